//! End-to-end tests of what an operator relies on: health checks and passive ejection, model
//! residency, draining and shutdown, hot reload, the admin API and the metrics.
//!
//! Like `gateway_e2e.rs`: the real gateway in-process, `fake-upstream` behind it, loopback
//! sockets only. Health checks run every 100–200 ms here so that state changes are quick, and
//! every wait on one polls with a generous deadline instead of sleeping a fixed time.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use fake_upstream::{FakeConfig, FakeUpstream};
use http::Request;
use http_body_util::Full;
use serde_json::Value;
use slotgate_exposition::{self as exposition, Line, Sample};
use support::{
    PATIENT, Reply, SOON, chat, fake, gateway, gateway_with, get, replies, sample, send, server,
    spawn_burst, status, streaming_chat, upstream_status,
};

/// An `[upstreams.NAME]` table of `kind` with one limited model.
fn upstream_of(
    kind: &str,
    name: &str,
    url: &str,
    model: &str,
    parallel: usize,
    queue: usize,
) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"{url}\"\nkind = \"{kind}\"\n\n\
         [upstreams.{name}.models.\"{model}\"]\nparallel = {parallel}\nqueue = {queue}\nqueue_timeout = \"30s\"\n"
    )
}

/// A request to the admin listener, with an optional bearer token.
async fn admin_request(admin: SocketAddr, method: &str, path: &str, token: Option<&str>) -> Reply {
    let mut builder = Request::builder()
        .method(method)
        .uri(format!("http://{admin}{path}"));
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    send(builder.body(Full::new(Bytes::new())).unwrap()).await
}

