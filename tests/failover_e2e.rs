//! End-to-end tests of failover on engine errors: an engine's 502/503/504 is retried on the
//! next-ranked host within `engine_error_retries`, other answers pass through, the first host's
//! slot goes back, and repeated 5xx answers eject a host until a health check restores it, but
//! never the only one, and not on one burst of concurrent requests.
//!
//! Like `operations_e2e.rs`: the real gateway in-process, `fake-upstream` llama-servers behind
//! it, loopback sockets only. Health checks run once at start and then every hour unless a test
//! needs them, so only forwarding changes an upstream's health; every wait polls with a
//! generous deadline instead of sleeping a fixed time.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use fake_upstream::{Failure, FakeUpstream};
use slotgate_gateway::Gateway;
use support::{PATIENT, Reply, admin_sample, chat, fake, gateway, server, upstream_status};

/// Two to three llama-servers serving `qwen`, ranked in configuration order.
const MODEL: &str = "qwen";

/// An `[upstreams.NAME]` llama-server table serving `qwen` with `parallel` slots, a queue of
/// `queue` and `cancel_grace`.
fn host(name: &str, fake: &FakeUpstream, parallel: usize, queue: usize, grace: &str) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"{}\"\nkind = \"llama-server\"\ncancel_grace = \"{grace}\"\n\n\
         [upstreams.{name}.models.{MODEL}]\nparallel = {parallel}\nqueue = {queue}\n\
         queue_timeout = \"30s\"\n",
        fake.url()
    )
}

/// The `[server]` table: checks hourly (only forwarding judges the hosts in between), and
/// `extra` lines.
fn quiet_server(extra: &str) -> String {
    server(&format!("health_check_interval = \"1h\"\n{extra}"))
}

