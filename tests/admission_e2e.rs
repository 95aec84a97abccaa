//! End-to-end tests of admission control: the real gateway in-process, real loopback sockets,
//! and `fake-upstream` behind it counting the *sequences* it runs (engine slots: `n` per
//! request) and their peak.
//!
//! No assertion depends on tight timing: the tests assert counts and peaks, and bounds are
//! generous for a loaded 2-core machine.

mod support;

use fake_upstream::{FakeConfig, FakeUpstream};
use support::{SOON, authority, chat, fake, gateway, get, post, sample, send, server, upstream};

/// A chat completion body asking for `n` choices.
fn chat_n(model: &str, n: u64) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "n": n,
    })
    .to_string()
}

/// A legacy completion body asking for `n` choices out of `best_of` candidates.
fn completion_best_of(model: &str, n: u64, best_of: u64) -> String {
    serde_json::json!({
        "model": model,
        "prompt": "hello there",
        "n": n,
        "best_of": best_of,
    })
    .to_string()
}

// === weighing ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_of_n_1_2_3_never_puts_more_than_parallel_sequences_on_the_engine() {
    // The engine could run 16 sequences: the cap of 4 is the gateway's doing.
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 4, 32, "60s")
    ))
    .await;
    let addr = gw.api_addr();

    let tasks: Vec<_> = (0..18u64)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("mix-{i}");
                let headers = [("x-fake-hold-ms", "300"), ("x-request-id", id.as_str())];
                // Every third request is a legacy completion whose `best_of` sets its weight.
                let req = if i % 3 == 2 {
                    post(
                        addr,
                        "/v1/completions",
                        completion_best_of("qwen", 1, 3),
                        &headers,
                    )
                } else {
                    post(
                        addr,
                        "/v1/chat/completions",
                        chat_n("qwen", i % 3 + 1),
                        &headers,
                    )
                };
                send(req).await
            })
        })
        .collect();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    }
    let observer = fake.observer();
    assert_eq!(observer.snapshot().received, 18, "every request was served");
    let peak = observer.peak_sequences_in_flight();
    assert!(
        peak <= 4,
        "the engine ran {peak} sequences at once, above parallel = 4"
    );
    // Weights of 3 ran (the `best_of` and `n = 3` requests), so the cap was reached.
    assert!(peak >= 3, "peak {peak}");
    let key = authority(fake.addr());
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 0, "every slot back");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_more_sequences_than_parallel_is_a_400_that_says_why() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 4, 8, "30s")
    ))
    .await;
    let addr = gw.api_addr();

    let reply = send(post(
        addr,
        "/v1/chat/completions",
        chat_n("qwen", 5),
        &[("x-request-id", "too-many")],
    ))
    .await;
    let doc = reply.assert_problem(400, "bad-request");
    assert_eq!(doc["sequences"], 5, "{doc}");
    assert_eq!(doc["parallel"], 4, "{doc}");
    assert_eq!(doc["error"]["param"], "n", "{doc}");
    let detail = doc["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("only 4 slots"), "{detail}");

    // `best_of` above `parallel` is refused the same way, on the route where it counts.
    let reply = send(post(
        addr,
        "/v1/completions",
        completion_best_of("qwen", 1, 6),
        &[],
    ))
    .await;
    let doc = reply.assert_problem(400, "bad-request");
    assert_eq!(doc["sequences"], 6, "{doc}");

    // A count that is not a positive integer is refused before any queue.
    for bad in [r#""two""#, "0", "-1", "1.5"] {
        let body = format!(
            r#"{{"model":"qwen","messages":[{{"role":"user","content":"hi"}}],"n":{bad}}}"#
        );
        let reply = send(post(addr, "/v1/chat/completions", body, &[])).await;
        let doc = reply.assert_problem(400, "bad-request");
        assert!(
            doc["detail"].as_str().unwrap_or_default().contains("`n`"),
            "n = {bad}: {doc}"
        );
    }

    // Exactly `parallel` fits.
    let reply = send(post(addr, "/v1/chat/completions", chat_n("qwen", 4), &[])).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert_eq!(reply.json()["choices"].as_array().map(Vec::len), Some(4));
    assert_eq!(
        fake.observer().snapshot().received,
        1,
        "no refused request reached the engine"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

// === prefetch ===

/// `prefetch = 1`: one request more than `parallel` goes to the engine to wait in its own
/// queue, and no more; the rest wait in the gateway. The status document keeps `slots` at the
/// engine's count and shows `prefetch` beside it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefetch_sends_k_requests_ahead_to_the_engine_and_no_more() {
    // The engine could run 16 sequences: whatever reaches it at once is the gateway's doing.
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}prefetch = 1\n",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 2, 16, "60s")
    ))
    .await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    let tasks: Vec<_> = (0..6u64)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("ahead-{i}");
                let headers = [("x-fake-hold-ms", "1500"), ("x-request-id", id.as_str())];
                send(post(
                    addr,
                    "/v1/chat/completions",
                    chat_n("qwen", 1),
                    &headers,
                ))
                .await
            })
        })
        .collect();
    // While they run: three at the engine (two slots and one ahead), three in the gateway.
    support::eventually("three at the engine, three queued", SOON, || {
        gw.limiter().in_flight(&key, "qwen") == 3 && gw.limiter().queued(&key, "qwen") == 3
    })
    .await;
    let admin = gw.admin_addr().expect("admin listener");
    let doc = support::upstream_status(admin, "gpu").await;
    let model = &doc["models"][0];
    assert_eq!(model["parallel"], 2, "{doc}");
    assert_eq!(model["slots"], 2, "{doc}");
    assert_eq!(model["prefetch"], 1, "{doc}");
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    }
    let observer = fake.observer();
    assert_eq!(observer.snapshot().received, 6, "every request was served");
    let peak = observer.peak_sequences_in_flight();
    assert_eq!(
        peak, 3,
        "parallel 2 + prefetch 1 at the engine at most, and reached"
    );
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 0, "every slot back");
    gw.shutdown().await;
    fake.shutdown().await;
}

