//! The ways an acquire can fail.

/// Why [`Limiter::acquire`](crate::Limiter::acquire) gave no permit.
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
}

/// Why [`Limiter::try_acquire`](crate::Limiter::try_acquire) gave no permit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
#[non_exhaustive]
pub enum TryAcquireError {
    /// No slot is free right now, or others are already waiting for one.
    #[error("no slot free without waiting")]
    NoSlot,
    /// The key was removed.
    #[error("key closed: it was removed from the limiter")]
    Closed,
}
