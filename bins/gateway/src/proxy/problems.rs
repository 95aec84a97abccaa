//! The last step of every failed request: each error is classified, counted and becomes its
//! problem document, here and nowhere else.
//!
//! Every failure of the request path becomes an [`Error`] through one conversion per source
//! type: a refusal of the admission step
//! ([`Refused::into_error`](crate::proxy::admit::Refused::into_error)), a forward that got no
//! response head ([`Error::forwarding`]), a body that could not be read (in
//! [`request`](crate::proxy::request)), a header the gateway reads (in
//! [`client`](crate::proxy::client) and [`auth`](crate::proxy::auth)). The admin API's errors
//! are their own type ([`AdminError`](crate::ops::admin::AdminError)).
//!
//! Errors are classified (STYLE.md §12) by whose side failed and whether a retry can help:
//!
//! | side     | variants | status |
//! |----------|----------|--------|
//! | client   | `NotFound`, `MethodNotAllowed`, `ModelNotFound`, `RouteNotServed`, `RouteDisabled`, `ResponseNotFound`, `BadRequest`, `TooHeavy`, `BodyRead`, `BodyIncomplete`, `BodyTooLarge`, `BodyTimeout`, `UnsupportedMediaType`, `Unauthorized`, `HeadersTooLarge` | 404, 405, 404, 404, 403, 404, 400, 400, 400, 400, 413, 408, 415, 401, 431 |
//! | capacity | `QueueFull`, `QueueTimeout`, `Overloaded`, `StoreUnavailable` (the request never ran; retry) | 503 + `Retry-After` |
//! | upstream | `UpstreamUnavailable`, `NoOllamaUpstream`, `ResponseUpstreamUnavailable` (nothing sent; retry), `UpstreamFailed`, `UpstreamTls`, `UpstreamTimeout` (maybe ran; the client decides) | 503 + `Retry-After`, 502, 502, 504 |
//! | gateway  | `ShuttingDown` (retry), `Internal` (a bug) | 503 + `Retry-After`, 500 |
//!
//! From the error alone, in one place each: [`record`] counts the refusal
//! (`slotgate_rejections_total{reason}`, [`Error::rejection`]) and notes the access log's
//! `outcome` and `reason` ([`Error::outcome`], [`Error::reason`]); [`respond`] turns it into an
//! `application/problem+json` response carrying the request id, and a request whose stream
//! already began (`queue_keepalive`) gets the same document as its last event. Nothing else in
//! the gateway builds an error response, so no path can answer with a bare 500 or an empty body.
//!
//! Errors after the response head has gone out (an upstream stalling or dying mid-stream)
//! cannot become a response any more: the body wrapper ([`body`](crate::proxy::body)) ends an SSE
//! answer with an `upstream-stalled` problem as its last event and a clean end of stream, and
//! cuts any other answer (HTTP/1: no final chunk; HTTP/2: a reset stream).

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use slotgate_problem::{Dialect, Problem};
use tracing::{debug, warn};

use crate::error::{BoxError, chain};
use crate::metrics::Metrics;
use crate::proxy::access::{Access, Outcome};
use crate::proxy::forward::ForwardError;
use crate::proxy::route::Routes;

/// `Retry-After` of 503 `overloaded`: bodies in flight are usually read within a second or so.
const OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// The methods of an endpoint that only reads.
pub(crate) const GET_ONLY: &[Method] = &[Method::GET, Method::HEAD];
/// The methods of an endpoint that only acts.
pub(crate) const POST_ONLY: &[Method] = &[Method::POST];

