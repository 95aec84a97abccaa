//! End-to-end tests of the gateway: the real `slotgate-gateway` in-process, real loopback
//! sockets, and `fake-upstream` simulating llama-server behind it.
//!
//! No assertion depends on tight timing: bounds are generous (a loaded 2-core CI machine), and
//! the tests assert orderings and counts — who reached the upstream, in what order things ended
//! — rather than durations.

mod support;

use std::time::Duration;

use fake_upstream::{FakeUpstream, Outcome};
use support::{
    SOON, authority, chat, chat_body, eventually, fake, gateway, gateway_with, get, open_chat,
    post, replies, send, server, slots_free, spawn_burst, streaming_chat, upstream,
};

// === the issue's load scenario ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_concurrent_requests_get_only_200_or_503_and_the_upstream_sees_at_most_six() {
    // The engine itself could run 16: the cap of 6 is the gateway's doing.
    let fake = fake(16, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 6, 8, "30s")]).await;
    let addr = gw.api_addr();

    let tasks = spawn_burst(40, |i| async move {
        let id = format!("burst-{i}");
        chat(
            addr,
            "qwen",
            false,
            &[("x-fake-hold-ms", "2000"), ("x-request-id", &id)],
        )
        .await
    });
    let mut ok = 0;
    let mut refused = 0;
    for reply in replies(tasks).await {
        match reply.status.as_u16() {
            200 => {
                assert_eq!(reply.json()["object"], "chat.completion");
                ok += 1;
            }
            503 => {
                reply.assert_problem(503, "queue-full");
                reply.retry_after();
                refused += 1;
            }
            other => panic!("unexpected status {other}: {}", reply.text()),
        }
    }
    assert_eq!(ok + refused, 40);
    // 6 running + 8 queued at least; the rest arrived while all 14 places were taken.
    assert!(ok >= 14, "served {ok}");
    assert!(refused >= 1, "refused {refused}");
    assert_eq!(
        fake.observer().peak_in_flight(),
        6,
        "the upstream never saw more than 6"
    );
    assert_eq!(
        fake.observer().snapshot().received,
        ok,
        "refused requests never reached it"
    );
    let key = authority(fake.addr());
    assert_eq!(
        gw.limiter().in_flight(&key, "qwen"),
        0,
        "every slot given back"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

// === client disconnects ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_queued_never_reaches_the_upstream_and_frees_its_place() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 1, 1, "30s")]).await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    // A holds the only slot.
    let holder = tokio::spawn(async move {
        chat(
            addr,
            "qwen",
            false,
            &[("x-fake-hold-ms", "1500"), ("x-request-id", "holder")],
        )
        .await
    });
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();

    // B takes the only place in the queue, then goes away.
    let leaver = open_chat(addr, "qwen", false, &[("x-request-id", "leaver")]).await;
    eventually("B queued", SOON, || gw.limiter().queued(&key, "qwen") == 1).await;
    leaver.disconnect();
    eventually("B's place freed", SOON, || {
        gw.limiter().queued(&key, "qwen") == 0
    })
    .await;

    // C can queue in the freed place (with B still there it would get 503 queue-full).
    let late = chat(addr, "qwen", false, &[("x-request-id", "late")]).await;
    assert_eq!(late.status, 200, "{}", late.text());
    assert_eq!(holder.await.unwrap().status, 200);

    let seen: Vec<String> = fake
        .observer()
        .requests()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert!(
        !seen.contains(&"leaver".to_owned()),
        "B reached the upstream: {seen:?}"
    );
    assert!(seen.contains(&"late".to_owned()));
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_stream_frees_the_slot_at_once_and_the_upstream_connection_closes()
{
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 1, 1, "60s")]).await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    // A streams slowly: 100 tokens, 200 ms apart, 20 s in all.
    let mut a = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-tokens", "100"),
            ("x-fake-chunk-interval-ms", "200"),
            ("x-request-id", "a"),
        ],
    )
    .await;
    assert_eq!(a.status, 200);
    assert!(a.next_data().await.unwrap().is_some(), "the stream started");

    // B waits behind A.
    let b = tokio::spawn(async move { chat(addr, "qwen", false, &[("x-request-id", "b")]).await });
    eventually("B queued", SOON, || gw.limiter().queued(&key, "qwen") == 1).await;

    let cut = tokio::time::Instant::now();
    a.disconnect();
    let b = tokio::time::timeout(SOON, b)
        .await
        .expect("B is served long before A's 20 s stream would have ended")
        .unwrap();
    assert_eq!(b.status, 200);

    // The upstream saw A's client go away (the gateway closed its upstream connection), and B
    // only reached it once A's client had left. (Against the instant of the cut, not the fake's
    // `ended_at` for A: the gateway frees the slot and closes A's upstream connection together,
    // so which of the two the fake records first is up to the scheduler.)
    let a_record = fake.observer().wait_for_outcome("a", SOON).await.unwrap();
    assert_eq!(a_record.outcome, Some(Outcome::ClientGoneMidResponse));
    assert!(a_record.events_sent < 100, "A was cut short");
    let b_record = fake.observer().wait_for_outcome("b", SOON).await.unwrap();
    assert!(
        b_record.received_at >= cut,
        "B reached the upstream {:?} before A's client left",
        cut - b_record.received_at
    );
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 0);
    gw.shutdown().await;
    fake.shutdown().await;
}

