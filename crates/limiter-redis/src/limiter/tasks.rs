//! The two background tasks of a shared limiter: the renewer (leases, store probing, the
//! periodic retry behind lost grant messages) and the subscriber (grant messages).
//!
//! Both hold only a weak reference to the limiter, and the limiter aborts them when its last
//! clone and its last slot are gone.

use std::sync::{Arc, Weak};
use std::time::Instant;

use futures_util::StreamExt;
use tokio::time::MissedTickBehavior;

use super::Inner;
use crate::script::KeyNames;
use crate::store::Mode;

pub(crate) fn spawn(inner: &Arc<Inner>) {
    let renewer = inner.runtime().spawn(renewer(Arc::downgrade(inner)));
    let subscriber = inner.runtime().spawn(subscriber(
        Arc::downgrade(inner),
        inner.store.client().clone(),
        KeyNames::wake_pattern(&inner.settings.key_prefix),
    ));
    inner.add_task(renewer.abort_handle());
    inner.add_task(subscriber.abort_handle());
}

/// Every `lease_ttl / 3`: renew every lease of this replica (up or rejoining) and say it is
/// alive (the replicas seen), or probe the store (down), and move between the modes.
async fn renewer(inner: Weak<Inner>) {
    let Some(interval) = inner.upgrade().map(|inner| inner.settings.renew_interval()) else {
        return;
    };
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        tick(&inner).await;
    }
}

async fn tick(inner: &Arc<Inner>) {
    let settings = &inner.settings;
    if inner.store.mode() == Mode::Down {
        if inner.store.ping().await.is_err() {
            return;
        }
        // Long enough for every replica (they all probe every interval) to put its leases back.
        let until = Instant::now() + settings.renew_interval() + 2 * settings.store_timeout;
        if inner.store.set_rejoining(until) {
            tracing::info!("the shared slot store answers again; re-registering slots");
        }
    }
    if let Err(error) = inner.renew_all().await {
        inner.store_failed(&error);
        return;
    }
    if let Err(error) = inner.heartbeat().await {
        inner.store_failed(&error);
        return;
    }
    if let Mode::Rejoining { until } = inner.store.mode()
        && Instant::now() >= until
    {
        inner.store_up();
    }
}

/// Listens for grant messages on every key's channel and completes this replica's waits.
/// Reconnects after a lost connection; what it missed meanwhile, the renewer catches up on.
async fn subscriber(inner: Weak<Inner>, client: redis::Client, pattern: String) {
    let Some((timeout, interval)) = inner.upgrade().map(|inner| {
        (
            inner.settings.store_timeout,
            inner.settings.renew_interval(),
        )
    }) else {
        return;
    };
    loop {
        let connected = tokio::time::timeout(timeout, client.get_async_pubsub()).await;
        if let Ok(Ok(mut pubsub)) = connected {
            let subscribed = tokio::time::timeout(timeout, pubsub.psubscribe(&pattern)).await;
            if let Ok(Ok(())) = subscribed {
                let mut messages = pubsub.into_on_message();
                while let Some(message) = messages.next().await {
                    let Some(inner) = inner.upgrade() else {
                        return;
                    };
                    if let Ok(payload) = message.get_payload::<String>() {
                        inner.told(&payload);
                    }
                }
            }
        }
        if inner.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(interval).await;
    }
}
