//! llama-server: deferral past `--parallel`, collapse, probes, loading, router mode.

use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream, Outcome};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::support::{SOON, chat, get, get_json, post, raw_post, spawn_post, stream, within};

#[tokio::test]
async fn deferred_requests_run_fifo_and_deferred_streams_send_no_headers() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(4))
        .await
        .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();

    // The first request takes the only slot and keeps it until told to stop (it hangs).
    let first = spawn_post(
        addr,
        "/v1/chat/completions",
        chat("m", false),
        &[("x-request-id", "hog"), ("x-fake-fail", "hang")],
    );
    within("the hog runs", observer.wait_for_in_flight(1, SOON))
        .await
        .unwrap();

    // Deferred: a stream whose headers must not come while it waits, and two more behind it.
    let mut deferred_stream = raw_post(
        addr,
        "/v1/chat/completions",
        &chat("m", true),
        &[("x-request-id", "d0")],
    )
    .await;
    within("d0 deferred", observer.wait_for_queued(1, SOON))
        .await
        .unwrap();
    let mut later = Vec::new();
    for id in ["d1", "d2"] {
        later.push(tokio::spawn(async move {
            post(
                addr,
                "/v1/chat/completions",
                &chat("m", false),
                &[("x-request-id", id)],
            )
            .await
        }));
        let n = later.len() + 1;
        within("queued", observer.wait_for_queued(n, SOON))
            .await
            .unwrap();
    }
    let mut byte = [0_u8; 1];
    let silent =
        tokio::time::timeout(Duration::from_millis(200), deferred_stream.read(&mut byte)).await;
    assert!(
        silent.is_err(),
        "a deferred stream sent bytes before it had a slot"
    );
    assert_eq!(observer.in_flight(), 1);

    // Free the slot: the deferred requests run one at a time, in arrival order.
    first.abort();
    let mut head = Vec::new();
    within("d0 answers", async {
        while !String::from_utf8_lossy(&head).contains("[DONE]") {
            let mut buf = [0_u8; 1024];
            let n = deferred_stream.read(&mut buf).await.unwrap();
            assert!(n > 0, "closed early");
            head.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(String::from_utf8_lossy(&head).starts_with("HTTP/1.1 200"));
    for task in later {
        let (status, _, body) = within("deferred answer", task).await.unwrap();
        assert_eq!(status, 200);
        assert_eq!(
            body["choices"][0]["message"]["content"],
            "tok0 tok1 tok2 tok3"
        );
    }
    let records = observer.inference_requests();
    let started = |id: &str| {
        records
            .iter()
            .find(|r| r.id == id)
            .unwrap()
            .started_at
            .unwrap()
    };
    assert!(
        started("d0") <= started("d1") && started("d1") <= started("d2"),
        "FIFO"
    );
    assert_eq!(
        observer.peak_in_flight(),
        1,
        "never more than --parallel at once"
    );
    let hog = within("hog ends", observer.wait_for_outcome("hog", SOON))
        .await
        .unwrap();
    assert_eq!(hog.outcome, Some(Outcome::ClientGoneMidResponse));
}

#[tokio::test]
async fn probes_report_slots_deferral_and_props() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).model("qwen").n_ctx(2048))
        .await
        .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let (status, health) = get_json(addr, "/health").await;
    assert_eq!((status, health), (200, json!({"status": "ok"})));

    let (_, slots) = get_json(addr, "/slots").await;
    assert_eq!(slots[0]["is_processing"], false);
    assert!(slots[0].get("id_task").is_none(), "no task yet");

    let hang = [("x-fake-fail", "hang")];
    let running = spawn_post(addr, "/v1/completions", json!({"prompt": "hi"}), &hang);
    within("running", observer.wait_for_in_flight(1, SOON))
        .await
        .unwrap();
    let waiting = spawn_post(addr, "/v1/completions", json!({"prompt": "hi"}), &[]);
    within("deferred", observer.wait_for_queued(1, SOON))
        .await
        .unwrap();

    let (_, slots) = get_json(addr, "/slots").await;
    assert_eq!(slots.as_array().unwrap().len(), 1);
    assert_eq!(slots[0]["is_processing"], true);
    assert_eq!(slots[0]["n_ctx"], 2048);
    assert!(slots[0]["next_token"].is_array());
    let (status, busy) = get_json(addr, "/slots?fail_on_no_slot=1").await;
    assert_eq!(status, 503);
    assert_eq!(
        busy,
        json!({"error": {"code": 503, "message": "no slot available", "type": "unavailable_error"}})
    );

    let (status, headers, metrics) = get(addr, "/metrics").await;
    assert_eq!(status, 200);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    assert!(headers.contains_key("process-start-time-unix"));
    assert!(
        metrics.contains("\nllamacpp:requests_processing 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nllamacpp:requests_deferred 1\n"),
        "{metrics}"
    );

    let (_, props) = get_json(addr, "/props").await;
    assert_eq!(props["total_slots"], 1);
    assert_eq!(props["default_generation_settings"]["n_ctx"], 2048);
    assert_eq!(props["model_alias"], "qwen");

    let (_, models) = get_json(addr, "/v1/models").await;
    assert_eq!(models["data"].as_array().unwrap().len(), 1);
    assert_eq!(models["data"][0]["id"], "qwen");
    assert_eq!(models["data"][0]["owned_by"], "llamacpp");
    assert_eq!(models["models"][0]["name"], "qwen");

    running.abort();
    let (status, _, _) = within("deferred runs", waiting).await.unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn errors_use_llama_envelope() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).n_ctx(16).metrics(false))
        .await
        .unwrap();
    let addr = fake.addr();
    let (status, missing) = get_json(addr, "/nope").await;
    assert_eq!(status, 404);
    assert_eq!(
        missing,
        json!({"error": {"code": 404, "message": "File Not Found", "type": "not_found_error"}})
    );
    let (status, metrics) = get_json(addr, "/metrics").await;
    assert_eq!(status, 501);
    assert_eq!(metrics["error"]["type"], "not_supported_error");

    let (status, _, too_long) = post(
        addr,
        "/v1/chat/completions",
        &chat("m", false),
        &[("x-fake-prompt-tokens", "100")],
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(too_long["error"]["type"], "exceed_context_size_error");
    assert_eq!(too_long["error"]["n_prompt_tokens"], 100);
    assert_eq!(too_long["error"]["n_ctx"], 16);
    assert!(
        too_long["error"].get("param").is_none(),
        "llama-server has no param"
    );
}

