//! What can stop a request: the one [`Error`] type of the request path, its kinds by whose side
//! failed, the conversions into it that belong to no other step ([`Error::forwarding`],
//! [`BadRequest`]), and the constructors the endpoint table uses ([`allow`], [`not_found`]).

use std::time::Duration;

use http::{Method, Request};

use crate::proxy::forward::ForwardError;
use crate::proxy::problems::bad_request::BadRequest;
use crate::support::error::BoxError;

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
    /// The request head is larger than the gateway takes (`[server] max_header_bytes`).
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
        /// How many other upstreams of the model were found full too (0: this one alone).
        also_full: usize,
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
