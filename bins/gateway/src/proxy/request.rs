//! Step 3: read the request body under a size limit and find out which model it asks for.
//!
//! An upload (`multipart/form-data`, the audio routes) is read the same way under its own limit,
//! and its model found by [`form`], which stops at the `model` field.
//!
//! The body is read whole (inference requests are small next to their answers, and the model
//! must be known before a host can be chosen), under the configured limit: a `Content-Length`
//! above the limit is refused before a byte is read, and a chunked body is refused the moment it
//! passes the limit. The limit is `max_body_bytes` (32 MiB by default: vision requests carry
//! images as base64), or `max_upload_bytes` for an upload.
//!
//! Two more bounds keep slow or many bodies from holding the gateway (a body cannot be
//! forwarded before it is whole, so it has to be buffered):
//!
//! - a deadline, `body_read_timeout`, from the end of the head to the body's last byte: a client
//!   that trickles its body (slowloris) gets 408 `body-timeout` and loses its connection;
//! - a budget, `max_buffered_body_bytes`, shared by every request: each body takes from it the
//!   memory its buffer takes as it arrives (the capacity, which for a body of unknown length
//!   runs ahead of its length: see [`collect`]) and gives it back when the request is over
//!   (answered, refused, or gone). A body that would overdraw it gets 503 `overloaded` at once.
//!   The per-request limit alone cannot bound memory: 200 streams on one HTTP/2 connection each
//!   stay under it.
//!
//! `model` and `stream` are read with `serde_json` into a small borrowed struct; every other
//! member is skipped, not copied. The original bytes are what goes upstream: nothing is
//! re-serialised, so numbers, key order and unknown fields reach the engine exactly as the
//! client wrote them. The one exception is a model the engine knows by another name than the
//! client sent (an alias, or the upstream's `engine_model`): then the bytes of the `model` value
//! (and only those) are replaced, see [`ApiRequest::body_for`].

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use http::request::Parts;
use http::{HeaderMap, Request};
use http_body::Body;
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::{Bound, Metrics};
use crate::proxy::endpoint::{Endpoint, ModelIn, Weighed};
use crate::proxy::problems::{BadRequest, Error};
use crate::support::error::BoxError;

/// The request-body bytes the whole gateway may buffer at once (`max_buffered_body_bytes`).
#[derive(Debug)]
pub(crate) struct BodyBudget {
    bytes: Arc<Semaphore>,
    total: usize,
    spent: Counter,
    timed_out: Counter,
}

impl BodyBudget {
    /// A budget of `total` bytes, counting refusals and body timeouts in `metrics`.
    pub(crate) fn new(total: usize, metrics: &Metrics) -> Self {
        let total = total.min(Semaphore::MAX_PERMITS);
        Self {
            bytes: Arc::new(Semaphore::new(total)),
            total,
            spent: metrics.bound(Bound::BodyBudget),
            timed_out: metrics.bound(Bound::BodyTimeout),
        }
    }

    /// Bytes buffered now.
    #[cfg(test)]
    pub(crate) fn in_use(&self) -> usize {
        self.total - self.bytes.available_permits()
    }

    /// Takes `len` more bytes into `held`, or says the budget is spent.
    fn take(&self, len: usize, held: &mut Option<OwnedSemaphorePermit>) -> Result<(), Error> {
        let Ok(count) = u32::try_from(len) else {
            return Err(self.refuse());
        };
        let Ok(permit) = Arc::clone(&self.bytes).try_acquire_many_owned(count) else {
            return Err(self.refuse());
        };
        match held {
            Some(held) => held.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }

    fn refuse(&self) -> Error {
        self.spent.inc();
        Error::Overloaded { budget: self.total }
    }
}

/// What bounds the reading of one body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimits<'a> {
    /// Largest body, in bytes (`max_body_bytes`, or `max_upload_bytes` for an upload).
    pub(crate) max_bytes: usize,
    /// Time for the whole body (`body_read_timeout`).
    pub(crate) timeout: Duration,
    /// The gateway-wide budget.
    pub(crate) budget: &'a BodyBudget,
}

