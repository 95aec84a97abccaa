//! The observer: client disconnects mid-stream and while deferred, counters, ids.

use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream, Outcome};
use http::Method;
use http_body_util::BodyExt;
use serde_json::json;

use crate::support::{SOON, chat, post, raw_post, request, send, spawn_post, within};

#[tokio::test]
async fn client_leaving_mid_stream_is_recorded_and_frees_the_slot() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(1)
            .tokens(1000)
            .chunk_interval(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let response = send(
        addr,
        request(
            Method::POST,
            "/v1/chat/completions",
            Some(&chat("m", true)),
            &[("x-request-id", "leaver")],
        ),
    )
    .await;
    let mut body = response.into_body();
    // Read a couple of chunks, then hang up.
    for _ in 0..2 {
        within("a chunk", body.frame()).await.unwrap().unwrap();
    }
    drop(body);
    let record = within("recorded", observer.wait_for_outcome("leaver", SOON))
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ClientGoneMidResponse));
    assert!(record.events_sent >= 2);
    assert!(record.stream);
    assert_eq!(observer.in_flight(), 0);
    let (status, _, _) = post(
        addr,
        "/v1/chat/completions",
        &chat("m", false),
        &[("x-fake-tokens", "1"), ("x-fake-chunk-interval-ms", "0")],
    )
    .await;
    assert_eq!(status, 200, "the slot is free again");
}

#[tokio::test]
async fn client_leaving_while_deferred_never_runs() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let hog = spawn_post(
        addr,
        "/v1/chat/completions",
        chat("m", false),
        &[("x-fake-fail", "hang")],
    );
    within("hog", observer.wait_for_in_flight(1, SOON))
        .await
        .unwrap();
    let deferred = raw_post(
        addr,
        "/v1/chat/completions",
        &chat("m", true),
        &[("x-request-id", "quitter")],
    )
    .await;
    within("deferred", observer.wait_for_queued(1, SOON))
        .await
        .unwrap();
    drop(deferred);
    let record = within("recorded", observer.wait_for_outcome("quitter", SOON))
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ClientGoneWhileQueued));
    assert_eq!(record.started_at, None, "it never got a slot");
    let snapshot = observer.snapshot();
    assert_eq!((snapshot.in_flight, snapshot.queued), (1, 0));
    hog.abort();
    within("idle", observer.wait_for_in_flight(0, SOON))
        .await
        .unwrap();
    assert_eq!(
        observer.peak_in_flight(),
        1,
        "the deferred request never counted"
    );
}

#[tokio::test]
async fn records_ids_paths_and_counts() {
    let fake = FakeUpstream::start(FakeConfig::vllm(2)).await.unwrap();
    let addr = fake.addr();
    let observer = fake.observer();
    let (_, headers, _) = post(
        addr,
        "/v1/embeddings",
        &json!({"model": "fake-model", "input": "x"}),
        &[("x-request-id", "mine")],
    )
    .await;
    assert_eq!(headers["x-request-id"], "mine", "echoed");
    let (_, headers, _) = post(addr, "/v1/completions", &json!({"prompt": "x"}), &[]).await;
    let generated = headers["x-request-id"].to_str().unwrap().to_owned();
    let _ = crate::support::get(addr, "/health").await;

    let all = observer.requests();
    assert_eq!(all.len(), 3);
    assert_eq!(all[2].path, "/health");
    let inference = observer.inference_requests();
    assert_eq!(inference.len(), 2);
    assert_eq!(inference[0].id, "mine");
    assert_eq!(inference[0].model.as_deref(), Some("fake-model"));
    assert_eq!(inference[1].id, generated);
    assert_eq!(inference[1].model, None);
    assert!(
        inference
            .iter()
            .all(|r| r.outcome == Some(Outcome::Completed) && r.status == Some(200))
    );
    let snapshot = observer.snapshot();
    assert_eq!(
        (snapshot.received, snapshot.ended, snapshot.in_flight),
        (2, 2, 0)
    );
    assert_eq!(snapshot.peak_in_flight, 1);
    observer.reset_peak();
    assert_eq!(observer.peak_in_flight(), 0);
    observer.clear_requests();
    assert!(observer.requests().is_empty());
}
