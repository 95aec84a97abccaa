//! Unit tests for [`SlotBody`]: the guard goes at the end, on an error, and on an early drop.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty, Full};
use prometheus_client::metrics::counter::Counter;

use super::{Completion, SlotBody, SlotGuard, Watch};
use crate::upstreams::target::AnswerNames;

/// Records how the body ended.
#[derive(Clone, Default)]
struct Recorder(Arc<Mutex<Vec<Completion>>>);

impl Recorder {
    fn seen(&self) -> Vec<Completion> {
        self.0.lock().unwrap().clone()
    }
}

impl SlotGuard for Recorder {
    fn finish(self, how: Completion) {
        self.0.lock().unwrap().push(how);
    }
}

type Chunk = Result<Frame<Bytes>, std::io::Error>;

/// A body that yields the given frames (each at once) and then ends.
struct Frames(VecDeque<Chunk>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        Poll::Ready(self.0.pop_front())
    }
}

fn stream_of(chunks: Vec<Chunk>) -> Frames {
    Frames(chunks.into())
}

#[tokio::test]
async fn releases_when_the_body_ends_and_passes_frames_through() {
    let rec = Recorder::default();
    let mut body = SlotBody::new(
        stream_of(vec![
            Ok(Frame::data(Bytes::from_static(b"data: 1\n\n"))),
            Ok(Frame::data(Bytes::from_static(b"data: 2\n\n"))),
        ]),
        rec.clone(),
    );
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, Bytes::from_static(b"data: 1\n\n"));
    assert!(rec.seen().is_empty(), "still streaming");
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(second, Bytes::from_static(b"data: 2\n\n"));
    assert!(body.frame().await.is_none());
    assert_eq!(rec.seen(), vec![Completion::Ended]);
    drop(body);
    assert_eq!(rec.seen(), vec![Completion::Ended], "released exactly once");
}

#[tokio::test]
async fn releases_with_the_last_frame_of_a_sized_body() {
    let rec = Recorder::default();
    let mut body = SlotBody::new(Full::new(Bytes::from_static(b"{}")), rec.clone());
    assert_eq!(body.size_hint().exact(), Some(2));
    assert!(!body.is_end_stream());
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"{}"));
    // Full knows it is done after its only frame: no need to wait for the `None`.
    assert_eq!(rec.seen(), vec![Completion::Ended]);
    assert!(!body.is_holding());
    assert!(body.is_end_stream());
}

#[tokio::test]
async fn releases_on_an_error() {
    let rec = Recorder::default();
    let mut body = SlotBody::new(
        stream_of(vec![
            Ok(Frame::data(Bytes::from_static(b"data: 1\n\n"))),
            Err(std::io::Error::other("upstream went away")),
        ]),
        rec.clone(),
    );
    assert!(body.frame().await.unwrap().is_ok());
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(rec.seen(), vec![Completion::Failed]);
    drop(body);
    assert_eq!(rec.seen(), vec![Completion::Failed]);
}

#[tokio::test]
async fn releases_when_dropped_mid_stream() {
    let rec = Recorder::default();
    let mut body = SlotBody::new(
        stream_of(vec![
            Ok(Frame::data(Bytes::from_static(b"data: 1\n\n"))),
            Ok(Frame::data(Bytes::from_static(b"data: 2\n\n"))),
        ]),
        rec.clone(),
    );
    assert!(body.frame().await.unwrap().is_ok());
    assert!(body.is_holding());
    drop(body);
    assert_eq!(
        rec.seen(),
        vec![Completion::Dropped {
            grace: Duration::ZERO
        }]
    );
}

#[test]
fn an_empty_body_dropped_unpolled_counts_as_ended() {
    let rec = Recorder::default();
    let body = SlotBody::new(Empty::<Bytes>::new(), rec.clone());
    assert!(body.is_end_stream());
    drop(body);
    assert_eq!(rec.seen(), vec![Completion::Ended]);
}

/// A body that yields the given frames and then goes silent for good (a stalled engine).
struct ThenSilence(VecDeque<Chunk>);

impl Body for ThenSilence {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        match self.0.pop_front() {
            Some(chunk) => Poll::Ready(Some(chunk)),
            None => Poll::Pending,
        }
    }
}

const IDLE: Duration = Duration::from_secs(30);
const GRACE: Duration = Duration::from_secs(2);

