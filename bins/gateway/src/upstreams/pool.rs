//! The request path's connections to one upstream: a small pool of HTTP/1.1 connections, kept
//! in the upstream's own state.
//!
//! It replaces hyper-util's general-purpose client on the hot path, whose costs per request were
//! measured (docs/benchmarks.md): a pool shared by every host, keyed by scheme and authority in a
//! `HashMap`, and one task spawned per request only to wait until the connection could be
//! reused. Here:
//!
//! - **Checkout** takes the most recently used idle connection of this upstream (one lock, no
//!   lookup) and checks that hyper still calls it ready; a closed one is dropped on the way.
//!   None left: a new connection is made, under `connect_timeout` for the TCP connect and the
//!   TLS handshake together, through the upstream's [`Connector`] (TCP keepalive, and rustls for
//!   an `https` upstream).
//! - **Each connection is driven by a task of its own** ([`Driver`]), which reads the answer and
//!   notices a peer that closes the connection while it is idle.
//! - **Return.** As soon as the response head is in, the connection goes back to the idle list
//!   if hyper already calls it ready (the whole answer was read). Otherwise (an answer still
//!   streaming) it is parked with its driver, which puts it back once hyper is ready for the
//!   next request, that is once the answer has been read to its end. An answer whose body is
//!   dropped before its end is drained from what hyper has already buffered, or the connection
//!   is closed: it comes back only when nothing of the old answer is left. A request
//!   dropped before its response head (a timeout, a client that left) cancels the exchange, and
//!   hyper closes that connection too. So an idle connection never carries the rest of an old
//!   answer.
//! - **Bounds.** At most `max_idle` connections are kept idle (the oldest goes first), and none
//!   longer than `idle_timeout`: a sweeper task runs while there are idle connections and
//!   closes the expired ones.
//! - **A stale connection.** An idle connection the upstream closed just as a request was given
//!   to it: hyper hands the unsent request back, and it goes once more on a new connection. If
//!   the request was already written when the close arrived, it is not sent again (the engine
//!   may have started it): the client gets `502 upstream-bad-response`, as from any proxy. The driver
//!   notices an upstream's idle close at once, so this needs the close and the reuse to meet
//!   within the same instant; an `idle_timeout` below the engine's own keep-alive timeout rules
//!   it out, which is why the pool of an engine whose keep-alive timeout is known keeps
//!   connections idle for at most 4 s (`Kind::max_pool_idle`: llama-server's cpp-httplib and
//!   vLLM's uvicorn close them at 5 s).
//! - **A close after a chunked answer.** llama-server closes the connection right after each
//!   streamed (chunked) answer, without saying `Connection: close`; the queued request that the
//!   freed slot lets go at that instant would meet the close. For such a kind
//!   (`Kind::closes_after_chunked_answer`) a connection that carried a chunked answer is not
//!   reused: its handle is dropped and hyper closes it once the answer is read.
//!
//! Only HTTP/1.1: the upstream connector offers no other protocol (see [`tls`](crate::tls)).
//! The probes ([`probe`](crate::upstreams::probe)) keep hyper-util's client: they make a new
//! connection each time on purpose, and are not on the request path.

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures::task::AtomicWaker;
use http::{Request, Response, header};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use slotgate_config::Kind;
use tower_service::Service;
use tracing::debug;

use crate::support::base::Base;
use crate::support::error::BoxError;
use crate::tls::Connector;

/// The body of every request the pool sends: the request path has read it whole.
type Sender = SendRequest<Full<Bytes>>;

/// How a [`Pool`] bounds its connections.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolSettings {
    /// The longest a new connection may take, TCP connect and TLS handshake together.
    pub(crate) connect_timeout: Duration,
    /// How long a connection may sit idle before it is closed.
    pub(crate) idle_timeout: Duration,
    /// Most connections kept idle at once.
    pub(crate) max_idle: usize,
    /// Whether a connection that carried a chunked answer may carry another request
    /// ([`Kind::closes_after_chunked_answer`]).
    pub(crate) reuse_after_chunked: bool,
}

impl PoolSettings {
    /// These settings with `idle_timeout` cut below the engine's own keep-alive timeout
    /// ([`Kind::max_pool_idle`]), and no reuse after a chunked answer where the engine closes
    /// the connection then ([`Kind::closes_after_chunked_answer`]): a connection the engine is
    /// about to close is never reused.
    pub(crate) fn for_kind(self, kind: Kind) -> Self {
        let idle_timeout = kind
            .max_pool_idle()
            .map_or(self.idle_timeout, |bound| bound.min(self.idle_timeout));
        Self {
            idle_timeout,
            reuse_after_chunked: self.reuse_after_chunked && !kind.closes_after_chunked_answer(),
            ..self
        }
    }
}

