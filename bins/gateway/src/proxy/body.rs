//! Step 8: the response body that holds the slot.
//!
//! [`SlotBody`] wraps the upstream's response body and owns the guard of the slot the request
//! holds (in the gateway, an [`admit::Slot`](crate::proxy::admit::Slot), which owns the limiter
//! `Permit`). The guard is dropped — so the slot goes back to the limiter — at the first of:
//!
//! - the inner body reports its end (a `None` frame, or `is_end_stream()` after a frame);
//! - the inner body yields an error (the upstream died mid-stream);
//! - the wrapper itself is dropped (hyper drops the response body when the client goes away).
//!   Before the first byte of the answer's body, that is a client leaving an engine still in
//!   prefill (llama-server sends a stream's head first): the engine notices the closed
//!   connection only at its first write, so the guard is told to keep the slot for
//!   `cancel_grace` ([`Completion::Dropped`]), as when the client leaves before the head. Once
//!   bytes flow, the engine notices at its next write (~10 ms) and the slot goes back at once.
//!
//! Bytes are passed through untouched, as soon as the upstream sends them: the wrapper never
//! buffers a whole answer. The one thing held back is the unfinished end of an SSE event split
//! across frames, until the rest of it comes ([`events`]): engines write whole events, so in
//! practice every frame goes on as it came, and an answer cut mid-event never leaves the client
//! half an event before its last one.
//!
//! With a [`Watch`] (the gateway always gives one), the wrapper also bounds the upstream:
//!
//! - **Stall**: while the wrapper waits on the upstream, at most the upstream's
//!   `stream_idle_timeout` may pass without a frame. The clock runs only while the wrapper is
//!   waiting on the upstream, not while the client is slow to read, so backpressure is never
//!   taken for a stall. A stalled answer ends, the connection to the engine is closed (the body
//!   is dropped) and the slot goes back after `cancel_grace`, as after a first-byte timeout: the
//!   engine needs that long to notice.
//! - **Cut**: the upstream's body fails (the engine died, or reset the connection).
//! - **Too long**: the answer is still going at the upstream's `stream_timeout`, counted from
//!   when the request was sent. The clock runs whatever the client does; a client that stops
//!   reading is the listener's business (`client_write_timeout`). The answer ends as after a
//!   stall, with a `stream-timeout` problem instead.
//!
//! In each case, an SSE answer (`text/event-stream`) or an NDJSON one (`application/x-ndjson`,
//! Ollama's streams) ends with one last message carrying an `upstream-stalled` (or
//! `stream-timeout`) problem in the client's dialect ([`last_message`]): OpenAI's `data:` event
//! with an `error` member, Anthropic's `event: error`, Ollama's `{"error": "…"}` line; each is what
//! that API's SDKs raise on. Then the body ends cleanly: HTTP/1 gets its terminating chunk,
//! HTTP/2 an `END_STREAM`. Any other answer cannot carry a late error, so it is cut (HTTP/1: no
//! final chunk; HTTP/2: a reset stream). Both are logged at `warn` with the request id and counted in
//! `slotgate_bounds_total` (`stream_idle`, `upstream_cut`, `stream_timeout`).
//!
//! A [`Completion`] says which of those three ended the body; the guard learns it through
//! [`SlotGuard::finish`] just before it is dropped, so the gateway can count client disconnects
//! mid-stream separately from clean ends.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::HeaderValue;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use prometheus_client::metrics::counter::Counter;
use slotgate_problem::{Dialect, Framing, Problem};
use tokio::time::{Instant, Sleep};
use tracing::warn;

use crate::support::error::{BoxError, chain};
use crate::upstreams::target::AnswerNames;
use events::Events;
use meter::Meter;

/// How a [`SlotBody`] ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Completion {
    /// The upstream body ended normally.
    Ended,
    /// The upstream body yielded an error (for example, the upstream closed mid-stream).
    Failed,
    /// The body was dropped before it ended: the client went away (or the server shut down).
    /// The slot should go back only after `grace`: the upstream's `cancel_grace` while no byte
    /// of the body had come yet, zero after.
    Dropped {
        /// How long the engine may take to notice.
        grace: Duration,
    },
    /// The upstream sent nothing for its stream idle timeout; the slot should go back only after
    /// `grace`, the time the engine needs to notice the closed connection.
    Stalled {
        /// The upstream's `cancel_grace`.
        grace: Duration,
    },
}

