//! Affinity for the Responses API: which upstream holds a response the gateway passed on.
//!
//! An engine that stores responses (vLLM with its store on) can continue a conversation
//! (`previous_response_id`) or answer `GET /v1/responses/{id}` only for ids *it* made; another
//! host answers 404, or worse, silently starts a new conversation. So the gateway records
//! `id → upstream` as each `/v1/responses` answer passes through ([`Sniff`], streamed or not)
//! and sends follow-ups there, never elsewhere.
//!
//! The record is bounded twice, both settings: at most `response_affinity_entries` ids (the
//! oldest goes first) and each for at most `response_affinity_ttl`. [`ResponseAffinity`] is
//! the interface; [`LocalAffinity`] keeps it in this process. A store shared by several
//! gateway replicas (Redis) can implement the same trait.

use std::collections::{HashMap, VecDeque};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use http_body::{Body, Frame, SizeHint};
use parking_lot::Mutex;
use pin_project_lite::pin_project;

/// Where each response id the gateway passed on was made.
pub(crate) trait ResponseAffinity: Send + Sync + std::fmt::Debug {
    /// Records that upstream `upstream` (its configured name) made response `id`.
    fn record(&self, id: &str, upstream: &str);
    /// The upstream that made `id`, unless it is unknown or expired.
    fn lookup(&self, id: &str) -> Option<String>;
    /// Forgets `id` (the client deleted the response).
    fn forget(&self, id: &str);
}

/// [`ResponseAffinity`] in this process's memory, bounded in entries and age.
#[derive(Debug)]
pub(crate) struct LocalAffinity {
    capacity: usize,
    ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    by_id: HashMap<String, (String, Instant)>,
    /// Ids in the order they were recorded, with the time each was; an id recorded again has
    /// a stale entry here, told apart by its time.
    order: VecDeque<(String, Instant)>,
}

impl LocalAffinity {
    /// An empty record of at most `capacity` ids, each kept for `ttl`.
    pub(crate) fn new(capacity: usize, ttl: Duration) -> Self {
        Self {
            capacity,
            ttl,
            inner: Mutex::default(),
        }
    }

    fn record_at(&self, id: &str, upstream: &str, now: Instant) {
        let mut inner = self.inner.lock();
        inner
            .by_id
            .insert(id.to_owned(), (upstream.to_owned(), now));
        inner.order.push_back((id.to_owned(), now));
        // Drop what expired, then the oldest while over capacity.
        while let Some((oldest, at)) = inner.order.front().cloned() {
            let expired = now.saturating_duration_since(at) > self.ttl;
            // Stale entries (ids recorded again) count against the queue's own bound.
            if !expired
                && inner.by_id.len() <= self.capacity
                && inner.order.len() <= 2 * self.capacity
            {
                break;
            }
            inner.order.pop_front();
            if inner
                .by_id
                .get(&oldest)
                .is_some_and(|(_, when)| *when == at)
            {
                inner.by_id.remove(&oldest);
            }
        }
    }

    fn lookup_at(&self, id: &str, now: Instant) -> Option<String> {
        let inner = self.inner.lock();
        let (upstream, at) = inner.by_id.get(id)?;
        (now.saturating_duration_since(*at) <= self.ttl).then(|| upstream.clone())
    }
}

impl ResponseAffinity for LocalAffinity {
    fn record(&self, id: &str, upstream: &str) {
        self.record_at(id, upstream, Instant::now());
    }

    fn lookup(&self, id: &str) -> Option<String> {
        self.lookup_at(id, Instant::now())
    }

    fn forget(&self, id: &str) {
        // Its `order` entry goes when it reaches the front.
        self.inner.lock().by_id.remove(id);
    }
}

/// How much of an answer's start is searched for its `id`: every engine writes the response id
/// first (in the JSON object, and in the first SSE event, `response.created`).
const SNIFF_LIMIT: usize = 16 * 1024;

/// The first `"id": "…"` member in `head`: `Ok(Some)` when found, `Ok(None)` when `head` may
/// still be too short, `Err(())` when it cannot be there.
fn first_id(head: &[u8]) -> Result<Option<String>, ()> {
    let Some(at) = head.windows(4).position(|w| w == b"\"id\"") else {
        return Ok(None);
    };
    let rest = &head[at + 4..];
    let rest = rest.trim_ascii_start();
    let Some(rest) = rest.strip_prefix(b":") else {
        return if rest.is_empty() { Ok(None) } else { Err(()) };
    };
    let rest = rest.trim_ascii_start();
    match serde_json::Deserializer::from_slice(rest)
        .into_iter::<String>()
        .next()
    {
        Some(Ok(id)) if !id.is_empty() => Ok(Some(id)),
        Some(Err(error)) if error.is_eof() => Ok(None),
        None => Ok(None),
        _ => Err(()),
    }
}