#[tokio::test]
async fn dropped_before_the_first_byte_keeps_the_slot_for_the_cancel_grace() {
    // The head came (the body exists), no byte of it yet: an engine in prefill.
    let rec = Recorder::default();
    let (watching, _, _) = watch(false);
    let mut body = SlotBody::new(
        ThenSilence(vec![Ok(Frame::data(Bytes::new()))].into()),
        rec.clone(),
    )
    .watched(watching);
    // An empty frame is not a byte of the answer.
    assert!(body.frame().await.unwrap().is_ok());
    drop(body);
    assert_eq!(rec.seen(), vec![Completion::Dropped { grace: GRACE }]);

    // After the first byte the engine notices at its next write: no grace.
    let rec = Recorder::default();
    let (watching, _, _) = watch(true);
    let data = Frame::data(Bytes::from_static(b"data: 1\n\n"));
    let mut body = SlotBody::new(ThenSilence(vec![Ok(data)].into()), rec.clone()).watched(watching);
    assert!(body.frame().await.unwrap().is_ok());
    drop(body);
    assert_eq!(
        rec.seen(),
        vec![Completion::Dropped {
            grace: Duration::ZERO
        }]
    );
}

fn watch(sse: bool) -> (Watch, Counter, Counter) {
    let (stalled, cut) = (Counter::default(), Counter::default());
    let watch = Watch {
        idle_timeout: IDLE,
        cancel_grace: GRACE,
        framing: sse.then_some(slotgate_problem::Framing::Sse),
        dialect: slotgate_problem::Dialect::OpenAi,
        names: Arc::new(AnswerNames {
            upstream: "a".into(),
            model: "m".into(),
        }),
        request_id: HeaderValue::from_static("req-1"),
        stalled: stalled.clone(),
        cut: cut.clone(),
        deadline: None,
        too_long: Counter::default(),
        meter: None,
    };
    (watch, stalled, cut)
}

/// A body that sends a frame every `every`, for ever: an engine that never pauses long enough
/// to stall.
struct Ticks {
    every: Duration,
    next: Pin<Box<tokio::time::Sleep>>,
}

impl Ticks {
    fn new(every: Duration) -> Self {
        Self {
            every,
            next: Box::pin(tokio::time::sleep(every)),
        }
    }
}

