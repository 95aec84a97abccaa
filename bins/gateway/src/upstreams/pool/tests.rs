//! Unit tests against a scripted HTTP/1.1 upstream on loopback: connections are reused, an
//! answer dropped mid-way never comes back to the pool, an answer read to its end does, the
//! idle bounds hold, a llama-server's keep-alive close never meets a reused connection, and a
//! refused or silent upstream is a connect error.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt as _, Full};
use slotgate_config::{Config, Kind};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

use super::{Pool, PoolError, PoolSettings};
use crate::support::base::Base;
use crate::tls::{self, UpstreamTls};

/// What the scripted upstream saw.
#[derive(Debug, Default)]
struct Seen {
    accepted: AtomicUsize,
    closed: AtomicUsize,
}

/// A scripted upstream on loopback: every accepted connection is counted in `accepted` and
/// handed to `serve` with the counts, on a task of its own.
async fn scripted<F, Fut>(serve: F) -> (String, Arc<Seen>)
where
    F: Fn(TcpStream, Arc<Seen>) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Seen::default());
    let counts = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            counts.accepted.fetch_add(1, Ordering::SeqCst);
            tokio::spawn(serve(stream, Arc::clone(&counts)));
        }
    });
    (url, seen)
}

/// An upstream on loopback that answers, by path:
/// - `/ok`: `ok`, keeping the connection;
/// - `/close`: `ok` with `Connection: close`, then closes;
/// - `/stream`: one chunk, then nothing until the client closes;
/// - `/slow-end`: one chunk, the end 100 ms later.
async fn upstream() -> (String, Arc<Seen>) {
    scripted(|stream, counts| async move {
        serve(stream).await;
        counts.closed.fetch_add(1, Ordering::SeqCst);
    })
    .await
}

/// Answers requests on one connection until the client closes it (or `/close`).
async fn serve(mut stream: TcpStream) {
    let mut head = Vec::new();
    let mut buf = [0_u8; 1024];
    loop {
        let Ok(n) = stream.read(&mut buf).await else {
            return;
        };
        if n == 0 {
            return;
        }
        head.extend_from_slice(&buf[..n]);
        let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
            continue;
        };
        let text = String::from_utf8_lossy(&head[..end]).into_owned();
        head.drain(..end + 4);
        let path = text.split(' ').nth(1).unwrap_or_default().to_owned();
        assert!(
            text.to_ascii_lowercase().contains("\r\nhost: 127.0.0.1:"),
            "{text}"
        );
        let chunk = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n";
        match path.as_str() {
            "/ok" => {
                let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                if stream.write_all(answer).await.is_err() {
                    return;
                }
            }
            "/close" => {
                let answer = b"HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 2\r\n\r\nok";
                let _ = stream.write_all(answer).await;
                return;
            }
            "/stream" => {
                if stream.write_all(chunk).await.is_err() {
                    return;
                }
                // Nothing more: wait for the client to close.
                while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
                return;
            }
            "/slow-end" => {
                if stream.write_all(chunk).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                if stream.write_all(b"0\r\n\r\n").await.is_err() {
                    return;
                }
            }
            other => panic!("unexpected path {other}"),
        }
    }
}

/// An upstream that closes a keep-alive connection idle for `keep_alive` the way llama-server
/// (cpp-httplib, 5 s) does, at the worst moment: the close crosses the gateway's next request,
/// so a request that arrives on a connection idle past `keep_alive` is read and the connection
/// closed without any answer ("connection closed before message completed"). A request within
/// `keep_alive` of the last answer gets `ok`. Counts connections accepted and requests lost.
async fn keep_alive_upstream(keep_alive: Duration) -> (String, Arc<Seen>) {
    scripted(move |mut stream, counts| async move {
        let mut buf = [0_u8; 4096];
        let mut answered = None::<std::time::Instant>;
        while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
            if answered.is_some_and(|at| at.elapsed() >= keep_alive) {
                // Lost: the request met the engine's idle close.
                counts.closed.fetch_add(1, Ordering::SeqCst);
                return;
            }
            let answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
            if stream.write_all(answer).await.is_err() {
                return;
            }
            answered = Some(std::time::Instant::now());
        }
    })
    .await
}

