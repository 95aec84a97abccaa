//! One constructor per [`Kind`]: each writes the `detail`, the extension members and the
//! `error.message` for its problem, so the wording lives in one place.

use std::time::Duration;

use http::Method;

use crate::problem::retry_secs;
use crate::{Kind, Problem};

impl Problem {
    /// [`Kind::QueueFull`] (503): every slot and queue place of `model` is taken on `upstream`
    /// (the gateway names the best-ranked upstream when several were full), so the request was
    /// refused without waiting.
    ///
    /// Sets `Retry-After` from `retry_after`, and the extension members `upstream` and `model`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::queue_full("gpu-a", "llama", Duration::from_secs(4));
    /// assert_eq!(p.status(), 503);
    /// assert_eq!(p.retry_after_secs(), Some(4));
    /// ```
    #[must_use]
    pub fn queue_full(upstream: &str, model: &str, retry_after: Duration) -> Self {
        let secs = retry_secs(retry_after);
        Self::new(
            Kind::QueueFull,
            format!(
                "Model `{model}` is at capacity: every slot and every queue place is taken. \
                 Retry in {secs} s."
            ),
        )
        .with_detail(format!(
            "Every slot and queue place for model `{model}` on upstream `{upstream}` is taken."
        ))
        .ext("upstream", upstream)
        .ext("model", model)
        .with_retry_after(retry_after)
    }

    /// [`Kind::QueueTimeout`] (503): the request waited `waited` in the queue of `model` on
    /// `upstream` without getting a slot. It never reached the upstream.
    ///
    /// Sets `Retry-After` from `retry_after`, and the extension members `upstream`, `model`
    /// and `waited_ms`.
    #[must_use]
    pub fn queue_timeout(
        upstream: &str,
        model: &str,
        waited: Duration,
        retry_after: Duration,
    ) -> Self {
        let secs = retry_secs(retry_after);
        let waited_text = human(waited);
        Self::new(
            Kind::QueueTimeout,
            format!(
                "Model `{model}` is busy: the request waited {waited_text} in the queue without \
                 getting a slot and was not run. Retry in {secs} s."
            ),
        )
        .with_detail(format!(
            "Waited {waited_text} in the queue for model `{model}` on upstream `{upstream}` \
             without getting a slot."
        ))
        .ext("upstream", upstream)
        .ext("model", model)
        .ext("waited_ms", millis(waited))
        .with_retry_after(retry_after)
    }

    /// [`Kind::QueueTimeout`] (503) for a wait bounded by the client's own deadline, shorter
    /// than the model's `queue_timeout`: `deadline` names it (`x-slotgate-max-wait` or
    /// `x-stainless-timeout`) and `bound` is its value. With `expected`, the request was
    /// refused before it queued: the wait the gateway expected from recent slot hold times was
    /// already longer than what was left of the deadline. It never reached the upstream.
    ///
    /// Sets `Retry-After` from `retry_after`, and the extension members `upstream`, `model`,
    /// `waited_ms`, `deadline`, `deadline_ms`, and `expected_wait_ms` when refused before
    /// queueing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_problem::Problem;
    ///
    /// let secs = Duration::from_secs;
    /// let p = Problem::queue_deadline("gpu-a", "llama", secs(0), "x-slotgate-max-wait",
    ///                                 secs(2), Some(secs(9)), secs(9));
    /// assert_eq!(p.status(), 503);
    /// assert_eq!(p.extension("deadline").unwrap(), "x-slotgate-max-wait");
    /// assert_eq!(p.extension("expected_wait_ms").unwrap(), 9000);
    /// ```
    #[must_use]
    pub fn queue_deadline(
        upstream: &str,
        model: &str,
        waited: Duration,
        deadline: &str,
        bound: Duration,
        expected: Option<Duration>,
        retry_after: Duration,
    ) -> Self {
        let secs = retry_secs(retry_after);
        let bound_text = human(bound);
        let (message, detail) = if let Some(expected) = expected {
            let expected_text = human(expected);
            (
                format!(
                    "Model `{model}` is busy: a slot is expected in about {expected_text}, \
                     later than your {deadline} of {bound_text}, so the request was not \
                     queued and was not run. Retry in {secs} s, or allow a longer wait."
                ),
                format!(
                    "The expected wait of {expected_text} for model `{model}` on upstream \
                     `{upstream}` is longer than the client's {deadline} of {bound_text}; \
                     refused without queueing."
                ),
            )
        } else {
            let waited_text = human(waited);
            (
                format!(
                    "Model `{model}` is busy: the request waited {waited_text} in the queue, \
                     up to your {deadline} of {bound_text}, without getting a slot and was \
                     not run. Retry in {secs} s."
                ),
                format!(
                    "Waited {waited_text} in the queue for model `{model}` on upstream \
                     `{upstream}` without getting a slot; the wait ended on the client's \
                     {deadline} of {bound_text}."
                ),
            )
        };
        let problem = Self::new(Kind::QueueTimeout, message)
            .with_detail(detail)
            .ext("upstream", upstream)
            .ext("model", model)
            .ext("waited_ms", millis(waited))
            .ext("deadline", deadline)
            .ext("deadline_ms", millis(bound))
            .with_retry_after(retry_after);
        if let Some(expected) = expected {
            problem.ext("expected_wait_ms", millis(expected))
        } else {
            problem
        }
    }

