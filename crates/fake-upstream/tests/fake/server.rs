//! Server-level switches: refusing connections, cutting them, shutting down.

use std::io::ErrorKind;
use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream, Outcome};
use tokio::net::TcpStream;

use crate::support::{SOON, chat, get, spawn_stream, within};

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
