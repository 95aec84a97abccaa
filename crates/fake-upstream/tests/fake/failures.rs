//! Injected failures, per request and per server.

use std::time::Duration;

use fake_upstream::{Failure, FakeConfig, FakeUpstream, Outcome};
use http::Method;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::time::Instant;

use crate::support::{SOON, chat, post, request, send, spawn_post, stream, within};

#[tokio::test]
async fn status_answers_in_the_kinds_envelope() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let (status, _, body) = post(
        fake.addr(),
        "/v1/chat/completions",
        &chat("m", true),
        &[("x-fake-fail", "status-500"), ("x-request-id", "e")],
    )
    .await;
    assert_eq!(status, 500);
    assert_eq!(body["error"]["code"], 500);
    assert_eq!(body["error"]["type"], "server_error");
    let record = fake.observer().request("e").unwrap();
    assert_eq!(
        record.outcome,
        Some(Outcome::Injected(Failure::Status(500)))
    );
    assert!(record.started_at.is_some(), "it held a slot");
    assert_eq!(record.failures, [Failure::Status(500)]);
}

#[tokio::test]
async fn hang_holds_the_slot_until_the_client_leaves() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let client = spawn_post(
        addr,
        "/v1/chat/completions",
        chat("fake-model", false),
        &[("x-fake-fail", "hang"), ("x-request-id", "h")],
    );
    within("hanging", observer.wait_for_in_flight(1, SOON))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!client.is_finished(), "a hang never answers");
    client.abort();
    let record = within("client gone", observer.wait_for_outcome("h", SOON))
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ClientGoneMidResponse));
    assert_eq!(observer.in_flight(), 0);
}

#[tokio::test]
async fn die_after_chunks_aborts_without_the_end() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(10))
        .await
        .unwrap();
    let addr = fake.addr();
    let streamed = stream(
        addr,
        "/v1/chat/completions",
        &chat("m", true),
        &[("x-fake-fail", "die-after-chunks=3"), ("x-request-id", "d")],
    )
    .await;
    assert!(streamed.aborted, "the body ended with an error");
    assert_eq!(streamed.events.len(), 3);
    assert!(!streamed.ends_with_done());
    let record = within("ended", fake.observer().wait_for_outcome("d", SOON))
        .await
        .unwrap();
    assert_eq!(
        record.outcome,
        Some(Outcome::Injected(Failure::DieAfterChunks(3)))
    );
    assert_eq!(record.events_sent, 3);

    // A non-streaming answer is cut half-way.
    let response = send(
        addr,
        request(
            Method::POST,
            "/v1/chat/completions",
            Some(&chat("m", false)),
            &[("x-fake-fail", "die-after-chunks=0")],
        ),
    )
    .await;
    assert_eq!(response.status(), 200);
    assert!(
        response.into_body().collect().await.is_err(),
        "truncated body"
    );
}

#[tokio::test]
async fn slow_first_byte_delays_the_headers() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let started = Instant::now();
    let response = send(
        fake.addr(),
        request(
            Method::POST,
            "/v1/chat/completions",
            Some(&chat("m", true)),
            &[("x-fake-fail", "slow-first-byte-ms=300")],
        ),
    )
    .await;
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(response.status(), 200);
}

#[tokio::test]
async fn server_failures_apply_unless_a_request_says_none() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1).fail(Failure::Status(503)))
        .await
        .unwrap();
    let addr = fake.addr();
    let (status, _, body) = post(addr, "/v1/completions", &json!({"prompt": "x"}), &[]).await;
    assert_eq!(status, 503);
    assert_eq!(body["error"]["code"], 503);
    let (status, _, _) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x"}),
        &[("x-fake-fail", "none")],
    )
    .await;
    assert_eq!(status, 200);
    fake.set_failures(vec![]);
    let (status, _, _) = post(addr, "/v1/completions", &json!({"prompt": "x"}), &[]).await;
    assert_eq!(status, 200);
    let (status, _, body) = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "x"}),
        &[("x-fake-fail", "explode")],
    )
    .await;
    assert_eq!(status, 400, "a malformed control header is an error");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("x-fake-fail")
    );
}