/// A fake-backed upstream with one model and the given `cancel_grace`.
fn upstream_with_grace(url: &str, parallel: usize, queue: usize, grace: &str) -> String {
    upstream("gpu", url, "qwen", parallel, queue, "60s").replace(
        "kind = \"llama-server\"\n",
        &format!("kind = \"llama-server\"\ncancel_grace = \"{grace}\"\n"),
    )
}

/// A holds the only slot with a long non-streamed request, B waits behind it, A's client
/// leaves before any answer. Returns when B was answered: A's and B's records at the fake, and
/// the instant just before A's client left.
async fn leave_before_the_answer_with_b_queued(
    gw: &slotgate_gateway::Gateway,
    fake: &FakeUpstream,
) -> (
    fake_upstream::RequestRecord,
    fake_upstream::RequestRecord,
    tokio::time::Instant,
) {
    let addr = gw.api_addr();
    let key = authority(fake.addr());
    let a = open_chat(
        addr,
        "qwen",
        false,
        &[("x-fake-hold-ms", "60000"), ("x-request-id", "a")],
    )
    .await;
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let b = tokio::spawn(async move { chat(addr, "qwen", false, &[("x-request-id", "b")]).await });
    eventually("B queued", SOON, || gw.limiter().queued(&key, "qwen") == 1).await;

    let cut = tokio::time::Instant::now();
    a.disconnect();
    let b = tokio::time::timeout(SOON, b)
        .await
        .expect("B is served long before A's 60 s would have ended")
        .unwrap();
    assert_eq!(b.status, 200, "{}", b.text());
    let a_record = fake.observer().wait_for_outcome("a", SOON).await.unwrap();
    assert_eq!(a_record.outcome, Some(Outcome::ClientGoneMidResponse));
    let b_record = fake.observer().wait_for_outcome("b", SOON).await.unwrap();
    assert_eq!(b_record.outcome, Some(Outcome::Completed));
    slots_free(gw, fake, "qwen", "slot freed").await;
    (a_record, b_record, cut)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_before_the_answer_keeps_the_slot_for_the_cancel_grace() {
    const GRACE: Duration = Duration::from_secs(4);
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream_with_grace(&fake.url(), 1, 1, "4s")]).await;

    let (a, b, cut) = leave_before_the_answer_with_b_queued(&gw, &fake).await;
    // The upstream saw A go away (its connection was closed at once), and B only arrived there
    // after that, and not before a good part of the grace had passed: the slot stayed taken
    // while the engine would still be winding A down.
    let a_ended = a.ended_at.unwrap();
    assert!(
        a_ended - cut < GRACE,
        "A's upstream connection was closed at once, not after the grace"
    );
    assert!(
        b.received_at >= a_ended,
        "B reached the upstream before A ended"
    );
    assert!(
        b.received_at >= cut + GRACE / 2,
        "B reached the upstream {:?} after A's client left, within the {GRACE:?} grace",
        b.received_at - cut
    );

    let text = get(gw.admin_addr().unwrap(), "/metrics").await.text();
    for line in [
        r#"slotgate_client_disconnects_total{upstream="gpu",model="qwen",phase="awaiting_response"} 1"#,
        r#"slotgate_client_disconnects_total{upstream="gpu",model="qwen",phase="streaming"} 0"#,
        r#"slotgate_requests_total{upstream="gpu",model="qwen",outcome="client_gone"} 1"#,
        r#"slotgate_requests_total{upstream="gpu",model="qwen",outcome="completed"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_stream_in_prefill_keeps_the_slot_for_the_cancel_grace() {
    // llama-server sends a stream's head at once, then nothing until prefill is done: the
    // client that leaves then has had no byte of the answer, and the engine notices only at
    // its first write. Issue 28: the next request reached the engine 5 ms after the client left.
    const GRACE: Duration = Duration::from_secs(4);
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream_with_grace(&fake.url(), 1, 1, "4s")]).await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());
    let a = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-fail", "first-token-delay-ms=60000"),
            ("x-request-id", "a"),
        ],
    )
    .await;
    assert_eq!(a.status, 200);
    let b = tokio::spawn(async move { chat(addr, "qwen", false, &[("x-request-id", "b")]).await });
    eventually("B queued", SOON, || gw.limiter().queued(&key, "qwen") == 1).await;

    let cut = tokio::time::Instant::now();
    a.disconnect();
    let b = tokio::time::timeout(SOON, b)
        .await
        .expect("B is served")
        .unwrap();
    assert_eq!(b.status, 200, "{}", b.text());
    let b_record = fake.observer().wait_for_outcome("b", SOON).await.unwrap();
    assert!(
        b_record.received_at >= cut + GRACE / 2,
        "B reached the upstream {:?} after A's client left, within the {GRACE:?} grace",
        b_record.received_at - cut
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_a_flowing_stream_frees_the_slot_at_once() {
    // Once the answer's bytes flow, the engine notices a closed connection at its next write.
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream_with_grace(&fake.url(), 1, 1, "4s")]).await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());
    let mut a = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-tokens", "100000"),
            ("x-fake-chunk-interval-ms", "50"),
        ],
    )
    .await;
    assert!(a.next_data().await.unwrap().is_some(), "the stream flows");
    let b = tokio::spawn(async move { chat(addr, "qwen", false, &[("x-request-id", "b")]).await });
    eventually("B queued", SOON, || gw.limiter().queued(&key, "qwen") == 1).await;
    let cut = tokio::time::Instant::now();
    a.disconnect();
    let b = tokio::time::timeout(SOON, b)
        .await
        .expect("B is served")
        .unwrap();
    assert_eq!(b.status, 200, "{}", b.text());
    let b_record = fake.observer().wait_for_outcome("b", SOON).await.unwrap();
    assert!(
        b_record.received_at - cut < Duration::from_secs(2),
        "B reached the upstream only {:?} after A's client left",
        b_record.received_at - cut
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_zero_cancel_grace_a_client_that_leaves_before_the_answer_frees_the_slot_at_once() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream_with_grace(&fake.url(), 1, 1, "0s")]).await;

    let (_a, b, cut) = leave_before_the_answer_with_b_queued(&gw, &fake).await;
    // Generous: half the grace the test above waits for, on a loaded machine.
    assert!(
        b.received_at - cut < Duration::from_secs(2),
        "B reached the upstream only {:?} after A's client left",
        b.received_at - cut
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

// === upstream failures ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_dies_mid_stream_ends_the_stream_and_frees_the_slot() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")]).await;
    let addr = gw.api_addr();

    let mut stream = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-fail", "die-after-chunks=3"),
            ("x-fake-chunk-interval-ms", "20"),
        ],
    )
    .await;
    assert_eq!(
        stream.status, 200,
        "headers went out before the upstream died"
    );
    // Not a silent cut: the stream ends cleanly, its last event an `upstream-stalled` error.
    let rest = stream.rest().await.expect("a clean end of the stream");
    let text = String::from_utf8_lossy(&rest);
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    assert!(
        last.starts_with("data: ") && last.contains("/problems/upstream-stalled"),
        "the last event is the error: {text}"
    );
    slots_free(&gw, &fake, "qwen", "slot freed").await;

    // The gateway carries on.
    assert_eq!(chat(addr, "qwen", false, &[]).await.status, 200);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_cut_mid_event_leaves_the_client_only_whole_events() {
    // Issue 28: the error event was glued onto the half event (`…"content":"haldata: {…`),
    // one event of invalid JSON, and SDKs raised a decode error instead of the problem.
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")]).await;
    let addr = gw.api_addr();
    let mut stream = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-fail", "die-mid-event=3"),
            ("x-fake-chunk-interval-ms", "20"),
        ],
    )
    .await;
    assert_eq!(stream.status, 200);
    let rest = stream.rest().await.expect("a clean end of the stream");
    let text = String::from_utf8_lossy(&rest);
    assert!(text.ends_with("\n\n"), "{text}");
    let events: Vec<&str> = text.trim_end().split("\n\n").collect();
    // The three whole events, then the error: the half fourth event is dropped.
    assert_eq!(events.len(), 4, "{text}");
    for event in &events {
        let json = event
            .strip_prefix("data: ")
            .expect("one data line per event");
        let parsed: serde_json::Value = serde_json::from_str(json)
            .unwrap_or_else(|e| panic!("event {json:?} is not JSON ({e}) in {text}"));
        assert!(parsed.is_object());
    }
    assert!(events[3].contains("/problems/upstream-stalled"), "{text}");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_refuses_connections_gives_a_problem_and_frees_the_slot() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with(
        "health_check_interval = \"3s\"",
        &[upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")],
    )
    .await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());
    fake.refuse_connections().await.unwrap();

    let reply = chat(addr, "qwen", false, &[]).await;
    // Nothing was sent, so this is "unavailable, retry" rather than a bad gateway.
    let doc = reply.assert_problem(503, "upstream-unavailable");
    assert_eq!(reply.retry_after(), 3, "the health-check interval: {doc}");
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 0);

    fake.accept_connections().await.unwrap();
    assert_eq!(chat(addr, "qwen", false, &[]).await.status, 200);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_hangs_past_the_first_byte_timeout_gives_504_and_frees_the_slot() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with(
        "first_byte_timeout = \"500ms\"",
        &[upstream_with_grace(&fake.url(), 1, 1, "3s")],
    )
    .await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    let reply = chat(
        addr,
        "qwen",
        false,
        &[("x-fake-fail", "hang"), ("x-request-id", "hung")],
    )
    .await;
    let doc = reply.assert_problem(504, "upstream-timeout");
    assert_eq!(doc["upstream"], "gpu");
    assert!(
        reply.headers.get("retry-after").is_none(),
        "it may have run: no Retry-After"
    );
    // The engine may still be winding the request down: the slot is kept for the cancel grace,
    // then given back.
    assert_eq!(
        gw.limiter().in_flight(&key, "qwen"),
        1,
        "kept for the grace"
    );
    slots_free(&gw, &fake, "qwen", "the slot back after the cancel grace").await;
    // The gateway dropped the upstream request, so the hung engine slot is told.
    let record = fake
        .observer()
        .wait_for_outcome("hung", SOON)
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ClientGoneMidResponse));

    // The single slot is usable again.
    assert_eq!(chat(addr, "qwen", false, &[]).await.status, 200);
    gw.shutdown().await;
    fake.shutdown().await;
}

