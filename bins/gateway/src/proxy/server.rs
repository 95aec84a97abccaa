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
//!   ([`Refusals`]).
//!
//! The accept loop knows nothing about the gateway: it serves any handler, so the API and the
//! admin listener share it.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use prometheus_client::metrics::counter::Counter;
use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tracing::{debug, info, warn};

use crate::error::BoxError;
use crate::metrics::{Bound, Metrics};
use crate::proxy::refusals::Refusals;
use crate::shutdown::ShutdownSignal;
use shedding::{Member, Roster};

mod shedding;

/// How long a connection asked to close (shed, or past its request deadline) gets to finish
/// the goodbye before it is cut: enough to write a `GOAWAY`, too short to keep a new client
/// waiting for its place.
const GOODBYE: Duration = Duration::from_millis(100);

/// On shutdown, how long a connection with nothing in flight gets to finish the goodbye before
/// it is cut, and how often a busy one is looked at again (at most `header_read_timeout`): a
/// well-behaved HTTP/2 client answers the goodbye PING within a round trip and closes; one that
/// ignores the `GOAWAY` would otherwise hold the drain to `drain_grace`.
const DRAIN_GOODBYE: Duration = Duration::from_secs(1);

/// How often the accept loop, holding a new connection at the limit, looks again for an idle
/// connection to shed (one that was busy may have gone idle).
const SHED_RETRY: Duration = Duration::from_millis(250);

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

/// At the connection limit, with a new connection accepted: sheds the connection idle the
/// longest, and waits for a place (looking again every [`SHED_RETRY`] while every connection
/// is busy). `None` when the server stops meanwhile.
async fn make_room(
    name: &'static str,
    limit: &Arc<Semaphore>,
    roster: &Roster,
    counters: &ServerCounters,
    shutdown: &mut ShutdownSignal,
) -> Option<OwnedSemaphorePermit> {
    loop {
        if roster.shed_oldest_idle() {
            counters.idle_shed.inc();
            debug!(
                listener = name,
                "at the connection limit: closing the connection idle the longest"
            );
        }
        tokio::select! {
            biased;
            () = shutdown.fired() => return None,
            permit = Arc::clone(limit).acquire_owned() => return permit.ok(),
            () = tokio::time::sleep(SHED_RETRY) => {}
        }
    }
}

/// The first part of serving a connection: waits for its first byte and, on a TLS listener,
/// its handshake, both under `header_read_timeout`; `None` when the connection is to be dropped
/// (silent, failed handshake, shed, or the server stops), with whether it was asked to make
/// room already (an HTTP/2 preface came, but this task had not seen it yet).
async fn open(
    name: &'static str,
    (stream, peer): (TcpStream, SocketAddr),
    tls: Option<TlsAcceptor>,
    settings: &ServerSettings,
    counters: &ServerCounters,
    stopping: &mut ShutdownSignal,
    member: &Member,
) -> Option<(
    Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>,
    bool,
)> {
    // auto::Builder sniffs the protocol before hyper's own header timeout starts, so a client
    // that connects and stays silent is dropped here (or at shutdown: it has nothing in flight
    // to drain). One asked to make room before this task saw its first byte may have sent it
    // already (an HTTP/2 preface): it is served just far enough to say goodbye with a `GOAWAY`.
    let mut shed_early = false;
    let spoke = tokio::select! {
        biased;
        () = stopping.fired() => false,
        () = member.shed_asked() => {
            if tls.is_some() || !bytes_waiting(&stream) {
                return None;
            }
            shed_early = true;
            first_byte_within(&stream, settings.header_read_timeout).await
        }
        spoke = first_byte_within(&stream, settings.header_read_timeout) => spoke,
    };
    if !spoke {
        if !stopping.is_fired() {
            counters.header_timeout.inc();
        }
        debug!(listener = name, %peer, "no request within the header-read timeout");
        return None;
    }
    // On a TLS listener the handshake comes first, under the same bound as a request head.
    match tls {
        None => Some((Either::Left(stream), shed_early)),
        Some(acceptor) => {
            let handshake =
                tokio::time::timeout(settings.header_read_timeout, acceptor.accept(stream));
            let done = tokio::select! {
                biased;
                () = stopping.fired() => return None,
                () = member.shed_asked() => return None,
                done = handshake => done,
            };
            match done {
                Ok(Ok(stream)) => Some((Either::Right(stream), false)),
                Ok(Err(error)) => {
                    debug!(listener = name, %peer, %error, "TLS handshake failed");
                    None
                }
                Err(_elapsed) => {
                    counters.header_timeout.inc();
                    debug!(listener = name, %peer, "TLS handshake not done within the header-read timeout");
                    None
                }
            }
        }
    }
}

