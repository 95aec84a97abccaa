//! [`Places`] for the request path: one per upstream, shared by its targets. A request enters
//! before its model's slot queue and holds a [`Pass`] until its answer ends; when the engine is
//! full it waits here, in the gateway (counted, cancellable by dropping the [`Waiting`], and
//! bounded by the caller's queue timeout and deadline), instead of inside the engine.

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
    reported: Option<usize>,
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
        self.configured.or(self.reported)
    }
}

/// What [`Gate::enter`] gave.
#[derive(Debug)]
pub(crate) enum Entered {
    /// The upstream is not bounded (no `max_loaded_models`, no bound reported): nothing is
    /// held or counted.
    Open,
    /// Admitted at once.
    Go(Pass),
    /// Waiting for the model to get a place: await [`Waiting::admitted`].
    Wait(Waiting),
    /// `max_waiting` requests already wait for this model here.
    Full,
}

impl Gate {
    /// `max_loaded_models` (the operator's bound, `None`: the engine's), `collate_for`.
    pub(crate) fn new(configured: Option<usize>, collate_for: Duration) -> Self {
        Self {
            inner: Mutex::new(Inner {
                places: Places::new(configured, collate_for),
                wakers: HashMap::new(),
                configured,
                reported: None,
            }),
        }
    }

    /// A request for `model` arrives; at most `max_waiting` may wait for one model. On an
    /// upstream that is not bounded it is let through without being counted: what it has
    /// running when a bound appears is not known to the gate (the probes still show what is
    /// loaded), which at worst lets one request of another model wait inside the engine.
    pub(crate) fn enter(self: &Arc<Self>, model: &Arc<str>, max_waiting: usize) -> Entered {
        let mut inner = self.inner.lock();
        if inner.places.capacity().is_none() {
            return Entered::Open;
        }
        let now = Instant::now();
        if !inner.places.is_resident(model) && inner.places.waiting(model) >= max_waiting {
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

    /// The probes' answer: the models holding a place (loaded, loading or asleep), and the
    /// engine's own bound when it reports one.
    pub(crate) fn observe<'a>(
        &self,
        running: impl IntoIterator<Item = &'a str>,
        reported: Option<usize>,
    ) {
        let mut inner = self.inner.lock();
        let now = Instant::now();
        let mut granted = inner.places.observe(running, now);
        inner.reported = reported;
        let bound = inner.bound();
        if bound != inner.places.capacity() {
            granted.extend(inner.places.set_capacity(bound, now));
        }
        inner.wake(granted);
    }

    /// A reload's settings.
    pub(crate) fn configure(&self, configured: Option<usize>, collate_for: Duration) {
        let mut inner = self.inner.lock();
        inner.configured = configured;
        inner.places.set_collate_for(collate_for);
        let bound = inner.bound();
        let granted = inner.places.set_capacity(bound, Instant::now());
        inner.wake(granted);
    }

    /// The bound in force: configured, else reported; `None` when the upstream is not bounded.
    pub(crate) fn capacity(&self) -> Option<usize> {
        self.inner.lock().places.capacity()
    }

    /// Every model known here, for the admin API and the metrics.
    pub(crate) fn view(&self) -> BTreeMap<Arc<str>, ModelPlace> {
        self.inner.lock().places.view()
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

    use super::{Entered, Gate};

    const LONG: Duration = Duration::from_secs(3600);

    #[tokio::test]
    async fn a_waiter_is_admitted_when_the_loaded_model_drains_and_can_leave_first() {
        let gate = Arc::new(Gate::new(Some(1), LONG));
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
        let gate = Arc::new(Gate::new(Some(1), LONG));
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
        let gate = Arc::new(Gate::new(None, LONG));
        assert_eq!(gate.capacity(), None);
        assert!(matches!(gate.enter(&Arc::from("a"), 0), Entered::Open));
        gate.observe(["a"], Some(1));
        assert_eq!(gate.capacity(), Some(1));
        gate.configure(Some(2), LONG);
        assert_eq!(gate.capacity(), Some(2));
        gate.observe(["a"], Some(0));
        assert_eq!(gate.capacity(), Some(2));
        gate.configure(None, LONG);
        assert_eq!(gate.capacity(), None, "0 reported: no bound");
    }
}
