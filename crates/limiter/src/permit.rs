//! The permit: proof of one held slot, given back when it is dropped.

use std::fmt;
use std::time::Duration;

use crate::key::KeyState;
use crate::sync::Arc;

/// One held slot of a key.
///
/// Dropping the permit releases the slot: it goes straight to the head waiter of the key if
/// there is one (the key's `in_flight` count does not change), otherwise back to the pool.
/// [`release`](Permit::release) does the same, by name. A permit keeps its key's state alive,
/// so it stays valid even if the key is reconfigured or removed while it is held.
///
/// # Examples
///
/// ```
/// use slotgate_limiter::Limiter;
///
/// let limiter: Limiter = Limiter::new();
/// limiter.configure("gpu-1:8080", "llama", 1, 0);
/// let permit = limiter.try_acquire("gpu-1:8080", "llama").unwrap();
/// assert_eq!(limiter.in_flight("gpu-1:8080", "llama"), 1);
/// permit.release();
/// assert_eq!(limiter.in_flight("gpu-1:8080", "llama"), 0);
/// ```
#[must_use = "dropping a permit releases its slot at once"]
pub struct Permit {
    key: Arc<KeyState>,
    waited: Duration,
}

// === impl Permit ===

impl Permit {
    pub(crate) fn new(key: Arc<KeyState>, waited: Duration) -> Self {
        Self { key, waited }
    }

    /// How long the acquirer sat in the queue before this permit was granted: zero when a slot
    /// was free at once. Measured up to the moment the acquire future saw the grant.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Releases the slot now. The same as dropping the permit.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.key.release();
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}
