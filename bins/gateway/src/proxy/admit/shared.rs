//! Admission under `[cluster]`: the slot comes from the shared store (one cap and one FIFO
//! queue across every replica, `docs/scale-out.md`), then the target's local key counts it.
//!
//! The wait is bounded like the local one (`queue_timeout`, the shutdown signal) and
//! cancellable the same way: dropping the future leaves the global queue. The local key always
//! has room for a granted shared slot (this replica holds no more shared slots than the cap),
//! so the local step does not wait in practice; it is bounded by the same `queue_timeout`
//! anyway.
//!
//! Weights: the shared store counts one slot per request, so a request that needs several
//! sequences (`n`, `best_of`) is refused with [`Refused::Unshared`] (a `400`) rather than let
//! it take more of the engine than the cap says.

use std::time::{Duration, Instant};

use slotgate_admission::AdmitError;
use slotgate_limiter::AcquireError;

use super::{QueuedGuard, Refused, Slot};
use crate::shutdown::ShutdownSignal;
use crate::upstreams::cluster::SharedKey;
use crate::upstreams::target::Target;

/// Takes one slot of `target` through its shared key, waiting up to its `queue_timeout` or
/// until `stop` fires.
pub(super) async fn enter(
    target: &Target,
    shared: &SharedKey,
    weight: usize,
    stop: &mut ShutdownSignal,
) -> Result<Slot, Refused> {
    if weight > 1 {
        return Err(Refused::Unshared { weight });
    }
    // Limited models only go through the store, and they always have a queue timeout.
    let limit = target.queue_timeout.unwrap_or(Duration::MAX);
    let deadline = Instant::now().checked_add(limit);
    let acquire = shared.acquire();
    // Counts the client leaving while queued (this future dropped mid-await, the guard armed).
    let mut waiting = QueuedGuard(Some(&target.metrics));
    let outcome = tokio::select! {
        biased;
        () = stop.fired() => None,
        outcome = tokio::time::timeout(limit, acquire) => Some(outcome),
    };
    waiting.0 = None;
    let held = match outcome {
        // The acquire future is dropped here: the place in the global queue is given up.
        None => return Err(Refused::ShuttingDown),
        Some(Err(_elapsed)) => return Err(Refused::Timeout(limit)),
        Some(Ok(Ok(held))) => held,
        Some(Ok(Err(AdmitError::QueueFull))) => return Err(Refused::Full),
        Some(Ok(Err(AdmitError::StoreUnavailable(_)))) => {
            return Err(Refused::StoreUnavailable {
                retry_after: shared.store_retry_after(),
            });
        }
        Some(Ok(Err(_))) => return Err(Refused::Closed),
    };
    // The local key counts the slot; what is left of the wait bounds it.
    let left = deadline.map_or(limit, |deadline| {
        deadline.saturating_duration_since(Instant::now())
    });
    let permit = match tokio::time::timeout(left, target.key.acquire_many(1)).await {
        Err(_elapsed) => return Err(Refused::Timeout(limit)),
        Ok(Err(AcquireError::QueueFull)) => return Err(Refused::Full),
        Ok(Err(_)) => return Err(Refused::Closed),
        Ok(Ok(permit)) => permit,
    };
    target
        .metrics
        .queue_wait
        .observe(held.waited() + permit.waited());
    Ok(Slot::new(permit, Some(held), target))
}
