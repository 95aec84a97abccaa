//! Steps 5 and 6: take a slot on a target, waiting in its queue for at most `queue_timeout`.
//!
//! A request takes as many of the target's slots as the engine will run sequences for it (its
//! *weight*: `n` choices are `n` sequences, see [`Weighed`](crate::proxy::endpoint::Weighed)),
//! all at once, in the same FIFO queue as everyone else (the limiter's `acquire_many`: a heavy
//! request at the head is never overtaken by lighter ones behind it). A weight above the
//! target's `parallel` could never be granted and is refused at once as [`Refused::TooHeavy`].
//!
//! [`enter`] joins the target's limiter key at once (the limiter enqueues at call time, so
//! arrival order is grant order). A full queue is known without waiting and reported as
//! [`Refused::Full`], so the caller can try the next ranked target. Otherwise the request waits
//! under the target's `queue_timeout`. The wait is a future like any other: if the client goes
//! away, hyper drops the request's future, the limiter's acquire future with it, and the place in
//! the queue is given up — the request never reaches the upstream.
//!
//! A granted slot is a [`Slot`]: the limiter's permit plus what is needed to learn from it. It is
//! handed to the response body ([`SlotBody`](crate::proxy::body::SlotBody)), which ends it when the
//! answer is done; ending it records how long the slot was held (for `Retry-After`) and counts a
//! client that left mid-stream.
//!
//! Between the grant and the response head the slot is held by a [`Sending`] guard, for the
//! case the body cannot cover: the client leaving while the engine works on a request that has
//! not answered yet. The upstream connection is closed at once (hyper drops the request), but
//! the engine may not notice for a while, so the slot is kept for the upstream's `cancel_grace`
//! before it goes to the next request (see [`Sending`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use slotgate_admission::Slot as SharedSlot;
use slotgate_limiter::{AcquireError, Permit};
use tracing::debug;

use crate::metrics::{TargetMetrics, observe};
use crate::proxy::body::{Completion, SlotGuard};
use crate::shutdown::ShutdownSignal;
use crate::upstreams::hold::HoldStats;
use crate::upstreams::target::Target;

/// Why no slot was had on a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The queue was full: try elsewhere.
    Full,
    /// The request needs more slots than the target has at all: try elsewhere, and if no
    /// target can ever take it, the client must ask for less.
    TooHeavy {
        /// The slots asked for.
        weight: usize,
        /// The target's `parallel`.
        parallel: usize,
    },
    /// Waited `queue_timeout` without a slot.
    Timeout(Duration),
    /// The key was removed while waiting (a reload removed the model from the upstream).
    Closed,
    /// The gateway started shutting down while the request waited: only requests already
    /// running get the drain grace period.
    ShuttingDown,
    /// Under `[cluster]`: the shared slot store cannot be reached and the policy is
    /// `fail-closed`. Every target shares the store, so no other target can help.
    StoreUnavailable {
        /// The store's next probe.
        retry_after: Duration,
    },
    /// Under `[cluster]`: the request needs `weight` slots, and the shared store counts one
    /// per request (see [`shared`]).
    Unshared {
        /// The slots asked for.
        weight: usize,
    },
}

/// Whether a released slot's hold time feeds the `Retry-After` estimate and the duration
/// histogram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hold {
    Record,
    Ignore,
}

/// A held slot on one target.
#[derive(Debug)]
pub(crate) struct Slot {
    permit: Permit,
    /// Under `[cluster]`: the slot in the shared store, released with the permit.
    shared: Option<SharedSlot>,
    granted: Instant,
    hold: Arc<HoldStats>,
    metrics: Arc<TargetMetrics>,
}

/// Takes `weight` slots on `target` (one permit for all of them), waiting up to its
/// `queue_timeout`, or until `stop` fires.
pub(crate) async fn enter(
    target: &Target,
    weight: usize,
    stop: &mut ShutdownSignal,
) -> Result<Slot, Refused> {
    if stop.is_fired() {
        return Err(Refused::ShuttingDown);
    }
    if let Some(key) = &target.shared {
        return shared::enter(target, key, weight, stop).await;
    }
    let acquire = target.key.acquire_many(weight);
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
        AcquireError::TooHeavy { weight, parallel } => Refused::TooHeavy { weight, parallel },
        _ => Refused::Closed,
    })?;
    target.metrics.queue_wait.observe(permit.waited());
    Ok(Slot::new(permit, None, target))
}

