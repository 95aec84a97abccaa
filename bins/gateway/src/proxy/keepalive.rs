//! Steps 6 to 8 inside the response body, for a streamed request that has to queue on a model
//! with `queue_keepalive`: the client gets `200 text/event-stream` at once, sees its place in
//! line while it waits, and then the engine's stream on the same response.
//!
//! While queued, [`KeepaliveBody`] sends an SSE comment at once and then every interval:
//!
//! ```text
//! : queued position=3 ahead=2 eta_s=8
//! ```
//!
//! `position` is the request's place in line (1 is next), `ahead` the waiters expected to be
//! served before it ([`QueuePosition::ahead`](slotgate_limiter::QueuePosition)); under
//! `[cluster]` the same count for the shared queue, read again from the store before each
//! comment after the first (one round trip each), `eta_s` the
//! wait expected from recent slot hold times, in whole seconds (the estimate behind
//! `Retry-After`; before any hold was observed, a typical answer's length stands in; plus the
//! model's measured load time while it is not loaded). Before that, while the request waits
//! at its upstream's gate for its model to get a place ([`places`](crate::upstreams::places)),
//! the comment is `: waiting for a model place models_ahead=M eta_s=E`
//! ([`HoldStats::eta_behind_loads`](crate::upstreams::hold::HoldStats::eta_behind_loads)). SSE
//! clients ignore comments, and a proxy between them sees bytes often enough not to cut an idle
//! connection. When the slot comes, one more comment (`: granted waited_ms=N`) precedes the
//! engine's events; the `x-slotgate-queue-wait-ms` header cannot carry the wait, since the head
//! went out before it was known.
//!
//! If no slot comes (the wait ends on `queue_timeout` or a client deadline, the gateway shuts
//! down, a reload removes the model), or the engine does not answer with a stream (it refuses the
//! connection, answers an error status, times out), the stream ends with one `data:` event
//! carrying the problem document — with OpenAI's `error` member, its `type`, and
//! `retry_after` where a retry may help — and then a clean end.
//!
//! The body owns every stage of the request, so dropping it (the client left) does exactly
//! what dropping the request's future does on the ordinary path: while queued, the place in the
//! queue is given up and the engine never sees the request; while sending, the slot is kept for
//! `cancel_grace` ([`Sending`](crate::proxy::admit::Sending)); while streaming, the slot body
//! ends as a client gone mid-stream.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use http_body::{Body, Frame};
use slotgate_limiter_redis::Standing;
use tokio::time::{Interval, MissedTickBehavior};

use http::Response;
use http::header::{self, HeaderValue};

use crate::metrics::Metrics;
use crate::proxy::admit::{InLine, Queued, Refused, Slot};
use crate::proxy::answer::{Answerer, Streamed, mark_upstream};
use crate::proxy::body::last_message;
use crate::proxy::choose::Routed;
use crate::proxy::problems::{self, Error, Unavailable};
use crate::proxy::send::{Sender, Sent};
use crate::support::error::BoxError;
use crate::upstreams::target::Target;

/// What the body does with the slot once granted: send the request and start the engine's
/// stream, or give the last event to end with.
pub(crate) type Forward =
    Box<dyn FnOnce(Slot) -> BoxFuture<'static, Result<Streamed, Bytes>> + Send>;

/// The last event for a wait that ended without a slot.
pub(crate) type Refuse = Box<dyn FnOnce(Refused) -> Bytes + Send>;

/// The response body of a request that queues under `queue_keepalive`; see the
/// [module docs](self).
pub(crate) struct KeepaliveBody {
    stage: Stage,
    ticker: Interval,
    target: Arc<Target>,
}

enum Stage {
    /// In the queue.
    Queued {
        /// Boxed: the wait is by far the largest stage.
        queued: Box<Queued>,
        forward: Forward,
        refuse: Refuse,
        /// Under `[cluster]`: the count of waiters ahead being read again from the store, for
        /// the comment due now.
        refreshing: Option<BoxFuture<'static, Standing>>,
        /// Under `[cluster]`: the first comment goes out with the count the acquire's own reply
        /// gave; the later ones read it again first.
        fresh: bool,
    },
    /// The slot is granted and the request is with the engine.
    Sending(BoxFuture<'static, Result<Streamed, Bytes>>),
    /// The engine's stream, passed through.
    Streaming(Pin<Box<Streamed>>),
    /// The last event is out; the next poll ends the body.
    Closing,
    /// Ended.
    Done,
}

impl fmt::Debug for KeepaliveBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let stage = match self.stage {
            Stage::Queued { .. } => "queued",
            Stage::Sending(_) => "sending",
            Stage::Streaming(_) => "streaming",
            Stage::Closing => "closing",
            Stage::Done => "done",
        };
        f.debug_struct("KeepaliveBody")
            .field("stage", &stage)
            .field("upstream", &self.target.upstream.name)
            .finish_non_exhaustive()
    }
}

