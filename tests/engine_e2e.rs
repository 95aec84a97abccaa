//! The engine suite: slotgate in-process in front of a *real* llama.cpp `llama-server` (a tiny
//! random-weight model, loopback only). The fake upstream proves the gateway's logic; these
//! tests prove that the gateway is right about the real engine: that it never lets the engine
//! queue behind its back, that a client leaving frees the engine's slot, that the OpenAI SDK
//! reads the real engine's stream through it, that health and residency work against the
//! real endpoints, and ([`router_mode`]) that in router mode requests for a model that is not
//! loaded wait in the gateway rather than inside the router.
//!
//! The engine comes from `LLAMA_SERVER`/`TINY_MODEL` or from `tests/engine/setup.sh` (see
//! `tests/engine_support`); a missing engine fails the suite, it is never skipped. Every engine
//! a test starts is stopped when the test ends, failing tests included. How the real server
//! behaves, and the timings these tests rely on, are in `docs/real-engine-notes.md`.
//!
//! Timing: requests are made long (`ignore_eos`, hundreds to thousands of tokens, ~2 ms each)
//! so that they overlap; assertions are on counts and on the engine's own view, and every wait
//! polls under a generous deadline.

mod engine_support;
#[path = "engine_e2e/router_mode.rs"]
mod router_mode;
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use engine_support::{Engine, EngineOptions, capture_logs, long_chat, spawn_long_chats};
use serde_json::Value;
use support::{
    SCRIPT_LIMIT, SOON, admin_sample, authority, eventually, gateway, get, open, openai_python,
    post, run_bounded, send, server, upstream,
};

/// Long enough for anything on a loaded 2-core machine; only reached when a test fails.
const PATIENT: Duration = Duration::from_secs(60);

/// What a poller saw of the engine during a burst.
#[derive(Debug, Default, Clone, Copy)]
struct Peaks {
    polls: usize,
    busy_slots: usize,
    processing: f64,
    deferred: f64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_of_twelve_gets_200_or_503_and_the_engine_never_queues() {
    let engine = Engine::start(EngineOptions::default()).await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("engine", &engine.url(), "tiny", 2, 4, "300s")
    ))
    .await;
    let addr = gw.api_addr();

    // The engine's own view, polled all through the burst.
    let api = engine.api();
    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let done = Arc::clone(&done);
        tokio::spawn(async move {
            let mut peaks = Peaks::default();
            while !done.load(Ordering::Relaxed) {
                peaks.busy_slots = peaks.busy_slots.max(api.busy_slots().await);
                peaks.processing = peaks
                    .processing
                    .max(api.metric("requests_processing").await);
                peaks.deferred = peaks.deferred.max(api.metric("requests_deferred").await);
                peaks.polls += 1;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            peaks
        })
    };

    // 12 at once; each holds a slot for ~1000 tokens (a second or more), so all of them arrive
    // while the first two run: 2 run, 4 wait, 6 are refused at once.
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("burst-{i}");
                send(post(
                    addr,
                    "/v1/chat/completions",
                    long_chat("tiny", 1000, false),
                    &[("x-request-id", &id)],
                ))
                .await
            })
        })
        .collect();
    let mut ok = 0;
    let mut refused = 0;
    for task in tasks {
        let reply = task.await.unwrap();
        match reply.status.as_u16() {
            200 => {
                let doc = reply.json();
                assert_eq!(doc["object"], "chat.completion", "{doc}");
                assert_eq!(doc["usage"]["completion_tokens"], 1000, "{doc}");
                ok += 1;
            }
            503 => {
                reply.assert_problem(503, "queue-full");
                reply.retry_after();
                refused += 1;
            }
            other => panic!("unexpected status {other}: {}", reply.text()),
        }
    }
    done.store(true, Ordering::Relaxed);
    let peaks = poller.await.unwrap();
    eprintln!("{ok} served, {refused} refused; engine peaks: {peaks:?}");

    assert_eq!(ok + refused, 12);
    // 2 running + 4 queued are served at least; the rest came while all 6 places were taken.
    assert!(ok >= 6, "served {ok}");
    assert!(refused >= 1, "refused {refused}");
    assert!(
        peaks.polls >= 5,
        "the engine was polled during the burst: {peaks:?}"
    );
    assert_eq!(
        peaks.busy_slots, 2,
        "both slots busy, never more: {peaks:?}"
    );
    assert!(peaks.processing <= 2.0, "{peaks:?}");
    assert!(
        peaks.deferred == 0.0,
        "the engine queued requests itself (requests_deferred {}): {peaks:?}",
        peaks.deferred
    );
    assert_eq!(gw.limiter().in_flight(&authority(engine.addr), "tiny"), 0);
    gw.shutdown().await;
}

