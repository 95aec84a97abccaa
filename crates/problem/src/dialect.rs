//! One problem, rendered in the dialect of the API the client called.
//!
//! The gateway fronts three APIs whose SDKs read errors differently. The [`Problem`] stays the
//! one internal form; only its `error` member, its media type and, in a stream, its framing
//! change with the route:
//!
//! | dialect | routes | body | `error` member | in a stream |
//! |---|---|---|---|---|
//! | [`Dialect::OpenAi`] | everything else | `application/problem+json` | `{"message","type","param","code"}` | SSE `data:` event carrying the document |
//! | [`Dialect::Anthropic`] | `/v1/messages`, `/v1/messages/count_tokens` | `application/problem+json` | `{"type","message","code","details":{"error_code"}}` with Anthropic's error types | SSE `event: error`, data `{"type":"error","error":{…},"request_id","problem":{…}}` |
//! | [`Dialect::Ollama`] | `/api/*` | `application/json` | the message as a string | an NDJSON line carrying the document |
//!
//! Why these shapes, from the clients' own code (versions pinned by the gateway's SDK tests):
//!
//! - **OpenAI** (openai-python 3.57 `_streaming.py`, `_exceptions.py`): an error body's `error`
//!   object becomes the exception's `message`, `type`, `param` and `code`; in a stream, any
//!   `data:` event whose JSON has an `error` member raises `APIError`.
//! - **Anthropic** (anthropic-python 2.10 `_exceptions.py` `APIStatusError`): `error.type`,
//!   `error.message` and `error.details.error_code` are read from *any* JSON body, and the
//!   request id from the `request-id` header. So the problem document carries Anthropic's
//!   `error` object and stays a problem document. In a stream (`_streaming.py`) only an event
//!   *named* `error` raises; an unnamed `data:` event is skipped, and the answer would look
//!   complete (`stop_reason: null`). That event carries Anthropic's own shape,
//!   `{"type":"error","error":{…}}`, with the problem document under `problem`.
//! - **Ollama** (ollama-python 0.6.3 `_client.py` `ResponseError`): the body's `error` member
//!   becomes `ResponseError.error`, which callers treat as a string; in a stream, any line with
//!   an `error` member raises. Real Ollama answers `{"error":"<text>"}` (routes.go).
//!
//! **Status.** The status never changes with the dialect. Anthropic's own API answers an
//! overload with 529 `overloaded_error`; the gateway keeps 503 for its capacity refusals, with
//! `overloaded_error` as the type: both Anthropic SDKs retry every status ≥ 500 alike and honour
//! `Retry-After` for both (anthropic-python `_base_client.py` `_should_retry`,
//! `_calculate_retry_timeout`), so 529 would gain an SDK user nothing, while 503 is the status
//! every proxy, load balancer and generic HTTP client knows to be retryable, and the one the
//! gateway's contract promises on `/v1/*`. The one visible difference: anthropic-python raises
//! `ServiceUnavailableError` (503) instead of `OverloadedError` (529); both are
//! `InternalServerError`s, and `error.type == "overloaded_error"` tells them apart.

use bytes::Bytes;
use http::Response;
use serde::Serialize;
use serde_json::Value;

use crate::{Kind, Problem};

/// The API dialect a client speaks, chosen from the route it called.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum Dialect {
    /// OpenAI's API and every other route: the problem document with OpenAI's `error` object.
    #[default]
    OpenAi,
    /// Anthropic's Messages API: the problem document with Anthropic's `error` object.
    Anthropic,
    /// Ollama's native API: `{"error": "<message>"}`, with the problem's members beside it.
    Ollama,
}

