//! Steps 5 and 6: take a slot on a target, waiting in its queue for as long as the request may.
//!
//! A request takes as many of the target's slots as the engine will run sequences for it (its
//! *weight*: `n` choices are `n` sequences, see [`Weighed`](crate::proxy::endpoint::Weighed)),
//! all at once. It asks with a [`Ticket`] that also carries its priority class and tenant
//! ([`Client`](crate::proxy::client::Client)); the key serves its waiters in the model's
//! `queue_order` (FIFO, or fair between tenants), higher classes first within the limiter's
//! starvation bound. A weight above the target's `parallel` could never be granted and is
//! refused at once as [`Refused::TooHeavy`].
//!
//! [`join`] joins the target's limiter key at once (the limiter enqueues at call time, so
//! arrival order is grant order). A full queue is known without waiting and reported as
//! [`Refused::Full`], so the caller can try the next ranked target. Otherwise the request is
//! [`Queued`] and waits until its [`Wait`] ends: the target's `queue_timeout`, or the client's
//! own deadline when that is sooner. When the wait expected from recent hold times (the
//! estimate behind `Retry-After`) is already longer than what is left of a *client's* deadline,
//! the request is refused at once ([`Refused::Hopeless`]) rather than queued to give up; the
//! operator's `queue_timeout` is never anticipated this way, and without an observed hold time
//! nothing is.
//!
//! The wait is a future like any other: if the client goes away, hyper drops the request's
//! future, the [`Queued`] with it, and the place in the queue is given up — the request never
//! reaches the upstream. (Under `queue_keepalive` the [`Queued`] lives in the response body
//! instead, which hyper drops the same way.)
//!
//! A granted slot is a [`Slot`]: the limiter's permit plus what is needed to learn from it. It is
//! handed to the response body ([`SlotBody`](crate::proxy::body::SlotBody)), which ends it when the
//! answer is done; ending it records how long the slot was held (for `Retry-After`) and counts a
//! client that left mid-stream.
//!
//! On an upstream that holds a bounded number of models
//! ([`places`](crate::upstreams::places)), [`join`] first asks its gate: a request for a model
//! that is not loaded, on a full engine, waits there, in the gateway, before its model's queue
//! (a [`Queued`] like any other: same bounds, cancelled the same way), and its slot carries the
//! [`Pass`] that keeps the model's place until the answer ends. More waiters for one model than
//! its `parallel + queue` are [`Refused::Full`].
//!
//! Between the grant and the response head the slot is held by a [`Sending`] guard, for the
//! case the body cannot cover: the client leaving while the engine works on a request that has
//! not answered yet. The upstream connection is closed at once (hyper drops the request), but
//! the engine may not notice for a while, so the slot is kept for the upstream's `cancel_grace`
//! before it goes to the next request (see [`Sending`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::BoxFuture;
use slotgate_admission::Slot as SharedSlot;
use slotgate_limiter::{Acquire, AcquireError, Permit, Ticket};
use slotgate_limiter_redis::{Place, Standing};
use tokio::time::Sleep;
use tracing::debug;

use crate::metrics::{TargetMetrics, observe};
use crate::proxy::body::{Completion, SlotGuard};
use crate::proxy::client::{Deadlines, Limit, Wait};
use crate::proxy::problems::{Deadline, Error, Unavailable};
use crate::shutdown::ShutdownSignal;
use crate::upstreams::hold::HoldStats;
use crate::upstreams::places::gate::{Entered, Pass};
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
    /// Waited until the end of `wait` without a slot.
    Timeout {
        /// How long it waited in the queue.
        waited: Duration,
        /// The wait that ended, and which bound set it.
        wait: Wait,
    },
    /// Not queued: the wait expected from recent hold times is longer than what is left of the
    /// client's deadline.
    Hopeless {
        /// The expected wait.
        expected: Duration,
        /// The client's deadline.
        wait: Wait,
    },
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

/// What [`join`] gave: a slot at once, or a place in the queue.
#[derive(Debug)]
pub(crate) enum Admission {
    /// A slot was free.
    Granted(Slot),
    /// The request waits; await the [`Queued`] for its slot.
    Queued(Queued),
}

impl Admission {
    /// Hands the gate's pass to the slot, now or when it is granted.
    fn with_place(self, pass: Option<Pass>) -> Self {
        match self {
            Admission::Granted(slot) => Admission::Granted(slot.with_place(pass)),
            Admission::Queued(mut queued) => {
                queued.place = pass;
                Admission::Queued(queued)
            }
        }
    }
}