/// Everything that can stop a request, classified.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum Error {
    // === the client's side ===
    /// No endpoint at this path.
    #[error("no endpoint at {path}")]
    NotFound {
        /// The path asked for.
        path: String,
    },
    /// A known path with the wrong method.
    #[error("method {method} is not allowed on {path}")]
    MethodNotAllowed {
        /// The method used.
        method: http::Method,
        /// The path asked for.
        path: String,
        /// The methods the path accepts.
        allow: &'static [http::Method],
    },
    /// The model is not configured.
    #[error("model {model:?} is not served here")]
    ModelNotFound {
        /// The model asked for.
        model: String,
    },
    /// The model's upstreams are all of kinds that do not serve the route.
    #[error("no upstream of model {model:?} serves {route}")]
    RouteNotServed {
        /// The configured model.
        model: String,
        /// The route asked for.
        route: &'static str,
    },
    /// A route that changes an engine's disk, and no upstream of the model allows it.
    #[error("{route} is disabled for model {model:?}")]
    RouteDisabled {
        /// The configured model.
        model: String,
        /// The route asked for.
        route: &'static str,
    },
    /// A Responses follow-up, or a request by id, names a response with no recorded upstream.
    #[error("no upstream is recorded for response {id:?}")]
    ResponseNotFound {
        /// The response id.
        id: String,
        /// Named in the path (`/v1/responses/{id}`), not as `previous_response_id`.
        in_path: bool,
    },
    /// The upstream holding the response a follow-up names cannot take it.
    #[error("upstream {upstream} holding response {id:?} is unavailable")]
    ResponseUpstreamUnavailable {
        /// The response id.
        id: String,
        /// The upstream that holds it.
        upstream: String,
        /// When to try again.
        retry_after: Duration,
    },
    /// The request is not usable as it is: its body, or one of the gateway's headers.
    #[error("bad request")]
    BadRequest(#[source] BadRequest),
    /// Reading the body failed: the client sent a broken body.
    #[error("reading the request body failed")]
    BodyRead(#[source] BoxError),
    /// The client's side of the connection ended before the body was complete: it closed the
    /// connection, or its write half, part-way through the body. Not a refusal: the client
    /// left (see [`Error::client_left`]).
    #[error("the request body ended before it was complete")]
    BodyIncomplete(#[source] BoxError),
    /// The body is larger than the configured limit.
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The request head is larger than the gateway takes (`request::MAX_HEAD_BYTES`).
    #[error("the request head is larger than {limit} bytes")]
    HeadersTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body was not complete within `body_read_timeout`.
    #[error("the request body was not complete within {after:?}")]
    BodyTimeout {
        /// The timeout.
        after: Duration,
    },
    /// The body is not JSON.
    #[error("the request body must be application/json")]
    UnsupportedMediaType {
        /// The `Content-Type` the client sent, if any (truncated).
        got: Option<String>,
    },

    /// The request needs more engine slots (`n` sequences) than any upstream of the model has
    /// (under the model's `parallel`, or the upstream's engine-wide one).
    #[error(
        "{weight} sequences for model {model:?} are more than the {parallel} slots of {upstream}"
    )]
    TooHeavy {
        /// The upstream named in the refusal (the first one tried).
        upstream: String,
        /// The model asked for.
        model: String,
        /// The slots the request needs.
        weight: usize,
        /// That upstream's `parallel`.
        parallel: usize,
    },

    /// API keys are configured and the request carries none that is accepted.
    #[error("missing or invalid API key")]
    Unauthorized,

    // === capacity ===
    /// Every candidate's queue is full.
    #[error("every queue for model {model:?} is full")]
    QueueFull {
        /// The best-ranked upstream (the first one tried).
        upstream: String,
        /// The model asked for.
        model: String,
        /// When a retry may succeed.
        retry_after: Duration,
    },
    /// The request waited `queue_timeout` (or the client's shorter deadline) without getting a
    /// slot, or was refused before queueing because its deadline could not be kept.
    #[error("no slot for model {model:?} on {upstream} within {waited:?}")]
    QueueTimeout {
        /// The upstream it waited for.
        upstream: String,
        /// The model asked for.
        model: String,
        /// How long it waited.
        waited: Duration,
        /// When a retry may succeed.
        retry_after: Duration,
        /// The client's deadline, when it (not `queue_timeout`) bounded the wait. Boxed: it is
        /// rare, and every `Result` carrying an `Error` would pay for it.
        deadline: Option<Box<Deadline>>,
    },

    /// Under `[cluster]`, the shared slot store cannot be reached and the policy is
    /// `fail-closed`.
    #[error("the shared slot store is unavailable; model {model:?} is refused (fail-closed)")]
    StoreUnavailable {
        /// The model asked for.
        model: String,
        /// The store's next probe.
        retry_after: Duration,
    },

    /// The gateway-wide budget of buffered request-body bytes is spent.
    #[error("the buffered request bodies fill the budget of {budget} bytes")]
    Overloaded {
        /// The budget, in bytes.
        budget: usize,
    },

    // === the upstream's side ===
    /// No candidate could be connected to (or none is eligible): nothing was sent.
    #[error("no upstream for model {model:?} is reachable")]
    UpstreamUnavailable {
        /// The model asked for.
        model: String,
        /// When a retry may succeed.
        retry_after: Duration,
        /// Whether the upstreams refused the connection or could take no requests at all.
        why: Unavailable,
        /// The last connect error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// `GET /api/version` found no Ollama upstream to pass it to: none is available, or each
    /// refused the connection.
    #[error("no Ollama upstream is reachable")]
    NoOllamaUpstream {
        /// When a retry may succeed.
        retry_after: Duration,
        /// The last connect error, or that none is available.
        #[source]
        source: BoxError,
    },
    /// The upstream failed after the request was (maybe partly) sent, before a response head.
    #[error("upstream {upstream} failed")]
    UpstreamFailed {
        /// The upstream's name.
        upstream: String,
        /// The model asked for.
        model: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The TLS handshake with the upstream failed: nothing was sent.
    #[error("TLS with upstream {upstream} failed")]
    UpstreamTls {
        /// The upstream's name.
        upstream: String,
        /// The model asked for.
        model: String,
        /// Why (rustls's reason: an unknown issuer, a refused client certificate, …).
        #[source]
        source: BoxError,
    },
    /// The upstream sent no response head within the first-byte timeout.
    #[error("upstream {upstream} sent nothing within {after:?}")]
    UpstreamTimeout {
        /// The upstream's name.
        upstream: String,
        /// The model asked for.
        model: String,
        /// The timeout.
        after: Duration,
    },

    // === the gateway's side ===
    /// The gateway is shutting down and takes no new requests.
    #[error("the gateway is shutting down")]
    ShuttingDown {
        /// When another try (elsewhere, or after a restart) makes sense.
        retry_after: Duration,
    },
    /// A bug: something that should not fail did.
    #[error("internal error: {what}")]
    Internal {
        /// What failed, for the log.
        what: &'static str,
        /// Why.
        #[source]
        source: BoxError,
    },
}

/// The `queue-timeout` problem, naming the client's deadline when one ended the wait.
fn queue_timeout(
    upstream: &str,
    model: &str,
    waited: Duration,
    retry_after: Duration,
    deadline: Option<&Deadline>,
) -> Problem {
    match deadline {
        None => Problem::queue_timeout(upstream, model, waited, retry_after),
        Some(d) => Problem::queue_deadline(
            upstream,
            model,
            waited,
            d.header,
            d.bound,
            d.expected,
            retry_after,
        ),
    }
}

/// Why no upstream of a model could take a request ([`Error::UpstreamUnavailable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Unavailable {
    /// Every upstream that could take it refused the connection: `upstream_unavailable`.
    Unreachable,
    /// None could take requests at all (unhealthy, draining, an unknown `auto` slot count,
    /// removed by a reload): `model_unavailable`.
    Down,
}

/// A client's deadline that bounded a queue wait (see [`Error::QueueTimeout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Deadline {
    /// The header that set it: `x-slotgate-max-wait`, `x-stainless-timeout` or `x-stainless-read-timeout`.
    pub(crate) header: &'static str,
    /// Its value.
    pub(crate) bound: Duration,
    /// Set when the request was refused before queueing: the wait expected from recent hold
    /// times, longer than what was left of the deadline.
    pub(crate) expected: Option<Duration>,
}

