//! The access log: one structured line per API request, at tracing target `slotgate::access`
//! (level `info`), written when the request is over — its response body ended, failed or was
//! dropped, or the request was given up before it had a response (the client left while it
//! queued or waited for the engine's head).
//!
//! The line carries `request_id`, `method`, `path`, `model` (the configured model, after
//! aliases), `upstream`, `status` (what the client got), `outcome`, `reason` (for a refusal: the
//! same word as `slotgate_rejections_total`), `queue_wait_ms`, `ttft_ms` (from sending the
//! request to the engine until the first body frame that carries data, as
//! `slotgate_time_to_first_token_seconds`), `duration_ms` (from the request's arrival), `bytes_in`
//! (request body), `bytes_out` (response body), `key_name`: the name of the client's API key,
//! never the key, and for a request whose engine reported its cached prompt tokens,
//! `cached_tokens` (as reported) with `cached_tokens_predicted` (what cache-aware routing
//! expected the host to hold, for a request it placed). Fields that do not apply (no upstream was chosen, no token came) are left out.
//!
//! `outcome` is one of `completed`, `upstream_status_error` (the engine answered 5xx),
//! `upstream_error` (no usable answer: a refused or failed connection, a timeout, an answer cut
//! or stalled mid-way), `client_gone` (the client left first) and `refused` (the gateway
//! refused the request itself: see `reason`).
//!
//! The parts of the request path that learn something write it into a per-request [`Access`]
//! (a shared record of atomics and set-once cells: no lock), and [`Logged`], the outermost
//! response body, writes the line when the body is done. A record dropped without a line (the
//! request's future was dropped) writes its own, as `client_gone`. `[server] access_log = false`
//! turns it off: [`Access::start`] then makes an empty handle whose every call does nothing.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;
use bytes::{Buf, Bytes};
use http::{HeaderValue, Method, StatusCode};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tracing::info;

use crate::proxy::route::Route;
use crate::support::error::BoxError;
use crate::upstreams::state::UpstreamState;

/// The tracing target of the access log.
pub(crate) const TARGET: &str = "slotgate::access";

/// The longest path written into a line, in bytes: a client chooses it.
const PATH_LIMIT: usize = 256;

/// How a request ended, as the access log's `outcome` says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Outcome {
    /// The answer ended normally (the engine's status below 500).
    Completed = 1,
    /// The engine answered with a 5xx status.
    UpstreamStatusError = 2,
    /// No usable answer came from the engine.
    UpstreamError = 3,
    /// The client left first.
    ClientGone = 4,
    /// The gateway refused the request itself.
    Refused = 5,
}

impl Outcome {
    fn from_u8(value: u8) -> Option<Self> {
        Some(match value {
            1 => Outcome::Completed,
            2 => Outcome::UpstreamStatusError,
            3 => Outcome::UpstreamError,
            4 => Outcome::ClientGone,
            5 => Outcome::Refused,
            _ => return None,
        })
    }

    /// The word in the log.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Outcome::Completed => "completed",
            Outcome::UpstreamStatusError => "upstream_status_error",
            Outcome::UpstreamError => "upstream_error",
            Outcome::ClientGone => "client_gone",
            Outcome::Refused => "refused",
        }
    }
}

/// How the response body ended, as [`Logged`] saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Ended,
    Failed,
    Dropped,
}

/// One request's access-log record, shared by the parts of the request path that fill it in.
/// Cloning shares it. An empty handle (the log is off) ignores every call.
#[derive(Debug, Clone, Default)]
pub(crate) struct Access(Option<Arc<Record>>);

/// "Not known" in the millisecond cells.
const UNSET: u64 = u64::MAX;

#[derive(Debug)]
struct Record {
    request_id: HeaderValue,
    method: Method,
    path: Box<str>,
    arrived: Instant,
    key_name: OnceLock<Arc<str>>,
    route: OnceLock<Arc<Route>>,
    upstream: ArcSwapOption<UpstreamState>,
    queue_wait_us: AtomicU64,
    ttft_us: AtomicU64,
    /// Cached prompt tokens: predicted by cache-aware routing, and reported by the engine.
    cached_predicted: AtomicU64,
    cached_reported: AtomicU64,
    bytes_in: AtomicU64,
    outcome: AtomicU8,
    reason: OnceLock<&'static str>,
    written: AtomicBool,
}