/// Joins `target`'s queue for `ticket`'s slots: a slot at once, a place in the queue (bounded
/// by the target's `queue_timeout` and the client's `deadlines`, and ended early by `stop`), or
/// a refusal that needed no waiting.
pub(crate) fn join(
    target: &Arc<Target>,
    ticket: &Ticket,
    deadlines: &Deadlines,
    stop: &ShutdownSignal,
) -> Result<Admission, Refused> {
    if stop.is_fired() {
        return Err(Refused::ShuttingDown);
    }
    let limits = target.key.limits();
    let max_waiting = limits.parallel.saturating_add(limits.queue);
    match target
        .upstream
        .places
        .enter(&target.place_name, max_waiting)
    {
        Entered::Go(pass) => Ok(join_slot(target, ticket, deadlines, stop)?.with_place(Some(pass))),
        Entered::Full => Err(Refused::Full),
        // A model without a queue (`parallel = "unlimited"`) never waits in the gateway: it
        // goes on as before, and the engine holds it.
        Entered::Wait(waiting) if target.queue_timeout.is_none() => {
            drop(waiting);
            join_slot(target, ticket, deadlines, stop)
        }
        Entered::Wait(waiting) => Ok(Admission::Queued(wait_for_place(
            target, ticket, deadlines, stop, waiting,
        ))),
    }
}

/// A request waiting at the upstream's gate, then in its model's queue: one [`Queued`], bounded
/// by the same [`Wait`] from now, that tells where it stands in either.
fn wait_for_place(
    target: &Arc<Target>,
    ticket: &Ticket,
    deadlines: &Deadlines,
    stop: &ShutdownSignal,
    waiting: crate::upstreams::places::gate::Waiting,
) -> Queued {
    let now = tokio::time::Instant::now();
    let wait = target
        .queue_timeout
        .map(|timeout| deadlines.wait(now, timeout, target.queueing.honor_sdk_timeout));
    let line = waiting.ticket();
    let then: JoinSlot = {
        let target = Arc::clone(target);
        let (ticket, deadlines, stop) = (ticket.clone(), *deadlines, stop.clone());
        Box::new(move || join_slot(&target, &ticket, &deadlines, &stop))
    };
    let mut stop = stop.clone();
    Queued {
        acquire: Waiting::Place(Box::new(AtGate {
            admitted: Box::pin(waiting.admitted()),
            gate: Arc::clone(&target.upstream.places),
            line,
            then: Some(then),
        })),
        wait,
        timer: wait.map(|wait| Box::pin(tokio::time::sleep_until(wait.until))),
        stop: Box::pin(async move { stop.fired().await }),
        since: now,
        armed: true,
        hold: Arc::clone(&target.hold),
        metrics: Arc::clone(&target.metrics),
        place: None,
    }
}

/// The model's slot queue, joined once the gate admits the request.
type JoinSlot = Box<dyn FnOnce() -> Result<Admission, Refused> + Send>;

/// A request at its upstream's gate.
struct AtGate {
    admitted: BoxFuture<'static, Pass>,
    gate: Arc<crate::upstreams::places::gate::Gate>,
    line: crate::upstreams::places::Ticket,
    /// `None` once called.
    then: Option<JoinSlot>,
}

/// [`join`] once the upstream's gate let the request go: the model's slot queue.
fn join_slot(
    target: &Target,
    ticket: &Ticket,
    deadlines: &Deadlines,
    stop: &ShutdownSignal,
) -> Result<Admission, Refused> {
    if let Some(key) = &target.shared {
        return Ok(shared::join(target, key, ticket, deadlines, stop));
    }
    let acquire = target.key.acquire_with(ticket);
    if !acquire.is_queued() {
        // Granted or refused at call time: the first poll answers without waiting.
        let outcome = acquire.now_or_never().unwrap_or(Err(AcquireError::Closed));
        return granted(outcome, &target.hold, &target.metrics).map(Admission::Granted);
    }
    let now = tokio::time::Instant::now();
    let wait = target
        .queue_timeout
        .map(|timeout| deadlines.wait(now, timeout, target.queueing.honor_sdk_timeout));
    if let Some(wait) = wait.filter(|wait| wait.limit != Limit::QueueTimeout) {
        let left = wait.until.saturating_duration_since(now);
        let expected = acquire
            .position()
            .and_then(|position| target.expected_wait(position.ahead));
        if let Some(expected) = expected.filter(|expected| *expected > left) {
            // The acquire is dropped here: the place in the queue is given up at once.
            debug!(?expected, ?left, deadline = %wait.limit, "refused: the deadline cannot be kept");
            return Err(Refused::Hopeless { expected, wait });
        }
    }
    let mut stop = stop.clone();
    Ok(Admission::Queued(Queued {
        acquire: Waiting::Local(acquire),
        wait,
        timer: wait.map(|wait| Box::pin(tokio::time::sleep_until(wait.until))),
        stop: Box::pin(async move { stop.fired().await }),
        since: now,
        armed: true,
        hold: Arc::clone(&target.hold),
        metrics: Arc::clone(&target.metrics),
        place: None,
    }))
}

