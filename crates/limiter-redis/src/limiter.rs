//! The shared limiter: keys, the lease table, the acquire paths for the store up and down, and
//! release on drop.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use slotgate_admission::{Admission, AdmitError, AdmitFuture, Occupancy, Slot};
use slotgate_limiter::{Limiter, Permit, QueueOrder, Ticket};
use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::AbortHandle;

use crate::error::{StartError, StoreError};
use crate::script::{Config, Desc, HostOccupancy, KeyNames, Op, Reply, Status, parse_refusal};
use crate::settings::{OnStoreDown, Settings};
use crate::store::{Mode, Store};

mod place;
mod tasks;

pub use place::{Place, Standing};

/// A keyed FIFO limiter whose holders and queue live in Redis, shared by every replica that
/// uses the same Redis and `key_prefix`.
///
/// It keeps the contract of [`slotgate_limiter::Limiter`] across replicas: per (host, model)
/// at most `parallel` slots held and `queue` acquirers waiting in all replicas together, FIFO
/// by arrival, a full queue refused at once, a wait cancelled by dropping its future (which
/// leaves the global queue), a slot released when it is dropped. It is used through the
/// [`Admission`] trait.
///
/// - **Leases.** Every slot and every waiter is a lease in Redis, renewed every
///   `lease_ttl / 3` by a background task for as long as it is alive here. A replica that dies
///   stops renewing, and its slots come back within `lease_ttl`.
/// - **Release on drop.** Dropping a [`Slot`] (or a waiting acquire) stops its renewal at once
///   and hands the release to a background task, which retries until it succeeds or until the
///   lease would have expired anyway.
/// - **Redis down.** See [`OnStoreDown`] and `docs/scale-out.md`.
///
/// Clones share the same state. Dropping the last clone (and every slot) stops the background
/// tasks.
///
/// # Examples
///
/// ```no_run
/// use slotgate_admission::Admission;
/// use slotgate_limiter_redis::{RedisLimiter, Settings};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let limiter = RedisLimiter::start(Settings::new("redis://127.0.0.1:6379/0"))?;
/// limiter.configure("http://gpu-1:8080", "llama", 4, 8);
/// // Every replica that runs this shares the 4 slots and the 8 places in the queue.
/// let slot = limiter.acquire("http://gpu-1:8080", "llama").await?;
/// // ... call the engine; the lease is renewed while `slot` lives.
/// drop(slot);
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct RedisLimiter {
    inner: Arc<Inner>,
}

/// The store's state and counters as seen by this replica, for metrics and status pages.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStatus {
    /// Admission goes through Redis now.
    pub up: bool,
    /// Redis answers again but this replica still applies the down policy while every replica
    /// re-registers its slots.
    pub rejoining: bool,
    /// Successful calls to Redis.
    pub round_trips: u64,
    /// Their total duration.
    pub round_trip_total: Duration,
    /// The last one's duration.
    pub last_round_trip: Duration,
    /// Calls that failed or timed out.
    pub errors: u64,
    /// Times the store was marked down.
    pub went_down: u64,
    /// Leases renewed (one per lease per renewal round).
    pub lease_renewals: u64,
    /// Leases of this replica that Redis had lost (expired or gone with its data) and that were
    /// put back at renewal.
    pub leases_lost: u64,
    /// Leases (of any replica) that this replica's calls found expired and removed.
    pub leases_expired: u64,
    /// This replica's id in the store (the start of its lease ids).
    pub replica: String,
    /// The replicas (ids, this one included) that said they were alive within the last
    /// `lease_ttl`, as of this replica's last renewal round; empty before the first.
    pub replicas_seen: Vec<String>,
}

pub(crate) struct Inner {
    pub(crate) settings: Settings,
    /// `<replica id>/`: the start of every lease id of this replica.
    replica: String,
    /// The replicas alive in the store as of the last renewal round.
    replicas_seen: Mutex<Vec<String>>,
    next: AtomicU64,
    pub(crate) store: Store,
    keys: Mutex<HashMap<(String, String), Arc<KeyEntry>>>,
    hosts: Mutex<HashMap<String, Arc<HostEntry>>>,
    leases: Mutex<HashMap<u64, Lease>>,
    /// Every slot also holds a permit of this limiter. While the store is up its keys are
    /// unlimited; when it goes down under `local-share` they shrink to the local share, so the
    /// slots granted through Redis before count against it.
    local: Limiter,
    runtime: Handle,
    tasks: Mutex<Vec<AbortHandle>>,
}

