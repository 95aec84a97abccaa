//! The wire formats past OpenAI's chat, completions and embeddings (`openai.rs`): each module
//! builds one API's answer bodies and stream events from the same [`Answer`](crate::openai::Answer), so every route
//! shares the request path (slot, pacing, injected failures) and differs only in its shapes.
//!
//! - [`responses`]: OpenAI Responses (`/v1/responses`), SSE with `event:` names;
//! - [`anthropic`]: Anthropic Messages (`/v1/messages`), SSE with `event:` names;
//! - [`ollama`]: Ollama's native API (`/api/chat`, `/api/generate`, `/api/embed`,
//!   `/api/embeddings`), NDJSON;
//! - [`llama`]: llama-server's native API (`/completion`, `/infill`, `/embedding`, and the
//!   slot-free `/tokenize`, `/detokenize`, `/apply-template`);
//! - [`rerank`]: llama-server's and vLLM's rerank and vLLM's score;
//! - [`media`]: audio transcription and translation, speech, image generation.
//!
//! The shapes and their sources are in `docs/PROTOCOLS.md`.

pub(crate) mod anthropic;
pub(crate) mod llama;
pub(crate) mod media;
pub(crate) mod ollama;
pub(crate) mod rerank;
pub(crate) mod responses;

use bytes::Bytes;
use serde_json::Value;

pub(crate) use crate::sse::Step;

/// An SSE event with a name: `event: <name>\ndata: <json>\n\n`.
pub(crate) fn named_event(name: &str, value: &Value) -> Bytes {
    let mut out = format!("event: {name}\ndata: ").into_bytes();
    serde_json::to_writer(&mut out, value).expect("a Value always serialises");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// One NDJSON line.
pub(crate) fn ndjson_line(value: &Value) -> Bytes {
    let mut out = serde_json::to_vec(value).expect("a Value always serialises");
    out.push(b'\n');
    Bytes::from(out)
}

/// A small deterministic vector for embeddings and fake scores.
pub(crate) fn vector(seed: usize, dims: usize) -> Vec<f64> {
    #[allow(clippy::cast_precision_loss)] // small indices; the values are arbitrary
    (0..dims)
        .map(|d| ((seed + d) as f64 * 0.125).sin())
        .collect()
}
