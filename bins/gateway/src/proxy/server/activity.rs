//! What one connection is doing ([`Activity`]): requests in flight, since when none is, and
//! which answers wait for the client to read them. Each request's response body is
//! [`Tracked`], so the connection's watchers see its start, its end and a client that stopped
//! reading.

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use pin_project_lite::pin_project;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What one connection is doing: how many requests are in flight, since when none is, and
/// which answers wait for the client to read them.
#[derive(Debug, Clone)]
pub(super) struct Activity(Arc<ActivityState>);

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
    pub(super) fn new() -> Self {
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

    /// When the connection was accepted.
    pub(super) fn opened(&self) -> Instant {
        self.0.opened
    }

    /// A request began; it is in flight until the returned guard is dropped.
    pub(super) fn begin(&self) -> Busy {
        self.0.in_flight.fetch_add(1, Ordering::SeqCst);
        Busy {
            state: Arc::clone(&self.0),
            request: self.0.next_request.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Resolves once some response has waited `timeout` for the client to take its last frame.
    pub(super) async fn stalled_for(&self, timeout: Duration) {
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
    pub(super) fn in_flight(&self) -> usize {
        self.0.in_flight.load(Ordering::SeqCst)
    }

    /// Since when no request has been in flight (the last one's end, or the accept).
    pub(super) fn quiet_since(&self) -> Instant {
        *self.0.quiet_since.lock()
    }

    /// Resolves at `deadline` if no request has begun on the connection by then; never after
    /// one has.
    pub(super) async fn no_request_by(&self, deadline: Instant) {
        tokio::time::sleep_until(deadline).await;
        if self.0.next_request.load(Ordering::Relaxed) > 0 {
            std::future::pending::<()>().await;
        }
    }

    /// Resolves once the connection has had no request in flight for `timeout`.
    pub(super) async fn idle_for(&self, timeout: Duration) {
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
pub(super) struct Busy {
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
    pub(super) struct Tracked<B> {
        #[pin]
        inner: B,
        busy: Busy,
    }
}

impl<B> Tracked<B> {
    pub(super) fn new(inner: B, busy: Busy) -> Self {
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
