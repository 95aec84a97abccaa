//! The failure modes of the fault matrix (issue #11): stalls, resets, garbage, 5xx in each
//! kind's shape, a late first token; and what the observer tells about the connection.

use std::io::ErrorKind;
use std::time::Duration;

use fake_upstream::{Failure, FakeConfig, FakeUpstream, GARBAGE, Outcome};
use http::Method;
use http_body_util::BodyExt;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::support::{SOON, chat, post, raw_post, read_stream, request, send, within};

/// Reads a raw connection to its end: the bytes, and whether it ended with a reset.
async fn read_raw(mut stream: TcpStream) -> (Vec<u8>, bool) {
    let mut bytes = Vec::new();
    let mut buf = [0_u8; 4096];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return (bytes, false),
            Ok(n) => bytes.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (bytes, true),
            Err(e) => panic!("unexpected read error: {e}"),
        }
    }
}

fn count_events(bytes: &[u8]) -> usize {
    String::from_utf8_lossy(bytes).matches("data: ").count()
}

#[tokio::test]
async fn stall_sends_n_events_then_silence_with_the_connection_open() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(10))
        .await
        .unwrap();
    let observer = fake.observer().clone();
    let response = send(
        fake.addr(),
        request(
            Method::POST,
            "/v1/chat/completions",
            Some(&chat("m", true)),
            &[
                ("x-fake-fail", "stall-after-chunks=2"),
                ("x-request-id", "s"),
            ],
        ),
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let mut raw = Vec::new();
    while count_events(&raw) < 2 {
        let frame = within("two events", body.frame()).await.unwrap().unwrap();
        raw.extend_from_slice(&frame.into_data().unwrap());
    }
    // Nothing more comes, and the request still holds its slot on an open connection.
    let more = tokio::time::timeout(Duration::from_millis(300), body.frame()).await;
    assert!(more.is_err(), "a stalled stream sends nothing more");
    let record = observer.request("s").unwrap();
    assert_eq!((record.events_sent, record.outcome), (2, None));
    assert!(record.connection_closed_at.is_none());
    assert_eq!(observer.in_flight(), 1);
    assert_eq!(observer.snapshot().connections_open, 1);

    // The client gives up: the fake sees it leave mid-response and the connection close.
    drop(body);
    let record = within("closed", observer.wait_for_connection_closed("s", SOON))
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ClientGoneMidResponse));
    within(
        "no open connection",
        observer.wait_for_open_connections(0, SOON),
    )
    .await
    .unwrap();
    assert_eq!(observer.in_flight(), 0);
}

#[tokio::test]
async fn stall_without_streaming_sends_the_head_only() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    let response = send(
        fake.addr(),
        request(
            Method::POST,
            "/v1/completions",
            Some(&serde_json::json!({"prompt": "x"})),
            &[("x-fake-fail", "stall-after-chunks=0")],
        ),
    )
    .await;
    assert_eq!(response.status(), 200);
    let mut body = response.into_body();
    let more = tokio::time::timeout(Duration::from_millis(300), body.frame()).await;
    assert!(more.is_err(), "no body comes");
    assert_eq!(fake.observer().in_flight(), 1);
}

#[tokio::test]
async fn reset_mid_stream_is_a_tcp_reset_after_n_events() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(10))
        .await
        .unwrap();
    let stream = raw_post(
        fake.addr(),
        "/v1/chat/completions",
        &chat("m", true),
        &[
            ("x-fake-fail", "reset-after-chunks=3"),
            ("x-request-id", "r"),
        ],
    )
    .await;
    let (bytes, reset) = within("reset", read_raw(stream)).await;
    assert!(reset, "the connection ends with RST, not FIN");
    assert!(String::from_utf8_lossy(&bytes).starts_with("HTTP/1.1 200"));
    assert_eq!(count_events(&bytes), 3);
    assert!(
        !String::from_utf8_lossy(&bytes).contains("\r\n0\r\n\r\n"),
        "no terminating chunk before the reset"
    );
    let record = within(
        "ended",
        fake.observer().wait_for_connection_closed("r", SOON),
    )
    .await
    .unwrap();
    assert_eq!(
        record.outcome,
        Some(Outcome::Injected(Failure::ResetAfterChunks(3)))
    );
    assert_eq!(fake.observer().in_flight(), 0);
}

#[tokio::test]
async fn reset_without_streaming_cuts_the_body() {
    let fake = FakeUpstream::start(FakeConfig::ollama(1)).await.unwrap();
    let stream = raw_post(
        fake.addr(),
        "/v1/chat/completions",
        &chat("fake-model", false),
        &[("x-fake-fail", "reset-after-chunks=0")],
    )
    .await;
    let (bytes, reset) = within("reset", read_raw(stream)).await;
    assert!(reset);
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.starts_with("HTTP/1.1 200"));
    assert!(!text.trim_end().ends_with('}'), "the JSON is cut: {text}");
}