/// A slot whose request is with the upstream, before the response head came back.
///
/// Made by [`Slot::sending`] just before the request goes out, and turned back into the slot by
/// [`Sending::answered`] on every path where the send returns (an answer, a connect error, a
/// failure). The one way it is dropped still holding the slot is the request's future being
/// dropped mid-send: the client went away (or the gateway stopped) before the answer began.
///
/// hyper then drops the upstream request and closes its connection, so the engine is told at
/// once; but it may take a while to *notice*. A llama-server checks a non-streamed request's
/// connection only at its next 1 s poll (measured: idle 0.9–1.8 s after the close, longer under
/// load; `docs/real-engine-notes.md`, "Client disconnects"). Handing the slot to the next queued
/// request at once would give the engine `parallel + 1` requests, and it would queue one itself
/// — what the gateway is there to prevent. So the slot is kept for the upstream's
/// `cancel_grace`, by a task that sleeps it out and then releases the slot: bounded, and if the
/// runtime shuts down first the task is dropped and the slot with it. A zero grace (the default
/// of engines that abort at once, like vLLM) releases it at once.
///
/// Streams whose body is already flowing are not concerned: the engine notices the closed
/// connection at its next write (~10 ms), so [`SlotBody`](crate::proxy::body::SlotBody) releases at once.
#[derive(Debug)]
pub(crate) struct Sending {
    /// `None` only once [`Sending::answered`] took it.
    slot: Option<Slot>,
    grace: Duration,
}

impl Sending {
    /// The send returned (whatever it returned): the slot, disarmed.
    pub(crate) fn answered(mut self) -> Slot {
        match self.slot.take() {
            Some(slot) => slot,
            // Only this method (which consumes the guard) and `drop` take the slot.
            None => unreachable!("a Sending guard always holds its slot until answered"),
        }
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        let Some(slot) = self.slot.take() else {
            return;
        };
        debug!(grace = ?self.grace, "client went away before the upstream answered");
        slot.metrics.client_gone.inc();
        slot.metrics.gone_awaiting.inc();
        slot.release_after(self.grace, Hold::Record);
    }
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
    /// A slot of `target` granted now: the local `permit`, and the `shared` one under
    /// `[cluster]`.
    fn new(permit: Permit, shared: Option<SharedSlot>, target: &Target) -> Self {
        Self {
            permit,
            shared,
            granted: Instant::now(),
            hold: Arc::clone(&target.hold),
            metrics: Arc::clone(&target.metrics),
        }
    }

    /// Gives the slot back without recording a hold time: the request never reached the
    /// upstream (a connect error), so the time says nothing about how long answers take.
    pub(crate) fn abandon(self) {
        drop(self.permit);
    }

    /// Gives the slot back after an upstream failure before any answer: counted as an upstream
    /// error; the hold time is not recorded (it measures the failure, not an answer).
    pub(crate) fn fail(self) {
        self.metrics.upstream_error.inc();
        drop(self.permit);
    }

    /// Hands the slot to a [`Sending`] guard for the time the request is with the upstream:
    /// if the request's future is dropped before [`Sending::answered`], the slot is kept for
    /// `cancel_grace` more.
    pub(crate) fn sending(self, cancel_grace: Duration) -> Sending {
        Sending {
            slot: Some(self),
            grace: cancel_grace,
        }
    }

    /// Gives the slot back after a first-byte timeout: counted as an upstream error, the hold
    /// time not recorded (it measures the timeout, not an answer). The connection was just
    /// closed, but the engine may still be winding the request down (a non-streamed request on
    /// llama-server: up to a second or more), so the slot is kept for `cancel_grace` as for a
    /// client that left before the answer.
    pub(crate) fn timed_out(self, cancel_grace: Duration) {
        self.metrics.upstream_error.inc();
        self.release_after(cancel_grace, Hold::Ignore);
    }

    /// Gives the slot back after `grace` (at once when zero), recording how long it was held
    /// when `hold` says so.
    fn release_after(self, grace: Duration, record: Hold) {
        let release = move |slot: Slot| {
            if record == Hold::Record {
                slot.record_hold();
            }
            drop(slot.permit);
        };
        if grace.is_zero() {
            return release(self);
        }
        // Dropped futures are dropped on a runtime thread; without a runtime (never in the
        // gateway) there is nothing to wait on, so the slot goes back at once.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(grace).await;
                    release(self);
                });
            }
            Err(_) => release(self),
        }
    }

    /// Records how long the slot has been held (for `Retry-After` and the duration histogram);
    /// returns it.
    fn record_hold(&self) -> Duration {
        let held = self.granted.elapsed();
        self.hold.record(held);
        observe(&self.metrics.duration, held);
        held
    }

    /// How long the request waited in the queue for this slot (zero when it was free).
    pub(crate) fn waited(&self) -> Duration {
        let shared = self
            .shared
            .as_ref()
            .map_or(Duration::ZERO, SharedSlot::waited);
        shared + self.permit.waited()
    }

    /// This slot's target metrics.
    pub(crate) fn metrics(&self) -> &TargetMetrics {
        &self.metrics
    }
}

impl SlotGuard for Slot {
    fn finish(self, how: Completion) {
        if let Completion::Stalled { grace } = how {
            // Like a first-byte timeout: the time measures the stall, not an answer.
            return self.timed_out(grace);
        }
        let held = self.record_hold();
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
            Completion::Stalled { .. } => {}
        }
        drop(self.permit);
    }
}

mod shared;
#[cfg(test)]
mod tests;