/// One (host, model) key as this replica knows it.
pub(crate) struct KeyEntry {
    host: String,
    model: String,
    pub(crate) names: KeyNames,
    /// This replica's `parallel`, `queue` and order for the key.
    limits: Mutex<(usize, usize, QueueOrder)>,
    /// The limits were changed here and not yet written to Redis: the next call writes them.
    dirty: AtomicBool,
    global: Mutex<Option<Occupancy>>,
    waiting: AtomicUsize,
    /// The key's host: its engine-wide cap.
    host_entry: Arc<HostEntry>,
}

/// One host as this replica knows it: its engine-wide cap, shared by its models.
pub(crate) struct HostEntry {
    /// The cap configured here; `None`: none.
    cap: Mutex<Option<usize>>,
    /// The cap was changed here and not yet written to Redis.
    dirty: AtomicBool,
    /// The cap as the last reply about one of the host's keys left it.
    global: Mutex<Option<HostOccupancy>>,
}

struct Lease {
    key: Arc<KeyEntry>,
    id: String,
    /// What it asks for: sent again when Redis lost it and a renewal puts it back.
    desc: Desc,
    state: LeaseState,
}

enum LeaseState {
    /// Waiting for a grant. Not `joined` while its acquire call is in flight: it is not in
    /// Redis yet (or the reply has not said so), so a renewal must not put it there.
    Waiting {
        tx: Option<oneshot::Sender<Wake>>,
        joined: bool,
    },
    Held,
}

/// The leases of one key to renew: (id, held here, what it asks for).
type Renewals = Vec<(String, bool, Desc)>;

/// What ends a wait in the global queue.
#[derive(Debug, Clone, Copy)]
enum Wake {
    Granted,
    StoreDown,
    Closed,
    /// The key's (or its host's) `parallel` shrank below the waiter's weight.
    TooHeavy(usize),
}

/// One lease of this replica: removed from the lease table (so no longer renewed) and released
/// in Redis in the background when dropped.
struct LeaseGuard {
    inner: Arc<Inner>,
    n: u64,
    key: Arc<KeyEntry>,
    id: String,
    release: bool,
}

/// A slot granted by this limiter.
struct SharedSlot {
    _lease: LeaseGuard,
    _permit: Permit,
}

/// Counts an acquire as waiting for this replica's `queued` until it is dropped.
struct WaitingCount(Arc<KeyEntry>);

enum Outcome {
    Done(Result<Slot, AdmitError>),
    /// The store's mode changed under this acquire: start again with the current one.
    Again,
}

// === impl RedisLimiter ===

impl RedisLimiter {
    /// Starts a shared limiter with these settings: validates them and spawns its background
    /// tasks (lease renewal and store probing, grant messages) on the current tokio runtime.
    ///
    /// Redis is not contacted here: the first call connects, and a Redis that is down at start
    /// is handled like one that goes down later.
    pub fn start(settings: Settings) -> Result<Self, StartError> {
        settings.validate()?;
        let runtime = Handle::try_current().map_err(StartError::NoRuntime)?;
        // Validated above, so this parses.
        let client = redis::Client::open(settings.redis_url.as_str()).map_err(|source| {
            StartError::Settings(crate::settings::SettingsErrors(vec![
                crate::settings::SettingsError::RedisUrl(source),
            ]))
        })?;
        let inner = Arc::new(Inner {
            replica: format!("{}/", uuid::Uuid::new_v4().simple()),
            replicas_seen: Mutex::new(Vec::new()),
            next: AtomicU64::new(1),
            store: Store::new(client, settings.store_timeout),
            keys: Mutex::new(HashMap::new()),
            hosts: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
            local: Limiter::new(),
            runtime,
            tasks: Mutex::new(Vec::new()),
            settings,
        });
        tasks::spawn(&inner);
        Ok(Self { inner })
    }

    /// The settings this limiter runs with.
    pub fn settings(&self) -> &Settings {
        &self.inner.settings
    }

    /// The store's state and counters as this replica sees them.
    pub fn status(&self) -> StoreStatus {
        let stats = &self.inner.store.stats;
        let mode = self.inner.store.mode();
        let micros = |c: &AtomicU64| Duration::from_micros(c.load(Ordering::Relaxed));
        StoreStatus {
            up: mode == Mode::Up,
            rejoining: matches!(mode, Mode::Rejoining { .. }),
            round_trips: stats.round_trips.load(Ordering::Relaxed),
            round_trip_total: micros(&stats.round_trip_micros),
            last_round_trip: micros(&stats.last_round_trip_micros),
            errors: stats.errors.load(Ordering::Relaxed),
            went_down: stats.went_down.load(Ordering::Relaxed),
            lease_renewals: stats.renewals.load(Ordering::Relaxed),
            leases_lost: stats.leases_lost.load(Ordering::Relaxed),
            leases_expired: stats.leases_expired.load(Ordering::Relaxed),
            replica: self.inner.replica_id().to_owned(),
            replicas_seen: self.inner.replicas_seen.lock().clone(),
        }
    }