/// Serves one accepted connection (after the TLS handshake, with `tls`) until it ends, is idle
/// for too long, is shed, or the server stops; `permit` is its place under the connection
/// limit, `member` its place on the listener's roster of connections that may be shed.
#[expect(
    clippy::too_many_arguments,
    reason = "one connection's parts, handed over once from the accept loop"
)]
async fn serve_connection<S, B>(
    name: &'static str,
    builder: Arc<auto::Builder<TokioExecutor>>,
    (stream, peer): (TcpStream, SocketAddr),
    tls: Option<TlsAcceptor>,
    service: S,
    activity: Activity,
    settings: ServerSettings,
    counters: ServerCounters,
    mut stopping: ShutdownSignal,
    (permit, member): (OwnedSemaphorePermit, Member),
) where
    S: hyper::service::Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let Some((io, shed_early)) = open(
        name,
        (stream, peer),
        tls,
        &settings,
        &counters,
        &mut stopping,
        &member,
    )
    .await
    else {
        return;
    };
    let mut conn = pin!(
        builder
            .serve_connection(Refusals::new(TokioIo::new(io)), service)
            .into_owned()
    );
    // Polled once before anything may close it: with the client's bytes at hand, the protocol
    // is chosen and an HTTP/2 connection is set up. A graceful shutdown while hyper-util still
    // sniffs the protocol ends the connection at once, with no `GOAWAY` for an HTTP/2 client.
    if let Poll::Ready(result) = poll_once(conn.as_mut()).await {
        if let Err(error) = result {
            debug!(listener = name, %peer, %error, "connection ended with an error");
        }
        return;
    }
    let mut closing = shed_early;
    // After an idle close, how long the peer gets to finish the goodbye (an HTTP/2 graceful
    // shutdown waits for the peer's PING answer, which a hostile peer never sends), and while
    // requests still run then, how long until it looks again.
    let (mut cut_at, mut look_again) = (None, settings.header_read_timeout);
    // A shed connection gives its place to the new one at once (see `Watch::Shed`).
    let mut permit = (!shed_early).then_some(permit);
    if shed_early {
        conn.as_mut().graceful_shutdown();
        cut_at = Some(Instant::now() + GOODBYE);
    }
    let mut watchers = watchers(&mut stopping, &activity, &member, &settings);
    loop {
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(error) = result {
                    debug!(listener = name, %peer, %error, "connection ended with an error");
                }
                break;
            }
            Some(watch) = watchers.next() => match watch {
                // Told to close already: the second reason to close changes nothing.
                Watch::Stop | Watch::Idle | Watch::Shed | Watch::NoRequest if closing => {}
                Watch::Stop => {
                    // HTTP/1: an idle keep-alive connection closes now, a busy one after its
                    // answer; HTTP/2: `GOAWAY`, and the connection closes once its streams are
                    // done.
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    // A peer that ignores the `GOAWAY` is cut once nothing is in flight, rather
                    // than holding the drain open for `drain_grace` ([`DRAIN_GOODBYE`]).
                    look_again = settings.header_read_timeout.min(DRAIN_GOODBYE);
                    cut_at = Some(Instant::now() + look_again);
                }
                Watch::Idle => {
                    debug!(listener = name, %peer, "closing a connection idle for the client idle timeout");
                    counters.client_idle.inc();
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    cut_at = Some(Instant::now() + settings.header_read_timeout);
                }
                Watch::Shed | Watch::NoRequest => {
                    if matches!(watch, Watch::NoRequest) {
                        debug!(listener = name, %peer, "no request within the header-read timeout; closing");
                        counters.header_timeout.inc();
                    } else {
                        // Its place goes to the new connection now, not after the goodbye: an
                        // idle HTTP/2 flood never answers the PING, and the accept loop would
                        // wait out a `GOODBYE` per shed, one after the other.
                        permit.take();
                    }
                    // Nothing in flight: `GOAWAY` (HTTP/2) or a close, and a cut soon after.
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                    cut_at = Some(Instant::now() + GOODBYE);
                }
                Watch::Stalled => {
                    info!(
                        listener = name,
                        %peer,
                        client_write_timeout = ?settings.write_timeout,
                        "the client read none of its answer for the client write timeout; closing its connection"
                    );
                    counters.client_stall.inc();
                    // Dropping the connection drops the response bodies it holds: their slots
                    // go back and their engine connections close.
                    break;
                }
            },
            () = sleep_until_some(cut_at), if cut_at.is_some() => {
                if activity.in_flight() == 0 {
                    debug!(listener = name, %peer, "idle connection did not close; cutting it");
                    break;
                }
                // Requests are still running (or one slipped in as the idle close began): let
                // them finish, and look again a while later.
                cut_at = Some(Instant::now() + look_again);
            }
        }
    }
    drop(permit);
}