// === queueing ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_past_queue_timeout_gets_503_queue_timeout_and_never_runs() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 1, 4, "300ms")]).await;
    let addr = gw.api_addr();

    let holder = tokio::spawn(async move {
        chat(
            addr,
            "qwen",
            false,
            &[("x-fake-hold-ms", "3000"), ("x-request-id", "holder")],
        )
        .await
    });
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();

    let reply = chat(addr, "qwen", false, &[("x-request-id", "waiter")]).await;
    let doc = reply.assert_problem(503, "queue-timeout");
    reply.retry_after();
    assert_eq!(doc["model"], "qwen");
    assert!(
        fake.observer().request("waiter").is_none(),
        "it never reached the upstream"
    );
    assert_eq!(holder.await.unwrap().status, 200);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_saturated_upstream_does_not_delay_requests_to_another() {
    let busy = fake(4, "big").await;
    let idle = fake(4, "small").await;
    let gw = gateway_with(
        "",
        &[
            upstream("busy", &busy.url(), "big", 1, 20, "60s"),
            upstream("idle", &idle.url(), "small", 2, 2, "60s"),
        ],
    )
    .await;
    let addr = gw.api_addr();
    let busy_key = authority(busy.addr());

    let backlog = spawn_burst(6, |_| async move {
        chat(addr, "big", false, &[("x-fake-hold-ms", "400")]).await
    });
    eventually("big's queue filled", SOON, || {
        gw.limiter().queued(&busy_key, "big") >= 3
    })
    .await;

    let small = chat(addr, "small", false, &[]).await;
    assert_eq!(small.status, 200);
    // Served while big's backlog was still waiting (its 6 × 400 ms take over 2 s).
    assert!(
        gw.limiter().queued(&busy_key, "big") >= 1,
        "small was not held up behind big"
    );
    for reply in replies(backlog).await {
        assert_eq!(reply.status, 200);
    }
    gw.shutdown().await;
    busy.shutdown().await;
    idle.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_aliases_of_one_model_share_one_cap_and_one_queue() {
    let fake = fake(4, "llama").await;
    let gw = gateway(&format!(
        "{}[aliases]\nfast = \"llama\"\ncheap = \"llama\"\n\n{}",
        server(""),
        upstream("gpu", &fake.url(), "llama", 1, 1, "30s")
    ))
    .await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    let first = tokio::spawn(async move {
        chat(
            addr,
            "fast",
            false,
            &[("x-fake-hold-ms", "1500"), ("x-request-id", "via-fast")],
        )
        .await
    });
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let second =
        tokio::spawn(
            async move { chat(addr, "cheap", false, &[("x-request-id", "via-cheap")]).await },
        );
    eventually("the second alias queued on the same key", SOON, || {
        gw.limiter().queued(&key, "llama") == 1
    })
    .await;

    // One slot, one queue place, both taken through the two aliases: the model's own name is
    // refused at once.
    let third = chat(addr, "llama", false, &[]).await;
    third.assert_problem(503, "queue-full");
    third.retry_after();

    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    // The upstream was asked for the model by its own name.
    for id in ["via-fast", "via-cheap"] {
        let record = fake.observer().request(id).unwrap();
        assert_eq!(record.model.as_deref(), Some("llama"), "{id}");
    }
    assert_eq!(fake.observer().peak_in_flight(), 1);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sse_arrives_chunk_by_chunk() {
    let fake = fake(2, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")]).await;
    let addr = gw.api_addr();

    let mut stream = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-tokens", "10"),
            ("x-fake-chunk-interval-ms", "300"),
            ("x-request-id", "sse"),
        ],
    )
    .await;
    assert_eq!(stream.status, 200);
    assert!(
        stream.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"),
        "{:?}",
        stream.headers
    );
    let first = stream.next_data().await.unwrap().expect("a first chunk");
    assert!(first.starts_with(b"data: "), "{first:?}");
    // The first chunk is here while the upstream is still generating.
    let record = fake.observer().request("sse").unwrap();
    assert!(
        record.outcome.is_none(),
        "the upstream had already finished: {record:?}"
    );

    let rest = stream.rest().await.expect("a clean end");
    let text = String::from_utf8_lossy(&first).into_owned() + &String::from_utf8_lossy(&rest);
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    gw.shutdown().await;
    fake.shutdown().await;
}

/// llama-server closes its connection right after every streamed answer, without
/// `Connection: close` (the fake does as the real one: `FakeConfig::close_after_stream`). With
/// one slot and a queue, each queued stream is let go the instant the stream before it ends, and
/// would be handed that stream's connection just as the engine closes it: the gateway must not
/// reuse it, or the queued request is lost as a 502.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_streams_never_get_the_connection_llama_server_closes_after_a_stream() {
    let fake = fake(1, "qwen").await;
    assert!(fake.config().close_after_stream);
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 1, 32, "30s")]).await;
    let addr = gw.api_addr();

    let tasks = spawn_burst(20, |i| async move {
        let id = format!("turn-{i}");
        chat(
            addr,
            "qwen",
            true,
            &[("x-fake-tokens", "4"), ("x-request-id", &id)],
        )
        .await
    });
    for reply in replies(tasks).await {
        assert_eq!(reply.status.as_u16(), 200, "{}", reply.text());
        assert!(
            reply.text().trim_end().ends_with("data: [DONE]"),
            "{}",
            reply.text()
        );
    }
    let seen = fake.observer().snapshot();
    assert_eq!(seen.received, 20, "every request reached the engine once");
    assert_eq!(fake.observer().peak_in_flight(), 1);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn falls_through_to_the_next_host_when_the_best_hosts_queue_is_full() {
    let a = fake(4, "qwen").await;
    let b = fake(4, "qwen").await;
    let gw = gateway_with(
        "",
        &[
            // Equal weights; "a" comes first in configuration order, so it wins every tie.
            upstream("a", &a.url(), "qwen", 1, 0, "30s"),
            upstream("b", &b.url(), "qwen", 1, 4, "30s"),
        ],
    )
    .await;
    let addr = gw.api_addr();

    let hold = [("x-fake-hold-ms", "1500")];
    let first = tokio::spawn(async move { chat(addr, "qwen", false, &hold).await });
    a.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let second = tokio::spawn(async move { chat(addr, "qwen", false, &hold).await });
    b.observer().wait_for_in_flight(1, SOON).await.unwrap();

    // Both busy, nobody queued: "a" ranks first (tie), its queue holds nobody, so the request
    // falls through to "b" and waits there.
    let third = chat(addr, "qwen", false, &[("x-request-id", "third")]).await;
    assert_eq!(third.status, 200, "{}", third.text());
    assert!(b.observer().request("third").is_some(), "served by b");
    assert!(a.observer().request("third").is_none());
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}