/// What makes a request unusable as it is: the `detail` of its 400 `bad-request` problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BadRequest {
    /// `Content-Length` is not a number.
    #[error("invalid Content-Length header")]
    ContentLength,
    /// A JSON route got something other than an object (an array, a string, …).
    #[error("the request body must be a JSON object")]
    NotAnObject,
    /// The body does not parse as JSON.
    #[error("the request body is not valid JSON")]
    Json(#[source] serde_json::Error),
    /// A route that needs `model` got a body without it.
    #[error("the request body has no `model` member")]
    NoModel,
    /// Ollama's `/api/copy` got a body without `source`.
    #[error("the request body has no `source` member (the model to copy)")]
    NoSource,
    /// `model` is there, but not a string.
    #[error("`model` must be a string")]
    ModelNotString,
    /// `model` is the empty string (in a JSON body or a form).
    #[error("`model` must not be empty")]
    EmptyModel,
    /// A count member (`n`, `best_of`) is not a positive integer.
    #[error("`{member}` must be a positive integer")]
    Count {
        /// The member's name.
        member: &'static str,
    },
    /// An upload route got a body that is not `multipart/form-data` with a boundary.
    #[error("this route takes a multipart/form-data body with a boundary, not {content_type:?}")]
    NotMultipart {
        /// The `Content-Type` the client sent (cut to 100 characters: it is echoed).
        content_type: String,
    },
    /// The multipart body is broken before its `model` field.
    #[error("the multipart body is malformed")]
    Multipart(#[source] multer::Error),
    /// The form has no `model` field.
    #[error("the form has no `model` field")]
    FormNoModel,
    /// The form's `model` field could not be read as text.
    #[error("the `model` field could not be read")]
    FormModel(#[source] multer::Error),
    /// The form's `model` value was read but not found again in the body (to rename it).
    #[error("the `model` field of the form could not be located")]
    FormModelNotLocated,
    /// The tenant header (`server.tenant_header`) is not visible ASCII.
    #[error("the `{header}` header must be visible ASCII text")]
    TenantNotText {
        /// The header's name.
        header: String,
    },
    /// The tenant header names a tenant longer than a tenant name may be.
    #[error(
        "the `{header}` header is {len} bytes long; a tenant name has at most {max}",
        max = slotgate_config::Server::MAX_TENANT_LEN
    )]
    TenantTooLong {
        /// The header's name.
        header: String,
        /// The value's length, in bytes.
        len: usize,
    },
    /// An HTTP/1.1 request without a `Host` field (RFC 9112 §3.2).
    #[error("an HTTP/1.1 request must carry a `Host` header field")]
    NoHost,
    /// An HTTP/1.1 request with more than one `Host` field line (RFC 9112 §3.2).
    #[error("the request carries {count} `Host` header fields; HTTP/1.1 allows exactly one")]
    ManyHosts {
        /// How many.
        count: usize,
    },
    /// A `Host` value that is not an authority (`host` or `host:port`) (RFC 9112 §3.2).
    #[error("the `Host` header field is not a valid host (and port)")]
    BadHost,
    /// `x-slotgate-max-wait` is not a duration.
    #[error("the `{header}` header must be a duration such as `5s` or `1500ms`")]
    MaxWait {
        /// The header's name.
        header: http::HeaderName,
    },
    /// The body names no model, and the route serves more (or fewer) than one.
    #[error(
        "the request body has no `model` member, and {route} does not serve exactly one model; \
         name one"
    )]
    ModelNeeded {
        /// The route asked for.
        route: &'static str,
    },
}

