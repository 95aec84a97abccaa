//! Weight in flight (issue #13): a request with `n` choices runs `n` sequences, each in its own
//! engine slot, and the observer counts sequences next to requests, per model and in total.

use fake_upstream::{FakeConfig, FakeUpstream};
use serde_json::{Value, json};

use crate::support::{SOON, get_json, post, spawn_post, within};

fn chat_n(model: &str, n: u32) -> Value {
    json!({"model": model, "n": n, "messages": [{"role": "user", "content": "hi"}]})
}

#[tokio::test]
async fn n_choices_take_n_slots() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(3).tokens(2))
        .await
        .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let held = spawn_post(
        addr,
        "/v1/chat/completions",
        chat_n("m", 2),
        &[("x-fake-fail", "hang"), ("x-request-id", "two")],
    );
    within(
        "two sequences",
        observer.wait_until("sequences_in_flight == 2", SOON, |s| {
            s.sequences_in_flight == 2
        }),
    )
    .await
    .unwrap();
    let snapshot = observer.snapshot();
    assert_eq!(
        (snapshot.in_flight, snapshot.peak_sequences_in_flight),
        (1, 2)
    );
    // A single-model llama-server serves its own model whatever the body names.
    assert_eq!(snapshot.model("fake-model").sequences_in_flight, 2);
    assert_eq!(observer.request("two").unwrap().weight, 2);
    let (_, slots) = get_json(addr, "/slots").await;
    let busy = slots
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["is_processing"] == true)
        .count();
    assert_eq!(busy, 2, "each choice is a task in its own slot");
    held.abort();
    within("released", observer.wait_for_in_flight(0, SOON))
        .await
        .unwrap();
    assert_eq!(observer.sequences_in_flight(), 0);

    // The answer has `n` choices, and usage counts all of them.
    let (status, _, body) = post(addr, "/v1/chat/completions", &chat_n("m", 3), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(body["choices"].as_array().unwrap().len(), 3);
    assert_eq!(body["choices"][2]["index"], 2);
    assert_eq!(body["usage"]["completion_tokens"], 6);
}

#[tokio::test]
async fn llama_server_refuses_more_choices_than_slots() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(2))
        .await
        .unwrap();
    let (status, _, body) = post(fake.addr(), "/v1/chat/completions", &chat_n("m", 3), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(
        body["error"]["message"],
        "Field 'n': Value must be between 1 <= value <= 2, but got 3"
    );
}

#[tokio::test]
async fn completions_count_best_of_and_ollama_ignores_n() {
    let vllm = FakeUpstream::start(FakeConfig::vllm(8)).await.unwrap();
    let held = spawn_post(
        vllm.addr(),
        "/v1/completions",
        json!({"prompt": "x", "n": 1, "best_of": 3}),
        &[("x-fake-fail", "hang")],
    );
    within(
        "three sequences",
        vllm.observer()
            .wait_until("sequences == 3", SOON, |s| s.sequences_in_flight == 3),
    )
    .await
    .unwrap();
    held.abort();

    let ollama = FakeUpstream::start(FakeConfig::ollama(4)).await.unwrap();
    let (status, _, body) = post(
        ollama.addr(),
        "/v1/chat/completions",
        &chat_n("fake-model", 3),
        &[("x-request-id", "o")],
    )
    .await;
    assert_eq!(status, 200);
    assert_eq!(body["choices"].as_array().unwrap().len(), 1);
    assert_eq!(ollama.observer().request("o").unwrap().weight, 1);
}

#[tokio::test]
async fn adapters_share_one_engine_and_the_total_shows_it() {
    // vLLM: the LoRA adapter `b` runs on the base model's engine, with its 4 sequences.
    let fake = FakeUpstream::start(FakeConfig::vllm(4).model("a").model("b"))
        .await
        .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let hang = [("x-fake-fail", "hang")];
    let a = spawn_post(addr, "/v1/chat/completions", chat_n("a", 2), &hang);
    let b = spawn_post(addr, "/v1/chat/completions", chat_n("b", 2), &hang);
    within(
        "four sequences",
        observer.wait_until("sequences == 4", SOON, |s| s.sequences_in_flight == 4),
    )
    .await
    .unwrap();
    let c = spawn_post(addr, "/v1/chat/completions", chat_n("a", 1), &hang);
    within("the fifth waits", observer.wait_for_queued(1, SOON))
        .await
        .unwrap();
    let snapshot = observer.snapshot();
    assert_eq!(snapshot.peak_sequences_in_flight, 4);
    assert_eq!(snapshot.model("a").peak_sequences_in_flight, 2);
    assert_eq!(snapshot.model("b").peak_sequences_in_flight, 2);
    for task in [a, b, c] {
        task.abort();
    }
    within(
        "all gone",
        observer.wait_until("idle", SOON, |s| {
            s.in_flight == 0 && s.queued == 0 && s.sequences_in_flight == 0
        }),
    )
    .await
    .unwrap();
    observer.reset_peak();
    assert_eq!(observer.peak_sequences_in_flight(), 0);
}
