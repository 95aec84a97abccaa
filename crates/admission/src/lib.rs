//! # slotgate-admission
//!
//! The one interface through which slotgate admits a request to an engine, so that the gateway
//! does not care whether the cap is kept in this process or shared by several replicas.
//!
//! - [`Admission`] is the trait: configure a key's limits, acquire a [`Slot`] (waiting in the
//!   key's FIFO queue), read this replica's own counts.
//! - This crate implements it for the in-process [`slotgate_limiter::Limiter`] (the default).
//! - `slotgate-limiter-redis` implements it on Redis, for several gateway replicas sharing one
//!   cap. It lives in its own crate so that users of the local limiter never pull in a Redis
//!   client; this crate depends on nothing but the local limiter.
//!
//! Every implementation keeps the local limiter's contract: per (host, model) at most
//! `parallel` slots held and at most `queue` acquirers waiting, first come first served; a full
//! queue is refused at once with [`AdmitError::QueueFull`]; dropping the acquire future cancels
//! the wait; dropping the [`Slot`] releases it. An unconfigured key behaves as
//! `parallel = 1, queue = 0`.
//!
//! ## Example: the gateway's view
//!
//! ```
//! use std::sync::Arc;
//! use slotgate_admission::{AdmitError, Admission};
//! use slotgate_limiter::Limiter;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! // Either `Limiter` or a shared one; the caller only sees the trait.
//! let admission: Arc<dyn Admission> = Arc::new(Limiter::<String, String>::new());
//! admission.configure("http://gpu-1:8080", "llama", 1, 0);
//!
//! let slot = admission.acquire("http://gpu-1:8080", "llama").await.unwrap();
//! assert_eq!(admission.local("http://gpu-1:8080", "llama").in_flight, 1);
//! // The only slot is taken and the queue has no room: refused at once.
//! let refused = admission.acquire("http://gpu-1:8080", "llama").await;
//! assert!(matches!(refused, Err(AdmitError::QueueFull)));
//! drop(slot);
//! assert_eq!(admission.local("http://gpu-1:8080", "llama").in_flight, 0);
//! # }
//! ```

use std::error::Error;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use slotgate_limiter::{AcquireError, Limiter, QueueOrder, Ticket};

/// The future returned by [`Admission::acquire`]: resolves to a [`Slot`] or to why none was
/// given. Dropping it cancels the wait and leaves the queue.
pub type AdmitFuture = Pin<Box<dyn Future<Output = Result<Slot, AdmitError>> + Send + 'static>>;

/// Admission to an engine: per (host, model), a bounded FIFO queue in front of `parallel`
/// slots.
///
/// Implemented by the in-process [`Limiter`] (through this crate) and by
/// `slotgate_limiter_redis::RedisLimiter`, whose keys are shared by every replica that uses the
/// same Redis and key prefix.
///
/// # Examples
///
/// ```
/// use slotgate_admission::Admission;
/// use slotgate_limiter::Limiter;
///
/// fn setup(admission: &dyn Admission) {
///     admission.configure("http://gpu-1:8080", "llama", 4, 8);
/// }
/// setup(&Limiter::<String, String>::new());
/// ```
pub trait Admission: Send + Sync + fmt::Debug + 'static {
    /// Creates a key with these limits or changes them live. `parallel = usize::MAX` means
    /// unlimited. Never revokes a held slot; shrinking `queue` keeps those already waiting.
    fn configure(&self, host: &str, model: &str, parallel: usize, queue: usize);

    /// Forgets the key on this replica: its waiters here fail with [`AdmitError::Closed`];
    /// slots already held stay valid until dropped.
    fn remove(&self, host: &str, model: &str);

    /// Caps the units in flight over all the host's models at `parallel` (an engine-wide cap,
    /// see [`Limiter::configure_host`]); `usize::MAX` lifts it. Never revokes a held slot.
    fn configure_host(&self, host: &str, parallel: usize);

    /// Sets the order in which the key serves its waiters (FIFO, or fair between tenants);
    /// waiters already queued keep their place (see [`Limiter::configure_order`]).
    fn configure_order(&self, host: &str, model: &str, order: QueueOrder);

    /// Joins the key's queue now for one unit, as an anonymous normal-class request, and
    /// returns a future for the slot: [`acquire_with`](Admission::acquire_with) with
    /// [`Ticket::new`].
    fn acquire(&self, host: &str, model: &str) -> AdmitFuture {
        self.acquire_with(host, model, &Ticket::new())
    }

    /// Joins the key's queue now as `ticket` says (its weight in units, its priority class,
    /// its tenant and share under fair order) and returns a future for the slot.
    ///
    /// The place in line is taken when the returned future is first polled (for the local
    /// limiter, already when it is created). Refusals ([`AdmitError::QueueFull`],
    /// [`AdmitError::TooHeavy`], [`AdmitError::StoreUnavailable`]) come back without waiting.
    /// Dropping the future leaves the queue; dropping the [`Slot`] releases it.
    fn acquire_with(&self, host: &str, model: &str, ticket: &Ticket) -> AdmitFuture;

    /// This replica's own slots held and acquirers waiting for the key.
    fn local(&self, host: &str, model: &str) -> Occupancy;

    /// The key's counts across every replica, when the implementation shares them (the last
    /// value seen, not a fresh read); `None` for a purely local implementation.
    fn global(&self, host: &str, model: &str) -> Option<Occupancy> {
        let _ = (host, model);
        None
    }
}

/// How many slots of a key are held and how many acquirers wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Occupancy {
    /// Slots held.
    pub in_flight: usize,
    /// Acquirers waiting.
    pub queued: usize,
}