    /// [`Kind::ModelNotFound`] (404): no upstream is configured for `model` (a name or an
    /// alias).
    ///
    /// Sets the extension member `model`, and `error.param` to `model`.
    /// The name is client input: only its first [`ECHO_LIMIT`] characters are echoed, so a huge
    /// name cannot make a huge answer.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::model_not_found(&"x".repeat(1 << 20));
    /// assert!(p.to_json_bytes().len() < 4096);
    /// ```
    #[must_use]
    pub fn model_not_found(model: &str) -> Self {
        let model = clip(model);
        let model = model.as_str();
        Self::new(
            Kind::ModelNotFound,
            format!(
                "The model `{model}` does not exist on this gateway. \
                 GET /v1/models lists the models you can use."
            ),
        )
        .with_detail(format!("No upstream serves model `{model}`."))
        .ext("model", model)
        .with_param("model")
    }

    /// [`Kind::RouteNotServed`] (404): upstreams serve `model`, but none of a kind that serves
    /// `route` (for example Ollama's `/api/chat` when only a `llama-server` has the model).
    ///
    /// Sets the extension members `model` and `route`.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::route_not_served("qwen", "/api/chat");
    /// assert_eq!(p.status(), 404);
    /// ```
    #[must_use]
    pub fn route_not_served(model: &str, route: &str) -> Self {
        Self::new(
            Kind::RouteNotServed,
            format!(
                "No server of model `{model}` serves `{route}`. Use a route its engines serve \
                 (POST /v1/chat/completions works everywhere)."
            ),
        )
        .with_detail(format!(
            "The upstreams configured for model `{model}` are of kinds that do not serve \
             `{route}`; docs/configuration.md lists which kind serves which route."
        ))
        .ext("model", model)
        .ext("route", route)
    }

    /// [`Kind::RouteDisabled`] (403): `route` changes an engine's disk and no upstream serving
    /// `model` allows it (`allow_model_management`).
    ///
    /// Sets the extension members `model` and `route`.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::route_disabled("qwen", "/api/pull");
    /// assert_eq!(p.status(), 403);
    /// ```
    #[must_use]
    pub fn route_disabled(model: &str, route: &str) -> Self {
        Self::new(
            Kind::RouteDisabled,
            format!(
                "`{route}` changes the models on an engine's disk and is disabled on this \
                 gateway. Ask the operator, or manage models on the engine directly."
            ),
        )
        .with_detail(format!(
            "No upstream serving model `{model}` has `allow_model_management = true`."
        ))
        .ext("model", model)
        .ext("route", route)
    }