impl Access {
    /// The record of a request that arrived now, or an empty handle when `enabled` is false or
    /// nothing listens at `slotgate::access`.
    pub(crate) fn start(
        enabled: bool,
        request_id: &HeaderValue,
        method: &Method,
        path: &str,
    ) -> Self {
        if !enabled || !tracing::enabled!(target: TARGET, tracing::Level::INFO) {
            return Self(None);
        }
        let mut end = path.len().min(PATH_LIMIT);
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        Self(Some(Arc::new(Record {
            request_id: request_id.clone(),
            method: method.clone(),
            path: path[..end].into(),
            arrived: Instant::now(),
            key_name: OnceLock::new(),
            route: OnceLock::new(),
            upstream: ArcSwapOption::empty(),
            queue_wait_us: AtomicU64::new(UNSET),
            ttft_us: AtomicU64::new(UNSET),
            cached_predicted: AtomicU64::new(UNSET),
            cached_reported: AtomicU64::new(UNSET),
            bytes_in: AtomicU64::new(0),
            outcome: AtomicU8::new(0),
            reason: OnceLock::new(),
            written: AtomicBool::new(false),
        })))
    }

    /// The client's API key's name (its tenant).
    pub(crate) fn key_name(&self, name: Option<&Arc<str>>) {
        if let (Some(record), Some(name)) = (&self.0, name) {
            let _ = record.key_name.set(Arc::clone(name));
        }
    }

    /// The model's route (its configured name is logged).
    pub(crate) fn route(&self, route: &Arc<Route>) {
        if let Some(record) = &self.0 {
            let _ = record.route.set(Arc::clone(route));
        }
    }

    /// The upstream the request goes to now (a later one replaces it).
    pub(crate) fn upstream(&self, upstream: &Arc<UpstreamState>) {
        if let Some(record) = &self.0 {
            record.upstream.store(Some(Arc::clone(upstream)));
        }
    }

    /// How long the request waited for its slot.
    pub(crate) fn queue_wait(&self, waited: Duration) {
        if let Some(record) = &self.0 {
            record
                .queue_wait_us
                .store(micros(waited), Ordering::Relaxed);
        }
    }

    /// The first token came `after` the request was sent to the engine.
    pub(crate) fn first_token(&self, after: Duration) {
        if let Some(record) = &self.0 {
            record.ttft_us.store(micros(after), Ordering::Relaxed);
        }
    }

    /// The cached prompt tokens cache-aware routing `predicted` and the engine `reported`, where
    /// known.
    pub(crate) fn cached_tokens(&self, predicted: Option<u64>, reported: Option<u64>) {
        if let Some(record) = &self.0 {
            let cell = |value: Option<u64>| value.map_or(UNSET, |v| v.min(UNSET - 1));
            record
                .cached_predicted
                .store(cell(predicted), Ordering::Relaxed);
            record
                .cached_reported
                .store(cell(reported), Ordering::Relaxed);
        }
    }

    /// How the request ended, as the part that knows best saw it (the body holding the slot,
    /// or a refusal); the last word counts.
    pub(crate) fn outcome(&self, outcome: Outcome) {
        if let Some(record) = &self.0 {
            record.outcome.store(outcome as u8, Ordering::Relaxed);
        }
    }

    /// The request ended with an error: a refusal (its `reason`), an engine that gave no
    /// usable answer, or a client that left before its body was whole (no reason then: nobody
    /// refused it). [`problems::record`](crate::proxy::problems::record) says which, from the
    /// error.
    pub(crate) fn failed(&self, outcome: Outcome, reason: Option<&'static str>) {
        if let Some(record) = &self.0 {
            record.outcome.store(outcome as u8, Ordering::Relaxed);
            if let Some(reason) = reason {
                let _ = record.reason.set(reason);
            }
        }
    }

    /// Writes the line, once: the response with `status` is over after `bytes_out` bytes;
    /// `end` decides the outcome when no part of the request path noted one.
    fn write(&self, status: Option<StatusCode>, bytes_out: u64, end: End) {
        if let Some(record) = &self.0 {
            record.write(status, bytes_out, end);
        }
    }

    /// Counts `n` request-body bytes.
    fn count_in(&self, n: usize) {
        if let Some(record) = &self.0 {
            let n = u64::try_from(n).unwrap_or(u64::MAX);
            record.bytes_in.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// Whether a line will be written (the log is on).
    pub(crate) fn is_on(&self) -> bool {
        self.0.is_some()
    }
}

fn micros(elapsed: Duration) -> u64 {
    u64::try_from(elapsed.as_micros()).unwrap_or(UNSET - 1)
}

/// A count cell's value; `None` when unset.
fn known(cell: u64) -> Option<u64> {
    (cell != UNSET).then_some(cell)
}

/// Milliseconds with three decimals, from a microsecond cell; `None` when unset.
fn millis(micros: u64) -> Option<f64> {
    #[expect(
        clippy::cast_precision_loss,
        reason = "durations in microseconds stay far below 2^53"
    )]
    (micros != UNSET).then(|| micros as f64 / 1000.0)
}