// === the rest of the API surface ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_plain_requests_and_refuses_bad_ones_with_problems() {
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}[aliases]\nchat = \"qwen\"\n\n{}",
        server("max_body_bytes = 1024"),
        upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")
    ))
    .await;
    let addr = gw.api_addr();

    // A plain answer, with the request id propagated upstream and echoed back.
    let ok = chat(addr, "qwen", false, &[("x-request-id", "plain-1")]).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.headers["x-request-id"], "plain-1");
    assert!(fake.observer().request("plain-1").is_some());
    // A generated id when the client sends none.
    let generated = chat(addr, "qwen", false, &[]).await;
    assert_eq!(generated.headers["x-request-id"].len(), 36);

    // Completions and embeddings are routed the same way.
    let completion = send(post(
        addr,
        "/v1/completions",
        r#"{"model":"chat","prompt":"hi"}"#.into(),
        &[],
    ))
    .await;
    assert_eq!(completion.status, 200, "{}", completion.text());
    let embedding = send(post(
        addr,
        "/v1/embeddings",
        r#"{"model":"qwen","input":"hi"}"#.into(),
        &[],
    ))
    .await;
    assert_eq!(embedding.status, 200, "{}", embedding.text());

    // The model list, aliases included.
    let models = get(addr, "/v1/models").await;
    assert_eq!(models.status, 200);
    let ids: Vec<String> = models.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["chat", "qwen"]);

    // Refusals, each a problem document.
    chat(addr, "gpt-4", false, &[])
        .await
        .assert_problem(404, "model-not-found");
    get(addr, "/v2/nothing")
        .await
        .assert_problem(404, "not-found");
    let wrong_method = get(addr, "/v1/chat/completions").await;
    wrong_method.assert_problem(405, "method-not-allowed");
    assert_eq!(wrong_method.headers["allow"], "POST");
    send(post(addr, "/v1/chat/completions", "{not json".into(), &[]))
        .await
        .assert_problem(400, "bad-request");
    send(post(
        addr,
        "/v1/chat/completions",
        r#"{"messages":[]}"#.into(),
        &[],
    ))
    .await
    .assert_problem(400, "bad-request");
    let big = format!(r#"{{"model":"qwen","pad":"{}"}}"#, "x".repeat(2048));
    send(post(addr, "/v1/chat/completions", big, &[]))
        .await
        .assert_problem(413, "body-too-large");
    let mut form = post(addr, "/v1/chat/completions", chat_body("qwen", false), &[]);
    form.headers_mut().insert(
        "content-type",
        "application/x-www-form-urlencoded".parse().unwrap(),
    );
    send(form)
        .await
        .assert_problem(415, "unsupported-media-type");

    // Nothing refused reached the upstream: 2 chats + 1 completion + 1 embedding.
    assert_eq!(fake.observer().snapshot().received, 4);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_listener_serves_probes_and_metrics() {
    let fake = fake(2, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 2, 3, "30s")]).await;
    let admin = gw.admin_addr().expect("admin listener configured");
    assert_eq!(chat(gw.api_addr(), "qwen", false, &[]).await.status, 200);

    assert_eq!(get(admin, "/healthz").await.status, 200);
    assert_eq!(get(admin, "/readyz").await.status, 200);
    let metrics = get(admin, "/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for line in [
        r#"slotgate_slots_capacity{upstream="gpu",model="qwen"} 2"#,
        r#"slotgate_queue_capacity{upstream="gpu",model="qwen"} 3"#,
        r#"slotgate_slots_in_use{upstream="gpu",model="qwen"} 0"#,
        r#"slotgate_requests_total{upstream="gpu",model="qwen",outcome="completed"} 1"#,
        r#"slotgate_rejections_total{model="qwen",reason="queue_full"} 0"#,
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    assert!(
        text.contains("slotgate_queue_wait_seconds_bucket"),
        "{text}"
    );
    get(admin, "/nope").await.assert_problem(404, "not-found");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_an_in_flight_stream_finish() {
    let fake = fake(2, "qwen").await;
    let gw = gateway_with(
        "drain_grace = \"20s\"",
        &[upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")],
    )
    .await;
    let addr = gw.api_addr();

    let mut stream = streaming_chat(
        addr,
        "qwen",
        &[("x-fake-tokens", "10"), ("x-fake-chunk-interval-ms", "100")],
    )
    .await;
    assert!(stream.next_data().await.unwrap().is_some());
    let stopping = tokio::spawn(gw.shutdown());
    let rest = stream.rest().await.expect("the stream ends cleanly");
    assert!(String::from_utf8_lossy(&rest).contains("[DONE]"));
    tokio::time::timeout(SOON, stopping)
        .await
        .expect("shutdown completes")
        .unwrap();
    // The listener is gone.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    fake.shutdown().await;
}

// === HTTP/2 ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_streams_share_the_cap_and_a_reset_stream_frees_its_slot() {
    use http_body_util::BodyExt;

    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 1, 1, "60s")]).await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());
    let mut conn = support::h2(addr).await;

    // A plain answer over h2c.
    let (head, body) = conn
        .send(post(
            addr,
            "/v1/chat/completions",
            chat_body("qwen", false),
            &[],
        ))
        .await;
    assert_eq!(head.status, 200);
    assert_eq!(head.version, http::Version::HTTP_2);
    let body = body.collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&body).contains("chat.completion"));

    // A slow stream on the same connection, cut by the client (RST_STREAM) after one chunk.
    let (head, mut body) = conn
        .send(post(
            addr,
            "/v1/chat/completions",
            chat_body("qwen", true),
            &[
                ("x-fake-tokens", "100"),
                ("x-fake-chunk-interval-ms", "200"),
                ("x-request-id", "h2-a"),
            ],
        ))
        .await;
    assert_eq!(head.status, 200);
    assert!(body.frame().await.is_some());
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 1);
    drop(body);

    let record = fake
        .observer()
        .wait_for_outcome("h2-a", SOON)
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ClientGoneMidResponse));
    slots_free(&gw, &fake, "qwen", "slot freed").await;
    conn.close();
    gw.shutdown().await;
    fake.shutdown().await;
}