/// A connection's watchers, each polled only when its own waker fired.
type Watchers<'a> = FuturesUnordered<Pin<Box<dyn Future<Output = Watch> + Send + 'a>>>;

/// The watchers of one connection: the shutdown signal, the idle timeout, the write stall, the
/// listener's call to make room, and the deadline for a first request. Each ends at most once.
/// In a set that polls a future only when its own waker fired, not at every wake-up of the
/// connection's task (several per request: the client's bytes, the engine's answer), as
/// `select!` branches were, at about 1 700 instructions per request.
fn watchers<'a>(
    stopping: &'a mut ShutdownSignal,
    activity: &'a Activity,
    member: &'a Member,
    settings: &ServerSettings,
) -> Watchers<'a> {
    let (idle, write) = (settings.idle_timeout, settings.write_timeout);
    let first_request_by = activity.0.opened + settings.header_read_timeout;
    let watchers: Watchers<'a> = FuturesUnordered::new();
    watchers.push(Box::pin(async move {
        member.shed_asked().await;
        Watch::Shed
    }));
    watchers.push(Box::pin(async move {
        activity.no_request_by(first_request_by).await;
        Watch::NoRequest
    }));
    watchers.push(Box::pin(async move {
        stopping.fired().await;
        Watch::Stop
    }));
    watchers.push(Box::pin(async move {
        activity.idle_for(idle).await;
        Watch::Idle
    }));
    watchers.push(Box::pin(async move {
        activity.stalled_for(write).await;
        Watch::Stalled
    }));
    watchers
}

/// Which of a connection's watchers ended (see [`serve_connection`]).
#[derive(Debug, Clone, Copy)]
enum Watch {
    /// The server is stopping.
    Stop,
    /// No request in flight for the client idle timeout.
    Idle,
    /// An answer waited for the client to read it for the client write timeout.
    Stalled,
    /// The listener, at its connection limit, asked this idle connection to make room.
    Shed,
    /// No request began within the header-read timeout of the connection's accept.
    NoRequest,
}

/// Waits until the client has sent at least one byte (or closed), for at most `timeout`.
async fn first_byte_within(stream: &TcpStream, timeout: Duration) -> bool {
    let mut byte = [0_u8; 1];
    matches!(
        tokio::time::timeout(timeout, stream.peek(&mut byte)).await,
        Ok(Ok(n)) if n > 0
    )
}

/// Whether the client's bytes wait to be read now (without waiting for the runtime to learn
/// that the socket is readable).
fn bytes_waiting(stream: &TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    matches!(SockRef::from(stream).peek(&mut byte), Ok(n) if n > 0)
}

/// Polls `future` once: its output if it is done, `Pending` if not.
async fn poll_once<F: Future + ?Sized>(mut future: Pin<&mut F>) -> Poll<F::Output> {
    std::future::poll_fn(move |cx| Poll::Ready(future.as_mut().poll(cx))).await
}

/// Sleeps until `deadline`; forever when there is none.
async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// What one connection is doing: how many requests are in flight, since when none is, and
/// which answers wait for the client to read them.
#[derive(Debug, Clone)]
struct Activity(Arc<ActivityState>);

