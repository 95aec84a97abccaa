//! Ollama: `num_parallel` per model, `max_queue`, the busy 503, residency listings.

use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream, Outcome};
use serde_json::json;

use crate::support::{SOON, chat, get, get_json, post, spawn_post, within};

#[tokio::test]
async fn past_max_queue_requests_get_503_busy() {
    let fake = FakeUpstream::start(FakeConfig::ollama(1).model("llama3").max_queue(1))
        .await
        .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let running = spawn_post(
        addr,
        "/v1/chat/completions",
        chat("llama3", false),
        &[("x-fake-fail", "hang")],
    );
    within("running", observer.wait_for_in_flight(1, SOON))
        .await
        .unwrap();
    let pending = tokio::spawn(async move {
        post(addr, "/v1/chat/completions", &chat("llama3", false), &[]).await
    });
    within("pending", observer.wait_for_queued(1, SOON))
        .await
        .unwrap();

    let (status, _, body) = post(
        addr,
        "/v1/chat/completions",
        &chat("llama3", false),
        &[("x-request-id", "busy")],
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(
        body,
        json!({"error": {
            "message": "server busy, please try again.  maximum pending requests exceeded",
            "type": "api_error", "param": null, "code": null,
        }})
    );
    assert_eq!(
        observer.request("busy").unwrap().outcome,
        Some(Outcome::Rejected(503))
    );

    running.abort();
    let (status, _, _) = within("pending runs", pending).await.unwrap();
    assert_eq!(status, 200);
}

#[tokio::test]
async fn residency_endpoints_and_missing_models() {
    let fake = FakeUpstream::start(
        FakeConfig::ollama(2)
            .model("llama3")
            .unloaded_model("qwen:7b")
            .model_load_delay(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let (status, _, text) = get(addr, "/").await;
    assert_eq!((status, text.as_str()), (200, "Ollama is running"));

    let names = |v: &serde_json::Value| -> Vec<String> {
        v["models"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (_, tags) = get_json(addr, "/api/tags").await;
    assert_eq!(names(&tags), ["llama3:latest", "qwen:7b"]);
    let (_, ps) = get_json(addr, "/api/ps").await;
    assert_eq!(names(&ps), ["llama3:latest"]);
    assert!(ps["models"][0]["expires_at"].is_string());
    assert!(ps["models"][0]["size_vram"].is_u64());
    let (_, openai) = get_json(addr, "/v1/models").await;
    assert_eq!(
        openai["data"].as_array().unwrap().len(),
        2,
        "built from tags, not residency"
    );
    assert_eq!(openai["data"][0]["owned_by"], "library");

    // A bare name means :latest; a request for a model on disk loads it.
    let (status, _, _) = post(addr, "/v1/chat/completions", &chat("llama3", false), &[]).await;
    assert_eq!(status, 200);
    let (status, _, _) = post(addr, "/v1/chat/completions", &chat("qwen:7b", false), &[]).await;
    assert_eq!(status, 200);
    let (_, ps) = get_json(addr, "/api/ps").await;
    assert_eq!(
        names(&ps),
        ["qwen:7b", "llama3:latest"],
        "most recently used first"
    );

    let (status, _, body) = post(addr, "/v1/chat/completions", &chat("mistral", false), &[]).await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"error": {
            "message": "model \"mistral\" not found, try pulling it first",
            "type": "not_found_error", "param": null, "code": null,
        }})
    );
    let (status, _, text) = get(addr, "/nope").await;
    assert_eq!((status, text.as_str()), (404, "404 page not found"));

    assert!(fake.unload_model("qwen:7b"));
    let (_, ps) = get_json(addr, "/api/ps").await;
    assert_eq!(names(&ps), ["llama3:latest"]);
}

#[tokio::test]
async fn parallel_is_per_model() {
    let fake = FakeUpstream::start(FakeConfig::ollama(1).model("a").model("b"))
        .await
        .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let hang = [("x-fake-fail", "hang")];
    let a = spawn_post(addr, "/v1/chat/completions", chat("a", false), &hang);
    let b = spawn_post(addr, "/v1/chat/completions", chat("b", false), &hang);
    within("one per model", observer.wait_for_in_flight(2, SOON))
        .await
        .unwrap();
    let snapshot = observer.snapshot();
    assert_eq!(snapshot.model("a:latest").in_flight, 1);
    assert_eq!(snapshot.model("b:latest").in_flight, 1);
    assert_eq!(snapshot.queued, 0);
    a.abort();
    b.abort();
    within("both gone", observer.wait_for_in_flight(0, SOON))
        .await
        .unwrap();
}
