//! Response shapes and streaming cadence.

use std::time::Duration;

use fake_upstream::sse::SseEvent;
use fake_upstream::{FakeConfig, FakeUpstream};
use http::Method;
use serde_json::json;

use crate::support::{chat, post, read_stream, request, send_h2, stream};

#[tokio::test]
async fn chunks_arrive_spread_over_time() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(6))
        .await
        .unwrap();
    let streamed = stream(
        fake.addr(),
        "/v1/chat/completions",
        &chat("m", true),
        &[("x-fake-chunk-interval-ms", "40")],
    )
    .await;
    assert_eq!(streamed.status, 200);
    // role chunk, 6 tokens, closing chunk, [DONE]
    assert_eq!(streamed.events.len(), 9, "{:?}", streamed.events);
    assert_eq!(streamed.text(), "tok0 tok1 tok2 tok3 tok4 tok5");
    assert!(streamed.ends_with_done());
    // Sleeps never end early: the six tokens cannot arrive in less than 6 x 40 ms.
    let spread = streamed.arrivals[7] - streamed.arrivals[0];
    assert!(spread >= Duration::from_millis(200), "{spread:?}");
    assert!(streamed.arrivals.windows(2).all(|w| w[0] <= w[1]));
    let distinct = streamed
        .arrivals
        .windows(2)
        .filter(|w| w[0] != w[1])
        .count();
    assert!(distinct >= 3, "chunks came in one burst");
    let first = streamed.events[0].json().unwrap();
    assert_eq!(first["object"], "chat.completion.chunk");
    assert_eq!(first["choices"][0]["delta"]["role"], "assistant");
    let last = streamed.events[7].json().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["choices"][0]["delta"], json!({}));
}

#[tokio::test]
async fn include_usage_adds_a_usage_chunk_before_done() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1).tokens(3))
        .await
        .unwrap();
    let mut body = chat("fake-model", true);
    body["stream_options"] = json!({"include_usage": true});
    let streamed = stream(fake.addr(), "/v1/chat/completions", &body, &[]).await;
    let n = streamed.events.len();
    let usage = streamed.events[n - 2].json().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    assert!(
        streamed.events[..n - 2]
            .iter()
            .all(|e| e.json().unwrap()["usage"].is_null())
    );
    assert_eq!(streamed.events[n - 1], SseEvent::Done);
}

#[tokio::test]
async fn completions_and_embeddings_have_their_shapes() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(5))
        .await
        .unwrap();
    let addr = fake.addr();
    let (status, _, body) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "a b c", "max_tokens": 2}),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["object"], "text_completion");
    assert_eq!(body["choices"][0]["text"], "tok0 tok1");
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    assert_eq!(body["usage"]["prompt_tokens"], 3);
    assert_eq!(body["usage"]["total_tokens"], 5);
    assert_eq!(body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

    let streamed = stream(
        addr,
        "/completions",
        &json!({"prompt": "x", "stream": true}),
        &[],
    )
    .await;
    assert_eq!(
        streamed.events[0].json().unwrap()["object"],
        "text_completion"
    );
    assert_eq!(streamed.text(), "tok0 tok1 tok2 tok3 tok4");

    let (status, _, body) = post(addr, "/v1/embeddings", &json!({"input": ["a", "b"]}), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(body["object"], "list");
    assert_eq!(body["data"].as_array().unwrap().len(), 2);
    assert_eq!(body["data"][1]["object"], "embedding");
    assert!(body["data"][0]["embedding"].as_array().unwrap().len() > 1);

    let (status, _, body) = post(addr, "/v1/chat/completions", &json!({"model": "m"}), &[]).await;
    assert_eq!(status, 400, "messages are required");
    assert_eq!(body["error"]["type"], "invalid_request_error");
}

#[tokio::test]
async fn serves_h2c() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1).tokens(2))
        .await
        .unwrap();
    let req = request(
        Method::POST,
        "/v1/chat/completions",
        Some(&chat("fake-model", true)),
        &[],
    );
    let streamed = read_stream(send_h2(fake.addr(), req).await).await;
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.text(), "tok0 tok1");
    assert!(streamed.ends_with_done());
}