/// The upstream that answered, from `x-slotgate-upstream`.
fn answered_by(reply: &Reply) -> &str {
    reply
        .headers
        .get("x-slotgate-upstream")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// `slotgate_retries_total` for an answer of `status` from `upstream`.
async fn retries(admin: SocketAddr, upstream: &str, status: u16) -> Option<f64> {
    let series = format!(
        r#"slotgate_retries_total{{upstream="{upstream}",model="{MODEL}",status="{status}"}}"#
    );
    admin_sample(admin, &series).await
}

/// `slotgate_slots_in_use` of `qwen` on `upstream`.
async fn slots_in_use(admin: SocketAddr, upstream: &str) -> Option<f64> {
    let series = format!(r#"slotgate_slots_in_use{{upstream="{upstream}",model="{MODEL}"}}"#);
    admin_sample(admin, &series).await
}

/// Two llama-servers, "a" then "b", serving `qwen` with `parallel` slots each (as the
/// gateway's `parallel` too), behind a gateway with `extra` server lines and, per host, its
/// `(queue, cancel_grace)`.
struct Pair {
    a: FakeUpstream,
    b: FakeUpstream,
    gw: Gateway,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Pair {
    async fn start(server: &str, parallel: usize, a: (usize, &str), b: (usize, &str)) -> Self {
        let (fake_a, fake_b) = (fake(parallel, MODEL).await, fake(parallel, MODEL).await);
        let gw = gateway(&format!(
            "{server}{}{}",
            host("a", &fake_a, parallel, a.0, a.1),
            host("b", &fake_b, parallel, b.0, b.1),
        ))
        .await;
        let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
        Self {
            a: fake_a,
            b: fake_b,
            gw,
            addr,
            admin,
        }
    }

    /// Stops the gateway, then both engines.
    async fn stop(self) {
        self.gw.shutdown().await;
        self.a.shutdown().await;
        self.b.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loading_engine_is_skipped_for_the_next_host() {
    let hosts = Pair::start(&quiet_server(""), 2, (4, "2s"), (4, "2s")).await;
    // Healthy at the start-up check; now back to `503 Loading model` on every path, as a
    // llama-server is while it (re)loads its model.
    hosts.a.set_healthy(false);

    for (i, stream) in [false, true].into_iter().enumerate() {
        let id = format!("loading-{i}");
        let reply = chat(hosts.addr, MODEL, stream, &[("x-request-id", &id)]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(answered_by(&reply), "b");
        assert_eq!(hosts.a.observer().request(&id).unwrap().status, Some(503));
        assert_eq!(hosts.b.observer().request(&id).unwrap().status, Some(200));
    }
    assert_eq!(retries(hosts.admin, "a", 503).await, Some(2.0));
    assert_eq!(retries(hosts.admin, "b", 503).await, Some(0.0));
    // A 503 is the engine's refusal: the slot on "a" went back at once.
    assert_eq!(slots_in_use(hosts.admin, "a").await, Some(0.0));
    hosts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_500_or_a_4xx_is_the_answer_and_not_retried() {
    let server = quiet_server("eject_after_failures = 100");
    let hosts = Pair::start(&server, 2, (4, "2s"), (4, "2s")).await;

    for status in [500, 400, 404, 429] {
        hosts.a.set_failures(vec![Failure::Status(status)]);
        let reply = chat(hosts.addr, MODEL, false, &[]).await;
        assert_eq!(reply.status.as_u16(), status, "{}", reply.text());
        assert_eq!(answered_by(&reply), "a");
        // The engine's own error document, not a problem of the gateway's.
        assert_ne!(
            reply.headers.get("content-type").unwrap(),
            "application/problem+json"
        );
        assert!(
            reply.json()["error"]["message"].is_string(),
            "{}",
            reply.text()
        );
    }
    assert!(hosts.b.observer().inference_requests().is_empty());
    for status in [502, 503, 504] {
        assert_eq!(retries(hosts.admin, "a", status).await, Some(0.0));
    }
    hosts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_error_retries_bounds_the_tries() {
    let a = fake(2, MODEL).await;
    let b = fake(2, MODEL).await;
    let c = fake(2, MODEL).await;
    a.set_failures(vec![Failure::Status(503)]);
    b.set_failures(vec![Failure::Status(502)]);
    let hosts = format!(
        "{}{}{}",
        host("a", &a, 2, 4, "0s"),
        host("b", &b, 2, 4, "0s"),
        host("c", &c, 2, 4, "0s"),
    );
    // Each answer of the last host tried, as it came: 503 from "a", 502 from "b", 200 from "c".
    for (tries, status, by) in [(0, 503, "a"), (1, 502, "b"), (2, 200, "c")] {
        let extra = format!("engine_error_retries = {tries}\neject_after_failures = 100");
        let gw = gateway(&format!("{}{hosts}", quiet_server(&extra))).await;
        let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
        let reply = chat(addr, MODEL, false, &[]).await;
        assert_eq!(reply.status.as_u16(), status, "{tries}: {}", reply.text());
        assert_eq!(answered_by(&reply), by, "{tries}");
        let expected = |retried: bool| Some(if retried { 1.0 } else { 0.0 });
        assert_eq!(retries(admin, "a", 503).await, expected(tries >= 1));
        assert_eq!(retries(admin, "b", 502).await, expected(tries >= 2));
        gw.shutdown().await;
    }
    let received = |fake: &FakeUpstream| fake.observer().inference_requests().len();
    assert_eq!((received(&a), received(&b), received(&c)), (3, 2, 1));

    // The last host's error is not retried for want of a next one.
    let gw = gateway(&format!(
        "{}{}",
        quiet_server("engine_error_retries = 5"),
        host("b", &b, 2, 4, "0s")
    ))
    .await;
    let reply = chat(gw.api_addr(), MODEL, false, &[]).await;
    assert_eq!(reply.status, 502);
    assert_eq!(retries(gw.admin_addr().unwrap(), "b", 502).await, Some(0.0));
    gw.shutdown().await;
    for fake in [a, b, c] {
        fake.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_hosts_slot_goes_back_and_no_engine_runs_more_than_its_slots() {
    let server = quiet_server("eject_after_failures = 100");
    let hosts = Pair::start(&server, 1, (8, "2s"), (8, "2s")).await;
    let (a, b, addr, admin) = (&hosts.a, &hosts.b, hosts.addr, hosts.admin);
    a.set_failures(vec![Failure::Status(503)]);
    b.set_pacing(fake_upstream::Pacing::Hold(Duration::from_millis(150)));

    // A request ranked to "a" takes its one slot, gets the 503, gives the slot back at once
    // and waits for "b"'s one slot (one ranked to "b" first, while "a" is busy, goes there
    // directly).
    let requests: Vec<_> = (0..4)
        .map(|_| tokio::spawn(chat(addr, MODEL, false, &[])))
        .collect();
    for request in requests {
        let reply = request.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(answered_by(&reply), "b");
    }
    let refused = a.observer().inference_requests().len();
    assert!(refused >= 1, "the first request is ranked to \"a\"");
    assert!(a.observer().peak_in_flight() <= 1);
    assert!(b.observer().peak_in_flight() <= 1);
    assert_eq!(b.observer().inference_requests().len(), 4);
    #[expect(clippy::cast_precision_loss, reason = "a handful of requests")]
    let refused = refused as f64;
    assert_eq!(retries(admin, "a", 503).await, Some(refused));
    assert_eq!(slots_in_use(admin, "a").await, Some(0.0));
    assert_eq!(slots_in_use(admin, "b").await, Some(0.0));
    hosts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_504_the_first_hosts_slot_is_kept_for_cancel_grace() {
    // A proxy in front of the engine gave up: the engine may still run the request, so "a"'s
    // slot stays taken for its (here: ten-minute) grace, and the next request skips "a".
    let server = quiet_server("eject_after_failures = 100");
    let hosts = Pair::start(&server, 1, (0, "10m"), (4, "0s")).await;
    let (a, b, addr, admin) = (&hosts.a, &hosts.b, hosts.addr, hosts.admin);
    a.set_failures(vec![Failure::Status(504)]);
    let reply = chat(addr, MODEL, false, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(answered_by(&reply), "b");
    assert_eq!(retries(admin, "a", 504).await, Some(1.0));
    assert_eq!(slots_in_use(admin, "a").await, Some(1.0));

    let reply = chat(addr, MODEL, false, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(a.observer().inference_requests().len(), 1);
    assert_eq!(b.observer().inference_requests().len(), 2);
    hosts.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_5xx_eject_a_host_and_a_health_check_restores_it() {
    // The engine fails every request with a 500 while its `/health` says 200: only its answers
    // can eject it, and the next check after that restores it.
    let server = server(
        "health_check_interval = \"1s\"\neject_after_failures = 3\nrestore_after_successes = 1",
    );
    let hosts = Pair::start(&server, 2, (4, "0s"), (4, "0s")).await;
    let (a, addr, admin) = (&hosts.a, hosts.addr, hosts.admin);
    a.set_failures(vec![Failure::Status(500)]);
    let healthy = r#"slotgate_upstream_healthy{upstream="a"}"#;

    // A check between two answers breaks the streak, so count answers until the ejection
    // rather than assume none came in between.
    let mut failed = 0;
    while admin_sample(admin, healthy).await == Some(1.0) {
        assert!(failed < 12, "still healthy after {failed} answers of 500");
        let reply = chat(addr, MODEL, false, &[]).await;
        assert_eq!(reply.status, 500, "{}", reply.text());
        assert_eq!(answered_by(&reply), "a");
        failed += 1;
    }
    assert!(failed >= 3, "ejected after {failed} answers");
    let doc = upstream_status(admin, "a").await;
    assert_eq!(doc["health"]["status"], "unhealthy", "{doc}");
    assert_eq!(doc["health"]["consecutive_failures"], 3, "{doc}");
    let reason = doc["health"]["last_error"].as_str().unwrap();
    assert!(reason.contains("answered 500"), "{doc}");

    // Ejected: requests go to "b" until a check restores "a".
    let reply = chat(addr, MODEL, false, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(answered_by(&reply), "b");

    a.set_failures(Vec::new());
    let deadline = tokio::time::Instant::now() + PATIENT;
    while admin_sample(admin, healthy).await != Some(1.0) {
        assert!(tokio::time::Instant::now() < deadline, "not restored");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reply = chat(addr, MODEL, false, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(answered_by(&reply), "a");
    hosts.stop().await;
}

/// What makes the fake engine answer a 500 after 300 ms: long enough for requests started
/// together to all be under way before the first answer.
const SLOW_500: (&str, &str) = ("x-fake-fail", "slow-first-byte-ms=300,status-500");

/// Sends three `SLOW_500` requests at once; returns their statuses.
async fn three_concurrent_500s(addr: SocketAddr) -> Vec<u16> {
    let sends =
        (0..3).map(|_| tokio::spawn(async move { chat(addr, MODEL, false, &[SLOW_500]).await }));
    let mut statuses = Vec::new();
    for send in sends.collect::<Vec<_>>() {
        statuses.push(send.await.unwrap().status.as_u16());
    }
    statuses
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_errors_never_eject_the_only_upstream() {
    // Issue 28: three concurrent requests that make the engine answer 500 took the only engine
    // out of rotation, and everyone got 503 until the next check.
    let fake_a = fake(4, MODEL).await;
    let gw = gateway(&format!(
        "{}{}",
        quiet_server("eject_after_failures = 3"),
        host("a", &fake_a, 4, 4, "0s")
    ))
    .await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());

    assert_eq!(three_concurrent_500s(addr).await, [500, 500, 500]);
    // One after the other too, each sent after the last failed: the streak reaches the
    // threshold, but "a" is the last upstream of `qwen` in rotation.
    for _ in 0..3 {
        assert_eq!(chat(addr, MODEL, false, &[SLOW_500]).await.status, 500);
    }
    let doc = upstream_status(admin, "a").await;
    assert_eq!(doc["health"]["status"], "healthy", "{doc}");
    let held = doc["health"]["ejection_held"].as_str().unwrap_or_default();
    assert!(held.contains("last upstream of `qwen`"), "{doc}");
    for _ in 0..10 {
        let reply = chat(addr, MODEL, false, &[]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    gw.shutdown().await;
    fake_a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_concurrent_engine_errors_counts_once() {
    let (fake_a, fake_b) = (fake(4, MODEL).await, fake(4, MODEL).await);
    // "b" weighs so little that every request goes to "a" while it has a free slot.
    let b = host("b", &fake_b, 4, 4, "0s").replace("kind = ", "weight = 0.01\nkind = ");
    let gw = gateway(&format!(
        "{}{}{b}",
        quiet_server("eject_after_failures = 3"),
        host("a", &fake_a, 4, 4, "0s"),
    ))
    .await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());

    assert_eq!(three_concurrent_500s(addr).await, [500, 500, 500]);
    assert_eq!(fake_a.observer().inference_requests().len(), 3);
    let doc = upstream_status(admin, "a").await;
    assert_eq!(doc["health"]["status"], "healthy", "{doc}");
    assert_eq!(doc["health"]["consecutive_failures"], 1, "{doc}");
    let reply = chat(addr, MODEL, false, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(answered_by(&reply), "a");
    gw.shutdown().await;
    fake_a.shutdown().await;
    fake_b.shutdown().await;
}