/// What a [`SlotBody`] needs to bound the upstream and end a failed answer well.
#[derive(Debug)]
pub(crate) struct Watch {
    /// Longest wait for the upstream's next frame.
    pub(crate) idle_timeout: Duration,
    /// Kept for the engine to notice a closed connection before the slot goes back.
    pub(crate) cancel_grace: Duration,
    /// How the answer is framed, when it can carry a last error message: SSE (an `error`
    /// event) or NDJSON (an `error` line, Ollama's streams). `None`: it can only be cut.
    pub(crate) framing: Option<Framing>,
    /// The API the client speaks, which writes that last message.
    pub(crate) dialect: Dialect,
    /// The upstream's and the model's names, shared with the target rather than copied for
    /// every answer: only an answer that ends badly reads them.
    pub(crate) names: Arc<AnswerNames>,
    /// The request id, for the log and the last event (a clone of the header's shared bytes).
    pub(crate) request_id: HeaderValue,
    /// `slotgate_bounds_total{bound="stream_idle"}`.
    pub(crate) stalled: Counter,
    /// `slotgate_bounds_total{bound="upstream_cut"}`.
    pub(crate) cut: Counter,
    /// When the answer must be over (`stream_timeout` after the request was sent), and the
    /// `stream_timeout` itself; `None`: no total bound.
    pub(crate) deadline: Option<(Instant, Duration)>,
    /// `slotgate_bounds_total{bound="stream_timeout"}`.
    pub(crate) too_long: Counter,
    /// Sees every data frame and how the body ended: the first token, the usage, the access
    /// log's outcome.
    pub(crate) meter: Option<Meter>,
}

impl Watch {
    /// The request id as text; empty if the header value is not (ours always are).
    fn request_id(&self) -> &str {
        self.request_id.to_str().unwrap_or_default()
    }

    /// Logs an answer that stopped, and returns its last SSE event, if the answer is SSE.
    fn ended_badly(&self, why: &str) -> Option<Bytes> {
        warn!(
            request_id = self.request_id(),
            upstream = %self.names.upstream,
            model = %self.names.model,
            why,
            "the upstream's answer stopped mid-way"
        );
        self.last_event(|| Problem::upstream_stalled(&self.names.upstream, &self.names.model, why))
    }

    /// Logs an answer that ran past its `stream_timeout`, and returns its last SSE event, if
    /// the answer is SSE.
    fn ran_too_long(&self, timeout: Duration) -> Option<Bytes> {
        warn!(
            request_id = self.request_id(),
            upstream = %self.names.upstream,
            model = %self.names.model,
            stream_timeout = %humantime::format_duration(timeout),
            "the upstream's answer ran past its stream timeout; ending it"
        );
        self.last_event(|| {
            Problem::stream_timeout(&self.names.upstream, &self.names.model, timeout)
        })
    }

    /// The message that ends the answer with `problem`; `None` when the answer cannot carry
    /// one.
    fn last_event(&self, problem: impl FnOnce() -> Problem) -> Option<Bytes> {
        let framing = self.framing?;
        Some(last_message(
            problem(),
            self.request_id(),
            self.dialect,
            framing,
        ))
    }
}

/// The last message of a stream that ends with `problem` (with the request id), in the
/// client's `dialect` ([`Problem::stream_ending`]): on OpenAI's SSE a `data:` event whose
/// `error` member the SDKs raise, on Anthropic's an `event: error` (the only event its SDKs
/// raise on), on Ollama's NDJSON a line with a string `error`.
pub(crate) fn last_message(
    problem: Problem,
    request_id: &str,
    dialect: Dialect,
    framing: Framing,
) -> Bytes {
    problem
        .with_extension("request_id", request_id)
        .stream_ending(dialect, framing)
}

/// How an answer whose head has `headers` can carry a last error message: an open-ended
/// (no `Content-Length`) SSE or NDJSON answer. A sized answer cannot grow a message.
pub(crate) fn framing(headers: &http::HeaderMap) -> Option<Framing> {
    if headers.contains_key(http::header::CONTENT_LENGTH) {
        None
    } else if meter::is_sse(headers) {
        Some(Framing::Sse)
    } else if meter::is_ndjson(headers) {
        Some(Framing::Ndjson)
    } else {
        None
    }
}

/// Where a watched body stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Passing frames through.
    Streaming,
    /// The last event is out; the next poll ends the body.
    Closing,
    /// Ended.
    Done,
}

/// Something held for as long as a response body streams, told how the body ended.
pub(crate) trait SlotGuard {
    /// Called once, just before the guard is dropped.
    fn finish(self, how: Completion);
}

/// `()` holds nothing; useful for bodies that hold no slot.
impl SlotGuard for () {
    fn finish(self, _how: Completion) {}
}