/// The slot an acquire's outcome gives, or why none.
fn granted(
    outcome: Result<Permit, AcquireError>,
    hold: &Arc<HoldStats>,
    metrics: &Arc<TargetMetrics>,
) -> Result<Slot, Refused> {
    let permit = outcome.map_err(|error| refusal(&error))?;
    metrics.queue_wait.observe(permit.waited());
    Ok(Slot::new(
        permit,
        None,
        Arc::clone(hold),
        Arc::clone(metrics),
    ))
}

/// Why a local acquire gave no slot.
fn refusal(error: &AcquireError) -> Refused {
    match *error {
        AcquireError::QueueFull => Refused::Full,
        AcquireError::TooHeavy { weight, parallel } => Refused::TooHeavy { weight, parallel },
        _ => Refused::Closed,
    }
}

/// A request waiting in a queue: a future of its [`Slot`], that ends at its [`Wait`] or when
/// the gateway shuts down. Dropping it gives up the place in the queue (counted as a client that
/// left while queued, unless it had already finished).
pub(crate) struct Queued {
    acquire: Waiting,
    /// `None` only for a target without `queue_timeout`, which never queues.
    wait: Option<Wait>,
    timer: Option<Pin<Box<Sleep>>>,
    stop: BoxFuture<'static, ()>,
    since: tokio::time::Instant,
    /// Until the wait has an outcome: dropping it armed counts a client gone while queued.
    armed: bool,
    hold: Arc<HoldStats>,
    metrics: Arc<TargetMetrics>,
    /// The upstream gate's pass, handed to the slot when granted.
    place: Option<Pass>,
}

/// Where a [`Queued`] request stands, for the keepalive comments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InLine {
    /// In its model's slot queue (under `[cluster]`, the shared one), with `ahead` waiters
    /// expected to be granted before it.
    Slot {
        /// [`QueuePosition::ahead`](slotgate_limiter::QueuePosition::ahead).
        ahead: usize,
    },
    /// At the upstream's gate, behind the loads of `models_ahead` other models.
    Place {
        /// Other models, not loaded, with a waiter before it.
        models_ahead: usize,
    },
}

/// What a [`Queued`] waits on: the target's local key, or (under `[cluster]`) the shared
/// store and then the local key ([`shared`]).
enum Waiting {
    Local(Acquire),
    /// The slot, and where its acquire stands in the shared queue.
    Shared(BoxFuture<'static, Result<Slot, Refused>>, Place),
    /// The upstream's gate, then ([`Waiting::Slot`]) the model's queue.
    Place(Box<AtGate>),
    /// Past the gate: the model's queue, whose wait is bounded by the outer one (it started
    /// later, with the same bounds), and whose drop is not counted again.
    Slot(Box<Queued>),
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Waiting::Local(acquire) => acquire.fmt(f),
            Waiting::Shared(_, place) => f.debug_tuple("Shared").field(place).finish(),
            Waiting::Place(_) => f.write_str("Place"),
            Waiting::Slot(queued) => queued.fmt(f),
        }
    }
}