/// `next_token[0].n_decoded` of a slot that has run (an array in real servers; PROTOCOLS says
/// some builds send an object).
fn decoded(slot: &Value) -> Option<u64> {
    let next = &slot["next_token"];
    next.get(0).unwrap_or(next)["n_decoded"].as_u64()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_by_the_client_frees_the_engine_slot_at_once() {
    const MAX_TOKENS: u64 = 2000;
    let engine = Engine::start(EngineOptions::default()).await;
    let api = engine.api();
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("engine", &engine.url(), "tiny", 2, 0, "30s")
    ))
    .await;
    let key = authority(engine.addr);

    #[allow(clippy::cast_possible_truncation)]
    let body = long_chat("tiny", MAX_TOKENS as usize, true);
    let mut stream = open(
        gw.api_addr(),
        post(gw.api_addr(), "/v1/chat/completions", body, &[]),
    )
    .await
    .head()
    .await;
    assert_eq!(stream.status, 200);
    // A few events in: the engine is generating.
    for _ in 0..3 {
        let data = stream
            .next_data()
            .await
            .expect("stream data")
            .expect("more data");
        assert!(data.starts_with(b"data: "), "{data:?}");
    }
    assert_eq!(
        api.busy_slots().await,
        1,
        "the stream holds one engine slot"
    );
    assert_eq!(gw.limiter().in_flight(&key, "tiny"), 1);

    let cut = Instant::now();
    stream.disconnect();
    // Seen idle by a poll that *started* within a second of the cut (a slow poll on a loaded
    // machine does not count against the engine). The engine notices at its next write, ~10 ms.
    let idle_after = loop {
        let asked = cut.elapsed();
        if api.busy_slots().await == 0 {
            break asked;
        }
        assert!(
            asked < Duration::from_secs(1),
            "the engine slot still busy {asked:?} after the client left"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    eprintln!("engine slot idle {idle_after:?} after the client cut the stream");
    // Cut, not finished: the slot stopped far short of the tokens asked for.
    let slots = api.slots().await;
    let decoded: Vec<u64> = slots.iter().filter_map(decoded).collect();
    assert!(
        !decoded.is_empty() && decoded.iter().all(|&n| n < MAX_TOKENS),
        "the slot stopped early: {slots:?}"
    );
    eventually("the gateway gives its slot back", SOON, || {
        gw.limiter().in_flight(&key, "tiny") == 0
    })
    .await;
    gw.shutdown().await;
}

/// With `parallel` 2 and `queue` 4 on the default engine (2 slots, here verbose): two long
/// non-streamed requests run, two more wait in the gateway, then the first two clients go away
/// before any answer. Returns when the waiting ones were answered (each must be a 200), with the
/// engine's log lines that say it deferred a task.
///
/// The engine is not polled meanwhile: each `/metrics` or `/slots` request would wake the
/// vanished clients' handlers and keep them from noticing (measured: with a 10 ms poller the cut
/// requests ran to their end). Its verbose log says afterwards whether it deferred anything.
async fn cut_two_non_streamed_with_two_queued(grace: Option<&str>) -> Vec<String> {
    let engine = Engine::start(EngineOptions {
        verbose: true,
        ..EngineOptions::default()
    })
    .await;
    let api = engine.api();
    let mut upstream = upstream("engine", &engine.url(), "tiny", 2, 4, "300s");
    if let Some(grace) = grace {
        upstream = upstream.replace(
            "kind = \"llama-server\"\n",
            &format!("kind = \"llama-server\"\ncancel_grace = \"{grace}\"\n"),
        );
    }
    let gw = gateway(&format!("{}{upstream}", server(""))).await;
    let addr = gw.api_addr();
    let key = authority(engine.addr);

    // Two requests of 2000 tokens (seconds each) fill both engine slots.
    let mut leavers = Vec::new();
    for _ in 0..2 {
        leavers.push(
            open(
                addr,
                post(
                    addr,
                    "/v1/chat/completions",
                    long_chat("tiny", 2000, false),
                    &[],
                ),
            )
            .await,
        );
    }
    let deadline = Instant::now() + PATIENT;
    while api.busy_slots().await < 2 {
        assert!(Instant::now() < deadline, "the engine never ran both");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Two more wait in the gateway.
    let waiting = spawn_long_chats(addr, "tiny", 2, 200);
    eventually("two queued", SOON, || {
        gw.limiter().queued(&key, "tiny") == 2
    })
    .await;

    let cut = Instant::now();
    for leaver in leavers {
        leaver.disconnect();
    }
    for task in waiting {
        let reply = tokio::time::timeout(PATIENT, task)
            .await
            .expect("the queued requests are answered")
            .unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["usage"]["completion_tokens"], 200);
    }
    eprintln!("queued requests answered {:?} after the cut", cut.elapsed());
    eventually("the gateway gives its slots back", SOON, || {
        gw.limiter().in_flight(&key, "tiny") == 0
    })
    .await;
    gw.shutdown().await;
    for line in engine.log_lines_with("cancel task") {
        eprintln!("engine: {line}");
    }
    engine.log_lines_with("defer task")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_clients_that_leave_before_the_answer_never_make_the_engine_queue() {
    // The default `cancel_grace` of a llama-server upstream (2 s): the engine notices a closed
    // non-streamed connection only at its next 1 s poll, so the slots stay taken meanwhile.
    let deferred = cut_two_non_streamed_with_two_queued(None).await;
    assert!(
        deferred.is_empty(),
        "the engine queued requests itself:\n{}",
        deferred.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openai_python_sdk_streams_from_the_real_engine_through_the_gateway() {
    let python = tokio::task::spawn_blocking(|| openai_python("openai-sdk-venv-engine"))
        .await
        .unwrap();
    let engine = Engine::start(EngineOptions::default()).await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("engine", &engine.url(), "tiny", 2, 4, "60s")
    ))
    .await;
    let base_url = format!("http://{}/v1", gw.api_addr());
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/engine/sdk_stream.py");
    let output = tokio::task::spawn_blocking(move || {
        run_bounded(
            std::process::Command::new(python).arg(script).arg(base_url),
            SCRIPT_LIMIT,
        )
    })
    .await
    .unwrap()
    .expect("the SDK script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the SDK script failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("all engine SDK checks passed"), "{stdout}");
    eprintln!("{stdout}");
    gw.shutdown().await;
}

/// `GET /admin/upstreams`, the one upstream's document.
async fn upstream_status(admin: std::net::SocketAddr) -> Value {
    let reply = get(admin, "/admin/upstreams").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()["upstreams"][0].clone()
}

/// Polls the admin API until `check` holds for the upstream's document.
async fn wait_for(
    admin: std::net::SocketAddr,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + PATIENT;
    loop {
        let doc = upstream_status(admin).await;
        if check(&doc) {
            return doc;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_health_and_residency_follow_the_real_engine() {
    let mut engine = Engine::start(EngineOptions::default()).await;
    let port = engine.addr.port();
    let gw = gateway(&format!(
        "{}{}",
        server(
            "health_check_interval = \"100ms\"\nhealth_check_timeout = \"2s\"\n\
             eject_after_failures = 2\nrestore_after_successes = 2"
        ),
        upstream("engine", &engine.url(), "tiny", 2, 0, "30s")
    ))
    .await;
    let admin = gw.admin_addr().unwrap();

    // /health 200 → healthy; /models lists the one model (no router status) → every model
    // configured there is resident, and the engine's own name for it is reported.
    let doc = wait_for(admin, "healthy and resident", |doc| {
        doc["health"]["status"] == "healthy" && doc["residency"]["resident"].is_array()
    })
    .await;
    assert_eq!(doc["kind"], "llama-server");
    assert_eq!(
        doc["residency"]["resident"],
        serde_json::json!(["tiny"]),
        "{doc}"
    );
    assert_eq!(doc["loaded"], serde_json::json!(["tiny"]), "{doc}");
    assert_eq!(doc["models"][0]["loaded"], true, "{doc}");
    let models = get(gw.api_addr(), "/v1/models").await.json();
    assert_eq!(models["data"][0]["id"], "tiny", "{models}");

    // The engine goes away: ejected after two failed checks; requests get a 503 at once.
    engine.stop();
    let doc = wait_for(admin, "ejected", |doc| {
        doc["health"]["status"] == "unhealthy"
    })
    .await;
    assert!(doc["health"]["last_error"].is_string(), "{doc}");
    let reply = send(post(
        gw.api_addr(),
        "/v1/chat/completions",
        long_chat("tiny", 4, false),
        &[],
    ))
    .await;
    assert_eq!(reply.status, 503, "{}", reply.text());

    // Back on the same port: restored after two good checks, and it serves again.
    let _engine = Engine::start(EngineOptions {
        port: Some(port),
        ..EngineOptions::default()
    })
    .await;
    wait_for(admin, "restored", |doc| {
        doc["health"]["status"] == "healthy"
    })
    .await;
    let reply = send(post(
        gw.api_addr(),
        "/v1/chat/completions",
        long_chat("tiny", 4, false),
        &[],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["usage"]["completion_tokens"], 4);
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_auto_reads_the_real_engines_slots_and_holds_the_line_there() {
    let engine = Engine::start(EngineOptions {
        parallel: 3,
        context: 3 * 1024,
        ..EngineOptions::default()
    })
    .await;
    let toml = format!(
        "{}[upstreams.engine]\nurl = \"{}\"\nkind = \"llama-server\"\n\n\
         [upstreams.engine.models.tiny]\nparallel = \"auto\"\nqueue = 8\nqueue_timeout = \"300s\"\n",
        server(""),
        engine.url()
    );
    // What `slotgate check` reports.
    let config = slotgate_config::Config::from_toml_str(&toml).unwrap();
    let found = slotgate_gateway::probe_config(&config).await;
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].slots.as_ref().ok(), Some(&3), "{found:?}");

    let gw = gateway(&toml).await;
    let doc = upstream_status(gw.admin_addr().unwrap()).await;
    assert_eq!(doc["models"][0]["parallel"], "auto", "{doc}");
    assert_eq!(doc["models"][0]["slots"], 3, "{doc}");
    assert_eq!(doc["models"][0]["discovery"]["slots"], 3, "{doc}");
    let key = authority(engine.addr);
    assert_eq!(gw.limiter().limits(&key, "tiny").unwrap().parallel, 3);

    // 6 long requests at once: the engine runs 3 and never defers one.
    let api = engine.api();
    let addr = gw.api_addr();
    let tasks = spawn_long_chats(addr, "tiny", 6, 600);
    let mut peak_busy = 0;
    let mut peak_deferred = 0.0_f64;
    while !tasks.iter().all(tokio::task::JoinHandle::is_finished) {
        peak_busy = peak_busy.max(api.busy_slots().await);
        peak_deferred = peak_deferred.max(api.metric("requests_deferred").await);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(peak_busy, 3, "all three engine slots used, never more");
    assert!(peak_deferred == 0.0, "the engine deferred {peak_deferred}");
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_straight_to_the_engine_show_in_its_busy_count_and_are_warned_about() {
    let logs = capture_logs();
    let engine = Engine::start(EngineOptions::default()).await;
    let gw = gateway(&format!(
        "{}{}",
        server("health_check_interval = \"100ms\""),
        upstream("shared-engine", &engine.url(), "tiny", 1, 4, "300s")
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let engine_doc = || async { upstream_status(admin).await["models"][0]["engine"].clone() };

    // Idle: the engine's count and ours agree at 0.
    let deadline = Instant::now() + PATIENT;
    while engine_doc().await["busy"] != 0 {
        assert!(
            Instant::now() < deadline,
            "no reading: {}",
            engine_doc().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Beside the gateway, a client keeps one engine slot busy; one request goes through it.
    let stop = Arc::new(AtomicBool::new(false));
    let bypass = {
        let stop = Arc::clone(&stop);
        let addr = engine.addr;
        tokio::spawn(async move {
            let mut sent = 0;
            while !stop.load(Ordering::Relaxed) && sent < 100 {
                let reply = send(post(
                    addr,
                    "/v1/chat/completions",
                    long_chat("tiny", 2000, false),
                    &[],
                ))
                .await;
                assert_eq!(reply.status, 200, "{}", reply.text());
                sent += 1;
            }
        })
    };
    let through = {
        let addr = gw.api_addr();
        tokio::spawn(async move {
            send(post(
                addr,
                "/v1/chat/completions",
                long_chat("tiny", 1500, true),
                &[],
            ))
            .await
        })
    };

    let deadline = Instant::now() + PATIENT;
    let doc = loop {
        let doc = engine_doc().await;
        if doc["warning"] == true {
            break doc;
        }
        assert!(Instant::now() < deadline, "never warned: {doc}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    eprintln!("engine view when warned: {doc}");
    assert!(doc["unaccounted"].as_u64().unwrap() >= 1, "{doc}");
    assert_eq!(doc["waiting"], 0, "the engine queued nothing: {doc}");
    let warned = logs.lines_with(&["busier than slotgate accounts for", "shared-engine"]);
    assert_eq!(warned.len(), 1, "{warned:#?}");
    let busy = admin_sample(
        admin,
        "slotgate_engine_busy{upstream=\"shared-engine\",model=\"tiny\"}",
    )
    .await;
    assert!(busy.is_some_and(|b| b >= 1.0), "{busy:?}");

    stop.store(true, Ordering::Relaxed);
    bypass.await.unwrap();
    let reply = through.await.unwrap();
    assert_eq!(reply.status, 200);
    assert!(reply.text().ends_with("data: [DONE]\n\n"));
    let deadline = Instant::now() + PATIENT;
    while engine_doc().await["warning"] != false {
        assert!(
            Instant::now() < deadline,
            "still warned: {}",
            engine_doc().await
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
}

/// A native `/completion` body: `n_predict` tokens, all generated (`ignore_eos`), no `model`
/// (a single-model llama-server needs none, and the gateway routes it to the only model).
fn long_completion(n_predict: usize) -> String {
    serde_json::json!({"prompt": "Hello", "n_predict": n_predict, "ignore_eos": true}).to_string()
}

/// An Anthropic Messages body for `tiny`.
fn anthropic_messages(max_tokens: usize, stream: bool) -> String {
    serde_json::json!({
        "model": "tiny",
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "Hello"}],
        "ignore_eos": true,
        "stream": stream,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_native_and_anthropic_routes_reach_the_real_engine_and_hold_its_slots() {
    let engine = Engine::start(EngineOptions::default()).await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("engine", &engine.url(), "tiny", 2, 8, "300s")
    ))
    .await;
    let addr = gw.api_addr();

    // llama-server's own `/completion` shape (PROTOCOLS §11), with and without `model`.
    for body in [
        long_completion(8),
        serde_json::json!({"model": "tiny", "prompt": "Hello", "n_predict": 8}).to_string(),
    ] {
        let reply = send(post(addr, "/completion", body, &[])).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let doc = reply.json();
        assert!(doc["content"].is_string(), "{doc}");
        assert_eq!(doc["stop"], true, "{doc}");
    }
    // Tokens round-trip through `/tokenize` and `/detokenize`.
    let reply = send(post(
        addr,
        "/tokenize",
        r#"{"content":"Hello world"}"#.into(),
        &[],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let tokens = reply.json()["tokens"].clone();
    assert!(
        tokens
            .as_array()
            .is_some_and(|t| !t.is_empty() && t.iter().all(Value::is_u64)),
        "{tokens}"
    );
    let reply = send(post(
        addr,
        "/detokenize",
        serde_json::json!({ "tokens": tokens }).to_string(),
        &[],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply.json()["content"]
            .as_str()
            .is_some_and(|text| text.contains("Hello world")),
        "{}",
        reply.text()
    );
    // `/infill` needs FIM tokens, which the tiny model's SPM vocabulary lacks: the engine's own
    // 501 comes back through the gateway, and the slot it held goes back (checked below).
    let reply = send(post(
        addr,
        "/infill",
        r#"{"input_prefix":"fn main() {","input_suffix":"}","n_predict":8}"#.into(),
        &[],
    ))
    .await;
    assert_eq!(reply.status, 501, "{}", reply.text());
    assert!(
        reply.text().contains("Infill is not supported"),
        "{}",
        reply.text()
    );
    // Anthropic Messages, plain and streamed (PROTOCOLS §9).
    let reply = send(post(
        addr,
        "/v1/messages",
        anthropic_messages(8, false),
        &[],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let doc = reply.json();
    assert_eq!(doc["type"], "message", "{doc}");
    assert_eq!(doc["content"][0]["type"], "text", "{doc}");
    let reply = send(post(addr, "/v1/messages", anthropic_messages(8, true), &[])).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = reply.text();
    let start = text.find("message_start").expect("a message_start event");
    let stop = text.rfind("message_stop").expect("a message_stop event");
    assert!(start < stop, "{text}");
    let key = authority(engine.addr);
    eventually("every slot went back", SOON, || {
        gw.limiter().in_flight(&key, "tiny") == 0
    })
    .await;

    mixed_burst_keeps_two_engine_slots_busy(addr, &engine).await;
    gw.shutdown().await;
}

/// 3 long `/completion`s and 3 long `/v1/messages` at once through the gateway at `addr`, on 2
/// slots: the engine runs 2 and never defers one; `/tokenize` answers meanwhile, without a slot.
async fn mixed_burst_keeps_two_engine_slots_busy(addr: std::net::SocketAddr, engine: &Engine) {
    let api = engine.api();
    let tasks: Vec<_> = (0..6)
        .map(|i| {
            let (path, body) = if i % 2 == 0 {
                ("/completion", long_completion(600))
            } else {
                ("/v1/messages", anthropic_messages(600, false))
            };
            tokio::spawn(async move { send(post(addr, path, body, &[])).await })
        })
        .collect();
    let mut peak_busy = 0;
    let mut peak_deferred = 0.0_f64;
    let mut tokenized_while_full = false;
    while !tasks.iter().all(tokio::task::JoinHandle::is_finished) {
        let busy = api.busy_slots().await;
        peak_busy = peak_busy.max(busy);
        peak_deferred = peak_deferred.max(api.metric("requests_deferred").await);
        if busy == 2 && !tokenized_while_full {
            let reply = send(post(addr, "/tokenize", r#"{"content":"hi"}"#.into(), &[])).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            tokenized_while_full = true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(peak_busy, 2, "both engine slots used, never more");
    assert!(peak_deferred == 0.0, "the engine deferred {peak_deferred}");
    assert!(tokenized_while_full, "never saw both slots busy");
}