impl Dialect {
    /// The dialect of the route at `path`: Anthropic for `/v1/messages` and what is under it,
    /// Ollama for `/api/…`, OpenAI otherwise.
    ///
    /// ```
    /// use slotgate_problem::Dialect;
    ///
    /// assert_eq!(Dialect::of_path("/v1/messages"), Dialect::Anthropic);
    /// assert_eq!(Dialect::of_path("/v1/messages/count_tokens"), Dialect::Anthropic);
    /// assert_eq!(Dialect::of_path("/api/chat"), Dialect::Ollama);
    /// assert_eq!(Dialect::of_path("/v1/chat/completions"), Dialect::OpenAi);
    /// assert_eq!(Dialect::of_path("/v1/messagesx"), Dialect::OpenAi);
    /// ```
    #[must_use]
    pub fn of_path(path: &str) -> Self {
        if path == "/v1/messages" || path.starts_with("/v1/messages/") {
            Self::Anthropic
        } else if path.starts_with("/api/") {
            Self::Ollama
        } else {
            Self::OpenAi
        }
    }

    /// The `Content-Type` of an error body in this dialect.
    #[must_use]
    pub fn content_type(self) -> &'static str {
        match self {
            Self::OpenAi | Self::Anthropic => crate::CONTENT_TYPE,
            Self::Ollama => "application/json",
        }
    }
}

impl Kind {
    /// The `error.type` Anthropic's API uses for this kind of failure: `invalid_request_error`,
    /// `authentication_error`, `permission_error`, `not_found_error`, `request_too_large`,
    /// `overloaded_error` (every capacity refusal: retry later), `timeout_error` or
    /// `api_error`.
    #[must_use]
    pub fn anthropic_type(self) -> &'static str {
        match self {
            Kind::QueueFull
            | Kind::QueueTimeout
            | Kind::Overloaded
            | Kind::StoreUnavailable
            | Kind::ShuttingDown
            | Kind::UpstreamUnavailable
            | Kind::ResponseUpstreamUnavailable => "overloaded_error",
            Kind::UpstreamTimeout | Kind::UpstreamStalled | Kind::StreamTimeout => "timeout_error",
            Kind::Unauthorized => "authentication_error",
            Kind::RouteDisabled => "permission_error",
            Kind::NotFound
            | Kind::ModelNotFound
            | Kind::RouteNotServed
            | Kind::ResponseNotFound => "not_found_error",
            Kind::BodyTooLarge => "request_too_large",
            Kind::UpstreamBadResponse | Kind::Internal => "api_error",
            _ if self.status().is_client_error() => "invalid_request_error",
            _ => "api_error",
        }
    }
}

/// Anthropic's `error` object for a problem.
#[derive(Serialize)]
struct AnthropicError<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    message: &'a str,
    code: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    param: Option<&'a str>,
    details: Details,
}

/// Anthropic's in-stream error event, with the problem document (without its `error`) beside.
#[derive(Serialize)]
struct ErrorEvent<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    error: AnthropicError<'a>,
    request_id: Option<&'a Value>,
    problem: crate::problem::InDialect<'a>,
}

/// `error.details`, where the Anthropic SDKs look for a stable `error_code`.
#[derive(Serialize)]
struct Details {
    error_code: &'static str,
}

