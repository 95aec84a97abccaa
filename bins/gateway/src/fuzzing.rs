//! Entry points for the fuzz targets in `fuzz/` (`docs/fuzzing.md`), and for nothing else.
//!
//! The fuzz targets are a separate package, so they see only what this crate exports, while the
//! parsers they drive are internal (`pub(crate)`). Each function here calls the gateway's own
//! code, the very function the request path or the probes call, and adds nothing of its own: a
//! target that fuzzed a copy would prove nothing about the gateway. What comes back is reduced
//! to plain values so that no internal type has to become public.
//!
//! Hidden from the documentation and outside any stability promise: it changes whenever the
//! code it wraps does, and nothing but `fuzz/` may use it.

use std::fmt;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::HeaderValue;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http_body::Frame;
use http_body_util::{BodyExt, Full, StreamBody};
use parking_lot::Mutex;
use prometheus_client::metrics::counter::Counter;
use slotgate_exposition::Samples;

use crate::metrics::Metrics;
use crate::proxy::affinity::{Recorder, ResponseAffinity, Sniff};
use crate::proxy::body::{SlotBody, Watch};
use crate::proxy::endpoint::Endpoint;
use crate::proxy::problems;
use crate::proxy::request::{self, BodyBudget, BodyLimits};
use crate::upstreams::probe::{self, LlamaProps, LlamaSlot, ModelList, OllamaPs, ProbeError};
use crate::upstreams::target::AnswerNames;

/// Runs `future` to its end on a runtime of this thread's own, with a clock: the request
/// reader bounds its body with `tokio::time::timeout`, and a watched body arms timers.
fn block_on<F: Future>(future: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime with a clock builds");
    }
    RUNTIME.with(|runtime| runtime.block_on(future))
}

// === the request reader ===

/// What the request reader made of a request.
#[derive(Debug)]
pub enum ReadOutcome {
    /// Read and understood.
    Read(Request),
    /// Refused: the status and the problem document the client would get.
    Refused {
        /// The response status.
        status: u16,
        /// The response body (`application/problem+json`).
        problem: Bytes,
    },
}

/// A request the reader accepted (boxed: it is large next to a refusal).
#[derive(Debug)]
pub struct Request(Box<request::ApiRequest>);

impl Request {
    /// The `model` member (or form field), unescaped; `None` only where the route lets it be
    /// absent.
    pub fn model(&self) -> Option<&str> {
        self.0.model.as_deref()
    }

    /// The `stream` member (the route's default when absent).
    pub fn stream(&self) -> bool {
        self.0.stream
    }

    /// The engine slots the request takes (`n`, `best_of` where the route weighs them).
    pub fn sequences(&self) -> usize {
        self.0.sequences
    }

    /// The body as read.
    pub fn body(&self) -> &[u8] {
        &self.0.body
    }

    /// Where the `model` value (with its quotes, in JSON) sits in the body.
    pub fn model_span(&self) -> Range<usize> {
        self.0.model_span()
    }

    /// The body sent to an upstream that calls the model `upstream_model`.
    pub fn body_for(&self, upstream_model: &str) -> Bytes {
        self.0.body_for(upstream_model)
    }
}

/// Reads a `POST` to the model-routed endpoint `path` with this `Content-Type` (none when
/// `None`) and body, under `limit` bytes, as the request path does; `declare_length` adds the
/// `Content-Length` hyper would pass for a length-delimited body. The body budget is roomy and
/// the deadline long: the body is in memory, so neither is what is tested here.
///
/// `None` when `path` is not a model-routed endpoint, or the header value is one hyper refuses
/// before the gateway sees the request.
pub fn read_request(
    path: &str,
    content_type: Option<&[u8]>,
    body: &[u8],
    declare_length: bool,
    limit: usize,
) -> Option<ReadOutcome> {
    let endpoint = Endpoint::find(path)?;
    let mut builder = http::Request::post(path);
    if let Some(value) = content_type {
        builder = builder.header(CONTENT_TYPE, HeaderValue::from_bytes(value).ok()?);
    }
    if declare_length {
        builder = builder.header(CONTENT_LENGTH, body.len());
    }
    let req = builder.body(Full::new(Bytes::copy_from_slice(body))).ok()?;
    let budget = BodyBudget::new(usize::MAX, &Metrics::new());
    let limits = BodyLimits {
        max_bytes: limit,
        timeout: Duration::from_secs(3600),
        budget: &budget,
    };
    Some(match block_on(request::read(req, limits, endpoint)) {
        Ok(request) => ReadOutcome::Read(Request(Box::new(request))),
        Err(error) => {
            let response = problems::respond::<Bytes>(
                &error,
                &HeaderValue::from_static("fuzzing"),
                slotgate_problem::Dialect::OpenAi,
            );
            ReadOutcome::Refused {
                status: response.status().as_u16(),
                problem: response.into_body(),
            }
        }
    })
}

