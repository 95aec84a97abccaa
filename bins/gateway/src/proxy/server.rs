//! Step 1: accept connections and serve them, until shutdown.
//!
//! - HTTP/1.1 and h2c (prior knowledge) on the same port, via hyper-util's `auto::Builder`.
//! - TLS when the listener has a certificate ([`tls::listener`](crate::tls::listener)): the
//!   handshake (ALPN `h2` or `http/1.1`) must end within the header-read timeout (a timed-out
//!   one counts as `bound="header_timeout"`), then the decrypted connection is served exactly
//!   like a plain one, under every bound below.
//! - A header-read timeout: a connection that sends no bytes at all within it is closed before
//!   the protocol is even sniffed, and an HTTP/1 request head must be complete within it. hyper
//!   also starts that timer while a keep-alive connection waits for its next request, so idle
//!   HTTP/1 connections close after it too and cannot hold connection slots forever. hyper
//!   closes such a connection without an answer (HTTP/1 has no way to tell a client that never
//!   finished its head); `slotgate_bounds_total{bound="header_timeout"}` counts the silent ones.
//! - An idle timeout, `client_idle_timeout`, for every connection and HTTP/2 above all: hyper
//!   has no header timeout there, so a client that sends the preface and then nothing would hold
//!   its connection forever. A connection with no request in flight for that long is shut down
//!   gracefully (HTTP/2: `GOAWAY`); counted as `bound="client_idle"`.
//! - HTTP/2 keep-alive PINGs every `h2_keep_alive_interval`; a peer that does not answer within
//!   the same time is cut. And an explicit cap of streams per connection,
//!   `h2_max_concurrent_streams`, so one connection cannot carry hundreds of requests.
//! - TCP keepalive (`tcp_keepalive`) on every accepted socket, so the kernel notices a client
//!   host that vanished without a FIN.
//! - At most 128 KiB of unsent answer in the kernel per connection (`TCP_NOTSENT_LOWAT`), so the
//!   client-write stall check below sees a slow reader's progress every 64 KiB or so rather than
//!   every few MiB, and a client that stops reading pins little kernel memory.
//! - A client-write stall timeout, `client_write_timeout`: hyper asks a response body for its
//!   next frame only once the client has taken the previous ones (HTTP/1: room in the write
//!   buffer; HTTP/2: flow-control window). A response whose frame has waited that long for the
//!   client to read it means a client that stopped reading; its connection is closed, which drops
//!   the body and so gives the slot back and closes the engine connection. A slow reader that
//!   keeps taking a few hundred KiB per `client_write_timeout` is never cut (HTTP/2: as often as
//!   its client library sends `WINDOW_UPDATE`s). HTTP/2: the whole connection goes, since hyper
//!   offers no way to reset one stream from outside its body; counted as `bound="client_stall"`.
//! - A request deadline: a connection that has begun no request within `header_read_timeout`
//!   of being accepted is closed (HTTP/2 with a `GOAWAY`): the HTTP/2 preface and `SETTINGS`
//!   are not a request, and hyper's own header timeout covers HTTP/1 only. Counted as
//!   `bound="header_timeout"`.
//! - A connection limit: at `max_connections` open connections, a new connection is admitted
//!   by closing the one idle the longest ([`shedding`]: nothing in flight; HTTP/2 with a
//!   `GOAWAY`), counted as `bound="idle_shed"`; with none idle, it waits until one closes. The
//!   admin listener has a loop and a cap of its own, so a flood on the API port cannot starve
//!   `/healthz`, and sheds the same way, so an idle flood on the admin port cannot either.
//! - Graceful shutdown: on the shutdown signal the listener is closed, every connection is told
//!   to finish what it is doing (in-flight responses stream to their end, idle keep-alive
//!   connections close at once: HTTP/1 with a FIN, HTTP/2 with a `GOAWAY`), and whatever is
//!   still open after the drain timeout is cut. A connection with nothing in flight that has not
//!   closed 1 s after the signal (at most `header_read_timeout`: an HTTP/2 peer that ignores
//!   the `GOAWAY`) is cut then, so idle peers never hold the drain to `drain_grace`.
//! - hyper's own answers to a malformed HTTP/1 head (400, 414, 431) go out as problem documents
//!   ([`Refusals`](crate::proxy::refusals::Refusals)).
//!
//! The accept loop knows nothing about the gateway: it serves any handler, so the API and the
//! admin listener share it.
//!
//! The parts: this module's accept loop ([`serve`]) and its drain; [`connection`] (one
//! connection's life and the watchers that end it); [`activity`] (what a connection is doing,
//! seen through its response bodies); [`shedding`] (room at the connection limit).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use hyper_util::server::conn::auto;
use prometheus_client::metrics::counter::Counter;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tracing::{debug, info, warn};

use crate::metrics::{Bound, Metrics};
use crate::support::error::BoxError;
use crate::support::shutdown::ShutdownSignal;
use activity::{Activity, Tracked};
use connection::serve_connection;
use shedding::{Roster, make_room};

mod activity;
mod connection;
mod shedding;