impl Record {
    fn write(&self, status: Option<StatusCode>, bytes_out: u64, end: End) {
        if self.written.swap(true, Ordering::AcqRel) {
            return;
        }
        let noted = Outcome::from_u8(self.outcome.load(Ordering::Relaxed));
        let outcome = match (noted, end) {
            // The client left before the part that knew the outcome finished: it left.
            (Some(Outcome::Completed) | None, End::Dropped) => Outcome::ClientGone,
            (Some(noted), _) => noted,
            // Nothing noted it: an answer hyper never polled (empty from the start, so its
            // meter ends only after this line), or one held for a retry and sent after all.
            (None, End::Ended) if status.is_some_and(|status| status.is_server_error()) => {
                Outcome::UpstreamStatusError
            }
            (None, End::Ended) => Outcome::Completed,
            (None, End::Failed) => Outcome::UpstreamError,
        };
        let upstream = self.upstream.load();
        info!(
            target: TARGET,
            request_id = self.request_id.to_str().unwrap_or_default(),
            method = self.method.as_str(),
            path = &*self.path,
            model = self.route.get().map(|route| route.model.as_str()),
            upstream = upstream.as_deref().map(|upstream| upstream.name.as_str()),
            status = status.map(|status| status.as_u16()),
            outcome = outcome.as_str(),
            reason = self.reason.get().copied(),
            queue_wait_ms = millis(self.queue_wait_us.load(Ordering::Relaxed)),
            ttft_ms = millis(self.ttft_us.load(Ordering::Relaxed)),
            cached_tokens = known(self.cached_reported.load(Ordering::Relaxed)),
            cached_tokens_predicted = known(self.cached_predicted.load(Ordering::Relaxed)),
            duration_ms = millis(micros(self.arrived.elapsed())),
            bytes_in = self.bytes_in.load(Ordering::Relaxed),
            bytes_out,
            key_name = self.key_name.get().map(|name| &**name),
            "request"
        );
    }
}

impl Drop for Record {
    fn drop(&mut self) {
        // The request's future was dropped before it had a response: the client left (or the
        // gateway stopped) while it queued or waited for the engine.
        self.write(None, 0, End::Dropped);
    }
}

pin_project! {
    /// A response body that counts its bytes and writes the access-log line when it ends,
    /// fails or is dropped.
    #[derive(Debug)]
    pub(crate) struct Logged<B: Body> {
        #[pin]
        inner: B,
        access: Access,
        status: StatusCode,
        bytes: u64,
    }

    impl<B: Body> PinnedDrop for Logged<B> {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            // Written already when the body ended; hyper never polls a body that is empty from
            // the start (a `HEAD`, a `204`), so a body at its end counts as ended here.
            let end = if this.inner.is_end_stream() {
                End::Ended
            } else {
                End::Dropped
            };
            this.access.write(Some(*this.status), *this.bytes, end);
        }
    }
}

impl<B: Body> Logged<B> {
    /// Wraps `inner`, the body of a response with `status`.
    pub(crate) fn new(inner: B, status: StatusCode, access: Access) -> Self {
        Self {
            inner,
            access,
            status,
            bytes: 0,
        }
    }
}

impl<B> Body for Logged<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        let polled = std::task::ready!(this.inner.as_mut().poll_frame(cx));
        match polled {
            None => {
                this.access
                    .write(Some(*this.status), *this.bytes, End::Ended);
                Poll::Ready(None)
            }
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    *this.bytes += u64::try_from(data.len()).unwrap_or(u64::MAX);
                }
                if this.inner.is_end_stream() {
                    this.access
                        .write(Some(*this.status), *this.bytes, End::Ended);
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Some(Err(error)) => {
                this.access
                    .write(Some(*this.status), *this.bytes, End::Failed);
                Poll::Ready(Some(Err(error.into())))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

pin_project! {
    /// A request body that counts its bytes into the access log's `bytes_in`.
    #[derive(Debug)]
    pub(crate) struct Counted<B> {
        #[pin]
        inner: B,
        access: Access,
    }
}

impl<B> Counted<B> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: B, access: Access) -> Self {
        Self { inner, access }
    }
}

impl<B> Body for Counted<B>
where
    B: Body,
    B::Data: Buf,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = std::task::ready!(this.inner.poll_frame(cx));
        if let Some(Ok(frame)) = &polled
            && let Some(data) = frame.data_ref()
        {
            this.access.count_in(data.remaining());
        }
        Poll::Ready(polled)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
