//! A granted slot ([`Slot`]) and how it ends: given back, kept for `cancel_grace` while the
//! engine may still be working, and what its end records (the hold time behind `Retry-After`,
//! the duration histogram, the outcome counters). [`Sending`] guards it while the request is
//! with the upstream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slotgate_admission::Slot as SharedSlot;
use slotgate_limiter::Permit;
use tracing::debug;

use crate::metrics::{TargetMetrics, observe};
use crate::proxy::body::{Completion, SlotGuard};
use crate::upstreams::hold::HoldStats;
use crate::upstreams::places::gate::Pass;

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
    /// When the slot became this request's: the handoff, for a slot handed over from a
    /// release (the limiter's wait ends there too, so the two add up to the whole time);
    /// otherwise the moment it was found free.
    granted: Instant,
    hold: Arc<HoldStats>,
    metrics: Arc<TargetMetrics>,
    /// The engine answered with a 5xx status: an answer that ends cleanly is still not
    /// `completed`.
    engine_error: bool,
    /// The upstream gate's pass: the model keeps its place in the engine while the slot is
    /// held, and gives it up with the slot. Boxed: only bounded upstreams have one, and the
    /// slot rides in every answer.
    place: Option<Box<Pass>>,
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
/// The same holds after the head, until the body's first byte: llama-server sends a stream's
/// head first and writes nothing during prefill, so [`SlotBody`](crate::proxy::body::SlotBody)
/// keeps the slot for `cancel_grace` too when dropped then. Streams whose body is already
/// flowing are not concerned: the engine notices the closed connection at its next write
/// (~10 ms), so the slot goes back at once.
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
        slot.observe_duration();
        slot.metrics.client_gone.inc();
        slot.metrics.gone_awaiting.inc();
        slot.release_after(self.grace, Hold::Record);
    }
}

impl Slot {
    /// The slot `permit` (and, under `[cluster]`, `shared`) gives, held from the handoff when
    /// it was handed over, else from now.
    pub(super) fn new(
        permit: Permit,
        shared: Option<SharedSlot>,
        hold: Arc<HoldStats>,
        metrics: Arc<TargetMetrics>,
    ) -> Self {
        Self {
            granted: permit.handed_over().unwrap_or_else(Instant::now),
            permit,
            shared,
            hold,
            metrics,
            engine_error: false,
            place: None,
        }
    }

    /// Carries the gate's pass (kept when `pass` is `None`).
    pub(super) fn with_place(mut self, pass: Option<Pass>) -> Self {
        if let Some(pass) = pass {
            self.place = Some(Box::new(pass));
        }
        self
    }

    /// Gives the slot back without recording a hold time: the request never reached the
    /// upstream (a connect error), so the time says nothing about how long answers take.
    pub(crate) fn abandon(self) {
        drop(self.permit);
    }

    /// Gives the slot back after an upstream failure before any answer: counted as an upstream
    /// error; the hold time is not recorded (it measures the failure, not an answer).
    pub(crate) fn fail(self) {
        self.observe_duration();
        self.metrics.upstream_error.inc();
        drop(self.permit);
    }

    /// Hands the slot to a [`Sending`] guard for the time the request is with the upstream:
    /// if the request's future is dropped before [`Sending::answered`], the slot is kept for
    /// `cancel_grace` more.
    ///
    /// A slot handed over from another request's release was idle from that release until now:
    /// observed as `slotgate_handoff_gap_seconds`.
    pub(crate) fn sending(self, cancel_grace: Duration) -> Sending {
        if let Some(at) = self.permit.handed_over() {
            observe(&self.metrics.handoff_gap, at.elapsed());
        }
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
        self.observe_duration();
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

    /// Records how long the slot has been held (for `Retry-After`); returns it.
    fn record_hold(&self) -> Duration {
        let held = self.granted.elapsed();
        self.hold.record(held);
        held
    }

    /// Observes the request's whole duration, from joining the queue until now (its answer
    /// ended, failed or was given up), in `slotgate_request_duration_seconds`.
    fn observe_duration(&self) {
        observe(
            &self.metrics.duration,
            self.waited() + self.granted.elapsed(),
        );
    }

    /// The engine's response head came with `status`: counted by class, and remembered so that
    /// a 5xx answer is not counted as `completed` when it ends.
    pub(crate) fn engine_status(&mut self, status: http::StatusCode) {
        self.metrics.response(status);
        self.engine_error = status.is_server_error() || status.as_u16() >= 600;
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
        self.observe_duration();
        let held = self.record_hold();
        match how {
            Completion::Ended if self.engine_error => {
                self.metrics.upstream_status_error.inc();
            }
            Completion::Ended => {
                self.metrics.completed.inc();
            }
            Completion::Failed => {
                self.metrics.upstream_error.inc();
            }
            Completion::Dropped { grace } => {
                debug!(?held, ?grace, "client went away mid-stream");
                self.metrics.client_gone.inc();
                self.metrics.gone_streaming.inc();
                // Before the first byte the engine may still be in prefill: it notices only
                // at its first write (see `SlotBody`).
                return self.release_after(grace, Hold::Ignore);
            }
            Completion::Stalled { .. } => {}
        }
        drop(self.permit);
    }
}
