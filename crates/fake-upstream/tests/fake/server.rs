//! Server-level switches: refusing connections, cutting them, shutting down.

use std::io::ErrorKind;
use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream, Outcome};
use http::{Method, header};
use http_body_util::BodyExt;
use hyper::client::conn::http1::{Connection, SendRequest, handshake};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

use crate::support::{SOON, chat, get, request, spawn_stream, within};

#[tokio::test]
async fn refuses_connections_then_accepts_again_on_the_same_port() {
    let fake = FakeUpstream::start(FakeConfig::ollama(1)).await.unwrap();
    let addr = fake.addr();
    let (status, _, _) = get(addr, "/").await;
    assert_eq!(status, 200);

    fake.refuse_connections().await.unwrap();
    let refused = TcpStream::connect(addr).await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::ConnectionRefused);

    fake.accept_connections().await.unwrap();
    assert_eq!(fake.addr(), addr);
    let (status, _, _) = get(addr, "/").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn dropping_connections_cuts_streams_as_server_dropped() {
    let fake = FakeUpstream::start(
        FakeConfig::llama_server(2)
            .tokens(1000)
            .chunk_interval(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let addr = fake.addr();
    let observer = fake.observer().clone();
    let client = spawn_stream(
        addr,
        "/v1/chat/completions",
        chat("m", true),
        &[("x-request-id", "cut")],
    );
    within("streaming", observer.wait_for_in_flight(1, SOON))
        .await
        .unwrap();
    within("dropped", fake.drop_connections()).await;
    let streamed = within("client sees the cut", client).await.unwrap();
    assert!(streamed.aborted || !streamed.ends_with_done());
    let record = within("recorded", observer.wait_for_outcome("cut", SOON))
        .await
        .unwrap();
    assert_eq!(record.outcome, Some(Outcome::ServerDropped));
    // The port still listens.
    let (status, _, _) = get(addr, "/health").await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn shutdown_closes_the_port() {
    let fake = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    let addr = fake.addr();
    within("shutdown", fake.shutdown()).await;
    let refused = TcpStream::connect(addr).await;
    assert_eq!(refused.unwrap_err().kind(), ErrorKind::ConnectionRefused);
}

#[tokio::test]
async fn contradictory_configs_do_not_start() {
    let err = FakeUpstream::start(FakeConfig::vllm(0)).await.unwrap_err();
    assert!(err.to_string().contains("parallel"));
}

#[tokio::test]
async fn health_can_be_failed_and_restored() {
    let llama = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let vllm = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    llama.set_healthy(false);
    vllm.set_healthy(false);
    let (status, _, body) = get(llama.addr(), "/health").await;
    assert_eq!(status, 503);
    assert!(body.contains("Loading model"));
    let (status, _, body) = get(vllm.addr(), "/health").await;
    assert_eq!((status, body.as_str()), (503, ""));
    llama.set_healthy(true);
    vllm.set_healthy(true);
    assert_eq!(get(llama.addr(), "/health").await.0, 200);
    assert_eq!(get(vllm.addr(), "/health").await.0, 200);
}

/// One client connection kept for several requests, and the task that drives it.
async fn keep_alive_client(
    addr: std::net::SocketAddr,
) -> (
    SendRequest<http_body_util::Full<bytes::Bytes>>,
    JoinHandle<hyper::Result<()>>,
) {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (sender, connection): (_, Connection<_, _>) =
        handshake(TokioIo::new(stream)).await.unwrap();
    (sender, tokio::spawn(connection))
}

/// Sends a chat on the kept connection and reads the whole answer: the answer's
/// `Connection` header, and its body.
async fn chat_on(
    sender: &mut SendRequest<http_body_util::Full<bytes::Bytes>>,
    stream: bool,
) -> (Option<http::HeaderValue>, String) {
    within("ready", sender.ready()).await.unwrap();
    let req = request(
        Method::POST,
        "/v1/chat/completions",
        Some(&chat("m", stream)),
        &[],
    );
    let response = within("answer", sender.send_request(req)).await.unwrap();
    assert_eq!(response.status(), 200);
    let connection = response.headers().get(header::CONNECTION).cloned();
    let body = within("body", response.into_body().collect())
        .await
        .unwrap()
        .to_bytes();
    (connection, String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test]
async fn llama_server_closes_the_connection_right_after_a_streamed_answer() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let (mut sender, connection) = keep_alive_client(fake.addr()).await;
    // A JSON answer keeps the connection: a second one follows on it.
    for _ in 0..2 {
        let (close, body) = chat_on(&mut sender, false).await;
        assert_eq!(close, None);
        assert!(body.contains("chat.completion"), "{body}");
    }
    // The streamed answer arrives whole, says nothing of closing, and then the connection ends
    // cleanly (hyper's client connection resolves Ok when the server closes it while idle).
    let (close, body) = chat_on(&mut sender, true).await;
    assert_eq!(close, None);
    assert!(body.ends_with("data: [DONE]\n\n"), "{body}");
    within("the fake closes", connection)
        .await
        .unwrap()
        .unwrap();
    assert!(sender.is_closed());
    within("closed", fake.observer().wait_for_open_connections(0, SOON))
        .await
        .unwrap();
}

#[tokio::test]
async fn streamed_answers_keep_the_connection_when_the_switch_is_off() {
    for config in [
        FakeConfig::llama_server(1).close_after_stream(false),
        FakeConfig::vllm(1).model("m"),
        FakeConfig::ollama(1).model("m"),
    ] {
        let fake = FakeUpstream::start(config).await.unwrap();
        let (mut sender, connection) = keep_alive_client(fake.addr()).await;
        for _ in 0..2 {
            let (close, body) = chat_on(&mut sender, true).await;
            assert_eq!(close, None);
            assert!(body.contains("data: "), "{body}");
        }
        drop(sender);
        within("client done", connection).await.unwrap().unwrap();
    }
}
