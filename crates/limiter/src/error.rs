//! The ways an acquire can fail.

/// Why [`Limiter::acquire`](crate::Limiter::acquire) (or
/// [`acquire_many`](crate::Limiter::acquire_many)) gave no permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum AcquireError {
    /// `queue` acquirers were already waiting for this key. Returned at once, without waiting:
    /// the caller should go elsewhere or tell its client to retry later.
    #[error("queue full: every slot is taken and the queue is at its limit")]
    QueueFull,
    /// The key was removed while this acquirer waited (or before it arrived, through a stale
    /// [`KeyHandle`](crate::KeyHandle)).
    #[error("key closed: it was removed from the limiter")]
    Closed,
    /// The acquire asked for more units than the key allows in flight at all, so it could
    /// never be granted. Returned at once when the acquire is made; a waiter already queued
    /// gets it when a reconfiguration shrinks `parallel` below its weight. Retrying does not
    /// help: the caller should ask for less (or refuse its client's request as too large).
    #[error("weight {weight} is above the {parallel} slots of the key: it can never be granted")]
    TooHeavy {
        /// The units asked for.
        weight: usize,
        /// The `parallel` it is above.
        parallel: usize,
    },
}

/// Why [`Limiter::try_acquire`](crate::Limiter::try_acquire) (or
/// [`try_acquire_many`](crate::Limiter::try_acquire_many)) gave no permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// Not enough units are free right now, or others are already waiting for them.
    #[error("no slot free without waiting")]
    NoSlot,
    /// The key was removed.
    #[error("key closed: it was removed from the limiter")]
    Closed,
    /// The acquire asked for more units than the key allows in flight at all; see
    /// [`AcquireError::TooHeavy`].
    #[error("weight {weight} is above the {parallel} slots of the key: it can never be granted")]
    TooHeavy {
        /// The units asked for.
        weight: usize,
        /// The `parallel` it is above.
        parallel: usize,
    },
}
