//! The response body: either a complete buffer, or a stream that owns the request's
//! [`Tracker`] (and with it the slot) for as long as it is being sent.
//!
//! A streaming body ends the tracker on every path: when its last event has been handed to
//! hyper ([`Outcome::Completed`] or the kind's own failure), when an injected failure aborts it,
//! when an injected reset dooms its connection, and, through the tracker's `Drop`, when hyper
//! drops it early because the client went away.
//!
//! A stream that ends cleanly tells its connection so
//! ([`ConnectionState::stream_ended`](crate::observer::ConnectionState::stream_ended)): a
//! llama-server's connection is then closed right after the answer's last byte, as the real one's
//! is ([`FakeConfig::close_after_stream`](crate::FakeConfig)).

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures::stream::BoxStream;
use http_body::{Body, Frame, SizeHint};

use crate::observer::{Fate, Outcome, Tracker};

/// One step of a streamed response.
#[derive(Debug)]
pub(crate) enum Emit {
    /// An SSE event (counted by the observer).
    Event(Bytes),
    /// Raw bytes that are not an event (a truncated JSON body).
    Raw(Bytes),
    /// The stream ends cleanly with this outcome.
    End(Outcome),
    /// The connection is aborted with this outcome: no terminating chunk, or a reset stream.
    Abort(Outcome),
    /// The connection is closed with a TCP reset, with this outcome.
    Reset(Outcome),
}

/// The error a body yields to make hyper abort the connection.
#[derive(Debug, thiserror::Error)]
#[error("the fake upstream aborted the response (injected failure)")]
pub(crate) struct Aborted;

/// The fake's response body.
pub(crate) enum ResponseBody {
    /// A complete body; its request was already ended when the response was built.
    Full(Option<Bytes>),
    /// A streamed body that ends its request itself.
    Stream {
        events: Option<BoxStream<'static, Emit>>,
        tracker: Tracker,
        /// An injected reset is under way: the body must never end, or hyper would write the
        /// terminating chunk before the connection task resets the socket.
        doomed: bool,
    },
}

impl std::fmt::Debug for ResponseBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Full(data) => f
                .debug_tuple("Full")
                .field(&data.as_ref().map(Bytes::len))
                .finish(),
            Self::Stream { tracker, .. } => {
                f.debug_struct("Stream").field("tracker", tracker).finish()
            }
        }
    }
}

impl ResponseBody {
    /// A complete body.
    pub(crate) fn full(data: impl Into<Bytes>) -> Self {
        let data: Bytes = data.into();
        Self::Full((!data.is_empty()).then_some(data))
    }

    /// A streamed body that owns `tracker` until it ends.
    pub(crate) fn stream(events: BoxStream<'static, Emit>, tracker: Tracker) -> Self {
        Self::Stream {
            events: Some(events),
            tracker,
            doomed: false,
        }
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = Aborted;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Aborted>>> {
        match self.get_mut() {
            Self::Full(data) => Poll::Ready(data.take().map(|d| Ok(Frame::data(d)))),
            Self::Stream {
                events,
                tracker,
                doomed,
            } => {
                if *doomed {
                    // hyper may poll again (the socket turned writable) before the connection
                    // task drops it; ending now would put a clean end on the wire first.
                    return Poll::Pending;
                }
                let Some(stream) = events.as_mut() else {
                    return Poll::Ready(None);
                };
                match ready!(stream.as_mut().poll_next(cx)) {
                    Some(Emit::Event(bytes)) => {
                        tracker.event_sent();
                        Poll::Ready(Some(Ok(Frame::data(bytes))))
                    }
                    Some(Emit::Raw(bytes)) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                    Some(Emit::End(outcome)) => {
                        *events = None;
                        tracker.finish(outcome);
                        tracker.connection().stream_ended();
                        Poll::Ready(None)
                    }
                    Some(Emit::Abort(outcome)) => {
                        *events = None;
                        tracker.finish(outcome);
                        Poll::Ready(Some(Err(Aborted)))
                    }
                    Some(Emit::Reset(outcome)) => {
                        *events = None;
                        tracker.finish(outcome);
                        // The connection task drops hyper's side and resets the socket; hyper
                        // must not end the body (or close the socket cleanly) meanwhile.
                        tracker.connection().doom(Fate::Reset);
                        *doomed = true;
                        Poll::Pending
                    }
                    None => {
                        *events = None;
                        tracker.finish(Outcome::Completed);
                        tracker.connection().stream_ended();
                        Poll::Ready(None)
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // A stream is never declared ended early: hyper must poll it to its end so the
        // completion is recorded.
        matches!(self, Self::Full(None))
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            Self::Full(data) => SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64)),
            Self::Stream { .. } => SizeHint::default(),
        }
    }
}