impl BadRequest {
    /// The header at fault, when it is a header and not the body.
    fn header(&self) -> Option<&str> {
        match self {
            BadRequest::TenantNotText { header } | BadRequest::TenantTooLong { header, .. } => {
                Some(header)
            }
            BadRequest::MaxWait { header } => Some(header.as_str()),
            BadRequest::ContentLength => Some("content-length"),
            _ => None,
        }
    }

    /// The problem's `detail`: what is wrong and, for a parse error, the parser's own words
    /// (its first cause only, as the client needs no deeper chain).
    pub(crate) fn detail(&self) -> String {
        use std::error::Error as _;
        match self.source() {
            Some(source) => format!("{self}: {source}"),
            None => self.to_string(),
        }
    }
}

impl From<BadRequest> for Error {
    fn from(bad: BadRequest) -> Self {
        Error::BadRequest(bad)
    }
}

impl Error {
    /// The error for a forward to `upstream` (for `model`, empty when the request names none)
    /// that got no response head: every [`ForwardError`] becomes its `Error` here. A refused
    /// connection is the caller's to handle first (it may try another upstream); one that
    /// reaches this point is counted like a bug.
    pub(crate) fn forwarding(failure: ForwardError, upstream: &str, model: &str) -> Self {
        let upstream = upstream.to_owned();
        let model = model.to_owned();
        match failure {
            ForwardError::Timeout(after) => Error::UpstreamTimeout {
                upstream,
                model,
                after,
            },
            ForwardError::Failed(source) => Error::UpstreamFailed {
                upstream,
                model,
                source,
            },
            ForwardError::Tls(source) => Error::UpstreamTls {
                upstream,
                model,
                source,
            },
            ForwardError::Build(error) => Error::Internal {
                what: "the upstream request could not be built",
                source: Box::new(error),
            },
            ForwardError::Connect(source) => Error::Internal {
                what: "a connect error was not handled",
                source,
            },
        }
    }