    /// Calls `observe` with the duration of every successful call to Redis from now on (for a
    /// round-trip histogram). Only the first observer is kept; returns false for a later one.
    ///
    /// ```no_run
    /// use std::sync::atomic::{AtomicU64, Ordering};
    /// use std::sync::Arc;
    /// use slotgate_limiter_redis::{RedisLimiter, Settings};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisLimiter::start(Settings::new("redis://127.0.0.1:6379/0"))?;
    /// let slowest = Arc::new(AtomicU64::new(0));
    /// let seen = slowest.clone();
    /// limiter.observe_round_trips(move |took| {
    ///     seen.fetch_max(took.as_micros() as u64, Ordering::Relaxed);
    /// });
    /// # Ok(())
    /// # }
    /// ```
    pub fn observe_round_trips(&self, observe: impl Fn(Duration) + Send + Sync + 'static) -> bool {
        self.inner.store.observer.set(Box::new(observe)).is_ok()
    }

    /// A host's engine-wide cap across every replica, as last seen (the reply of the last call
    /// about one of its models); `None` for a host without a cap, or before any call.
    pub fn host_global(&self, host: &str) -> Option<HostOccupancy> {
        let entry = self.inner.hosts.lock().get(host).cloned()?;
        *entry.global.lock()
    }

    /// [`Admission::acquire_with`], with a [`Place`] that shows where the acquire stands: in
    /// the shared queue or not yet, and how many are expected to be granted before it.
    ///
    /// A gateway that answers a request before its slot comes (`queue_keepalive`) awaits
    /// [`Place::settled`] together with the acquire, so that it answers only once the shared
    /// queue has accepted the waiter (a full queue is still refused with a status).
    ///
    /// ```no_run
    /// use slotgate_limiter::Ticket;
    /// use slotgate_limiter_redis::{RedisLimiter, Settings, Standing};
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let limiter = RedisLimiter::start(Settings::new("redis://127.0.0.1:6379/0"))?;
    /// let (mut acquire, place) = limiter.acquire_placed("http://gpu-1:8080", "llama", &Ticket::new());
    /// tokio::select! {
    ///     slot = &mut acquire => drop(slot?), // granted at once, or refused
    ///     standing = place.settled() => {
    ///         if let Standing::Queued { ahead } = standing {
    ///             println!("queued, {ahead} ahead");
    ///         }
    ///         drop(acquire.await?);
    ///     }
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn acquire_placed(&self, host: &str, model: &str, ticket: &Ticket) -> (AdmitFuture, Place) {
        let inner = self.inner.clone();
        let key = inner.key(host, model);
        let place = Place::new();
        let acquire = Box::pin(inner.acquire(key, ticket.clone(), place.clone()));
        (acquire, place)
    }

    /// Reads again from the store how many are ahead of `place`'s acquire (one round trip
    /// while it waits in the shared queue; nothing otherwise) and returns where it stands. A
    /// failed call leaves the last count and counts against the store like any other.
    pub async fn refresh(&self, place: &Place) -> Standing {
        if let Some((key, id)) = place.lease() {
            match self.inner.call(&key, &Op::Position(&id)).await {
                Ok(reply) => {
                    self.inner.absorb(&key, &reply);
                    if let Some(ahead) = reply.ahead {
                        place.ahead(ahead);
                    }
                }
                Err(error) => self.inner.store_failed(&error),
            }
        }
        place.standing()
    }

    /// Every key this replica knows, with its limits: for metrics and status pages.
    pub fn keys(&self) -> Vec<(String, String)> {
        self.inner.keys.lock().keys().cloned().collect()
    }
}

impl fmt::Debug for RedisLimiter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisLimiter")
            .field("replica", &self.inner.replica)
            .field("key_prefix", &self.inner.settings.key_prefix)
            .field("mode", &self.inner.store.mode())
            .finish_non_exhaustive()
    }
}

impl Admission for RedisLimiter {
    fn configure(&self, host: &str, model: &str, parallel: usize, queue: usize) {
        let key = self.inner.key(host, model);
        {
            let mut limits = key.limits.lock();
            limits.0 = parallel;
            limits.1 = queue;
        }
        self.inner.configured(key);
    }

    fn configure_order(&self, host: &str, model: &str, order: QueueOrder) {
        let key = self.inner.key(host, model);
        key.limits.lock().2 = order;
        self.inner.configured(key);
    }

