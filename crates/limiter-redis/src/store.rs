//! The connection to Redis: every call bounded by `store_timeout`, timed for the round-trip
//! metric, and the replica's view of whether the store is up, down or rejoining.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::error::StoreError;
use crate::script::{self, Config, KeyNames, Op, Reply};

/// This replica's view of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Admission goes through Redis.
    Up,
    /// The last call failed; the down policy applies and the renewer probes.
    Down,
    /// Redis answered again; the down policy still applies until `until`, while every replica
    /// puts its leases back (`docs/scale-out.md`, "Switching back").
    Rejoining { until: Instant },
}

/// Counters for the metrics, all cumulative since start.
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) round_trips: AtomicU64,
    pub(crate) round_trip_micros: AtomicU64,
    pub(crate) last_round_trip_micros: AtomicU64,
    pub(crate) errors: AtomicU64,
    pub(crate) renewals: AtomicU64,
    pub(crate) leases_lost: AtomicU64,
    pub(crate) leases_expired: AtomicU64,
    pub(crate) went_down: AtomicU64,
}

/// Puts this replica in the set of replicas seen (`key`, a sorted set scored by expiry in
/// Redis's own clock), drops the expired entries, and lists the rest. ARGV: the replica id,
/// the entry's time to live in milliseconds.
const HEARTBEAT: &str = r"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('PEXPIRE', KEYS[1], 2 * ttl)
return redis.call('ZRANGE', KEYS[1], 0, -1)
";

static HEARTBEAT_SCRIPT: std::sync::LazyLock<redis::Script> =
    std::sync::LazyLock::new(|| redis::Script::new(HEARTBEAT));

/// Told the duration of every successful call to Redis (a metrics histogram, say).
pub(crate) type RoundTripObserver = Box<dyn Fn(Duration) + Send + Sync>;

/// The shared store as one replica sees it.
pub(crate) struct Store {
    client: redis::Client,
    timeout: Duration,
    /// Made on first use, once however many calls start at the same time (the others wait for
    /// it, each within its own bound); made by the next call (the renewer's probe, say) after a
    /// failed start. The manager itself reconnects after a broken connection.
    conn: tokio::sync::OnceCell<ConnectionManager>,
    mode: Mutex<Mode>,
    pub(crate) stats: Stats,
    /// Set at most once, by [`RedisLimiter::observe_round_trips`](crate::RedisLimiter::observe_round_trips).
    pub(crate) observer: OnceLock<RoundTripObserver>,
}

impl Store {
    pub(crate) fn new(client: redis::Client, timeout: Duration) -> Self {
        Self {
            client,
            timeout,
            conn: tokio::sync::OnceCell::new(),
            mode: Mutex::new(Mode::Up),
            stats: Stats::default(),
            observer: OnceLock::new(),
        }
    }

    pub(crate) fn client(&self) -> &redis::Client {
        &self.client
    }

    pub(crate) fn mode(&self) -> Mode {
        *self.mode.lock()
    }

    /// Marks the store down; true if it was not down already.
    pub(crate) fn set_down(&self) -> bool {
        let mut mode = self.mode.lock();
        let was_down = *mode == Mode::Down;
        *mode = Mode::Down;
        !was_down
    }

    /// Down → rejoining until `until`; false if the mode was not down.
    pub(crate) fn set_rejoining(&self, until: Instant) -> bool {
        let mut mode = self.mode.lock();
        if *mode == Mode::Down {
            *mode = Mode::Rejoining { until };
            true
        } else {
            false
        }
    }

    /// Rejoining → up; false if the mode was not rejoining (it went down again meanwhile).
    pub(crate) fn set_up(&self) -> bool {
        let mut mode = self.mode.lock();
        if matches!(*mode, Mode::Rejoining { .. }) {
            *mode = Mode::Up;
            true
        } else {
            false
        }
    }

    async fn connection(&self) -> Result<ConnectionManager, StoreError> {
        let conn = self
            .conn
            .get_or_try_init(|| {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(self.timeout))
                    .set_response_timeout(Some(self.timeout))
                    .set_number_of_retries(2);
                ConnectionManager::new_with_config(self.client.clone(), config)
            })
            .await?;
        Ok(conn.clone())
    }

    /// Runs one script operation on a key, bounded by `store_timeout`.
    pub(crate) async fn call(
        &self,
        names: &KeyNames,
        config: &Config,
        op: &Op<'_>,
    ) -> Result<Reply, StoreError> {
        self.timed(async {
            let mut conn = self.connection().await?;
            Ok(script::call(&mut conn, names, config, op).await?)
        })
        .await
    }

    /// Marks `replica` alive in the set `key` for `ttl` and returns every replica alive there
    /// (one round trip), bounded by `store_timeout`.
    pub(crate) async fn heartbeat(
        &self,
        key: &str,
        replica: &str,
        ttl: Duration,
    ) -> Result<Vec<String>, StoreError> {
        self.timed(async {
            let mut conn = self.connection().await?;
            let ttl = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
            Ok(HEARTBEAT_SCRIPT
                .key(key)
                .arg(replica)
                .arg(ttl)
                .invoke_async(&mut conn)
                .await?)
        })
        .await
    }

    /// `PING`, bounded by `store_timeout`: the probe while the store is down.
    pub(crate) async fn ping(&self) -> Result<(), StoreError> {
        self.timed(async {
            let mut conn = self.connection().await?;
            redis::cmd("PING").query_async::<()>(&mut conn).await?;
            Ok(())
        })
        .await
    }

    async fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = tokio::time::timeout(self.timeout, call)
            .await
            .unwrap_or(Err(StoreError::Timeout(self.timeout)));
        let elapsed = started.elapsed();
        let micros = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
        let stats = &self.stats;
        if result.is_ok() {
            stats.round_trips.fetch_add(1, Ordering::Relaxed);
            stats.round_trip_micros.fetch_add(micros, Ordering::Relaxed);
            stats
                .last_round_trip_micros
                .store(micros, Ordering::Relaxed);
            if let Some(observe) = self.observer.get() {
                observe(elapsed);
            }
        } else {
            stats.errors.fetch_add(1, Ordering::Relaxed);
        }
        result
    }
}