/// Why [`Pool::send`] got no response head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PoolError {
    /// No connection could be made (refused, unreachable, TLS handshake failed): nothing was
    /// sent.
    #[error("connecting to the upstream failed")]
    Connect(#[source] BoxError),
    /// No connection within `connect_timeout`: nothing was sent.
    #[error("no connection to the upstream within {0:?}")]
    ConnectTimeout(Duration),
    /// The exchange failed once the request was handed to a connection (it may have been sent).
    #[error("the exchange with the upstream failed")]
    Exchange(#[source] hyper::Error),
}

/// The connections of one upstream. Cheap to share: the request path borrows it from the
/// upstream's state.
#[derive(Debug)]
pub(crate) struct Pool {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    connector: Connector,
    /// `scheme://authority/`: what the connector dials.
    root: http::Uri,
    /// The `Host` field of every request.
    host: http::HeaderValue,
    settings: PoolSettings,
    /// How the connections speak HTTP/1.1 (hyper's defaults).
    builder: http1::Builder,
    idle: Mutex<IdleList>,
}

#[derive(Debug, Default)]
struct IdleList {
    /// Oldest first; checkout takes from the back, the most recently used.
    conns: VecDeque<IdleConn>,
    /// Whether a sweeper task is running.
    sweeping: bool,
}

#[derive(Debug)]
struct IdleConn {
    conn: Conn,
    since: Instant,
}

/// A connection's request handle and the place its driver looks for it.
#[derive(Debug)]
struct Conn {
    sender: Sender,
    home: Arc<Home>,
}

/// Where a connection whose answer is still streaming waits for its driver to take it back.
#[derive(Debug, Default)]
struct Home {
    parked: Mutex<Option<Sender>>,
    /// The driver's waker, to look at `parked` again.
    driver: AtomicWaker,
}

impl Pool {
    /// A pool of connections to `base` through `connector`; makes no connection yet.
    pub(crate) fn new(connector: Connector, base: &Base, settings: PoolSettings) -> Self {
        Self {
            inner: Arc::new(Inner {
                connector,
                root: base.root().clone(),
                host: base.host().clone(),
                settings,
                builder: http1::Builder::new(),
                idle: Mutex::new(IdleList::default()),
            }),
        }
    }

    /// Sends `req` (origin-form URI; its `Host` is set here) on an idle connection or a new
    /// one, and waits for the response head. The connection goes back to the pool by itself
    /// once the answer has been read to its end.
    pub(crate) async fn send(
        &self,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<Incoming>, PoolError> {
        req.headers_mut()
            .insert(header::HOST, self.inner.host.clone());
        if let Some(mut conn) = self.inner.checkout() {
            match conn.sender.try_send_request(req).await {
                Ok(response) => {
                    self.inner.release_after(conn, &response);
                    return Ok(response);
                }
                Err(mut failed) => match failed.take_message() {
                    // Never written: the connection closed as it was handed the request. The
                    // request goes on a new connection instead.
                    Some(unsent) => {
                        debug!(error = %failed.error(), "a pooled connection closed before its request went out; using a new one");
                        req = unsent;
                    }
                    None => return Err(PoolError::Exchange(failed.into_error())),
                },
            }
        }
        // Boxed: connecting is the cold path, and its future is large.
        let mut conn = Box::pin(Arc::clone(&self.inner).connect()).await?;
        let response = conn
            .sender
            .send_request(req)
            .await
            .map_err(PoolError::Exchange)?;
        self.inner.release_after(conn, &response);
        Ok(response)
    }

    /// How many connections are idle now.
    #[cfg(test)]
    fn idle_count(&self) -> usize {
        self.inner.idle.lock().conns.len()
    }
}

impl Inner {
    /// The most recently used idle connection that hyper still calls ready.
    fn checkout(&self) -> Option<Conn> {
        let mut idle = self.idle.lock();
        while let Some(entry) = idle.conns.pop_back() {
            // Not ready means closed: an idle connection's driver has already asked for the
            // next request. One past its idle time is left to close.
            if entry.conn.sender.is_ready() && entry.since.elapsed() < self.settings.idle_timeout {
                return Some(entry.conn);
            }
        }
        None
    }

    /// [`Inner::release`], unless `response` is chunked and the engine closes the connection
    /// after such an answer: then the handle is dropped, and hyper closes the connection once
    /// the answer has been read (the answer itself is not cut).
    fn release_after<B>(self: &Arc<Self>, conn: Conn, response: &Response<B>) {
        if self.settings.reuse_after_chunked
            || !response.headers().contains_key(header::TRANSFER_ENCODING)
        {
            self.release(conn);
        }
    }

    /// Back to the idle list if the answer is already read; otherwise parked with the driver,
    /// which returns it when hyper is ready for the next request.
    fn release(self: &Arc<Self>, conn: Conn) {
        if conn.sender.is_ready() {
            self.put_idle(conn);
        } else if !conn.sender.is_closed() {
            *conn.home.parked.lock() = Some(conn.sender);
            conn.home.driver.wake();
        }
    }

    /// Adds a ready connection to the idle list, within `max_idle`.
    fn put_idle(self: &Arc<Self>, conn: Conn) {
        if self.settings.max_idle == 0 {
            return;
        }
        let since = Instant::now();
        let mut idle = self.idle.lock();
        if idle.conns.len() >= self.settings.max_idle {
            // The oldest goes: it is the likeliest to have been closed by the upstream.
            idle.conns.pop_front();
        }
        idle.conns.push_back(IdleConn { conn, since });
        if !idle.sweeping {
            idle.sweeping = true;
            tokio::spawn(sweep(Arc::downgrade(self), self.settings.idle_timeout));
        }
    }

    /// A new connection, its driver spawned.
    async fn connect(self: Arc<Self>) -> Result<Conn, PoolError> {
        let mut connector = self.connector.clone();
        let timeout = self.settings.connect_timeout;
        let connecting = async {
            poll_fn(|cx| connector.poll_ready(cx))
                .await
                .map_err(PoolError::Connect)?;
            connector
                .call(self.root.clone())
                .await
                .map_err(PoolError::Connect)
        };
        let io = tokio::time::timeout(timeout, connecting)
            .await
            .map_err(|_elapsed| PoolError::ConnectTimeout(timeout))??;
        // An HTTP/1 handshake does no I/O: it only sets the connection up.
        let (sender, connection) = self
            .builder
            .handshake(io)
            .await
            .map_err(|error| PoolError::Connect(Box::new(error)))?;
        let home = Arc::new(Home::default());
        tokio::spawn(Driver {
            connection,
            home: Arc::clone(&home),
            pool: Arc::downgrade(&self),
        });
        Ok(Conn { sender, home })
    }
}

pin_project! {
    /// Drives one connection until it closes, and puts its request handle back in the pool
    /// when hyper is ready for the next request.
    struct Driver<C> {
        #[pin]
        connection: C,
        home: Arc<Home>,
        pool: Weak<Inner>,
    }
}

impl<C> Future for Driver<C>
where
    C: Future<Output = hyper::Result<()>>,
{
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        if let Poll::Ready(result) = this.connection.poll(cx) {
            if let Err(error) = result {
                debug!(%error, "upstream connection ended with an error");
            }
            // A handle parked here is dropped with the last reference to `home`.
            this.home.parked.lock().take();
            return Poll::Ready(());
        }
        // Registered before looking, so a handle parked after the look wakes this task.
        this.home.driver.register(cx.waker());
        let parked = this.home.parked.lock().take();
        if let Some(mut sender) = parked {
            match sender.poll_ready(cx) {
                Poll::Ready(Ok(())) => {
                    if let Some(pool) = this.pool.upgrade() {
                        pool.put_idle(Conn {
                            sender,
                            home: Arc::clone(this.home),
                        });
                    }
                }
                // Closed: dropping the handle is all there is to do.
                Poll::Ready(Err(_closed)) => {}
                // The answer is still being read; hyper wakes this task when it is done.
                Poll::Pending => *this.home.parked.lock() = Some(sender),
            }
        }
        Poll::Pending
    }
}

/// Closes idle connections past `idle_timeout` while the pool has any; ends when it has none,
/// or when the pool itself is gone.
async fn sweep(pool: Weak<Inner>, idle_timeout: Duration) {
    let mut next = idle_timeout;
    loop {
        tokio::time::sleep(next).await;
        let Some(pool) = pool.upgrade() else { return };
        let mut idle = pool.idle.lock();
        let now = Instant::now();
        // Dropping a handle makes its driver close the connection.
        idle.conns.retain(|entry| {
            entry.conn.sender.is_ready() && now.duration_since(entry.since) < idle_timeout
        });
        let Some(oldest) = idle.conns.front() else {
            idle.sweeping = false;
            return;
        };
        // At least a millisecond, so a clock that does not move cannot make this spin.
        next = idle_timeout
            .saturating_sub(now.duration_since(oldest.since))
            .max(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests;
