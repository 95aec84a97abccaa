//! The keyed limiter: a map from (host, model) to each key's state, and the handles into it.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::fmt;
use std::hash::Hash;

use crate::error::TryAcquireError;
use crate::future::Acquire;
use crate::group::HostReading;
use crate::key::{HostCap, KeyState, Limits};
use crate::permit::Permit;
use crate::sched::{QueueOrder, Ticket};
use crate::sync::{Arc, RwLock};

/// One host's entry in the map: its models' keys and, once set, its cap.
pub(crate) struct Host<M> {
    group: Option<Arc<HostCap>>,
    models: HashMap<M, Arc<KeyState>>,
}

impl<M> Default for Host<M> {
    fn default() -> Self {
        Self {
            group: None,
            models: HashMap::new(),
        }
    }
}

impl<M: Hash + Eq> Host<M> {
    /// A new key of this host, counting against its cap if it has one.
    fn new_key(&self, limits: Limits) -> Arc<KeyState> {
        Arc::new(KeyState::new(limits, self.group.clone()))
    }
}

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
/// - **Weighted permits:** [`acquire_many`](Limiter::acquire_many) takes several units at once,
///   still strictly FIFO (a heavy head is never overtaken).
/// - **Host caps:** [`configure_host`](Limiter::configure_host) caps the sum over a host's
///   models, on top of each model's own limit.
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
    pub(crate) hosts: Arc<RwLock<HashMap<H, Host<M>>>>,
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