    /// [`Kind::ResponseNotFound`] (404): the gateway knows no upstream for response `id`.
    ///
    /// Sets the extension member `response_id`.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// assert_eq!(Problem::response_not_found("resp_1").status(), 404);
    /// ```
    #[must_use]
    pub fn response_not_found(id: &str) -> Self {
        Self::new(
            Kind::ResponseNotFound,
            format!(
                "Response `{id}` is not known here: it did not pass through this gateway, it was \
                 deleted, or it is too old. Start a new conversation without \
                 `previous_response_id`."
            ),
        )
        .with_detail(format!("No upstream is recorded for response `{id}`."))
        .ext("response_id", id)
        .with_param("previous_response_id")
    }

    /// [`Kind::ResponseNotFound`] (404) for a response named in the path (`GET`/`DELETE
    /// /v1/responses/{id}`, `/cancel`, `/input_items`) rather than as `previous_response_id`:
    /// no `error.param`, since no body member is at fault.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let problem = Problem::response_id_not_found("resp_1");
    /// assert_eq!(problem.status(), 404);
    /// assert_eq!(problem.param(), None);
    /// ```
    #[must_use]
    pub fn response_id_not_found(id: &str) -> Self {
        Self::new(
            Kind::ResponseNotFound,
            format!(
                "Response `{id}` is not known here: it did not pass through this gateway, it was \
                 deleted, or it is too old. It cannot be read, cancelled or deleted here."
            ),
        )
        .with_detail(format!("No upstream is recorded for response `{id}`."))
        .ext("response_id", id)
    }

    /// [`Kind::ResponseUpstreamUnavailable`] (503): `upstream`, which holds response `id`, is
    /// down, draining or no longer serves the model.
    ///
    /// Sets `Retry-After` from `retry_after`, and the extension members `response_id` and
    /// `upstream`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::response_upstream_unavailable("resp_1", "gpu-a", Duration::from_secs(5));
    /// assert_eq!(p.retry_after_secs(), Some(5));
    /// ```
    #[must_use]
    pub fn response_upstream_unavailable(id: &str, upstream: &str, retry_after: Duration) -> Self {
        let secs = retry_secs(retry_after);
        Self::new(
            Kind::ResponseUpstreamUnavailable,
            format!(
                "The server holding response `{id}` cannot take requests now. Retry in {secs} s, \
                 or start a new conversation without `previous_response_id`."
            ),
        )
        .with_detail(format!(
            "Upstream `{upstream}`, which holds response `{id}`, is down, draining or no longer \
             serves the model; no other host has the conversation."
        ))
        .ext("response_id", id)
        .ext("upstream", upstream)
        .with_retry_after(retry_after)
    }

    /// [`Kind::NotFound`] (404): `path` is not a route of the gateway.
    ///
    /// Sets the extension member `path`, clipped to [`ECHO_LIMIT`] characters like any echoed
    /// client input.
    #[must_use]
    pub fn not_found(path: &str) -> Self {
        let path = clip(path);
        let path = path.as_str();
        Self::new(
            Kind::NotFound,
            format!(
                "Unknown path `{path}`. This gateway serves the OpenAI API under /v1, \
                 for example POST /v1/chat/completions."
            ),
        )
        .with_detail(format!("No route for `{path}`."))
        .ext("path", path)
    }

    /// [`Kind::MethodNotAllowed`] (405): the route exists, but not for `method`; `allowed`
    /// lists the methods it accepts.
    ///
    /// Sets the `Allow` header (RFC 9110 §15.5.6 requires it) and the extension members
    /// `method` and `allowed`.
    #[must_use]
    pub fn method_not_allowed(method: &Method, allowed: &[Method]) -> Self {
        let list = join_methods(allowed);
        let next = if allowed.is_empty() {
            "This path accepts no method.".to_owned()
        } else {
            format!("Use one of: {list}.")
        };
        let mut problem = Self::new(
            Kind::MethodNotAllowed,
            format!("Method {method} is not allowed on this path. {next}"),
        )
        .with_detail(format!(
            "Method {method} is not allowed here; allowed: {list}."
        ))
        .ext("method", method.as_str())
        .ext(
            "allowed",
            allowed.iter().map(Method::as_str).collect::<Vec<_>>(),
        );
        problem.allow = allowed.to_vec();
        problem
    }