    fn configure_host(&self, host: &str, parallel: usize) {
        let inner = &self.inner;
        let entry = inner.host(host);
        *entry.cap.lock() = Some(parallel);
        entry.dirty.store(true, Ordering::Release);
        inner.configure_local_host(host, &entry);
        // Written with the next call about any of the host's keys; the renewer writes it too.
        // The cap alone: that key's limits are not marked changed, since writing them runs the
        // key's grant step under the store's old cap (which could refuse a waiter as too heavy
        // for a cap that is being replaced), where the local limiter only kicks the cap's line.
        if let Some(key) = inner
            .keys_now()
            .into_iter()
            .find(|key| Arc::ptr_eq(&key.host_entry, &entry))
        {
            inner.write_soon(key);
        }
    }

    fn remove(&self, host: &str, model: &str) {
        let inner = &self.inner;
        let Some(key) = inner
            .keys
            .lock()
            .remove(&(host.to_owned(), model.to_owned()))
        else {
            return;
        };
        inner.local.remove(host, model);
        inner.wake_key(&key, Wake::Closed);
    }

    fn acquire_with(&self, host: &str, model: &str, ticket: &Ticket) -> AdmitFuture {
        self.acquire_placed(host, model, ticket).0
    }

    fn local(&self, host: &str, model: &str) -> Occupancy {
        let key = self
            .inner
            .keys
            .lock()
            .get(&(host.to_owned(), model.to_owned()))
            .cloned();
        let queued = key.map_or(0, |key| key.waiting.load(Ordering::Relaxed));
        Occupancy::new(self.inner.local.in_flight(host, model), queued)
    }

    fn global(&self, host: &str, model: &str) -> Option<Occupancy> {
        let key = self
            .inner
            .keys
            .lock()
            .get(&(host.to_owned(), model.to_owned()))
            .cloned()?;
        *key.global.lock()
    }
}

// === impl Inner ===

impl Inner {
    fn key(&self, host: &str, model: &str) -> Arc<KeyEntry> {
        let mut keys = self.keys.lock();
        if let Some(key) = keys.get(&(host.to_owned(), model.to_owned())) {
            return key.clone();
        }
        let key = Arc::new(KeyEntry {
            host: host.to_owned(),
            model: model.to_owned(),
            names: KeyNames::new(&self.settings.key_prefix, host, model),
            // Unconfigured: as the local limiter.
            limits: Mutex::new((1, 0, QueueOrder::Fifo)),
            dirty: AtomicBool::new(false),
            global: Mutex::new(None),
            waiting: AtomicUsize::new(0),
            host_entry: self.host(host),
        });
        keys.insert((host.to_owned(), model.to_owned()), key.clone());
        drop(keys);
        self.configure_local(&key);
        key
    }

    fn host(&self, host: &str) -> Arc<HostEntry> {
        self.hosts
            .lock()
            .entry(host.to_owned())
            .or_insert_with(|| {
                Arc::new(HostEntry {
                    cap: Mutex::new(None),
                    dirty: AtomicBool::new(false),
                    global: Mutex::new(None),
                })
            })
            .clone()
    }

    /// The key's limits or order changed here: the local key follows, and Redis is told (in
    /// the background; an acquire of this replica sends them along first anyway).
    fn configured(self: &Arc<Self>, key: Arc<KeyEntry>) {
        self.configure_local(&key);
        key.dirty.store(true, Ordering::Release);
        self.write_soon(key);
    }

    /// Writes what was changed here about `key` or its host in the background (while the store
    /// is down, the renewer's next round after it is back writes it).
    fn write_soon(self: &Arc<Self>, key: Arc<KeyEntry>) {
        if self.store.mode() != Mode::Down {
            let inner = self.clone();
            self.runtime.spawn(async move {
                inner.write_limits(&key).await;
            });
        }
    }

    /// One script call about `key`, with this replica's configuration; limits changed here
    /// since the last call that reached Redis are written by this one.
    ///
    /// Calls of this replica reach Redis in no fixed order from the moment they read the
    /// configuration (concurrent tasks, a reconnection), so one that wrote limits may land
    /// after a later one that wrote newer limits, and leave the older ones in the store. Such
    /// a call sees it when it returns (its limits are no longer this replica's) and writes the
    /// current ones again before it returns.
    pub(crate) async fn call(&self, key: &KeyEntry, op: &Op<'_>) -> Result<Reply, StoreError> {
        let (result, mut stale) = self.call_once(key, op).await;
        while stale {
            stale = match self.call_once(key, &Op::Configure).await {
                (Ok(reply), stale) => {
                    self.absorb(key, &reply);
                    stale
                }
                // Marked to write again: the next call does.
                (Err(error), _) => {
                    self.store_failed(&error);
                    false
                }
            };
        }
        result
    }