// === the routing headers ===

/// The value of `name` in `headers` as text; panics when absent.
fn header<'h>(headers: &'h http::HeaderMap, name: &str) -> &'h str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        .to_str()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_routed_answer_names_its_upstream_and_its_queue_wait() {
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 4, "30s")
    ))
    .await;
    let addr = gw.api_addr();

    // A free slot: no wait.
    let reply = chat(addr, "qwen", false, &[]).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert_eq!(header(&reply.headers, "x-slotgate-upstream"), "gpu");
    assert_eq!(header(&reply.headers, "x-slotgate-queue-wait-ms"), "0");

    // A request queued behind a 500 ms answer waited for it.
    let first = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "500")]));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let queued = chat(addr, "qwen", true, &[]).await;
    assert_eq!(queued.status.as_u16(), 200, "{}", queued.text());
    assert!(
        header(&queued.headers, "content-type").starts_with("text/event-stream"),
        "a stream"
    );
    assert_eq!(header(&queued.headers, "x-slotgate-upstream"), "gpu");
    let waited: u64 = header(&queued.headers, "x-slotgate-queue-wait-ms")
        .parse()
        .unwrap();
    assert!(waited > 0, "it queued behind the first request");
    let first = first.await.unwrap();
    assert_eq!(header(&first.headers, "x-slotgate-upstream"), "gpu");

    // The engine's own refusal is a routed answer too.
    let reply = chat(addr, "qwen", false, &[("x-fake-fail", "status-400")]).await;
    assert_eq!(reply.status.as_u16(), 400, "{}", reply.text());
    assert_eq!(header(&reply.headers, "x-slotgate-upstream"), "gpu");
    assert_eq!(header(&reply.headers, "x-slotgate-queue-wait-ms"), "0");

    // A refusal of the gateway's own is not.
    let reply = send(post(addr, "/v1/chat/completions", chat_n("qwen", 2), &[])).await;
    reply.assert_problem(400, "bad-request");
    assert!(!reply.headers.contains_key("x-slotgate-upstream"));
    gw.shutdown().await;
    fake.shutdown().await;
}

