//! The keyed limiter: a map from (host, model) to each key's state, and the handles into it.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use crate::error::TryAcquireError;
use crate::future::Acquire;
use crate::key::{KeyState, Limits};
use crate::permit::Permit;
use crate::sync::{Arc, RwLock};

type Models<M> = HashMap<M, Arc<KeyState>>;

/// A keyed, FIFO, cancel-safe concurrency limiter with bounded queues.
///
/// Each key is a (host, model) pair with its own limits, set by
/// [`configure`](Limiter::configure): at most `parallel` [`Permit`]s held at once, at most
/// `queue` acquirers waiting, first come first served. Past that, [`acquire`](Limiter::acquire)
/// fails at once with [`AcquireError::QueueFull`](crate::AcquireError::QueueFull).
///
/// - **Unconfigured keys** behave as `parallel = 1, queue = 0` ([`Limits::UNCONFIGURED`]).
/// - **Direct handoff:** a released permit goes straight to the head waiter; `in_flight` only
///   goes down when nobody waits, so a late arrival can never overtake the queue.
/// - **Live reconfiguration** never revokes a held permit. Shrinking `parallel` lets `in_flight`
///   drain down before new grants; growing it grants waiters at once; shrinking `queue` keeps the
///   waiters already in line.
/// - **Independent keys:** each key has its own lock, and permits and acquire futures hold their
///   key directly, so a busy key never slows another. [`handle`](Limiter::handle) resolves a key
///   once so that later acquires skip the map entirely.
/// - **O(1)** acquire, release and cancellation, however many wait.
///
/// The limiter is runtime-agnostic (it only uses [`std::task::Waker`]), `Send + Sync`, and
/// cheap to clone: clones share the same keys.
///
/// Keys are generic; `String` keys accept `&str` at every method.
///
/// # Examples
///
/// ```
/// use slotgate_limiter::{AcquireError, Limiter};
///
/// # async fn demo() -> Result<(), AcquireError> {
/// let limiter: Limiter = Limiter::new();
/// limiter.configure("http://gpu-1:8080", "llama-3-8b", 4, 16);
///
/// let permit = limiter.acquire("http://gpu-1:8080", "llama-3-8b").await?;
/// println!("waited {:?} for a slot", permit.waited());
/// // ... call the engine; dropping the permit gives the slot back.
/// drop(permit);
/// # Ok(())
/// # }
/// ```
pub struct Limiter<H = String, M = String> {
    pub(crate) hosts: Arc<RwLock<HashMap<H, Models<M>>>>,
}

/// A resolved key: acquires through it skip the limiter's map.
///
/// A handle names the key's state as it was when it was resolved. If the key is then
/// [removed](Limiter::remove), the handle stays closed (its acquires fail with
/// [`Closed`](crate::AcquireError::Closed)) even if the key is configured again later:
/// resolve a new handle after a remove.
///
/// # Examples
///
/// ```
/// use slotgate_limiter::Limiter;
///
/// let limiter: Limiter = Limiter::new();
/// limiter.configure("gpu-1", "llama", 2, 0);
/// let key = limiter.handle("gpu-1", "llama");
/// let a = key.try_acquire().unwrap();
/// let b = key.try_acquire().unwrap();
/// assert!(key.try_acquire().is_err());
/// assert_eq!(key.in_flight(), 2);
/// drop((a, b));
/// ```
#[derive(Clone)]
pub struct KeyHandle {
    key: Arc<KeyState>,
}

/// One key's state at one instant, for metrics and status pages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeySnapshot<H, M> {
    /// The key's host.
    pub host: H,
    /// The key's model.
    pub model: M,
    /// The key's limits.
    pub limits: Limits,
    /// Units held now: the sum of the weights of the permits held.
    pub in_flight: usize,
    /// Units free now but set aside for a heavy head waiter that needs more (its partial
    /// grant): not held, yet not free for anybody else. 0 when nobody waits.
    pub reserved: usize,
    /// Acquirers waiting now.
    pub queued: usize,
}

/// One key's limits and counts, read together under the key's lock (see
/// [`KeyHandle::reading`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct KeyReading {
    /// The key's limits.
    pub limits: Limits,
    /// Units held now: the sum of the weights of the permits held.
    pub in_flight: usize,
    /// Units set aside for a heavy head waiter (see [`KeySnapshot::reserved`]).
    pub reserved: usize,
    /// Acquirers waiting now.
    pub queued: usize,
}

// === impl Limiter ===

