//! Models that come and go on the real engine (issue #32): a llama-server in router mode with two
//! copies of the tiny model, `a` and `b`, and `--models-max 1`, behind the gateway, which reads
//! the bound from the router's own `/props`. What the fake's router mode proves for the rules
//! (`tests/swap_e2e.rs`), these prove against the real router: requests for the model that is
//! not loaded wait in the gateway, not inside the router, and a client that leaves while
//! waiting never reaches it.
//!
//! The router's own view is its log: every request for a model that is not ready logs `waiting
//! until model name=M is fully loaded` when it enters the router (server-models.cpp
//! `ensure_model_ready`), and every load `spawning server instance with name=M`. Its probes
//! here always say `autoload=false`, as the gateway's do, so they never load anything.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::engine_support::{Engine, EngineApi, EngineOptions, long_chat};
use crate::support::{gateway, open, post, send, server};
use crate::{PATIENT, wait_for};

/// The gateway in front of the router at `url`: models `a` and `b`, 2 slots each, a queue of
/// 16; no bound configured (read from the router).
fn config(url: &str) -> String {
    let model = |name: &str| {
        format!(
            "[upstreams.router.models.{name}]\nparallel = 2\nqueue = 16\nqueue_timeout = \"60s\"\n"
        )
    };
    format!(
        "{}[upstreams.router]\nurl = \"{url}\"\nkind = \"llama-server\"\n{}{}",
        server("health_check_interval = \"100ms\""),
        model("a"),
        model("b"),
    )
}

/// One model's entry in the upstream's document.
fn model_doc<'d>(doc: &'d Value, model: &str) -> &'d Value {
    doc["models"]
        .as_array()
        .and_then(|models| models.iter().find(|m| m["name"] == model))
        .unwrap_or_else(|| panic!("no model {model} in {doc}"))
}

/// How many lines of the router's log contain `needle`.
fn count(engine: &Engine, needle: &str) -> usize {
    engine.log_lines_with(needle).len()
}

/// Requests for `model` that entered the router while it was not loaded.
fn entered_unloaded(engine: &Engine, model: &str) -> usize {
    count(
        engine,
        &format!("waiting until model name={model} is fully loaded"),
    )
}

/// The router's loads of `model`.
fn loads(engine: &Engine, model: &str) -> usize {
    count(
        engine,
        &format!("spawning server instance with name={model} "),
    )
}

/// Whether one of `model`'s slots is processing, by the router's `/slots?model=` (without
/// loading it: an unloaded model answers 400, not busy).
async fn busy(api: EngineApi, model: &str) -> bool {
    let reply = api
        .get(&format!("/slots?model={model}&autoload=false"))
        .await;
    reply.status == 200
        && reply
            .json()
            .as_array()
            .is_some_and(|slots| slots.iter().any(|s| s["is_processing"] == true))
}

/// Sends a short chat for `model` through the gateway and expects a 200.
async fn served(addr: SocketAddr, model: &str, max_tokens: usize) {
    let reply = send(post(
        addr,
        "/v1/chat/completions",
        long_chat(model, max_tokens, false),
        &[],
    ))
    .await;
    assert_eq!(reply.status, 200, "{model}: {}", reply.text());
}