/// A request to one of the model-routed endpoints, read and understood.
#[derive(Debug)]
pub(crate) struct ApiRequest {
    /// Method, URI and headers as the client sent them.
    pub(crate) parts: Parts,
    /// The body, byte for byte.
    pub(crate) body: Bytes,
    /// The `model` member, unescaped; `None` only where the route lets it be absent.
    pub(crate) model: Option<String>,
    /// The `stream` member (the route's default when absent or `null`).
    pub(crate) stream: bool,
    /// The `previous_response_id` member (Responses), when a string.
    pub(crate) previous_response_id: Option<String>,
    /// The engine slots (sequences) the request takes, from `n` and `best_of` where the route
    /// weighs them ([`Weighed`]); at least 1.
    pub(crate) sequences: usize,
    /// Where its prompt sits in `body`, for cache-aware routing.
    pub(crate) prompt: Prompt,
    /// Where the request went by its prompt, once chosen ([`cache_aware`](crate::proxy::cache_aware)).
    pub(crate) placement: Option<Placement>,
    /// Where the `model` value (with its quotes, in JSON) sits in `body`.
    model_span: Range<usize>,
    /// Whether the body is a `multipart/form-data` upload (the model value is bare text).
    form: bool,
    /// The body's bytes taken from the [`BodyBudget`], given back when the request is dropped.
    _budget: Option<OwnedSemaphorePermit>,
}

/// The members the gateway needs; everything else is skipped by `serde_json` without being
/// copied. `model` stays raw so its position in the body is known; `n` and `best_of` stay raw
/// so that a route that does not weigh them never refuses what its engine may accept.
#[derive(Deserialize)]
struct Head<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    /// Ollama's `/api/copy` names its model here.
    #[serde(borrow, default)]
    source: Option<&'a RawValue>,
    #[serde(default)]
    stream: Option<bool>,
    /// Anything but a string is the engine's to refuse.
    #[serde(default)]
    previous_response_id: Option<serde_json::Value>,
    #[serde(borrow, default)]
    n: Option<&'a RawValue>,
    #[serde(borrow, default)]
    best_of: Option<&'a RawValue>,
    // What may carry the prompt (`prompt::Members`); borrowed, never copied.
    #[serde(borrow, default)]
    messages: prompt::Elements<'a>,
    #[serde(borrow, default)]
    system: Option<&'a RawValue>,
    #[serde(borrow, default)]
    prompt: Option<&'a RawValue>,
    #[serde(borrow, default)]
    instructions: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    user: Option<&'a RawValue>,
    #[serde(borrow, default)]
    metadata: Option<&'a RawValue>,
}

/// Reads and checks a request to a model-routed endpoint.
///
/// Refuses, in this order: a content type other than JSON (415), a declared length above
/// `limits.max_bytes` (413, before reading), a declared length the budget cannot hold (503), a
/// body that grows past the limit (413) or past the budget (503), a body not complete within
/// `limits.timeout` (408), a body that is not a JSON object, has no string `model` (unless the
/// endpoint allows that), has a non-boolean `stream`, or, on a route weighed by its choices,
/// an `n` or `best_of` that is not a positive integer (400).
pub(crate) async fn read<B>(
    req: Request<B>,
    limits: BodyLimits<'_>,
    endpoint: &Endpoint,
) -> Result<ApiRequest, Error>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let (parts, body) = req.into_parts();
    let form = endpoint.model == ModelIn::Form;
    let boundary = if form {
        Some(form::boundary(&parts.headers)?)
    } else {
        // Ollama reads any body as JSON whatever its `Content-Type` (gin's `ShouldBindJSON`),
        // and its own docs' `curl -d '{…}'` sends `application/x-www-form-urlencoded`: its
        // routes do the same. The body must still parse as a JSON object, under the limit.
        if !endpoint.takes_any_content_type() {
            check_content_type(&parts.headers)?;
        }
        None
    };
    let (body, held) = read_body(&parts.headers, body, limits).await?;
    let parsed = match boundary {
        Some(boundary) => {
            // Boxed: the multipart parser's future is large, and every request's future would
            // carry room for it; only uploads pay for the allocation.
            let (model, span) = Box::pin(form::model(boundary, &body)).await?;
            Parsed {
                model: Some(model),
                stream: false,
                // Uploads (audio) run one sequence.
                sequences: 1,
                span,
                previous_response_id: None,
                prompt: Prompt::default(),
            }
        }
        None => parse(&body, endpoint)?,
    };
    Ok(ApiRequest {
        parts,
        body,
        model: parsed.model,
        stream: parsed.stream,
        previous_response_id: parsed.previous_response_id,
        sequences: parsed.sequences,
        prompt: parsed.prompt,
        placement: None,
        model_span: parsed.span,
        form,
        _budget: held,
    })
}