#[tokio::test]
async fn loading_answers_503_on_every_path_then_ok() {
    let fake =
        FakeUpstream::start(FakeConfig::llama_server(1).startup_delay(Duration::from_millis(500)))
            .await
            .unwrap();
    let addr = fake.addr();
    let loading =
        json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}});
    for path in ["/health", "/v1/models", "/slots"] {
        let (status, body) = get_json(addr, path).await;
        assert_eq!((status, body), (503, loading.clone()), "{path}");
    }
    let (status, _, body) = post(addr, "/v1/chat/completions", &chat("m", false), &[]).await;
    assert_eq!((status, body), (503, loading));
    within("ready", async {
        loop {
            if get_json(addr, "/health").await == (200, json!({"status": "ok"})) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let (status, _, _) = post(addr, "/v1/chat/completions", &chat("m", false), &[]).await;
    assert_eq!(status, 200);
    let rejected = fake.observer().inference_requests()[0].outcome;
    assert_eq!(rejected, Some(Outcome::Rejected(503)));
}

#[tokio::test]
async fn collapse_fails_every_running_request() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(2)
            .collapse(true)
            .tokens(400)
            .chunk_interval(Duration::from_millis(25)),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let streams: Vec<_> = ["s0", "s1"]
        .into_iter()
        .map(|id| {
            tokio::spawn(async move {
                stream(
                    addr,
                    "/v1/chat/completions",
                    &chat("m", true),
                    &[("x-request-id", id)],
                )
                .await
            })
        })
        .collect();
    within("two running", observer.wait_for_in_flight(2, SOON))
        .await
        .unwrap();

    // The third concurrent request overflows the KV cache: everyone fails.
    let (status, _, body) = post(
        addr,
        "/v1/chat/completions",
        &chat("m", false),
        &[("x-request-id", "third")],
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(
        body,
        json!({"error": {"code": 500, "message": "Context size has been exceeded.", "type": "server_error"}})
    );
    for task in streams {
        let streamed = within("stream fails", task).await.unwrap();
        assert_eq!(streamed.status, 200);
        let last = streamed.events.last().unwrap();
        assert!(last.is_error(), "ends with the error event: {last:?}");
        assert_eq!(
            last.json().unwrap()["error"]["message"],
            "Context size has been exceeded."
        );
        assert!(
            !streamed.ends_with_done(),
            "llama-server sends no [DONE] after an error"
        );
    }
    for id in ["s0", "s1", "third"] {
        let record = within("ended", observer.wait_for_outcome(id, SOON))
            .await
            .unwrap();
        assert_eq!(record.outcome, Some(Outcome::Failed(500)), "{id}");
    }
    // Back under the limit, requests run again.
    let (status, _, _) = post(
        addr,
        "/v1/chat/completions",
        &chat("m", false),
        &[("x-fake-tokens", "1")],
    )
    .await;
    assert_eq!(status, 200);
}

fn status_of(models: &Value, id: &str) -> String {
    models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("{id} listed"))["status"]["value"]
        .as_str()
        .unwrap()
        .to_owned()
}

#[tokio::test]
async fn router_lists_loads_and_unloads_models() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(2)
            .router(true)
            .model("a")
            .unloaded_model("b")
            .model_load_delay(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let (_, models) = get_json(addr, "/models").await;
    assert_eq!(status_of(&models, "a"), "loaded");
    assert_eq!(status_of(&models, "b"), "unloaded");

    // Autoload: a request for b waits for the load, then runs.
    let (status, _, body) = post(
        addr,
        "/v1/chat/completions",
        &chat("b", false),
        &[("x-request-id", "auto")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["model"], "b");
    let record = fake.observer().request("auto").unwrap();
    assert!(
        record.queue_wait().unwrap() >= Duration::from_millis(300),
        "waited for the load"
    );
    let (_, models) = get_json(addr, "/v1/models").await;
    assert_eq!(status_of(&models, "b"), "loaded");

    let (status, _, unknown) = post(addr, "/v1/chat/completions", &chat("zzz", false), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(unknown["error"]["message"], "model 'zzz' not found");
    let (status, _, missing) =
        post(addr, "/v1/chat/completions", &json!({"messages": []}), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(
        missing["error"]["message"],
        "model name is missing from the request"
    );
    let (status, _) = get_json(addr, "/slots").await;
    assert_eq!(status, 400, "router probes need ?model=");
    let (status, slots) = get_json(addr, "/slots?model=a").await;
    assert_eq!(status, 200);
    assert_eq!(slots.as_array().unwrap().len(), 2);

    let (status, _, ok) = post(addr, "/models/unload", &json!({"model": "b"}), &[]).await;
    assert_eq!((status, ok), (200, json!({"success": true})));
    let (status, _, _) = post(addr, "/models/unload", &json!({"model": "b"}), &[]).await;
    assert_eq!(status, 400, "not running");
    let (status, _, _) = post(addr, "/models/load", &json!({"model": "zzz"}), &[]).await;
    assert_eq!(status, 404);
    let (status, _, _) = post(addr, "/models/load", &json!({"model": "b"}), &[]).await;
    assert_eq!(status, 200);
    let (_, models) = get_json(addr, "/models").await;
    let b = status_of(&models, "b");
    assert!(b == "loading" || b == "loaded", "{b}");
    assert!(within("load", fake.load_model("b")).await);
    assert_eq!(fake.is_loaded("b"), Some(true));
}

#[tokio::test]
async fn router_without_autoload_refuses_unloaded_models() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(1)
            .router(true)
            .model("a")
            .unloaded_model("b")
            .autoload(false),
    )
    .await
    .unwrap();
    let (status, _, body) = post(fake.addr(), "/v1/chat/completions", &chat("b", false), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["message"], "model is not loaded");
    let (status, _, _) = post(fake.addr(), "/v1/chat/completions", &chat("a", false), &[]).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn router_models_max_evicts_the_least_recently_used_idle_model() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(1)
            .router(true)
            .model("a")
            .model("b")
            .unloaded_model("c")
            .models_max(2),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let (status, props) = get_json(addr, "/props").await;
    assert_eq!(status, 200);
    assert_eq!(props["role"], "router");
    assert_eq!(props["max_instances"], 2);
    assert_eq!(props["models_autoload"], true);

    // a served last, so b is the least recently used.
    let (status, _, _) = post(addr, "/v1/chat/completions", &chat("a", false), &[]).await;
    assert_eq!(status, 200);
    let (status, _, _) = post(addr, "/v1/chat/completions", &chat("c", false), &[]).await;
    assert_eq!(status, 200);
    let (_, models) = get_json(addr, "/models").await;
    assert_eq!(status_of(&models, "a"), "loaded");
    assert_eq!(status_of(&models, "b"), "unloaded");
    assert_eq!(status_of(&models, "c"), "loaded");
    assert_eq!(fake.model_loads("c"), Some(1));
    assert_eq!(
        fake.model_loads("b"),
        Some(0),
        "loaded at start is not a load"
    );
}

#[tokio::test]
async fn router_models_max_never_evicts_a_busy_model_the_request_waits_inside() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(1)
            .router(true)
            .model("a")
            .unloaded_model("b")
            .models_max(1),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let busy = spawn_post(
        addr,
        "/v1/chat/completions",
        chat("a", false),
        &[("x-fake-fail", "hang")],
    );
    within("a runs", observer.wait_for_in_flight(1, SOON))
        .await
        .unwrap();
    let waiting = spawn_post(
        addr,
        "/v1/chat/completions",
        chat("b", false),
        &[("x-request-id", "b")],
    );
    within("b waits", observer.wait_for_queued(1, SOON))
        .await
        .unwrap();
    // A probe never loads: with autoload=false an unloaded model is refused.
    let (status, refused) = get_json(addr, "/props?model=b&autoload=false").await;
    assert_eq!(status, 400);
    assert_eq!(refused["error"]["message"], "model is not loaded");
    let (_, models) = get_json(addr, "/models").await;
    assert_eq!(status_of(&models, "a"), "loaded", "a is busy: not evicted");
    assert_eq!(status_of(&models, "b"), "unloaded");
    let (status, _, limit) = post(addr, "/models/load", &json!({"model": "b"}), &[]).await;
    assert_eq!(status, 500);
    assert_eq!(
        limit["error"]["message"],
        "model limit reached, try again later"
    );

    busy.abort();
    let (status, _, body) = within("b answers", waiting).await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(fake.is_loaded("a"), Some(false), "evicted once idle");
    assert_eq!(fake.model_loads("b"), Some(1));
}

#[tokio::test]
async fn router_reports_failed_loads_and_sleeping_models() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(1)
            .router(true)
            .model("a")
            .unloaded_model("b"),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    assert!(fake.fail_next_load("b"));
    let (status, _, body) = post(addr, "/v1/chat/completions", &chat("b", false), &[]).await;
    assert_eq!(status, 500);
    assert_eq!(body["error"]["message"], "model name=b failed to load");
    let (_, models) = get_json(addr, "/models").await;
    let b = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "b")
        .unwrap();
    assert_eq!(b["status"]["value"], "unloaded");
    assert_eq!(b["status"]["failed"], true);
    assert_eq!(b["status"]["exit_code"], 1);

    assert!(fake.sleep_model("a"));
    let (_, models) = get_json(addr, "/models").await;
    assert_eq!(status_of(&models, "a"), "sleeping");
    let (status, _) = get_json(addr, "/props?model=a&autoload=false").await;
    assert_eq!(status, 200, "a sleeping model is running: probes reach it");
    let (status, _, _) = post(addr, "/v1/chat/completions", &chat("a", false), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(fake.is_loaded("a"), Some(true), "woken without a load");
    assert_eq!(fake.model_loads("a"), Some(0));
}