    /// One script call (see [`Inner::call`]), and whether the limits or cap it wrote have
    /// been changed here since it read them (then they are marked to write again).
    async fn call_once(&self, key: &KeyEntry, op: &Op<'_>) -> (Result<Reply, StoreError>, bool) {
        let force_key = key.dirty.swap(false, Ordering::AcqRel);
        let force_cap = key.host_entry.dirty.swap(false, Ordering::AcqRel);
        let (parallel, queue, order) = key.limits();
        let config = Config {
            parallel,
            queue,
            order,
            cap: *key.host_entry.cap.lock(),
            force_key,
            force_cap,
        };
        let result = self.store.call(&key.names, &config, op).await;
        // Not known to have reached Redis, or overtaken by a newer write: written again.
        let again_key = force_key && (result.is_err() || key.limits() != (parallel, queue, order));
        let again_cap = force_cap && (result.is_err() || *key.host_entry.cap.lock() != config.cap);
        if again_key {
            key.dirty.store(true, Ordering::Release);
        }
        if again_cap {
            key.host_entry.dirty.store(true, Ordering::Release);
        }
        let stale = result.is_ok() && (again_key || again_cap);
        (result, stale)
    }

    fn keys_now(&self) -> Vec<Arc<KeyEntry>> {
        self.keys.lock().values().cloned().collect()
    }

    /// The local limiter's limits for a key: unlimited while admission goes through Redis,
    /// the local share while the down policy applies.
    fn configure_local(&self, key: &KeyEntry) {
        let (parallel, queue, order) = key.limits();
        let (parallel, queue) = if self.store.mode() == Mode::Up {
            (usize::MAX, usize::MAX)
        } else {
            let replicas = self.settings.replicas.max(1);
            (share(parallel, replicas), share(queue, replicas))
        };
        self.local.configure(&key.host, &key.model, parallel, queue);
        self.local.configure_order(&key.host, &key.model, order);
        self.configure_local_host(&key.host, &key.host_entry);
    }

    /// The local limiter's host cap: lifted while admission goes through Redis, the local
    /// share of the engine-wide cap while the down policy applies.
    fn configure_local_host(&self, host: &str, entry: &HostEntry) {
        let Some(cap) = *entry.cap.lock() else {
            return;
        };
        let cap = if self.store.mode() == Mode::Up {
            usize::MAX
        } else {
            share(cap, self.settings.replicas.max(1))
        };
        self.local.configure_host(host, cap);
    }

    fn ttl_millis(&self) -> u128 {
        self.settings.lease_ttl.as_millis()
    }

