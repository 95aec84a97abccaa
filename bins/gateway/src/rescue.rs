//! The last step of every failed request: each error becomes its problem document, here and
//! nowhere else.
//!
//! Errors are first classified (STYLE.md §12) by whose side failed and whether a retry can help:
//!
//! | side       | variants                                                        | status      |
//! |------------|-----------------------------------------------------------------|-------------|
//! | client     | `NotFound`, `MethodNotAllowed`, `ModelNotFound`, `BadRequest`, `BodyRead`, `BodyTooLarge`, `UnsupportedMediaType` | 404, 405, 404, 400, 400, 413, 415 |
//! | capacity   | `QueueFull`, `QueueTimeout`                                     | 503 + `Retry-After` |
//! | upstream   | `UpstreamConnect`, `UpstreamFailed`, `UpstreamTimeout`          | 502, 502, 504 |
//! | gateway    | `ShuttingDown`, `Internal`                                      | 503, 500 (as a problem) |
//!
//! [`respond`] turns any of them into an `application/problem+json` response carrying the
//! request id. Nothing else in the gateway builds an error response, so no path can answer with
//! a bare 500 or an empty body.

use std::time::Duration;

/// A boxed error, as hyper and http-body-util hand them out.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Everything that can stop a request, classified.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
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
        /// The value of the `Allow` header.
        allow: &'static str,
    },
    /// The model is not configured.
    #[error("model {model:?} is not served here")]
    ModelNotFound {
        /// The model asked for.
        model: String,
    },
    /// The body is not a usable request.
    #[error("{0}")]
    BadRequest(String),
    /// Reading the body failed (the client went away or sent a broken body).
    #[error("reading the request body failed")]
    BodyRead(#[source] BoxError),
    /// The body is larger than the configured limit.
    #[error("the request body is larger than {limit} bytes")]
    BodyTooLarge {
        /// The limit, in bytes.
        limit: usize,
    },
    /// The body is not JSON.
    #[error("the request body must be application/json")]
    UnsupportedMediaType {
        /// The `Content-Type` the client sent, if any (truncated).
        got: Option<String>,
    },

    // === capacity ===
    /// Every candidate's queue is full.
    #[error("every queue for model {model:?} is full")]
    QueueFull {
        /// The model asked for.
        model: String,
        /// When a retry may succeed.
        retry_after: Duration,
    },
    /// The request waited `queue_timeout` without getting a slot.
    #[error("no slot for model {model:?} within {waited:?}")]
    QueueTimeout {
        /// The model asked for.
        model: String,
        /// How long it waited.
        waited: Duration,
        /// When a retry may succeed.
        retry_after: Duration,
    },

    // === the upstream's side ===
    /// The upstream could not be connected to: nothing was sent.
    #[error("cannot connect to upstream {upstream}")]
    UpstreamConnect {
        /// The upstream's name.
        upstream: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The upstream failed after the request was (maybe partly) sent.
    #[error("upstream {upstream} failed")]
    UpstreamFailed {
        /// The upstream's name.
        upstream: String,
        /// Why.
        #[source]
        source: BoxError,
    },
    /// The upstream sent no response head within the first-byte timeout.
    #[error("upstream {upstream} sent nothing within {after:?}")]
    UpstreamTimeout {
        /// The upstream's name.
        upstream: String,
        /// The timeout.
        after: Duration,
    },

    // === the gateway's side ===
    /// The gateway is shutting down and takes no new requests.
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// A bug: something that should not fail did.
    #[error("internal error: {0}")]
    Internal(String),
}