/// Most bytes of an answer the kernel may hold unsent for one client connection
/// (`TCP_NOTSENT_LOWAT`), beyond what the client's receive window has taken.
///
/// Without it Linux grows the send buffer to the maximum of `net.ipv4.tcp_wmem` (4 MiB by
/// default) and reports the socket writable again only once a third of that has drained, so a
/// client reading 800 KB/s left one piece of its answer waiting over a second and was cut as a
/// stalled one by a 1 s `client_write_timeout`. With the cap, hyper is asked for more after every
/// 64 KiB or so the client takes, so the stall check sees a live reader as live; and a reader that
/// stops pins 128 KiB of kernel memory here instead of megabytes.
#[cfg(any(target_os = "linux", target_os = "android"))]
const UNSENT_LOW_WATER: u32 = 128 * 1024;

/// Settings of one listener.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServerSettings {
    /// How long a client may take to send a request head (and its first byte).
    pub(crate) header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight.
    pub(crate) idle_timeout: Duration,
    /// How many connections may be open at once.
    pub(crate) max_connections: usize,
    /// Most HTTP/2 streams open at once on one connection.
    pub(crate) h2_max_concurrent_streams: u32,
    /// HTTP/2 PING interval, and how long a PING may go unanswered.
    pub(crate) h2_keep_alive_interval: Duration,
    /// TCP keepalive idle time on accepted sockets.
    pub(crate) tcp_keepalive: Duration,
    /// Longest a response frame may wait for the client to take it.
    pub(crate) write_timeout: Duration,
    /// How long a graceful shutdown waits for open connections before cutting them.
    pub(crate) drain_timeout: Duration,
}

/// The counters a listener keeps of the bounds it enforces.
#[derive(Debug, Clone)]
pub(crate) struct ServerCounters {
    header_timeout: Counter,
    client_idle: Counter,
    client_stall: Counter,
    idle_shed: Counter,
}

impl ServerCounters {
    /// The listener's handles in `metrics`.
    pub(crate) fn new(metrics: &Metrics) -> Self {
        Self {
            header_timeout: metrics.bound(Bound::HeaderTimeout),
            client_idle: metrics.bound(Bound::ClientIdle),
            client_stall: metrics.bound(Bound::ClientStall),
            idle_shed: metrics.bound(Bound::IdleShed),
        }
    }
}

/// Serves `listener` with `handler` until `shutdown` fires, then drains; speaks TLS through
/// `tls` when given.
///
/// `handler` is called once per request with the peer's address; it must answer every request
/// itself (it cannot fail).
pub(crate) async fn serve<H, Fut, B>(
    name: &'static str,
    listener: TcpListener,
    settings: ServerSettings,
    counters: ServerCounters,
    tls: Option<TlsAcceptor>,
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
    builder
        .http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(settings.h2_max_concurrent_streams)
        .keep_alive_interval(settings.h2_keep_alive_interval)
        .keep_alive_timeout(settings.h2_keep_alive_interval);
    let builder = Arc::new(builder);
    let keepalive = TcpKeepalive::new().with_time(settings.tcp_keepalive);
    let connection_limit = Arc::new(Semaphore::new(settings.max_connections.max(1)));
    let roster = Arc::new(Roster::default());
    let mut connections = JoinSet::new();

    loop {
        // Reap finished connection tasks so the set does not grow with the server's uptime.
        while connections.try_join_next().is_some() {}

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
        let permit = match Arc::clone(&connection_limit).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_full) => {
                let room = make_room(name, &connection_limit, &roster, &counters, &mut shutdown);
                match room.await {
                    Some(permit) => permit,
                    None => break,
                }
            }
        };
        if let Err(error) = stream.set_nodelay(true) {
            debug!(listener = name, %peer, %error, "set_nodelay failed");
        }
        if let Err(error) = SockRef::from(&stream).set_tcp_keepalive(&keepalive) {
            debug!(listener = name, %peer, %error, "setting TCP keepalive failed");
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if let Err(error) = SockRef::from(&stream).set_tcp_notsent_lowat(UNSENT_LOW_WATER) {
            debug!(listener = name, %peer, %error, "setting TCP_NOTSENT_LOWAT failed");
        }

        let activity = Activity::new();
        let member = roster.join(&activity);
        let handler = handler.clone();
        let requests = activity.clone();
        let service = service_fn(move |req| {
            let busy = requests.begin();
            // Boxed: hyper keeps a connection's request future in an allocation of its own for
            // as long as the connection lives, sized for the future's type. The handler's future
            // is several KiB (and an `async` block holding one while awaiting it takes twice
            // that); boxed, the connection keeps a pointer, and the request's state is freed as
            // soon as its response head is out instead of staying resident while it streams.
            let answer = Box::pin(handler(req, peer));
            async move { Ok::<_, Infallible>(answer.await.map(|body| Tracked::new(body, busy))) }
        });
        connections.spawn(serve_connection(
            name,
            Arc::clone(&builder),
            (stream, peer),
            tls.clone(),
            service,
            activity,
            settings,
            counters.clone(),
            shutdown.clone(),
            (permit, member),
        ));
    }

    drop(listener);
    info!(
        listener = name,
        open = connections.len(),
        "draining connections"
    );
    let drained = tokio::time::timeout(settings.drain_timeout, async {
        while connections.join_next().await.is_some() {}
    });
    if drained.await.is_err() {
        warn!(
            listener = name,
            drain_timeout = ?settings.drain_timeout,
            "connections still open after the drain timeout; closing them"
        );
    }
    connections.shutdown().await;
}
