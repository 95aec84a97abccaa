//! What differs between the servers: error envelopes, how an error travels inside a stream, and
//! each kind's own endpoints (probes, listings, residency, metrics). Inference itself is shared
//! (`app.rs`, which sits above this module).

pub(crate) mod llama;
pub(crate) mod ollama;
pub(crate) mod vllm;

use http::{Request, Response};
use hyper::body::Incoming;
use serde_json::Value;

use crate::body::ResponseBody;
use crate::config::Kind;
use crate::observer::Outcome;
use crate::state::App;

/// A kind's own endpoints: probes, listings, residency, metrics, and its 404.
pub(crate) async fn route(app: &App, req: Request<Incoming>) -> (Response<ResponseBody>, Outcome) {
    match app.kind() {
        Kind::LlamaServer => llama::route(app, req).await,
        Kind::Vllm => vllm::route(app, &req),
        Kind::Ollama => ollama::route(app, &req),
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