    /// The problem document for this error.
    #[expect(
        clippy::too_many_lines,
        reason = "one arm per error, each its constructor call: splitting it hides the mapping"
    )]
    pub(crate) fn to_problem(&self) -> Problem {
        match self {
            Error::NotFound { path } => Problem::not_found(path),
            Error::MethodNotAllowed { method, allow, .. } => {
                Problem::method_not_allowed(method, allow)
            }
            Error::ModelNotFound { model } => Problem::model_not_found(model),
            Error::RouteNotServed { model, route } => Problem::route_not_served(model, route),
            Error::RouteDisabled { model, route } => Problem::route_disabled(model, route),
            Error::ResponseNotFound { id, in_path: false } => Problem::response_not_found(id),
            Error::ResponseNotFound { id, in_path: true } => Problem::response_id_not_found(id),
            Error::ResponseUpstreamUnavailable {
                id,
                upstream,
                retry_after,
            } => Problem::response_upstream_unavailable(id, upstream, *retry_after),
            Error::BadRequest(bad) => match bad.header() {
                Some(header) => Problem::bad_header(header, bad.detail()),
                None => Problem::bad_request(bad.detail()),
            },
            Error::TooHeavy {
                upstream,
                model,
                weight,
                parallel,
            } => Problem::bad_request(format!(
                "the request runs {weight} sequences (`n`, or `best_of` when larger), but \
                 upstream `{upstream}` has only {parallel} slots for model `{model}` (its \
                 `parallel`, or the engine-wide one); ask for at most {parallel}"
            ))
            .with_param("n")
            .with_extension("sequences", *weight)
            .with_extension("parallel", *parallel),
            Error::BodyRead(_) => Problem::bad_request("the request body could not be read"),
            Error::BodyIncomplete(_) => Problem::bad_request(
                "the request body ended before it was complete (the connection was closed part-way \
                 through it); send the whole body",
            ),
            Error::BodyTooLarge { limit } => {
                Problem::body_too_large(u64::try_from(*limit).unwrap_or(u64::MAX))
            }
            Error::BodyTimeout { after } => Problem::body_timeout(*after),
            Error::HeadersTooLarge { .. } => Problem::headers_too_large(),
            Error::Overloaded { budget } => Problem::overloaded(
                u64::try_from(*budget).unwrap_or(u64::MAX),
                OVERLOADED_RETRY_AFTER,
            ),
            Error::StoreUnavailable { model, retry_after } => {
                Problem::store_unavailable(model, *retry_after)
            }
            Error::UnsupportedMediaType { got } => Problem::unsupported_media_type(got.as_deref()),
            Error::Unauthorized => Problem::unauthorized(),
            Error::QueueFull {
                upstream,
                model,
                retry_after,
            } => Problem::queue_full(upstream, model, *retry_after),
            Error::QueueTimeout {
                upstream,
                model,
                waited,
                retry_after,
                deadline,
            } => queue_timeout(upstream, model, *waited, *retry_after, deadline.as_deref()),
            Error::UpstreamUnavailable {
                model,
                retry_after,
                source,
                ..
            } => {
                let problem = Problem::upstream_unavailable(model, *retry_after);
                match source {
                    // Why, when known: a refused connection, a model removed by a reload, a
                    // slot count the engine did not give.
                    Some(source) => problem.with_detail(format!(
                        "No upstream for model `{model}` can take the request: {}",
                        chain(&**source)
                    )),
                    None => problem,
                }
            }
            Error::NoOllamaUpstream {
                retry_after,
                source,
            } => {
                let model = "(any Ollama model)";
                Problem::upstream_unavailable(model, *retry_after).with_detail(format!(
                    "No upstream for model `{model}` can take the request: {}",
                    chain(&**source)
                ))
            }
            Error::UpstreamFailed {
                upstream,
                model,
                source,
            } => Problem::upstream_bad_response(upstream, model).with_detail(format!(
                "Upstream `{upstream}` failed: {}",
                chain(&**source)
            )),
            Error::UpstreamTls {
                upstream,
                model,
                source,
            } => Problem::upstream_bad_response(upstream, model).with_detail(format!(
                "The TLS handshake with upstream `{upstream}` failed, so the request was not \
                 sent: {}. The operator must fix the upstream's certificate or the gateway's \
                 `ca_file` / `client_cert` for it.",
                chain(&**source)
            )),
            Error::UpstreamTimeout {
                upstream,
                model,
                after,
            } => Problem::upstream_timeout(upstream, model, *after),
            Error::ShuttingDown { retry_after } => Problem::shutting_down(*retry_after),
            Error::Internal { .. } => Problem::internal(),
        }
    }

    /// The word for this error in `slotgate_rejections_total{reason}` and the access log's
    /// `reason`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::MethodNotAllowed { .. } => "method_not_allowed",
            Error::ModelNotFound { .. } => "model_not_found",
            Error::RouteNotServed { .. } => "route_not_served",
            Error::RouteDisabled { .. } => "route_disabled",
            Error::ResponseNotFound { .. } => "response_not_found",
            Error::ResponseUpstreamUnavailable { .. } => "response_upstream_unavailable",
            Error::BadRequest(_) | Error::BodyRead(_) => "bad_request",
            Error::BodyIncomplete(_) => "client_gone",
            Error::BodyTooLarge { .. } => "body_too_large",
            Error::HeadersTooLarge { .. } => "headers_too_large",
            Error::BodyTimeout { .. } => "body_timeout",
            Error::UnsupportedMediaType { .. } => "unsupported_media_type",
            Error::TooHeavy { .. } => "too_heavy",
            Error::Unauthorized => "unauthorized",
            Error::QueueFull { .. } => "queue_full",
            Error::QueueTimeout { .. } => "queue_timeout",
            Error::StoreUnavailable { .. } => "store_unavailable",
            Error::Overloaded { .. } => "overloaded",
            Error::UpstreamUnavailable {
                why: Unavailable::Down,
                ..
            } => "model_unavailable",
            Error::UpstreamUnavailable {
                why: Unavailable::Unreachable,
                ..
            }
            | Error::NoOllamaUpstream { .. } => "upstream_unavailable",
            Error::UpstreamFailed { .. } => "upstream_failed",
            Error::UpstreamTls { .. } => "upstream_tls",
            Error::UpstreamTimeout { .. } => "upstream_timeout",
            Error::ShuttingDown { .. } => "shutting_down",
            Error::Internal { .. } => "internal",
        }
    }

    /// Whether the client left before the request was whole (the access log's `client_gone`,
    /// not a refusal): its body ended early.
    pub(crate) fn client_left(&self) -> bool {
        matches!(self, Error::BodyIncomplete(_))
    }

    /// Whether the engine gave no usable answer (counted as an `upstream_error` outcome, not as
    /// a refusal).
    pub(crate) fn is_upstream_failure(&self) -> bool {
        matches!(
            self,
            Error::UpstreamFailed { .. }
                | Error::UpstreamTls { .. }
                | Error::UpstreamTimeout { .. }
        )
    }

    /// The refusal to count in `slotgate_rejections_total` when the request ends with this
    /// error: (the configured model, or `""`, and the reason). `None` when nobody refused it:
    /// the client left, or the engine gave no usable answer (counted by the slot as an
    /// `upstream_error` outcome).
    pub(crate) fn rejection(&self) -> Option<(&str, &'static str)> {
        let model = match self {
            Error::BodyIncomplete(_) => return None,
            _ if self.is_upstream_failure() => return None,
            // Configured names (a client's unknown name never becomes a label).
            Error::RouteNotServed { model, .. }
            | Error::RouteDisabled { model, .. }
            | Error::TooHeavy { model, .. }
            | Error::QueueFull { model, .. }
            | Error::QueueTimeout { model, .. }
            | Error::StoreUnavailable { model, .. }
            | Error::UpstreamUnavailable { model, .. } => model.as_str(),
            _ => "",
        };
        Some((model, self.reason()))
    }

    /// How the access log says a request that ends with this error ended.
    pub(crate) fn outcome(&self) -> Outcome {
        if self.is_upstream_failure() {
            Outcome::UpstreamError
        } else if self.client_left() {
            Outcome::ClientGone
        } else {
            Outcome::Refused
        }
    }

    /// Whether the gateway or an upstream is at fault (worth a warning in the log), rather than
    /// the client or plain load.
    fn is_fault(&self) -> bool {
        matches!(
            self,
            Error::UpstreamUnavailable { .. }
                | Error::NoOllamaUpstream { .. }
                | Error::UpstreamFailed { .. }
                | Error::UpstreamTls { .. }
                | Error::UpstreamTimeout { .. }
                | Error::Internal { .. }
        )
    }
}