impl KeepaliveBody {
    /// The body of `queued`, a request waiting on `target`, with a comment `every` so often;
    /// `forward` runs once it has its slot, `refuse` if the wait ends without one.
    pub(crate) fn new(
        queued: Queued,
        target: Arc<Target>,
        every: Duration,
        forward: Forward,
        refuse: Refuse,
    ) -> Self {
        let mut ticker = tokio::time::interval(every);
        // A client slow to read gets the next comment late, not a burst of them.
        ticker.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Self {
            stage: Stage::Queued {
                queued: Box::new(queued),
                forward,
                refuse,
                refreshing: None,
                fresh: true,
            },
            ticker,
            target,
        }
    }

    /// The `200 text/event-stream` response whose body this is.
    pub(crate) fn respond(self) -> Response<Self> {
        let target = Arc::clone(&self.target);
        let mut response = Response::new(self);
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        mark_upstream(headers, &target);
        response
    }

    /// The comment that tells the client where it stands.
    fn position_comment(target: &Target, queued: &Queued) -> Option<Bytes> {
        let load = target.load_cost();
        let comment = match queued.standing()? {
            InLine::Slot { ahead } => {
                let reading = target.reading();
                let slots = target.slots(&reading).unwrap_or(usize::MAX);
                let eta = target.hold.eta(ahead, slots, load);
                format!(
                    ": queued position={} ahead={ahead} eta_s={}\n\n",
                    ahead.saturating_add(1),
                    whole_seconds(eta),
                )
            }
            InLine::Place { models_ahead } => {
                let eta = target.hold.eta_behind_loads(models_ahead, load);
                format!(
                    ": waiting for a model place models_ahead={models_ahead} eta_s={}\n\n",
                    whole_seconds(eta),
                )
            }
        };
        Some(Bytes::from(comment))
    }

    /// The comment due after a tick, once the count it shows is known: under `[cluster]`
    /// read again from the shared store (one round trip per comment, after the first),
    /// otherwise the local queue's, at once.
    fn poll_comment(
        target: &Target,
        queued: &Queued,
        refreshing: &mut Option<BoxFuture<'static, Standing>>,
        fresh: &mut bool,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Bytes>> {
        if refreshing.is_none()
            && !std::mem::take(fresh)
            && let (Some(place), Some(key)) = (queued.place(), target.shared.as_ref())
        {
            *refreshing = Some(key.refresh(place));
        }
        if let Some(refresh) = refreshing {
            ready!(refresh.as_mut().poll(cx));
            *refreshing = None;
        }
        Poll::Ready(Self::position_comment(target, queued))
    }
}

/// `duration` rounded up to whole seconds.
fn whole_seconds(duration: Duration) -> u64 {
    duration.as_secs() + u64::from(duration.subsec_nanos() > 0)
}

impl Body for KeepaliveBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.get_mut();
        loop {
            match &mut this.stage {
                Stage::Queued { queued, .. } => {
                    if let Poll::Ready(outcome) = Pin::new(&mut **queued).poll(cx) {
                        let waited = queued.waited();
                        let Stage::Queued {
                            forward, refuse, ..
                        } = std::mem::replace(&mut this.stage, Stage::Closing)
                        else {
                            unreachable!("matched as queued just above");
                        };
                        let frame = match outcome {
                            Ok(slot) => {
                                this.stage = Stage::Sending(forward(slot));
                                let millis = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
                                Bytes::from(format!(": granted waited_ms={millis}\n\n"))
                            }
                            // The stage stays `Closing`: this event is the last.
                            Err(refused) => refuse(refused),
                        };
                        return Poll::Ready(Some(Ok(Frame::data(frame))));
                    }
                    let Stage::Queued {
                        queued,
                        refreshing,
                        fresh,
                        ..
                    } = &mut this.stage
                    else {
                        unreachable!("matched as queued just above");
                    };
                    if refreshing.is_none() {
                        ready!(this.ticker.poll_tick(cx));
                    }
                    let comment = ready!(Self::poll_comment(
                        &this.target,
                        queued,
                        refreshing,
                        fresh,
                        cx
                    ));
                    if let Some(comment) = comment {
                        return Poll::Ready(Some(Ok(Frame::data(comment))));
                    }
                }
                Stage::Sending(sending) => match ready!(sending.as_mut().poll(cx)) {
                    Ok(streamed) => this.stage = Stage::Streaming(Box::pin(streamed)),
                    Err(event) => {
                        this.stage = Stage::Closing;
                        return Poll::Ready(Some(Ok(Frame::data(event))));
                    }
                },
                Stage::Streaming(streamed) => {
                    let polled = ready!(streamed.as_mut().poll_frame(cx));
                    if polled.is_none() {
                        this.stage = Stage::Done;
                    }
                    return Poll::Ready(polled);
                }
                Stage::Closing => {
                    this.stage = Stage::Done;
                    return Poll::Ready(None);
                }
                Stage::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.stage, Stage::Done)
    }
}