    /// [`Kind::BadRequest`] (400): the body is not what the endpoint needs; `detail` says what
    /// is wrong (for example "`model` is missing").
    ///
    /// Use [`with_param`](Problem::with_param) to name the field at fault.
    #[must_use]
    pub fn bad_request(detail: impl Into<String>) -> Self {
        let detail = detail.into();
        Self::new(
            Kind::BadRequest,
            format!(
                "The request body is invalid: {}. Fix it and send the request again.",
                detail.trim_end_matches('.')
            ),
        )
        .with_detail(detail)
    }

    /// [`Kind::BadRequest`] (400) for one of the request's headers rather than its body:
    /// `detail` says what is wrong with `header`, which is also `error.param`.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let problem = Problem::bad_header("x-slotgate-max-wait", "it must be a duration");
    /// assert_eq!(problem.status(), 400);
    /// assert_eq!(problem.param(), Some("x-slotgate-max-wait"));
    /// assert!(problem.message().starts_with("The `x-slotgate-max-wait` header is invalid"));
    /// ```
    #[must_use]
    pub fn bad_header(header: &str, detail: impl Into<String>) -> Self {
        let detail = detail.into();
        Self::new(
            Kind::BadRequest,
            format!(
                "The `{header}` header is invalid: {}. Fix it and send the request again.",
                detail.trim_end_matches('.')
            ),
        )
        .with_detail(detail)
        .with_param(header)
    }

    /// [`Kind::BodyTooLarge`] (413): the body is larger than `limit` bytes.
    ///
    /// Sets the extension member `limit_bytes`.
    #[must_use]
    pub fn body_too_large(limit: u64) -> Self {
        Self::new(
            Kind::BodyTooLarge,
            format!(
                "The request body is larger than this gateway accepts ({limit} bytes). \
                 Send a smaller request, for example fewer or shorter messages."
            ),
        )
        .with_detail(format!(
            "The request body exceeds the limit of {limit} bytes."
        ))
        .ext("limit_bytes", limit)
    }

    /// [`Kind::UnsupportedMediaType`] (415): the body is not declared as JSON; `content_type`
    /// is the request's `Content-Type`, [`None`] when it had none.
    ///
    /// Sets the extension members `content_type` (null when absent) and `accepted`.
    #[must_use]
    pub fn unsupported_media_type(content_type: Option<&str>) -> Self {
        let got = content_type.map_or_else(
            || "The request has no Content-Type.".to_owned(),
            |ct| format!("Content-Type `{ct}` is not supported."),
        );
        Self::new(
            Kind::UnsupportedMediaType,
            format!("{got} Send the body as JSON with `Content-Type: application/json`."),
        )
        .with_detail(got)
        .ext("content_type", content_type)
        .ext("accepted", vec!["application/json"])
    }

    /// [`Kind::BodyTimeout`] (408): the client did not send the whole body within `timeout`.
    ///
    /// Sets the extension member `timeout_ms`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_problem::Problem;
    ///
    /// assert_eq!(Problem::body_timeout(Duration::from_secs(30)).status(), 408);
    /// ```
    #[must_use]
    pub fn body_timeout(timeout: Duration) -> Self {
        let after = human(timeout);
        Self::new(
            Kind::BodyTimeout,
            format!(
                "The request body did not arrive within {after}; nothing was run. Send the \
                 whole body at once, or check the network between you and the gateway."
            ),
        )
        .with_detail(format!("The request body was not complete within {after}."))
        .ext("timeout_ms", millis(timeout))
    }

