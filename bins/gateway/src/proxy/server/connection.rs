//! One connection, from accept to close: its first byte and TLS handshake under
//! `header_read_timeout` ([`open`]), then hyper serving it ([`serve_connection`]) while its
//! watchers end it gracefully or cut it: the shutdown signal (drain), the idle timeout, the
//! write stall, the listener's call to make room, and the deadline for a first request.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;
use tracing::{debug, info};

use super::{ServerCounters, ServerSettings};
use crate::proxy::refusals::Refusals;
use crate::proxy::server::activity::Activity;
use crate::proxy::server::shedding::Member;
use crate::support::error::BoxError;
use crate::support::shutdown::ShutdownSignal;

/// How long a connection asked to close (shed, or past its request deadline) gets to finish
/// the goodbye before it is cut: enough to write a `GOAWAY`, too short to keep a new client
/// waiting for its place.
const GOODBYE: Duration = Duration::from_millis(100);

/// On shutdown, how long a connection with nothing in flight gets to finish the goodbye before
/// it is cut, and how often a busy one is looked at again (at most `header_read_timeout`): a
/// well-behaved HTTP/2 client answers the goodbye PING within a round trip and closes; one that
/// ignores the `GOAWAY` would otherwise hold the drain to `drain_grace`.
const DRAIN_GOODBYE: Duration = Duration::from_secs(1);

/// The first part of serving a connection: waits for its first byte and, on a TLS listener,
/// its handshake, both under `header_read_timeout`; `None` when the connection is to be dropped
/// (silent, failed handshake, shed, or the server stops), with whether it was asked to make
/// room already (an HTTP/2 preface came, but this task had not seen it yet).
pub(super) async fn open(
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
    let first = tokio::select! {
        biased;
        () = stopping.fired() => return None,
        () = member.shed_asked() => {
            if tls.is_some() || !bytes_waiting(&stream) {
                return None;
            }
            shed_early = true;
            first_byte_within(&stream, settings.header_read_timeout).await
        }
        first = first_byte_within(&stream, settings.header_read_timeout) => first,
    };
    match first {
        FirstByte::Spoke => {}
        FirstByte::Left => {
            debug!(listener = name, %peer, "closed by the client before a request");
            return None;
        }
        FirstByte::Silent => {
            if !stopping.is_fired() {
                counters.header_timeout.inc();
            }
            debug!(listener = name, %peer, "no request within the header-read timeout");
            return None;
        }
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
pub(super) async fn serve_connection<S, B>(
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
    let first_request_by = activity.opened() + settings.header_read_timeout;
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
async fn first_byte_within(stream: &TcpStream, timeout: Duration) -> FirstByte {
    let mut byte = [0_u8; 1];
    match tokio::time::timeout(timeout, stream.peek(&mut byte)).await {
        Ok(Ok(n)) if n > 0 => FirstByte::Spoke,
        Ok(_) => FirstByte::Left,
        Err(_elapsed) => FirstByte::Silent,
    }
}

/// How a new connection began ([`first_byte_within`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FirstByte {
    /// Its first byte came in time.
    Spoke,
    /// The client closed it (or it failed) before sending anything: a port check, a client
    /// that gave up. Not a timeout.
    Left,
    /// Nothing came within the header-read timeout.
    Silent,
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