#[derive(Debug)]
struct ActivityState {
    /// When the connection was accepted.
    opened: Instant,
    in_flight: AtomicUsize,
    /// When the last request ended (or the connection opened).
    quiet_since: Mutex<Instant>,
    /// The responses that handed hyper a frame and have not been asked for the next one since,
    /// by request number, with the time of that frame: hyper asks again as soon as the client
    /// has room for more, so an old entry is a client that stopped reading.
    waiting: Mutex<HashMap<u64, Instant>>,
    /// Wakes [`Activity::stalled_for`] when `waiting` gets its first entry.
    first_waiting: Notify,
    /// Numbers the requests of the connection, for `waiting`.
    next_request: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        let now = Instant::now();
        Self(Arc::new(ActivityState {
            opened: now,
            in_flight: AtomicUsize::new(0),
            quiet_since: Mutex::new(now),
            waiting: Mutex::new(HashMap::new()),
            first_waiting: Notify::new(),
            next_request: AtomicU64::new(0),
        }))
    }

    /// A request began; it is in flight until the returned guard is dropped.
    fn begin(&self) -> Busy {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy {
            state: Arc::clone(&self.0),
            request: self.0.next_request.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Resolves once some response has waited `timeout` for the client to take its last frame.
    async fn stalled_for(&self, timeout: Duration) {
        loop {
            let oldest = self.0.waiting.lock().values().min().copied();
            let Some(since) = oldest else {
                // `notify_one` keeps a permit when nobody waits yet, so an entry added between
                // the look above and this wait is not missed.
                self.0.first_waiting.notified().await;
                continue;
            };
            let deadline = since + timeout;
            if Instant::now() >= deadline {
                return;
            }
            // The entry may go (hyper asked again) or be replaced meanwhile: look again then.
            tokio::time::sleep_until(deadline).await;
        }
    }

    /// Requests in flight now.
    fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// Since when no request has been in flight (the last one's end, or the accept).
    fn quiet_since(&self) -> Instant {
        *self.0.quiet_since.lock()
    }

    /// Resolves at `deadline` if no request has begun on the connection by then; never after
    /// one has.
    async fn no_request_by(&self, deadline: Instant) {
        tokio::time::sleep_until(deadline).await;
        if self.0.next_request.load(Ordering::Relaxed) > 0 {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the connection has had no request in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            // Read the time before the count: a request that ends in between moves the time on
            // and is seen on the next round.
            let quiet_since = *self.0.quiet_since.lock();
            if self.in_flight() > 0 {
                // Busy: look again later; the idle time starts when the last request ends.
                tokio::time::sleep(timeout).await;
                continue;
            }
            let deadline = quiet_since + timeout;
            if Instant::now() >= deadline && *self.0.quiet_since.lock() == quiet_since {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// One request in flight on a connection (see [`Activity::begin`]).
#[derive(Debug)]
struct Busy {
    state: Arc<ActivityState>,
    request: u64,
}

impl Busy {
    /// hyper asked the response for its next frame: the client took the previous ones.
    fn asked(&self) {
        self.state.waiting.lock().remove(&self.request);
    }

    /// The response handed hyper a frame: until hyper asks again, it waits on the client.
    fn handed_over(&self) {
        let mut waiting = self.state.waiting.lock();
        if waiting.is_empty() {
            self.state.first_waiting.notify_one();
        }
        waiting.insert(self.request, Instant::now());
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.asked();
        *self.state.quiet_since.lock() = Instant::now();
        self.state.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

pin_project! {
    /// A response body that keeps its request counted as in flight until the body is done (hyper
    /// drops it when the answer is sent, or when the client goes away), and tells its [`Busy`]
    /// when it waits on the client.
    #[derive(Debug)]
    struct Tracked<B> {
        #[pin]
        inner: B,
        busy: Busy,
    }
}

impl<B> Tracked<B> {
    fn new(inner: B, busy: Busy) -> Self {
        Self { inner, busy }
    }
}

impl<B: Body> Body for Tracked<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        this.busy.asked();
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(_))) = &polled {
            this.busy.handed_over();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