/// The header the Anthropic SDKs read the request id from, set beside `x-request-id` on every
/// answer of an Anthropic route.
pub(crate) const ANTHROPIC_REQUEST_ID: http::HeaderName =
    http::HeaderName::from_static("request-id");

/// The dialect a refusal of `req` is written in ([`Dialect`]): the route's, except that a client
/// of an Ollama route that asks for `application/problem+json` in `Accept` gets the problem
/// document (Anthropic's and OpenAI's already are one).
pub(crate) fn dialect<B>(req: &Request<B>) -> Dialect {
    match Dialect::of_path(req.uri().path()) {
        Dialect::Ollama if accepts_problem(req.headers()) => Dialect::OpenAi,
        dialect => dialect,
    }
}

/// Whether `Accept` names `application/problem+json` (any case, any parameters).
fn accepts_problem(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::ACCEPT)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .any(|item| {
            let media = item.split(';').next().unwrap_or_default().trim();
            media.eq_ignore_ascii_case(slotgate_problem::CONTENT_TYPE)
        })
}

/// Everything a request that ends with `error` leaves behind but its document, derived from the
/// error here and nowhere else: the refusal counted in `slotgate_rejections_total` (through
/// the model's pre-resolved counter in `routes` when it has one, so no label is hashed), and
/// the access log's outcome and reason. The document is [`respond`]'s, or the last event of a
/// stream that already began.
pub(crate) fn record(error: &Error, routes: &Routes, metrics: &Metrics, access: &Access) {
    if let Some((model, reason)) = error.rejection() {
        let counted = routes
            .resolve(model)
            .is_some_and(|route| route.model == model && route.rejections.count(reason));
        if !counted {
            metrics.refused(model, reason);
        }
    }
    let outcome = error.outcome();
    // A client that left was not refused: no reason.
    let reason = (outcome != Outcome::ClientGone).then(|| error.reason());
    access.failed(outcome, reason);
}

/// The response for `error` in `dialect`, carrying the request id: as the `request_id`
/// member, and as `instance` (`urn:uuid:…`) when it is a UUID. The caller sets the
/// `x-request-id` header on every response.
pub(crate) fn respond<B: From<Bytes>>(
    error: &Error,
    request_id: &HeaderValue,
    dialect: Dialect,
) -> Response<B> {
    document(
        error,
        error.to_problem(),
        error.is_fault(),
        request_id,
        dialect,
    )
}