    /// [`Kind::Unauthorized`] (401): API keys are configured and the request carries none, or
    /// one that is not accepted. The key is never echoed.
    ///
    /// The response carries `WWW-Authenticate: Bearer` (RFC 9110 §11.6.1 requires a challenge
    /// on 401).
    #[must_use]
    pub fn unauthorized() -> Self {
        Self::new(
            Kind::Unauthorized,
            "Missing or invalid API key. Send a valid key as `Authorization: Bearer <key>` or `x-api-key: <key>`."
                .to_owned(),
        )
        .with_detail("The request has no API key, or one this gateway does not accept.")
    }

    /// [`Kind::UpstreamUnavailable`] (503): no upstream that serves `model` can take the
    /// request right now: none is healthy and not draining, or every one refused the
    /// connection before the request was sent.
    ///
    /// Sets `Retry-After` from `retry_after` (for example the health-check interval) and the
    /// extension member `model`. See [`Kind::UpstreamUnavailable`] for why this is 503 and not
    /// 502.
    #[must_use]
    pub fn upstream_unavailable(model: &str, retry_after: Duration) -> Self {
        let secs = retry_secs(retry_after);
        Self::new(
            Kind::UpstreamUnavailable,
            format!(
                "No server for model `{model}` is reachable right now; the request was not run. \
                 Retry in {secs} s."
            ),
        )
        .with_detail(format!(
            "No upstream for model `{model}` is healthy and accepting connections."
        ))
        .ext("model", model)
        .with_retry_after(retry_after)
    }

    /// [`Kind::UpstreamTimeout`] (504): `upstream` took the request for `model` but sent no
    /// response headers within `timeout`.
    ///
    /// Sets the extension members `upstream`, `model` and `timeout_ms`. No `Retry-After`: the
    /// request may have run (and used tokens) on the upstream, so whether to retry is the
    /// client's call.
    #[must_use]
    pub fn upstream_timeout(upstream: &str, model: &str, timeout: Duration) -> Self {
        let after = human(timeout);
        Self::new(
            Kind::UpstreamTimeout,
            format!(
                "The server for model `{model}` did not answer within {after}. The request may \
                 still have run. Retry later, or with a smaller request."
            ),
        )
        .with_detail(format!(
            "Upstream `{upstream}` sent no response headers for model `{model}` within {after}."
        ))
        .ext("upstream", upstream)
        .ext("model", model)
        .ext("timeout_ms", millis(timeout))
    }

    /// [`Kind::UpstreamBadResponse`] (502): `upstream` answered the request for `model` with
    /// something that is not a valid HTTP response, or closed the connection before the
    /// response headers.
    ///
    /// Sets the extension members `upstream` and `model`; add the cause with
    /// [`with_detail`](Problem::with_detail) when it helps.
    #[must_use]
    pub fn upstream_bad_response(upstream: &str, model: &str) -> Self {
        Self::new(
            Kind::UpstreamBadResponse,
            format!(
                "The server for model `{model}` sent an invalid or incomplete response. \
                 Retry the request; if this keeps happening, tell the gateway's operator."
            ),
        )
        .with_detail(format!(
            "Upstream `{upstream}` sent an invalid response, or none, for model `{model}`."
        ))
        .ext("upstream", upstream)
        .ext("model", model)
    }

    /// [`Kind::Overloaded`] (503): the gateway already buffers `budget` bytes of request bodies
    /// and refused this one rather than run out of memory.
    ///
    /// Sets `Retry-After` from `retry_after` and the extension member `budget_bytes`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::overloaded(1 << 28, Duration::from_secs(1));
    /// assert_eq!(p.status(), 503);
    /// assert_eq!(p.retry_after_secs(), Some(1));
    /// ```
    #[must_use]
    pub fn overloaded(budget: u64, retry_after: Duration) -> Self {
        let secs = retry_secs(retry_after);
        Self::new(
            Kind::Overloaded,
            format!(
                "The gateway is receiving too many request bodies at once; the request was not \
                 run. Retry in {secs} s."
            ),
        )
        .with_detail(format!(
            "The request bodies being received already fill the gateway's budget of {budget} \
             bytes."
        ))
        .ext("budget_bytes", budget)
        .with_retry_after(retry_after)
    }

