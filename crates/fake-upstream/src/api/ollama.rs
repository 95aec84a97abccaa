//! Ollama's native API (ollama `api/types.go`, `server/routes.go`): `/api/chat` and
//! `/api/generate` answer one JSON object, or NDJSON (`application/x-ndjson`) when streaming,
//! which is their default; the last line has `done: true`, `done_reason` and the timings.
//! `/api/embed` answers `embeddings` (one per input), the older `/api/embeddings` one
//! `embedding`. Errors are `{"error": "..."}`, in a stream too.

use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::api::{Step, ndjson_line, vector};
use crate::openai::{Answer, token_text};

/// The native endpoints that generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Generation {
    /// `/api/chat`: `message.content`.
    Chat,
    /// `/api/generate`: `response`.
    Generate,
}

fn created_at() -> String {
    humantime::format_rfc3339_nanos(SystemTime::now()).to_string()
}

fn piece(kind: Generation, text: &str) -> (&'static str, Value) {
    match kind {
        Generation::Chat => ("message", json!({"role": "assistant", "content": text})),
        Generation::Generate => ("response", json!(text)),
    }
}

/// The last object: `done`, why, and the counts and timings (nanoseconds).
fn done(answer: &Answer<'_>, kind: Generation, text: &str) -> Value {
    let (field, value) = piece(kind, text);
    let generation = answer.plan.interval * answer.plan.tokens;
    let nanos = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    let mut object = json!({
        "model": answer.model,
        "created_at": created_at(),
        field: value,
        "done": true,
        "done_reason": if answer.plan.finish_reason == "length" { "length" } else { "stop" },
        "total_duration": nanos(generation) + 1_000_000,
        "load_duration": 1_000_000,
        // Only what it evaluated: the cached part of the prompt is not counted.
        "prompt_eval_count": answer.prompt_tokens(),
        "prompt_eval_duration": nanos(answer.plan.prefill).max(1_000_000),
        "eval_count": answer.plan.tokens,
        "eval_duration": nanos(generation),
    });
    if kind == Generation::Generate {
        object["context"] = json!([1, 2, 3]);
    }
    object
}

/// The non-streaming answer.
pub(crate) fn full(answer: &Answer<'_>, kind: Generation) -> Value {
    done(answer, kind, &answer.text())
}

/// The NDJSON stream: one line per token, then the `done` line.
pub(crate) fn stream(answer: &Answer<'_>, kind: Generation) -> Vec<Step> {
    let mut steps: Vec<Step> = (0..answer.plan.tokens)
        .map(|i| {
            let (field, value) = piece(kind, &token_text(i));
            Step::token(ndjson_line(&json!({
                "model": answer.model,
                "created_at": created_at(),
                field: value,
                "done": false,
            })))
        })
        .collect();
    steps.push(Step::at_once(ndjson_line(&done(answer, kind, ""))));
    steps
}

/// `/api/embed`: one embedding per input.
pub(crate) fn embed(model: &str, inputs: usize, prompt_tokens: u32) -> Value {
    let embeddings: Vec<Vec<f64>> = (0..inputs).map(|i| vector(i, 8)).collect();
    json!({
        "model": model,
        "embeddings": embeddings,
        "total_duration": 1_000_000,
        "load_duration": 0,
        "prompt_eval_count": prompt_tokens,
    })
}

/// `/api/embeddings` (the older endpoint): one `embedding`.
pub(crate) fn embeddings() -> Value {
    json!({"embedding": vector(0, 8)})
}

/// The native error body.
pub(crate) fn error_json(message: &str) -> Value {
    json!({"error": message})
}

/// The error line a failed stream ends with.
pub(crate) fn stream_error(message: &str) -> Vec<bytes::Bytes> {
    vec![ndjson_line(&error_json(message))]
}