/// The request head's own rules, before anything else is read: RFC 9112 §3.2 for HTTP/1.1 (one
/// `Host` field, no more, no less, with a valid value: 400 `bad-request` otherwise) and
/// `max_header_bytes`, the largest head taken, counting the request line and each field as
/// `name: value` with its line end (431 `headers-too-large`). hyper refuses a head that
/// overflows its read buffer (a little more than the largest `max_header_bytes`) by itself, but
/// only when it arrives in more reads than fit, so the limit is checked here for every head.
/// HTTP/2 carries the authority in its own pseudo-field and limits its header list in the
/// protocol (16 KiB), and HTTP/1.0 needs no `Host`.
pub(crate) fn check_head<B>(req: &Request<B>, max_header_bytes: usize) -> Result<(), Error> {
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    // "METHOD TARGET HTTP/1.1\r\n", then "name: value\r\n" per field.
    let size = req.headers().iter().fold(
        req.method().as_str().len() + target + 12,
        |size, (name, value)| size + name.as_str().len() + value.len() + 4,
    );
    if size > max_header_bytes {
        return Err(Error::HeadersTooLarge {
            limit: max_header_bytes,
        });
    }
    if req.version() != http::Version::HTTP_11 {
        return Ok(());
    }
    let mut hosts = req.headers().get_all(http::header::HOST).iter();
    let (Some(host), None) = (hosts.next(), hosts.next()) else {
        let count = req.headers().get_all(http::header::HOST).iter().count();
        return Err(if count == 0 {
            BadRequest::NoHost.into()
        } else {
            BadRequest::ManyHosts { count }.into()
        });
    };
    // Empty is allowed: a target with no authority (RFC 9112 §3.2). No user info either.
    let host = host.as_bytes();
    let valid =
        host.is_empty() || (!host.contains(&b'@') && http::uri::Authority::try_from(host).is_ok());
    if valid {
        Ok(())
    } else {
        Err(BadRequest::BadHost.into())
    }
}

/// Reads `body` whole under `limits`: a declared `Content-Length` above the limit is refused
/// before a byte is read (413), one the budget cannot hold at once (503); a body that grows
/// past either as soon as it does, one not complete in time with 408. Returns the bytes and
/// what they hold of the budget, which goes back when the permit is dropped.
pub(crate) async fn read_body<B>(
    headers: &HeaderMap,
    body: B,
    limits: BodyLimits<'_>,
) -> Result<(Bytes, Option<OwnedSemaphorePermit>), Error>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let limit = limits.max_bytes;
    let mut held = None;
    if let Some(declared) = declared_length(headers)? {
        if declared > limit as u64 {
            return Err(Error::BodyTooLarge { limit });
        }
        // The whole declared length up front: a refusal then costs the client no upload.
        limits
            .budget
            .take(usize::try_from(declared).unwrap_or(usize::MAX), &mut held)?;
    }
    let declared = held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
    let collect = collect(body, limit, limits.budget, declared, &mut held);
    match tokio::time::timeout(limits.timeout, collect).await {
        Ok(body) => Ok((body?, held)),
        Err(_elapsed) => {
            limits.budget.timed_out.inc();
            Err(Error::BodyTimeout {
                after: limits.timeout,
            })
        }
    }
}

