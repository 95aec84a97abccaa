//! # slotgate-problem
//!
//! Every error the slotgate gateway sends, as an [RFC 9457] problem document
//! (`application/problem+json`). One constructor per problem type fixes its status, its stable
//! `type` URI, its title, the extension members a program can act on, and a message that tells a
//! person what happened and what to do next:
//!
//! | constructor | status | `type` slug | `Retry-After` |
//! |---|---|---|---|
//! | [`Problem::queue_full`] | 503 | `queue-full` | yes |
//! | [`Problem::queue_timeout`] | 503 | `queue-timeout` | yes |
//! | [`Problem::queue_deadline`] | 503 | `queue-timeout` | yes |
//! | [`Problem::model_not_found`] | 404 | `model-not-found` | |
//! | [`Problem::not_found`] | 404 | `not-found` | |
//! | [`Problem::method_not_allowed`] | 405 | `method-not-allowed` | |
//! | [`Problem::route_not_served`] | 404 | `route-not-served` | |
//! | [`Problem::route_disabled`] | 403 | `route-disabled` | |
//! | [`Problem::response_not_found`] | 404 | `response-not-found` | |
//! | [`Problem::response_id_not_found`] | 404 | `response-not-found` | |
//! | [`Problem::response_upstream_unavailable`] | 503 | `response-upstream-unavailable` | yes |
//! | [`Problem::bad_request`] | 400 | `bad-request` | |
//! | [`Problem::bad_header`] | 400 | `bad-request` | |
//! | [`Problem::body_too_large`] | 413 | `body-too-large` | |
//! | [`Problem::unsupported_media_type`] | 415 | `unsupported-media-type` | |
//! | [`Problem::body_timeout`] | 408 | `body-timeout` | |
//! | [`Problem::unauthorized`] | 401 | `unauthorized` | |
//! | [`Problem::upstream_unavailable`] | 503 | `upstream-unavailable` | yes |
//! | [`Problem::upstream_timeout`] | 504 | `upstream-timeout` | |
//! | [`Problem::upstream_bad_response`] | 502 | `upstream-bad-response` | |
//! | [`Problem::overloaded`] | 503 | `overloaded` | yes |
//! | [`Problem::store_unavailable`] | 503 | `store-unavailable` | yes |
//! | [`Problem::upstream_stalled`] | 504 | `upstream-stalled` | |
//! | [`Problem::stream_timeout`] | 504 | `stream-timeout` | |
//! | [`Problem::malformed_request`] | 400 | `malformed-request` | |
//! | [`Problem::uri_too_long`] | 414 | `uri-too-long` | |
//! | [`Problem::headers_too_large`] | 431 | `headers-too-large` | |
//! | [`Problem::shutting_down`] | 503 | `shutting-down` | yes |
//! | [`Problem::reload_unavailable`] | 409 | `reload-unavailable` | |
//! | [`Problem::config_refused`] | 422 | `config-refused` | |
//! | [`Problem::internal`] | 500 | `internal` | |
//!
//! `docs/problems.md` in the repository is the reference for clients: when each problem happens
//! and what to do about it.
//!
//! # OpenAI-compatible clients
//!
//! OpenAI-compatible clients do not know RFC 9457; they read `{"error": {"message", "type",
//! "param", "code"}}`. Every document therefore also carries that object as an extension member
//! named `error` (all four keys present, `param` and `code` may be null, `code` is the slug with
//! `_`, e.g. `queue_full`). RFC 9457 consumers ignore it, OpenAI-compatible SDKs show its message, and both
//! see the same status and `Retry-After`.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use bytes::Bytes;
//! use slotgate_problem::{CONTENT_TYPE, Kind, Problem};
//!
//! let problem = Problem::queue_full("gpu-a", "llama", Duration::from_millis(2500));
//! let response: http::Response<Bytes> = problem.to_response();
//!
//! assert_eq!(response.status(), 503);
//! assert_eq!(response.headers()["content-type"], CONTENT_TYPE);
//! assert_eq!(response.headers()["retry-after"], "3"); // rounded up
//!
//! let body: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
//! assert_eq!(body["type"], Kind::QueueFull.type_uri());
//! assert_eq!(body["title"], "Queue full");
//! assert_eq!(body["status"], 503);
//! assert_eq!(body["model"], "llama");
//! assert_eq!(body["retry_after"], 3);
//! assert_eq!(body["error"]["code"], "queue_full");
//! assert_eq!(body["error"]["type"], "server_error");
//! ```
//!
//! [RFC 9457]: https://www.rfc-editor.org/rfc/rfc9457

mod constructors;
mod dialect;
mod kind;
mod problem;
mod response;

pub use constructors::ECHO_LIMIT;
pub use dialect::{Dialect, Framing};
pub use kind::{BASE_URI, Kind, slug};
pub use problem::Problem;

/// The media type of a problem document (RFC 9457 §3), sent as `Content-Type`.
pub const CONTENT_TYPE: &str = "application/problem+json";

/// Whether `name` follows RFC 9457 §3.2 for extension member names: at least three characters,
/// only ASCII letters, digits and `_`, starting with a letter.
///
/// ```
/// use slotgate_problem::is_valid_extension_name;
///
/// assert!(is_valid_extension_name("request_id"));
/// assert!(!is_valid_extension_name("id")); // too short
/// assert!(!is_valid_extension_name("_private"));
/// assert!(!is_valid_extension_name("retry-after"));
/// ```
#[must_use]
pub fn is_valid_extension_name(name: &str) -> bool {
    let mut chars = name.chars();
    name.len() >= 3
        && chars.next().is_some_and(|c| c.is_ascii_alphabetic())
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

#[cfg(test)]
mod tests;