/// `None` holds nothing: the answer of a route that takes no slot (`/tokenize`, `/api/show`)
/// streams through the same body type as one that does.
impl<G: SlotGuard> SlotGuard for Option<G> {
    fn finish(self, how: Completion) {
        if let Some(guard) = self {
            guard.finish(how);
        }
    }
}

pin_project! {
    /// A response body that holds a slot guard until the body ends, fails or is dropped.
    ///
    /// See the [module documentation](self).
    #[derive(Debug)]
    #[project = SlotBodyProj]
    pub(crate) struct SlotBody<B: Body, G: SlotGuard> {
        #[pin]
        inner: B,
        guard: Option<G>,
        watch: Option<Watch>,
        // Runs only while waiting on the upstream: armed at the first `Pending` after a frame.
        // Boxed (and only with a watch) so the body stays `Unpin` when the inner one is.
        idle: Option<Pin<Box<Sleep>>>,
        armed: bool,
        // The watch's deadline, if it has one.
        total: Option<Pin<Box<Sleep>>>,
        phase: Phase,
        // Whether a byte of the body has come from the upstream (the engine is past prefill).
        flowing: bool,
        // For an SSE answer with a watch: what of an unfinished event is held back.
        events: Option<Events>,
    }

    impl<B: Body, G: SlotGuard> PinnedDrop for SlotBody<B, G> {
        fn drop(this: Pin<&mut Self>) {
            let mut this = this.project();
            if this.guard.is_some() {
                // hyper never polls a body that says it is already at its end (an empty body),
                // so a guard still held here is a clean end in that case, and otherwise means
                // the client (or a shutdown) dropped the response mid-stream.
                let how = if this.inner.is_end_stream() || *this.phase != Phase::Streaming {
                    Completion::Ended
                } else {
                    let grace = match this.watch.as_ref() {
                        Some(watch) if !*this.flowing => watch.cancel_grace,
                        _ => Duration::ZERO,
                    };
                    Completion::Dropped { grace }
                };
                this.release(how);
            }
        }
    }
}

impl<B: Body, G: SlotGuard> SlotBody<B, G> {
    /// Wraps `inner`, holding `guard` until the body is done.
    pub(crate) fn new(inner: B, guard: G) -> Self {
        Self {
            inner,
            guard: Some(guard),
            watch: None,
            idle: None,
            armed: false,
            total: None,
            phase: Phase::Streaming,
            flowing: false,
            events: None,
        }
    }

    /// Also bounds the upstream and ends a failed answer as [`Watch`] says.
    pub(crate) fn watched(mut self, watch: Watch) -> Self {
        self.idle = Some(Box::pin(tokio::time::sleep(watch.idle_timeout)));
        self.total = watch
            .deadline
            .map(|(at, _)| Box::pin(tokio::time::sleep_until(at)));
        self.events = watch.framing.map(Events::new);
        self.watch = Some(watch);
        self
    }

    /// Whether the guard is still held (the body has not ended yet). The gateway never needs to
    /// ask; the tests check when the slot goes back.
    #[cfg(test)]
    pub(crate) fn is_holding(&self) -> bool {
        self.guard.is_some()
    }
}

impl<B: Body, G: SlotGuard> SlotBodyProj<'_, B, G> {
    fn release(&mut self, how: Completion) {
        if let Some(guard) = self.guard.take() {
            if let Some(meter) = self.watch.as_mut().and_then(|watch| watch.meter.as_mut()) {
                meter.end(how);
            }
            guard.finish(how);
        }
    }

    /// What of `frame` goes on now: a data frame of an SSE answer up to its last whole event
    /// (everything when it is the `last`), `None` when that is nothing; any other frame as
    /// it is.
    fn whole_events(&mut self, frame: Frame<Bytes>, last: bool) -> Option<Frame<Bytes>> {
        let Some(events) = self.events.as_mut() else {
            return Some(frame);
        };
        let data = match frame.into_data() {
            Ok(data) => data,
            Err(other) => return Some(other),
        };
        let mut whole = events.whole(data);
        if last {
            let rest = events.rest();
            if whole.is_empty() {
                whole = rest;
            } else if !rest.is_empty() {
                whole = [whole, rest].concat().into();
            }
        }
        (last || !whole.is_empty()).then(|| Frame::data(whole))
    }

    /// Ends a failed answer: with its last SSE `event` and then a clean end, or, when it has
    /// none (not SSE), with an error that cuts it (`why`). The unfinished event it was in the
    /// middle of, if any, is dropped: the last event follows whole ones.
    fn end_with(
        &mut self,
        event: Option<Bytes>,
        why: String,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(events) = self.events.as_mut() {
            events.drop_partial();
        }
        if let Some(event) = event {
            *self.phase = Phase::Closing;
            Poll::Ready(Some(Ok(Frame::data(event))))
        } else {
            *self.phase = Phase::Done;
            Poll::Ready(Some(Err(why.into())))
        }
    }
}