// === connections, authentication, unlimited models ===

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_the_header_read_timeout() {
    use tokio::io::AsyncReadExt;

    let fake = fake(1, "qwen").await;
    let gw = gateway_with(
        "header_read_timeout = \"300ms\"",
        &[upstream("gpu", &fake.url(), "qwen", 1, 0, "30s")],
    )
    .await;
    let mut silent = tokio::net::TcpStream::connect(gw.api_addr()).await.unwrap();
    let mut buf = [0_u8; 64];
    let read = tokio::time::timeout(SOON, silent.read(&mut buf))
        .await
        .expect("the gateway closes the connection");
    assert!(
        matches!(read, Ok(0) | Err(_)),
        "closed without an answer: {read:?}"
    );

    // A client that starts a head and stalls is cut too.
    let mut stalled = tokio::net::TcpStream::connect(gw.api_addr()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stalled, b"POST /v1/chat/completions HTTP/1.1\r\nHo")
        .await
        .unwrap();
    let read = tokio::time::timeout(SOON, async {
        let mut all = Vec::new();
        loop {
            match stalled.read(&mut buf).await {
                Ok(0) | Err(_) => return all,
                Ok(n) => all.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await
    .expect("the gateway closes the stalled connection");
    // hyper may answer 408 before closing; it must not have waited forever.
    let text = String::from_utf8_lossy(&read);
    assert!(
        read.is_empty() || text.starts_with("HTTP/1.1 408"),
        "{text}"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_connections_new_connections_wait_for_a_free_one() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with(
        "max_connections = 1",
        &[upstream("gpu", &fake.url(), "qwen", 4, 0, "30s")],
    )
    .await;
    let addr = gw.api_addr();

    // The only connection: a request on it is in flight.
    let first = open_chat(addr, "qwen", false, &[("x-fake-hold-ms", "1000")]).await;
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    // A second connection is not served while the first is open...
    let second =
        tokio::spawn(async move { chat(addr, "qwen", false, &[("x-request-id", "second")]).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        fake.observer().request("second").is_none(),
        "served past the connection limit"
    );
    // ...and is served once the first closes.
    first.disconnect();
    let second = tokio::time::timeout(SOON, second)
        .await
        .expect("served after")
        .unwrap();
    assert_eq!(second.status, 200);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_are_required_when_configured() {
    let fake = fake(2, "qwen").await;
    let gw = gateway_with(
        "api_keys = [\"sk-test-1\"]",
        &[upstream("gpu", &fake.url(), "qwen", 2, 0, "30s")],
    )
    .await;
    let addr = gw.api_addr();
    let none = chat(addr, "qwen", false, &[]).await;
    none.assert_problem(401, "unauthorized");
    assert_eq!(none.headers["www-authenticate"], "Bearer");
    chat(addr, "qwen", false, &[("authorization", "Bearer sk-wrong")])
        .await
        .assert_problem(401, "unauthorized");
    let ok = chat(
        addr,
        "qwen",
        false,
        &[("authorization", "Bearer sk-test-1")],
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    get(addr, "/v1/models")
        .await
        .assert_problem(401, "unauthorized");
    assert_eq!(fake.observer().snapshot().received, 1);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unlimited_model_is_never_queued_or_refused() {
    let fake = fake(16, "qwen").await;
    let gw = gateway(&format!(
        "{}[upstreams.gpu]\nurl = \"{}\"\nkind = \"vllm\"\n\n[upstreams.gpu.models.qwen]\nparallel = \"unlimited\"\n",
        server(""),
        fake.url()
    ))
    .await;
    let addr = gw.api_addr();
    let tasks = spawn_burst(12, |_| async move {
        chat(addr, "qwen", false, &[("x-fake-hold-ms", "500")]).await
    });
    for reply in replies(tasks).await {
        assert_eq!(reply.status, 200);
    }
    assert!(fake.observer().peak_in_flight() > 1);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_the_upstream_is_silent_is_noticed_without_a_write() {
    let fake = fake(4, "qwen").await;
    let gw = gateway_with("", &[upstream("gpu", &fake.url(), "qwen", 1, 1, "60s")]).await;
    let addr = gw.api_addr();
    let key = authority(fake.addr());

    // The role chunk comes at once, the first token only after 60 s (a long prefill).
    let mut a = streaming_chat(
        addr,
        "qwen",
        &[
            ("x-fake-tokens", "2"),
            ("x-fake-chunk-interval-ms", "60000"),
            ("x-request-id", "silent"),
        ],
    )
    .await;
    assert!(a.next_data().await.unwrap().is_some());
    assert_eq!(gw.limiter().in_flight(&key, "qwen"), 1);
    a.disconnect();
    // Freed long before the upstream writes again: hyper saw the client's FIN while idle.
    slots_free(&gw, &fake, "qwen", "slot freed").await;
    let record = fake
        .observer()
        .wait_for_outcome("silent", SOON)
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ClientGoneMidResponse));
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_fails_over_to_the_next_host() {
    let a = fake(4, "qwen").await;
    let b = fake(4, "qwen").await;
    let gw = gateway_with(
        "",
        &[
            upstream("a", &a.url(), "qwen", 2, 2, "30s"),
            upstream("b", &b.url(), "qwen", 2, 2, "30s"),
        ],
    )
    .await;
    a.refuse_connections().await.unwrap();

    // "a" ranks first (configuration order breaks the tie) but refuses: nothing was sent, so
    // the request goes to "b".
    let reply = chat(gw.api_addr(), "qwen", false, &[("x-request-id", "moved")]).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(b.observer().request("moved").is_some());
    assert_eq!(
        gw.limiter().in_flight(&authority(a.addr()), "qwen"),
        0,
        "a's slot given back"
    );
    gw.shutdown().await;
    a.shutdown().await;
    b.shutdown().await;
}