/// An upstream whose name cannot be a header value (a quoted TOML key may hold control
/// characters) still serves: its answers leave `x-slotgate-upstream` out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_name_that_is_no_header_value_leaves_the_header_out() {
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("\"gpu\\u0001\"", &fake.url(), "qwen", 1, 4, "30s")
    ))
    .await;
    let reply = chat(gw.api_addr(), "qwen", false, &[]).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert!(!reply.headers.contains_key("x-slotgate-upstream"));
    assert_eq!(header(&reply.headers, "x-slotgate-queue-wait-ms"), "0");
    gw.shutdown().await;
    fake.shutdown().await;
}

// === engine-wide caps ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_models_under_a_shared_upstream_cap_never_exceed_it_together() {
    // One vLLM with two LoRA adapters: 3 slots each, 4 for the engine as a whole.
    let fake = FakeUpstream::start(FakeConfig::vllm(16).model("sql").model("chat"))
        .await
        .expect("fake upstream starts");
    let gw = gateway(&format!(
        "{}[upstreams.vllm]\nurl = \"{}\"\nkind = \"vllm\"\nparallel = 4\n\n\
         [upstreams.vllm.models.sql]\nparallel = 3\nqueue = 16\nqueue_timeout = \"60s\"\n\n\
         [upstreams.vllm.models.chat]\nparallel = 3\nqueue = 16\nqueue_timeout = \"60s\"\n",
        server(""),
        fake.url()
    ))
    .await;
    let addr = gw.api_addr();
    let admin = gw.admin_addr().expect("admin listener");

    let tasks: Vec<_> = (0..16u64)
        .map(|i| {
            tokio::spawn(async move {
                let model = if i % 2 == 0 { "sql" } else { "chat" };
                send(post(
                    addr,
                    "/v1/chat/completions",
                    chat_n(model, 1 + i % 2),
                    &[("x-fake-hold-ms", "300")],
                ))
                .await
            })
        })
        .collect();
    // While they run, the cap shows in the admin status and the metrics.
    fake.observer().wait_for_in_flight(2, SOON).await.unwrap();
    let status = get(admin, "/admin/upstreams").await.json();
    let slots = &status["upstreams"][0]["slots"];
    assert_eq!(slots["parallel"], 4, "{status}");
    assert!(
        slots["in_flight"].as_u64().is_some_and(|n| n <= 4),
        "{slots}"
    );
    let metrics = get(admin, "/metrics").await.text();
    assert_eq!(
        sample(
            &metrics,
            r#"slotgate_upstream_slots_capacity{upstream="vllm"}"#
        ),
        Some(4.0),
        "{metrics}"
    );
    assert!(
        sample(
            &metrics,
            r#"slotgate_upstream_slots_in_use{upstream="vllm"}"#
        )
        .is_some()
    );

    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    }
    let observer = fake.observer();
    assert_eq!(observer.snapshot().received, 16);
    let peak = observer.peak_sequences_in_flight();
    assert!(
        peak <= 4,
        "the engine ran {peak} sequences at once, above its cap of 4"
    );
    // Each model alone stays under its own 3, and both ran.
    for model in ["sql", "chat"] {
        let counts = observer.snapshot().model(model);
        assert!(counts.peak_sequences_in_flight <= 3, "{model}: {counts:?}");
        assert!(counts.peak_sequences_in_flight >= 1, "{model} ran");
    }
    let key = authority(fake.addr());
    let cap = gw.limiter().host_reading(&key).expect("a host cap");
    assert_eq!((cap.parallel, cap.in_flight), (4, 0), "every slot back");
    gw.shutdown().await;
    fake.shutdown().await;
}

