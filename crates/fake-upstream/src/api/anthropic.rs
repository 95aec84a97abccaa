//! Anthropic Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`): the message
//! object, and the SSE sequence `message_start`, `content_block_start`, one
//! `content_block_delta` per token, `content_block_stop`, `message_delta` (with `stop_reason`
//! and the output usage), `message_stop` (Anthropic's streaming reference, which llama-server,
//! vLLM and Ollama follow).

use serde_json::{Value, json};

use crate::api::{Step, named_event};
use crate::config::Kind;
use crate::openai::Answer;

fn stop_reason(answer: &Answer<'_>) -> &'static str {
    if answer.plan.finish_reason == "length" {
        "max_tokens"
    } else {
        "end_turn"
    }
}

fn message(answer: &Answer<'_>, content: &Value, stop: Option<&str>, output: u32) -> Value {
    json!({
        "id": answer.id,
        "type": "message",
        "role": "assistant",
        "model": answer.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": usage(answer, output),
    })
}

/// The usage object: llama-server splits the input into the cached part
/// (`cache_read_input_tokens`) and the rest (`input_tokens`).
fn usage(answer: &Answer<'_>, output: u32) -> Value {
    if answer.kind == Kind::LlamaServer {
        return json!({
            "cache_read_input_tokens": answer.cached_tokens(),
            "input_tokens": answer.plan.processed_tokens(),
            "output_tokens": output,
        });
    }
    json!({"input_tokens": answer.prompt_tokens(), "output_tokens": output})
}

/// The non-streaming answer.
pub(crate) fn full(answer: &Answer<'_>) -> Value {
    message(
        answer,
        &json!([{"type": "text", "text": answer.text()}]),
        Some(stop_reason(answer)),
        answer.completion_tokens(),
    )
}

/// The streamed answer.
pub(crate) fn stream(answer: &Answer<'_>) -> Vec<Step> {
    let mut steps = vec![
        Step::at_once(named_event(
            "message_start",
            &json!({"type": "message_start", "message": message(answer, &json!([]), None, 0)}),
        )),
        Step::at_once(named_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "text", "text": ""}}),
        )),
    ];
    for i in 0..answer.plan.tokens {
        steps.push(Step::token(named_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0,
                    "delta": {"type": "text_delta", "text": crate::openai::token_text(i)}}),
        )));
    }
    steps.extend([
        Step::at_once(named_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        )),
        Step::at_once(named_event(
            "message_delta",
            &json!({"type": "message_delta",
                    "delta": {"stop_reason": stop_reason(answer), "stop_sequence": null},
                    "usage": {"output_tokens": answer.completion_tokens()}}),
        )),
        Step::at_once(named_event(
            "message_stop",
            &json!({"type": "message_stop"}),
        )),
    ]);
    steps
}

/// Anthropic's error body (also its in-stream `error` event's data).
pub(crate) fn error_json(status: u16, message: &str) -> Value {
    let error_type = match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        _ => "api_error",
    };
    json!({"type": "error", "error": {"type": error_type, "message": message}})
}

/// The `error` event a failed stream ends with.
pub(crate) fn stream_error(status: u16, message: &str) -> Vec<bytes::Bytes> {
    vec![named_event("error", &error_json(status, message))]
}

/// `count_tokens`: `{"input_tokens": N}`.
pub(crate) fn count_tokens(input_tokens: u32) -> Value {
    json!({"input_tokens": input_tokens})
}
