//! `[cluster]`: the shared slot store several gateway replicas admit through, so that N
//! replicas in front of one engine put one cap on it (`docs/scale-out.md`).
//!
//! The process has one [`RedisLimiter`], started with the first configuration and kept by every
//! reload (changing `[cluster]` itself is refused until a restart: the leases in flight belong
//! to the store they were taken in). A target whose model has a cap admits through its
//! [`SharedKey`] first, in the global FIFO queue; the local limiter key still counts the slot
//! for the gateway's own accounting (hold times, metrics, `Retry-After`) and always has room
//! for it, since this replica never holds more shared slots than the cap.
//!
//! ```text
//! request ── SharedKey::acquire (Redis: global cap + queue) ── local key (counts) ── engine
//! ```

use std::time::Duration;

use futures::future::BoxFuture;
use slotgate_admission::{Admission, AdmitFuture, Occupancy};
use slotgate_config::{Cluster, Config, StoreDown};
use slotgate_limiter::{QueueOrder, Ticket};
use slotgate_limiter_redis::{
    HostOccupancy, OnStoreDown, Place, RedisLimiter, Settings, SettingsErrors, Standing, StartError,
};

/// Why the shared slot store cannot be used with a configuration.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ClusterError {
    /// The settings are refused by the shared limiter.
    #[error("cluster: invalid settings")]
    Invalid(#[source] SettingsErrors),
    /// The shared limiter could not start.
    #[error("cluster: the shared slot store cannot start")]
    Start(#[source] StartError),
    /// A reload changed `[cluster]`.
    #[error(
        "cluster: [cluster] changed; it only takes effect at a restart (the slots in flight are \
         leased in the store they were taken in, and every replica must share one table)"
    )]
    Changed,
}

/// The shared limiter's settings for a `[cluster]` table, checked.
///
/// ```text
/// [cluster] redis_url, key_prefix, lease_ttl, store_timeout, on_store_down, replicas
/// ```
pub(crate) fn settings(cluster: &Cluster) -> Result<Settings, ClusterError> {
    let mut settings = Settings::new(cluster.redis_url.expose());
    settings.key_prefix.clone_from(&cluster.key_prefix);
    settings.lease_ttl = cluster.lease_ttl;
    settings.store_timeout = cluster.store_timeout;
    settings.on_store_down = match cluster.on_store_down {
        StoreDown::LocalShare => OnStoreDown::LocalShare,
        // `StoreDown` is non-exhaustive: anything new refuses rather than risk the cap.
        _ => OnStoreDown::FailClosed,
    };
    settings.replicas = cluster.replicas.unwrap_or(1);
    settings.validate().map_err(ClusterError::Invalid)?;
    Ok(settings)
}

/// Checks `config`'s `[cluster]` against the one in force (`previous`, on a reload): the
/// settings to start a store with (first start only), or an error.
pub(crate) fn check(
    config: &Config,
    previous: Option<&Config>,
) -> Result<Option<Settings>, ClusterError> {
    let settings = config.cluster.as_ref().map(settings).transpose()?;
    match previous {
        Some(previous) if previous.cluster != config.cluster => Err(ClusterError::Changed),
        Some(_) => Ok(None),
        None => Ok(settings),
    }
}

/// Starts the store for `settings` (on the current tokio runtime; Redis is contacted on first
/// use, so a Redis that is down at start is handled like one that goes down later).
pub(crate) fn start(settings: Settings) -> Result<RedisLimiter, ClusterError> {
    RedisLimiter::start(settings).map_err(ClusterError::Start)
}

/// One target's key in the shared store.
#[derive(Debug)]
pub(crate) struct SharedKey {
    limiter: RedisLimiter,
    host: String,
    model: String,
}

impl SharedKey {
    /// The key (`host`, `model`) of `limiter`, configured with the model's limits and queue
    /// order (last writer wins across replicas).
    pub(crate) fn configure(
        limiter: &RedisLimiter,
        host: &str,
        model: &str,
        (parallel, queue): (usize, usize),
        order: QueueOrder,
    ) -> Self {
        limiter.configure(host, model, parallel, queue);
        limiter.configure_order(host, model, order);
        Self {
            limiter: limiter.clone(),
            host: host.to_owned(),
            model: model.to_owned(),
        }
    }

    /// The key (`host`, `model`) of `limiter`, left as it is in the store: for a model whose
    /// `parallel = "auto"`, whose count is written when it is read (`AutoSlots`).
    pub(crate) fn attach(limiter: &RedisLimiter, host: &str, model: &str) -> Self {
        Self {
            limiter: limiter.clone(),
            host: host.to_owned(),
            model: model.to_owned(),
        }
    }

    /// Joins the key's global queue as `ticket` says: its weight, class and tenant (see
    /// [`Admission::acquire_with`]), with the [`Place`] that shows when the store has taken
    /// it in and how many are ahead.
    pub(crate) fn acquire(&self, ticket: &Ticket) -> (AdmitFuture, Place) {
        self.limiter.acquire_placed(&self.host, &self.model, ticket)
    }

    /// Reads again how many are ahead of `place` in the shared queue (one round trip).
    pub(crate) fn refresh(&self, place: &Place) -> BoxFuture<'static, Standing> {
        let limiter = self.limiter.clone();
        let place = place.clone();
        Box::pin(async move { limiter.refresh(&place).await })
    }

    /// The key's holders and waiters across every replica, as last seen.
    pub(crate) fn global(&self) -> Option<Occupancy> {
        self.limiter.global(&self.host, &self.model)
    }

    /// The engine-wide cap across every replica, as last seen, when the upstream has one.
    pub(crate) fn host_global(&self) -> Option<HostOccupancy> {
        self.limiter.host_global(&self.host)
    }

    /// This replica's own holders and waiters in the shared store.
    pub(crate) fn local(&self) -> Occupancy {
        self.limiter.local(&self.host, &self.model)
    }

    /// The `Retry-After` of a refusal because the store is down: its next probe.
    pub(crate) fn store_retry_after(&self) -> Duration {
        self.limiter.settings().renew_interval()
    }
}