#[tokio::test]
async fn reset_before_head_sends_nothing_but_rst() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    let stream = raw_post(
        fake.addr(),
        "/v1/chat/completions",
        &chat("fake-model", true),
        &[("x-fake-fail", "reset-before-head"), ("x-request-id", "b")],
    )
    .await;
    let (bytes, reset) = within("reset", read_raw(stream)).await;
    assert!(reset);
    assert!(bytes.is_empty(), "no byte of a response: {bytes:?}");
    let record = within(
        "closed",
        fake.observer().wait_for_connection_closed("b", SOON),
    )
    .await
    .unwrap();
    assert_eq!(
        record.outcome,
        Some(Outcome::Injected(Failure::ResetBeforeHead))
    );
    assert!(record.started_at.is_some(), "it held a slot first");
}

#[tokio::test]
async fn garbage_instead_of_http() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let stream = raw_post(
        fake.addr(),
        "/v1/chat/completions",
        &chat("m", false),
        &[("x-fake-fail", "garbage")],
    )
    .await;
    let (bytes, reset) = within("garbage", read_raw(stream)).await;
    assert!(!reset, "garbage ends with a plain close");
    assert_eq!(bytes, GARBAGE);

    // An HTTP client sees a protocol error, not a response.
    let stream = TcpStream::connect(fake.addr()).await.unwrap();
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(connection);
    let sent = sender
        .send_request(request(
            Method::POST,
            "/v1/chat/completions",
            Some(&chat("m", false)),
            &[("x-fake-fail", "garbage")],
        ))
        .await;
    assert!(sent.is_err(), "not HTTP");
}

#[tokio::test]
async fn server_errors_in_each_kinds_shape() {
    let llama = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let (status, _, body) = post(
        llama.addr(),
        "/v1/chat/completions",
        &chat("m", false),
        &[("x-fake-fail", "status-503")],
    )
    .await;
    assert_eq!(status, 503);
    assert_eq!(
        body,
        serde_json::json!({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}})
    );

    let ollama = FakeUpstream::start(FakeConfig::ollama(1)).await.unwrap();
    let (status, _, body) = post(
        ollama.addr(),
        "/v1/chat/completions",
        &chat("fake-model", false),
        &[("x-fake-fail", "status-503")],
    )
    .await;
    assert_eq!(status, 503);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("server busy")
    );

    let vllm = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    for (code, kind) in [
        (500, "InternalServerError"),
        (502, "InternalServerError"),
        (504, "InternalServerError"),
    ] {
        let fail = format!("status-{code}");
        let (status, _, body) = post(
            vllm.addr(),
            "/v1/completions",
            &serde_json::json!({"prompt": "x"}),
            &[("x-fake-fail", &fail)],
        )
        .await;
        assert_eq!(status, code);
        assert_eq!(body["error"]["type"], kind);
        assert_eq!(body["error"]["code"], code);
    }
}

#[tokio::test]
async fn first_token_delay_sends_the_head_first() {
    let delay = Duration::from_millis(1500);
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(3))
        .await
        .unwrap();
    let started = Instant::now();
    let response = send(
        fake.addr(),
        request(
            Method::POST,
            "/v1/chat/completions",
            Some(&chat("m", true)),
            &[
                ("x-fake-fail", "first-token-delay-ms=1500"),
                ("x-request-id", "t"),
            ],
        ),
    )
    .await;
    let head_at = Instant::now();
    assert_eq!(response.status(), 200);
    assert_eq!(
        fake.observer().request("t").unwrap().events_sent,
        0,
        "the head comes before any event"
    );
    let streamed = read_stream(response).await;
    assert!(streamed.ends_with_done());
    let first = streamed.arrivals[0];
    assert!(first - started >= delay);
    assert!(
        first - head_at >= delay / 2,
        "the head did not wait for the first token"
    );
    assert!(streamed.events[0].json().is_some(), "a JSON chunk first");
}

#[tokio::test]
async fn the_observer_counts_connections() {
    let fake = FakeUpstream::start(FakeConfig::vllm(2)).await.unwrap();
    let observer = fake.observer();
    assert_eq!(observer.snapshot().connections_open, 0);
    let (status, _, _) = post(
        fake.addr(),
        "/v1/completions",
        &serde_json::json!({"prompt": "x"}),
        &[("x-request-id", "c")],
    )
    .await;
    assert_eq!(status, 200);
    // `post` drops its connection once the body is read.
    let record = within("closed", observer.wait_for_connection_closed("c", SOON))
        .await
        .unwrap();
    assert!(record.connection >= 1);
    let snapshot = observer.snapshot();
    assert_eq!(
        (snapshot.connections_open, snapshot.connections_accepted),
        (0, 1)
    );
}
