//! The permit: proof of held units (one slot, or `weight` of them), given back when dropped.

use std::fmt;
use std::time::{Duration, Instant};

use crate::key::KeyState;
use crate::sync::Arc;

/// Units held on a key: one slot from [`acquire`](crate::Limiter::acquire), `weight` slots from
/// [`acquire_many`](crate::Limiter::acquire_many).
///
/// Dropping the permit releases its whole weight at once: the units go straight to the head
/// waiter of the key if there is one (granting it if its weight now fits, else staying set
/// aside for it), otherwise back to the pool.
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
    weight: usize,
    waited: Duration,
    handed_over: Option<Instant>,
}

// === impl Permit ===

impl Permit {
    pub(crate) fn new(
        key: Arc<KeyState>,
        weight: usize,
        waited: Duration,
        handed_over: Option<Instant>,
    ) -> Self {
        Self {
            key,
            weight,
            waited,
            handed_over,
        }
    }

    /// The units this permit holds (and gives back when dropped).
    pub fn weight(&self) -> usize {
        self.weight
    }

    /// How long the acquirer sat in the queue before this permit was granted: zero when a slot
    /// was free at once. Measured from the acquire call up to the handoff
    /// ([`handed_over`](Permit::handed_over)); the time from there until the acquirer uses the
    /// units is the handoff gap, not counted here.
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// When the units were handed over to this permit's acquirer while it waited in the queue:
    /// the instant of the grant step that freed them (a release, a cancel or a reconfiguration,
    /// under the key's lock). `None` when a slot was free at once.
    ///
    /// The time from here to the moment the acquirer puts the units to use is the handoff gap:
    /// a slot that is paid for and idle while the waiter wakes up.
    ///
    /// ```
    /// use slotgate_limiter::Limiter;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() {
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 1, 1);
    /// let first = limiter.try_acquire("gpu-1", "llama").unwrap();
    /// assert!(first.handed_over().is_none(), "free at once");
    /// let waiting = limiter.acquire("gpu-1", "llama");
    /// drop(first); // the grant step hands the slot over here
    /// let second = waiting.await.unwrap();
    /// let gap = second.handed_over().unwrap().elapsed();
    /// assert!(gap < std::time::Duration::from_secs(60));
    /// # }
    /// ```
    pub fn handed_over(&self) -> Option<Instant> {
        self.handed_over
    }

    /// Releases the units now. The same as dropping the permit.
    pub fn release(self) {
        drop(self);
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        KeyState::release(&self.key, self.weight);
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("weight", &self.weight)
            .field("waited", &self.waited)
            .field("handed_over", &self.handed_over)
            .finish_non_exhaustive()
    }
}