/// One host cap's state at one instant (see [`Limiter::host_snapshot`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostSnapshot<H> {
    /// The host.
    pub host: H,
    /// Its cap's limit and counts.
    pub cap: HostReading,
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
            let entry = hosts.entry(host.to_owned()).or_default();
            if let Some(key) = entry.models.get(model) {
                key.clone()
            } else {
                let key = entry.new_key(limits);
                entry.models.insert(model.to_owned(), key);
                return;
            }
        };
        // Outside the map lock: growing `parallel` wakes waiters.
        KeyState::configure(&key, limits);
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
        Acquire::one(self.resolve(host, model))
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
        Acquire::new(self.resolve(host, model), weight, None)
    }

    /// Acquires a permit as `ticket` says: its weight (as
    /// [`acquire_many`](Limiter::acquire_many)), its [`Priority`](crate::Priority) class, and
    /// its tenant and share for a key under [`QueueOrder::Fair`].
    ///
    /// Everything else is as [`acquire`](Limiter::acquire): a free slot with nobody waiting is
    /// taken at once; otherwise the acquire queues (or is refused at once when the key's queue
    /// is full, whatever its class) and is granted when the key's order picks it and its whole
    /// weight fits. Higher classes are picked first, within the bound of
    /// [`Priority::PASS_LIMIT`](crate::Priority::PASS_LIMIT);
    /// [`Acquire::position`] tells where it stands.
    ///
    /// # Examples
    ///
    /// ```
    /// use std::future::Future;
    /// use std::pin::pin;
    /// use std::task::{Context, Waker};
    /// use slotgate_limiter::{Limiter, Priority, QueueOrder, Ticket};
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 1, 32);
    /// limiter.configure_order("gpu-1", "llama", QueueOrder::Fair);
    /// let held = limiter.try_acquire("gpu-1", "llama").unwrap();
    ///
    /// // A busy tenant queues three, then another tenant arrives with one.
    /// let busy = Ticket::new().tenant("busy");
    /// let mut a: Vec<_> = (0..3).map(|_| limiter.acquire_with("gpu-1", "llama", &busy)).collect();
    /// let late = limiter.acquire_with("gpu-1", "llama", &Ticket::new().tenant("late"));
    /// // Round-robin between tenants: the late one is second in line, not fourth.
    /// assert_eq!(late.position().unwrap().ahead, 1);
    ///
    /// // A high-priority waiter goes first.
    /// let urgent = limiter.acquire_with(
    ///     "gpu-1",
    ///     "llama",
    ///     &Ticket::new().tenant("ops").priority(Priority::High),
    /// );
    /// assert_eq!(urgent.position().unwrap().ahead, 0);
    /// drop(held);
    /// let mut urgent = pin!(urgent);
    /// assert!(urgent.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_ready());
    /// # drop(a.drain(..));
    /// ```
    pub fn acquire_with<Q, R>(&self, host: &Q, model: &R, ticket: &Ticket) -> Acquire
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        Acquire::new(
            self.resolve(host, model),
            ticket.weight_units(),
            Some(ticket),
        )
    }

    /// Sets the order in which the key serves its waiters: [`QueueOrder::Fifo`] (the default)
    /// or [`QueueOrder::Fair`] between tenants. Live: waiters already queued keep their place
    /// and are served as before until their line empties. Creates the key (unconfigured) if
    /// there is none.
    pub fn configure_order<Q, R>(&self, host: &Q, model: &R, order: QueueOrder)
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
        R: Hash + Eq + ToOwned<Owned = M> + ?Sized,
    {
        KeyState::set_order(&self.resolve(host, model), order);
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
    /// in use, and the next release may grant them. With a host cap
    /// ([`configure_host`](Limiter::configure_host)) the sum is capped at the host's own free
    /// units, `parallel - in_flight` of the cap.
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
        hosts.get(host).map_or(0, |entry| {
            let sum = entry.models.values().fold(0usize, |sum, key| {
                let r = key.read();
                sum.saturating_add(r.limits.parallel.saturating_sub(r.in_flight))
            });
            entry.group.as_ref().map_or(sum, |group| {
                let cap = group.read();
                sum.min(cap.parallel.saturating_sub(cap.in_flight))
            })
        })
    }

    /// Every key's state, for metrics. Each key is read under its own lock, one after the other,
    /// so the readings of different keys may be from slightly different instants.
    pub fn snapshot(&self) -> Vec<KeySnapshot<H, M>> {
        let hosts = self.hosts.read();
        let mut out = Vec::with_capacity(hosts.values().map(|h| h.models.len()).sum());
        for (host, entry) in hosts.iter() {
            for (model, key) in &entry.models {
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
            let Some(entry) = hosts.get_mut(host) else {
                return false;
            };
            let removed = entry.models.remove(model);
            // A host with a cap keeps its entry: the cap outlives its models.
            if entry.models.is_empty() && entry.group.is_none() {
                hosts.remove(host);
            }
            removed
        };
        // Close outside the map lock: it wakes tasks.
        removed.is_some_and(|key| {
            KeyState::close(&key);
            true
        })
    }

    /// Caps the units in flight over **all** the host's models at `parallel`, on top of each
    /// model's own limit: for an engine whose models share one pool of slots (vLLM's
    /// adapters, a llama-server router). `usize::MAX` lifts the cap (unlimited); it can be
    /// changed live like a key's limits, and applies to the host's keys made before and after.
    ///
    /// A request then needs room at both levels, and takes both at once or neither:
    ///
    /// - **One fixed order, no deadlock:** the model's key is always locked before the host's
    ///   cap, never the other way round.
    /// - **Nothing held while waiting:** a waiter holds no units at either level until it is
    ///   granted both; it waits in its **own model's queue**, bounded by that key's `queue`
    ///   (a full queue is still refused at once) and cancelled by dropping the future, as
    ///   without a cap.
    /// - **FIFO across models:** a model whose head waiter fits its own limit but not the
    ///   host's lines up for the host cap; host units go to the models in that order, so light
    ///   requests on one model cannot starve a heavy one on another. A newcomer on another
    ///   model does not jump that line: it queues in its own key (or is refused if that queue
    ///   is full).
    /// - **Releasing frees both levels** at once; a weight above the cap's `parallel` is
    ///   refused at once with [`TooHeavy`](crate::AcquireError::TooHeavy) naming the cap.
    /// - Held permits are never revoked: shrinking the cap drains, as for a key. A key made
    ///   before the cap starts counting against it with the units it holds then.
    ///
    /// [`host_reading`](Limiter::host_reading) and [`host_snapshot`](Limiter::host_snapshot)
    /// expose the cap's limit and in-flight units for metrics.
    ///
    /// # Examples
    ///
    /// ```
    /// use slotgate_limiter::{Limiter, TryAcquireError};
    ///
    /// let limiter: Limiter = Limiter::new();
    /// // One engine, two LoRA adapters: 3 slots each, 4 for the engine as a whole.
    /// limiter.configure_host("http://vllm:8000", 4);
    /// limiter.configure("http://vllm:8000", "base+sql", 3, 8);
    /// limiter.configure("http://vllm:8000", "base+chat", 3, 8);
    ///
    /// let sql = limiter.try_acquire_many("http://vllm:8000", "base+sql", 3).unwrap();
    /// let chat = limiter.try_acquire("http://vllm:8000", "base+chat").unwrap();
    /// // base+chat has 2 slots left of its own, but the engine is full.
    /// assert_eq!(
    ///     limiter.try_acquire("http://vllm:8000", "base+chat").unwrap_err(),
    ///     TryAcquireError::NoSlot
    /// );
    /// let cap = limiter.host_reading("http://vllm:8000").unwrap();
    /// assert_eq!((cap.parallel, cap.in_flight), (4, 4));
    /// assert_eq!(limiter.free_slots("http://vllm:8000"), 0);
    /// drop((sql, chat));
    /// ```
    pub fn configure_host<Q>(&self, host: &Q, parallel: usize)
    where
        H: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = H> + ?Sized,
    {
        let (group, keys) = {
            let mut hosts = self.hosts.write();
            let entry = hosts.entry(host.to_owned()).or_default();
            if let Some(group) = &entry.group {
                (group.clone(), Vec::new())
            } else {
                let group = Arc::new(HostCap::new(parallel));
                entry.group = Some(group.clone());
                (group, entry.models.values().cloned().collect())
            }
        };
        // Outside the map lock: attaching and growing wake waiters.
        for key in keys {
            KeyState::attach(&key, &group);
        }
        group.configure(parallel);
    }

    /// The host cap's limit and counts, or `None` when the host has no cap.
    ///
    /// ```
    /// use slotgate_limiter::Limiter;
    ///
    /// let limiter: Limiter = Limiter::new();
    /// assert!(limiter.host_reading("gpu-1").is_none());
    /// limiter.configure_host("gpu-1", 8);
    /// limiter.configure("gpu-1", "a", 4, 0);
    /// let _p = limiter.try_acquire_many("gpu-1", "a", 3).unwrap();
    /// let cap = limiter.host_reading("gpu-1").unwrap();
    /// assert_eq!((cap.parallel, cap.in_flight, cap.blocked_models), (8, 3, 0));
    /// ```
    pub fn host_reading<Q>(&self, host: &Q) -> Option<HostReading>
    where
        H: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        let group = self.hosts.read().get(host)?.group.clone()?;
        Some(group.read())
    }

    /// Every host cap's state, for metrics; hosts without a cap are left out.
    pub fn host_snapshot(&self) -> Vec<HostSnapshot<H>> {
        let groups: Vec<_> = self
            .hosts
            .read()
            .iter()
            .filter_map(|(host, entry)| Some((host.clone(), entry.group.clone()?)))
            .collect();
        groups
            .into_iter()
            .map(|(host, group)| HostSnapshot {
                host,
                cap: group.read(),
            })
            .collect()
    }

    fn find<Q, R>(&self, host: &Q, model: &R) -> Option<Arc<KeyState>>
    where
        H: Borrow<Q>,
        M: Borrow<R>,
        Q: Hash + Eq + ?Sized,
        R: Hash + Eq + ?Sized,
    {
        self.hosts.read().get(host)?.models.get(model).cloned()
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
        let mut hosts = self.hosts.write();
        let entry = hosts.entry(host.to_owned()).or_default();
        if let Some(key) = entry.models.get(model) {
            return key.clone();
        }
        let key = entry.new_key(Limits::UNCONFIGURED);
        entry.models.insert(model.to_owned(), key.clone());
        key
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
        for (host, entry) in hosts.iter() {
            for (model, key) in &entry.models {
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
        Acquire::one(self.key.clone())
    }

    /// Acquires a permit as `ticket` says; see [`Limiter::acquire_with`].
    pub fn acquire_with(&self, ticket: &Ticket) -> Acquire {
        Acquire::new(self.key.clone(), ticket.weight_units(), Some(ticket))
    }

    /// Where an acquire with `ticket` would stand if it had to queue now: its expected
    /// [`ahead`](crate::QueuePosition::ahead) count among the waiters, and the waiters of its
    /// own line (its tenant's, under fair order) ahead of it. For a `Retry-After` per tenant
    /// when the queue is full, or an estimate before queueing. Nothing is reserved.
    ///
    /// ```
    /// use slotgate_limiter::{Limiter, QueueOrder, Ticket};
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 1, 2);
    /// limiter.configure_order("gpu-1", "llama", QueueOrder::Fair);
    /// let key = limiter.handle("gpu-1", "llama");
    /// let _held = key.try_acquire().unwrap();
    /// let busy = Ticket::new().tenant("busy");
    /// let _a = key.acquire_with(&busy);
    /// let _b = key.acquire_with(&busy);
    /// // The queue is full now, but a quiet tenant would be next but one, a busy one third.
    /// assert_eq!(key.position_for(&Ticket::new().tenant("quiet")).ahead, 1);
    /// assert_eq!(key.position_for(&busy).ahead, 2);
    /// ```
    pub fn position_for(&self, ticket: &Ticket) -> crate::QueuePosition {
        self.key.position_for(ticket)
    }

    /// Acquires a permit of `weight` units for this key; see [`Limiter::acquire_many`].
    pub fn acquire_many(&self, weight: usize) -> Acquire {
        Acquire::new(self.key.clone(), weight, None)
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
            None,
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

    /// The cap of this key's host, if it has one (see [`Limiter::configure_host`]), read under
    /// the cap's lock right after this call looks it up.
    pub fn host_reading(&self) -> Option<HostReading> {
        self.key.group().map(|group| group.read())
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
