//! `GET /admin/events`: the status page's one server-sent event stream.
//!
//! Each event is `event: status`, `id:` the newest sample's number, and one line of JSON
//! ([`document`]); the first comes at once, then one per
//! [`SAMPLE_EVERY`]. The stream is bounded like every admin answer: its connection counts under
//! `server.admin_max_connections`, a client that stops reading is cut by
//! `server.client_write_timeout` (the listener's own stall check, which starts once the unread
//! events have filled hyper's buffer and the kernel's send buffer: see `docs/operations.md`),
//! and the stream ends as soon as the gateway starts shutting down.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use futures::stream::{self, BoxStream, StreamExt};
use http_body::Frame;
use http_body_util::StreamBody;
use parking_lot::Mutex;
use tokio::time::{Interval, MissedTickBehavior};
use tracing::warn;

use crate::ops::status::document;
use crate::ops::status::history::{History, SAMPLE_EVERY};
use crate::proxy::live::Live;
use crate::support::error::chain;
use crate::support::shutdown::ShutdownSignal;

/// The `Content-Type` of the stream.
pub(crate) const CONTENT_TYPE: &str = "text/event-stream; charset=utf-8";

/// The stream's response body.
pub(crate) type EventBody = StreamBody<BoxStream<'static, Result<Frame<Bytes>, Infallible>>>;

/// What the stream keeps between events.
struct State {
    live: Arc<Live>,
    history: Arc<Mutex<History>>,
    stop: ShutdownSignal,
    every: Interval,
    /// The newest sample already sent; `None` before the first event.
    sent: Option<u64>,
}

/// A new stream of status events, until `stop` fires or the client goes away.
pub(crate) fn stream(
    live: Arc<Live>,
    history: Arc<Mutex<History>>,
    stop: ShutdownSignal,
) -> EventBody {
    let mut every = tokio::time::interval(SAMPLE_EVERY);
    every.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let state = State {
        live,
        history,
        stop,
        every,
        sent: None,
    };
    let events = stream::unfold(state, |mut state| async move {
        tokio::select! {
            biased;
            () = state.stop.fired() => return None,
            // The interval's first tick is immediate: the first event goes out at once.
            _ = state.every.tick() => {}
        }
        let event = next_event(&mut state)?;
        Some((Ok(Frame::data(event)), state))
    });
    StreamBody::new(events.boxed())
}

/// The next event's bytes; `None` ends the stream (a document that does not serialize, which
/// would be a bug).
fn next_event(state: &mut State) -> Option<Bytes> {
    let generation = state.live.current();
    let (tick, json) = {
        let history = state.history.lock();
        let doc = document::build(&generation, &history, state.sent);
        (doc.tick, serde_json::to_string(&doc))
    };
    match json {
        Ok(json) => {
            state.sent = Some(tick);
            Some(Bytes::from(format!(
                "id: {tick}\nevent: status\ndata: {json}\n\n"
            )))
        }
        Err(error) => {
            warn!(error = %chain(&error), "cannot serialize a status event; ending the stream");
            None
        }
    }
}