/// Reads `body` whole, under `limit`, charging `budget` for the memory its buffer takes beyond
/// the `prepaid` bytes.
///
/// The budget is charged for the buffer's *capacity*, not the bytes read: a body of unknown
/// length (chunked, or HTTP/2 without `content-length`) grows its buffer by doubling, so it may
/// hold up to twice its length while it arrives. The buffer is a `Vec` grown with
/// `reserve_exact`, so what is charged is what is allocated. Once the body is whole its buffer
/// is shrunk to its length and the rest of the charge goes back; the frames hyper hands over
/// are copied out, so none of its read buffers is kept alive by a queued request.
async fn collect<B>(
    body: B,
    limit: usize,
    budget: &BodyBudget,
    prepaid: usize,
    held: &mut Option<OwnedSemaphorePermit>,
) -> Result<Bytes, Error>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let mut body = std::pin::pin!(body);
    let mut out: Vec<u8> = Vec::with_capacity(prepaid);
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|error| body_error(error.into()))?;
        let Ok(mut data) = frame.into_data() else {
            continue; // trailers: nothing the gateway forwards
        };
        let needed = out.len() + data.remaining();
        if needed > limit {
            return Err(Error::BodyTooLarge { limit });
        }
        if needed > out.capacity() {
            // The first frame exactly (most bodies are one frame), then by doubling.
            let grown = if out.capacity() == 0 {
                needed
            } else {
                needed.max(out.capacity().saturating_mul(2)).min(limit)
            };
            budget.take(grown.saturating_sub(charged(held.as_ref())), held)?;
            out.reserve_exact(grown - out.len());
        }
        while data.has_remaining() {
            let chunk = data.chunk();
            let taken = chunk.len();
            out.extend_from_slice(chunk);
            data.advance(taken);
        }
    }
    out.shrink_to_fit();
    let spare = charged(held.as_ref()).saturating_sub(out.capacity().max(prepaid));
    if let (Some(permit), true) = (held.as_mut(), spare > 0) {
        drop(permit.split(spare));
    }
    Ok(Bytes::from(out))
}

/// The bytes of the budget `held` holds.
fn charged(held: Option<&OwnedSemaphorePermit>) -> usize {
    held.map_or(0, OwnedSemaphorePermit::num_permits)
}

/// The error for a body that failed part-way: [`Error::BodyIncomplete`] when the client's side
/// ended early, else [`Error::BodyRead`]. hyper reports an HTTP/1 body cut by EOF as an
/// `UnexpectedEof` I/O error in its chain, and an HTTP/2 stream the client reset (or a
/// connection it ended with `GOAWAY`) as an `h2` error. (A reset HTTP/1 connection ends the
/// connection, which drops the request's future: its access line says `client_gone` too.)
fn body_error(error: BoxError) -> Error {
    let first: &(dyn std::error::Error + 'static) = &*error;
    let ended_early = std::iter::successors(Some(first), |cause| cause.source()).any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::UnexpectedEof)
            || cause
                .downcast_ref::<h2::Error>()
                .is_some_and(|h2| h2.is_reset() || h2.is_go_away())
    });
    if ended_early {
        Error::BodyIncomplete(error)
    } else {
        Error::BodyRead(error)
    }
}

impl ApiRequest {
    /// Where the `model` value (with its quotes) sits in `body` (for the fuzz targets' checks).
    #[cfg(any(fuzzing, test))]
    pub(crate) fn model_span(&self) -> Range<usize> {
        self.model_span.clone()
    }

    /// The body to send to an upstream that calls the model `upstream_model`.
    ///
    /// The original bytes when the name is the one the client used (a cheap `Bytes` clone);
    /// otherwise the original bytes with only the `model` value replaced.
    /// A request without `model` goes as it came.
    pub(crate) fn body_for(&self, upstream_model: &str) -> Bytes {
        if self
            .model
            .as_deref()
            .is_none_or(|model| model == upstream_model)
        {
            return self.body.clone();
        }
        // `to_string` of a `&str` cannot fail: it only escapes. A form field is bare text.
        let literal = if self.form {
            upstream_model.to_owned()
        } else {
            serde_json::to_string(upstream_model).unwrap_or_default()
        };
        let mut out =
            BytesMut::with_capacity(self.body.len() - self.model_span.len() + literal.len());
        out.extend_from_slice(&self.body[..self.model_span.start]);
        out.extend_from_slice(literal.as_bytes());
        out.extend_from_slice(&self.body[self.model_span.end..]);
        out.freeze()
    }
}

