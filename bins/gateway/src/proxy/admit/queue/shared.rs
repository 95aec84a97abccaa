//! Admission under `[cluster]`: the slot comes from the shared store (one cap and one FIFO
//! queue across every replica, `docs/scale-out.md`), then the target's local key counts it.
//!
//! The request always gets a [`Queued`]: even a free slot takes a round trip to Redis. Its wait
//! is bounded like a local one (`queue_timeout` and the client's deadline, the shutdown signal)
//! and cancellable the same way: dropping it leaves the global queue. The local key always has
//! room for a granted shared slot (this replica holds no more shared slots than the cap), so
//! the local step does not wait in practice; the same timer bounds it anyway.
//!
//! The acquire's [`Place`](slotgate_limiter_redis::Place) goes with the [`Queued`]: it says
//! when the store has taken the request into its queue (what `queue_keepalive` waits for
//! before it answers `200`, [`Queued::joined`]) and how many are ahead of it.
//!
//! The ticket goes to the store whole: a request of weight `w` holds `w` units of the shared
//! cap (and of the engine-wide cap, if the upstream has one), and waits in its priority class
//! and (under fair order) its tenant's line, by the same rules as the local limiter.

use std::sync::Arc;

use slotgate_admission::AdmitError;
use slotgate_limiter::Ticket;

use super::{Admission, Queued, Waiting};
use crate::proxy::admit::refused::Refused;
use crate::proxy::admit::slot::Slot;
use crate::proxy::client::Deadlines;
use crate::support::shutdown::ShutdownSignal;
use crate::upstreams::cluster::SharedKey;
use crate::upstreams::target::Target;

/// Joins the global queue of `target`'s shared key for `ticket`.
pub(super) fn join(
    target: &Target,
    key: &SharedKey,
    ticket: &Ticket,
    deadlines: &Deadlines,
    stop: &ShutdownSignal,
) -> Admission {
    let weight = ticket.weight_units();
    let now = tokio::time::Instant::now();
    let wait = super::wait_from(target, deadlines, now);
    let (shared, place) = key.acquire(ticket);
    let retry_after = key.store_retry_after();
    let local = target.key.clone();
    let hold = Arc::clone(&target.hold);
    let metrics = Arc::clone(&target.metrics);
    let slot = async move {
        let shared_slot = shared.await.map_err(|error| match error {
            AdmitError::QueueFull => Refused::Full,
            AdmitError::TooHeavy { weight, parallel } => Refused::TooHeavy { weight, parallel },
            AdmitError::StoreUnavailable(_) => Refused::StoreUnavailable { retry_after },
            _ => Refused::Closed,
        })?;
        // The local key counts the units for the gateway's own accounting.
        let permit = local
            .acquire_many(weight)
            .await
            .map_err(|error| super::refusal(&error))?;
        metrics
            .queue_wait
            .observe(shared_slot.waited() + permit.waited());
        Ok(Slot::new(permit, Some(shared_slot), hold, metrics))
    };
    let acquire = Waiting::Shared(Box::pin(slot), place);
    Admission::Queued(Queued::new(acquire, now, wait, target, stop))
}