/// An upstream that closes each connection 100 ms after a chunked answer, without saying so
/// (`Connection: close`), as llama-server does after every streamed answer; a request that
/// arrives in those 100 ms is lost with the connection. Counts connections accepted and
/// requests lost (in `closed`).
async fn closes_after_chunked_upstream() -> (String, Arc<Seen>) {
    scripted(|mut stream, counts| async move {
        let mut buf = [0_u8; 4096];
        if !matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {
            return;
        }
        let answer = b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n";
        if stream.write_all(answer).await.is_err() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        if matches!(
            tokio::time::timeout(Duration::ZERO, stream.read(&mut buf)).await,
            Ok(Ok(n)) if n > 0
        ) {
            counts.closed.fetch_add(1, Ordering::SeqCst);
        }
    })
    .await
}

fn settings() -> PoolSettings {
    PoolSettings {
        connect_timeout: Duration::from_secs(5),
        idle_timeout: Duration::from_secs(60),
        max_idle: 8,
        reuse_after_chunked: true,
    }
}

fn pool(url: &str, settings: PoolSettings) -> Pool {
    let connector = tls::connector(None, settings.connect_timeout, Duration::from_secs(60));
    Pool::new(connector, &Base::parse(url).unwrap(), settings)
}

fn get(path: &'static str) -> Request<Full<Bytes>> {
    Request::get(path).body(Full::new(Bytes::new())).unwrap()
}