impl<H, M> Limiter<H, M>
where
    H: Hash + Eq + Clone,
    M: Hash + Eq + Clone,
{
    /// An empty limiter: every key is unconfigured.
    pub fn new() -> Self {
        Self {
            hosts: Arc::new(RwLock::new(HashMap::new())),
        }
    }

    /// Creates a key with these limits, or changes an existing key's limits live.
    ///
    /// `parallel = usize::MAX` means unlimited ([`Limits::UNLIMITED`]). `parallel = 0` grants
    /// nothing new: acquirers queue (up to `queue`) until it grows again.
    ///
    /// # Examples
    ///
    /// ```
    /// use slotgate_limiter::Limiter;
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 1, 0);
    /// let held = limiter.try_acquire("gpu-1", "llama").unwrap();
    /// limiter.configure("gpu-1", "llama", 2, 0); // growing grants at once
    /// let second = limiter.try_acquire("gpu-1", "llama").unwrap();
    /// # drop((held, second));
    /// ```
    pub fn configure<Q, R>(&self, host: &Q, model: &R, parallel: usize, queue: usize)
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        let limits = Limits { parallel, queue };
        let key = {
            let mut hosts = self.hosts.write();
            let models = hosts.entry(host.to_owned()).or_default();
            if let Some(key) = models.get(model) {
                key.clone()
            } else {
                models.insert(model.to_owned(), Arc::new(KeyState::new(limits)));
                return;
            }
        };
        // Outside the map lock: growing `parallel` wakes waiters.
        key.configure(limits);
    }

    /// Acquires a permit for the key, waiting in its queue if every slot is taken.
    ///
    /// The acquirer joins the key now (see [`Acquire`]); the returned future resolves to a
    /// [`Permit`], to [`QueueFull`](crate::AcquireError::QueueFull) on its first poll if the
    /// queue was full, or to [`Closed`](crate::AcquireError::Closed) if the key is removed while
    /// it waits. Dropping the future cancels the acquire. An unconfigured key is created with
    /// [`Limits::UNCONFIGURED`].
    pub fn acquire<Q, R>(&self, host: &Q, model: &R) -> Acquire
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        Acquire::new(self.resolve(host, model), 1)
    }

    /// Acquires a permit of `weight` units (slots) at once, for a request that occupies several
    /// of the engine's slots (an OpenAI request with `n = 3` decodes three sequences).
    ///
    /// The same queue as [`acquire`](Limiter::acquire), strictly FIFO by units: the acquire is
    /// granted when its whole weight fits under `parallel`, never in pieces, and a heavy head
    /// waiter is **never overtaken** by lighter waiters behind it, even when enough units for
    /// them are free (as tokio's `Semaphore::acquire_many`). Units released while it waits are
    /// set aside for it (its partial grant, counted in [`KeySnapshot::reserved`]); if it is
    /// cancelled they pass on to the next head, so nothing leaks.
    ///
    /// A weight above the key's `parallel` could never be granted: the future fails at once
    /// (first poll) with [`TooHeavy`](crate::AcquireError::TooHeavy), without queueing. A
    /// waiter already queued fails with it too when a reconfiguration shrinks `parallel` below
    /// its weight. A paused key (`parallel = 0`) refuses no weight: everything queues. A weight
    /// of 0 holds nothing and is granted as soon as nobody is ahead of it.
    ///
    /// The permit releases all its units at once when dropped.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Waker};
    /// use slotgate_limiter::{AcquireError, Limiter};
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 4, 8);
    /// let one = limiter.try_acquire("gpu-1", "llama").unwrap();
    ///
    /// // Three units needed, three free: granted at once.
    /// let mut three = pin!(limiter.acquire_many("gpu-1", "llama", 3));
    /// let mut cx = Context::from_waker(Waker::noop());
    /// let three = match three.as_mut().poll(&mut cx) {
    ///     std::task::Poll::Ready(Ok(permit)) => permit,
    ///     other => panic!("{other:?}"),
    /// };
    /// assert_eq!(limiter.in_flight("gpu-1", "llama"), 4);
    ///
    /// // A heavy waiter at the head holds back a light one behind it.
    /// let mut heavy = pin!(limiter.acquire_many("gpu-1", "llama", 2));
    /// let mut light = pin!(limiter.acquire("gpu-1", "llama"));
    /// assert!(heavy.as_mut().poll(&mut cx).is_pending());
    /// assert!(light.as_mut().poll(&mut cx).is_pending());
    /// drop(one); // one unit free: set aside for `heavy`, not given to `light`
    /// assert!(light.as_mut().poll(&mut cx).is_pending());
    /// drop(three); // now `heavy` fits (2), and then `light` (1)
    /// assert!(heavy.as_mut().poll(&mut cx).is_ready());
    /// assert!(light.as_mut().poll(&mut cx).is_ready());
    ///
    /// // More than `parallel` can never be granted: refused at once.
    /// let mut huge = pin!(limiter.acquire_many("gpu-1", "llama", 5));
    /// assert!(matches!(
    ///     huge.as_mut().poll(&mut cx),
    ///     std::task::Poll::Ready(Err(AcquireError::TooHeavy { weight: 5, parallel: 4 }))
    /// ));
    /// ```
    pub fn acquire_many<Q, R>(&self, host: &Q, model: &R, weight: usize) -> Acquire
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        Acquire::new(self.resolve(host, model), weight)
    }

    /// Takes a permit only if a slot is free now and nobody waits for one. Never waits.
    pub fn try_acquire<Q, R>(&self, host: &Q, model: &R) -> Result<Permit, TryAcquireError>
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        self.handle(host, model).try_acquire()
    }

    /// Takes a permit of `weight` units only if they are all free now and nobody waits. Never
    /// waits; a weight above `parallel` fails with
    /// [`TooHeavy`](crate::TryAcquireError::TooHeavy).
    ///
    /// ```
    /// use slotgate_limiter::{Limiter, TryAcquireError};
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 4, 0);
    /// let three = limiter.try_acquire_many("gpu-1", "llama", 3).unwrap();
    /// assert_eq!(three.weight(), 3);
    /// assert_eq!(
    ///     limiter.try_acquire_many("gpu-1", "llama", 2).unwrap_err(),
    ///     TryAcquireError::NoSlot
    /// );
    /// assert_eq!(
    ///     limiter.try_acquire_many("gpu-1", "llama", 9).unwrap_err(),
    ///     TryAcquireError::TooHeavy { weight: 9, parallel: 4 }
    /// );
    /// ```
    pub fn try_acquire_many<Q, R>(
        &self,
        host: &Q,
        model: &R,
        weight: usize,
    ) -> Result<Permit, TryAcquireError>
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        self.handle(host, model).try_acquire_many(weight)
    }

    /// Resolves the key once, for acquires that skip the map. Creates an unconfigured key if
    /// there is none.
    pub fn handle<Q, R>(&self, host: &Q, model: &R) -> KeyHandle
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        KeyHandle {
            key: self.resolve(host, model),
        }
    }

    /// Units of the key held now (one per [`acquire`](Limiter::acquire), `weight` per
    /// [`acquire_many`](Limiter::acquire_many)); 0 for an unknown key.
    pub fn in_flight<Q, R>(&self, host: &Q, model: &R) -> usize
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ?Sized,
        R: Hash + Eq + ?Sized,
    {
        self.find(host, model).map_or(0, |key| key.read().in_flight)
    }

    /// Acquirers of the key waiting now; 0 for an unknown key.
    pub fn queued<Q, R>(&self, host: &Q, model: &R) -> usize
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ?Sized,
        R: Hash + Eq + ?Sized,
    {
        self.find(host, model).map_or(0, |key| key.read().queued)
    }

    /// The key's limits, or `None` for a key the limiter does not know.
    pub fn limits<Q, R>(&self, host: &Q, model: &R) -> Option<Limits>
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ?Sized,
        R: Hash + Eq + ?Sized,
    {
        self.find(host, model).map(|key| key.read().limits)
    }

    /// Free slots of a host: the sum over its models of `parallel - in_flight`, never below 0
    /// per model (a shrunk key still draining counts 0), saturating at `usize::MAX`; 0 for an
    /// unknown host. Units set aside for a heavy head waiter count as free here: they are not
    /// in use, and the next release may grant them.
    ///
    /// # Examples
    ///
    /// ```
    /// use slotgate_limiter::Limiter;
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "small", 4, 0);
    /// limiter.configure("gpu-1", "large", 2, 0);
    /// let _p = limiter.try_acquire("gpu-1", "large").unwrap();
    /// assert_eq!(limiter.free_slots("gpu-1"), 5);
    /// assert_eq!(limiter.free_slots("gpu-2"), 0);
    /// ```
    pub fn free_slots<Q>(&self, host: &Q) -> usize
    where
        H: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let hosts = self.hosts.read();
        hosts.get(host).map_or(0, |models| {
            models.values().fold(0usize, |sum, key| {
                let r = key.read();
                sum.saturating_add(r.limits.parallel.saturating_sub(r.in_flight))
            })
        })
    }

    /// Every key's state, for metrics. Each key is read under its own lock, one after the other,
    /// so the readings of different keys may be from slightly different instants.
    pub fn snapshot(&self) -> Vec<KeySnapshot<H, M>> {
        let hosts = self.hosts.read();
        let mut out = Vec::with_capacity(hosts.values().map(HashMap::len).sum());
        for (host, models) in hosts.iter() {
            for (model, key) in models {
                let r = key.read();
                out.push(KeySnapshot {
                    host: host.clone(),
                    model: model.clone(),
                    limits: r.limits,
                    in_flight: r.in_flight,
                    reserved: r.reserved,
                    queued: r.queued,
                });
            }
        }
        out
    }

    /// Removes a key. Its waiters fail with [`Closed`](crate::AcquireError::Closed); permits
    /// already held stay valid and release into the removed key's state, so they no longer
    /// count against a key configured later under the same name. Returns whether the key
    /// existed.
    pub fn remove<Q, R>(&self, host: &Q, model: &R) -> bool
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ?Sized,
        R: Hash + Eq + ?Sized,
    {
        let removed = {
            let mut hosts = self.hosts.write();
            let Some(models) = hosts.get_mut(host) else {
                return false;
            };
            let removed = models.remove(model);
            if models.is_empty() {
                hosts.remove(host);
            }
            removed
        };
        // Close outside the map lock: it wakes tasks.
        removed.is_some_and(|key| {
            key.close();
            true
        })
    }

    fn find<Q, R>(&self, host: &Q, model: &R) -> Option<Arc<KeyState>>
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ?Sized,
        R: Hash + Eq + ?Sized,
    {
        self.hosts.read().get(host)?.get(model).cloned()
    }

    fn resolve<Q, R>(&self, host: &Q, model: &R) -> Arc<KeyState>
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        if let Some(key) = self.find(host, model) {
            return key;
        }
        self.hosts
            .write()
            .entry(host.to_owned())
            .or_default()
            .entry(model.to_owned())
            .or_insert_with(|| Arc::new(KeyState::new(Limits::UNCONFIGURED)))
            .clone()
    }
}