impl Problem {
    /// Anthropic's `error` object for this problem.
    fn anthropic_error(&self) -> AnthropicError<'_> {
        AnthropicError {
            kind: self.kind().anthropic_type(),
            message: self.message(),
            code: self.kind().code(),
            param: self.param(),
            details: Details {
                error_code: self.kind().code(),
            },
        }
    }

    /// The `error` member in `dialect`.
    pub(crate) fn error_member(&self, dialect: Dialect) -> Value {
        let value = match dialect {
            Dialect::OpenAi => serde_json::to_value(crate::problem::OpenAiError::of(self)),
            Dialect::Anthropic => serde_json::to_value(self.anthropic_error()),
            Dialect::Ollama => Ok(Value::String(self.message().to_owned())),
        };
        value.unwrap_or_else(|_| Value::String(self.message().to_owned()))
    }

    /// The document as bytes in `dialect`: the problem document with that dialect's `error`
    /// member.
    pub fn to_json_bytes_in(&self, dialect: Dialect) -> Bytes {
        serde_json::to_vec(&self.in_dialect(dialect)).map_or_else(
            |_| Bytes::from_static(crate::response::FALLBACK_JSON.as_bytes()),
            Bytes::from,
        )
    }

    /// The complete HTTP response in `dialect`: as [`to_response`](Problem::to_response), with
    /// the dialect's `error` member and `Content-Type`.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use slotgate_problem::{Dialect, Problem};
    ///
    /// let problem = Problem::queue_full("gpu-a", "llama", Duration::from_secs(3));
    /// let res: http::Response<Bytes> = problem.to_response_in(Dialect::Ollama);
    /// assert_eq!(res.status(), 503);
    /// assert_eq!(res.headers()["content-type"], "application/json");
    /// let body: serde_json::Value = serde_json::from_slice(res.body()).unwrap();
    /// assert_eq!(body["error"], problem.message());
    /// assert_eq!(body["type"], "https://slotgate.dev/problems/queue-full");
    /// ```
    pub fn to_response_in<B: From<Bytes>>(&self, dialect: Dialect) -> Response<B> {
        let mut response: Response<B> = self.to_response();
        *response.body_mut() = B::from(self.to_json_bytes_in(dialect));
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static(dialect.content_type()),
        );
        response
    }

    /// The last piece of a streamed answer that ends with this problem, in `dialect` and the
    /// stream's `framing`:
    ///
    /// - SSE, OpenAI: `data: <document>` and a blank line;
    /// - SSE, Anthropic: `event: error` and `data: {"type":"error","error":{…},"request_id":…,
    ///   "problem":{…}}`, Anthropic's own error event (`request_id` is the document's
    ///   `request_id` member, when set);
    /// - SSE, Ollama (no Ollama route streams SSE): as OpenAI;
    /// - NDJSON (Ollama's streams): one line, the document in `dialect`.
    ///
    /// ```
    /// use slotgate_problem::{Dialect, Framing, Problem};
    /// use std::time::Duration;
    ///
    /// let problem = Problem::stream_timeout("gpu", "m", Duration::from_secs(60));
    /// let event = problem.stream_ending(Dialect::Anthropic, Framing::Sse);
    /// assert!(event.starts_with(b"event: error\ndata: {\"type\":\"error\""));
    /// assert!(event.ends_with(b"\n\n"));
    /// ```
    pub fn stream_ending(&self, dialect: Dialect, framing: Framing) -> Bytes {
        let mut out = Vec::new();
        match (framing, dialect) {
            (Framing::Ndjson, _) => {
                out.extend_from_slice(&self.to_json_bytes_in(dialect));
                out.push(b'\n');
            }
            (Framing::Sse, Dialect::Anthropic) => {
                let event = ErrorEvent {
                    kind: "error",
                    error: self.anthropic_error(),
                    request_id: self.extension("request_id"),
                    problem: crate::problem::InDialect {
                        problem: self,
                        dialect: None,
                    },
                };
                out.extend_from_slice(b"event: error\ndata: ");
                // Cannot fail (string keys, JSON values, written to memory); were it to, the
                // event would still be named `error` and raise in the SDK.
                let _ = serde_json::to_writer(&mut out, &event);
                out.extend_from_slice(b"\n\n");
            }
            (Framing::Sse, _) => {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(&self.to_json_bytes_in(dialect));
                out.extend_from_slice(b"\n\n");
            }
        }
        Bytes::from(out)
    }

    fn in_dialect(&self, dialect: Dialect) -> crate::problem::InDialect<'_> {
        crate::problem::InDialect {
            problem: self,
            dialect: Some(dialect),
        }
    }
}