    fn new_lease(
        self: &Arc<Self>,
        key: &Arc<KeyEntry>,
        desc: &Desc,
        state: LeaseState,
    ) -> LeaseGuard {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}{n}/{}", self.replica, self.ttl_millis());
        self.leases.lock().insert(
            n,
            Lease {
                key: key.clone(),
                id: id.clone(),
                desc: desc.clone(),
                state,
            },
        );
        LeaseGuard {
            inner: self.clone(),
            n,
            key: key.clone(),
            id,
            release: true,
        }
    }

    async fn acquire(
        self: Arc<Self>,
        key: Arc<KeyEntry>,
        ticket: Ticket,
        place: Place,
    ) -> Result<Slot, AdmitError> {
        let started = Instant::now();
        let desc = Desc::of(&ticket);
        let _waiting = WaitingCount::new(&key);
        // `Done` however the acquire ends, dropped included.
        let place = PlaceGuard(place);
        // One lease id for the whole acquire: a call that failed may still have run in Redis,
        // so a retry sends the same id, which the script recognises (one place in line, not
        // two).
        let mut pending: Option<LeaseGuard> = None;
        loop {
            let outcome = if self.store.mode() == Mode::Up {
                self.acquire_shared(&key, (&ticket, &desc, &place.0), started, &mut pending)
                    .await
            } else {
                // The shared attempt is over: its entry in Redis, if any, is released.
                drop(pending.take());
                self.acquire_while_down(&key, (&ticket, &desc, &place.0), started)
                    .await
            };
            if let Outcome::Done(result) = outcome {
                return result;
            }
        }
    }

    /// The store is up: one script call, then (if queued) a local wait for the grant.
    ///
    /// `pending` is the lease of an earlier attempt of the same acquire whose call failed or
    /// whose wait was interrupted: it is sent again under the same id. On [`Outcome::Again`]
    /// the lease is left there for the next attempt.
    async fn acquire_shared(
        self: &Arc<Self>,
        key: &Arc<KeyEntry>,
        (ticket, desc, place): (&Ticket, &Desc, &Place),
        started: Instant,
        pending: &mut Option<LeaseGuard>,
    ) -> Outcome {
        let (tx, rx) = oneshot::channel();
        let waiting = LeaseState::Waiting {
            tx: Some(tx),
            joined: false,
        };
        // In the table before the call: a grant message may overtake the script's reply.
        let mut lease = match pending.take() {
            Some(lease) => {
                self.set_state(&lease, desc, waiting);
                lease
            }
            None => self.new_lease(key, desc, waiting),
        };
        let reply = match self.call(key, &Op::Acquire(&lease.id, desc)).await {
            Ok(reply) => reply,
            Err(error) => {
                // The script may have run: the next attempt sends the same id, and if there is
                // none, dropping the lease releases it in the background.
                self.store_failed(&error);
                *pending = Some(lease);
                return Outcome::Again;
            }
        };
        self.absorb(key, &reply);
        match reply.status {
            Status::Yes => self.set_held(lease.n),
            Status::No => {
                lease.release = false;
                return Outcome::Done(Err(AdmitError::QueueFull));
            }
            Status::Gone => {
                lease.release = false;
                return Outcome::Done(Err(AdmitError::Closed));
            }
            Status::TooHeavy(parallel) => {
                lease.release = false;
                return Outcome::Done(Err(AdmitError::TooHeavy {
                    weight: desc.weight,
                    parallel,
                }));
            }
            Status::Queued => {
                self.set_joined(lease.n);
                // Without a count (not expected), the whole queue is ahead.
                let ahead = reply.ahead.unwrap_or(reply.waiters.saturating_sub(1));
                place.queued(key, &lease.id, ahead);
                match rx.await {
                    Ok(Wake::Granted) => {}
                    Ok(Wake::Closed) => return Outcome::Done(Err(AdmitError::Closed)),
                    Ok(Wake::TooHeavy(parallel)) => {
                        // Taken out of the queue by the script: nothing to release.
                        lease.release = false;
                        return Outcome::Done(Err(AdmitError::TooHeavy {
                            weight: desc.weight,
                            parallel,
                        }));
                    }
                    Ok(Wake::StoreDown) | Err(_) => {
                        *pending = Some(lease);
                        return Outcome::Again;
                    }
                }
            }
        }
        // The shadow permit: instant while the store is up (the local key is unlimited).
        match self.local.acquire_with(&key.host, &key.model, ticket).await {
            Ok(permit) => Outcome::Done(Ok(Slot::new(
                SharedSlot {
                    _lease: lease,
                    _permit: permit,
                },
                started.elapsed(),
            ))),
            Err(error) => Outcome::Done(Err(error.into())),
        }
    }

    /// The store is down or rejoining: refuse, or admit within the local share.
    async fn acquire_while_down(
        self: &Arc<Self>,
        key: &Arc<KeyEntry>,
        (ticket, desc, place): (&Ticket, &Desc, &Place),
        started: Instant,
    ) -> Outcome {
        if self.settings.on_store_down == OnStoreDown::FailClosed {
            return Outcome::Done(Err(AdmitError::StoreUnavailable(Box::new(
                StoreError::Down,
            ))));
        }
        // The replica that marks the store down shrinks every local key to its share just
        // after; an acquire that saw the mode change first must not take an unlimited permit
        // meanwhile, so it applies the share itself.
        self.configure_local(key);
        let acquire = self.local.acquire_with(&key.host, &key.model, ticket);
        if let Some(position) = acquire.position() {
            // The local share's queue accepted it.
            place.queued_locally(position.ahead);
        }
        let permit = match acquire.await {
            Ok(permit) => permit,
            Err(error) => return Outcome::Done(Err(error.into())),
        };
        match self.store.mode() {
            // Back up while this waited: the local key is unlimited now, so go through Redis.
            Mode::Up => return Outcome::Again,
            Mode::Rejoining { .. } => {}
            Mode::Down => {
                // A lease that is not in Redis yet: the renewer puts it there on rejoining.
                let lease = self.new_lease(key, desc, LeaseState::Held);
                return Outcome::Done(Ok(Slot::new(
                    SharedSlot {
                        _lease: lease,
                        _permit: permit,
                    },
                    started.elapsed(),
                )));
            }
        }
        // Rejoining: Redis must count this slot before anyone grants through it again.
        let lease = self.new_lease(key, desc, LeaseState::Held);
        let ids = [(lease.id.clone(), true, desc.clone())];
        match self.call(key, &Op::Renew(&ids)).await {
            Ok(reply) => self.absorb(key, &reply),
            Err(error) => self.store_failed(&error),
        }
        Outcome::Done(Ok(Slot::new(
            SharedSlot {
                _lease: lease,
                _permit: permit,
            },
            started.elapsed(),
        )))
    }

    /// The acquire call says this lease is queued: from now on it is renewed as a waiter.
    fn set_joined(&self, n: u64) {
        if let Some(Lease {
            state: LeaseState::Waiting { joined, .. },
            ..
        }) = self.leases.lock().get_mut(&n)
        {
            *joined = true;
        }
    }

    /// Puts a lease of an earlier attempt back in the table in `state` (a drop of its guard is
    /// the only thing that removes it, but re-inserting keeps this obviously right).
    fn set_state(&self, lease: &LeaseGuard, desc: &Desc, state: LeaseState) {
        self.leases.lock().insert(
            lease.n,
            Lease {
                key: lease.key.clone(),
                id: lease.id.clone(),
                desc: desc.clone(),
                state,
            },
        );
    }

    fn set_held(&self, n: u64) {
        if let Some(lease) = self.leases.lock().get_mut(&n) {
            lease.state = LeaseState::Held;
        }
    }

    /// Takes in what a script reply says: the key's global counts, expiries, and grants to
    /// this replica's waiters (so they need not wait for the message).
    pub(crate) fn absorb(&self, key: &KeyEntry, reply: &Reply) {
        *key.global.lock() = Some(Occupancy::new(reply.holders, reply.waiters));
        *key.host_entry.global.lock() = reply.cap;
        let stats = &self.store.stats;
        stats
            .leases_expired
            .fetch_add(reply.expired, Ordering::Relaxed);
        stats
            .leases_lost
            .fetch_add(reply.restored, Ordering::Relaxed);
        for id in reply.granted.iter().chain(&reply.reported) {
            self.granted(id);
        }
        for (id, parallel) in &reply.refused {
            self.refused(id, *parallel);
        }
    }

    /// A grant message from any replica's script call: the lease ids it granted, and those it
    /// refused as too heavy as `!id=parallel` (a shrink written by that replica can refuse a
    /// waiter of this one, which must hear it as it hears a grant).
    pub(crate) fn told(&self, message: &str) {
        for word in message.split_whitespace() {
            match word.strip_prefix('!') {
                Some(refusal) => {
                    if let Some((id, parallel)) = parse_refusal(refusal) {
                        self.refused(&id, parallel);
                    }
                }
                None => self.granted(word),
            }
        }
    }

    /// This replica's number of a lease id, `None` for another replica's.
    fn lease_number(&self, id: &str) -> Option<u64> {
        id.strip_prefix(self.replica.as_str())
            .and_then(|rest| rest.split('/').next())
            .and_then(|n| n.parse::<u64>().ok())
    }

    /// A waiter was taken out of the queue in Redis as too heavy for `parallel` (a shrink): if
    /// it is one of this replica's, its wait ends with that refusal, and it is no longer
    /// renewed (a renewal would queue it again).
    pub(crate) fn refused(&self, id: &str, parallel: usize) {
        let Some(n) = self.lease_number(id) else {
            return;
        };
        let lease = self.leases.lock().remove(&n);
        if let Some(Lease {
            state: LeaseState::Waiting { tx: Some(tx), .. },
            ..
        }) = lease
        {
            let _ = tx.send(Wake::TooHeavy(parallel));
        }
    }

    /// A lease id was granted in Redis: if it is one of this replica's waiters, it holds now.
    pub(crate) fn granted(&self, id: &str) {
        let Some(n) = self.lease_number(id) else {
            return;
        };
        let mut leases = self.leases.lock();
        let Some(lease) = leases.get_mut(&n) else {
            // Dropped meanwhile: its release (already queued) passes the slot on.
            return;
        };
        if let LeaseState::Waiting { tx, .. } = &mut lease.state {
            let tx = tx.take();
            lease.state = LeaseState::Held;
            drop(leases);
            if let Some(tx) = tx {
                // A receiver gone means the acquire was dropped; its guard releases the lease.
                let _ = tx.send(Wake::Granted);
            }
        }
    }

    fn wake_key(&self, key: &Arc<KeyEntry>, wake: Wake) {
        self.wake_where(wake, |lease| Arc::ptr_eq(&lease.key, key));
    }

    fn wake_where(&self, wake: Wake, mut which: impl FnMut(&Lease) -> bool) {
        let senders: Vec<_> = self
            .leases
            .lock()
            .values_mut()
            .filter(|lease| which(lease))
            .filter_map(|lease| match &mut lease.state {
                LeaseState::Waiting { tx, .. } => tx.take(),
                LeaseState::Held => None,
            })
            .collect();
        for tx in senders {
            let _ = tx.send(wake);
        }
    }

    /// A call failed: mark the store down, apply the down policy to the local limits, and
    /// send the waiters to it.
    pub(crate) fn store_failed(&self, error: &StoreError) {
        if !self.store.set_down() {
            return;
        }
        self.store.stats.went_down.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            error = %error,
            cause = ?std::error::Error::source(error).map(ToString::to_string),
            policy = %self.settings.on_store_down,
            "the shared slot store is down; applying on_store_down"
        );
        for key in self.keys_now() {
            self.configure_local(&key);
        }
        self.wake_where(Wake::StoreDown, |_| true);
    }

    /// Rejoining is over: admission goes through Redis again.
    pub(crate) fn store_up(&self) {
        if self.store.set_up() {
            tracing::info!("the shared slot store is back; admitting through it again");
            for key in self.keys_now() {
                self.configure_local(&key);
            }
        }
    }

    /// Writes limits changed here, unless a call since (an acquire, say) took them along.
    async fn write_limits(&self, key: &KeyEntry) {
        if !key.dirty.load(Ordering::Acquire) && !key.host_entry.dirty.load(Ordering::Acquire) {
            return;
        }
        match self.call(key, &Op::Configure).await {
            Ok(reply) => self.absorb(key, &reply),
            Err(error) => self.store_failed(&error),
        }
    }

    /// One renewal round: every key this replica knows or holds leases of, one call each.
    /// Each call also writes limits that could not be written while the store was down.
    pub(crate) async fn renew_all(&self) -> Result<(), StoreError> {
        let mut by_key: HashMap<usize, (Arc<KeyEntry>, Renewals)> = HashMap::new();
        for key in self.keys_now() {
            by_key.insert(Arc::as_ptr(&key).addr(), (key, Vec::new()));
        }
        for lease in self.leases.lock().values() {
            let held = match lease.state {
                LeaseState::Held => true,
                LeaseState::Waiting { joined: true, .. } => false,
                LeaseState::Waiting { joined: false, .. } => continue,
            };
            by_key
                .entry(Arc::as_ptr(&lease.key).addr())
                .or_insert_with(|| (lease.key.clone(), Vec::new()))
                .1
                .push((lease.id.clone(), held, lease.desc.clone()));
        }
        for (key, ids) in by_key.into_values() {
            let reply = self.call(&key, &Op::Renew(&ids)).await?;
            self.store
                .stats
                .renewals
                .fetch_add(ids.len() as u64, Ordering::Relaxed);
            self.absorb(&key, &reply);
        }
        Ok(())
    }

    fn spawn_release(self: &Arc<Self>, key: Arc<KeyEntry>, id: String) {
        let inner = self.clone();
        // After this the lease has expired by itself: nothing left to release.
        let deadline = Instant::now() + self.settings.lease_ttl;
        let mut backoff = Duration::from_millis(20);
        self.runtime.spawn(async move {
            loop {
                match inner.call(&key, &Op::Release(&id)).await {
                    Ok(reply) => {
                        inner.absorb(&key, &reply);
                        return;
                    }
                    Err(error) => {
                        inner.store_failed(&error);
                        if Instant::now() + backoff >= deadline {
                            return;
                        }
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(inner.settings.renew_interval());
                    }
                }
            }
        });
    }

    /// This replica's id, without the separator of its lease ids.
    fn replica_id(&self) -> &str {
        self.replica.trim_end_matches('/')
    }

    /// Says this replica is alive (for `lease_ttl`) in the store's set of replicas and keeps
    /// the list of those alive: one round trip per renewal round.
    pub(crate) async fn heartbeat(&self) -> Result<(), StoreError> {
        let key = format!("{}:replicas", self.settings.key_prefix);
        let seen = self
            .store
            .heartbeat(&key, self.replica_id(), self.settings.lease_ttl)
            .await?;
        *self.replicas_seen.lock() = seen;
        Ok(())
    }

    pub(crate) fn runtime(&self) -> &Handle {
        &self.runtime
    }

    pub(crate) fn add_task(&self, task: AbortHandle) {
        self.tasks.lock().push(task);
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in self.tasks.get_mut().drain(..) {
            task.abort();
        }
    }
}

// === impl KeyEntry ===

impl KeyEntry {
    fn limits(&self) -> (usize, usize, QueueOrder) {
        *self.limits.lock()
    }
}

// === impl LeaseGuard ===

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.inner.leases.lock().remove(&self.n);
        if self.release {
            self.inner
                .spawn_release(self.key.clone(), std::mem::take(&mut self.id));
        }
    }
}

// === impl PlaceGuard ===

/// Marks an acquire's [`Place`] done when the acquire ends, however it ends.
struct PlaceGuard(Place);

impl Drop for PlaceGuard {
    fn drop(&mut self) {
        self.0.done();
    }
}

// === impl WaitingCount ===

impl WaitingCount {
    fn new(key: &Arc<KeyEntry>) -> Self {
        key.waiting.fetch_add(1, Ordering::Relaxed);
        Self(key.clone())
    }
}

impl Drop for WaitingCount {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::Relaxed);
    }
}

/// This replica's share of a limit under `local-share`: `floor(limit / replicas)`, unlimited
/// staying unlimited.
fn share(limit: usize, replicas: usize) -> usize {
    if limit == usize::MAX {
        limit
    } else {
        limit / replicas
    }
}