/// Waits (at most 5 s) until `done` holds.
async fn eventually(what: &str, done: impl Fn() -> bool) {
    for _ in 0..500 {
        if done() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("not within 5 s: {what}");
}

/// Sends `path` and reads the answer to its end.
async fn fetch(pool: &Pool, path: &'static str) -> Bytes {
    let response = pool.send(get(path)).await.unwrap();
    response.into_body().collect().await.unwrap().to_bytes()
}

#[tokio::test]
async fn requests_in_turn_share_one_connection() {
    let (url, seen) = upstream().await;
    let pool = pool(&url, settings());
    for _ in 0..3 {
        assert_eq!(fetch(&pool, "/ok").await, "ok");
        eventually("the connection is idle again", || pool.idle_count() == 1).await;
    }
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_answer_dropped_mid_way_closes_its_connection() {
    let (url, seen) = upstream().await;
    let pool = pool(&url, settings());
    let response = pool.send(get("/stream")).await.unwrap();
    let mut body = response.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert_eq!(first.into_data().unwrap(), "hello");
    assert_eq!(pool.idle_count(), 0, "still streaming");
    drop(body);
    eventually("the upstream sees its connection closed", || {
        seen.closed.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(fetch(&pool, "/ok").await, "ok");
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 2, "a new connection");
}

#[tokio::test]
async fn an_answer_read_to_its_end_gives_its_connection_back() {
    let (url, seen) = upstream().await;
    let pool = pool(&url, settings());
    let response = pool.send(get("/slow-end")).await.unwrap();
    // The answer is still coming: the connection is with its driver, not idle.
    assert_eq!(pool.idle_count(), 0);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "hello");
    eventually("the connection is idle again", || pool.idle_count() == 1).await;
    assert_eq!(fetch(&pool, "/ok").await, "ok");
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_the_upstream_closed_is_not_reused() {
    let (url, seen) = upstream().await;
    let pool = pool(&url, settings());
    assert_eq!(fetch(&pool, "/close").await, "ok");
    eventually("the upstream closed it", || {
        seen.closed.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(fetch(&pool, "/ok").await, "ok");
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn idle_connections_close_after_the_idle_timeout() {
    let (url, seen) = upstream().await;
    let settings = PoolSettings {
        idle_timeout: Duration::from_millis(200),
        ..settings()
    };
    let pool = pool(&url, settings);
    assert_eq!(fetch(&pool, "/ok").await, "ok");
    eventually("the idle connection is closed", || {
        seen.closed.load(Ordering::SeqCst) == 1
    })
    .await;
    assert_eq!(pool.idle_count(), 0);
    // And the pool still works afterwards, on a new connection.
    assert_eq!(fetch(&pool, "/ok").await, "ok");
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_llama_server_connection_is_not_reused_past_the_engines_keep_alive() {
    // cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND; the gateway's default idle_timeout.
    let (url, seen) = keep_alive_upstream(Duration::from_secs(5)).await;
    let settings = PoolSettings {
        idle_timeout: Duration::from_secs(90),
        ..settings()
    }
    .for_kind(Kind::LlamaServer);
    let pool = pool(&url, settings);
    assert_eq!(fetch(&pool, "/ok").await, "ok");
    // Idle just past the engine's keep-alive: the connection must not be handed the request.
    tokio::time::sleep(Duration::from_millis(5_100)).await;
    let response = pool.send(get("/ok")).await;
    let response = response.expect("the request went on a fresh connection");
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    assert_eq!(seen.closed.load(Ordering::SeqCst), 0, "no request lost");
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_llama_server_connection_is_not_reused_after_a_chunked_answer() {
    // Another kind reuses it, and the engine's close takes the next request with it: what the
    // gateway saw of llama-server before (a 502, "connection closed before message completed").
    let (url, seen) = closes_after_chunked_upstream().await;
    let other = pool(&url, settings().for_kind(Kind::Vllm));
    assert_eq!(fetch(&other, "/a").await, "ok");
    assert!(matches!(
        other.send(get("/b")).await,
        Err(PoolError::Exchange(_))
    ));
    assert_eq!(seen.closed.load(Ordering::SeqCst), 1);

    let (url, seen) = closes_after_chunked_upstream().await;
    let llama = pool(&url, settings().for_kind(Kind::LlamaServer));
    for _ in 0..3 {
        assert_eq!(
            fetch(&llama, "/a").await,
            "ok",
            "the answer itself is whole"
        );
    }
    assert_eq!(seen.closed.load(Ordering::SeqCst), 0, "no request lost");
    assert_eq!(
        seen.accepted.load(Ordering::SeqCst),
        3,
        "a new connection each"
    );
    assert_eq!(llama.idle_count(), 0);
}

#[tokio::test]
async fn at_most_max_idle_connections_are_kept() {
    let (url, seen) = upstream().await;
    let settings = PoolSettings {
        max_idle: 2,
        ..settings()
    };
    let pool = pool(&url, settings);
    // Four answers held open at once need four connections.
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(pool.send(get("/slow-end")).await.unwrap());
    }
    for response in held {
        response.into_body().collect().await.unwrap();
    }
    eventually("two connections closed", || {
        seen.closed.load(Ordering::SeqCst) == 2
    })
    .await;
    assert_eq!(seen.accepted.load(Ordering::SeqCst), 4);
    assert_eq!(pool.idle_count(), 2);
}

#[tokio::test]
async fn a_refused_connection_is_a_connect_error() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let pool = pool(&url, settings());
    let error = pool.send(get("/ok")).await.unwrap_err();
    assert!(matches!(error, PoolError::Connect(_)), "{error:?}");
}

#[tokio::test]
async fn a_tls_handshake_that_never_ends_is_bounded_by_the_connect_timeout() {
    // Accepts, then says nothing: the TCP connect succeeds and the handshake hangs.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let mut open = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            open.push(stream);
        }
    });
    let toml = format!(
        r#"
        [server]
        listen = "127.0.0.1:0"
        [upstreams.a]
        url = "https://{addr}"
        kind = "vllm"
        [upstreams.a.models.m]
        parallel = 1
        queue = 0
        queue_timeout = "1s"
        "#
    );
    let upstream = Config::from_toml_str(&toml)
        .unwrap()
        .upstreams
        .remove("a")
        .unwrap();
    let tls = UpstreamTls::load(&upstream).unwrap();
    let settings = PoolSettings {
        connect_timeout: Duration::from_millis(300),
        ..settings()
    };
    let connector = tls::connector(
        tls.as_ref(),
        settings.connect_timeout,
        Duration::from_secs(60),
    );
    let base = Base::parse(upstream.url.as_str()).unwrap();
    let pool = Pool::new(connector, &base, settings);
    let error = pool.send(get("/ok")).await.unwrap_err();
    assert!(matches!(error, PoolError::ConnectTimeout(_)), "{error:?}");
    silent.abort();
}