/// What the poller saw while the burst ran.
#[derive(Debug, Default)]
struct Seen {
    polls: usize,
    /// Times `b` had entered the router (by its log, read first) while `a` was busy (read
    /// after): a request for `b` waiting inside the engine behind `a`'s work.
    b_inside_while_a_busy: usize,
    /// The most requests for `b` waiting for a place in the gateway.
    b_waiting_for_place: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_mode_an_interleaved_burst_waits_in_the_gateway_and_loads_twice() {
    let engine = Arc::new(Engine::start(EngineOptions::router(&["a", "b"], 1)).await);
    let api = engine.api();
    let gw = gateway(&config(&engine.url())).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    let doc = wait_for(admin, "the router's bound", |d| {
        d["residency"]["max_loaded_models"] == 1
    })
    .await;
    assert_eq!(
        doc["residency"]["models"]["a"]["state"], "unloaded",
        "{doc}"
    );
    // `a` is loaded first (one load), so the burst starts on a loaded model.
    served(addr, "a", 4).await;

    let done = Arc::new(AtomicBool::new(false));
    let poller = {
        let (engine, done) = (Arc::clone(&engine), Arc::clone(&done));
        tokio::spawn(async move {
            let mut seen = Seen::default();
            while !done.load(Ordering::Relaxed) {
                let b_entered = entered_unloaded(&engine, "b") > 0;
                if b_entered && busy(api, "a").await {
                    seen.b_inside_while_a_busy += 1;
                }
                let doc = crate::upstream_status(admin).await;
                let waiting = model_doc(&doc, "b")["waiting_for_place"].as_u64();
                seen.b_waiting_for_place = seen.b_waiting_for_place.max(waiting.unwrap_or(0));
                seen.polls += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            seen
        })
    };

    // a b a b …, 8 of each, 10 ms apart so they arrive in that order; 150 tokens each (a
    // fraction of a second), so `a`'s 8 on 2 slots keep it busy while every `b` arrives.
    let started = Instant::now();
    let mut burst = Vec::new();
    for i in 0..16 {
        let model = if i % 2 == 0 { "a" } else { "b" };
        burst.push(tokio::spawn(served(addr, model, 150)));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for reply in burst {
        tokio::time::timeout(PATIENT, reply)
            .await
            .expect("the burst is answered")
            .unwrap();
    }
    done.store(true, Ordering::Relaxed);
    let seen = poller.await.unwrap();
    let (a_loads, b_loads) = (loads(&engine, "a"), loads(&engine, "b"));
    eprintln!(
        "burst answered in {:?}; loads a {a_loads}, b {b_loads}; {seen:?}",
        started.elapsed()
    );
    assert!(seen.polls >= 5, "the engine was polled meanwhile: {seen:?}");
    assert!(
        a_loads + b_loads <= 3,
        "{a_loads} + {b_loads} loads for an interleaved burst of 16 (warm-up included)"
    );
    assert_eq!(
        seen.b_inside_while_a_busy, 0,
        "a request for b waited inside the router while a was busy: {seen:?}"
    );
    assert!(
        seen.b_waiting_for_place >= 1,
        "b waited for its place in the gateway: {seen:?}"
    );
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_mode_a_client_that_leaves_while_its_model_waits_never_reaches_the_router() {
    let engine = Engine::start(EngineOptions::router(&["a", "b"], 1)).await;
    let gw = gateway(&config(&engine.url())).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    wait_for(admin, "the router's bound", |d| {
        d["residency"]["max_loaded_models"] == 1
    })
    .await;
    served(addr, "a", 4).await;

    // `a` streams a long answer (2000 tokens, seconds) until its client goes.
    let mut stream = open(
        addr,
        post(
            addr,
            "/v1/chat/completions",
            long_chat("a", 2000, true),
            &[],
        ),
    )
    .await
    .head()
    .await;
    assert_eq!(stream.status, 200);
    stream.next_data().await.expect("a's stream").expect("data");

    // `b` waits for its place in the gateway, then its client goes.
    let leaver = open(
        addr,
        post(addr, "/v1/chat/completions", long_chat("b", 4, false), &[]),
    )
    .await;
    wait_for(admin, "b waits for a place", |d| {
        model_doc(d, "b")["waiting_for_place"] == 1
    })
    .await;
    leaver.disconnect();
    wait_for(admin, "b no longer waits", |d| {
        model_doc(d, "b")["waiting_for_place"] == 0
    })
    .await;
    stream.disconnect();
    wait_for(admin, "a's stream is over", |d| {
        model_doc(d, "a")["in_flight"] == 0
    })
    .await;
    assert_eq!(entered_unloaded(&engine, "b"), 0, "{}", engine.log_tail());
    assert_eq!(loads(&engine, "b"), 0, "{}", engine.log_tail());

    // A later `b` is served: one request for `b` ever entered the router, one load.
    served(addr, "b", 4).await;
    assert_eq!(entered_unloaded(&engine, "b"), 1, "{}", engine.log_tail());
    assert_eq!(loads(&engine, "b"), 1, "{}", engine.log_tail());
    gw.shutdown().await;
}