// === fair queues and priority ===

/// The ids of the inference requests the engine started, in the order it started them.
fn start_order(fake: &FakeUpstream) -> Vec<String> {
    let mut started: Vec<_> = fake
        .observer()
        .inference_requests()
        .into_iter()
        .filter_map(|r| r.started_at.map(|at| (at, r.id)))
        .collect();
    started.sort();
    started.into_iter().map(|(_, id)| id).collect()
}

/// Who a request is, to the gateway: a header and its value (a client key's `authorization`,
/// or the `tenant_header`).
type Who = (&'static str, &'static str);

/// Sends a chat request as `who` with id `id`, holding its slot `hold_ms` on the engine.
fn chat_as(
    addr: std::net::SocketAddr,
    who: Who,
    id: String,
    hold_ms: &'static str,
) -> tokio::task::JoinHandle<support::Reply> {
    tokio::spawn(async move {
        let headers = [
            who,
            ("x-request-id", id.as_str()),
            ("x-fake-hold-ms", hold_ms),
        ];
        send(post(
            addr,
            "/v1/chat/completions",
            chat_n("qwen", 1),
            &headers,
        ))
        .await
    })
}

/// Waits until `n` requests wait in the gateway's queue for `qwen` on `fake`.
async fn queued_in_gateway(gw: &slotgate_gateway::Gateway, fake: &FakeUpstream, n: usize) {
    let key = authority(fake.addr());
    support::eventually(&format!("{n} queued"), SOON, || {
        gw.limiter().queued(&key, "qwen") == n
    })
    .await;
}

