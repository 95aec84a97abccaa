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
//! [`Queued`] and waits until its [`Wait`](crate::proxy::client::Wait) ends: the target's
//! `queue_timeout`, or the client's own deadline when that is sooner. When the wait expected
//! from recent hold times (the estimate behind `Retry-After`) is already longer than what is
//! left of a *client's* deadline, the request is refused at once ([`Refused::Hopeless`]) rather
//! than queued to give up; the operator's `queue_timeout` is never anticipated this way, and
//! without an observed hold time nothing is.
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
//! [`Pass`](crate::upstreams::places::gate::Pass) that keeps the model's place until the answer
//! ends. More waiters for one model than its `parallel + queue` are [`Refused::Full`].
//!
//! Between the grant and the response head the slot is held by a [`Sending`] guard, for the
//! case the body cannot cover: the client leaving while the engine works on a request that has
//! not answered yet. The upstream connection is closed at once (hyper drops the request), but
//! the engine may not notice for a while, so the slot is kept for the upstream's `cancel_grace`
//! before it goes to the next request (see [`Sending`]).
//!
//! The parts: [`queue`] (joining a target's queue, and the wait), [`slot`] (a granted slot and
//! how it ends), [`refused`] (why no slot, and the error each refusal becomes).

use std::sync::Arc;
use std::time::Duration;

use slotgate_limiter::Ticket;

use crate::proxy::client::Deadlines;
use crate::support::shutdown::ShutdownSignal;
use crate::upstreams::target::Target;

mod queue;
mod refused;
mod slot;

use self::queue::{Admission, join};
pub(crate) use self::queue::{InLine, Queued};
pub(crate) use self::refused::{Fallback, Refused};
pub(crate) use self::slot::{Sending, Slot};

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

#[cfg(test)]
mod tests;