impl std::fmt::Debug for Queued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queued")
            .field("acquire", &self.acquire)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl Queued {
    /// Where the request stands now; `None` once it has an outcome, and under `[cluster]`
    /// before the shared queue has taken it in. Under `[cluster]` the count is the one last
    /// read from the store ([`Queued::place`]).
    pub(crate) fn standing(&self) -> Option<InLine> {
        match &self.acquire {
            Waiting::Local(acquire) => acquire.position().map(|position| InLine::Slot {
                ahead: position.ahead,
            }),
            Waiting::Shared(_, place) => match place.standing() {
                Standing::Queued { ahead } => Some(InLine::Slot { ahead }),
                _ => None,
            },
            Waiting::Place(at) => at
                .gate
                .models_ahead(at.line)
                .map(|models_ahead| InLine::Place { models_ahead }),
            Waiting::Slot(queued) => queued.standing(),
        }
    }

    /// Under `[cluster]`: the request's place in the shared queue.
    pub(crate) fn place(&self) -> Option<&Place> {
        match &self.acquire {
            Waiting::Local(_) | Waiting::Place(_) => None,
            Waiting::Shared(_, place) => Some(place),
            Waiting::Slot(queued) => queued.place(),
        }
    }

    /// Waits until a queue has accepted the request: at once for the local limiter (it
    /// queues at call time); under `[cluster]`, until the shared store has answered the
    /// acquire. The store may grant the slot at once or refuse the request, which ends here
    /// as for an ordinary wait; otherwise the request is still queued, and `queue_keepalive`
    /// may answer `200`. The wait's bounds (`queue_timeout`, the client's deadline, shutdown)
    /// apply meanwhile.
    pub(crate) async fn joined(mut self) -> Result<Admission, Refused> {
        let Some(place) = self.place().cloned() else {
            return Ok(Admission::Queued(self));
        };
        let settled = place.settled();
        let mut settled = std::pin::pin!(settled);
        let outcome = std::future::poll_fn(|cx| {
            // The outcome first: granted at once or refused is not "queued".
            if let Poll::Ready(outcome) = Pin::new(&mut self).poll(cx) {
                return Poll::Ready(Some(outcome));
            }
            settled.as_mut().poll(cx).map(|_| None)
        })
        .await;
        match outcome {
            Some(outcome) => outcome.map(Admission::Granted),
            None => Ok(Admission::Queued(self)),
        }
    }

    /// Polls what it waits on; past the gate, joins the model's slot queue.
    fn poll_acquire(&mut self, cx: &mut Context<'_>) -> Poll<Result<Slot, Refused>> {
        loop {
            match &mut self.acquire {
                Waiting::Local(acquire) => {
                    return Pin::new(acquire)
                        .poll(cx)
                        .map(|outcome| granted(outcome, &self.hold, &self.metrics));
                }
                Waiting::Shared(slot, _) => return slot.as_mut().poll(cx),
                Waiting::Slot(queued) => return Pin::new(&mut **queued).poll(cx),
                Waiting::Place(at) => {
                    let pass = std::task::ready!(at.admitted.as_mut().poll(cx));
                    self.place = Some(pass);
                    let Some(then) = at.then.take() else {
                        unreachable!("the gate admits once, and then is taken only here");
                    };
                    match then()? {
                        Admission::Granted(slot) => return Poll::Ready(Ok(slot)),
                        Admission::Queued(mut queued) => {
                            // The outer wait counts a client that leaves; this one must not.
                            queued.armed = false;
                            self.acquire = Waiting::Slot(Box::new(queued));
                        }
                    }
                }
            }
        }
    }

    /// How long it has waited so far.
    pub(crate) fn waited(&self) -> Duration {
        self.since.elapsed()
    }
}

impl Future for Queued {
    type Output = Result<Slot, Refused>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        // A shutdown first: only requests already running get the grace period.
        if this.stop.as_mut().poll(cx).is_ready() {
            this.armed = false;
            return Poll::Ready(Err(Refused::ShuttingDown));
        }
        if let Poll::Ready(outcome) = this.poll_acquire(cx) {
            this.armed = false;
            let place = this.place.take();
            return Poll::Ready(outcome.map(|slot| slot.with_place(place)));
        }
        if let (Some(timer), Some(wait)) = (this.timer.as_mut(), this.wait)
            && timer.as_mut().poll(cx).is_ready()
        {
            this.armed = false;
            let waited = this.since.elapsed();
            return Poll::Ready(Err(Refused::Timeout { waited, wait }));
        }
        Poll::Pending
    }
}