    /// [`Kind::StoreUnavailable`] (503): the shared slot store of `[cluster]` cannot be reached
    /// and the gateway refuses rather than risk exceeding `model`'s cap across its replicas.
    ///
    /// Sets `Retry-After` from `retry_after` and the extension member `model`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::store_unavailable("llama", Duration::from_secs(3));
    /// assert_eq!(p.status(), 503);
    /// assert_eq!(p.retry_after_secs(), Some(3));
    /// ```
    #[must_use]
    pub fn store_unavailable(model: &str, retry_after: Duration) -> Self {
        let secs = retry_secs(retry_after);
        Self::new(
            Kind::StoreUnavailable,
            format!(
                "The gateway cannot reach the slot store it shares with its other replicas; the \
                 request was not run. Retry in {secs} s."
            ),
        )
        .with_detail(format!(
            "The shared slot store (Redis, [cluster]) does not answer and on_store_down is \
             fail-closed: requests for model `{model}` are refused rather than risk exceeding \
             its cap."
        ))
        .ext("model", model)
        .with_retry_after(retry_after)
    }

    /// [`Kind::UpstreamStalled`] (504): the answer of `upstream` for `model` had begun, then
    /// stopped, `why` says how (no data within the stream idle timeout, or a failed
    /// connection). A streamed answer carries this as its last `error` event.
    ///
    /// Sets the extension members `upstream` and `model`.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::upstream_stalled("gpu-a", "llama", "no data for 30 s");
    /// assert_eq!(p.status(), 504);
    /// ```
    #[must_use]
    pub fn upstream_stalled(upstream: &str, model: &str, why: &str) -> Self {
        Self::new(
            Kind::UpstreamStalled,
            format!(
                "The server for model `{model}` stopped in the middle of its answer ({why}); \
                 the answer is incomplete. Retry the request."
            ),
        )
        .with_detail(format!(
            "Upstream `{upstream}` stopped answering for model `{model}`: {why}."
        ))
        .ext("upstream", upstream)
        .ext("model", model)
    }

    /// [`Kind::StreamTimeout`] (504): the answer of `upstream` for `model` was still going at
    /// the upstream's `stream_timeout`, so the gateway ended it. A streamed answer carries this
    /// as its last `error` event.
    ///
    /// Sets the extension members `upstream`, `model` and `timeout_ms`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::stream_timeout("gpu-a", "llama", Duration::from_secs(3600));
    /// assert_eq!(p.status(), 504);
    /// ```
    #[must_use]
    pub fn stream_timeout(upstream: &str, model: &str, timeout: Duration) -> Self {
        let after = human(timeout);
        Self::new(
            Kind::StreamTimeout,
            format!(
                "The answer of model `{model}` took longer than {after}, the longest this \
                 server lets one answer run; it is incomplete. Ask for a shorter answer \
                 (`max_tokens`)."
            ),
        )
        .with_detail(format!(
            "Upstream `{upstream}` was still answering for model `{model}` after {after}."
        ))
        .ext("upstream", upstream)
        .ext("model", model)
        .ext("timeout_ms", millis(timeout))
    }

    /// [`Kind::MalformedRequest`] (400): the HTTP/1 request head did not parse. The connection
    /// is closed after it.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// assert_eq!(Problem::malformed_request().status(), 400);
    /// ```
    #[must_use]
    pub fn malformed_request() -> Self {
        Self::new(
            Kind::MalformedRequest,
            "The request is not valid HTTP: its head could not be parsed. Fix the client."
                .to_owned(),
        )
        .with_detail(
            "The HTTP/1 request head did not parse (a header line without `:`, or a bad method, \
             target or version); the connection is closed.",
        )
    }

    /// [`Kind::UriTooLong`] (414): the HTTP/1 request target is longer than 65,534 bytes. The
    /// connection is closed after it.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// assert_eq!(Problem::uri_too_long().status(), 414);
    /// ```
    #[must_use]
    pub fn uri_too_long() -> Self {
        Self::new(
            Kind::UriTooLong,
            "The request URL is too long. Send large inputs in the request body.".to_owned(),
        )
        .with_detail("The request target is longer than 65,534 bytes; the connection is closed.")
    }

