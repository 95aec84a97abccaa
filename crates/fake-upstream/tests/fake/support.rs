//! Helpers: a minimal HTTP client over real loopback sockets (hyper's connection API), a raw-TCP
//! sender for what a client library would hide, and a guard against hanging forever.

use std::fmt::Write as _;
use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use fake_upstream::sse::{SseEvent, parse_events};
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// A generous bound for anything that should happen "soon", even on a loaded 2-core machine.
pub(crate) const SOON: Duration = Duration::from_secs(20);

/// Fails the test instead of hanging when `fut` takes longer than [`SOON`].
pub(crate) async fn within<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(SOON, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out: {what}"))
}

/// Builds a request; `body` is sent as JSON.
pub(crate) fn request(
    method: Method,
    path: &str,
    body: Option<&Value>,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut builder = Request::builder()
        .method(method)
        .uri(path)
        .header("host", "127.0.0.1");
    if body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    let bytes = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    builder.body(Full::new(bytes)).expect("a valid request")
}

/// Sends one request on a fresh HTTP/1.1 connection.
pub(crate) async fn send(addr: SocketAddr, req: Request<Full<Bytes>>) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(connection);
    sender.send_request(req).await.expect("response head")
}

/// Sends one request on a fresh h2c (prior knowledge) connection.
pub(crate) async fn send_h2(addr: SocketAddr, req: Request<Full<Bytes>>) -> Response<Incoming> {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2 handshake");
    tokio::spawn(connection);
    sender.send_request(req).await.expect("response head")
}

/// POSTs JSON and reads a JSON answer (`Value::Null` for an empty or non-JSON body).
pub(crate) async fn post(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> (u16, HeaderMap, Value) {
    let response = send(addr, request(Method::POST, path, Some(body), headers)).await;
    let (status, headers, text) = read_text(response).await;
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// GETs a path and reads the body as text.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, HeaderMap, String) {
    read_text(send(addr, request(Method::GET, path, None, &[])).await).await
}

/// GETs a path and parses the body as JSON.
pub(crate) async fn get_json(addr: SocketAddr, path: &str) -> (u16, Value) {
    let (status, _, text) = get(addr, path).await;
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

async fn read_text(response: Response<Incoming>) -> (u16, HeaderMap, String) {
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("a complete body")
        .to_bytes();
    (
        status,
        headers,
        String::from_utf8(body.to_vec()).expect("UTF-8"),
    )
}

/// A streamed answer as the client saw it.
#[derive(Debug)]
pub(crate) struct Streamed {
    pub(crate) status: u16,
    /// Every complete event, in order.
    pub(crate) events: Vec<SseEvent>,
    /// When each event's bytes arrived.
    pub(crate) arrivals: Vec<Instant>,
    /// The body ended with an error (connection aborted) instead of cleanly.
    pub(crate) aborted: bool,
}

impl Streamed {
    pub(crate) fn ends_with_done(&self) -> bool {
        self.events.last() == Some(&SseEvent::Done)
    }

    /// The concatenated content of the chunks (chat `delta.content` or completion `text`).
    pub(crate) fn text(&self) -> String {
        self.events
            .iter()
            .filter_map(SseEvent::json)
            .filter_map(|chunk| {
                let choice = chunk.get("choices")?.get(0)?;
                choice
                    .pointer("/delta/content")
                    .or_else(|| choice.get("text"))
                    .and_then(Value::as_str)
                    .map(str::to_owned)
            })
            .collect()
    }
}

/// Reads a whole streamed body, noting when each event arrived.
pub(crate) async fn read_stream(response: Response<Incoming>) -> Streamed {
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut raw = String::new();
    let mut arrivals = Vec::new();
    let mut aborted = false;
    loop {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    raw.push_str(std::str::from_utf8(&data).expect("UTF-8"));
                    let complete = parse_events(&raw).len();
                    arrivals.resize(complete, Instant::now());
                }
            }
            Some(Err(_)) => {
                aborted = true;
                break;
            }
            None => break,
        }
    }
    Streamed {
        status,
        events: parse_events(&raw),
        arrivals,
        aborted,
    }
}

/// POSTs a streaming request and reads the stream to its end.
pub(crate) async fn stream(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> Streamed {
    read_stream(send(addr, request(Method::POST, path, Some(body), headers)).await).await
}

/// Writes a raw HTTP/1.1 POST and returns the socket without reading anything.
pub(crate) async fn raw_post(
    addr: SocketAddr,
    path: &str,
    body: &Value,
    headers: &[(&str, &str)],
) -> TcpStream {
    let body = body.to_string();
    let mut head = format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (name, value) in headers {
        let _ = write!(head, "{name}: {value}\r\n");
    }
    head.push_str("\r\n");
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(head.as_bytes()).await.expect("write head");
    stream.write_all(body.as_bytes()).await.expect("write body");
    stream
}

/// A chat request body.
pub(crate) fn chat(model: &str, stream: bool) -> Value {
    serde_json::json!({
        "model": model,
        "stream": stream,
        "messages": [{"role": "user", "content": "say something"}],
    })
}

/// Owned copies of `headers`, for a request sent from a spawned task.
fn owned(headers: &[(&str, &str)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(name, value)| ((*name).to_owned(), (*value).to_owned()))
        .collect()
}

/// [`post`] in a background task: for a request that holds a slot (or hangs, with
/// `x-fake-fail: hang`) while the test goes on.
pub(crate) fn spawn_post(
    addr: SocketAddr,
    path: &'static str,
    body: Value,
    headers: &[(&str, &str)],
) -> JoinHandle<(u16, HeaderMap, Value)> {
    let headers = owned(headers);
    tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        post(addr, path, &body, &headers).await
    })
}

/// [`stream`] in a background task.
pub(crate) fn spawn_stream(
    addr: SocketAddr,
    path: &'static str,
    body: Value,
    headers: &[(&str, &str)],
) -> JoinHandle<Streamed> {
    let headers = owned(headers);
    tokio::spawn(async move {
        let headers: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        stream(addr, path, &body, &headers).await
    })
}