impl<B, G> Body for SlotBody<B, G>
where
    B: Body,
    B::Error: Into<BoxError>,
    G: SlotGuard,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let mut this = self.project();
        match *this.phase {
            Phase::Streaming => {}
            Phase::Closing => {
                *this.phase = Phase::Done;
                return Poll::Ready(None);
            }
            Phase::Done => return Poll::Ready(None),
        }
        // Looked at before the upstream, so that an engine that never pauses cannot run past it.
        if let (Some(watch), Some(total)) = (this.watch.as_ref(), this.total.as_mut())
            && total.as_mut().poll(cx).is_ready()
        {
            watch.too_long.inc();
            let timeout = watch
                .deadline
                .map_or(Duration::ZERO, |(_, timeout)| timeout);
            let why = format!(
                "the answer ran past the stream timeout of {}",
                humantime::format_duration(timeout)
            );
            let event = watch.ran_too_long(timeout);
            let grace = watch.cancel_grace;
            this.release(Completion::Stalled { grace });
            return this.end_with(event, why);
        }
        let failure = loop {
            let polled = this.inner.as_mut().poll_frame(cx);
            break match polled {
                Poll::Pending => {
                    let (Some(watch), Some(idle)) = (this.watch.as_ref(), this.idle.as_mut())
                    else {
                        return Poll::Pending;
                    };
                    if !*this.armed {
                        *this.armed = true;
                        idle.as_mut().reset(Instant::now() + watch.idle_timeout);
                    }
                    ready!(idle.as_mut().poll(cx));
                    watch.stalled.inc();
                    let why = format!(
                        "no data for {}",
                        humantime::format_duration(watch.idle_timeout)
                    );
                    let grace = watch.cancel_grace;
                    let event = watch.ended_badly(&why);
                    this.release(Completion::Stalled { grace });
                    (event, why)
                }
                Poll::Ready(None) => {
                    this.release(Completion::Ended);
                    // An answer that ends cleanly gets what it sent, a last unfinished event
                    // included.
                    let rest = this.events.as_mut().map(Events::rest).unwrap_or_default();
                    if rest.is_empty() {
                        *this.phase = Phase::Done;
                        return Poll::Ready(None);
                    }
                    *this.phase = Phase::Closing;
                    return Poll::Ready(Some(Ok(Frame::data(rest))));
                }
                Poll::Ready(Some(Ok(frame))) => {
                    *this.armed = false;
                    let frame = frame.map_data(|mut data| data.copy_to_bytes(data.remaining()));
                    let last = this.inner.is_end_stream();
                    let Some(frame) = this.whole_events(frame, last) else {
                        // Only part of an event: wait for the rest of it.
                        continue;
                    };
                    *this.flowing |= frame.data_ref().is_some_and(|data| !data.is_empty());
                    if let (Some(meter), Some(data)) = (
                        this.watch.as_mut().and_then(|watch| watch.meter.as_mut()),
                        frame.data_ref(),
                    ) {
                        meter.frame(data);
                    }
                    // Release as soon as the last frame is out, rather than waiting for hyper
                    // to poll once more for the `None`: the next queued request should not
                    // wait on us.
                    if last {
                        this.release(Completion::Ended);
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(error))) => {
                    this.release(Completion::Failed);
                    let error: BoxError = error.into();
                    let Some(watch) = this.watch.as_ref() else {
                        return Poll::Ready(Some(Err(error)));
                    };
                    watch.cut.inc();
                    let why = format!("the connection failed: {}", chain(&*error));
                    (watch.ended_badly(&why), why)
                }
            };
        };
        let (event, why) = failure;
        this.end_with(event, why)
    }

    fn is_end_stream(&self) -> bool {
        match self.phase {
            Phase::Streaming => self.inner.is_end_stream(),
            Phase::Closing => false,
            Phase::Done => true,
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self.phase {
            Phase::Streaming => self.inner.size_hint(),
            Phase::Closing => SizeHint::default(),
            Phase::Done => SizeHint::with_exact(0),
        }
    }
}

pub(crate) mod events;
pub(crate) mod meter;
#[cfg(test)]
mod tests;