/// The response carrying `problem` in `dialect`, the document for `error` (logged: as a
/// warning when it is a `fault` of the gateway or an upstream), with the request id as
/// [`respond`] says.
pub(crate) fn document<B: From<Bytes>>(
    error: &(dyn std::error::Error + 'static),
    problem: Problem,
    fault: bool,
    request_id: &HeaderValue,
    dialect: Dialect,
) -> Response<B> {
    let id = request_id.to_str().unwrap_or_default();
    if fault {
        warn!(request_id = id, error = %chain(error), "request failed");
    } else {
        debug!(request_id = id, error = %chain(error), "request refused");
    }
    let mut problem = problem.with_extension("request_id", id);
    // A generated id is a UUID, which makes a valid `instance` URI; a client's own id may not be.
    if let Ok(uuid) = uuid::Uuid::try_parse(id) {
        problem = problem.with_instance(format!("urn:uuid:{}", uuid.hyphenated()));
    }
    problem.to_response_in(dialect)
}

/// `Ok` when `req` uses one of `methods`, else the `MethodNotAllowed` error naming them.
pub(crate) fn allow<B>(req: &Request<B>, methods: &'static [Method]) -> Result<(), Error> {
    if methods.contains(req.method()) {
        Ok(())
    } else {
        Err(Error::MethodNotAllowed {
            method: req.method().clone(),
            path: req.uri().path().to_owned(),
            allow: methods,
        })
    }
}

/// The `NotFound` error for `path` (cut to 200 characters: it is echoed in the document).
pub(crate) fn not_found(path: &str) -> Error {
    Error::NotFound {
        path: path.chars().take(200).collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use http::{HeaderValue, Method, Response};

    use slotgate_problem::Dialect;

    use super::{BadRequest, Error, respond};

    #[expect(clippy::too_many_lines, reason = "one entry per variant, written out")]
    fn every_error() -> Vec<(Error, u16, &'static str, bool)> {
        let io = || Box::new(std::io::Error::other("connection reset")) as crate::error::BoxError;
        vec![
            (
                Error::NotFound { path: "/x".into() },
                404,
                "not-found",
                false,
            ),
            (
                Error::MethodNotAllowed {
                    method: Method::GET,
                    path: "/v1/embeddings".into(),
                    allow: &[Method::POST],
                },
                405,
                "method-not-allowed",
                false,
            ),
            (
                Error::RouteNotServed {
                    model: "m".into(),
                    route: "/api/chat",
                },
                404,
                "route-not-served",
                false,
            ),
            (
                Error::RouteDisabled {
                    model: "m".into(),
                    route: "/api/pull",
                },
                403,
                "route-disabled",
                false,
            ),
            (
                Error::ResponseNotFound {
                    id: "r".into(),
                    in_path: false,
                },
                404,
                "response-not-found",
                false,
            ),
            (
                Error::ResponseUpstreamUnavailable {
                    id: "r".into(),
                    upstream: "u".into(),
                    retry_after: Duration::from_secs(5),
                },
                503,
                "response-upstream-unavailable",
                true,
            ),
            (
                Error::ModelNotFound { model: "m".into() },
                404,
                "model-not-found",
                false,
            ),
            (
                Error::BadRequest(BadRequest::NoModel),
                400,
                "bad-request",
                false,
            ),
            (Error::BodyRead(io()), 400, "bad-request", false),
            (Error::BodyIncomplete(io()), 400, "bad-request", false),
            (
                Error::BodyTooLarge { limit: 10 },
                413,
                "body-too-large",
                false,
            ),
            (
                Error::HeadersTooLarge { limit: 10 },
                431,
                "headers-too-large",
                false,
            ),
            (
                Error::BodyTimeout {
                    after: Duration::from_secs(30),
                },
                408,
                "body-timeout",
                false,
            ),
            (
                Error::Overloaded { budget: 1 << 20 },
                503,
                "overloaded",
                true,
            ),
            (
                Error::StoreUnavailable {
                    model: "m".into(),
                    retry_after: Duration::from_secs(3),
                },
                503,
                "store-unavailable",
                true,
            ),
            (
                Error::UnsupportedMediaType { got: None },
                415,
                "unsupported-media-type",
                false,
            ),
            (Error::Unauthorized, 401, "unauthorized", false),
            (
                Error::QueueFull {
                    upstream: "gpu".into(),
                    model: "m".into(),
                    retry_after: Duration::from_secs(3),
                },
                503,
                "queue-full",
                true,
            ),
            (
                Error::QueueTimeout {
                    upstream: "gpu".into(),
                    model: "m".into(),
                    waited: Duration::from_secs(30),
                    retry_after: Duration::from_secs(5),
                    deadline: None,
                },
                503,
                "queue-timeout",
                true,
            ),
            (
                Error::UpstreamUnavailable {
                    model: "m".into(),
                    retry_after: Duration::from_secs(5),
                    why: super::Unavailable::Unreachable,
                    source: Some(io()),
                },
                503,
                "upstream-unavailable",
                true,
            ),
            (
                Error::UpstreamFailed {
                    upstream: "gpu".into(),
                    model: "m".into(),
                    source: io(),
                },
                502,
                "upstream-bad-response",
                false,
            ),
            (
                Error::UpstreamTimeout {
                    upstream: "gpu".into(),
                    model: "m".into(),
                    after: Duration::from_secs(1),
                },
                504,
                "upstream-timeout",
                false,
            ),
            (
                Error::ShuttingDown {
                    retry_after: Duration::from_secs(30),
                },
                503,
                "shutting-down",
                true,
            ),
            (
                Error::Internal {
                    what: "a test",
                    source: io(),
                },
                500,
                "internal",
                false,
            ),
        ]
    }

    #[test]
    fn every_error_becomes_its_problem_document() {
        let id = HeaderValue::from_static("req-1");
        for (error, status, slug, retry) in every_error() {
            let response: Response<Bytes> = respond(&error, &id, Dialect::OpenAi);
            assert_eq!(response.status().as_u16(), status, "{error:?}");
            assert_eq!(
                response.headers()["content-type"],
                "application/problem+json",
                "{error:?}"
            );
            assert_eq!(
                response.headers().contains_key("retry-after"),
                retry,
                "{error:?}"
            );
            let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
            assert!(
                doc["type"].as_str().unwrap().ends_with(slug),
                "{error:?}: {doc}"
            );
            assert_eq!(doc["request_id"], "req-1");
            assert!(doc.get("instance").is_none(), "not a UUID: no instance");
            assert!(doc["error"]["message"].is_string());
        }
    }

    /// The rejection series of `metrics` as exposed, one `reason model value` line each.
    fn rejections(metrics: &crate::metrics::Metrics) -> Vec<String> {
        let mut registry = prometheus_client::registry::Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text.lines()
            .filter(|line| line.starts_with("rejections_total{") && !line.ends_with(" 0"))
            .map(ToOwned::to_owned)
            .collect()
    }

    #[test]
    fn every_refusal_is_counted_once_and_nothing_else_is() {
        let built = crate::fixtures::Built::new(
            r#"
            [server]
            listen = "127.0.0.1:0"
            [upstreams.a]
            url = "http://127.0.0.1:9"
            kind = "vllm"
            [upstreams.a.models.m]
            parallel = 1
            queue = 1
            queue_timeout = "5s"
            "#,
        );
        let (routes, metrics) = (&built.generation.routes, &built.metrics);
        let access = crate::proxy::access::Access::default();
        let io = || Box::new(std::io::Error::other("refused")) as crate::error::BoxError;
        let errors = [
            Error::QueueFull {
                upstream: "a".into(),
                model: "m".into(),
                retry_after: Duration::from_secs(1),
            },
            Error::UpstreamUnavailable {
                model: "m".into(),
                retry_after: Duration::from_secs(1),
                why: super::Unavailable::Down,
                source: None,
            },
            Error::UpstreamUnavailable {
                model: "m".into(),
                retry_after: Duration::from_secs(1),
                why: super::Unavailable::Unreachable,
                source: Some(io()),
            },
            Error::TooHeavy {
                upstream: "a".into(),
                model: "m".into(),
                weight: 2,
                parallel: 1,
            },
            Error::ModelNotFound {
                model: "unknown".into(),
            },
            Error::ShuttingDown {
                retry_after: Duration::from_secs(1),
            },
            // Not refusals: the client left, the engine failed.
            Error::BodyIncomplete(io()),
            Error::UpstreamTimeout {
                upstream: "a".into(),
                model: "m".into(),
                after: Duration::from_secs(1),
            },
        ];
        for error in &errors {
            super::record(error, routes, metrics, &access);
        }
        let route = routes.resolve("m").unwrap();
        assert_eq!(route.rejections.queue_full.get(), 1);
        assert_eq!(route.rejections.model_unavailable.get(), 1);
        assert_eq!(route.rejections.upstream_unavailable.get(), 1);
        assert_eq!(route.rejections.queue_timeout.get(), 0);
        let mut lines = rejections(metrics);
        lines.sort();
        assert_eq!(
            lines,
            [
                r#"rejections_total{model="",reason="model_not_found"} 1"#,
                r#"rejections_total{model="",reason="shutting_down"} 1"#,
                r#"rejections_total{model="m",reason="model_unavailable"} 1"#,
                r#"rejections_total{model="m",reason="queue_full"} 1"#,
                r#"rejections_total{model="m",reason="too_heavy"} 1"#,
                r#"rejections_total{model="m",reason="upstream_unavailable"} 1"#,
            ]
        );
    }

    #[test]
    fn a_uuid_request_id_becomes_the_instance() {
        let id = HeaderValue::from_static("0b7c6f3e-1d2a-4c5b-9e8f-7a6b5c4d3e2f");
        let response: Response<Bytes> = respond(&Error::Unauthorized, &id, Dialect::OpenAi);
        let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert_eq!(
            doc["instance"],
            "urn:uuid:0b7c6f3e-1d2a-4c5b-9e8f-7a6b5c4d3e2f"
        );
    }

    #[test]
    fn a_bad_request_reads_as_its_detail_with_the_parsers_words() {
        let json = serde_json::from_str::<serde_json::Value>("{bad").unwrap_err();
        let cases = [
            (
                BadRequest::Count { member: "n" },
                "`n` must be a positive integer".to_owned(),
            ),
            (
                BadRequest::Json(json),
                "the request body is not valid JSON: key must be a string at line 1 column 2"
                    .to_owned(),
            ),
            (
                BadRequest::TenantTooLong {
                    header: "x-tenant".into(),
                    len: 200,
                },
                "the `x-tenant` header is 200 bytes long; a tenant name has at most 128".to_owned(),
            ),
            (
                BadRequest::ModelNeeded {
                    route: "/v1/embeddings",
                },
                "the request body has no `model` member, and /v1/embeddings does not serve \
                 exactly one model; name one"
                    .to_owned(),
            ),
        ];
        for (bad, detail) in cases {
            assert_eq!(bad.detail(), detail);
            let doc = Error::BadRequest(bad).to_problem();
            assert_eq!(doc.detail(), Some(detail.as_str()));
        }
    }

    #[test]
    fn a_bad_header_is_not_called_a_bad_body() {
        let doc = Error::BadRequest(BadRequest::MaxWait {
            header: http::HeaderName::from_static("x-slotgate-max-wait"),
        })
        .to_problem();
        assert!(
            doc.message()
                .starts_with("The `x-slotgate-max-wait` header is invalid"),
            "{doc:?}"
        );
        assert_eq!(doc.param(), Some("x-slotgate-max-wait"));
        let body = Error::BadRequest(BadRequest::NoModel).to_problem();
        assert!(body.message().starts_with("The request body is invalid"));
    }

    #[test]
    fn an_upstream_failure_names_its_cause() {
        let error = Error::UpstreamFailed {
            upstream: "gpu".into(),
            model: "m".into(),
            source: Box::new(std::io::Error::other("connection reset")),
        };
        let doc = error.to_problem();
        assert!(
            doc.detail().unwrap().contains("connection reset"),
            "{doc:?}"
        );
    }
}