impl<H, M> Default for Limiter<H, M>
where
    H: Hash + Eq + Clone,
    M: Hash + Eq + Clone,
{
    fn default() -> Self {
        Self::new()
    }
}

impl<H, M> Clone for Limiter<H, M> {
    fn clone(&self) -> Self {
        Self {
            hosts: self.hosts.clone(),
        }
    }
}

impl<H: fmt::Debug, M: fmt::Debug> fmt::Debug for Limiter<H, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hosts = self.hosts.read();
        let mut list = f.debug_list();
        for (host, models) in hosts.iter() {
            for (model, key) in models {
                list.entry(&(host, model, key.read()));
            }
        }
        list.finish()
    }
}

// === impl KeyHandle ===

impl KeyHandle {
    /// Acquires a permit for this key; see [`Limiter::acquire`].
    pub fn acquire(&self) -> Acquire {
        Acquire::new(self.key.clone(), 1)
    }

    /// Acquires a permit of `weight` units for this key; see [`Limiter::acquire_many`].
    pub fn acquire_many(&self, weight: usize) -> Acquire {
        Acquire::new(self.key.clone(), weight)
    }

    /// Takes a permit only if a slot is free now and nobody waits; see
    /// [`Limiter::try_acquire`].
    pub fn try_acquire(&self) -> Result<Permit, TryAcquireError> {
        self.try_acquire_many(1)
    }