/// Polls the admin API until `check` holds for the upstream's status.
async fn wait_for_upstream(
    admin: SocketAddr,
    name: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENT;
    loop {
        let doc = upstream_status(admin, name).await;
        if check(&doc) {
            return doc;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {name}: {what}; last status: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn wait_for_health(admin: SocketAddr, name: &str, health: &str) -> Value {
    wait_for_upstream(admin, name, health, |u| u["health"]["status"] == health).await
}

async fn metrics_text(admin: SocketAddr) -> String {
    let reply = get(admin, "/metrics").await;
    assert_eq!(reply.status, 200);
    reply.text()
}

/// The ids `GET /v1/models` lists.
async fn model_ids(addr: SocketAddr) -> Vec<String> {
    let reply = get(addr, "/v1/models").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect()
}

// === health ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_loading_llama_server_gets_no_requests_until_it_is_healthy() {
    // llama-server answers every path with 503 "Loading model" while it loads.
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(2)
            .model("qwen")
            .startup_delay(Duration::from_secs(6)),
    )
    .await
    .unwrap();
    let gw = gateway_with(
        "health_check_interval = \"200ms\"",
        &[upstream_of(
            "llama-server",
            "gpu",
            &fake.url(),
            "qwen",
            2,
            2,
        )],
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();

    // The gateway checked before serving: the first answer decided.
    let doc = upstream_status(admin, "gpu").await;
    assert_eq!(doc["health"]["status"], "unhealthy", "{doc}");
    assert!(
        doc["health"]["last_error"]
            .as_str()
            .unwrap()
            .contains("Loading model"),
        "{doc}"
    );
    let refused = chat(addr, "qwen", false, &[]).await;
    refused.assert_problem(503, "upstream-unavailable");
    assert_eq!(fake.observer().snapshot().received, 0, "nothing forwarded");
    assert_eq!(get(admin, "/readyz").await.status, 503);
    assert!(model_ids(addr).await.is_empty(), "no servable model listed");
    let metrics = metrics_text(admin).await;
    assert_eq!(
        sample(&metrics, r#"slotgate_upstream_healthy{upstream="gpu"}"#),
        Some(0.0)
    );

    // Loaded: restored after enough good checks, and served.
    wait_for_health(admin, "gpu", "healthy").await;
    let ok = chat(addr, "qwen", false, &[]).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(get(admin, "/readyz").await.status, 200);
    assert_eq!(model_ids(addr).await, ["qwen"]);
    let metrics = metrics_text(admin).await;
    assert_eq!(
        sample(&metrics, r#"slotgate_upstream_healthy{upstream="gpu"}"#),
        Some(1.0)
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_stops_answering_is_ejected_and_restored() {
    let fake = FakeUpstream::start(FakeConfig::vllm(4).model("qwen"))
        .await
        .unwrap();
    let gw = gateway(&format!(
        "{}{}",
        server(
            "health_check_interval = \"100ms\"\neject_after_failures = 2\nrestore_after_successes = 2"
        ),
        upstream_of("vllm", "gpu", &fake.url(), "qwen", 2, 2)
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    wait_for_health(admin, "gpu", "healthy").await;

    fake.refuse_connections().await.unwrap();
    let doc = wait_for_health(admin, "gpu", "unhealthy").await;
    assert!(
        doc["health"]["last_error"]
            .as_str()
            .unwrap()
            .contains("connect"),
        "{doc}"
    );
    chat(addr, "qwen", false, &[])
        .await
        .assert_problem(503, "upstream-unavailable");

    fake.accept_connections().await.unwrap();
    wait_for_health(admin, "gpu", "healthy").await;
    let ok = chat(addr, "qwen", false, &[]).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_connections_eject_an_upstream_between_checks() {
    let a = fake(4, "qwen").await;
    let b = fake(4, "qwen").await;
    // Checks once at start, then not for an hour: only forwarding can eject "a".
    let gw = gateway_with(
        "health_check_interval = \"1h\"\neject_after_failures = 2",
        &[
            upstream_of("llama-server", "a", &a.url(), "qwen", 2, 2),
            upstream_of("llama-server", "b", &b.url(), "qwen", 2, 2),
        ],
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    a.refuse_connections().await.unwrap();

    // "a" ranks first (configuration order breaks ties); each request fails over to "b".
    for i in 0..2 {
        let id = format!("over-{i}");
        let reply = chat(addr, "qwen", false, &[("x-request-id", &id)]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(b.observer().request(&id).is_some());
    }
    let doc = upstream_status(admin, "a").await;
    assert_eq!(doc["health"]["status"], "unhealthy", "{doc}");
    assert_eq!(doc["health"]["consecutive_failures"], 2, "{doc}");

    // Ejected: even with "a" listening again, nothing goes there until a check restores it.
    a.accept_connections().await.unwrap();
    for i in 0..3 {
        let reply = chat(
            addr,
            "qwen",
            false,
            &[("x-request-id", &format!("after-{i}"))],
        )
        .await;
        assert_eq!(reply.status, 200);
    }
    assert!(a.observer().inference_requests().is_empty());
    assert_eq!(b.observer().snapshot().received, 5);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_is_checked_with_its_own_probe() {
    let llama = fake(1, "m1").await;
    let vllm = FakeUpstream::start(FakeConfig::vllm(1).model("m2"))
        .await
        .unwrap();
    let ollama = FakeUpstream::start(FakeConfig::ollama(1).model("m3"))
        .await
        .unwrap();
    // Any OpenAI-compatible server: checked with GET /v1/models.
    let generic = FakeUpstream::start(FakeConfig::vllm(1).model("m4"))
        .await
        .unwrap();
    let gw = gateway(&format!(
        "{}{}{}{}{}",
        server("health_check_interval = \"100ms\""),
        upstream_of("llama-server", "llama", &llama.url(), "m1", 1, 0),
        upstream_of("vllm", "vllm", &vllm.url(), "m2", 1, 0),
        upstream_of("ollama", "ollama", &ollama.url(), "m3", 1, 0),
        upstream_of("openai", "generic", &generic.url(), "m4", 1, 0),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    for name in ["llama", "vllm", "ollama", "generic"] {
        wait_for_health(admin, name, "healthy").await;
    }
    let paths = |fake: &FakeUpstream| -> Vec<String> {
        fake.observer()
            .requests()
            .into_iter()
            .map(|r| r.path)
            .collect()
    };
    assert!(paths(&llama).contains(&"/health".to_owned()));
    assert!(paths(&vllm).contains(&"/health".to_owned()));
    assert!(paths(&ollama).contains(&"/".to_owned()));
    assert!(paths(&generic).contains(&"/v1/models".to_owned()));
    assert!(!paths(&generic).contains(&"/health".to_owned()));
    gw.shutdown().await;
    for fake in [llama, vllm, ollama, generic] {
        fake.shutdown().await;
    }
}

// === model residency ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_go_where_the_model_is_loaded_and_fall_through_only_when_its_queue_is_full() {
    // Two llama-server routers that can both serve "qwen"; only "b" has it loaded.
    let a = FakeUpstream::start(
        FakeConfig::llama_server(4)
            .router(true)
            .unloaded_model("qwen"),
    )
    .await
    .unwrap();
    let b = FakeUpstream::start(FakeConfig::llama_server(4).router(true).model("qwen"))
        .await
        .unwrap();
    let gw = gateway_with(
        "health_check_interval = \"100ms\"",
        &[
            // "a" comes first in configuration order and has more free slots: without residency
            // it would win every pick.
            upstream_of("llama-server", "a", &a.url(), "qwen", 2, 1),
            upstream_of("llama-server", "b", &b.url(), "qwen", 1, 1),
        ],
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    let doc = upstream_status(admin, "b").await;
    assert_eq!(doc["loaded"], serde_json::json!(["qwen"]), "{doc}");
    let doc = upstream_status(admin, "a").await;
    assert_eq!(doc["loaded"], serde_json::json!([]), "{doc}");
    assert_eq!(doc["residency"]["resident"], serde_json::json!([]), "{doc}");
    let metrics = metrics_text(admin).await;
    assert_eq!(
        sample(
            &metrics,
            r#"slotgate_model_loaded{upstream="b",model="qwen"}"#
        ),
        Some(1.0)
    );
    assert_eq!(
        sample(
            &metrics,
            r#"slotgate_model_loaded{upstream="a",model="qwen"}"#
        ),
        Some(0.0)
    );

    // One runs on "b"; the next waits in b's queue rather than going to the cold host.
    let hold = [("x-fake-hold-ms", "1500")];
    let first = tokio::spawn(async move {
        chat(addr, "qwen", false, &[hold[0], ("x-request-id", "first")]).await
    });
    b.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let second = tokio::spawn(async move {
        chat(addr, "qwen", false, &[hold[0], ("x-request-id", "second")]).await
    });
    let key = support::authority(b.addr());
    support::eventually("second queued on b", SOON, || {
        gw.limiter().queued(&key, "qwen") == 1
    })
    .await;
    // b's queue is full now: the third falls through to "a", which loads the model.
    let third = chat(addr, "qwen", false, &[("x-request-id", "third")]).await;
    assert_eq!(third.status, 200, "{}", third.text());
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    assert!(b.observer().request("first").is_some());
    assert!(b.observer().request("second").is_some());
    assert!(a.observer().request("third").is_some());
    assert_eq!(
        a.observer().snapshot().received,
        1,
        "only the overflow went to a"
    );

    // "a" loaded it on demand; the next discovery sees that.
    wait_for_upstream(admin, "a", "qwen loaded", |u| {
        u["loaded"] == serde_json::json!(["qwen"])
    })
    .await;
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn residency_follows_each_kinds_own_listing() {
    // Ollama lists what is resident in /api/ps; a configured name without a tag is `:latest`.
    let ollama = FakeUpstream::start(
        FakeConfig::ollama(1)
            .unloaded_model("llama3")
            .model("qwen:7b"),
    )
    .await
    .unwrap();
    // vLLM lists what it serves; a single-model llama-server serves its one model by any name.
    let vllm = FakeUpstream::start(FakeConfig::vllm(1).model("served"))
        .await
        .unwrap();
    let llama = fake(1, "/models/tiny.gguf").await;
    let gw = gateway(&format!(
        "{}{}[upstreams.ollama.models.\"qwen:7b\"]\nparallel = 1\nqueue = 0\nqueue_timeout = \"5s\"\n\n{}[upstreams.vllm.models.other]\nparallel = 1\nqueue = 0\nqueue_timeout = \"5s\"\n\n{}",
        server("health_check_interval = \"100ms\""),
        upstream_of("ollama", "ollama", &ollama.url(), "llama3", 1, 0),
        upstream_of("vllm", "vllm", &vllm.url(), "served", 1, 0),
        upstream_of("llama-server", "llama", &llama.url(), "tiny", 1, 0),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let loaded = |names: &[&str]| serde_json::json!(names);

    assert_eq!(
        upstream_status(admin, "ollama").await["loaded"],
        loaded(&["qwen:7b"])
    );
    assert_eq!(
        upstream_status(admin, "vllm").await["loaded"],
        loaded(&["served"])
    );
    assert_eq!(
        upstream_status(admin, "llama").await["loaded"],
        loaded(&["tiny"])
    );

    assert!(ollama.load_model("llama3").await);
    wait_for_upstream(admin, "ollama", "llama3 loaded", |u| {
        u["loaded"] == loaded(&["llama3", "qwen:7b"])
    })
    .await;
    assert!(ollama.unload_model("qwen:7b"));
    wait_for_upstream(admin, "ollama", "qwen:7b unloaded", |u| {
        u["loaded"] == loaded(&["llama3"])
    })
    .await;
    gw.shutdown().await;
    for fake in [ollama, vllm, llama] {
        fake.shutdown().await;
    }
}

// === draining and shutdown ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drained_upstream_gets_no_new_requests_and_its_running_ones_finish() {
    let a = fake(4, "qwen").await;
    let b = fake(4, "qwen").await;
    let gw = gateway_with(
        "admin_token = \"let-me-in\"",
        &[
            upstream_of("llama-server", "a", &a.url(), "qwen", 2, 2),
            upstream_of("llama-server", "b", &b.url(), "qwen", 2, 2),
        ],
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    let token = Some("let-me-in");

    // A stream runs on "a" (first in configuration order).
    let mut running = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-tokens", "10"),
            ("x-fake-chunk-interval-ms", "150"),
            ("x-request-id", "running"),
        ],
    )
    .await;
    assert_eq!(running.status, 200);
    assert!(running.next_data().await.unwrap().is_some());
    assert!(a.observer().request("running").is_some());

    let drained = admin_request(admin, "POST", "/admin/upstreams/a/drain", token).await;
    assert_eq!(drained.status, 200, "{}", drained.text());
    let doc = drained.json();
    assert_eq!(doc["draining"], true, "{doc}");
    assert_eq!(doc["models"][0]["in_flight"], 1, "{doc}");
    let metrics = metrics_text(admin).await;
    assert_eq!(
        sample(&metrics, r#"slotgate_upstream_draining{upstream="a"}"#),
        Some(1.0)
    );

    // New requests go to "b"; the stream on "a" runs to its end.
    for i in 0..3 {
        let id = format!("new-{i}");
        let reply = chat(addr, "qwen", false, &[("x-request-id", &id)]).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert!(b.observer().request(&id).is_some(), "{id} went to b");
    }
    let rest = running.rest().await.expect("the stream ends cleanly");
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    assert_eq!(a.observer().snapshot().received, 1);

    // Draining every upstream: nothing can be served, and the gateway is not ready.
    let drained = admin_request(admin, "POST", "/admin/upstreams/b/drain", token).await;
    assert_eq!(drained.status, 200);
    chat(addr, "qwen", false, &[])
        .await
        .assert_problem(503, "upstream-unavailable");
    assert_eq!(get(admin, "/readyz").await.status, 503);
    assert!(model_ids(addr).await.is_empty());

    // Undrained: "a" takes requests again.
    for name in ["a", "b"] {
        let reply = admin_request(
            admin,
            "POST",
            &format!("/admin/upstreams/{name}/undrain"),
            token,
        )
        .await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.json()["draining"], false);
    }
    let back = chat(addr, "qwen", false, &[("x-request-id", "back")]).await;
    assert_eq!(back.status, 200);
    assert!(a.observer().request("back").is_some());
    assert_eq!(get(admin, "/readyz").await.status, 200);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_running_requests_finish_and_refuses_queued_ones() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with(
        "drain_grace = \"20s\"",
        &[upstream_of(
            "llama-server",
            "gpu",
            &fake.url(),
            "qwen",
            1,
            2,
        )],
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    let key = support::authority(fake.addr());

    // One stream holds the only slot; one request waits behind it.
    let mut running = streaming_chat(
        addr,
        "qwen",
        &[("x-fake-tokens", "20"), ("x-fake-chunk-interval-ms", "150")],
    )
    .await;
    assert!(running.next_data().await.unwrap().is_some());
    let queued =
        tokio::spawn(async move { chat(addr, "qwen", false, &[("x-request-id", "queued")]).await });
    support::eventually("one queued", SOON, || {
        gw.limiter().queued(&key, "qwen") == 1
    })
    .await;
    assert_eq!(get(admin, "/readyz").await.status, 200);

    let stopping = tokio::spawn(gw.shutdown());
    // The waiting request is told at once, long before the stream (3 s) ends.
    let refused = tokio::time::timeout(SOON, queued)
        .await
        .expect("the queued request is answered")
        .unwrap();
    let doc = refused.assert_problem(503, "shutting-down");
    refused.retry_after();
    assert!(fake.observer().request("queued").is_none(), "{doc}");
    // Not ready while draining (the admin listener stops last).
    let readyz = get(admin, "/readyz").await;
    assert_eq!(readyz.status, 503);
    assert_eq!(readyz.json()["shutting_down"], true);

    let rest = running.rest().await.expect("the stream ends cleanly");
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    tokio::time::timeout(SOON, stopping)
        .await
        .expect("shutdown completes")
        .unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_api_wants_its_token_and_answers_mistakes_with_problems() {
    let fake = fake(1, "qwen").await;
    let gw = gateway_with(
        "admin_token = \"let-me-in\"",
        &[upstream_of("llama-server", "a", &fake.url(), "qwen", 1, 0)],
    )
    .await;
    let admin = gw.admin_addr().unwrap();
    let token = Some("let-me-in");
    // The admin API wants the token; probes and metrics do not.
    for (method, path) in [
        ("POST", "/admin/upstreams/a/drain"),
        ("GET", "/admin/upstreams"),
        ("POST", "/admin/reload"),
    ] {
        for wrong in [None, Some("let-me-out"), Some("")] {
            admin_request(admin, method, path, wrong)
                .await
                .assert_problem(401, "unauthorized");
        }
    }
    assert!(
        !upstream_status_with(admin, token).await["draining"]
            .as_bool()
            .unwrap()
    );
    assert_eq!(get(admin, "/healthz").await.status, 200);
    assert_eq!(get(admin, "/readyz").await.status, 200);
    assert_eq!(get(admin, "/metrics").await.status, 200);
    admin_request(admin, "POST", "/admin/upstreams/nope/drain", token)
        .await
        .assert_problem(404, "not-found");
    admin_request(admin, "GET", "/admin/upstreams/a/drain", token)
        .await
        .assert_problem(405, "method-not-allowed");
    admin_request(admin, "POST", "/admin/upstreams", token)
        .await
        .assert_problem(405, "method-not-allowed");
    admin_request(admin, "GET", "/admin/nothing", token)
        .await
        .assert_problem(404, "not-found");
    // Started from memory, not a file: nothing to reload.
    let reload = admin_request(admin, "POST", "/admin/reload", token)
        .await
        .assert_problem(409, "reload-unavailable");
    assert_eq!(reload["reloaded"], false);
    assert_eq!(reload["generation"], 1);
    gw.shutdown().await;
    fake.shutdown().await;
}

/// The first upstream's status, asked with `token`.
async fn upstream_status_with(admin: SocketAddr, token: Option<&str>) -> Value {
    let reply = admin_request(admin, "GET", "/admin/upstreams", token).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["upstreams"][0].clone()
}

// === hot reload ===

/// A gateway started from the file at `path`, so that it can reload it.
async fn gateway_from_file(path: &std::path::Path) -> slotgate_gateway::Gateway {
    let config = slotgate_config::Config::load(path).expect("a valid test config");
    slotgate_gateway::Gateway::bind_file(&config, path)
        .await
        .expect("gateway starts")
}

/// A file of its own for each test, in a directory of its own for the process.
fn temp_file(name: &str, text: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("slotgate-ops-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(clippy::too_many_lines, reason = "one reload scenario, told in order")]
async fn a_reload_applies_new_upstreams_models_and_limits_without_dropping_requests() {
    let a = fake(8, "qwen").await;
    let b = fake(8, "old").await;
    let c = fake(8, "new").await;
    let before = format!(
        "{}{}{}",
        server(""),
        upstream_of("llama-server", "a", &a.url(), "qwen", 1, 2),
        upstream_of("llama-server", "b", &b.url(), "old", 1, 1),
    );
    let path = temp_file("reload.toml", &before);
    let gw = gateway_from_file(&path).await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    let key_a = support::authority(a.addr());
    let key_b = support::authority(b.addr());

    // On "a": a stream holds the only slot, one request waits behind it.
    let mut stream = streaming_chat(
        addr,
        "qwen",
        &[("x-fake-tokens", "10"), ("x-fake-chunk-interval-ms", "200")],
    )
    .await;
    assert!(stream.next_data().await.unwrap().is_some());
    let waits_on_a = tokio::spawn(async move {
        chat(
            addr,
            "qwen",
            false,
            &[("x-fake-hold-ms", "3000"), ("x-request-id", "waits-a")],
        )
        .await
    });
    // On "b", whose model is about to go: one runs, one waits.
    let runs_on_b = tokio::spawn(async move {
        chat(
            addr,
            "old",
            false,
            &[("x-fake-hold-ms", "1500"), ("x-request-id", "runs-b")],
        )
        .await
    });
    b.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let waits_on_b =
        tokio::spawn(async move { chat(addr, "old", false, &[("x-request-id", "waits-b")]).await });
    support::eventually("one waiting on each", SOON, || {
        gw.limiter().queued(&key_a, "qwen") == 1 && gw.limiter().queued(&key_b, "old") == 1
    })
    .await;

    // "a" gets a second slot, "b" goes, "c" comes with an alias.
    let after = format!(
        "{}[aliases]\nchat = \"new\"\n\n{}{}",
        server(""),
        upstream_of("llama-server", "a", &a.url(), "qwen", 2, 2),
        upstream_of("llama-server", "c", &c.url(), "new", 1, 1),
    );
    std::fs::write(&path, &after).unwrap();
    let reply = admin_request(admin, "POST", "/admin/reload", None).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let doc = reply.json();
    assert_eq!(doc["added"], serde_json::json!(["c"]), "{doc}");
    assert_eq!(doc["removed"], serde_json::json!(["b"]), "{doc}");
    assert_eq!(doc["changed"], serde_json::json!(["a"]), "{doc}");
    assert_eq!(doc["generation"], 2, "{doc}");

    // The grown limit granted the waiter on "a" at once, beside the running stream.
    a.observer().wait_for_in_flight(2, SOON).await.unwrap();
    assert_eq!(gw.limiter().limits(&key_a, "qwen").unwrap().parallel, 2);
    // The waiter on the removed model is told; the request running there finishes.
    let told = waits_on_b.await.unwrap();
    told.assert_problem(503, "upstream-unavailable");
    assert!(b.observer().request("waits-b").is_none());
    assert_eq!(runs_on_b.await.unwrap().status, 200);
    let rest = stream.rest().await.expect("the stream ends cleanly");
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    assert_eq!(waits_on_a.await.unwrap().status, 200);

    // The new configuration serves.
    chat(addr, "old", false, &[])
        .await
        .assert_problem(404, "model-not-found");
    let via_alias = chat(addr, "chat", false, &[("x-request-id", "via-alias")]).await;
    assert_eq!(via_alias.status, 200, "{}", via_alias.text());
    assert!(c.observer().request("via-alias").is_some());
    assert_eq!(model_ids(addr).await, ["chat", "new", "qwen"]);
    let upstreams: Vec<Value> = status(admin).await["upstreams"].as_array().unwrap().clone();
    let names: Vec<&str> = upstreams
        .iter()
        .map(|u| u["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "c"]);
    let metrics = metrics_text(admin).await;
    assert!(
        !metrics.contains(r#"upstream="b""#),
        "b's series are gone:\n{metrics}"
    );
    assert_eq!(
        sample(
            &metrics,
            r#"slotgate_slots_capacity{upstream="a",model="qwen"}"#
        ),
        Some(2.0)
    );

    // An invalid file is refused with every problem listed; the running configuration stays.
    let broken = format!(
        "{}[aliases]\nchat = \"nothing\"\n\n[upstreams.a]\nurl = \"{}\"\nkind = \"llama-server\"\n\n[upstreams.a.models.qwen]\nparallel = 2\nqueue = 2\n",
        server(""),
        a.url()
    );
    std::fs::write(&path, broken).unwrap();
    let doc = admin_request(admin, "POST", "/admin/reload", None)
        .await
        .assert_problem(422, "config-refused");
    assert_eq!(doc["reloaded"], false);
    assert_eq!(doc["generation"], 2, "the generation still in force");
    let issues: Vec<&str> = doc["issues"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_str().unwrap())
        .collect();
    assert_eq!(issues.len(), 2, "{doc}");
    assert!(
        issues
            .iter()
            .any(|i| i.starts_with("upstreams.a.models.qwen.queue_timeout")),
        "{doc}"
    );
    assert!(
        issues.iter().any(|i| i.starts_with("aliases.chat")),
        "{doc}"
    );
    let error = gw.reload().await.expect_err("still invalid");
    assert_eq!(error.issues().len(), 2);
    assert_eq!(status(admin).await["generation"], 2);
    let still = chat(addr, "chat", false, &[]).await;
    assert_eq!(still.status, 200, "the old configuration still serves");

    gw.shutdown().await;
    for fake in [a, b, c] {
        fake.shutdown().await;
    }
    std::fs::remove_file(&path).unwrap();
}

/// The request-body budget is read at start only: a reload that raises a body limit past the
/// budget in force is refused, even when the file raises the budget too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_cannot_raise_a_body_limit_past_the_budget_in_force() {
    let a = fake(2, "qwen").await;
    let limits = |bytes: usize| {
        format!(
            "{}{}",
            server(&format!(
                "max_body_bytes = {bytes}\nmax_upload_bytes = 4096\nmax_buffered_body_bytes = {bytes}"
            )),
            upstream_of("llama-server", "a", &a.url(), "qwen", 1, 2),
        )
    };
    let path = temp_file("reload-budget.toml", &limits(8192));
    let gw = gateway_from_file(&path).await;
    std::fs::write(&path, limits(16384)).unwrap();
    let error = gw.reload().await.expect_err("past the budget in force");
    let issues = error.issues();
    assert_eq!(issues.len(), 1, "{issues:?}");
    assert!(
        issues[0].starts_with(
            "server.max_body_bytes: 16384 is more than the max_buffered_body_bytes in force (8192)"
        ),
        "{issues:?}"
    );
    // Within the budget in force: applied.
    std::fs::write(
        &path,
        limits(8192).replace("max_body_bytes = 8192", "max_body_bytes = 6000"),
    )
    .unwrap();
    gw.reload().await.expect("within the budget");
    gw.shutdown().await;
    a.shutdown().await;
    std::fs::remove_file(&path).unwrap();
}

/// The cache-aware index and the Responses record are built once, at start, with their
/// bounds: a reload that changes their keys applies everything else and names them in its
/// answer's `restart_required` (the affinity keys were once left out, and such a change did
/// nothing, silently), as long as the file differs from what the gateway started with.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reports_the_affinity_keys_that_wait_for_a_restart() {
    let a = fake(2, "qwen").await;
    let config = |extra: &str| {
        format!(
            "{}{}",
            server(extra),
            upstream_of("llama-server", "a", &a.url(), "qwen", 1, 2)
        )
    };
    let path = temp_file("reload-affinity.toml", &config(""));
    let gw = gateway_from_file(&path).await;
    let admin = gw.admin_addr().unwrap();
    std::fs::write(
        &path,
        config(
            "affinity = \"off\"\naffinity_entries = 1024\naffinity_ttl = \"5m\"\n\
             affinity_block_bytes = 1024\nsession_headers = [\"x-conversation\"]\n\
             response_affinity_ttl = \"1h\"\nmax_body_bytes = 4096",
        ),
    )
    .unwrap();
    let answer = admin_request(admin, "POST", "/admin/reload", None).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let answer = answer.json();
    assert_eq!(answer["reloaded"], true, "{answer}");
    assert_eq!(
        answer["restart_required"],
        serde_json::json!([
            "server.response_affinity_ttl",
            "server.affinity",
            "server.affinity_entries",
            "server.affinity_ttl",
            "server.affinity_block_bytes",
            "server.session_headers",
        ]),
        "{answer}"
    );
    // The index still runs with the start's values: the same file again says so again.
    let again = gw.reload().await.expect("the same file again");
    assert_eq!(again.restart_required.len(), 6, "{again:?}");
    // Back to the start's values: nothing waits for a restart any more.
    std::fs::write(&path, config("")).unwrap();
    let back = gw.reload().await.expect("the start's file");
    assert!(back.restart_required.is_empty(), "{back:?}");
    gw.shutdown().await;
    a.shutdown().await;
    std::fs::remove_file(&path).unwrap();
}

/// `/readyz`'s Retry-After is the health-check interval in force: a reload that changes the
/// interval changes it too (it was read once, at start).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_retry_after_follows_a_reloaded_health_check_interval() {
    let loading = FakeUpstream::start(
        FakeConfig::llama_server(1)
            .model("qwen")
            .startup_delay(Duration::from_secs(120)),
    )
    .await
    .unwrap();
    let config = |interval: &str| {
        format!(
            "{}{}",
            server(&format!("health_check_interval = \"{interval}\"")),
            upstream_of("llama-server", "gpu", &loading.url(), "qwen", 1, 1)
        )
    };
    let path = temp_file("reload-readyz.toml", &config("3s"));
    let gw = gateway_from_file(&path).await;
    let admin = gw.admin_addr().unwrap();
    let retry_after = |reply: &Reply| reply.headers.get("retry-after").cloned();
    let before = get(admin, "/readyz").await;
    assert_eq!(before.status, 503);
    assert_eq!(retry_after(&before), Some("3".parse().unwrap()));
    std::fs::write(&path, config("7s")).unwrap();
    let reloaded = gw.reload().await.expect("a valid file");
    assert!(reloaded.restart_required.is_empty(), "{reloaded:?}");
    let after = get(admin, "/readyz").await;
    assert_eq!(after.status, 503);
    assert_eq!(retry_after(&after), Some("7".parse().unwrap()));
    gw.shutdown().await;
    loading.shutdown().await;
    std::fs::remove_file(&path).unwrap();
}

// === /v1/models ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_list_follows_upstream_health_and_includes_aliases() {
    let a = FakeUpstream::start(FakeConfig::vllm(2).model("only-a").model("both"))
        .await
        .unwrap();
    let b = FakeUpstream::start(FakeConfig::vllm(2).model("both"))
        .await
        .unwrap();
    let gw = gateway(&format!(
        "{}[aliases]\nalias-a = \"only-a\"\nalias-both = \"both\"\n\n{}[upstreams.a.models.both]\nparallel = 1\nqueue = 0\nqueue_timeout = \"5s\"\n\n{}",
        server(
            "health_check_interval = \"100ms\"\neject_after_failures = 1\nrestore_after_successes = 1"
        ),
        upstream_of("vllm", "a", &a.url(), "only-a", 1, 0),
        upstream_of("vllm", "b", &b.url(), "both", 1, 0),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    let all = ["alias-a", "alias-both", "both", "only-a"];
    assert_eq!(model_ids(addr).await, all);
    let listed = get(addr, "/v1/models").await.json();
    assert_eq!(listed["object"], "list");
    assert_eq!(listed["data"][0]["object"], "model");

    // "a" down: its own model and the alias to it disappear; the shared one stays.
    a.refuse_connections().await.unwrap();
    wait_for_health(admin, "a", "unhealthy").await;
    assert_eq!(model_ids(addr).await, ["alias-both", "both"]);

    a.accept_connections().await.unwrap();
    wait_for_health(admin, "a", "healthy").await;
    assert_eq!(model_ids(addr).await, all);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

// === metrics and status under load ===

/// Parses the `OpenMetrics` text exposition strictly enough to catch a malformed line: every
/// line is a `# HELP`/`# TYPE`/`# UNIT` comment, a sample of a declared family, or the final
/// `# EOF`. The lines themselves are read by the workspace's one parser (`slotgate-exposition`);
/// what is checked here is how they follow each other.
fn parse_exposition(text: &str) -> Vec<Sample> {
    let lines = exposition::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(lines.last(), Some(&Line::Eof), "ends with # EOF");
    let mut families: Vec<(String, String)> = Vec::new();
    let mut samples = Vec::new();
    for line in &lines[..lines.len() - 1] {
        let sample = match line {
            Line::Type { name, kind } => {
                assert!(
                    [
                        "counter",
                        "gauge",
                        "histogram",
                        "summary",
                        "info",
                        "stateset",
                        "unknown"
                    ]
                    .contains(&kind.as_str()),
                    "bad type in {line:?}"
                );
                families.push((name.clone(), kind.clone()));
                continue;
            }
            Line::Help { .. } | Line::Unit { .. } => continue,
            Line::Sample(sample) => sample,
            other => panic!("not a HELP, TYPE, UNIT or sample line before # EOF: {other:?}"),
        };
        let family = families
            .iter()
            .rev()
            .find(|(family, metric_type)| {
                let suffixes: &[&str] = match metric_type.as_str() {
                    "counter" => &["_total", "_created"],
                    "histogram" => &["_bucket", "_sum", "_count", "_created"],
                    "info" => &["_info"],
                    _ => &[""],
                };
                suffixes
                    .iter()
                    .any(|s| sample.name == format!("{family}{s}"))
            })
            .unwrap_or_else(|| panic!("sample of an undeclared family: {line:?}"));
        assert_eq!(
            families.last().map(|f| &f.0),
            Some(&family.0),
            "samples of a family are contiguous, after its TYPE: {line:?}"
        );
        samples.push(sample.clone());
    }
    samples
}

/// The value of the sample `name{labels}`, which must be a whole number; labels in any order.
fn int_of(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> i64 {
    let value = value_of(samples, name, labels);
    assert!(
        value.fract() == 0.0 && value.abs() < 1e15,
        "{name}{labels:?} = {value}"
    );
    #[expect(
        clippy::cast_possible_truncation,
        reason = "checked to be a small whole number"
    )]
    let whole = value as i64;
    whole
}

/// The value of the sample `name{labels}`; labels given in any order.
fn value_of(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    samples
        .iter()
        .find(|s| s.is_series(name, labels))
        .unwrap_or_else(|| panic!("no sample {name}{labels:?}"))
        .value
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "every series of the issue, checked in one scrape"
)]
async fn metrics_and_status_under_held_load_match_what_the_upstream_sees() {
    let fake = fake(8, "qwen").await;
    let gw = gateway(&format!(
        "{}{}capacity = 4\n",
        server(""),
        upstream_of("llama-server", "gpu", &fake.url(), "qwen", 2, 3),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    let key = support::authority(fake.addr());
    let gpu_qwen = [("upstream", "gpu"), ("model", "qwen")];

    // Five held requests: two run, three wait; a sixth is refused (queue full).
    let held = spawn_burst(5, |i| async move {
        chat(
            addr,
            "qwen",
            false,
            &[
                ("x-fake-hold-ms", "2500"),
                ("x-request-id", &format!("held-{i}")),
            ],
        )
        .await
    });
    fake.observer().wait_for_in_flight(2, SOON).await.unwrap();
    support::eventually("three queued", SOON, || {
        gw.limiter().queued(&key, "qwen") == 3
    })
    .await;
    chat(addr, "qwen", false, &[])
        .await
        .assert_problem(503, "queue-full");

    let text = metrics_text(admin).await;
    let samples = parse_exposition(&text);
    let seen = fake.observer().snapshot();
    assert_eq!(seen.in_flight, 2);
    assert_eq!(
        seen.queued, 0,
        "the gateway holds the queue, not the engine"
    );
    let count = |n: usize| i64::try_from(n).unwrap();
    assert_eq!(
        int_of(&samples, "slotgate_slots_in_use", &gpu_qwen),
        count(seen.in_flight)
    );
    assert_eq!(
        int_of(&samples, "slotgate_queue_depth", &gpu_qwen),
        count(5 - seen.received),
        "every request the engine has not seen waits in the gateway's queue"
    );
    assert_eq!(int_of(&samples, "slotgate_slots_capacity", &gpu_qwen), 2);
    assert_eq!(int_of(&samples, "slotgate_queue_capacity", &gpu_qwen), 3);
    assert_eq!(
        int_of(
            &samples,
            "slotgate_upstream_healthy",
            &[("upstream", "gpu")]
        ),
        1
    );
    assert_eq!(
        int_of(
            &samples,
            "slotgate_upstream_draining",
            &[("upstream", "gpu")]
        ),
        0
    );
    assert_eq!(int_of(&samples, "slotgate_model_loaded", &gpu_qwen), 1);
    assert_eq!(
        int_of(
            &samples,
            "slotgate_rejections_total",
            &[("model", "qwen"), ("reason", "queue_full")]
        ),
        1
    );
    assert_eq!(
        int_of(
            &samples,
            "slotgate_rejections_total",
            &[("model", "qwen"), ("reason", "queue_timeout")]
        ),
        0
    );
    for phase in ["queued", "streaming"] {
        assert_eq!(
            int_of(
                &samples,
                "slotgate_client_disconnects_total",
                &[("upstream", "gpu"), ("model", "qwen"), ("phase", phase)]
            ),
            0
        );
    }
    assert_eq!(int_of(&samples, "slotgate_config_generation", &[]), 1);
    assert_eq!(
        int_of(
            &samples,
            "slotgate_config_reloads_total",
            &[("result", "refused")]
        ),
        0
    );

    // The admin status tells the same story.
    let doc = upstream_status(admin, "gpu").await;
    let model = &doc["models"][0];
    assert_eq!(model["name"], "qwen", "{doc}");
    assert_eq!(model["in_flight"], 2, "{doc}");
    assert_eq!(model["queued"], 3, "{doc}");
    assert_eq!(model["parallel"], 2, "{doc}");
    assert_eq!(model["queue"], 3, "{doc}");
    assert_eq!(model["capacity"], 4, "{doc}");
    assert_eq!(model["queue_timeout"], "30s", "{doc}");
    assert_eq!(model["loaded"], true, "{doc}");
    assert_eq!(doc["health"]["status"], "healthy", "{doc}");
    assert_eq!(doc["draining"], false, "{doc}");
    assert_eq!(doc["kind"], "llama-server", "{doc}");
    let ready = get(admin, "/readyz").await;
    assert_eq!(ready.status, 200);
    assert_eq!(ready.json()["available_upstreams"], 1);

    for reply in replies(held).await {
        assert_eq!(reply.status, 200);
    }
    let samples = parse_exposition(&metrics_text(admin).await);
    assert_eq!(int_of(&samples, "slotgate_slots_in_use", &gpu_qwen), 0);
    assert_eq!(int_of(&samples, "slotgate_queue_depth", &gpu_qwen), 0);
    assert_eq!(
        int_of(
            &samples,
            "slotgate_requests_total",
            &[
                ("upstream", "gpu"),
                ("model", "qwen"),
                ("outcome", "completed")
            ]
        ),
        5
    );
    for histogram in [
        "slotgate_queue_wait_seconds_count",
        "slotgate_time_to_response_head_seconds_count",
        "slotgate_time_to_first_token_seconds_count",
        "slotgate_request_duration_seconds_count",
    ] {
        assert_eq!(int_of(&samples, histogram, &gpu_qwen), 5, "{histogram}");
    }
    let waited = value_of(&samples, "slotgate_queue_wait_seconds_sum", &gpu_qwen);
    assert!(waited > 0.0, "three of them waited");
    gw.shutdown().await;
    fake.shutdown().await;
}

// === API keys ===

/// A bare HTTP/1.1 upstream that records every request head and answers `200 {}`.
async fn recording_upstream() -> (
    SocketAddr,
    std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    tokio::task::JoinHandle<()>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let heads = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let recorded = std::sync::Arc::clone(&heads);
    let task = tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let heads = std::sync::Arc::clone(&recorded);
            connections.spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0_u8; 4096];
                loop {
                    // One request per connection is enough: answer with `Connection: close`.
                    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                        continue;
                    };
                    let head = String::from_utf8_lossy(&buffer[..end]).to_lowercase();
                    let length: usize = head
                        .lines()
                        .find_map(|l| l.strip_prefix("content-length:"))
                        .map_or(0, |v| v.trim().parse().unwrap());
                    while buffer.len() < end + 4 + length {
                        match stream.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                        }
                    }
                    heads.lock().unwrap().push(head);
                    let _ = stream
                        .write_all(
                            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                              content-length: 2\r\nconnection: close\r\n\r\n{}",
                        )
                        .await;
                    return;
                }
            });
        }
    });
    (addr, heads, task)
}

/// The fields besides `Authorization` that clients carry API keys in.
const KEY_FIELDS: [&str; 3] = ["x-api-key", "api-key", "openai-api-key"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_keys_stay_at_the_gateway_and_each_upstream_gets_its_own() {
    let (upstream, heads, task) = recording_upstream().await;
    let gw = gateway(&format!(
        "{}[upstreams.gpu]\nurl = \"http://{upstream}\"\nkind = \"vllm\"\napi_key = \"sk-upstream\"\n\n\
         [upstreams.gpu.models.qwen]\nparallel = 1\nqueue = 0\nqueue_timeout = \"5s\"\n",
        server("api_keys = [\"sk-client-1\", \"sk-client-2\"]"),
    ))
    .await;
    let addr = gw.api_addr();
    let before = heads.lock().unwrap().len();
    for wrong in [
        None,
        Some("Bearer sk-client-3"),
        Some("Bearer sk-client"),
        Some("Basic sk-client-1"),
    ] {
        let headers: Vec<(&str, &str)> = wrong.iter().map(|v| ("authorization", *v)).collect();
        chat(addr, "qwen", false, &headers)
            .await
            .assert_problem(401, "unauthorized");
    }
    let posts = |heads: &[String]| heads.iter().filter(|h| h.starts_with("post ")).count();
    assert_eq!(
        posts(&heads.lock().unwrap()[before..]),
        0,
        "no refused request got through"
    );

    for key in ["sk-client-1", "sk-client-2"] {
        // Every header an SDK may carry its key in (Anthropic's `x-api-key`, Azure's
        // `api-key`) stays here too, not only `Authorization`.
        let mut headers = vec![("authorization".to_owned(), format!("Bearer {key}"))];
        headers.extend(KEY_FIELDS.map(|field| (field.to_owned(), key.to_owned())));
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        let reply = chat(addr, "qwen", false, &headers).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let heads = heads.lock().unwrap().clone();
    let chats: Vec<&String> = heads.iter().filter(|h| h.starts_with("post ")).collect();
    assert_eq!(chats.len(), 2);
    for head in &chats {
        assert!(head.contains("authorization: bearer sk-upstream"), "{head}");
        assert!(
            !head.contains("sk-client"),
            "the client's key stays here: {head}"
        );
    }
    // The probes carry the upstream's key too (vLLM's --api-key guards /v1/models).
    let probe = heads
        .iter()
        .find(|h| h.starts_with("get /v1/models"))
        .expect("a residency probe");
    assert!(
        probe.contains("authorization: bearer sk-upstream"),
        "{probe}"
    );
    gw.shutdown().await;
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_key_is_withheld_from_an_upstream_without_its_own_key() {
    // With client keys on, the client's `Authorization` is its key to the gateway: an upstream
    // with no `api_key` of its own gets no `Authorization` at all, not the client's key.
    let (upstream, heads, task) = recording_upstream().await;
    let gw = gateway(&format!(
        "{}[upstreams.gpu]\nurl = \"http://{upstream}\"\nkind = \"vllm\"\n\n\
         [upstreams.gpu.models.qwen]\nparallel = 1\nqueue = 0\nqueue_timeout = \"5s\"\n",
        server("api_keys = [\"sk-client-1\"]"),
    ))
    .await;
    let reply = chat(
        gw.api_addr(),
        "qwen",
        false,
        &[
            ("authorization", "Bearer sk-client-1"),
            ("x-api-key", "sk-client-1"),
            ("api-key", "sk-client-1"),
            ("openai-api-key", "sk-client-1"),
        ],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let heads = heads.lock().unwrap().clone();
    let chat_head = heads
        .iter()
        .find(|h| h.starts_with("post "))
        .expect("the chat reached the upstream");
    assert!(
        !chat_head.contains("authorization"),
        "no Authorization upstream: {chat_head}"
    );
    assert!(
        !chat_head.contains("sk-client"),
        "no client key in any field: {chat_head}"
    );
    gw.shutdown().await;
    task.abort();

    // Without client keys the gateway is transparent: what the client sent is the engine's key.
    let (upstream, heads, task) = recording_upstream().await;
    let gw = gateway(&format!(
        "{}[upstreams.gpu]\nurl = \"http://{upstream}\"\nkind = \"vllm\"\n\n\
         [upstreams.gpu.models.qwen]\nparallel = 1\nqueue = 0\nqueue_timeout = \"5s\"\n",
        server(""),
    ))
    .await;
    let reply = chat(
        gw.api_addr(),
        "qwen",
        false,
        &[
            ("authorization", "Bearer sk-engine"),
            ("x-api-key", "sk-engine-x"),
        ],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let heads = heads.lock().unwrap().clone();
    let chat_head = heads
        .iter()
        .find(|h| h.starts_with("post "))
        .expect("the chat reached the upstream");
    assert!(
        chat_head.contains("authorization: bearer sk-engine"),
        "{chat_head}"
    );
    assert!(chat_head.contains("x-api-key: sk-engine-x"), "{chat_head}");
    gw.shutdown().await;
    task.abort();
}
