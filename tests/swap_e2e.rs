//! End-to-end tests of models that come and go (issue #32): a llama-server router holding one
//! model at a time (`--models-max 1`), the gateway in front of it. Requests for the model that
//! is not loaded wait in the gateway while the loaded one is busy, never inside the engine; the
//! loaded model's requests are served first (collated), so an interleaved burst costs one swap
//! instead of one per request; a client that leaves while waiting never reaches the engine.
//!
//! Like the other e2e suites: the real gateway in-process, `fake-upstream` behind it, loopback
//! sockets only, every wait bounded.

mod support;

use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream, RequestRecord};
use serde_json::Value;
use support::{
    PATIENT, chat, chat_body, gateway, get, open, post, sample, server, upstream_status,
};

/// The router with models "a" (loaded) and "b" (not), one place, two slots each.
async fn router() -> FakeUpstream {
    FakeUpstream::start(
        FakeConfig::llama_server(2)
            .router(true)
            .model("a")
            .unloaded_model("b")
            .models_max(1)
            .model_load_delay(Duration::from_millis(150)),
    )
    .await
    .unwrap()
}

/// The gateway's configuration for an upstream "r" of `kind` at `url` (plus `extra` keys): models
/// "a" and "b", each `parallel = 2` and a queue of 16.
fn config(kind: &str, url: &str, extra: &str) -> String {
    let model = |name: &str| {
        format!("[upstreams.r.models.{name}]\nparallel = 2\nqueue = 16\nqueue_timeout = \"30s\"\n")
    };
    format!(
        "{}[upstreams.r]\nurl = \"{url}\"\nkind = \"{kind}\"\n{extra}\n{}{}",
        server("health_check_interval = \"100ms\""),
        model("a"),
        model("b"),
    )
}