    /// Takes a permit of `weight` units only if they are free now and nobody waits; see
    /// [`Limiter::try_acquire_many`].
    pub fn try_acquire_many(&self, weight: usize) -> Result<Permit, TryAcquireError> {
        self.key.try_take(weight)?;
        Ok(Permit::new(
            self.key.clone(),
            weight,
            std::time::Duration::ZERO,
        ))
    }

    /// The key's limits, permits held and acquirers waiting, read together under one lock, so
    /// the three numbers always agree with each other (reading them one by one may not).
    ///
    /// ```
    /// use slotgate_limiter::Limiter;
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 2, 4);
    /// let key = limiter.handle("gpu-1", "llama");
    /// let _permit = key.try_acquire().unwrap();
    /// let now = key.reading();
    /// assert_eq!((now.limits.parallel, now.limits.queue), (2, 4));
    /// assert_eq!((now.in_flight, now.queued), (1, 0));
    /// ```
    pub fn reading(&self) -> KeyReading {
        let r = self.key.read();
        KeyReading {
            limits: r.limits,
            in_flight: r.in_flight,
            reserved: r.reserved,
            queued: r.queued,
        }
    }

    /// Units of this key held now.
    pub fn in_flight(&self) -> usize {
        self.key.read().in_flight
    }

    /// Acquirers of this key waiting now.
    pub fn queued(&self) -> usize {
        self.key.read().queued
    }

    /// This key's limits.
    pub fn limits(&self) -> Limits {
        self.key.read().limits
    }

    /// Whether the key was removed since this handle was resolved.
    pub fn is_closed(&self) -> bool {
        self.key.read().closed
    }
}

impl fmt::Debug for KeyHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyHandle")
            .field("state", &self.key.read())
            .finish()
    }
}
