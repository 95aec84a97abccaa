//! llama-server's native API (`tools/server/README.md`, `server-task.cpp`): `/completion` and
//! `/infill` answer `{content, stop, tokens_predicted, ...}`, streamed as `data: {...}` events
//! with `stop: false` and a last one with `stop: true` and the totals, and no `[DONE]`;
//! `/embedding` answers `[{index, embedding: [[...]]}]`; `/tokenize`, `/detokenize` and
//! `/apply-template` take no slot.

use std::fmt::Write as _;

use serde_json::{Value, json};

use crate::api::{Step, vector};
use crate::openai::{Answer, token_text};
use crate::sse;

fn last(answer: &Answer<'_>, content: &str, prompt: &Value) -> Value {
    let limited = answer.plan.finish_reason == "length";
    json!({
        "index": 0,
        "content": content,
        "tokens": [],
        "id_slot": 0,
        "stop": true,
        "model": answer.model,
        "tokens_predicted": answer.plan.tokens,
        "tokens_evaluated": answer.plan.prompt_tokens,
        "generation_settings": {"n_predict": -1, "temperature": 0.8, "top_k": 40, "top_p": 0.95},
        "prompt": prompt,
        "has_new_line": false,
        "truncated": false,
        "stop_type": if limited { "limit" } else { "eos" },
        "stopping_word": "",
        "tokens_cached": answer.plan.prompt_tokens,
        "timings": answer.timings(),
    })
}

/// `/completion`, `/infill` without streaming.
pub(crate) fn full(answer: &Answer<'_>, prompt: &Value) -> Value {
    last(answer, &answer.text(), prompt)
}

/// `/completion`, `/infill` streamed.
pub(crate) fn stream(answer: &Answer<'_>, prompt: &Value) -> Vec<Step> {
    let mut steps: Vec<Step> = (0..answer.plan.tokens)
        .map(|i| {
            Step::token(sse::event(&json!({
                "index": 0,
                "content": token_text(i),
                "tokens": [],
                "stop": false,
                "id_slot": -1,
                "tokens_predicted": i + 1,
                "tokens_evaluated": answer.plan.prompt_tokens,
            })))
        })
        .collect();
    steps.push(Step::at_once(sse::event(&last(answer, "", prompt))));
    steps
}

/// `/embedding`: one entry per input, each the (pooled) vector wrapped in an array.
pub(crate) fn embedding(inputs: usize) -> Value {
    let entries: Vec<Value> = (0..inputs)
        .map(|index| json!({"index": index, "embedding": [vector(index, 8)]}))
        .collect();
    Value::Array(entries)
}

/// `/tokenize`: one token id per word (`with_pieces` adds the text).
pub(crate) fn tokenize(content: &str, with_pieces: bool) -> Value {
    let tokens: Vec<Value> = content
        .split_whitespace()
        .enumerate()
        .map(|(i, word)| {
            let id = 1000 + i;
            if with_pieces {
                json!({"id": id, "piece": word})
            } else {
                json!(id)
            }
        })
        .collect();
    json!({"tokens": tokens})
}

/// `/detokenize`: the fake's tokens back as text.
pub(crate) fn detokenize(tokens: &[Value]) -> Value {
    let words: Vec<String> = tokens.iter().map(|t| format!("t{t}")).collect();
    json!({"content": words.join(" ")})
}

/// `/apply-template`: the messages rendered with a ChatML-like template.
pub(crate) fn apply_template(messages: &[Value]) -> Value {
    let mut prompt = String::new();
    for message in messages {
        let role = message["role"].as_str().unwrap_or("user");
        let content = match &message["content"] {
            Value::String(text) => text.clone(),
            other => other.to_string(),
        };
        // Writing to a String cannot fail.
        let _ = write!(prompt, "<|im_start|>{role}\n{content}<|im_end|>\n");
    }
    prompt.push_str("<|im_start|>assistant\n");
    json!({"prompt": prompt})
}