/// Polls the admin API until `check` holds for upstream "r".
async fn wait_for(
    admin: std::net::SocketAddr,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENT;
    loop {
        let doc = upstream_status(admin, "r").await;
        if check(&doc) {
            return doc;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}; last status: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn model_doc<'d>(doc: &'d Value, model: &str) -> &'d Value {
    doc["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == model)
        .unwrap()
}

/// Whether two requests were inside the engine at the same time.
fn overlap(x: &RequestRecord, y: &RequestRecord) -> bool {
    let end = |r: &RequestRecord| r.ended_at.expect("ended");
    x.received_at < end(y) && y.received_at < end(x)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interleaved_burst_swaps_once_and_never_waits_inside_the_engine() {
    let fake = router().await;
    let gw = gateway(&config("llama-server", &fake.url(), "")).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    // The router's own /props says it holds one model: no setting needed.
    let doc = wait_for(admin, "max_instances read", |d| {
        d["residency"]["max_loaded_models"] == 1
    })
    .await;
    assert_eq!(doc["residency"]["max_instances"], 1, "{doc}");
    assert_eq!(doc["residency"]["models"]["a"]["state"], "loaded", "{doc}");
    assert_eq!(
        doc["residency"]["models"]["b"]["state"], "unloaded",
        "{doc}"
    );
    assert_eq!(model_doc(&doc, "a")["state"], "loaded", "{doc}");

    // A B A B …, 8 of each, all at once.
    let hold = [("x-fake-hold-ms", "100")];
    let burst: Vec<_> = (0..16)
        .map(|i| {
            let model = if i % 2 == 0 { "a" } else { "b" };
            tokio::spawn(async move { chat(addr, model, false, &hold).await })
        })
        .collect();
    for reply in burst {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let loads = fake.model_loads("a").unwrap() + fake.model_loads("b").unwrap();
    assert!(loads <= 2, "{loads} loads for an interleaved burst of 16");

    // The checks count the loads they saw (never more than the engine made) and show the bound.
    let seen = |d: &Value| {
        ["a", "b"]
            .iter()
            .map(|m| d["residency"]["models"][*m]["loads"].as_u64().unwrap_or(0))
            .sum::<u64>()
    };
    wait_for(admin, "a load counted", |d| seen(d) >= 1).await;
    let metrics = get(admin, "/metrics").await.text();
    let counted: f64 = ["a", "b"]
        .iter()
        .map(|m| {
            let series = format!(r#"slotgate_model_loads_total{{upstream="r",model="{m}"}}"#);
            sample(&metrics, &series).unwrap_or_else(|| panic!("{series}"))
        })
        .sum();
    #[expect(clippy::cast_precision_loss, reason = "a handful of loads")]
    let made = loads as f64;
    assert!(
        (1.0..=made).contains(&counted),
        "{counted} counted, {made} made"
    );
    for (series, value) in [
        (r#"slotgate_upstream_max_loaded_models{upstream="r"}"#, 1.0),
        (
            r#"slotgate_model_waiting_for_place{upstream="r",model="b"}"#,
            0.0,
        ),
    ] {
        assert_eq!(sample(&metrics, series), Some(value), "{series}");
    }

    // Never two models' requests inside the engine at once: the gateway held the other one.
    let records = fake.observer().inference_requests();
    assert_eq!(records.len(), 16);
    for x in &records {
        for y in &records {
            if x.model != y.model {
                assert!(
                    !overlap(x, y),
                    "{:?} and {:?} overlapped in the engine",
                    x.id,
                    y.id
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_its_model_waits_never_reaches_the_engine() {
    let fake = router().await;
    let gw = gateway(&config("llama-server", &fake.url(), "")).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    wait_for(admin, "max_instances read", |d| {
        d["residency"]["max_loaded_models"] == 1
    })
    .await;
    // "a" is busy with a request that runs until its client goes.
    let busy = open(
        addr,
        post(
            addr,
            "/v1/chat/completions",
            chat_body("a", false),
            &[("x-fake-fail", "hang"), ("x-request-id", "busy")],
        ),
    )
    .await;
    fake.observer()
        .wait_for_in_flight(1, PATIENT)
        .await
        .unwrap();
    let waiting = open(
        addr,
        post(
            addr,
            "/v1/chat/completions",
            chat_body("b", false),
            &[("x-request-id", "leaver")],
        ),
    )
    .await;
    let doc = wait_for(admin, "b waits for a place", |d| {
        model_doc(d, "b")["waiting_for_place"] == 1
    })
    .await;
    assert_eq!(model_doc(&doc, "b")["queued"], 0, "{doc}");
    // It leaves: no longer waiting, and the engine never saw it.
    waiting.disconnect();
    wait_for(admin, "b no longer waits", |d| {
        model_doc(d, "b")["waiting_for_place"] == 0
    })
    .await;
    busy.disconnect();
    // A later b runs (the place is free once a's request is gone).
    let reply = chat(addr, "b", false, &[("x-request-id", "later")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        fake.observer().request("leaver").is_none(),
        "reached the engine"
    );
    assert_eq!(fake.model_loads("b"), Some(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollama_with_max_loaded_models_holds_the_other_model_in_the_gateway() {
    let fake = FakeUpstream::start(
        FakeConfig::ollama(2)
            .model("a")
            .unloaded_model("b")
            .models_max(1),
    )
    .await
    .unwrap();
    let toml = config("ollama", &fake.url(), "max_loaded_models = 1");
    let gw = gateway(&toml).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    let doc = wait_for(admin, "a seen loaded", |d| {
        d["residency"]["models"]["a:latest"]["state"] == "loaded"
    })
    .await;
    assert_eq!(doc["residency"]["max_loaded_models"], 1, "{doc}");
    let hold = [("x-fake-hold-ms", "100")];
    let burst: Vec<_> = (0..8)
        .map(|i| {
            let model = if i % 2 == 0 { "a" } else { "b" };
            tokio::spawn(async move { chat(addr, model, false, &hold).await })
        })
        .collect();
    for reply in burst {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let records = fake.observer().inference_requests();
    for x in &records {
        for y in &records {
            if x.model != y.model {
                assert!(
                    !overlap(x, y),
                    "{:?} and {:?} overlapped in the engine",
                    x.id,
                    y.id
                );
            }
        }
    }
    assert!(fake.model_loads("b").unwrap() <= 1);
}
