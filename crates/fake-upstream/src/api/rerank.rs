//! Rerank and score. llama-server (`/rerank`, `/reranking`, `/v1/rerank`, `/v1/reranking`)
//! answers `{model, object: "list", usage, results: [{index, relevance_score}]}`; vLLM
//! (`/rerank`, `/v1/rerank`, `/v2/rerank`) answers `{id, model, usage, results: [{index,
//! document: {text}, relevance_score}]}`; vLLM's `/score` and `/v1/score` answer `{id, object:
//! "list", created, model, data: [{index, object: "score", score}], usage}`. Results are sorted
//! by score, best first, and cut to `top_n`.

use serde_json::{Value, json};

use crate::config::Kind;

/// A fake relevance score for document `index`: decreasing, so the order is predictable.
fn score(index: usize) -> f64 {
    #[allow(clippy::cast_precision_loss)] // small indices
    let index = index as f64;
    1.0 / (1.0 + index)
}

/// The text of a document (a string, or `{"text": ...}`).
fn text(document: &Value) -> Value {
    match document {
        Value::String(_) => document.clone(),
        other => other.get("text").cloned().unwrap_or(Value::Null),
    }
}

/// A rerank answer in the kind's shape.
pub(crate) fn rerank(
    kind: Kind,
    id: &str,
    model: &str,
    documents: &[Value],
    top_n: Option<usize>,
    prompt_tokens: u32,
) -> Value {
    let n = top_n.unwrap_or(documents.len()).min(documents.len());
    let results: Vec<Value> = (0..n)
        .map(|index| match kind {
            Kind::Vllm => json!({
                "index": index,
                "document": {"text": text(&documents[index])},
                "relevance_score": score(index),
            }),
            _ => json!({"index": index, "relevance_score": score(index)}),
        })
        .collect();
    match kind {
        Kind::Vllm => json!({
            "id": id,
            "model": model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            "results": results,
        }),
        _ => json!({
            "model": model,
            "object": "list",
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
            "results": results,
        }),
    }
}

/// vLLM's score answer: one score per pair.
pub(crate) fn score_answer(
    id: &str,
    created: u64,
    model: &str,
    pairs: usize,
    prompt_tokens: u32,
) -> Value {
    let data: Vec<Value> = (0..pairs)
        .map(|index| json!({"index": index, "object": "score", "score": score(index)}))
        .collect();
    json!({
        "id": id,
        "object": "list",
        "created": created,
        "model": model,
        "data": data,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens,
                  "completion_tokens": 0, "prompt_tokens_details": null},
    })
}