impl Body for Ticks {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
        if self.next.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        let at = tokio::time::Instant::now() + self.every;
        self.next.as_mut().reset(at);
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"data: t\n\n")))))
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_past_its_stream_timeout_ends_with_an_error_event() {
    let rec = Recorder::default();
    let (mut watch, stalled, cut) = watch(true);
    let total = Duration::from_secs(1);
    let too_long = watch.too_long.clone();
    let started = tokio::time::Instant::now();
    watch.deadline = Some((started + total, total));
    let mut body =
        SlotBody::new(Ticks::new(Duration::from_millis(100)), rec.clone()).watched(watch);
    let mut ticks = 0;
    let last = loop {
        let data = body.frame().await.unwrap().unwrap().into_data().unwrap();
        if data != Bytes::from_static(b"data: t\n\n") {
            break event(Frame::data(data));
        }
        ticks += 1;
    };
    // A tick every 100 ms is never a stall, yet the answer ends at the deadline.
    assert_eq!(started.elapsed(), total);
    assert!((8..=10).contains(&ticks), "{ticks} ticks");
    assert_eq!(last["type"], "https://slotgate.dev/problems/stream-timeout");
    assert_eq!(last["timeout_ms"], 1000);
    assert_eq!(last["request_id"], "req-1");
    assert!(body.frame().await.is_none(), "a clean end after the event");
    assert_eq!(rec.seen(), vec![Completion::Stalled { grace: GRACE }]);
    assert_eq!((too_long.get(), stalled.get(), cut.get()), (1, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_non_sse_answer_past_its_stream_timeout_is_cut() {
    let rec = Recorder::default();
    let (mut watch, _, _) = watch(false);
    let total = Duration::from_secs(1);
    watch.deadline = Some((tokio::time::Instant::now() + total, total));
    let mut body =
        SlotBody::new(Ticks::new(Duration::from_millis(300)), rec.clone()).watched(watch);
    let mut frames = 0;
    let error = loop {
        match body.frame().await.unwrap() {
            Ok(_) => frames += 1,
            Err(error) => break error,
        }
    };
    assert_eq!(frames, 3);
    assert!(error.to_string().contains("stream timeout"), "{error}");
    assert!(body.frame().await.is_none());
    assert_eq!(rec.seen(), vec![Completion::Stalled { grace: GRACE }]);
}

fn event(frame: Frame<Bytes>) -> serde_json::Value {
    let data = frame.into_data().unwrap();
    let text = std::str::from_utf8(&data).unwrap();
    let json = text
        .strip_prefix("data: ")
        .unwrap()
        .strip_suffix("\n\n")
        .unwrap();
    serde_json::from_str(json).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_stalled_sse_answer_ends_with_an_error_event_and_a_clean_end() {
    let rec = Recorder::default();
    let (watch, stalled, _) = watch(true);
    let mut body = SlotBody::new(
        ThenSilence(vec![Ok(Frame::data(Bytes::from_static(b"data: 1\n\n")))].into()),
        rec.clone(),
    )
    .watched(watch);
    assert!(body.frame().await.unwrap().is_ok());
    let started = tokio::time::Instant::now();
    let last = event(body.frame().await.unwrap().unwrap());
    assert_eq!(started.elapsed(), IDLE);
    assert_eq!(
        last["type"],
        "https://slotgate.dev/problems/upstream-stalled"
    );
    assert_eq!(last["error"]["code"], "upstream_stalled");
    assert_eq!(last["request_id"], "req-1");
    assert!(body.frame().await.is_none(), "a clean end after the event");
    assert!(body.is_end_stream());
    assert_eq!(rec.seen(), vec![Completion::Stalled { grace: GRACE }]);
    assert_eq!(stalled.get(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_slow_reader_is_not_a_stall() {
    let rec = Recorder::default();
    let (watch, stalled, _) = watch(true);
    let mut body = SlotBody::new(
        ThenSilence(
            vec![
                Ok(Frame::data(Bytes::from_static(b"data: 1\n\n"))),
                Ok(Frame::data(Bytes::from_static(b"data: 2\n\n"))),
            ]
            .into(),
        ),
        rec.clone(),
    )
    .watched(watch);
    assert!(body.frame().await.unwrap().is_ok());
    // The client reads nothing for longer than the idle timeout; the upstream had sent more.
    tokio::time::sleep(IDLE * 3).await;
    let second = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(second, Bytes::from_static(b"data: 2\n\n"));
    assert!(rec.seen().is_empty() && body.is_holding());
    assert_eq!(stalled.get(), 0);
}

#[tokio::test]
async fn an_sse_answer_cut_by_the_engine_ends_with_an_error_event() {
    let rec = Recorder::default();
    let (watch, _, cut) = watch(true);
    let mut body = SlotBody::new(
        stream_of(vec![
            Ok(Frame::data(Bytes::from_static(b"data: 1\n\n"))),
            Err(std::io::Error::other("connection reset")),
        ]),
        rec.clone(),
    )
    .watched(watch);
    assert!(body.frame().await.unwrap().is_ok());
    let last = event(body.frame().await.unwrap().unwrap());
    assert_eq!(
        last["type"],
        "https://slotgate.dev/problems/upstream-stalled"
    );
    assert!(
        last["detail"]
            .as_str()
            .unwrap()
            .contains("connection reset")
    );
    assert!(body.frame().await.is_none());
    assert_eq!(rec.seen(), vec![Completion::Failed]);
    assert_eq!(cut.get(), 1);
}

#[tokio::test]
async fn an_sse_answer_cut_mid_event_drops_the_half_event_before_the_error() {
    let rec = Recorder::default();
    let (watch, _, _) = watch(true);
    let mut body = SlotBody::new(
        stream_of(vec![
            Ok(Frame::data(Bytes::from_static(b"data: 1\n\ndata: {\"a\""))),
            Ok(Frame::data(Bytes::from_static(
                b":2}\n\ndata: {\"content\":\"hal",
            ))),
            Err(std::io::Error::other("connection reset")),
        ]),
        rec.clone(),
    )
    .watched(watch);
    let data = |frame: Frame<Bytes>| frame.into_data().unwrap();
    assert_eq!(data(body.frame().await.unwrap().unwrap()), "data: 1\n\n");
    // The event split across two frames goes on whole, once its end came.
    assert_eq!(
        data(body.frame().await.unwrap().unwrap()),
        "data: {\"a\":2}\n\n"
    );
    let last = event(body.frame().await.unwrap().unwrap());
    assert_eq!(
        last["type"],
        "https://slotgate.dev/problems/upstream-stalled"
    );
    assert!(body.frame().await.is_none());
    assert_eq!(rec.seen(), vec![Completion::Failed]);
}

#[tokio::test]
async fn an_sse_answer_that_ends_cleanly_mid_event_keeps_its_last_bytes() {
    let rec = Recorder::default();
    let (watch, _, _) = watch(true);
    let mut body = SlotBody::new(
        stream_of(vec![Ok(Frame::data(Bytes::from_static(
            b"data: 1\n\ndata: [DONE]",
        )))]),
        rec.clone(),
    )
    .watched(watch);
    let mut all = Vec::new();
    while let Some(frame) = body.frame().await {
        all.extend_from_slice(&frame.unwrap().into_data().unwrap());
    }
    assert_eq!(all, b"data: 1\n\ndata: [DONE]");
    assert_eq!(rec.seen(), vec![Completion::Ended]);
}

#[tokio::test]
async fn a_cut_answer_that_is_not_sse_stays_cut() {
    let rec = Recorder::default();
    let (watch, _, cut) = watch(false);
    let mut body = SlotBody::new(
        stream_of(vec![Err(std::io::Error::other("connection reset"))]),
        rec.clone(),
    )
    .watched(watch);
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(rec.seen(), vec![Completion::Failed]);
    assert_eq!(cut.get(), 1);
}
