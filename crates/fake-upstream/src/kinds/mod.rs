//! What differs between the servers: error envelopes (per kind, and per API where an API has
//! its own: Anthropic's, Ollama's native), how an error travels inside a stream, and each kind's
//! own endpoints (probes, listings, residency, metrics, the slot-free helpers such as
//! `/tokenize`, and the stored Responses). Inference itself is shared (`app.rs`, which sits
//! above this module).

pub(crate) mod llama;
pub(crate) mod ollama;
pub(crate) mod vllm;

use bytes::Bytes;
use http::{Method, Request, Response};
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::api::{anthropic, ollama as ollama_api, responses};
use crate::body::ResponseBody;
use crate::config::Kind;
use crate::observer::Outcome;
use crate::openai::{self, Endpoint};
use crate::reply::{json_response, read_json};
use crate::sse;
use crate::state::App;

type Reply = (Response<ResponseBody>, Outcome);

/// A kind's own endpoints: probes, listings, residency, metrics, the slot-free helpers, the
/// stored Responses, and its 404.
pub(crate) async fn route(app: &App, req: Request<Incoming>) -> Reply {
    let path = req.uri().path().to_owned();
    if app.config.responses_store
        && let Some(rest) = path.strip_prefix("/v1/responses/")
    {
        let method = req.method().clone();
        return stored_response(app, &method, rest);
    }
    if req.method() == Method::POST
        && path == "/v1/messages/count_tokens"
        && app.kind() != Kind::Ollama
    {
        let body = read_json(req).await;
        let words = openai::words(&body["messages"]) + openai::words(&body["system"]);
        let tokens = u32::try_from(words).unwrap_or(u32::MAX).max(1);
        return (
            json_response(200, &anthropic::count_tokens(tokens)),
            Outcome::Completed,
        );
    }
    match app.kind() {
        Kind::LlamaServer => llama::route(app, req).await,
        Kind::Vllm => vllm::route(app, req).await,
        Kind::Ollama => ollama::route(app, req).await,
    }
}

/// `GET /v1/responses/{id}`, `DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`,
/// `GET /v1/responses/{id}/input_items`, answered from this instance's memory only.
fn stored_response(app: &App, method: &Method, rest: &str) -> Reply {
    let (id, action) = rest.split_once('/').unwrap_or((rest, ""));
    let unknown = || {
        let message = format!("Response with id '{id}' not found.");
        let body = error_json(app.kind(), 404, &message, Some("response_id"));
        (json_response(404, &body), Outcome::Rejected(404))
    };
    let done = |body: Value| (json_response(200, &body), Outcome::Completed);
    match (method, action) {
        (&Method::GET, "") => app
            .responses
            .get(id)
            .map_or_else(unknown, |stored| done(stored.object)),
        (&Method::DELETE, "") => {
            if app.responses.remove(id) {
                done(json!({"id": id, "object": "response", "deleted": true}))
            } else {
                unknown()
            }
        }
        (&Method::POST, "cancel") => app.responses.cancel(id).map_or_else(unknown, done),
        (&Method::GET, "input_items") => app.responses.get(id).map_or_else(unknown, |stored| {
            done(responses::input_items(id, stored.input.as_ref()))
        }),
        _ => not_found(app.kind()),
    }
}

/// The kind's answer to a route it does not serve.
pub(crate) fn not_found(kind: Kind) -> Reply {
    match kind {
        Kind::LlamaServer => llama::not_found(),
        Kind::Vllm => vllm::not_found(),
        Kind::Ollama => ollama::not_found(),
    }
}

/// The error body a route answers in: Anthropic's envelope on `/v1/messages`, Ollama's native
/// `{"error"}` on `/api/*`, the kind's OpenAI-compatible envelope elsewhere.
pub(crate) fn error_for(
    kind: Kind,
    endpoint: Endpoint,
    status: u16,
    message: &str,
    param: Option<&str>,
) -> Value {
    match endpoint {
        Endpoint::Messages => anthropic::error_json(status, message),
        _ if endpoint.is_ollama_native() => ollama_api::error_json(message),
        _ => error_json(kind, status, message, param),
    }
}

/// The events a failed stream ends with, in the route's own shape (and the kind's, for the
/// OpenAI-compatible routes: see [`stream_error`]). `sequence` is the error event's
/// `sequence_number` on a Responses stream.
pub(crate) fn stream_error_events(
    kind: Kind,
    endpoint: Endpoint,
    status: u16,
    message: &str,
    sequence: u64,
) -> Vec<Bytes> {
    match endpoint {
        Endpoint::Responses => responses::stream_error(message, sequence),
        Endpoint::Messages => anthropic::stream_error(status, message),
        Endpoint::OllamaChat | Endpoint::OllamaGenerate => ollama_api::stream_error(message),
        _ => {
            let (error, then_done) = stream_error(kind, status, message);
            let mut events = vec![sse::event(&error)];
            if then_done {
                events.push(Bytes::from_static(sse::DONE));
            }
            events
        }
    }
}

/// The kind's error envelope for an OpenAI-compatible path.
pub(crate) fn error_json(kind: Kind, status: u16, message: &str, param: Option<&str>) -> Value {
    match kind {
        Kind::LlamaServer => llama::error_json(status, message, None),
        Kind::Vllm => vllm::error_json(status, message, param),
        Kind::Ollama => ollama::error_json(status, message),
    }
}

/// The message of an injected `status-<code>` answer: a kind's own words where the engine has
/// them for that status (llama-server's 503 is its "Loading model"; Ollama's is its queue-full
/// "server busy"), a plain note otherwise. Engines do not answer 502 or 504 themselves (a proxy
/// in front of them does); the fake still uses the kind's envelope for them.
pub(crate) fn injected_status_message(kind: Kind, status: u16) -> String {
    match (kind, status) {
        (Kind::LlamaServer, 503) => "Loading model".to_owned(),
        (Kind::Ollama, 503) => ollama::SERVER_BUSY.to_owned(),
        _ => format!("injected failure: status {status}"),
    }
}

/// The error event a kind sends inside a stream, and whether `[DONE]` still follows it.
///
/// llama-server ends the stream right after the error (no `[DONE]`); vLLM sends `[DONE]` after
/// it (PROTOCOLS.md §1, §2). Ollama's mid-stream behaviour is not documented there: the fake
/// sends its `/v1` envelope and ends, like llama-server.
pub(crate) fn stream_error(kind: Kind, status: u16, message: &str) -> (Value, bool) {
    (error_json(kind, status, message, None), kind == Kind::Vllm)
}
