//! Step 1: accept connections and serve them, until shutdown.
//!
//! - HTTP/1.1 and h2c (prior knowledge) on the same port, via hyper-util's `auto::Builder`.
//! - A header-read timeout: a connection that sends no bytes at all within it is closed before
//!   the protocol is even sniffed, and an HTTP/1 request head must be complete within it. hyper
//!   also starts that timer while a keep-alive connection waits for its next request, so idle
//!   HTTP/1 connections close after it too and cannot hold connection slots forever.
//! - A connection limit: at `max_connections` open connections the accept loop stops accepting
//!   (new connections wait in the kernel's backlog) until one closes.
//! - Graceful shutdown: on the shutdown signal the listener is closed, every connection is told
//!   to finish what it is doing (in-flight responses stream to their end, idle keep-alive
//!   connections close), and whatever is still open after the drain timeout is cut.
//!
//! The accept loop knows nothing about the gateway: it serves any handler, so the API and the
//! admin listener share it.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::error::BoxError;
use crate::shutdown::ShutdownSignal;

/// Settings of one listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerSettings {
    /// How long a client may take to send a request head (and its first byte).
    pub(crate) header_read_timeout: Duration,
    /// How many connections may be open at once.
    pub(crate) max_connections: usize,
    /// How long a graceful shutdown waits for open connections before cutting them.
    pub(crate) drain_timeout: Duration,
}

/// Serves `listener` with `handler` until `shutdown` fires, then drains.
///
/// `handler` is called once per request with the peer's address; it must answer every request
/// itself (it cannot fail).
pub(crate) async fn serve<H, Fut, B>(
    name: &'static str,
    listener: TcpListener,
    settings: ServerSettings,
    handler: H,
    mut shutdown: ShutdownSignal,
) where
    H: Fn(Request<Incoming>, SocketAddr) -> Fut + Clone + Send + Sync + 'static,
    Fut: Future<Output = Response<B>> + Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(settings.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let graceful = GracefulShutdown::new();
    let connection_limit = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let mut connections = JoinSet::new();

    loop {
        // Reap finished connection tasks so the set does not grow with the server's uptime.
        while connections.try_join_next().is_some() {}

        let permit = tokio::select! {
            biased;
            () = shutdown.fired() => break,
            permit = Arc::clone(&connection_limit).acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_closed) => break, // never closed, but stopping is the safe reading
            },
        };
        let (stream, peer) = tokio::select! {
            biased;
            () = shutdown.fired() => break,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Per-connection errors (reset before accept) and resource exhaustion
                    // (EMFILE) both land here; back off briefly instead of spinning.
                    warn!(listener = name, %error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        if let Err(error) = stream.set_nodelay(true) {
            debug!(listener = name, %peer, %error, "set_nodelay failed");
        }

        let handler = handler.clone();
        let service = service_fn(move |req| {
            let answer = handler(req, peer);
            async move { Ok::<_, Infallible>(answer.await) }
        });
        let builder = Arc::clone(&builder);
        let watcher = graceful.watcher();
        let header_read_timeout = settings.header_read_timeout;
        let mut stopping = shutdown.clone();
        connections.spawn(async move {
            // auto::Builder sniffs the protocol before hyper's own header timeout starts, so a
            // client that connects and stays silent is dropped here (or at shutdown: it has
            // nothing in flight to drain).
            let spoke = tokio::select! {
                biased;
                () = stopping.fired() => false,
                spoke = first_byte_within(&stream, header_read_timeout) => spoke,
            };
            if !spoke {
                debug!(listener = name, %peer, "no request within the header-read timeout");
                return;
            }
            let conn = builder.serve_connection(TokioIo::new(stream), service);
            if let Err(error) = watcher.watch(conn.into_owned()).await {
                debug!(listener = name, %peer, error = %error, "connection ended with an error");
            }
            drop(permit);
        });
    }

    drop(listener);
    info!(
        listener = name,
        open = graceful.count(),
        "draining connections"
    );
    if tokio::time::timeout(settings.drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        warn!(
            listener = name,
            drain_timeout = ?settings.drain_timeout,
            "connections still open after the drain timeout; closing them"
        );
    }
    connections.shutdown().await;
}

/// Waits until the client has sent at least one byte (or closed), for at most `timeout`.
async fn first_byte_within(stream: &TcpStream, timeout: Duration) -> bool {
    let mut byte = [0_u8; 1];
    matches!(
        tokio::time::timeout(timeout, stream.peek(&mut byte)).await,
        Ok(Ok(n)) if n > 0
    )
}
