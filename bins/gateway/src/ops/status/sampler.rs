//! The one task that fills the status page's [`History`]: every [`SAMPLE_EVERY`], one reading of
//! every (upstream, model) key of the configuration in force and of every model's refusal
//! counters. Requests never write to the history; a second's sample costs a few atomic reads
//! per key, whatever the traffic.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::time::MissedTickBehavior;

use crate::ops::status::history::{History, KeySample, Refusals, SAMPLE_EVERY};
use crate::proxy::live::{Generation, Live};
use crate::support::shutdown::ShutdownSignal;

/// Samples into `history` until `stop` fires.
pub(crate) async fn run(live: Arc<Live>, history: Arc<Mutex<History>>, mut stop: ShutdownSignal) {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    // A late tick (a stalled runtime) is skipped, not caught up in a burst.
    every.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            biased;
            () = stop.fired() => break,
            _ = every.tick() => sample(&live.current(), &history),
        }
    }
}

/// One round of samples of `generation`.
pub(crate) fn sample(generation: &Generation, history: &Mutex<History>) {
    let keys: Vec<KeySample> = generation
        .routes
        .targets()
        .map(|target| {
            let reading = target.reading();
            KeySample {
                upstream: target.upstream.name.clone(),
                model: target.model.clone(),
                in_flight: reading.in_flight,
                queued: reading.queued,
                queue_wait: target.metrics.queue_wait.recent.counts(),
                first_byte: target.metrics.response_head.recent.counts(),
            }
        })
        .collect();
    let refusals: Vec<(String, Refusals)> = generation
        .routes
        .routes()
        .map(|route| {
            (
                route.model.clone(),
                Refusals {
                    queue_full: route.rejections.queue_full.get(),
                    queue_timeout: route.rejections.queue_timeout.get(),
                },
            )
        })
        .collect();
    // Read before taking the lock: the lock is held only to append.
    history.lock().record(keys, refusals);
}
