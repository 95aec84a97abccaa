//! What differs between the servers: error envelopes, how an error travels inside a stream, and
//! each kind's own endpoints (probes, listings, residency, metrics). Inference itself is shared
//! (`app.rs`).

pub(crate) mod llama;
pub(crate) mod ollama;
pub(crate) mod vllm;

use serde_json::Value;

use crate::config::Kind;

/// The kind's error envelope for an OpenAI-compatible path.
pub(crate) fn error_json(kind: Kind, status: u16, message: &str, param: Option<&str>) -> Value {
    match kind {
        Kind::LlamaServer => llama::error_json(status, message, None),
        Kind::Vllm => vllm::error_json(status, message, param),
        Kind::Ollama => ollama::error_json(status, message),
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

/// A stable fake digest for a model name.
pub(crate) fn digest(name: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut hasher);
    format!("{:016x}", hasher.finish()).repeat(4)
}