/// Under fair order, `busy` has one request running and twenty queued when `late` arrives with
/// two: the late tenant's first request starts within the next two grants. `server_extra` says
/// how the gateway tells tenants apart.
async fn a_late_tenant_starts_within_the_next_two_grants(server_extra: &str, busy: Who, late: Who) {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}queue_order = \"fair\"\n",
        server(server_extra),
        upstream("gpu", &fake.url(), "qwen", 1, 32, "60s")
    ))
    .await;
    let addr = gw.api_addr();

    // The busy tenant: one running for long enough to set the scene, twenty queued behind it.
    let mut tasks = vec![chat_as(addr, busy, "busy-0".into(), "3000")];
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    for i in 1..=20 {
        tasks.push(chat_as(addr, busy, format!("busy-{i}"), "20"));
        queued_in_gateway(&gw, &fake, i).await;
    }
    // The late tenant arrives with two.
    for i in 1..=2 {
        tasks.push(chat_as(addr, late, format!("late-{i}"), "20"));
        queued_in_gateway(&gw, &fake, 20 + i).await;
    }
    let first = fake.observer().request("busy-0").expect("seen");
    assert!(
        !first.is_done(),
        "the scene was set while the first request still ran"
    );
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    }
    let order = start_order(&fake);
    assert_eq!(order.len(), 23, "{order:?}");
    assert_eq!(order[0], "busy-0");
    // Grants after the late tenant joined: its first request is among the next two.
    let late = order.iter().position(|id| id == "late-1").unwrap();
    assert!(late <= 2, "late-1 started as grant {late}: {order:?}");
    // Its second is not stuck behind the busy tenant's twenty either.
    let late2 = order.iter().position(|id| id == "late-2").unwrap();
    assert!(late2 <= 4, "late-2 started as grant {late2}: {order:?}");
    // Within the busy tenant, first come first served.
    let busy: Vec<_> = order.iter().filter(|id| id.starts_with("busy-")).collect();
    let expected: Vec<String> = (0..=20).map(|i| format!("busy-{i}")).collect();
    assert_eq!(busy, expected.iter().collect::<Vec<_>>());
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_fair_order_a_late_tenant_starts_within_the_next_two_grants() {
    // Tenants are the client keys' names.
    let keys =
        r#"api_keys = [{ key = "sk-busy", name = "busy" }, { key = "sk-late", name = "late" }]"#;
    a_late_tenant_starts_within_the_next_two_grants(
        keys,
        ("authorization", "Bearer sk-busy"),
        ("authorization", "Bearer sk-late"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_keys_the_tenant_header_names_the_tenants() {
    a_late_tenant_starts_within_the_next_two_grants(
        r#"tenant_header = "x-tenant""#,
        ("x-tenant", "busy"),
        ("x-tenant", "late"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_low_waiter_behind_a_stream_of_high_ones_is_served_within_the_bound() {
    const HIGH: Who = ("authorization", "Bearer sk-high");
    const LOW: Who = ("authorization", "Bearer sk-low");
    let fake = fake(16, "qwen").await;
    let keys = r#"api_keys = [{ key = "sk-high", priority = "high" }, { key = "sk-low", priority = "low" }]"#;
    let gw = gateway(&format!(
        "{}{}",
        server(keys),
        upstream("gpu", &fake.url(), "qwen", 1, 32, "60s")
    ))
    .await;
    let addr = gw.api_addr();

    let mut tasks = vec![chat_as(addr, HIGH, "high-0".into(), "3000")];
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    tasks.push(chat_as(addr, LOW, "low".into(), "20"));
    queued_in_gateway(&gw, &fake, 1).await;
    // Then a stream of high ones, every one of them queued after the low one.
    for i in 1..=12 {
        tasks.push(chat_as(addr, HIGH, format!("high-{i}"), "20"));
        queued_in_gateway(&gw, &fake, 1 + i).await;
    }
    assert!(
        !fake.observer().request("high-0").expect("seen").is_done(),
        "the scene was set while the first request still ran"
    );
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    }
    let order = start_order(&fake);
    assert_eq!(order.len(), 14, "{order:?}");
    // High first: the first grants after the running one go to high waiters...
    assert!(order[1].starts_with("high-"), "{order:?}");
    // ...but the low one is served after at most PASS_LIMIT (4) of them, the documented bound.
    let low = order.iter().position(|id| id == "low").unwrap();
    assert!(
        (2..=5).contains(&low),
        "low started as grant {low}: {order:?}"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

// === client deadlines ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn x_slotgate_max_wait_ends_the_wait_long_before_queue_timeout() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 8, "30s")
    ))
    .await;
    let addr = gw.api_addr();

    let first = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "6000")]));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let asked = std::time::Instant::now();
    let reply = chat(addr, "qwen", false, &[("x-slotgate-max-wait", "1s")]).await;
    let took = asked.elapsed();
    let doc = reply.assert_problem(503, "queue-timeout");
    assert_eq!(doc["deadline"], "x-slotgate-max-wait", "{doc}");
    assert_eq!(doc["deadline_ms"], 1000, "{doc}");
    let waited = doc["waited_ms"].as_u64().unwrap();
    // About a second: far from the 30 s queue timeout, and not refused before queueing.
    assert!((800..5000).contains(&waited), "waited {waited} ms: {doc}");
    assert!(took < std::time::Duration::from_secs(5), "took {took:?}");
    assert!(doc.get("expected_wait_ms").is_none(), "{doc}");
    assert!(reply.retry_after() >= 1);
    // A malformed deadline is the client's mistake.
    let reply = chat(addr, "qwen", false, &[("x-slotgate-max-wait", "soon")]).await;
    reply.assert_problem(400, "bad-request");
    assert_eq!(first.await.unwrap().status.as_u16(), 200);
    assert_eq!(fake.observer().snapshot().received, 1, "only the first ran");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_the_queue_cannot_keep_is_refused_without_queueing() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 8, "30s")
    ))
    .await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    // One answer of about a second teaches the gateway how long slots are held.
    let reply = chat(addr, "qwen", false, &[("x-fake-hold-ms", "1200")]).await;
    assert_eq!(reply.status.as_u16(), 200);
    let running = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "4000")]));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();

    // A slot is a second away at best: a 200 ms deadline cannot be kept.
    for (header, value, named) in [
        ("x-slotgate-max-wait", "200ms", "x-slotgate-max-wait"),
        ("x-stainless-timeout", "0.2", "x-stainless-timeout"),
    ] {
        let reply = chat(addr, "qwen", false, &[(header, value)]).await;
        let doc = reply.assert_problem(503, "queue-timeout");
        assert_eq!(doc["deadline"], named, "{doc}");
        assert_eq!(doc["waited_ms"], 0, "refused at once: {doc}");
        let expected = doc["expected_wait_ms"].as_u64().unwrap();
        assert!(expected > 200, "{doc}");
        assert!(reply.retry_after() >= 1);
        assert_eq!(gw.limiter().queued(&key, "qwen"), 0, "it never queued");
    }
    assert_eq!(running.await.unwrap().status.as_u16(), 200);
    assert_eq!(
        fake.observer().snapshot().received,
        2,
        "no refused request ran"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

// === queue keepalive ===

/// A streamed chat request with `headers`.
fn stream_request(
    addr: std::net::SocketAddr,
    headers: &[(&str, &str)],
) -> http::Request<http_body_util::Full<bytes::Bytes>> {
    post(
        addr,
        "/v1/chat/completions",
        support::chat_body("qwen", true),
        headers,
    )
}

/// The comment lines (`: ...`) and data lines (`data: ...`) of an SSE text, in order.
fn sse_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|line| line.starts_with(':') || line.starts_with("data:"))
        .collect()
}