impl Drop for Queued {
    fn drop(&mut self) {
        if self.armed {
            debug!("client went away while queued");
            self.metrics.gone_queued.inc();
        }
    }
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
    fn with_place(mut self, pass: Option<Pass>) -> Self {
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

/// What the admission step gave a request on one target.
#[derive(Debug)]
pub(crate) enum Admitted {
    /// Go ahead: with a slot, or without one on an endpoint that takes none.
    Go(Option<Slot>),
    /// The request queues in its response body, which tells it where it stands `every` so
    /// often (`queue_keepalive`).
    KeepAlive(Queued, Duration),
}

/// Steps 5 and 6 on one target: `ticket`'s slots (none when the endpoint takes no `slot`), at
/// once or after waiting in the queue; with `keepalive`, a request that has to queue waits in
/// its response body instead ([`Admitted::KeepAlive`]). A shutdown ends the wait: only
/// requests already running get the grace period.
pub(crate) async fn admit(
    target: &Arc<Target>,
    slot: bool,
    ticket: &Ticket,
    deadlines: &Deadlines,
    stop: &ShutdownSignal,
    keepalive: Option<Duration>,
) -> Result<Admitted, Refused> {
    if !slot {
        return Ok(Admitted::Go(None));
    }
    match join(target, ticket, deadlines, stop)? {
        Admission::Granted(slot) => Ok(Admitted::Go(Some(slot))),
        Admission::Queued(queued) => match keepalive {
            // Under `[cluster]`, `200` only once the shared queue has taken the request in:
            // the store may still grant it at once or refuse it.
            Some(every) => match queued.joined().await? {
                Admission::Granted(slot) => Ok(Admitted::Go(Some(slot))),
                Admission::Queued(queued) => Ok(Admitted::KeepAlive(queued, every)),
            },
            None => queued.await.map(|slot| Admitted::Go(Some(slot))),
        },
    }
}

/// The `Retry-After` of refusals that have no estimate of their own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fallback {
    /// While shutting down: when a restart is likely done.
    pub(crate) shutting_down: Duration,
    /// When no upstream can take the model: the next health check.
    pub(crate) unavailable: Duration,
}

impl Refused {
    /// The error for a request refused on `target` (for `ticket`, a request for `model`):
    /// every refusal of the admission step becomes its [`Error`] here.
    pub(crate) fn into_error(
        self,
        target: &Target,
        ticket: &Ticket,
        model: &str,
        fallback: Fallback,
    ) -> Error {
        let upstream = target.upstream.name.clone();
        let model = model.to_owned();
        match self {
            Refused::ShuttingDown => Error::ShuttingDown {
                retry_after: fallback.shutting_down,
            },
            // A reload removed this model from this upstream while the request waited.
            Refused::Closed => {
                let why = format!(
                    "model {model:?} was removed from upstream {upstream} by a configuration \
                     reload while the request waited"
                );
                Error::UpstreamUnavailable {
                    model,
                    retry_after: fallback.unavailable,
                    why: Unavailable::Down,
                    source: Some(why.into()),
                }
            }
            Refused::Full => Error::QueueFull {
                upstream,
                model,
                retry_after: target.retry_after_for(ticket),
            },
            Refused::TooHeavy { weight, parallel } => Error::TooHeavy {
                upstream,
                model,
                weight,
                parallel,
            },
            Refused::Timeout { waited, wait } => Error::QueueTimeout {
                upstream,
                model,
                waited,
                retry_after: target.retry_after_for(ticket),
                deadline: client_deadline(wait, None),
            },
            Refused::StoreUnavailable { retry_after } => {
                Error::StoreUnavailable { model, retry_after }
            }
            Refused::Hopeless { expected, wait } => Error::QueueTimeout {
                upstream,
                model,
                waited: Duration::ZERO,
                retry_after: target.retry_after_for(ticket),
                deadline: client_deadline(wait, Some(expected)),
            },
        }
    }
}

/// The client's deadline that set `wait`, if one did (rather than `queue_timeout`), with the
/// `expected` wait that it could not cover when the request was refused before queueing.
fn client_deadline(wait: Wait, expected: Option<Duration>) -> Option<Box<Deadline>> {
    (wait.limit != Limit::QueueTimeout).then(|| {
        Box::new(Deadline {
            header: wait.limit.as_str(),
            bound: wait.bound,
            expected,
        })
    })
}

/// Takes `weight` slots on `target` as an anonymous client without deadlines, waiting in the
/// queue as [`join`] says: the admission step of the tests.
#[cfg(test)]
pub(crate) async fn take(
    target: &Arc<Target>,
    weight: usize,
    stop: &mut ShutdownSignal,
) -> Result<Slot, Refused> {
    let deadlines = Deadlines::read(&http::HeaderMap::new(), tokio::time::Instant::now())
        .expect("no headers, no malformed deadline");
    match join(target, &Ticket::new().weight(weight), &deadlines, stop)? {
        Admission::Granted(slot) => Ok(slot),
        Admission::Queued(queued) => queued.await,
    }
}

mod shared;
#[cfg(test)]
mod tests;
