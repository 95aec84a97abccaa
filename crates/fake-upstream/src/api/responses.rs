//! OpenAI Responses (`POST /v1/responses`): the response object, and the SSE sequence
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, one `response.output_text.delta` per token,
//! `response.output_text.done`, `response.content_part.done`, `response.output_item.done`,
//! `response.completed` (or `response.incomplete` when `max_output_tokens` cut it). Each event
//! is `event: <type>` plus `data: <json>` carrying the same `type` and a `sequence_number`;
//! there is no `[DONE]` (vLLM `_convert_stream_to_sse_events`; OpenAI's API reference).

use serde_json::{Value, json};

use crate::api::{Step, named_event};
use crate::config::Kind;
use crate::openai::Answer;

/// The id of the one output message of a response.
fn message_id(answer: &Answer<'_>) -> String {
    format!("msg_{}", answer.id.trim_start_matches("resp_"))
}

fn usage(answer: &Answer<'_>) -> Value {
    let input = answer.prompt_tokens();
    let output = answer.completion_tokens();
    // Ollama reports no cached count (its input is only the uncached part).
    let cached = match answer.kind {
        Kind::Ollama => 0,
        Kind::LlamaServer | Kind::Vllm => answer.cached_tokens(),
    };
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": u64::from(input) + u64::from(output),
    })
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

fn message(answer: &Answer<'_>, status: &str, content: &[Value]) -> Value {
    json!({
        "id": message_id(answer),
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

/// Whether `max_output_tokens` cut the answer short.
fn incomplete(answer: &Answer<'_>) -> bool {
    answer.plan.finish_reason == "length"
}

/// The response object in a given state; `done` adds the output and the usage.
pub(crate) fn object(answer: &Answer<'_>, previous: Option<&str>, done: bool) -> Value {
    let (status, output, usage, details) = if done {
        let status = if incomplete(answer) {
            "incomplete"
        } else {
            "completed"
        };
        let details = incomplete(answer).then(|| json!({"reason": "max_output_tokens"}));
        let output = vec![message(answer, status, &[text_part(&answer.text())])];
        (status, output, usage(answer), details)
    } else {
        ("in_progress", Vec::new(), Value::Null, None)
    };
    json!({
        "id": answer.id,
        "object": "response",
        "created_at": answer.created,
        "status": status,
        "background": false,
        "error": null,
        "incomplete_details": details,
        "instructions": null,
        "max_output_tokens": null,
        "model": answer.model,
        "output": output,
        "parallel_tool_calls": true,
        "previous_response_id": previous,
        "reasoning": {"effort": null, "summary": null},
        "store": true,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": null,
        "metadata": {},
    })
}

/// The stream of a response, event by event.
pub(crate) fn stream(answer: &Answer<'_>, previous: Option<&str>) -> Vec<Step> {
    let mut sequence = 0_u64;
    let mut event = |name: &str, mut data: Value| {
        data["type"] = json!(name);
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        named_event(name, &data)
    };
    let item_id = message_id(answer);
    let at = |extra: Value| {
        let mut data = json!({"item_id": item_id, "output_index": 0, "content_index": 0});
        if let (Some(data), Value::Object(extra)) = (data.as_object_mut(), extra) {
            data.extend(extra);
        }
        data
    };
    let started = object(answer, previous, false);
    let mut steps = vec![
        Step::at_once(event("response.created", json!({"response": started}))),
        Step::at_once(event("response.in_progress", json!({"response": started}))),
        Step::at_once(event(
            "response.output_item.added",
            json!({"output_index": 0, "item": message(answer, "in_progress", &[])}),
        )),
        Step::at_once(event(
            "response.content_part.added",
            at(json!({"part": text_part("")})),
        )),
    ];
    for i in 0..answer.plan.tokens {
        let delta = at(json!({"delta": crate::openai::token_text(i), "logprobs": []}));
        steps.push(Step::token(event("response.output_text.delta", delta)));
    }
    let text = answer.text();
    let done = object(answer, previous, true);
    let status = done["status"].as_str().unwrap_or("completed").to_owned();
    steps.extend([
        Step::at_once(event(
            "response.output_text.done",
            at(json!({"text": text, "logprobs": []})),
        )),
        Step::at_once(event(
            "response.content_part.done",
            at(json!({"part": text_part(&text)})),
        )),
        Step::at_once(event(
            "response.output_item.done",
            json!({"output_index": 0, "item": done["output"][0]}),
        )),
    ]);
    let mut last = json!({"response": done});
    // llama-server adds its timings to the last event.
    if let Some(timings) = answer.timings() {
        last["timings"] = timings;
    }
    steps.push(Step::at_once(event(&format!("response.{status}"), last)));
    steps
}

/// The `error` event a failed stream ends with, numbered `sequence` (OpenAI's
/// `ResponseErrorEvent`: `type`, `code`, `message`, `param`, `sequence_number`; PROTOCOLS.md §8).
pub(crate) fn stream_error(message: &str, sequence: u64) -> Vec<bytes::Bytes> {
    vec![named_event(
        "error",
        &json!({
            "type": "error",
            "code": "server_error",
            "message": message,
            "param": null,
            "sequence_number": sequence,
        }),
    )]
}

/// The input items of a request (`GET /v1/responses/{id}/input_items`): a string input is one
/// user message; an array is kept as sent, each item given an id if it has none.
pub(crate) fn input_items(response_id: &str, input: Option<&Value>) -> Value {
    let items: Vec<Value> = match input {
        Some(Value::String(text)) => vec![json!({
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": text}],
        })],
        Some(Value::Array(items)) => items.clone(),
        _ => Vec::new(),
    };
    let data: Vec<Value> = items
        .into_iter()
        .enumerate()
        .map(|(i, mut item)| {
            if item.get("id").is_none() && item.is_object() {
                item["id"] = json!(format!(
                    "msg_{}_in{i}",
                    response_id.trim_start_matches("resp_")
                ));
            }
            item
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "first_id": data.first().and_then(|d| d.get("id")).cloned(),
        "last_id": data.last().and_then(|d| d.get("id")).cloned(),
        "has_more": false,
    })
}