fn check_content_type(headers: &HeaderMap) -> Result<(), Error> {
    let Some(value) = headers.get(CONTENT_TYPE) else {
        return Err(Error::UnsupportedMediaType { got: None });
    };
    let text = value.to_str().unwrap_or_default();
    // `application/json`, optionally with parameters (`; charset=utf-8`), any case.
    let essence = text.split(';').next().unwrap_or_default().trim();
    if essence.eq_ignore_ascii_case("application/json") {
        Ok(())
    } else {
        Err(Error::UnsupportedMediaType {
            got: Some(text.chars().take(100).collect()),
        })
    }
}

fn declared_length(headers: &HeaderMap) -> Result<Option<u64>, Error> {
    let Some(value) = headers.get(CONTENT_LENGTH) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok())
        .map(Some)
        .ok_or(Error::BadRequest(BadRequest::ContentLength))
}

/// What [`parse`] found in a JSON body.
struct Parsed {
    model: Option<String>,
    stream: bool,
    sequences: usize,
    span: Range<usize>,
    previous_response_id: Option<String>,
    prompt: Prompt,
}

fn parse(body: &[u8], endpoint: &Endpoint) -> Result<Parsed, Error> {
    // serde's derived struct visitor would also accept a JSON array (`["m", true]`); the
    // OpenAI endpoints take objects only.
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(BadRequest::NotAnObject.into());
    }
    let head: Head<'_> = serde_json::from_slice(body).map_err(BadRequest::Json)?;
    let stream = head.stream.unwrap_or(endpoint.stream_default);
    let previous_response_id = match head.previous_response_id {
        Some(serde_json::Value::String(id)) => Some(id),
        _ => None,
    };
    let sequences = match endpoint.weighed {
        Weighed::One => 1,
        Weighed::Choices => count(head.n, "n")?,
        Weighed::ChoicesOrBestOf => count(head.n, "n")?.max(count(head.best_of, "best_of")?),
    };
    let prompt = prompt::Members {
        messages: head.messages,
        system: head.system,
        prompt: head.prompt,
        instructions: head.instructions,
        input: head.input,
        user: head.user,
        metadata: head.metadata,
    }
    .prompt(body, endpoint.carries);
    let named = match endpoint.model {
        ModelIn::JsonSource => head.source,
        _ => head.model,
    };
    let Some(raw) = named else {
        if endpoint.model == ModelIn::JsonOptional {
            return Ok(Parsed {
                model: None,
                stream,
                sequences,
                span: 0..0,
                previous_response_id,
                prompt,
            });
        }
        return Err(match endpoint.model {
            ModelIn::JsonSource => BadRequest::NoSource,
            _ => BadRequest::NoModel,
        }
        .into());
    };
    let model: String = serde_json::from_str(raw.get()).map_err(|_| BadRequest::ModelNotString)?;
    if model.is_empty() {
        return Err(BadRequest::EmptyModel.into());
    }
    // `raw` borrows from `body`, so its address tells where the value sits in the body.
    let start = raw.get().as_ptr().addr() - body.as_ptr().addr();
    let span = start..start + raw.get().len();
    Ok(Parsed {
        model: Some(model),
        stream,
        sequences,
        span,
        previous_response_id,
        prompt,
    })
}

/// The value of a count member (`n`, `best_of`): 1 when absent or `null`, else a positive
/// integer (a refusal names the member otherwise: the engines refuse it too, but only after
/// the request has waited for its slots).
fn count(raw: Option<&RawValue>, member: &'static str) -> Result<usize, Error> {
    let Some(raw) = raw else { return Ok(1) };
    match serde_json::from_str::<Option<u64>>(raw.get()) {
        Ok(None) => Ok(1),
        // Above what a `usize` holds is above every `parallel`: refused as too heavy later.
        Ok(Some(value)) if value >= 1 => Ok(usize::try_from(value).unwrap_or(usize::MAX)),
        _ => Err(BadRequest::Count { member }.into()),
    }
}

mod form;
pub(crate) mod prompt;

pub(crate) use prompt::{Placement, Prompt};

#[cfg(test)]
mod tests;