// === the answer stream ===

/// What came out of an upstream's answer after the gateway's wrappers.
#[derive(Debug)]
pub struct StreamOutcome {
    /// The data frames the client got, in order.
    pub frames: Vec<Bytes>,
    /// Whether the body ended with an error (the answer is cut at the client).
    pub failed: bool,
    /// The response id the affinity sniffer recorded, if any.
    pub recorded: Option<String>,
}

/// Streams `chunks`, one data frame each, through the wrappers every slot-holding answer goes
/// through ([`SlotBody`] with a [`Watch`], around the response-id [`Sniff`]), as an answer of
/// `upstream` for `model`; the upstream's body fails after the last chunk when `cut`, and the
/// answer is `text/event-stream` when `sse`.
pub fn stream(
    chunks: &[&[u8]],
    cut: bool,
    sse: bool,
    upstream: &str,
    model: &str,
) -> StreamOutcome {
    let store = Arc::new(FirstRecord::default());
    // The upstream's body: each chunk a frame, then an error when `cut`.
    let frames = chunks
        .iter()
        .map(|chunk| Ok(Frame::data(Bytes::copy_from_slice(chunk))));
    let failure = cut.then(|| Err(std::io::Error::from(std::io::ErrorKind::ConnectionReset)));
    let inner = StreamBody::new(futures::stream::iter(frames.chain(failure)));
    let sniffer = Recorder::new(
        Arc::clone(&store) as Arc<dyn ResponseAffinity>,
        upstream.to_owned(),
    );
    let (frames, failed) = block_on(async {
        let watch = Watch {
            idle_timeout: Duration::from_secs(3600),
            cancel_grace: Duration::ZERO,
            framing: sse.then_some(slotgate_problem::Framing::Sse),
            dialect: slotgate_problem::Dialect::OpenAi,
            names: Arc::new(AnswerNames {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
            }),
            request_id: HeaderValue::from_static("fuzzing"),
            stalled: Counter::default(),
            cut: Counter::default(),
            deadline: None,
            too_long: Counter::default(),
            meter: None,
        };
        let mut body = SlotBody::new(Sniff::new(inner, Some(sniffer)), ()).watched(watch);
        let mut frames = Vec::new();
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => frames.extend(frame.into_data().ok()),
                Err(_) => return (frames, true),
            }
        }
        (frames, false)
    });
    let recorded = store.id.lock().clone();
    StreamOutcome {
        frames,
        failed,
        recorded,
    }
}

/// Keeps the first id recorded.
#[derive(Debug, Default)]
struct FirstRecord {
    id: Mutex<Option<String>>,
}

impl ResponseAffinity for FirstRecord {
    fn record(&self, id: &str, _upstream: &str) {
        self.id.lock().get_or_insert_with(|| id.to_owned());
    }

    fn lookup(&self, _id: &str) -> Option<String> {
        None
    }

    fn forget(&self, _id: &str) {}
}

// === the engines' answers ===

/// An engine answer the probes would refuse.
#[derive(Debug)]
pub struct AnswerError(ProbeError);

impl fmt::Display for AnswerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for AnswerError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.0.source()
    }
}

/// An engine's `/metrics` text as the probes read it.
#[derive(Debug)]
pub struct EngineMetrics(Samples);

impl EngineMetrics {
    /// The sum of the samples named `name` carrying all of `labels`; `None` when none matches.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.0.sum(name, labels)
    }
}

/// A 2xx `GET /metrics` body (llama-server, vLLM) as the probes decode it.
pub fn engine_metrics(body: &[u8]) -> Result<EngineMetrics, AnswerError> {
    probe::decode_metrics("/metrics", body)
        .map(EngineMetrics)
        .map_err(AnswerError)
}