/// The keepalive interval for `routed` on `target`: `queue_keepalive`, for a streamed request
/// on an SSE endpoint; `None` otherwise (the request queues as usual).
pub(crate) fn interval(routed: &Routed, target: &Target) -> Option<Duration> {
    let every = target.queueing.keepalive?;
    (routed.api.stream && routed.endpoint.streams_sse()).then_some(every)
}

/// What the request path's own steps 7 and 8 need, lent to a queued request's body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Steps<'a> {
    /// Step 7.
    pub(crate) sender: &'a Sender,
    /// Step 8.
    pub(crate) answerer: &'a Answerer,
    /// Where a refusal is counted.
    pub(crate) metrics: &'a Metrics,
}

/// Steps 7 and 8 for a request granted its `slot` on `target` under `queue_keepalive`: the
/// same [`Sender::send`] and [`Answerer::answer`] as on the ordinary path, except that the
/// client already has its `200`, so anything but the engine's stream becomes the stream's
/// last event (`Err`).
pub(crate) async fn forward(
    steps: Steps<'_>,
    routed: &Routed,
    target: &Target,
    slot: Slot,
) -> Result<Streamed, Bytes> {
    routed.access.queue_wait(slot.waited());
    let error = match steps.sender.send(routed, target, Some(slot)).await {
        Sent::Answered(head) => {
            // The client already has its `200`: an error answer is not retried here, it ends
            // the stream (`engine_refused`).
            let answer = steps.answerer.answer(routed, target, head, &routed.access);
            if answer.status().is_success() {
                return Ok(answer.into_body());
            }
            return Err(engine_refused(routed, target, answer).await);
        }
        Sent::Unreachable(error) => Error::UpstreamUnavailable {
            model: routed.route.model.clone(),
            retry_after: routed.generation.config.server.health_check_interval,
            why: Unavailable::Unreachable,
            source: Some(error),
        },
        Sent::Failed(error) => error,
    };
    Err(last_event(routed, &error, steps.metrics))
}

/// The stream's last event for `error`, recorded as every error is
/// ([`problems::record`]).
pub(crate) fn last_event(routed: &Routed, error: &Error, metrics: &Metrics) -> Bytes {
    problems::record(error, &routed.generation.routes, metrics, &routed.access);
    ending(routed, error.to_problem())
}

/// The SSE event that ends `routed`'s stream with `problem`, in the client's dialect (an
/// Anthropic client gets `event: error`, the only event its SDKs raise on).
fn ending(routed: &Routed, problem: slotgate_problem::Problem) -> Bytes {
    last_message(
        problem,
        routed.id(),
        slotgate_problem::Dialect::of_path(routed.endpoint.path),
        slotgate_problem::Framing::Sse,
    )
}

/// The most of an engine's error answer read to explain it.
const ENGINE_ERROR_LIMIT: usize = 64 * 1024;

/// The last event for an engine that answered with an error status instead of a stream:
/// an `upstream-bad-response` problem with the engine's status and, when it sent one, its
/// own error document. The answer is read to its end (at most [`ENGINE_ERROR_LIMIT`]
/// bytes, under the body's usual bounds), which gives its slot back.
async fn engine_refused(routed: &Routed, target: &Target, answer: Response<Streamed>) -> Bytes {
    use http_body_util::BodyExt as _;
    let status = answer.status().as_u16();
    let body = http_body_util::Limited::new(answer.into_body(), ENGINE_ERROR_LIMIT);
    let text = body
        .collect()
        .await
        .map(http_body_util::Collected::to_bytes)
        .unwrap_or_default();
    let engine: serde_json::Value =
        serde_json::from_slice(&text).unwrap_or(serde_json::Value::Null);
    let upstream = &target.upstream.name;
    let problem = slotgate_problem::Problem::upstream_bad_response(upstream, &routed.route.model)
        .with_detail(format!(
            "Upstream `{upstream}` answered {status} instead of a stream after the request \
             had queued (the client already had its 200)."
        ))
        .with_extension("upstream_status", status)
        .with_extension("upstream_error", engine);
    ending(routed, problem)
}