    /// [`Kind::HeadersTooLarge`] (431): the HTTP/1 request head has more than 100 header fields
    /// or is larger than 400 KiB.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// assert_eq!(Problem::headers_too_large().status(), 431);
    /// ```
    #[must_use]
    pub fn headers_too_large() -> Self {
        Self::new(
            Kind::HeadersTooLarge,
            "The request headers are too large. Send fewer or smaller headers.".to_owned(),
        )
        .with_detail(
            "The request head has more than 100 header fields or is larger than 400 KiB \
             (409,600 bytes, counting the request line and each field as `name: value` and its \
             line end).",
        )
    }

    /// [`Kind::ShuttingDown`] (503): the gateway is shutting down and takes no new requests.
    ///
    /// Sets `Retry-After` from `retry_after`.
    #[must_use]
    pub fn shutting_down(retry_after: Duration) -> Self {
        let secs = retry_secs(retry_after);
        Self::new(
            Kind::ShuttingDown,
            format!(
                "This gateway is shutting down and takes no new requests. Retry in {secs} s; \
                 another replica may answer sooner."
            ),
        )
        .with_detail("The gateway is shutting down; requests already running will finish.")
        .with_retry_after(retry_after)
    }

    /// [`Kind::ReloadUnavailable`] (409): the gateway was not started from a configuration
    /// file, so a reload has nothing to read.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// assert_eq!(Problem::reload_unavailable().status(), 409);
    /// ```
    #[must_use]
    pub fn reload_unavailable() -> Self {
        Self::new(
            Kind::ReloadUnavailable,
            "This gateway was started from a configuration in memory, not from a file, so there \
             is nothing to reload. Restart it with the new configuration instead."
                .to_owned(),
        )
        .with_detail("The gateway was not started from a configuration file.")
    }

    /// [`Kind::ConfigRefused`] (422): the new configuration cannot be put in force; the one in
    /// force stays. Sets the extension member `issues`, one entry per problem.
    ///
    /// ```
    /// use slotgate_problem::Problem;
    ///
    /// let p = Problem::config_refused(&["upstreams.a.url: unsupported scheme".to_owned()]);
    /// assert_eq!(p.status(), 422);
    /// assert_eq!(p.extension("issues").unwrap()[0], "upstreams.a.url: unsupported scheme");
    /// ```
    #[must_use]
    pub fn config_refused(issues: &[String]) -> Self {
        Self::new(
            Kind::ConfigRefused,
            "The new configuration was refused and the one in force stays. Fix every problem \
             listed in `issues`, then reload again."
                .to_owned(),
        )
        .with_detail(format!(
            "The new configuration has {} problem(s); the configuration in force stays.",
            issues.len()
        ))
        .with_extension("issues", issues.to_vec())
    }

    /// [`Kind::Internal`] (500): a case the gateway believed unreachable. It is a bug; the
    /// gateway logs it and still answers with a problem document.
    #[must_use]
    pub fn internal() -> Self {
        Self::new(
            Kind::Internal,
            "The gateway hit an unexpected error. Retry the request; if this keeps happening, \
             tell the gateway's operator."
                .to_owned(),
        )
        .with_detail("An unexpected error occurred in the gateway.")
    }
}

/// How many characters of client input a problem echoes back.
pub const ECHO_LIMIT: usize = 256;

/// The first [`ECHO_LIMIT`] characters of `input`, with `…` when it was longer.
fn clip(input: &str) -> String {
    match input.char_indices().nth(ECHO_LIMIT) {
        Some((cut, _)) => format!("{}…", &input[..cut]),
        None => input.to_owned(),
    }
}

/// A duration for people: milliseconds below a second, else seconds with one decimal.
fn human(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// Milliseconds for an extension member, saturating instead of wrapping.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn join_methods(methods: &[Method]) -> String {
    methods
        .iter()
        .map(Method::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}