/// How a streamed answer is cut into messages, which decides how its last one is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Framing {
    /// Server-Sent Events (`text/event-stream`): events end with a blank line.
    Sse,
    /// Newline-delimited JSON (`application/x-ndjson`, Ollama's streams): one document a line.
    Ndjson,
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use serde_json::Value;

    use super::{Dialect, Framing};
    use crate::{Kind, Problem};

    fn body(res: &http::Response<Bytes>) -> Value {
        serde_json::from_slice(res.body()).unwrap()
    }

    #[test]
    fn anthropic_gets_its_error_object_inside_the_problem_document() {
        let problem = Problem::queue_full("gpu", "m", Duration::from_secs(3))
            .with_extension("request_id", "req-1");
        let res: http::Response<Bytes> = problem.to_response_in(Dialect::Anthropic);
        assert_eq!(res.status(), 503);
        assert_eq!(res.headers()["retry-after"], "3");
        assert_eq!(res.headers()["content-type"], "application/problem+json");
        let doc = body(&res);
        assert_eq!(doc["type"], "https://slotgate.dev/problems/queue-full");
        assert_eq!(doc["error"]["type"], "overloaded_error");
        assert_eq!(doc["error"]["code"], "queue_full");
        assert_eq!(doc["error"]["details"]["error_code"], "queue_full");
        assert_eq!(doc["error"]["message"], problem.message());
        assert_eq!(doc["request_id"], "req-1");
    }

    #[test]
    fn ollama_gets_a_string_error_and_keeps_the_type_and_status() {
        let problem = Problem::model_not_found("x").with_extension("request_id", "req-2");
        let res: http::Response<Bytes> = problem.to_response_in(Dialect::Ollama);
        assert_eq!(res.status(), 404);
        assert_eq!(res.headers()["content-type"], "application/json");
        let doc = body(&res);
        assert_eq!(doc["error"], problem.message());
        assert_eq!(doc["type"], "https://slotgate.dev/problems/model-not-found");
        assert_eq!(doc["request_id"], "req-2");
    }

    #[test]
    fn openai_is_the_default_document() {
        let problem = Problem::unauthorized();
        assert_eq!(
            problem.to_json_bytes_in(Dialect::OpenAi),
            problem.to_json_bytes()
        );
    }

    #[test]
    fn every_kind_has_an_anthropic_type_of_the_right_family() {
        let known = [
            "invalid_request_error",
            "authentication_error",
            "permission_error",
            "not_found_error",
            "request_too_large",
            "overloaded_error",
            "timeout_error",
            "api_error",
        ];
        for kind in Kind::ALL {
            let t = kind.anthropic_type();
            assert!(known.contains(&t), "{kind:?}: {t}");
            if kind.status() == 503 {
                assert_eq!(t, "overloaded_error", "{kind:?}");
            }
            if kind.status().is_client_error() {
                assert!(
                    !["overloaded_error", "api_error", "timeout_error"].contains(&t),
                    "{kind:?}"
                );
            }
        }
    }

    #[test]
    fn an_anthropic_stream_ends_with_a_named_error_event() {
        let problem = Problem::upstream_stalled("gpu", "m", "no frame for 30s")
            .with_extension("request_id", "req-3");
        let event = problem.stream_ending(Dialect::Anthropic, Framing::Sse);
        let text = std::str::from_utf8(&event).unwrap();
        let data = text
            .strip_prefix("event: error\ndata: ")
            .and_then(|rest| rest.strip_suffix("\n\n"))
            .unwrap();
        let data: Value = serde_json::from_str(data).unwrap();
        assert_eq!(data["type"], "error");
        assert_eq!(data["error"]["type"], "timeout_error");
        assert_eq!(data["error"]["code"], "upstream_stalled");
        assert_eq!(data["request_id"], "req-3");
        assert_eq!(
            data["problem"]["type"],
            "https://slotgate.dev/problems/upstream-stalled"
        );
        assert!(data["problem"].get("error").is_none());
    }

    #[test]
    fn openai_and_ollama_stream_endings_carry_the_document() {
        let problem = Problem::stream_timeout("gpu", "m", Duration::from_secs(5));
        let sse = problem.stream_ending(Dialect::OpenAi, Framing::Sse);
        assert!(sse.starts_with(b"data: {") && sse.ends_with(b"}\n\n"));
        let doc: Value = serde_json::from_slice(&sse[6..sse.len() - 2]).unwrap();
        assert_eq!(doc["error"]["code"], "stream_timeout");

        let line = problem.stream_ending(Dialect::Ollama, Framing::Ndjson);
        assert!(line.ends_with(b"\n") && !line[..line.len() - 1].contains(&b'\n'));
        let doc: Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(doc["error"], problem.message());
    }
}
