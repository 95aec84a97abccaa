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
//!
//! The parts: [`error`] (the type, and the conversions that belong to no other step),
//! [`bad_request`] (a request unusable as it is), [`classify`] (reason, outcome, what is
//! counted, and [`record`]), [`render`] (the problem document in the client's dialect,
//! [`respond`]).

mod bad_request;
mod classify;
mod error;
mod render;

pub(crate) use self::bad_request::BadRequest;
pub(crate) use self::classify::record;
pub(crate) use self::error::{Deadline, Error, GET_ONLY, POST_ONLY, Unavailable, allow, not_found};
pub(crate) use self::render::{ANTHROPIC_REQUEST_ID, dialect, document, respond};

#[cfg(test)]
mod tests;
