//! Helpers for the tests against a real Redis: the shared server (with a clear failure when it
//! is missing), a key prefix per test that is deleted afterwards, private `redis-server`
//! processes for the down/up cases, and bounded polling.

#![allow(dead_code, unreachable_pub)]

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use slotgate_limiter_redis::{OnStoreDown, RedisLimiter, Settings};

/// The Redis the tests share: `SLOTGATE_TEST_REDIS_URL`, or `127.0.0.1:6379`.
pub fn redis_url() -> String {
    std::env::var("SLOTGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn sync_connection(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).expect("a redis:// URL");
    let mut conn = client.get_connection().unwrap_or_else(|error| {
        panic!(
            "these tests need a Redis server at {url} ({error}); start one with \
             `redis-server --save '' --appendonly no &` or set SLOTGATE_TEST_REDIS_URL"
        )
    });
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .unwrap_or_else(|error| panic!("Redis at {url} does not answer PING: {error}"));
    conn
}

/// A key prefix of its own for one test; every key under it is deleted when it drops, even
/// when the test panics.
pub struct Prefix {
    pub url: String,
    pub prefix: String,
}

impl Prefix {
    pub fn new(url: &str) -> Self {
        // Fails here, with the message above, when Redis is missing.
        drop(sync_connection(url));
        Self {
            url: url.to_owned(),
            prefix: format!("slotgate-test-{}", uuid::Uuid::new_v4().simple()),
        }
    }

    pub fn settings(&self, lease_ttl: Duration, on_store_down: OnStoreDown) -> Settings {
        let mut settings = Settings::new(&self.url);
        settings.key_prefix.clone_from(&self.prefix);
        settings.lease_ttl = lease_ttl;
        settings.store_timeout = Duration::from_millis(200).min(lease_ttl / 3);
        settings.on_store_down = on_store_down;
        settings
    }

    pub fn limiter(&self, lease_ttl: Duration) -> RedisLimiter {
        RedisLimiter::start(self.settings(lease_ttl, OnStoreDown::FailClosed)).unwrap()
    }

    /// The key's units held, waiters, `parallel` and `queue` as Redis holds them now (read by
    /// a small script, since the host's state is one msgpack value); `None` before the
    /// key was written.
    pub fn counts(&self, host: &str, model: &str) -> Option<[usize; 4]> {
        self.state(host, model).map(|s| s.counts)
    }

    /// The key's counts, whether it is in fair order, and its host's cap, as Redis holds them.
    pub fn state(&self, host: &str, model: &str) -> Option<KeyState> {
        const READ: &str = r"
            local raw = redis.call('GET', KEYS[1])
            if not raw then return {} end
            local S = cmsgpack.unpack(raw)
            local K = (S.m or {})[ARGV[1]]
            if not K then return {} end
            local fair = 0
            if K.ord == 'fair' then fair = 1 end
            local cap = -1
            if S.cap then cap = S.cap.p end
            return {K.inf, K.n, K.p, K.q, fair, cap}
        ";
        let key = format!("{}:{{{}:{host}}}:state", self.prefix, host.len());
        let client = redis::Client::open(self.url.as_str()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        let read: Vec<i64> = redis::cmd("EVAL")
            .arg(READ)
            .arg(1)
            .arg(key)
            .arg(model)
            .query(&mut conn)
            .ok()?;
        let [inf, n, p, q, fair, cap] = read.try_into().ok()?;
        let count = |v: i64| usize::try_from(v).unwrap_or(0);
        Some(KeyState {
            counts: [count(inf), count(n), count(p), count(q)],
            fair: fair == 1,
            cap: usize::try_from(cap).ok(),
        })
    }

    /// Units held (`"holders"`) or waiters (`"waiters"`) of the key in Redis now.
    pub fn zcard(&self, host: &str, model: &str, set: &str) -> usize {
        let counts = self.counts(host, model).unwrap_or_default();
        match set {
            "holders" => counts[0],
            "waiters" => counts[1],
            other => panic!("no count {other:?}"),
        }
    }

    /// The key's limits as Redis holds them, `None` before any were written.
    pub fn limits(&self, host: &str, model: &str) -> Option<(usize, usize)> {
        self.counts(host, model).map(|c| (c[2], c[3]))
    }

    fn cleanup(&self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.prefix))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _ = redis::cmd("DEL").arg(keys).query::<()>(&mut conn);
        }
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// One key as Redis holds it (see [`Prefix::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyState {
    /// Units held, waiters, `parallel`, `queue`.
    pub counts: [usize; 4],
    /// In fair order.
    pub fair: bool,
    /// The host's cap, if it has one.
    pub cap: Option<usize>,
}

/// A private `redis-server` on a free loopback port, without persistence, stopped on drop.
pub struct PrivateRedis {
    pub port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let mut redis = Self { port, child: None };
        redis.restart();
        redis
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server (again, on the same port, empty) and waits until it answers.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "already running");
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
        self.child = Some(child);
        let url = self.url();
        wait_until(
            Duration::from_secs(10),
            "the private redis-server answers",
            || {
                redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                    .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                    .is_ok()
            },
        );
    }

    /// Kills the server (SIGKILL: its data is gone, as after a crash).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Polls `done` every 10ms until it holds, failing the test after `limit`.
pub fn wait_until(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting until {what}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The async twin of [`wait_until`], for conditions read inside a runtime.
pub async fn eventually(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(
            start.elapsed() < limit,
            "timed out after {limit:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
