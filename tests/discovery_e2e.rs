//! What the gateway learns from the engine itself, against `fake-upstream`: the slot count of a
//! `parallel = "auto"` model (llama-server `/props` `total_slots`), and the engine's own busy
//! count next to the gateway's (reconciliation: llama-server `/slots` and `/metrics`, vLLM
//! `/metrics`).
//!
//! The same behaviour against the real llama-server is in `tests/engine_e2e.rs`. Like the other
//! end-to-end tests: loopback only, and every wait polls under a generous deadline.

mod engine_support;
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use engine_support::capture_logs;
use fake_upstream::{FakeConfig, FakeUpstream};
use serde_json::Value;
use support::{PATIENT, SOON, admin_sample, authority, chat, fake, gateway, get, server, upstream};

/// An `[upstreams.NAME]` llama-server table with one `parallel = "auto"` model.
fn auto_upstream(name: &str, url: &str, model: &str, queue: usize) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"{url}\"\nkind = \"llama-server\"\n\n\
         [upstreams.{name}.models.{model}]\nparallel = \"auto\"\nqueue = {queue}\nqueue_timeout = \"30s\"\n"
    )
}

/// The admin document of model `model` on the first upstream.
async fn model_status(admin: SocketAddr, model: &str) -> Value {
    let reply = get(admin, "/admin/upstreams").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let doc = reply.json();
    doc["upstreams"][0]["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == model)
        .unwrap_or_else(|| panic!("no model {model} in {doc}"))
        .clone()
}

/// Polls the admin API until `check` holds for the model's document.
async fn wait_for_model(
    admin: SocketAddr,
    model: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + PATIENT;
    loop {
        let doc = model_status(admin, model).await;
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
async fn parallel_auto_takes_the_slot_count_from_the_engines_props() {
    let fake = fake(3, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        auto_upstream("gpu", &fake.url(), "qwen", 8)
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let key = authority(fake.addr());

    // Read before the first request: the gateway starts with it.
    let doc = model_status(admin, "qwen").await;
    assert_eq!(doc["parallel"], "auto", "{doc}");
    assert_eq!(doc["slots"], 3, "{doc}");
    assert_eq!(doc["discovery"]["slots"], 3, "{doc}");
    assert_eq!(doc["discovery"]["last_error"], Value::Null, "{doc}");
    assert!(doc["discovery"]["last_check"].is_string(), "{doc}");
    assert_eq!(gw.limiter().limits(&key, "qwen").unwrap().parallel, 3);
    assert_eq!(
        admin_sample(
            admin,
            "slotgate_slots_capacity{upstream=\"gpu\",model=\"qwen\"}"
        )
        .await,
        Some(3.0)
    );

    // And it holds the line at 3: 8 at once, 3 run, 5 wait, all served.
    let addr = gw.api_addr();
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            tokio::spawn(
                async move { chat(addr, "qwen", false, &[("x-fake-hold-ms", "300")]).await },
            )
        })
        .collect();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(fake.observer().peak_in_flight(), 3);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_slot_count_the_model_is_unavailable_says_why_and_is_retried() {
    let fake = fake(2, "qwen").await;
    fake.refuse_connections().await.unwrap();
    let gw = gateway(&format!(
        "{}{}",
        server("health_check_interval = \"100ms\"\nrestore_after_successes = 1"),
        auto_upstream("gpu", &fake.url(), "qwen", 2)
    ))
    .await;
    let admin = gw.admin_addr().unwrap();

    // Never a default: no count, no requests, and the 503 says why.
    let doc = model_status(admin, "qwen").await;
    assert_eq!(doc["slots"], Value::Null, "{doc}");
    assert_eq!(doc["discovery"]["slots"], Value::Null, "{doc}");
    let error = doc["discovery"]["last_error"].as_str().unwrap_or_default();
    assert!(error.contains("/props"), "{doc}");
    let reply = chat(gw.api_addr(), "qwen", false, &[]).await;
    let problem = reply.assert_problem(503, "upstream-unavailable");
    reply.retry_after();
    let detail = problem["detail"].as_str().unwrap();
    assert!(
        detail.contains("parallel = \"auto\"") && detail.contains("slot count is not known"),
        "{problem}"
    );
    assert_eq!(fake.observer().snapshot().received, 0);
    assert_eq!(
        admin_sample(
            admin,
            "slotgate_slots_capacity{upstream=\"gpu\",model=\"qwen\"}"
        )
        .await,
        None,
        "no capacity is reported while it is unknown"
    );

    // The engine comes up: the count is read on a later health round, and requests flow.
    fake.accept_connections().await.unwrap();
    let doc = wait_for_model(admin, "qwen", "the slot count", |doc| doc["slots"] == 2).await;
    assert_eq!(doc["discovery"]["last_error"], Value::Null, "{doc}");
    let deadline = Instant::now() + SOON;
    loop {
        // Health may be restored a round after the count was read.
        let reply = chat(gw.api_addr(), "qwen", false, &[]).await;
        if reply.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "still refused: {}", reply.text());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_engine_with_other_slots_is_read_again() {
    let fake = fake(2, "qwen").await;
    let port = fake.addr().port();
    let gw = gateway(&format!(
        "{}{}",
        server(
            "health_check_interval = \"100ms\"\neject_after_failures = 1\nrestore_after_successes = 1"
        ),
        auto_upstream("gpu", &fake.url(), "qwen", 2)
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    assert_eq!(model_status(admin, "qwen").await["slots"], 2);

    // Restarted with --parallel 5: ejected while down, read again once back.
    fake.shutdown().await;
    let deadline = Instant::now() + PATIENT;
    while get(admin, "/admin/upstreams").await.json()["upstreams"][0]["health"]["status"]
        != "unhealthy"
    {
        assert!(Instant::now() < deadline, "never ejected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let fake = FakeUpstream::start(FakeConfig::llama_server(5).model("qwen").port(port))
        .await
        .unwrap();
    wait_for_model(admin, "qwen", "the new count", |doc| doc["slots"] == 5).await;
    assert_eq!(
        gw.limiter()
            .limits(&authority(fake.addr()), "qwen")
            .unwrap()
            .parallel,
        5
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reads_the_slot_count_again_and_can_switch_to_and_from_auto() {
    let fake = fake(2, "qwen").await;
    let port = fake.addr().port();
    // No health rounds during the test: only the start and the reload read the count.
    let auto = format!(
        "{}{}",
        server("health_check_interval = \"1h\""),
        auto_upstream("gpu", &fake.url(), "qwen", 2)
    );
    let path = std::env::temp_dir().join(format!(
        "slotgate-discovery-{}-reload.toml",
        std::process::id()
    ));
    std::fs::write(&path, &auto).unwrap();
    let config = slotgate_config::Config::load(&path).unwrap();
    let gw = slotgate_gateway::Gateway::bind_file(&config, &path)
        .await
        .unwrap();
    let admin = gw.admin_addr().unwrap();
    let key = authority(fake.addr());
    assert_eq!(model_status(admin, "qwen").await["slots"], 2);

    // The engine restarts with 4 slots between two health rounds; a reload reads it.
    fake.shutdown().await;
    let fake = FakeUpstream::start(FakeConfig::llama_server(4).model("qwen").port(port))
        .await
        .unwrap();
    gw.reload().await.expect("reload applies");
    assert_eq!(model_status(admin, "qwen").await["slots"], 4);
    assert_eq!(gw.limiter().limits(&key, "qwen").unwrap().parallel, 4);

    // A stated count replaces it, and "auto" comes back.
    std::fs::write(&path, auto.replace("parallel = \"auto\"", "parallel = 1")).unwrap();
    gw.reload().await.expect("reload applies");
    let doc = model_status(admin, "qwen").await;
    assert_eq!(
        (doc["parallel"].clone(), doc["slots"].clone()),
        (1.into(), 1.into()),
        "{doc}"
    );
    assert!(doc.get("discovery").is_none(), "{doc}");
    assert_eq!(gw.limiter().limits(&key, "qwen").unwrap().parallel, 1);
    std::fs::write(&path, &auto).unwrap();
    gw.reload().await.expect("reload applies");
    assert_eq!(model_status(admin, "qwen").await["slots"], 4);
    assert_eq!(gw.limiter().limits(&key, "qwen").unwrap().parallel, 4);
    assert_eq!(chat(gw.api_addr(), "qwen", false, &[]).await.status, 200);

    gw.shutdown().await;
    fake.shutdown().await;
    let _ = std::fs::remove_file(&path);
}

// === reconciliation ===

/// Polls until the model's `engine` document satisfies `check`.
async fn wait_for_engine(
    admin: SocketAddr,
    model: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) -> Value {
    wait_for_model(admin, model, what, |doc| check(&doc["engine"])).await["engine"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn llama_server_traffic_that_bypasses_the_gateway_is_seen_and_warned_about() {
    let logs = capture_logs();
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server("health_check_interval = \"100ms\""),
        upstream("bypassed", &fake.url(), "qwen", 2, 4, "30s")
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();

    // Through the gateway: the engine and the gateway agree.
    let through: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(
                async move { chat(addr, "qwen", false, &[("x-fake-hold-ms", "6000")]).await },
            )
        })
        .collect();
    let engine = wait_for_engine(admin, "qwen", "both counted", |e| {
        e["busy"] == 2 && e["gateway_in_flight"] == 2
    })
    .await;
    assert_eq!(engine["unaccounted"], 0, "{engine}");
    assert_eq!(engine["warning"], false, "{engine}");
    assert_eq!(engine["whole_engine"], true, "{engine}");
    assert_eq!(
        admin_sample(
            admin,
            "slotgate_engine_busy{upstream=\"bypassed\",model=\"qwen\"}"
        )
        .await,
        Some(2.0)
    );
    assert_eq!(
        admin_sample(
            admin,
            "slotgate_engine_waiting{upstream=\"bypassed\",model=\"qwen\"}"
        )
        .await,
        Some(0.0)
    );

    // One more straight to the engine: 3 busy, 2 accounted for; warned once it lasts.
    let engine_addr = fake.addr();
    let direct = tokio::spawn(async move {
        chat(engine_addr, "qwen", false, &[("x-fake-hold-ms", "8000")]).await
    });
    let engine = wait_for_engine(admin, "qwen", "the warning", |e| e["warning"] == true).await;
    assert_eq!(engine["busy"], 3, "{engine}");
    assert_eq!(engine["unaccounted"], 1, "{engine}");
    let warned = logs.lines_with(&["busier than slotgate accounts for", "bypassed"]);
    assert_eq!(warned.len(), 1, "warned once: {warned:#?}");
    assert!(warned[0].contains("WARN"), "{warned:?}");
    assert!(
        warned[0].contains("engine_busy=3") && warned[0].contains("gateway_in_flight=2"),
        "{warned:?}"
    );

    for task in through {
        assert_eq!(task.await.unwrap().status, 200);
    }
    assert_eq!(direct.await.unwrap().status, 200);
    // Everything over: the episode ends.
    wait_for_engine(admin, "qwen", "the end of the excess", |e| {
        e["busy"] == 0 && e["warning"] == false
    })
    .await;
    assert_eq!(
        logs.lines_with(&["no busier than slotgate accounts for again", "bypassed"])
            .len(),
        1
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vllm_running_and_waiting_requests_are_read_from_its_metrics() {
    let logs = capture_logs();
    let fake = FakeUpstream::start(FakeConfig::vllm(2).model("qwen"))
        .await
        .unwrap();
    let gw = gateway(&format!(
        "{}[upstreams.vllm-bypassed]\nurl = \"{}\"\nkind = \"vllm\"\n\n\
         [upstreams.vllm-bypassed.models.qwen]\nparallel = 2\nqueue = 2\nqueue_timeout = \"30s\"\n",
        server("health_check_interval = \"100ms\""),
        fake.url()
    ))
    .await;
    let admin = gw.admin_addr().unwrap();

    // Three straight to the engine, which runs two and queues one itself.
    let engine_addr = fake.addr();
    let direct: Vec<_> = (0..3)
        .map(|_| {
            tokio::spawn(async move {
                chat(engine_addr, "qwen", false, &[("x-fake-hold-ms", "5000")]).await
            })
        })
        .collect();
    let engine = wait_for_engine(admin, "qwen", "the warning", |e| e["warning"] == true).await;
    assert_eq!(
        (engine["busy"].clone(), engine["waiting"].clone()),
        (2.into(), 1.into()),
        "{engine}"
    );
    assert_eq!(engine["gateway_in_flight"], 0, "{engine}");
    assert_eq!(engine["unaccounted"], 3, "{engine}");
    assert_eq!(
        admin_sample(
            admin,
            "slotgate_engine_waiting{upstream=\"vllm-bypassed\",model=\"qwen\"}"
        )
        .await,
        Some(1.0)
    );
    assert_eq!(
        logs.lines_with(&["busier than slotgate accounts for", "vllm-bypassed"])
            .len(),
        1
    );
    for task in direct {
        assert_eq!(task.await.unwrap().status, 200);
    }
    gw.shutdown().await;
    fake.shutdown().await;
}
