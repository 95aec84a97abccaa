//! `[cluster]` end to end: two `slotgate` processes (the built binary) in front of one fake
//! engine share its caps and queues through Redis (`docs/scale-out.md`): one cap and one FIFO
//! queue per model, and fair order, priority classes, weighted requests and an engine-wide cap
//! by the same rules as one gateway.
//!
//! They need the Redis on `127.0.0.1:6379` (or `SLOTGATE_TEST_REDIS_URL`) and fail with a
//! message saying so when it is missing; the store-down tests start their own `redis-server` on
//! a free port and stop it. Every test uses its own key prefix and deletes its keys; every
//! process a test starts, it stops (dropping a [`Replica`] kills it).

mod support;

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fake_upstream::{FakeConfig, FakeUpstream, Observer};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;
use support::{slotgate, write};

const MODEL: &str = "m";
/// Bound on anything that should happen soon on a loaded 2-core machine (reached only when a
/// test fails).
const SOON: Duration = Duration::from_secs(20);

fn redis_url() -> String {
    std::env::var("SLOTGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

/// A sync connection to `url`, failing the test with a clear message when Redis is missing.
fn redis_conn(url: &str) -> redis::Connection {
    let client = redis::Client::open(url).expect("a redis:// URL");
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|error| {
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

/// This test's key prefix in a Redis; deletes every key under it when dropped.
struct Prefix {
    url: String,
    name: String,
}

impl Prefix {
    fn new(url: &str, test: &str) -> Self {
        let prefix = Self {
            url: url.to_owned(),
            name: format!("slotgate-e2e-{test}-{}", std::process::id()),
        };
        prefix.cleanup();
        prefix
    }

    /// The fake's key in Redis as `[units held, waiters, parallel, queue]`, read by a small
    /// script (the host's state is one msgpack value, see `KeyNames`); zeros before the
    /// key was written.
    fn counts(&self, fake: &FakeUpstream, model: &str) -> [usize; 4] {
        const READ: &str = r"
            local raw = redis.call('GET', KEYS[1])
            if not raw then return {0, 0, 0, 0} end
            local K = (cmsgpack.unpack(raw).m or {})[ARGV[1]]
            if not K then return {0, 0, 0, 0} end
            return {K.inf, K.n, K.p, K.q}
        ";
        let host = format!("http://{}", fake.addr());
        let key = format!("{}:{{{}:{host}}}:state", self.name, host.len());
        let counts: Vec<usize> = redis::cmd("EVAL")
            .arg(READ)
            .arg(1)
            .arg(key)
            .arg(model)
            .query(&mut redis_conn(&self.url))
            .unwrap();
        counts.try_into().unwrap()
    }

    /// Units held (`"holders"`) or waiters (`"waiters"`) of the fake's key in Redis.
    fn zcard(&self, fake: &FakeUpstream, set: &str) -> usize {
        let counts = self.counts(fake, MODEL);
        if set == "holders" {
            counts[0]
        } else {
            counts[1]
        }
    }

    fn cleanup(&self) {
        let Ok(client) = redis::Client::open(self.url.as_str()) else {
            return;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
            return;
        };
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{}:*", self.name))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _: redis::RedisResult<()> = redis::cmd("DEL").arg(keys).query(&mut conn);
        }
    }
}

impl Drop for Prefix {
    fn drop(&mut self) {
        self.cleanup();
    }
}

/// A private `redis-server` on a free loopback port, without persistence, stopped on drop.
struct PrivateRedis {
    port: u16,
    child: Option<Child>,
}

impl PrivateRedis {
    fn start() -> Self {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free loopback port");
        let mut redis = Self { port, child: None };
        redis.restart();
        redis
    }

    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Starts the server (again, on the same port, empty) and waits until it answers.
    fn restart(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server is installed (apt-get install redis-server)");
        self.child = Some(child);
        let deadline = Instant::now() + SOON;
        loop {
            let up = redis::Client::open(self.url().as_str())
                .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
                .and_then(|mut c| redis::cmd("PING").query::<String>(&mut c))
                .is_ok();
            if up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the private redis-server answers"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills the server (SIGKILL: its data is gone, as after a crash).
    fn stop(&mut self) {
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

/// One `slotgate serve` process; killed (SIGKILL) and reaped when dropped.
struct Replica {
    child: Child,
    api: SocketAddr,
    /// The admin listener, when the configuration has one.
    admin: Option<SocketAddr>,
}

impl Replica {
    fn start(name: &str, toml: &str) -> Self {
        let path = write(&format!("cluster-{name}.toml"), toml);
        let mut child = slotgate()
            .args(["serve", "--log-format", "json", "--config"])
            .arg(&path)
            .stderr(Stdio::piped())
            .spawn()
            .expect("the slotgate binary starts");
        let mut lines = BufReader::new(child.stderr.take().expect("stderr is piped")).lines();
        let deadline = Instant::now() + SOON;
        let wants_admin = toml.contains("admin_listen");
        let (mut api, mut admin) = (None, None);
        while api.is_none() || (wants_admin && admin.is_none()) {
            assert!(Instant::now() < deadline, "no 'listening' log lines");
            let line = lines.next().expect("the gateway logs").expect("a log line");
            let log: Value = serde_json::from_str(&line).unwrap_or_default();
            let field =
                |name: &str| -> Option<SocketAddr> { log["fields"][name].as_str()?.parse().ok() };
            if line.contains("API listening") {
                api = field("api_addr");
            } else if line.contains("admin listening") {
                admin = field("admin_addr");
            }
        }
        let api = api.expect("api_addr in the log line");
        // Keep reading the logs, so the gateway never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
        Self { child, api, admin }
    }

    /// `kill -9`.
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}

fn config(fake: &FakeUpstream, cluster: &str, parallel: usize, queue: usize) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[cluster]
{cluster}

[upstreams.engine]
url = "{url}"
kind = "llama-server"

[upstreams.engine.models.{MODEL}]
parallel = {parallel}
queue = {queue}
queue_timeout = "30s"
"#,
        url = fake.url(),
    )
}

fn cluster(url: &str, prefix: &Prefix, extra: &str) -> String {
    format!(
        "redis_url = \"{url}\"\nkey_prefix = \"{}\"\nlease_ttl = \"2s\"\nstore_timeout = \"300ms\"\n{extra}",
        prefix.name
    )
}

/// A complete answer: status, headers, body.
#[derive(Debug)]
struct Reply {
    status: u16,
    retry_after: Option<u64>,
    body: Bytes,
}

impl Reply {
    fn problem_type(&self) -> String {
        let doc: Value = serde_json::from_slice(&self.body).unwrap_or_default();
        doc["type"].as_str().unwrap_or_default().to_owned()
    }

    /// Asserts a 503 problem of `slug` with a `Retry-After`.
    fn assert_503(&self, slug: &str) {
        assert_eq!(self.status, 503, "{self:?}");
        assert!(
            self.problem_type().ends_with(&format!("/{slug}")),
            "{self:?}"
        );
        assert!(
            self.retry_after.is_some_and(|s| s >= 1),
            "Retry-After: {self:?}"
        );
    }
}

/// A streamed `POST /v1/chat/completions` with `id` as the request id and `headers` for the
/// fake, read to its end.
async fn chat(addr: SocketAddr, id: String, headers: &[(&str, &str)]) -> Reply {
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": true,
    });
    let mut request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-request-id", id.as_str());
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client.request(request).await.expect("the gateway answers");
    let (head, body) = response.into_parts();
    let body = body.collect().await.expect("the whole body").to_bytes();
    Reply {
        status: head.status.as_u16(),
        retry_after: head
            .headers
            .get("retry-after")
            .and_then(|v| v.to_str().ok()?.parse().ok()),
        body,
    }
}

/// `GET path` on `addr`: status and body.
async fn get(addr: SocketAddr, path: &str) -> (u16, String) {
    let request = Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .expect("the admin listener answers");
    let status = response.status().as_u16();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// The first event of the status page's stream (`GET /admin/events`), its `data` parsed.
async fn first_status_event(admin: SocketAddr) -> Value {
    let request = Request::get(format!("http://{admin}/admin/events"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client
        .request(request)
        .await
        .expect("the admin listener answers");
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut text = String::new();
    while !text.contains("\n\n") {
        let frame = tokio::time::timeout(SOON, body.frame())
            .await
            .expect("an event within SOON")
            .expect("the stream goes on")
            .expect("a clean frame");
        if let Ok(data) = frame.into_data() {
            text.push_str(&String::from_utf8_lossy(&data));
        }
    }
    let data: String = text
        .lines()
        .take_while(|line| !line.is_empty())
        .filter_map(|line| line.strip_prefix("data: "))
        .collect();
    serde_json::from_str(&data).unwrap_or_else(|e| panic!("an event's data is JSON ({e}): {text}"))
}

/// A chat request for `n` choices (no stream), answered at once.
async fn chat_n(addr: SocketAddr, n: u32) -> Reply {
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "n": n,
    });
    let request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = client.request(request).await.expect("the gateway answers");
    let (head, body) = response.into_parts();
    Reply {
        status: head.status.as_u16(),
        retry_after: None,
        body: body.collect().await.unwrap().to_bytes(),
    }
}

/// Polls `done` until it holds, failing after [`SOON`].
async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + SOON;
    while !done() {
        assert!(Instant::now() < deadline, "not within {SOON:?}: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Request ids in the order the engine started them.
fn started_order(observer: &Observer, ids: &[String]) -> Vec<String> {
    let mut started: Vec<_> = observer
        .requests()
        .into_iter()
        .filter(|r| ids.contains(&r.id))
        .filter_map(|r| Some((r.started_at?, r.id)))
        .collect();
    started.sort();
    started.into_iter().map(|(_, id)| id).collect()
}

async fn engine(slots: usize) -> FakeUpstream {
    FakeUpstream::start(FakeConfig::llama_server(slots).model(MODEL))
        .await
        .expect("the fake engine starts")
}

/// Spawns [`chat`].
fn spawn_chat(
    addr: SocketAddr,
    id: impl Into<String>,
    headers: &'static [(&'static str, &'static str)],
) -> tokio::task::JoinHandle<Reply> {
    tokio::spawn(chat(addr, id.into(), headers))
}

const QUICK: &[(&str, &str)] = &[("x-fake-hold-ms", "50")];
const SHORT_HOLD: &[(&str, &str)] = &[("x-fake-hold-ms", "400")];
const QUEUED_HOLD: &[(&str, &str)] = &[("x-fake-hold-ms", "1600")];
const LONG_HOLD: &[(&str, &str)] = &[("x-fake-hold-ms", "3000")];
const HOLDS: [&[(&str, &str)]; 4] = [
    &[("x-fake-hold-ms", "4000")],
    &[("x-fake-hold-ms", "4400")],
    &[("x-fake-hold-ms", "4800")],
    &[("x-fake-hold-ms", "5200")],
];
/// A stream of 20 s: long enough to be held until the test ends it.
const STREAM: &[(&str, &str)] = &[("x-fake-tokens", "400"), ("x-fake-chunk-interval-ms", "50")];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_one_cap_and_one_fifo_queue() {
    let url = redis_url();
    redis_conn(&url);
    let prefix = Prefix::new(&url, "cap");
    // The engine has room for 16: only the shared cap keeps it at 4.
    let fake = engine(16).await;
    let toml = config(&fake, &cluster(&url, &prefix, ""), 4, 8);
    let a = Replica::start("cap-a", &toml);
    let b = Replica::start("cap-b", &toml);
    let gateways = [a.api, b.api];

    // 4 holders, 2 through each gateway, released 400 ms apart so that each release grants
    // one waiter at a time and the grant order is plain to see at the engine.
    let mut served = Vec::new();
    for (i, hold) in HOLDS.into_iter().enumerate() {
        served.push(spawn_chat(gateways[i % 2], format!("hold-{i}"), hold));
    }
    eventually("4 slots held on the engine", || {
        fake.observer().in_flight() == 4
    })
    .await;

    // 8 queued, alternating gateways, each in the global queue before the next arrives.
    let mut arrival = Vec::new();
    for i in 0..8 {
        let id = format!("queued-{i}");
        arrival.push(id.clone());
        served.push(spawn_chat(gateways[i % 2], id, QUEUED_HOLD));
        eventually("the request waits in the global queue", || {
            prefix.zcard(&fake, "waiters") == i + 1
        })
        .await;
    }
    // The last 28 of the 40 find the global queue full: refused at once, whichever gateway.
    let refused: Vec<_> = (0..28)
        .map(|i| spawn_chat(gateways[i % 2], format!("refused-{i}"), QUICK))
        .collect();
    for task in refused {
        task.await.unwrap().assert_503("queue-full");
    }
    for task in served {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    assert_eq!(
        fake.observer().peak_in_flight(),
        4,
        "the engine saw one cap, not two"
    );
    assert_eq!(
        started_order(fake.observer(), &arrival),
        arrival,
        "grants follow arrival across the two gateways"
    );
    assert!(
        fake.observer()
            .requests()
            .iter()
            .all(|r| !r.id.starts_with("refused-"))
    );

    // The store's state and the key's global counts, on the admin listener.
    let admin = a.admin.expect("an admin listener");
    let (status, metrics) = get(admin, "/metrics").await;
    assert_eq!(status, 200);
    for series in [
        "slotgate_store_up 1",
        "slotgate_store_round_trip_seconds_count",
        "slotgate_lease_renewals_total",
        "slotgate_leases_expired_total",
        "slotgate_cluster_slots_in_use{upstream=\"engine\",model=\"m\"}",
        "slotgate_cluster_queue_depth{upstream=\"engine\",model=\"m\"}",
        "slotgate_cluster_replicas_seen ",
    ] {
        assert!(metrics.contains(series), "{series} in {metrics}");
    }
    let (status, upstreams) = get(admin, "/admin/upstreams").await;
    assert_eq!(status, 200);
    let upstreams: Value = serde_json::from_str(&upstreams).unwrap();
    assert_eq!(upstreams["store"]["up"], true, "{upstreams}");
    assert!(
        upstreams["store"]["round_trips"].as_u64() > Some(0),
        "{upstreams}"
    );
    let model = &upstreams["upstreams"][0]["models"][0];
    assert!(model["cluster"]["in_flight"].is_u64(), "{model}");

    // The replicas seen (issue #33): both, each renewal round; the status page's events carry
    // the same store document beside the shared counts.
    let deadline = Instant::now() + SOON;
    loop {
        let (_, upstreams) = get(admin, "/admin/upstreams").await;
        let upstreams: Value = serde_json::from_str(&upstreams).unwrap();
        let store = &upstreams["store"];
        if store["replicas_seen"] == 2 {
            let ids = store["replicas"].as_array().expect("the ids seen");
            assert!(ids.contains(&store["replica"]), "{store}");
            break;
        }
        assert!(Instant::now() < deadline, "two replicas seen: {store}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let event = first_status_event(admin).await;
    assert_eq!(event["store"]["replicas_seen"], 2, "{event}");
    let model = &event["upstreams"][0]["models"][0];
    assert!(model["cluster"]["in_flight"].is_u64(), "{model}");
    assert!(model["cluster"]["queued"].is_u64(), "{model}");

    // Several sequences are counted by the shared store as that many units (issue #33).
    let heavy = chat_n(b.api, 2).await;
    assert_eq!(heavy.status, 200, "{heavy:?}");
    drop((a, b));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateways_slots_come_back_when_its_leases_expire() {
    let url = redis_url();
    redis_conn(&url);
    let prefix = Prefix::new(&url, "kill");
    let fake = engine(16).await;
    let toml = config(&fake, &cluster(&url, &prefix, ""), 4, 8);
    let mut a = Replica::start("kill-a", &toml);
    let b = Replica::start("kill-b", &toml);

    // Long streams: 2 through each gateway hold the 4 slots.
    let streams: Vec<_> = (0..4)
        .map(|i| spawn_chat([a.api, b.api][i % 2], format!("stream-{i}"), STREAM))
        .collect();
    eventually("4 streams on the engine", || {
        fake.observer().in_flight() == 4
    })
    .await;
    let queued: Vec<_> = (0..2)
        .map(|i| spawn_chat(b.api, format!("queued-{i}"), QUICK))
        .collect();
    eventually("2 wait in the global queue", || {
        prefix.zcard(&fake, "waiters") == 2
    })
    .await;

    a.kill();
    let killed = Instant::now();
    for task in queued {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    // lease_ttl (2 s) after A's last renewal, which was at most one renewal interval (2/3 s)
    // before the kill; plus slack for a loaded machine.
    let bound = Duration::from_millis(2000 + 667 + 2000);
    assert!(
        killed.elapsed() < bound,
        "served {:?} after the kill",
        killed.elapsed()
    );
    assert!(fake.observer().peak_in_flight() <= 4, "never above the cap");
    for task in streams {
        task.abort();
    }
    drop(b);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_client_that_leaves_leaves_the_global_queue() {
    let url = redis_url();
    redis_conn(&url);
    let prefix = Prefix::new(&url, "leave");
    let fake = engine(16).await;
    let toml = config(&fake, &cluster(&url, &prefix, ""), 4, 8);
    let a = Replica::start("leave-a", &toml);
    let b = Replica::start("leave-b", &toml);
    let held: Vec<_> = (0..4)
        .map(|i| spawn_chat(a.api, format!("hold-{i}"), LONG_HOLD))
        .collect();
    eventually("4 slots held", || fake.observer().in_flight() == 4).await;
    let leaving = spawn_chat(b.api, "leaving", QUICK);
    eventually("it waits in the global queue", || {
        prefix.zcard(&fake, "waiters") == 1
    })
    .await;
    // The client goes away: its connection closes, the gateway drops the wait.
    leaving.abort();
    eventually("it left the global queue", || {
        prefix.zcard(&fake, "waiters") == 0
    })
    .await;
    for task in held {
        assert_eq!(task.await.unwrap().status, 200);
    }
    assert!(
        fake.observer().request("leaving").is_none(),
        "it never reached the engine"
    );
    drop((a, b));
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_fail_closed_refuses_then_recovers() {
    let mut redis = PrivateRedis::start();
    let prefix = Prefix::new(&redis.url(), "down-closed");
    let fake = engine(16).await;
    let toml = config(&fake, &cluster(&redis.url(), &prefix, ""), 4, 8);
    let a = Replica::start("closed-a", &toml);
    assert_eq!(chat(a.api, "before".into(), QUICK).await.status, 200);

    redis.stop();
    chat(a.api, "down".into(), QUICK)
        .await
        .assert_503("store-unavailable");
    assert!(fake.observer().request("down").is_none());

    redis.restart();
    let mut n = 0;
    let deadline = Instant::now() + SOON;
    loop {
        n += 1;
        let reply = chat(a.api, format!("back-{n}"), QUICK).await;
        if reply.status == 200 {
            break;
        }
        reply.assert_503("store-unavailable");
        assert!(
            Instant::now() < deadline,
            "not admitting again after Redis came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(a);
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_local_share_admits_each_replicas_share() {
    let mut redis = PrivateRedis::start();
    let prefix = Prefix::new(&redis.url(), "down-share");
    let fake = engine(16).await;
    let extra = "on_store_down = \"local-share\"\nreplicas = 2";
    let toml = config(&fake, &cluster(&redis.url(), &prefix, extra), 4, 8);
    let a = Replica::start("share-a", &toml);
    let b = Replica::start("share-b", &toml);
    assert_eq!(chat(a.api, "before".into(), QUICK).await.status, 200);

    redis.stop();
    fake.observer().reset_peak();
    // A replica admits its share, floor(4 / 2) = 2, at once and queues floor(8 / 2) = 4: all 6
    // served, never more than 2 at once on the engine.
    let tasks: Vec<_> = (0..6)
        .map(|i| spawn_chat(a.api, format!("down-{i}"), SHORT_HOLD))
        .collect();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{reply:?}");
    }
    assert_eq!(fake.observer().peak_in_flight(), 2, "one replica's share");

    redis.restart();
    eventually("the store is used again", || {
        redis::Client::open(redis.url().as_str())
            .and_then(|c| c.get_connection_with_timeout(Duration::from_millis(200)))
            .and_then(|mut c| {
                redis::cmd("KEYS")
                    .arg(format!("{}:*", prefix.name))
                    .query::<Vec<String>>(&mut c)
            })
            .is_ok_and(|keys| !keys.is_empty())
    })
    .await;
    assert_eq!(chat(b.api, "after".into(), QUICK).await.status, 200);
    drop((a, b));
    fake.shutdown().await;
}

#[test]
fn check_prints_the_cluster_table_and_refuses_bad_settings() {
    let good = r#"
[server]
listen = "127.0.0.1:0"

[cluster]
redis_url = "redis://:hunter2@127.0.0.1:6379/0"
key_prefix = "check"

[upstreams.engine]
url = "http://127.0.0.1:9"
kind = "vllm"

[upstreams.engine.models.m]
parallel = 4
queue = 8
queue_timeout = "30s"
"#;
    let out = slotgate()
        .args(["check", "--config"])
        .arg(write("cluster-check.toml", good))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for line in [
        "[cluster]",
        "key_prefix = \"check\"",
        "lease_ttl = \"10s\"",
        "store_timeout = \"1s\"",
        "on_store_down = \"fail-closed\"",
    ] {
        assert!(stdout.contains(line), "{line} in {stdout}");
    }
    assert!(
        !stdout.contains("hunter2"),
        "the password is redacted: {stdout}"
    );

    let bad = good.replace("key_prefix = \"check\"", "on_store_down = \"local-share\"");
    let out = slotgate()
        .args(["check", "--config"])
        .arg(write("cluster-bad.toml", &bad))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(stderr.contains("cluster.replicas"), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_changes_limits_in_the_store_but_not_the_cluster_table() {
    let url = redis_url();
    redis_conn(&url);
    let prefix = Prefix::new(&url, "reload");
    let fake = engine(16).await;
    let path = write(
        "cluster-reload.toml",
        &config(&fake, &cluster(&url, &prefix, ""), 4, 8),
    );
    let loaded = slotgate_config::Config::load(&path).unwrap();
    let gateway = slotgate_gateway::Gateway::bind_file(&loaded, &path)
        .await
        .expect("the gateway starts");
    let limits = || -> Option<usize> { Some(prefix.counts(&fake, MODEL)[2]) };
    eventually("the limits are written to Redis", || limits() == Some(4)).await;

    std::fs::write(&path, config(&fake, &cluster(&url, &prefix, ""), 2, 8)).unwrap();
    gateway.reload().await.expect("a limits change reloads");
    eventually("the new limit is in Redis", || limits() == Some(2)).await;

    std::fs::write(
        &path,
        config(&fake, &cluster(&url, &prefix, "replicas = 3"), 2, 8),
    )
    .unwrap();
    let refused = gateway.reload().await.expect_err("[cluster] changed");
    let issues = refused.issues().join("\n");
    assert!(issues.contains("[cluster] changed"), "{issues}");
    gateway.shutdown().await;
    fake.shutdown().await;
}

/// A chat request for `model` with `n` choices as the client key `key`, with `id` as its
/// request id, held `hold_ms` on the engine; read to its end.
fn spawn_as(
    addr: SocketAddr,
    (key, model, n): (&'static str, &'static str, u32),
    id: String,
    hold_ms: &'static str,
) -> tokio::task::JoinHandle<(String, u16)> {
    tokio::spawn(async move {
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "hello"}],
            "n": n,
        });
        let request = Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .header("x-request-id", id.as_str())
            .header("x-fake-hold-ms", hold_ms)
            .body(Full::new(Bytes::from(body.to_string())))
            .unwrap();
        let client = Client::builder(TokioExecutor::new()).build_http();
        let response = client.request(request).await.expect("the gateway answers");
        let status = response.status().as_u16();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(status, 200, "{id}: {}", String::from_utf8_lossy(&body));
        (id, status)
    })
}

/// Two models on one engine under an engine-wide cap of 3, `sql` in fair order, three client
/// keys (two tenants, one of them also high priority).
fn rules_config(cluster: &str, fake: &FakeUpstream) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
api_keys = [
  {{ key = "sk-busy", name = "busy" }},
  {{ key = "sk-quiet", name = "quiet" }},
  {{ key = "sk-ops", name = "ops", priority = "high" }},
]

[cluster]
{cluster}

[upstreams.engine]
url = "{url}"
kind = "vllm"
parallel = 3

[upstreams.engine.models.sql]
parallel = 3
queue = 32
queue_timeout = "60s"
queue_order = "fair"

[upstreams.engine.models.chat]
parallel = 2
queue = 8
queue_timeout = "60s"
"#,
        url = fake.url(),
    )
}

/// Issue #33's "done when": two gateways with fair order, a priority key, `n = 2` requests and
/// an engine-wide cap hold every rule one gateway holds. The engine (room for 16) never runs
/// more sequences than its cap of 3 over its two models; the high-priority request is served
/// first; a tenant that floods the queue does not hold back another tenant's single request;
/// within a tenant, first come first served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_keep_fairness_priority_weights_and_the_engine_cap() {
    let url = redis_url();
    redis_conn(&url);
    let prefix = Prefix::new(&url, "rules");
    let fake = FakeUpstream::start(FakeConfig::vllm(16).model("sql").model("chat"))
        .await
        .expect("the fake engine starts");
    let toml = rules_config(&cluster(&url, &prefix, ""), &fake);
    let a = Replica::start("rules-a", &toml);
    let b = Replica::start("rules-b", &toml);
    let gateways = [a.api, b.api];
    let sql_waiting = || prefix.counts(&fake, "sql")[1];

    // The scene: two sequences of `chat` (one request, n = 2) and one of `sql` fill the
    // engine's cap of 3.
    let mut tasks = vec![spawn_as(
        b.api,
        ("sk-busy", "chat", 2),
        "chat-0".into(),
        "3000",
    )];
    eventually("chat-0 runs", || fake.observer().sequences_in_flight() == 2).await;
    tasks.push(spawn_as(
        a.api,
        ("sk-busy", "sql", 1),
        "busy-0".into(),
        "3000",
    ));
    eventually("the cap is full", || {
        fake.observer().sequences_in_flight() == 3
    })
    .await;
    // The busy tenant floods `sql` through both gateways; then the quiet tenant and the
    // high-priority key send one each; a second `n = 2` request waits for `chat`.
    for i in 1..=10 {
        let id = format!("busy-{i}");
        tasks.push(spawn_as(gateways[i % 2], ("sk-busy", "sql", 1), id, "100"));
        eventually("the request waits in the global queue", || {
            sql_waiting() == i
        })
        .await;
    }
    tasks.push(spawn_as(
        b.api,
        ("sk-quiet", "sql", 1),
        "quiet-1".into(),
        "100",
    ));
    eventually("quiet-1 is queued", || sql_waiting() == 11).await;
    tasks.push(spawn_as(a.api, ("sk-ops", "sql", 1), "ops-1".into(), "100"));
    eventually("ops-1 is queued", || sql_waiting() == 12).await;
    tasks.push(spawn_as(
        a.api,
        ("sk-quiet", "chat", 2),
        "chat-1".into(),
        "100",
    ));
    eventually("chat-1 is queued", || prefix.counts(&fake, "chat")[1] == 1).await;
    assert!(
        fake.observer()
            .request("busy-0")
            .is_some_and(|r| !r.is_done()),
        "the scene was set while the first requests still ran"
    );

    for task in tasks {
        tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("every request is served in time")
            .expect("the request task did not panic");
    }
    assert_eq!(
        fake.observer().peak_sequences_in_flight(),
        3,
        "the engine saw its cap of 3 sequences over both models, from two gateways"
    );
    check_rules(fake.observer());
    drop((a, b));
    fake.shutdown().await;
}

/// The rules of [`two_gateways_keep_fairness_priority_weights_and_the_engine_cap`], read from
/// when the engine started its `sql` requests. Requests granted in one step (one release can
/// free several units) reach the engine within a few milliseconds of each other, in whichever
/// order their two gateways forward them, so orders are checked between grants further apart.
fn check_rules(observer: &Observer) {
    let t0 = observer.request("busy-0").expect("seen").received_at;
    let timeline: Vec<String> = observer
        .inference_requests()
        .into_iter()
        .map(|r| {
            format!(
                "{} rx {:?} start {:?}",
                r.id,
                r.received_at - t0,
                r.started_at.map(|s| s - t0)
            )
        })
        .collect();
    let start = |id: &str| {
        observer
            .request(id)
            .and_then(|r| r.started_at)
            .unwrap_or_else(|| panic!("{id} started: {timeline:#?}"))
    };
    let step = Duration::from_millis(30);
    let busy: Vec<String> = (1..=10).map(|i| format!("busy-{i}")).collect();
    // The high class first: before every queued request of the normal class.
    for id in busy.iter().map(String::as_str).chain(["quiet-1"]) {
        assert!(
            start("ops-1") < start(id),
            "ops-1 before {id}: {timeline:#?}"
        );
    }
    // The quiet tenant's one request is among the next two grants of the normal class, so it
    // starts before the busy tenant's third; without fair order it would start after its tenth.
    assert!(
        start("quiet-1") < start("busy-3"),
        "the quiet tenant's request is not held back: {timeline:#?}"
    );
    // Within a tenant, first come first served.
    for (i, earlier) in busy.iter().enumerate() {
        for later in &busy[i + 1..] {
            assert!(
                start(later) + step > start(earlier),
                "{earlier} arrived before {later}: {timeline:#?}"
            );
        }
    }
}

/// `parallel = "auto"` under `[cluster]` (issue #33): the count a replica reads from the
/// engine's `/props` is written to the store as the key's limit, so two replicas put the
/// engine's own count on it, not twice that: no request waits inside the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_auto_count_read_by_a_replica_is_the_shared_limit() {
    let url = redis_url();
    redis_conn(&url);
    let prefix = Prefix::new(&url, "auto");
    let fake = engine(3).await;
    let toml = config(&fake, &cluster(&url, &prefix, ""), 3, 16)
        .replace("parallel = 3", "parallel = \"auto\"");
    let a = Replica::start("auto-a", &toml);
    let b = Replica::start("auto-b", &toml);
    // Both replicas have read the count once a request through each is served.
    for replica in [&a, &b] {
        let deadline = Instant::now() + SOON;
        while chat(replica.api, "probe".into(), QUICK).await.status != 200 {
            assert!(Instant::now() < deadline, "the count is read");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        prefix.counts(&fake, MODEL)[2],
        3,
        "the count is the shared limit"
    );
    fake.observer().reset_peak();
    let tasks: Vec<_> = (0..12)
        .map(|i| spawn_chat([a.api, b.api][i % 2], format!("auto-{i}"), SHORT_HOLD))
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().status, 200);
    }
    assert_eq!(fake.observer().peak_in_flight(), 3);
    for record in fake.observer().inference_requests() {
        let waited = record.queue_wait().unwrap_or_default();
        assert!(
            waited < Duration::from_millis(150),
            "{} waited {waited:?} inside the engine: more than its count was sent",
            record.id
        );
    }
    drop((a, b));
    fake.shutdown().await;
}

/// A streamed request through `addr` whose head has come: its status, its content type and
/// its body, read frame by frame with [`next_text`].
async fn open_stream(
    addr: SocketAddr,
    id: &str,
    headers: &[(&str, &str)],
) -> (u16, String, hyper::body::Incoming) {
    let body = serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": true,
    });
    let mut request = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-request-id", id);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let client = Client::builder(TokioExecutor::new()).build_http();
    let response = tokio::time::timeout(SOON, client.request(request))
        .await
        .expect("the head within SOON")
        .expect("the gateway answers");
    let (head, body) = response.into_parts();
    let content_type = head
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    (head.status.as_u16(), content_type, body)
}

/// The next data frame of `body` as text (`None` at its end), within [`SOON`].
async fn next_text(body: &mut hyper::body::Incoming) -> Option<String> {
    loop {
        let frame = tokio::time::timeout(SOON, body.frame())
            .await
            .expect("a frame within SOON")?
            .expect("a clean frame");
        if let Ok(data) = frame.into_data() {
            return Some(String::from_utf8_lossy(&data).into_owned());
        }
    }
}

/// `queue_keepalive` under `[cluster]` (issue #33): the `200` comes only once the shared queue
/// has taken the waiter in (a full shared queue is still a `503` with a status, not a stream
/// that ends in an error), and the comments show the place in the *shared* queue, read again
/// from the store: a waiter on one replica is counted ahead of a later one on the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalive_answers_once_the_shared_queue_has_the_waiter() {
    let url = redis_url();
    redis_conn(&url);
    let prefix = Prefix::new(&url, "keepalive");
    let fake = engine(8).await;
    let toml = format!(
        "{}queue_keepalive = \"1s\"\n",
        config(&fake, &cluster(&url, &prefix, ""), 1, 2)
    );
    let a = Replica::start("keepalive-a", &toml);
    let b = Replica::start("keepalive-b", &toml);
    let holder = spawn_chat(a.api, "holder", STREAM);
    eventually("the holder has the shared slot", || {
        prefix.zcard(&fake, "holders") == 1
    })
    .await;

    // The first waiter, on B: its head comes once the store lists it as waiting.
    // It holds its slot 3 s: long enough for the second to be told it is next.
    let (status, content_type, mut first) = open_stream(b.api, "first", LONG_HOLD).await;
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("text/event-stream"),
        "{content_type}"
    );
    assert_eq!(
        prefix.zcard(&fake, "waiters"),
        1,
        "queued in the store before the 200"
    );
    let comment = next_text(&mut first).await.expect("a comment");
    assert!(
        comment.starts_with(": queued position=1 ahead=0 eta_s="),
        "{comment}"
    );

    // The second, on A: A's own queue is empty, the shared one has B's waiter ahead.
    let (status, _, mut second) = open_stream(a.api, "second", QUICK).await;
    assert_eq!(status, 200);
    let comment = next_text(&mut second).await.expect("a comment");
    assert!(
        comment.starts_with(": queued position=2 ahead=1 eta_s="),
        "{comment}"
    );

    // The shared queue is full (2): refused with a status, on either replica.
    chat(b.api, "third".into(), QUICK)
        .await
        .assert_503("queue-full");
    assert_eq!(prefix.zcard(&fake, "waiters"), 2);

    // The holder leaves: B's waiter gets the slot and the engine's stream; A's comments, read
    // again from the store, move it to the front.
    holder.abort();
    let mut first_text = String::new();
    while let Some(text) = next_text(&mut first).await {
        first_text.push_str(&text);
    }
    assert!(first_text.contains(": granted waited_ms="), "{first_text}");
    assert!(first_text.contains("data: [DONE]"), "{first_text}");
    let mut moved = false;
    while let Some(text) = next_text(&mut second).await {
        if text.starts_with(": queued position=1 ahead=0 ") {
            moved = true;
        }
        if text.starts_with(": granted") {
            break;
        }
    }
    assert!(moved, "a comment showed the second waiter at the front");
    while next_text(&mut second).await.is_some() {}
    drop((a, b));
    fake.shutdown().await;
}
