//! vLLM: silent waiting past `max_num_seqs`, metrics, model cards, errors, refused while loading.

use std::io::ErrorKind;
use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream};
use serde_json::json;

use crate::support::{SOON, chat, get, get_json, post, spawn_post, stream, within};

#[tokio::test]
async fn waits_silently_past_max_num_seqs() {
    let fake = FakeUpstream::start(
        FakeConfig::vllm(2)
            .model("reasoning")
            .hold(Duration::from_millis(300)),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let hang = [("x-fake-fail", "hang")];
    let hogs: Vec<_> = (0..2)
        .map(|_| {
            spawn_post(
                addr,
                "/v1/chat/completions",
                chat("reasoning", false),
                &hang,
            )
        })
        .collect();
    within("two running", observer.wait_for_in_flight(2, SOON))
        .await
        .unwrap();
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            tokio::spawn(async move {
                post(addr, "/v1/chat/completions", &chat("reasoning", false), &[]).await
            })
        })
        .collect();
    within("two waiting", observer.wait_for_queued(2, SOON))
        .await
        .unwrap();

    let (_, _, metrics) = get(addr, "/metrics").await;
    let labels = r#"{model_name="reasoning",engine="0"}"#;
    assert!(
        metrics.contains(&format!("vllm:num_requests_running{labels} 2.0")),
        "{metrics}"
    );
    assert!(
        metrics.contains(&format!("vllm:num_requests_waiting{labels} 2.0")),
        "{metrics}"
    );

    for hog in hogs {
        hog.abort();
    }
    for task in waiting {
        let (status, _, body) = within("waiting requests run", task).await.unwrap();
        assert_eq!(status, 200, "no rejection, ever");
        assert_eq!(body["object"], "chat.completion");
    }
    assert_eq!(observer.peak_in_flight(), 2);
    assert_eq!(observer.snapshot().model("reasoning").peak_in_flight, 2);
}

#[tokio::test]
async fn health_models_and_errors() {
    let fake = FakeUpstream::start(
        FakeConfig::vllm(4)
            .model("base")
            .model("lora-a")
            .n_ctx(32768),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let (status, _, body) = get(addr, "/health").await;
    assert_eq!((status, body.as_str()), (200, ""));

    let (_, models) = get_json(addr, "/v1/models").await;
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "base");
    assert_eq!(models["data"][0]["max_model_len"], 32768);
    assert_eq!(models["data"][0]["owned_by"], "vllm");
    assert_eq!(
        models["data"][1]["parent"], "base",
        "adapters name their base"
    );

    let (status, _, body) = post(addr, "/v1/chat/completions", &chat("nope", false), &[]).await;
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"error": {"message": "The model `nope` does not exist.", "type": "NotFoundError", "param": "model", "code": 404}})
    );
    let (status, _, _) = post(addr, "/v1/chat/completions", &chat("lora-a", false), &[]).await;
    assert_eq!(status, 200);
    let (status, _, body) = post(
        addr,
        "/v1/chat/completions",
        &chat("base", false),
        &[("x-fake-prompt-tokens", "40000")],
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(body["error"]["type"], "BadRequestError");
    assert_eq!(body["error"]["param"], "input_tokens");
    let (status, body) = get_json(addr, "/nope").await;
    assert_eq!((status, body), (404, json!({"detail": "Not Found"})));
}

#[tokio::test]
async fn stream_errors_are_followed_by_done() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    let streamed = stream(
        fake.addr(),
        "/v1/chat/completions",
        &chat("fake-model", true),
        &[("x-fake-fail", "error-after-chunks=2")],
    )
    .await;
    assert_eq!(streamed.events.len(), 4, "{:?}", streamed.events);
    assert!(streamed.events[2].is_error());
    assert_eq!(
        streamed.events[2].json().unwrap()["error"]["type"],
        "InternalServerError"
    );
    assert!(
        streamed.ends_with_done(),
        "vLLM sends [DONE] after the error"
    );
    assert!(!streamed.aborted);
}

#[tokio::test]
async fn connections_are_refused_while_loading() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1).startup_delay(Duration::from_millis(400)))
        .await
        .unwrap();
    let early = tokio::net::TcpStream::connect(fake.addr()).await;
    assert_eq!(early.unwrap_err().kind(), ErrorKind::ConnectionRefused);
    within("listening", async {
        while tokio::net::TcpStream::connect(fake.addr()).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let (status, _, _) = get(fake.addr(), "/health").await;
    assert_eq!(status, 200);
}
