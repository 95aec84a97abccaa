//! Steps 5 and 6: take a slot on a target, waiting in its queue for at most `queue_timeout`.
//!
//! [`enter`] joins the target's limiter key at once (the limiter enqueues at call time, so
//! arrival order is grant order). A full queue is known without waiting and reported as
//! [`Refused::Full`], so the caller can try the next ranked target. Otherwise the request waits
//! under the target's `queue_timeout`. The wait is a future like any other: if the client goes
//! away, hyper drops the request's future, the limiter's acquire future with it, and the place in
//! the queue is given up — the request never reaches the upstream.
//!
//! A granted slot is a [`Slot`]: the limiter's permit plus what is needed to learn from it. It is
//! handed to the response body ([`SlotBody`](crate::body::SlotBody)), which ends it when the
//! answer is done; ending it records how long the slot was held (for `Retry-After`) and counts a
//! client that left mid-stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slotgate_limiter::{AcquireError, Permit};
use tracing::debug;

use crate::body::{Completion, SlotGuard};
use crate::hold::HoldStats;
use crate::metrics::{TargetMetrics, observe};
use crate::route::Target;
use crate::server::ShutdownSignal;

/// Why no slot was had on a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The queue was full: try elsewhere.
    Full,
    /// Waited `queue_timeout` without a slot.
    Timeout(Duration),
    /// The key was removed while waiting (a reload removed the model from the upstream).
    Closed,
    /// The gateway started shutting down while the request waited: only requests already
    /// running get the drain grace period.
    ShuttingDown,
}

/// A held slot on one target.
#[derive(Debug)]
pub struct Slot {
    permit: Permit,
    granted: Instant,
    hold: Arc<HoldStats>,
    metrics: Arc<TargetMetrics>,
}

/// Takes a slot on `target`, waiting up to its `queue_timeout`, or until `stop` fires.
pub async fn enter(target: &Target, stop: &mut ShutdownSignal) -> Result<Slot, Refused> {
    if stop.is_fired() {
        return Err(Refused::ShuttingDown);
    }
    let acquire = target.key.acquire();
    let outcome = match target.queue_timeout {
        Some(limit) if acquire.is_queued() => {
            // Counts the client leaving while queued: this future is then dropped mid-await,
            // and the guard with it, still armed.
            let mut waiting = QueuedGuard(Some(&target.metrics));
            let outcome = tokio::select! {
                biased;
                () = stop.fired() => None,
                outcome = tokio::time::timeout(limit, acquire) => Some(outcome),
            };
            waiting.0 = None;
            match outcome {
                // The acquire future is dropped here: the place in the queue is given up.
                None => return Err(Refused::ShuttingDown),
                Some(Ok(outcome)) => outcome,
                Some(Err(_elapsed)) => return Err(Refused::Timeout(limit)),
            }
        }
        // Granted or refused at call time: the first poll answers without waiting.
        _ => acquire.await,
    };
    let permit = outcome.map_err(|error| match error {
        AcquireError::QueueFull => Refused::Full,
        _ => Refused::Closed,
    })?;
    observe(&target.metrics.queue_wait, permit.waited());
    Ok(Slot {
        permit,
        granted: Instant::now(),
        hold: Arc::clone(&target.hold),
        metrics: Arc::clone(&target.metrics),
    })
}

/// Armed while a request waits in a queue; counts a disconnect if dropped armed.
struct QueuedGuard<'a>(Option<&'a TargetMetrics>);

impl Drop for QueuedGuard<'_> {
    fn drop(&mut self) {
        if let Some(metrics) = self.0 {
            debug!("client went away while queued");
            metrics.gone_queued.inc();
        }
    }
}

impl Slot {
    /// Gives the slot back without recording a hold time: the request never reached the
    /// upstream (a connect error), so the time says nothing about how long answers take.
    pub fn abandon(self) {
        drop(self.permit);
    }

    /// Gives the slot back after an upstream failure before any answer: counted as an upstream
    /// error; the hold time is not recorded (it measures the failure, not an answer).
    pub fn fail(self) {
        self.metrics.upstream_error.inc();
        drop(self.permit);
    }

    /// How long the request waited in the queue.
    pub fn waited(&self) -> Duration {
        self.permit.waited()
    }

    /// This slot's target metrics.
    pub fn metrics(&self) -> &TargetMetrics {
        &self.metrics
    }
}

impl SlotGuard for Slot {
    fn finish(self, how: Completion) {
        let held = self.granted.elapsed();
        self.hold.record(held);
        observe(&self.metrics.duration, held);
        match how {
            Completion::Ended => {
                self.metrics.completed.inc();
            }
            Completion::Failed => {
                self.metrics.upstream_error.inc();
            }
            Completion::Dropped => {
                debug!(?held, "client went away mid-stream");
                self.metrics.client_gone.inc();
                self.metrics.gone_streaming.inc();
            }
        }
        drop(self.permit);
    }
}
