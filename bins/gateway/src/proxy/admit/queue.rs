//! Joining a target's queue ([`join`]): a slot at once, a refusal that needs no waiting, or a
//! [`Queued`] request, a future of its slot bounded by its [`Wait`] and the shutdown signal.
//! What it waits on: the target's local limiter key, the upstream's gate for a model's place
//! first on a bounded upstream, or under `[cluster]` the shared store ([`shared`]).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use slotgate_limiter::{Acquire, AcquireError, Permit, Ticket};
use slotgate_limiter_redis::{Place, Standing};
use tokio::time::Sleep;
use tracing::debug;

use crate::metrics::TargetMetrics;
use crate::proxy::admit::refused::Refused;
use crate::proxy::admit::slot::Slot;
use crate::proxy::client::{Deadlines, Limit, Wait};
use crate::support::shutdown::ShutdownSignal;
use crate::upstreams::hold::HoldStats;
use crate::upstreams::places::gate::{Entered, Pass};
use crate::upstreams::target::Target;

mod shared;

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
    let wait = wait_from(target, deadlines, now);
    let line = waiting.ticket();
    let then: JoinSlot = {
        let target = Arc::clone(target);
        let (ticket, deadlines, stop) = (ticket.clone(), *deadlines, stop.clone());
        Box::new(move || join_slot(&target, &ticket, &deadlines, &stop))
    };
    let at_gate = AtGate {
        admitted: Box::pin(waiting.admitted()),
        gate: Arc::clone(&target.upstream.places),
        line,
        then: Some(then),
    };
    Queued::new(Waiting::Place(Box::new(at_gate)), now, wait, target, stop)
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
    let wait = wait_from(target, deadlines, now);
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
    let queued = Queued::new(Waiting::Local(acquire), now, wait, target, stop);
    Ok(Admission::Queued(queued))
}

/// When a wait that starts `now` on `target` ends: at the target's `queue_timeout`, or at the
/// client's `deadlines` when sooner. `None` for a target without `queue_timeout`.
fn wait_from(target: &Target, deadlines: &Deadlines, now: tokio::time::Instant) -> Option<Wait> {
    target
        .queue_timeout
        .map(|timeout| deadlines.wait(now, timeout, target.queueing.honor_sdk_timeout))
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
    /// A request for `target` that waits on `acquire` from `since` until it has an outcome,
    /// `wait` ends or `stop` fires; dropped before that, it counts as a client gone while
    /// queued.
    fn new(
        acquire: Waiting,
        since: tokio::time::Instant,
        wait: Option<Wait>,
        target: &Target,
        stop: &ShutdownSignal,
    ) -> Self {
        let mut stop = stop.clone();
        Queued {
            acquire,
            wait,
            timer: wait.map(|wait| Box::pin(tokio::time::sleep_until(wait.until))),
            stop: Box::pin(async move { stop.fired().await }),
            since,
            armed: true,
            hold: Arc::clone(&target.hold),
            metrics: Arc::clone(&target.metrics),
            place: None,
        }
    }

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
