//! [`Places`] for the request path: one per upstream, shared by its targets. A request enters
//! before its model's slot queue and holds a [`Pass`] until its answer ends; when the engine is
//! full it waits here, in the gateway (counted, cancellable by dropping the [`Waiting`], and
//! bounded by the caller's queue timeout and deadline), instead of inside the engine.
//!
//! Every request is counted, bounded upstream or not, so a bound that appears later finds every
//! request it must know about.
//!
//! # Until the engine's bound is known
//!
//! An engine that may report its bound (a llama-server: a router's `max_instances`) and has no
//! configured one is *held* until a check has read it ([`Gate::report`]): requests wait here
//! meanwhile, in the same line as any wait for a place. The check that runs before the gateway
//! serves, and before a reload adds the upstream, reads it at once when the engine answers; a
//! check that could not read it (no answer within `health_check_timeout`) leaves the hold for the
//! next one, one `health_check_interval` later. After `eject_after_failures` such checks in a row
//! the gate stops waiting for the bound: requests go on, counted, and a bound read later still
//! finds them. A single-model llama-server answers that it has no bound, which ends the hold.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Arrival, ModelPlace, Places, Ticket};

/// One upstream's places, behind a lock, with the waiters' wake-ups.
#[derive(Debug)]
pub(crate) struct Gate {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    places: Places,
    wakers: HashMap<Ticket, oneshot::Sender<()>>,
    /// The configured bound (`max_loaded_models`), which wins over what the engine reports.
    configured: Option<usize>,
    /// What the engine reports (router `max_instances`).
    reported: Report,
}

/// What is known of the engine's own bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Report {
    /// Not read yet, by an engine that may report one: `failed` checks could not read it.
    Awaited {
        /// Checks in a row that could not read it.
        failed: usize,
    },
    /// Read (`None`: the engine has none), never awaited (an engine that does not report one),
    /// or no longer awaited.
    Known(Option<usize>),
}

/// What one check learnt of the engine's own bound ([`Gate::report`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BoundRead {
    /// The engine answered: it holds at most this many models (`None` or 0: no bound).
    Read(Option<usize>),
    /// The check could not read it (no answer in time, or none that could be read).
    Unread,
}

impl Inner {
    fn wake(&mut self, granted: Vec<Ticket>) {
        for ticket in granted {
            if let Some(waker) = self.wakers.remove(&ticket) {
                // The receiver is dropped only under this lock, after cancelling: never here.
                let _ = waker.send(());
            }
        }
    }

    fn bound(&self) -> Option<usize> {
        match self.reported {
            Report::Known(reported) => self.configured.or(reported),
            Report::Awaited { .. } => self.configured,
        }
    }

    /// Applies the bound in force and whether requests are held for it; wakes who may go.
    fn settle(&mut self, now: Instant) {
        let held = self.configured.is_none() && matches!(self.reported, Report::Awaited { .. });
        let mut granted = Vec::new();
        let bound = self.bound();
        if bound != self.places.capacity() {
            granted.extend(self.places.set_capacity(bound, now));
        }
        if held != self.places.is_held() {
            granted.extend(self.places.set_held(held, now));
        }
        self.wake(granted);
    }
}

/// What [`Gate::enter`] gave.
#[derive(Debug)]
pub(crate) enum Entered {
    /// Admitted at once.
    Go(Pass),
    /// Waiting for the model to get a place: await [`Waiting::admitted`].
    Wait(Waiting),
    /// `max_waiting` requests already wait for this model here.
    Full,
}

impl Gate {
    /// `max_loaded_models` (the operator's bound, `None`: the engine's), `collate_for`, and
    /// whether the engine may report a bound of its own (a llama-server): then, without a
    /// configured bound, requests are held until a check has read it (see the
    /// [module docs](self)).
    pub(crate) fn new(configured: Option<usize>, collate_for: Duration, may_report: bool) -> Self {
        let reported = if may_report {
            Report::Awaited { failed: 0 }
        } else {
            Report::Known(None)
        };
        let mut inner = Inner {
            places: Places::new(configured, collate_for),
            wakers: HashMap::new(),
            configured,
            reported,
        };
        inner.settle(Instant::now());
        Self {
            inner: Mutex::new(inner),
        }
    }

    /// A request for `model` arrives; at most `max_waiting` may wait for one model. Counted
    /// whether the upstream is bounded or not (see the [module docs](self)).
    pub(crate) fn enter(self: &Arc<Self>, model: &Arc<str>, max_waiting: usize) -> Entered {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        if !inner.places.would_go(model, now) && inner.places.waiting(model) >= max_waiting {
            return Entered::Full;
        }
        match inner.places.arrive(model, now) {
            Arrival::Go => Entered::Go(self.pass(model)),
            Arrival::Wait(ticket) => {
                let (tx, rx) = oneshot::channel();
                inner.wakers.insert(ticket, tx);
                Entered::Wait(Waiting {
                    gate: Arc::clone(self),
                    model: Arc::clone(model),
                    ticket,
                    granted: rx,
                    done: false,
                })
            }
        }
    }