/// A model that keeps queued streams alive every second.
fn keepalive_gateway_config(fake: &FakeUpstream, queue_timeout: &str) -> String {
    format!(
        "{}{}queue_keepalive = \"1s\"\n",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 8, queue_timeout)
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_stream_gets_keepalive_comments_then_the_engines_tokens() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&keepalive_gateway_config(&fake, "30s")).await;
    let addr = gw.api_addr();

    let first = tokio::spawn(chat(
        addr,
        "qwen",
        false,
        &[("x-request-id", "first"), ("x-fake-hold-ms", "2500")],
    ));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let mut stream = support::open(addr, stream_request(addr, &[("x-request-id", "kept")]))
        .await
        .head()
        .await;
    // The head came at once, while the slot was still taken.
    assert_eq!(stream.status.as_u16(), 200);
    assert!(header(&stream.headers, "content-type").starts_with("text/event-stream"));
    assert_eq!(header(&stream.headers, "x-slotgate-upstream"), "gpu");
    assert!(!fake.observer().request("first").expect("seen").is_done());
    let text = String::from_utf8(stream.rest().await.expect("a clean end").to_vec()).unwrap();
    let lines = sse_lines(&text);
    let queued = lines
        .iter()
        .take_while(|l| l.starts_with(": queued"))
        .count();
    assert!(queued >= 2, "a comment at once and one a second: {lines:?}");
    assert!(
        lines[0].starts_with(": queued position=1 ahead=0 eta_s="),
        "{lines:?}"
    );
    assert!(
        lines[queued].starts_with(": granted waited_ms="),
        "{lines:?}"
    );
    let data = &lines[queued + 1..];
    assert!(data.iter().all(|l| l.starts_with("data:")), "{lines:?}");
    assert!(data.len() >= 2, "the engine's tokens: {lines:?}");
    assert_eq!(data.last().copied(), Some("data: [DONE]"), "{lines:?}");
    assert_eq!(first.await.unwrap().status.as_u16(), 200);
    let kept = fake
        .observer()
        .request("kept")
        .expect("the engine served it");
    assert!(kept.stream && kept.is_done());
    let key = authority(fake.addr());
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 0, "every slot back");

    // An engine that answers an error instead of a stream: the error becomes the last event.
    let blocker = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "1500")]));
    support::eventually("the blocker runs", SOON, || {
        gw.limiter().in_flight(&key, "qwen") == 1
    })
    .await;
    let mut stream = support::open(addr, stream_request(addr, &[("x-fake-fail", "status-500")]))
        .await
        .head()
        .await;
    assert_eq!(stream.status.as_u16(), 200);
    let text = String::from_utf8(stream.rest().await.expect("a clean end").to_vec()).unwrap();
    let last = sse_lines(&text)
        .last()
        .copied()
        .unwrap_or_default()
        .to_owned();
    let event: serde_json::Value = serde_json::from_str(last.trim_start_matches("data:").trim())
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(event["upstream_status"], 500, "{event}");
    assert!(
        event["type"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/upstream-bad-response"),
        "{event}"
    );
    assert!(event["error"]["message"].is_string(), "{event}");
    assert_eq!(blocker.await.unwrap().status.as_u16(), 200);
    support::eventually("every slot back", SOON, || {
        gw.limiter().in_flight(&key, "qwen") == 0
    })
    .await;
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_keepalive_stream_whose_queue_times_out_ends_with_an_error_event() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&keepalive_gateway_config(&fake, "1500ms")).await;
    let addr = gw.api_addr();

    let first = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "5000")]));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let mut stream = support::open(addr, stream_request(addr, &[("x-request-id", "timed-out")]))
        .await
        .head()
        .await;
    assert_eq!(stream.status.as_u16(), 200);
    let text = String::from_utf8(stream.rest().await.expect("a clean end").to_vec()).unwrap();
    let lines = sse_lines(&text);
    assert!(lines[0].starts_with(": queued"), "{lines:?}");
    let last = lines.last().copied().unwrap_or_default();
    let event: serde_json::Value = serde_json::from_str(last.trim_start_matches("data:").trim())
        .unwrap_or_else(|e| panic!("{e}: {text}"));
    assert!(
        event["type"]
            .as_str()
            .unwrap_or_default()
            .ends_with("/queue-timeout"),
        "{event}"
    );
    assert_eq!(event["error"]["code"], "queue_timeout", "{event}");
    assert!(
        event["retry_after"].as_u64().is_some_and(|s| s >= 1),
        "{event}"
    );
    assert_eq!(event["request_id"], "timed-out", "{event}");
    assert!(
        fake.observer().request("timed-out").is_none(),
        "never reached the engine"
    );
    assert_eq!(first.await.unwrap().status.as_u16(), 200);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_during_keepalive_never_reaches_the_engine() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&keepalive_gateway_config(&fake, "30s")).await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    let first = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "3000")]));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let mut stream = support::open(addr, stream_request(addr, &[("x-request-id", "leaver")]))
        .await
        .head()
        .await;
    assert_eq!(stream.status.as_u16(), 200);
    let comment = stream.next_data().await.unwrap().unwrap_or_default();
    assert!(comment.starts_with(b": queued"), "{comment:?}");
    assert_eq!(gw.limiter().queued(&key, "qwen"), 1);
    stream.disconnect();
    // Its place in the queue goes at once, not when the slot would have come.
    support::eventually("the queue place given up", SOON, || {
        gw.limiter().queued(&key, "qwen") == 0
    })
    .await;
    assert_eq!(first.await.unwrap().status.as_u16(), 200);
    // The slot the leaver would have had goes unused, and the engine never heard of it.
    support::eventually("every slot back", SOON, || {
        gw.limiter().in_flight(&key, "qwen") == 0
    })
    .await;
    assert!(fake.observer().request("leaver").is_none());
    assert_eq!(fake.observer().snapshot().received, 1);
    gw.shutdown().await;
    fake.shutdown().await;
}
