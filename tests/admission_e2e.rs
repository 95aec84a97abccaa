//! End-to-end tests of admission control: the real gateway in-process, real loopback sockets,
//! and `fake-upstream` behind it counting the *sequences* it runs (engine slots: `n` per
//! request) and their peak.
//!
//! No assertion depends on tight timing: the tests assert counts and peaks, and bounds are
//! generous for a loaded 2-core machine.

mod support;

use support::{SOON, authority, chat, fake, gateway, post, send, server, upstream};

/// A chat completion body asking for `n` choices.
fn chat_n(model: &str, n: u64) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "n": n,
    })
    .to_string()
}

/// A legacy completion body asking for `n` choices out of `best_of` candidates.
fn completion_best_of(model: &str, n: u64, best_of: u64) -> String {
    serde_json::json!({
        "model": model,
        "prompt": "hello there",
        "n": n,
        "best_of": best_of,
    })
    .to_string()
}

// === weighing ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mix_of_n_1_2_3_never_puts_more_than_parallel_sequences_on_the_engine() {
    // The engine could run 16 sequences: the cap of 4 is the gateway's doing.
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 4, 32, "60s")
    ))
    .await;
    let addr = gw.api_addr();

    let tasks: Vec<_> = (0..18u64)
        .map(|i| {
            tokio::spawn(async move {
                let id = format!("mix-{i}");
                let headers = [("x-fake-hold-ms", "300"), ("x-request-id", id.as_str())];
                // Every third request is a legacy completion whose `best_of` sets its weight.
                let req = if i % 3 == 2 {
                    post(
                        addr,
                        "/v1/completions",
                        completion_best_of("qwen", 1, 3),
                        &headers,
                    )
                } else {
                    post(
                        addr,
                        "/v1/chat/completions",
                        chat_n("qwen", i % 3 + 1),
                        &headers,
                    )
                };
                send(req).await
            })
        })
        .collect();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    }
    let observer = fake.observer();
    assert_eq!(observer.snapshot().received, 18, "every request was served");
    let peak = observer.peak_sequences_in_flight();
    assert!(
        peak <= 4,
        "the engine ran {peak} sequences at once, above parallel = 4"
    );
    // Weights of 3 ran (the `best_of` and `n = 3` requests), so the cap was reached.
    assert!(peak >= 3, "peak {peak}");
    let key = authority(fake.addr());
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 0, "every slot back");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_for_more_sequences_than_parallel_is_a_400_that_says_why() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 4, 8, "30s")
    ))
    .await;
    let addr = gw.api_addr();

    let reply = send(post(
        addr,
        "/v1/chat/completions",
        chat_n("qwen", 5),
        &[("x-request-id", "too-many")],
    ))
    .await;
    let doc = reply.assert_problem(400, "bad-request");
    assert_eq!(doc["sequences"], 5, "{doc}");
    assert_eq!(doc["parallel"], 4, "{doc}");
    assert_eq!(doc["error"]["param"], "n", "{doc}");
    let detail = doc["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("only 4 slots"), "{detail}");

    // `best_of` above `parallel` is refused the same way, on the route where it counts.
    let reply = send(post(
        addr,
        "/v1/completions",
        completion_best_of("qwen", 1, 6),
        &[],
    ))
    .await;
    let doc = reply.assert_problem(400, "bad-request");
    assert_eq!(doc["sequences"], 6, "{doc}");

    // A count that is not a positive integer is refused before any queue.
    for bad in [r#""two""#, "0", "-1", "1.5"] {
        let body = format!(
            r#"{{"model":"qwen","messages":[{{"role":"user","content":"hi"}}],"n":{bad}}}"#
        );
        let reply = send(post(addr, "/v1/chat/completions", body, &[])).await;
        let doc = reply.assert_problem(400, "bad-request");
        assert!(
            doc["detail"].as_str().unwrap_or_default().contains("`n`"),
            "n = {bad}: {doc}"
        );
    }

    // Exactly `parallel` fits.
    let reply = send(post(addr, "/v1/chat/completions", chat_n("qwen", 4), &[])).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert_eq!(reply.json()["choices"].as_array().map(Vec::len), Some(4));
    assert_eq!(
        fake.observer().snapshot().received,
        1,
        "no refused request reached the engine"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

// === the routing headers ===

/// The value of `name` in `headers` as text; panics when absent.
fn header<'h>(headers: &'h http::HeaderMap, name: &str) -> &'h str {
    headers
        .get(name)
        .unwrap_or_else(|| panic!("no {name} in {headers:?}"))
        .to_str()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_routed_answer_names_its_upstream_and_its_queue_wait() {
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 4, "30s")
    ))
    .await;
    let addr = gw.api_addr();

    // A free slot: no wait.
    let reply = chat(addr, "qwen", false, &[]).await;
    assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
    assert_eq!(header(&reply.headers, "x-slotgate-upstream"), "gpu");
    assert_eq!(header(&reply.headers, "x-slotgate-queue-wait-ms"), "0");

    // A request queued behind a 500 ms answer waited for it.
    let first = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "500")]));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let queued = chat(addr, "qwen", true, &[]).await;
    assert_eq!(queued.status.as_u16(), 200, "{}", queued.text());
    assert!(
        header(&queued.headers, "content-type").starts_with("text/event-stream"),
        "a stream"
    );
    assert_eq!(header(&queued.headers, "x-slotgate-upstream"), "gpu");
    let waited: u64 = header(&queued.headers, "x-slotgate-queue-wait-ms")
        .parse()
        .unwrap();
    assert!(waited > 0, "it queued behind the first request");
    let first = first.await.unwrap();
    assert_eq!(header(&first.headers, "x-slotgate-upstream"), "gpu");

    // The engine's own refusal is a routed answer too.
    let reply = chat(addr, "qwen", false, &[("x-fake-fail", "status-400")]).await;
    assert_eq!(reply.status.as_u16(), 400, "{}", reply.text());
    assert_eq!(header(&reply.headers, "x-slotgate-upstream"), "gpu");
    assert_eq!(header(&reply.headers, "x-slotgate-queue-wait-ms"), "0");

    // A refusal of the gateway's own is not.
    let reply = send(post(addr, "/v1/chat/completions", chat_n("qwen", 2), &[])).await;
    reply.assert_problem(400, "bad-request");
    assert!(!reply.headers.contains_key("x-slotgate-upstream"));
    gw.shutdown().await;
    fake.shutdown().await;
}
