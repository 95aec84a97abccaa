//! The answer to a failed request: the problem document of each [`Error`], written in the
//! client's dialect ([`dialect`]: OpenAI's and Anthropic's error objects are problem documents,
//! Ollama's is a string error unless the client asks for `application/problem+json`), with the
//! request id, and logged as a warning when the gateway or an upstream is at fault.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use slotgate_problem::{Dialect, Problem};
use tracing::{debug, warn};

use crate::proxy::problems::error::{Deadline, Error};
use crate::support::error::chain;

/// `Retry-After` of 503 `overloaded`: bodies in flight are usually read within a second or so.
const OVERLOADED_RETRY_AFTER: Duration = Duration::from_secs(1);

impl Error {
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
            Error::HeadersTooLarge { limit } => Problem::headers_too_large().with_detail(format!(
                "The request head is larger than the {limit} bytes this gateway takes (counting \
                 the request line and each field as `name: value` and its line end)."
            )),
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
                also_full,
            } => queue_full(upstream, model, *retry_after, *also_full),
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
}

/// The `queue-full` problem; when other upstreams of the model were full too, its detail says
/// so (the `upstream` member still names the best-ranked one), so that it does not read as if
/// only that one were full.
fn queue_full(upstream: &str, model: &str, retry_after: Duration, also_full: usize) -> Problem {
    let problem = Problem::queue_full(upstream, model, retry_after);
    if also_full == 0 {
        return problem;
    }
    let plural = if also_full == 1 { "" } else { "s" };
    problem.with_detail(format!(
        "Every slot and queue place for model `{model}` is taken on upstream `{upstream}` and on \
         {also_full} other upstream{plural}."
    ))
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