/// What [`Sniff`] records to.
#[derive(Debug)]
pub(crate) struct Recorder {
    store: Arc<dyn ResponseAffinity>,
    upstream: String,
    head: BytesMut,
}

impl Recorder {
    /// Records the id of the answer to `store` as made by `upstream`.
    pub(crate) fn new(store: Arc<dyn ResponseAffinity>, upstream: String) -> Self {
        Self {
            store,
            upstream,
            head: BytesMut::new(),
        }
    }

    /// Looks at the next bytes; `true` when done (recorded, or given up).
    fn see(&mut self, data: &[u8]) -> bool {
        let room = SNIFF_LIMIT.saturating_sub(self.head.len());
        self.head.extend_from_slice(&data[..data.len().min(room)]);
        match first_id(&self.head) {
            Ok(Some(id)) => {
                self.store.record(&id, &self.upstream);
                true
            }
            Ok(None) => self.head.len() >= SNIFF_LIMIT,
            Err(()) => true,
        }
    }
}

pin_project! {
    /// A response body passed through frame for frame, whose start is searched for the
    /// response id (when it has a [`Recorder`]).
    #[derive(Debug)]
    pub(crate) struct Sniff<B> {
        #[pin]
        inner: B,
        recorder: Option<Recorder>,
    }
}

impl<B> Sniff<B> {
    /// Wraps `inner`, recording its id with `recorder` if there is one.
    pub(crate) fn new(inner: B, recorder: Option<Recorder>) -> Self {
        Self { inner, recorder }
    }
}

impl<B> Body for Sniff<B>
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
        let polled = this.inner.poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled
            && let Some(data) = frame.data_ref()
            && let Some(recorder) = this.recorder
            && recorder.see(data.chunk())
        {
            *this.recorder = None;
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{LocalAffinity, first_id};

    #[test]
    fn finds_the_first_id_of_json_and_of_an_sse_stream() {
        let json = br#"{"id": "resp_1", "output": [{"id": "msg_1"}]}"#;
        assert_eq!(first_id(json), Ok(Some("resp_1".into())));
        let sse = b"event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":\"resp_2\",";
        assert_eq!(first_id(sse), Ok(Some("resp_2".into())));
        assert_eq!(
            first_id(br#"{"object":"response","id":"resp_"#),
            Ok(None),
            "cut mid-id"
        );
        assert_eq!(first_id(br#"{"object":"#), Ok(None));
        assert_eq!(first_id(br#"{"id": 7}"#), Err(()));
    }

    #[test]
    fn forgets_the_oldest_past_capacity_and_everything_past_its_ttl() {
        let affinity = LocalAffinity::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        affinity.record_at("a", "gpu-a", t0);
        affinity.record_at("b", "gpu-b", t0);
        affinity.record_at("c", "gpu-a", t0);
        assert_eq!(affinity.lookup_at("a", t0), None, "over capacity");
        assert_eq!(affinity.lookup_at("b", t0).as_deref(), Some("gpu-b"));
        assert_eq!(affinity.lookup_at("c", t0).as_deref(), Some("gpu-a"));
        let later = t0 + Duration::from_secs(61);
        assert_eq!(affinity.lookup_at("b", later), None, "expired");
        affinity.record_at("d", "gpu-b", later);
        assert_eq!(affinity.inner.lock().by_id.len(), 1, "expired ones dropped");
    }

    #[test]
    fn an_id_recorded_again_keeps_its_newest_upstream() {
        let affinity = LocalAffinity::new(2, Duration::from_secs(60));
        let t0 = Instant::now();
        affinity.record_at("a", "gpu-a", t0);
        affinity.record_at("a", "gpu-b", t0 + Duration::from_secs(1));
        affinity.record_at("b", "gpu-a", t0 + Duration::from_secs(2));
        assert_eq!(
            affinity
                .lookup_at("a", t0 + Duration::from_secs(2))
                .as_deref(),
            Some("gpu-b")
        );
    }
}
