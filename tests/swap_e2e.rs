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
use support::{PATIENT, chat, gateway, get, open_chat, sample, server, upstream_status};

/// `n` chats sent at once, alternating "a" and "b", each held 100 ms by the engine: every
/// answer must be 200.
async fn interleaved_burst(addr: std::net::SocketAddr, n: usize) {
    let hold = [("x-fake-hold-ms", "100")];
    let burst: Vec<_> = (0..n)
        .map(|i| {
            let model = if i % 2 == 0 { "a" } else { "b" };
            tokio::spawn(async move { chat(addr, model, false, &hold).await })
        })
        .collect();
    for reply in burst {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
}

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
    interleaved_burst(addr, 16).await;
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
    assert_eq!(fake.observer().inference_requests().len(), 16);
    assert_never_two_models_at_once(&fake);
}

/// No two requests for different models were inside the engine at the same time.
fn assert_never_two_models_at_once(fake: &FakeUpstream) {
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
}

/// Requests of `models` waiting for their place, by the admin API.
fn waiting_for_place(doc: &Value, models: &[&str]) -> u64 {
    models
        .iter()
        .map(|m| model_doc(doc, m)["waiting_for_place"].as_u64().unwrap_or(0))
        .sum()
}

/// The router's bound not read yet (its `/props` did not answer the check before serving): a
/// burst arriving meanwhile waits in the gateway for it, then collates as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_that_arrives_before_the_bound_is_read_waits_for_it_and_still_collates() {
    let fake = router().await;
    fake.set_router_props(false);
    // Many failed reads before the gateway stops waiting for the bound: the test says when.
    let toml = config("llama-server", &fake.url(), "").replace(
        "health_check_interval = \"100ms\"",
        "health_check_interval = \"100ms\"\neject_after_failures = 1000",
    );
    let gw = gateway(&toml).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    let doc = upstream_status(admin, "r").await;
    assert!(doc["residency"]["max_loaded_models"].is_null(), "{doc}");
    assert_eq!(doc["health"]["status"], "healthy", "{doc}");

    let hold = [("x-fake-hold-ms", "100")];
    let burst: Vec<_> = (0..16)
        .map(|i| {
            let model = if i % 2 == 0 { "a" } else { "b" };
            tokio::spawn(async move { chat(addr, model, false, &hold).await })
        })
        .collect();
    wait_for(admin, "the whole burst waits for the bound", |d| {
        waiting_for_place(d, &["a", "b"]) == 16
    })
    .await;
    assert!(fake.observer().inference_requests().is_empty());
    fake.set_router_props(true);
    for reply in burst {
        let reply = reply.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let loads = fake.model_loads("a").unwrap() + fake.model_loads("b").unwrap();
    assert!(loads <= 2, "{loads} loads for an interleaved burst of 16");
    assert_never_two_models_at_once(&fake);
}

/// Once a load was timed, a refusal for the model while it is not loaded says to come back no
/// sooner than a load takes (`Retry-After`), and a stream waiting for its place is told as much
/// (`eta_s`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_and_eta_s_include_the_measured_load_time() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(2)
            .router(true)
            .model("a")
            .unloaded_model("b")
            .models_max(1)
            .model_load_delay(Duration::from_millis(1500)),
    )
    .await
    .unwrap();
    let toml = config("llama-server", &fake.url(), "").replace(
        "[upstreams.r.models.b]\nparallel = 2\nqueue = 16\nqueue_timeout = \"30s\"\n",
        "[upstreams.r.models.b]\nparallel = 2\nqueue = 16\nqueue_timeout = \"300ms\"\n\
         queue_keepalive = \"1s\"\n",
    );
    let gw = gateway(&toml).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    // One load of "b" (by the engine itself, so no request's hold time includes it), timed by
    // the checks; then a request for "b", whose short hold is the typical one.
    assert!(fake.load_model("b").await);
    let doc = wait_for(admin, "b's load timed", |d| {
        d["residency"]["models"]["b"]["last_load_seconds"].is_number()
    })
    .await;
    let load = doc["residency"]["models"]["b"]["last_load_seconds"]
        .as_f64()
        .unwrap();
    let reply = chat(addr, "b", false, &[]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // "a" takes the place back and keeps it busy; "b" is seen unloaded.
    let busy = open_chat(addr, "a", false, &[("x-fake-fail", "hang")]).await;
    wait_for(admin, "a loaded and busy, b unloaded", |d| {
        d["residency"]["models"]["a"]["state"] == "loaded"
            && d["residency"]["models"]["b"]["state"] == "unloaded"
            && model_doc(d, "a")["in_flight"] == 1
    })
    .await;

    // "b" waits for its place past its queue_timeout: refused, told to come back after a load.
    let reply = chat(addr, "b", false, &[]).await;
    reply.assert_problem(503, "queue-timeout");
    #[expect(clippy::cast_precision_loss, reason = "a few seconds")]
    let retry_after = reply.retry_after() as f64;
    assert!(
        retry_after >= load,
        "Retry-After {retry_after} < load {load}"
    );

    // A stream for "b" waiting for its place: its first comment's eta_s counts the load too.
    let text = chat(addr, "b", true, &[]).await.text();
    let first = text
        .lines()
        .find(|l| l.starts_with(':'))
        .unwrap_or_else(|| panic!("a comment: {text}"));
    let eta: f64 = first
        .strip_prefix(": waiting for a model place models_ahead=0 eta_s=")
        .and_then(|eta| eta.trim().parse().ok())
        .unwrap_or_else(|| panic!("{first:?}"));
    assert!(eta >= load, "eta_s {eta} < load {load}: {text}");
    busy.disconnect();
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
    let busy = open_chat(
        addr,
        "a",
        false,
        &[("x-fake-fail", "hang"), ("x-request-id", "busy")],
    )
    .await;
    fake.observer()
        .wait_for_in_flight(1, PATIENT)
        .await
        .unwrap();
    let waiting = open_chat(addr, "b", false, &[("x-request-id", "leaver")]).await;
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
    interleaved_burst(addr, 8).await;
    assert_never_two_models_at_once(&fake);
    assert!(fake.model_loads("b").unwrap() <= 1);
}