/// A 2xx llama-server `GET /slots` body: each slot's `is_processing`.
pub fn engine_slots(body: &[u8]) -> Result<Vec<bool>, AnswerError> {
    let slots: Vec<LlamaSlot> = probe::decode_json("/slots", body).map_err(AnswerError)?;
    Ok(slots.iter().map(|slot| slot.is_processing).collect())
}

/// A 2xx llama-server `GET /props` body: its `total_slots`.
pub fn engine_props(body: &[u8]) -> Result<usize, AnswerError> {
    let props: LlamaProps = probe::decode_json("/props", body).map_err(AnswerError)?;
    Ok(props.total_slots)
}

/// A 2xx model listing (`/models`, `/v1/models`): each model's names, its id first.
pub fn engine_models(body: &[u8]) -> Result<Vec<Vec<String>>, AnswerError> {
    let list: ModelList = probe::decode_json("/models", body).map_err(AnswerError)?;
    Ok(list
        .data
        .iter()
        .map(|card| card.names().map(str::to_owned).collect())
        .collect())
}

/// A 2xx Ollama `GET /api/ps` body: the resident models' names.
pub fn ollama_ps(body: &[u8]) -> Result<Vec<String>, AnswerError> {
    let ps: OllamaPs = probe::decode_json("/api/ps", body).map_err(AnswerError)?;
    Ok(ps.models.into_iter().map(|model| model.name).collect())
}

/// The message the probes take from a non-2xx body, if any.
pub fn engine_error_message(body: &[u8]) -> Option<String> {
    probe::error_message(body)
}

#[cfg(test)]
mod tests {
    use super::{ReadOutcome, engine_metrics, engine_slots, read_request, stream};

    const CHAT: &str = "/v1/chat/completions";

    #[test]
    fn the_request_reader_reads_and_refuses_as_the_request_path_does() {
        let body = br#"{"model":"m","stream":true}"#;
        let Some(ReadOutcome::Read(request)) =
            read_request(CHAT, Some(b"application/json"), body, true, 1024)
        else {
            panic!("a valid request was not read");
        };
        assert_eq!((request.model(), request.stream()), (Some("m"), true));
        assert_eq!(&body[request.model_span()], br#""m""#);
        assert_eq!(
            request.body_for("n"),
            &br#"{"model":"n","stream":true}"#[..]
        );

        let Some(ReadOutcome::Refused { status, problem }) =
            read_request(CHAT, None, body, false, 1024)
        else {
            panic!("a request without a content type was read");
        };
        assert_eq!(status, 415);
        assert!(serde_json::from_slice::<serde_json::Value>(&problem).is_ok());
        assert!(read_request(CHAT, Some(b"bad\nvalue"), body, false, 1024).is_none());
        assert!(read_request("/v1/models", Some(b"application/json"), body, false, 1024).is_none());
    }

    #[test]
    fn engine_answers_decode_as_the_probes_decode_them() {
        let metrics = engine_metrics(b"llamacpp:requests_processing 2\n").expect("metrics");
        assert_eq!(metrics.sum("llamacpp:requests_processing", &[]), Some(2.0));
        assert!(engine_metrics(b"\xff").is_err());
        let slots = engine_slots(br#"[{"is_processing":true},{"is_processing":false}]"#);
        assert_eq!(slots.expect("slots"), [true, false]);
    }

    #[test]
    fn an_answer_passes_through_and_a_cut_sse_answer_ends_with_an_error_event() {
        let chunks: [&[u8]; 2] = [b"data: {\"id\":", b" \"resp_1\"}\n\n"];
        let whole = stream(&chunks, false, true, "gpu-a", "m");
        assert!(!whole.failed);
        assert_eq!(whole.frames.concat(), chunks.concat());
        assert_eq!(whole.recorded.as_deref(), Some("resp_1"));

        let cut = stream(&chunks, true, true, "gpu-a", "m");
        assert!(
            !cut.failed,
            "an SSE answer ends cleanly after its error event"
        );
        let last = cut.frames.last().expect("the error event");
        assert!(last.starts_with(b"data: {") && last.ends_with(b"\n\n"));
        assert!(stream(&chunks, true, false, "gpu-a", "m").failed);
    }
}