impl Occupancy {
    /// Counts of held slots and waiting acquirers.
    ///
    /// ```
    /// let o = slotgate_admission::Occupancy::new(2, 1);
    /// assert_eq!((o.in_flight, o.queued), (2, 1));
    /// ```
    pub fn new(in_flight: usize, queued: usize) -> Self {
        Self { in_flight, queued }
    }
}

/// Anything that holds a slot until it is dropped: the local limiter's permit, a lease in a
/// shared store. Implemented for every `Send + Sync` type.
pub trait Held: Send + Sync + 'static {}

impl<T: Send + Sync + 'static> Held for T {}

/// One held slot. Dropping it releases the slot (for a shared store: in the background, see
/// that implementation's docs); [`release`](Slot::release) does the same by name.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use slotgate_admission::Slot;
///
/// struct Token; // whatever the implementation releases on drop
/// let slot = Slot::new(Token, Duration::from_millis(5));
/// assert_eq!(slot.waited(), Duration::from_millis(5));
/// slot.release();
/// ```
#[must_use = "dropping a slot releases it at once"]
pub struct Slot {
    waited: Duration,
    _held: Box<dyn Held>,
}

// === impl Slot ===

impl Slot {
    /// A slot that lives as long as `held`, granted after waiting `waited`.
    pub fn new(held: impl Held, waited: Duration) -> Self {
        Self {
            waited,
            _held: Box::new(held),
        }
    }

    /// How long the acquirer waited in the queue (zero when a slot was free at once).
    pub fn waited(&self) -> Duration {
        self.waited
    }

    /// Releases the slot now. The same as dropping it.
    pub fn release(self) {
        drop(self);
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("waited", &self.waited)
            .finish_non_exhaustive()
    }
}

/// Why [`Admission::acquire`] gave no slot.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AdmitError {
    /// `queue` acquirers were already waiting: refused at once. Retry later or elsewhere.
    #[error("queue full: every slot is taken and the queue is at its limit")]
    QueueFull,
    /// The key was removed while this acquirer waited.
    #[error("key closed: it was removed")]
    Closed,
    /// The weight asked for is above `parallel` (the key's, or its host cap's), so it could
    /// never be granted: refused at once, or when a shrink left a waiter too heavy.
    #[error("{weight} units can never fit under parallel = {parallel}")]
    TooHeavy {
        /// The units asked for.
        weight: usize,
        /// The limit it is above.
        parallel: usize,
    },
    /// The shared store that keeps the cap cannot be reached and the policy is to refuse
    /// rather than risk exceeding the cap. Retry after a short while.
    #[error("the shared slot store is unavailable")]
    StoreUnavailable(#[source] Box<dyn Error + Send + Sync + 'static>),
}

impl From<AcquireError> for AdmitError {
    fn from(error: AcquireError) -> Self {
        match error {
            AcquireError::QueueFull => Self::QueueFull,
            AcquireError::TooHeavy { weight, parallel } => Self::TooHeavy { weight, parallel },
            // `AcquireError` is non-exhaustive: anything new means this key gives no slot.
            _ => Self::Closed,
        }
    }
}

// === impl Admission for Limiter ===

impl Admission for Limiter<String, String> {
    fn configure(&self, host: &str, model: &str, parallel: usize, queue: usize) {
        Limiter::configure(self, host, model, parallel, queue);
    }

    fn remove(&self, host: &str, model: &str) {
        Limiter::remove(self, host, model);
    }

    fn configure_host(&self, host: &str, parallel: usize) {
        Limiter::configure_host(self, host, parallel);
    }

    fn configure_order(&self, host: &str, model: &str, order: QueueOrder) {
        Limiter::configure_order(self, host, model, order);
    }

    fn acquire_with(&self, host: &str, model: &str, ticket: &Ticket) -> AdmitFuture {
        // Joined here, synchronously: the place in line is the order of the calls.
        let acquire = Limiter::acquire_with(self, host, model, ticket);
        Box::pin(async move {
            let permit = acquire.await?;
            let waited = permit.waited();
            Ok(Slot::new(permit, waited))
        })
    }

    fn local(&self, host: &str, model: &str) -> Occupancy {
        Occupancy::new(self.in_flight(host, model), self.queued(host, model))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn local_limiter_through_the_trait_is_fifo_and_cancellable() {
        let limiter: Limiter = Limiter::new();
        let admission: &dyn Admission = &limiter;
        admission.configure("h", "m", 1, 2);
        let first = admission.acquire("h", "m").await.unwrap();
        let second = admission.acquire("h", "m");
        let third = admission.acquire("h", "m");
        assert_eq!(admission.local("h", "m"), Occupancy::new(1, 2));
        assert!(matches!(
            admission.acquire("h", "m").await,
            Err(AdmitError::QueueFull)
        ));
        drop(second);
        assert_eq!(admission.local("h", "m"), Occupancy::new(1, 1));
        drop(first);
        let third = third.await.unwrap();
        assert_eq!(admission.local("h", "m"), Occupancy::new(1, 0));
        assert!(admission.global("h", "m").is_none());
        admission.remove("h", "m");
        drop(third);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn removed_key_fails_its_waiters_with_closed() {
        let limiter: Limiter = Limiter::new();
        let admission: &dyn Admission = &limiter;
        admission.configure("h", "m", 1, 1);
        let held = admission.acquire("h", "m").await.unwrap();
        let waiting = admission.acquire("h", "m");
        admission.remove("h", "m");
        assert!(matches!(waiting.await, Err(AdmitError::Closed)));
        drop(held);
    }
}