    fn pass(self: &Arc<Self>, model: &Arc<str>) -> Pass {
        Pass {
            gate: Arc::clone(self),
            model: Arc::clone(model),
        }
    }

    /// The probes' answer: the models holding a place (loaded, loading or asleep).
    pub(crate) fn observe<'a>(&self, running: impl IntoIterator<Item = &'a str>) {
        let mut inner = self.inner.lock();
        let granted = inner.places.observe(running, Instant::now());
        inner.wake(granted);
    }

    /// What a check of an engine that may report a bound learnt of it. A bound once read is
    /// kept when a later check cannot read it. Until one is read, the `give_up_after`-th check
    /// in a row that could not read it ends the hold (returns `true` then, once).
    pub(crate) fn report(&self, read: BoundRead, give_up_after: usize) -> bool {
        let mut inner = self.inner.lock();
        let mut gave_up = false;
        inner.reported = match (read, inner.reported) {
            (BoundRead::Read(bound), _) => Report::Known(bound.filter(|&n| n > 0)),
            (BoundRead::Unread, Report::Awaited { failed }) if failed + 1 >= give_up_after => {
                gave_up = true;
                Report::Known(None)
            }
            (BoundRead::Unread, Report::Awaited { failed }) => {
                Report::Awaited { failed: failed + 1 }
            }
            (BoundRead::Unread, known @ Report::Known(_)) => known,
        };
        inner.settle(Instant::now());
        gave_up
    }

    /// A reload's settings.
    pub(crate) fn configure(&self, configured: Option<usize>, collate_for: Duration) {
        let mut inner = self.inner.lock();
        inner.configured = configured;
        inner.places.set_collate_for(collate_for);
        inner.settle(Instant::now());
    }

    /// Whether requests wait for the engine's bound to be read.
    #[cfg(test)]
    pub(crate) fn is_held(&self) -> bool {
        self.inner.lock().places.is_held()
    }

    /// The bound in force: configured, else reported; `None` when the upstream is not bounded.
    pub(crate) fn capacity(&self) -> Option<usize> {
        self.inner.lock().places.capacity()
    }

    /// Every model known here, for the admin API and the metrics.
    pub(crate) fn view(&self) -> BTreeMap<Arc<str>, ModelPlace> {
        self.inner.lock().places.view()
    }

    /// Whether a request for `model` arriving now would go at once ([`Places::would_go`]).
    pub(crate) fn would_go(&self, model: &str) -> bool {
        self.inner.lock().places.would_go(model, Instant::now())
    }

    /// The models a waiting `ticket` is behind ([`Places::models_ahead`]).
    pub(crate) fn models_ahead(&self, ticket: Ticket) -> Option<usize> {
        self.inner.lock().places.models_ahead(ticket)
    }

    fn leave(&self, model: &str) {
        let mut inner = self.inner.lock();
        let granted = inner.places.leave(model, Instant::now());
        inner.wake(granted);
    }
}

/// A request admitted by its upstream's [`Gate`]: its model keeps its place until this is
/// dropped (with the answer).
#[derive(Debug)]
pub(crate) struct Pass {
    gate: Arc<Gate>,
    model: Arc<str>,
}

impl Drop for Pass {
    fn drop(&mut self) {
        self.gate.leave(&self.model);
    }
}

/// A request waiting for its model to get a place. Dropping it before it is admitted gives up
/// its turn (and, if the grant raced the drop, the place it was given).
#[derive(Debug)]
pub(crate) struct Waiting {
    gate: Arc<Gate>,
    model: Arc<str>,
    ticket: Ticket,
    granted: oneshot::Receiver<()>,
    /// Turned into a [`Pass`]: nothing to undo.
    done: bool,
}

impl Waiting {
    /// Its turn in the gate's line, for [`Gate::models_ahead`].
    pub(crate) fn ticket(&self) -> Ticket {
        self.ticket
    }