/// While a streamed request waits at the gate for its model's place, `queue_keepalive` keeps it
/// told where it stands (the models whose loads come first, the wait expected), and the
/// engine's tokens follow once its model is loaded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_waiting_for_its_models_place_gets_keepalive_comments() {
    let fake = router().await;
    let toml = config("llama-server", &fake.url(), "").replace(
        "[upstreams.r.models.b]\n",
        "[upstreams.r.models.b]\nqueue_keepalive = \"1s\"\n",
    );
    let gw = gateway(&toml).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    wait_for(admin, "max_instances read", |d| {
        d["residency"]["max_loaded_models"] == 1
    })
    .await;
    // "a" is busy for 2.5s: "b" waits for its place meanwhile.
    let busy = tokio::spawn(chat(addr, "a", false, &[("x-fake-hold-ms", "2500")]));
    fake.observer()
        .wait_for_in_flight(1, PATIENT)
        .await
        .unwrap();
    let mut stream = open_chat(addr, "b", true, &[("x-request-id", "kept")])
        .await
        .head()
        .await;
    assert_eq!(stream.status.as_u16(), 200);
    let text = String::from_utf8(stream.rest().await.expect("a clean end").to_vec()).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| l.starts_with(':') || l.starts_with("data:"))
        .collect();
    let waiting = lines
        .iter()
        .take_while(|l| l.starts_with(": waiting for a model place"))
        .count();
    assert!(
        waiting >= 2,
        "a comment at once and one a second: {lines:?}"
    );
    assert!(
        lines[0].starts_with(": waiting for a model place models_ahead=0 eta_s="),
        "{lines:?}"
    );
    let granted = lines
        .iter()
        .position(|l| l.starts_with(": granted waited_ms="))
        .unwrap_or_else(|| panic!("granted: {lines:?}"));
    assert!(
        lines[waiting..granted]
            .iter()
            .all(|l| l.starts_with(": queued position=")),
        "{lines:?}"
    );
    assert_eq!(lines.last().copied(), Some("data: [DONE]"), "{lines:?}");
    assert_eq!(busy.await.unwrap().status, 200);
    assert!(fake.observer().request("kept").expect("served").is_done());
}

/// Placement across hosts: two routers serve "a" and "b", one place each, "a" loaded on both.
/// While the first listed is busy with "a", a request for "b" goes to the second, whose place
/// can be taken at once, instead of waiting behind the first's work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_not_loaded_anywhere_goes_where_its_load_can_start_now() {
    let (one, two) = (router().await, router().await);
    let model = |up: &str, name: &str| {
        format!(
            "[upstreams.{up}.models.{name}]\nparallel = 2\nqueue = 16\nqueue_timeout = \"30s\"\n"
        )
    };
    let toml = format!(
        "{}[upstreams.r]\nurl = \"{}\"\nkind = \"llama-server\"\n{}{}\
         [upstreams.s]\nurl = \"{}\"\nkind = \"llama-server\"\n{}{}",
        server("health_check_interval = \"100ms\""),
        one.url(),
        model("r", "a"),
        model("r", "b"),
        two.url(),
        model("s", "a"),
        model("s", "b"),
    );
    let gw = gateway(&toml).await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    for name in ["r", "s"] {
        let deadline = tokio::time::Instant::now() + PATIENT;
        while upstream_status(admin, name).await["residency"]["max_loaded_models"] != 1 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name}'s bound read"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // "a" runs on the first listed ("r") until its client goes.
    let busy = open_chat(
        addr,
        "a",
        false,
        &[("x-fake-fail", "hang"), ("x-request-id", "busy")],
    )
    .await;
    one.observer().wait_for_in_flight(1, PATIENT).await.unwrap();
    let reply = chat(addr, "b", false, &[("x-request-id", "placed")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(two.observer().request("placed").is_some(), "served by s");
    assert!(one.observer().request("placed").is_none());
    assert_eq!(one.model_loads("b"), Some(0), "r never swapped");
    busy.disconnect();
}