    /// Waits until admitted. Cancel-safe: dropping the future drops the `Waiting`.
    pub(crate) async fn admitted(mut self) -> Pass {
        // The sender lives in the gate until it is used: an error means it was dropped with the
        // gate, which outlives its waiters; treat it as admitted so nothing waits forever.
        let _ = (&mut self.granted).await;
        self.done = true;
        self.gate.pass(&self.model)
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let mut inner = self.gate.inner.lock();
        inner.wakers.remove(&self.ticket);
        let now = Instant::now();
        let (was_waiting, mut granted) = inner.places.cancel(self.ticket, now);
        if !was_waiting {
            // Granted while being dropped: give the place back.
            granted.extend(inner.places.leave(&self.model, now));
        }
        inner.wake(granted);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use futures::FutureExt;

    use super::{BoundRead, Entered, Gate};

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_waiter_is_admitted_when_the_loaded_model_drains_and_can_leave_first() {
        let gate = Arc::new(Gate::new(Some(1), LONG, true));
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let Entered::Go(running) = gate.enter(&a, 4) else {
            panic!("a goes")
        };
        let Entered::Wait(first) = gate.enter(&b, 2) else {
            panic!("b waits")
        };
        let Entered::Wait(second) = gate.enter(&b, 2) else {
            panic!("b waits")
        };
        assert!(matches!(gate.enter(&b, 2), Entered::Full), "2 wait already");
        // The first b leaves before its turn: it never reaches the engine.
        drop(first);
        assert_eq!(gate.view()[&b].waiting, 1);
        drop(running);
        let pass = tokio::time::timeout(LONG, second.admitted())
            .await
            .expect("admitted once a drained");
        let view = gate.view();
        assert!(view[&b].resident && !view[&a].resident);
        assert_eq!(view[&b].admitted, 1);
        drop(pass);
        assert_eq!(gate.view()[&b].admitted, 0);
    }

    #[tokio::test]
    async fn a_waiter_dropped_after_its_grant_gives_the_place_back() {
        let gate = Arc::new(Gate::new(Some(1), LONG, true));
        let (a, b, c): (Arc<str>, Arc<str>, Arc<str>) =
            (Arc::from("a"), Arc::from("b"), Arc::from("c"));
        let Entered::Go(running) = gate.enter(&a, 4) else {
            panic!("a goes")
        };
        let Entered::Wait(b_waits) = gate.enter(&b, 4) else {
            panic!("b waits")
        };
        let Entered::Wait(c_waits) = gate.enter(&c, 4) else {
            panic!("c waits")
        };
        drop(running); // grants b, whose client is gone before it polls
        drop(b_waits);
        let pass = tokio::time::timeout(LONG, c_waits.admitted())
            .await
            .expect("c admitted after b gave its place back");
        assert!(gate.view()[&c].resident);
        drop(pass);
    }

    #[tokio::test]
    async fn the_engine_reports_its_bound_and_the_setting_wins() {
        let gate = Arc::new(Gate::new(None, LONG, true));
        assert!(gate.is_held(), "a llama-server's bound is awaited");
        assert!(!gate.report(BoundRead::Read(Some(1)), 3));
        assert_eq!(gate.capacity(), Some(1));
        assert!(!gate.is_held());
        gate.configure(Some(2), LONG);
        assert_eq!(gate.capacity(), Some(2));
        gate.report(BoundRead::Read(Some(0)), 3);
        assert_eq!(gate.capacity(), Some(2));
        gate.configure(None, LONG);
        assert_eq!(gate.capacity(), None, "0 reported: no bound");
        // A bound once read stays when a later check cannot read it.
        gate.report(BoundRead::Read(Some(1)), 3);
        gate.report(BoundRead::Unread, 3);
        assert_eq!(gate.capacity(), Some(1));
        // An engine that never reports one is not waited for.
        assert!(!Gate::new(None, LONG, false).is_held());
        assert!(!Gate::new(Some(1), LONG, true).is_held(), "configured");
    }

    #[tokio::test]
    async fn requests_wait_for_the_bound_and_then_follow_the_rule() {
        let gate = Arc::new(Gate::new(None, LONG, true));
        let (a, b): (Arc<str>, Arc<str>) = (Arc::from("a"), Arc::from("b"));
        let waiting: Vec<_> = [&a, &b, &a, &b]
            .into_iter()
            .map(|model| match gate.enter(model, 4) {
                Entered::Wait(waiting) => (Arc::clone(model), waiting),
                other => panic!("held: {other:?}"),
            })
            .collect();
        assert_eq!(gate.view()[&a].waiting, 2);
        gate.observe(["a"]);
        assert!(!gate.report(BoundRead::Unread, 3), "one failed read");
        assert!(gate.is_held());
        // Read: one place, "a" loaded: a's waiters go, b's wait for a to drain.
        gate.report(BoundRead::Read(Some(1)), 3);
        let mut passes = Vec::new();
        let mut still = Vec::new();
        for (model, waiting) in waiting {
            // Granted or not by now: a grant is sent before `report` returns.
            match waiting.admitted().now_or_never() {
                Some(pass) => passes.push((model, pass)),
                None => still.push(model),
            }
        }
        assert_eq!(still, [Arc::clone(&b), Arc::clone(&b)], "b waits");
        assert!(passes.iter().all(|(model, _)| *model == a));
        assert_eq!(gate.view()[&a].admitted, 2, "counted");
    }

    #[tokio::test]
    async fn the_hold_ends_after_failed_reads_and_what_went_is_counted() {
        let gate = Arc::new(Gate::new(None, LONG, true));
        let a: Arc<str> = Arc::from("a");
        let Entered::Wait(waiting) = gate.enter(&a, 4) else {
            panic!("held")
        };
        assert!(!gate.report(BoundRead::Unread, 2));
        assert!(gate.report(BoundRead::Unread, 2), "gave up");
        assert!(!gate.report(BoundRead::Unread, 2), "once");
        let pass = tokio::time::timeout(LONG, waiting.admitted())
            .await
            .expect("let go");
        let Entered::Go(second) = gate.enter(&a, 4) else {
            panic!("no bound: goes")
        };
        // A bound read later knows both.
        gate.report(BoundRead::Read(Some(1)), 2);
        assert_eq!(gate.view()[&a].admitted, 2);
        assert!(matches!(gate.enter(&Arc::from("b"), 4), Entered::Wait(_)));
        drop((pass, second));
    }
}
