//! The OpenAI wire format (PROTOCOLS.md §4): reading the few request fields the fake needs, and
//! building the response bodies and stream chunks. Generated text is `tok0 tok1 tok2 ...`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::cache;
use crate::config::Kind;
use crate::control::Plan;
pub(crate) use crate::route::Endpoint;
use crate::sse::{self, Step};

/// The request fields the fake looks at. Everything else is accepted and ignored.
#[derive(Clone, Debug, Default, Deserialize)]
pub(crate) struct InferenceRequest {
    #[serde(default)]
    pub(crate) model: Option<String>,
    #[serde(default)]
    pub(crate) stream: Option<bool>,
    #[serde(default)]
    pub(crate) stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub(crate) max_tokens: Option<i64>,
    #[serde(default)]
    pub(crate) max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub(crate) messages: Option<Value>,
    #[serde(default)]
    pub(crate) prompt: Option<Value>,
    #[serde(default)]
    pub(crate) input: Option<Value>,
    /// Choices to generate: each runs as its own sequence in its own slot.
    #[serde(default)]
    pub(crate) n: Option<u32>,
    /// Completions: candidates generated server-side, of which `n` are returned.
    #[serde(default)]
    pub(crate) best_of: Option<u32>,
    /// Responses: the limit on output tokens.
    #[serde(default)]
    pub(crate) max_output_tokens: Option<i64>,
    /// Responses: the answer this one continues.
    #[serde(default)]
    pub(crate) previous_response_id: Option<String>,
    /// llama-server native: the completion limit (-1: none).
    #[serde(default)]
    pub(crate) n_predict: Option<i64>,
    /// Ollama native: `options.num_predict` is its completion limit.
    #[serde(default)]
    pub(crate) options: Option<Value>,
    /// llama-server `/infill`: the text before the cursor.
    #[serde(default)]
    pub(crate) input_prefix: Option<Value>,
    /// llama-server `/embedding`, `/tokenize`: the text.
    #[serde(default)]
    pub(crate) content: Option<Value>,
    /// Rerank: the query.
    #[serde(default)]
    pub(crate) query: Option<Value>,
    /// Rerank: the documents.
    #[serde(default)]
    pub(crate) documents: Option<Value>,
    /// Rerank: how many results to return.
    #[serde(default)]
    pub(crate) top_n: Option<usize>,
    /// vLLM score: the first text(s).
    #[serde(default)]
    pub(crate) text_1: Option<Value>,
    /// vLLM score: the second text(s).
    #[serde(default)]
    pub(crate) text_2: Option<Value>,
    /// Audio (a form field) and others: how to answer (`json`, `text`, ...).
    #[serde(default)]
    pub(crate) response_format: Option<Value>,
    /// Audio: the uploaded file's size, from the form (never in JSON).
    #[serde(skip)]
    pub(crate) file_len: Option<usize>,
}

/// `stream_options`.
#[derive(Clone, Copy, Debug, Default, Deserialize)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: Option<bool>,
}

impl InferenceRequest {
    pub(crate) fn is_stream(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    /// The request built from an audio form's fields.
    pub(crate) fn from_form(
        fields: &std::collections::BTreeMap<String, String>,
        file_len: Option<usize>,
    ) -> Self {
        Self {
            model: fields.get("model").cloned(),
            prompt: fields.get("prompt").map(|p| Value::from(p.as_str())),
            response_format: fields
                .get("response_format")
                .map(|f| Value::from(f.as_str())),
            file_len,
            ..Self::default()
        }
    }

    pub(crate) fn include_usage(&self) -> bool {
        self.is_stream()
            && self
                .stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false)
    }

    /// The client's completion limit; `max_completion_tokens` supersedes the deprecated
    /// `max_tokens`, and a negative value (llama-server's "no limit") means none.
    pub(crate) fn max_tokens(&self) -> Option<u32> {
        let num_predict = self
            .options
            .as_ref()
            .and_then(|o| o.get("num_predict"))
            .and_then(Value::as_i64);
        self.max_completion_tokens
            .or(self.max_tokens)
            .or(self.max_output_tokens)
            .or(self.n_predict)
            .or(num_predict)
            .and_then(|n| u32::try_from(n).ok())
    }

    /// The sequences the request runs on an engine that honours `n`: `n` for chat, the larger
    /// of `n` and `best_of` for completions, 1 for everything else.
    pub(crate) fn sequences(&self, endpoint: Endpoint) -> u32 {
        let n = self.n.unwrap_or(1).max(1);
        match endpoint {
            Endpoint::Chat => n,
            Endpoint::Completions => n.max(self.best_of.unwrap_or(1)),
            _ => 1,
        }
    }

    /// The body of the endpoint's required field, if present.
    pub(crate) fn required(&self, endpoint: Endpoint) -> Option<&Value> {
        match endpoint.required_field() {
            "messages" => self.messages.as_ref(),
            "prompt" => self.prompt.as_ref(),
            "input" => self.input.as_ref(),
            "input_prefix" => self.input_prefix.as_ref(),
            "content" => self.content.as_ref(),
            "documents" => self.documents.as_ref(),
            "text_1" => self.text_1.as_ref(),
            "file" => self.file_len.map(|_| &Value::Bool(true)),
            _ => None,
        }
        .filter(|v| !v.is_null())
    }

    /// A rough prompt size: the words of every string in the prompt, at least 1.
    pub(crate) fn count_prompt_tokens(&self, endpoint: Endpoint) -> u32 {
        // A rerank's query is part of every pair the engine scores.
        let n = self.required(endpoint).map_or(0, words) + self.query.as_ref().map_or(0, words);
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    }

    /// The prompt as the prompt cache sees it: one token per word of what
    /// [`count_prompt_tokens`](Self::count_prompt_tokens) counts, each message's first word
    /// hashed with its role. Empty on routes whose engines cache nothing (embeddings, rerank,
    /// audio, ...).
    pub(crate) fn prompt_sequence(&self, endpoint: Endpoint) -> Vec<u64> {
        let mut out = Vec::new();
        if endpoint.caches_prompt()
            && let Some(prompt) = self.required(endpoint)
        {
            // A Responses `input` string is one user message, as its next turn resends it.
            let role = (endpoint == Endpoint::Responses).then_some("user");
            push_sequence(&mut out, prompt, role);
        }
        out
    }

    /// How many inputs an embeddings request has (`input`, or `content` for llama-server's
    /// `/embedding`).
    pub(crate) fn embedding_inputs(&self) -> usize {
        match self.input.as_ref().or(self.content.as_ref()) {
            Some(Value::Array(items)) if items.iter().all(Value::is_string) => items.len(),
            // A token array (`[1, 2, 3]`) or array of token arrays is one input per inner array.
            Some(Value::Array(items)) if items.iter().all(Value::is_array) => items.len(),
            _ => 1,
        }
    }
}

/// The text of token `i`: `tok0`, ` tok1`, ` tok2`, ... so they join to `tok0 tok1 tok2`.
pub(crate) fn token_text(i: u32) -> String {
    if i == 0 {
        "tok0".to_owned()
    } else {
        format!(" tok{i}")
    }
}

/// The fake's token count of a prompt: the words of every string in it (message `content`s and
/// `text` parts included).
pub(crate) fn words(v: &Value) -> usize {
    match v {
        Value::String(s) => s.split_whitespace().count(),
        Value::Array(items) => items.iter().map(words).sum(),
        Value::Object(map) => map
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "content" | "text"))
            .map(|(_, v)| words(v))
            .sum(),
        _ => 0,
    }
}

/// Appends the tokens of a prompt value, walking it as [`words`] does; the first word of a
/// message (an object with a `role`) is hashed with its role.
fn push_sequence(out: &mut Vec<u64>, value: &Value, role: Option<&str>) {
    // Each part passes the role on until one of them has a word.
    fn push(out: &mut Vec<u64>, value: &Value, role: &mut Option<&str>) {
        let before = out.len();
        push_sequence(out, value, *role);
        if out.len() > before {
            *role = None;
        }
    }
    let mut role = role;
    match value {
        Value::String(text) => cache::push_words(out, role, text),
        Value::Array(items) => {
            for item in items {
                push(out, item, &mut role);
            }
        }
        Value::Object(map) => {
            let mut role = map.get("role").and_then(Value::as_str).or(role);
            for (_, value) in map
                .iter()
                .filter(|(k, _)| matches!(k.as_str(), "content" | "text"))
            {
                push(out, value, &mut role);
            }
        }
        _ => {}
    }
}

/// The tokens an answer of `tokens` words leaves in the slot after the prompt: the answer's
/// words, the first hashed with `assistant` where the next turn resends it as a message.
pub(crate) fn answer_sequence(endpoint: Endpoint, tokens: u32) -> Vec<u64> {
    if !endpoint.caches_prompt() {
        return Vec::new();
    }
    let role = endpoint.is_conversation().then_some("assistant");
    let text: String = (0..tokens).map(token_text).collect();
    let mut out = Vec::with_capacity(tokens as usize);
    cache::push_words(&mut out, role, &text);
    out
}

/// The number of items of a string-or-array field (rerank documents, score pairs).
pub(crate) fn count_items(value: Option<&Value>) -> usize {
    match value {
        Some(Value::Array(items)) => items.len(),
        Some(Value::Null) | None => 0,
        Some(_) => 1,
    }
}

/// Seconds since the epoch, for `created`.
pub(crate) fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Builds every body of one inference answer.
#[derive(Debug)]
pub(crate) struct Answer<'a> {
    pub(crate) kind: Kind,
    pub(crate) endpoint: Endpoint,
    pub(crate) id: String,
    pub(crate) created: u64,
    pub(crate) model: &'a str,
    pub(crate) plan: &'a Plan,
    pub(crate) include_usage: bool,
    /// Choices returned (`n`; 1 where the kind ignores it).
    pub(crate) choices: u32,
    /// vLLM `--enable-prompt-tokens-details`.
    pub(crate) cache_details: bool,
}

impl Answer<'_> {
    /// Completion tokens over all choices.
    pub(crate) fn completion_tokens(&self) -> u32 {
        self.plan.tokens.saturating_mul(self.choices.max(1))
    }

    /// The prompt tokens the kind reports: the whole prompt, except on Ollama, which counts
    /// only what it evaluated (`prompt_eval_count`, and its `/v1` usage taken from it).
    pub(crate) fn prompt_tokens(&self) -> u32 {
        match self.kind {
            Kind::Ollama => self.plan.processed_tokens(),
            Kind::LlamaServer | Kind::Vllm => self.plan.prompt_tokens,
        }
    }

    /// The prompt tokens the engine found in its cache.
    pub(crate) fn cached_tokens(&self) -> u32 {
        self.plan.cached_tokens
    }

    fn usage(&self) -> Value {
        let prompt = self.prompt_tokens();
        let completion = self.completion_tokens();
        let mut usage = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": u64::from(prompt) + u64::from(completion),
        });
        let cached = self.cached_tokens();
        match self.kind {
            Kind::LlamaServer => {
                // llama-server adds the details objects (PROTOCOLS.md §1), always.
                usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
                usage["completion_tokens_details"] = json!({"reasoning_tokens": 0});
            }
            // vLLM only with --enable-prompt-tokens-details, and only when something was cached.
            Kind::Vllm if self.cache_details && cached > 0 => {
                usage["prompt_tokens_details"] = json!({"cached_tokens": cached});
            }
            Kind::Vllm | Kind::Ollama => {}
        }
        usage
    }

    /// llama-server's `timings` (`server_slot_stats::to_json`), on its last event or its answer;
    /// `None` for the other kinds.
    pub(crate) fn timings(&self) -> Option<Value> {
        if self.kind != Kind::LlamaServer {
            return None;
        }
        let prompt_n = self.plan.processed_tokens();
        let predicted_n = self.plan.tokens;
        // Whole microseconds, so that a round number of milliseconds stays exact.
        #[allow(clippy::cast_precision_loss)] // durations far below 2^52 µs
        let millis = |d: Duration| d.as_micros() as f64 / 1e3;
        let prompt_ms = millis(self.plan.prefill);
        let predicted_ms = millis(self.plan.total());
        let per_token = |ms: f64, n: u32| if n == 0 { 0.0 } else { ms / f64::from(n) };
        let per_second = |ms: f64, n: u32| {
            if ms > 0.0 {
                1e3 * f64::from(n) / ms
            } else {
                0.0
            }
        };
        Some(json!({
            "cache_n": self.cached_tokens(),
            "prompt_n": prompt_n,
            "prompt_ms": prompt_ms,
            "prompt_per_token_ms": per_token(prompt_ms, prompt_n),
            "prompt_per_second": per_second(prompt_ms, prompt_n),
            "predicted_n": predicted_n,
            "predicted_ms": predicted_ms,
            "predicted_per_token_ms": per_token(predicted_ms, predicted_n),
            "predicted_per_second": per_second(predicted_ms, predicted_n),
        }))
    }

    fn fingerprint(&self) -> Value {
        match self.kind {
            Kind::LlamaServer => json!("b0000-fake"),
            Kind::Ollama => json!("fp_ollama"),
            Kind::Vllm => Value::Null,
        }
    }

    /// The generated text of one choice.
    pub(crate) fn text(&self) -> String {
        (0..self.plan.tokens).map(token_text).collect()
    }

    /// The non-streaming body.
    pub(crate) fn full(&self) -> Value {
        let mut body = self.full_body();
        if let Some(timings) = self.timings() {
            body["timings"] = timings;
        }
        body
    }

    fn full_body(&self) -> Value {
        match self.endpoint {
            Endpoint::Chat => json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": self.fingerprint(),
                "choices": self.each_choice(|index| json!({
                    "index": index,
                    "message": {"role": "assistant", "content": self.text()},
                    "logprobs": null,
                    "finish_reason": self.plan.finish_reason,
                })),
                "usage": self.usage(),
            }),
            // Completions; the other routes build their bodies with their own modules.
            _ => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": self.fingerprint(),
                "choices": self.each_choice(|index| json!({
                    "index": index,
                    "text": self.text(),
                    "logprobs": null,
                    "finish_reason": self.plan.finish_reason,
                })),
                "usage": self.usage(),
            }),
        }
    }

    fn chunk(&self, choice: Value) -> Value {
        let object = match self.endpoint {
            Endpoint::Chat => "chat.completion.chunk",
            _ => "text_completion",
        };
        let mut chunk = json!({
            "id": self.id,
            "object": object,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.fingerprint(),
        });
        chunk["choices"] = Value::Array(vec![choice]);
        if self.include_usage {
            // With include_usage every chunk but the usage chunk carries `usage: null`.
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn each_choice(&self, choice: impl Fn(u32) -> Value) -> Value {
        Value::Array((0..self.choices.max(1)).map(choice).collect())
    }

    /// The stream: the role chunk of each choice (chat only), one chunk per token and choice
    /// (the choices of one token go out together), the closing chunk of each choice, the usage
    /// chunk if asked for, and `[DONE]`.
    pub(crate) fn steps(&self) -> Vec<Step> {
        let choices = self.choices.max(1);
        let mut steps = Vec::with_capacity(((self.plan.tokens + 2) * choices) as usize + 2);
        if self.endpoint == Endpoint::Chat {
            for index in 0..choices {
                steps.push(Step::at_once(sse::event(&self.chunk(json!({
                    "index": index,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": null,
                    "finish_reason": null,
                })))));
            }
        }
        for i in 0..self.plan.tokens {
            for index in 0..choices {
                let chunk = self.chunk(match self.endpoint {
                    Endpoint::Chat => json!({
                        "index": index,
                        "delta": {"content": token_text(i)},
                        "logprobs": null,
                        "finish_reason": null,
                    }),
                    _ => json!({
                        "index": index,
                        "text": token_text(i),
                        "logprobs": null,
                        "finish_reason": null,
                    }),
                });
                let bytes = sse::event(&chunk);
                steps.push(if index == 0 {
                    Step::token(bytes)
                } else {
                    Step::at_once(bytes)
                });
            }
        }
        // The closing chunk of each choice, then the usage chunk if asked for; llama-server
        // puts its timings on the last of them.
        let mut tail: Vec<Value> = (0..choices)
            .map(|index| {
                self.chunk(match self.endpoint {
                    Endpoint::Chat => json!({
                        "index": index,
                        "delta": {},
                        "logprobs": null,
                        "finish_reason": self.plan.finish_reason,
                    }),
                    _ => json!({
                        "index": index,
                        "text": "",
                        "logprobs": null,
                        "finish_reason": self.plan.finish_reason,
                    }),
                })
            })
            .collect();
        if self.include_usage {
            let mut usage_chunk = self.chunk(json!(null));
            usage_chunk["choices"] = json!([]);
            usage_chunk["usage"] = self.usage();
            tail.push(usage_chunk);
        }
        if let (Some(timings), Some(last)) = (self.timings(), tail.last_mut()) {
            last["timings"] = timings;
        }
        steps.extend(tail.iter().map(|chunk| Step::at_once(sse::event(chunk))));
        steps.push(Step::at_once(Bytes::from_static(sse::DONE)));
        steps
    }
}

/// An embeddings response with `inputs` small deterministic vectors.
pub(crate) fn embeddings(model: &str, inputs: usize, prompt_tokens: u32) -> Value {
    let data: Vec<Value> = (0..inputs)
        .map(|index| {
            #[allow(clippy::cast_precision_loss)] // small indices; the values are arbitrary
            let vector: Vec<f64> = (0..8).map(|d| ((index + d) as f64 * 0.125).sin()).collect();
            json!({"object": "embedding", "index": index, "embedding": vector})
        })
        .collect();
    json!({
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Pacing;
    use crate::control::Overrides;

    fn plan(tokens: u32) -> Plan {
        Plan::new(tokens, Pacing::Instant, &[], Overrides::default(), None, 3)
    }

    #[test]
    fn request_fields() {
        let req: InferenceRequest = serde_json::from_value(json!({
            "model": "m", "stream": true, "stream_options": {"include_usage": true},
            "max_tokens": 5, "max_completion_tokens": 4,
            "messages": [{"role": "user", "content": "one two three"},
                         {"role": "user", "content": [{"type": "text", "text": "four"}]}],
        }))
        .unwrap();
        assert!(req.is_stream() && req.include_usage());
        assert_eq!(req.max_tokens(), Some(4));
        assert_eq!(req.count_prompt_tokens(Endpoint::Chat), 4);
        let req: InferenceRequest =
            serde_json::from_value(json!({"input": ["a", "b"], "max_tokens": -1})).unwrap();
        assert_eq!(req.embedding_inputs(), 2);
        assert_eq!(req.max_tokens(), None);
    }

    fn parsed(steps: &[Step]) -> Vec<Value> {
        steps
            .iter()
            .filter_map(|s| {
                let text = std::str::from_utf8(&s.bytes).unwrap();
                serde_json::from_str(text.trim().strip_prefix("data: ")?).ok()
            })
            .collect()
    }

    #[test]
    fn chat_answer_shapes() {
        let plan = plan(3);
        let answer = Answer {
            kind: Kind::Vllm,
            endpoint: Endpoint::Chat,
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m",
            plan: &plan,
            include_usage: true,
            choices: 1,
            cache_details: false,
        };
        let full = answer.full();
        assert_eq!(full["choices"][0]["message"]["content"], "tok0 tok1 tok2");
        assert_eq!(full["usage"]["total_tokens"], 6);
        let steps = answer.steps();
        assert_eq!(steps.len(), 7, "role + 3 tokens + closing + usage + [DONE]");
        assert_eq!(steps.iter().filter(|s| s.paced).count(), 3);
        let chunks = parsed(&steps);
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks[1]["usage"].is_null());
        assert_eq!(chunks[4]["choices"][0]["finish_reason"], "stop");
        assert_eq!(chunks[5]["choices"], json!([]));
        assert_eq!(chunks[5]["usage"]["completion_tokens"], 3);
        assert_eq!(&steps[6].bytes[..], sse::DONE);
    }

    #[test]
    fn completion_chunks_have_text() {
        let plan = plan(2);
        let answer = Answer {
            kind: Kind::LlamaServer,
            endpoint: Endpoint::Completions,
            id: "cmpl-1".into(),
            created: 1,
            model: "m",
            plan: &plan,
            include_usage: false,
            choices: 1,
            cache_details: false,
        };
        let chunks = parsed(&answer.steps());
        assert_eq!(chunks.len(), 3, "2 tokens + closing");
        assert_eq!(chunks[1]["object"], "text_completion");
        assert_eq!(chunks[1]["choices"][0]["text"], " tok1");
        assert!(chunks[1].get("usage").is_none());
    }

    #[test]
    fn n_choices_answer_n_times() {
        let plan = plan(2);
        let answer = Answer {
            kind: Kind::Vllm,
            endpoint: Endpoint::Chat,
            id: "chatcmpl-1".into(),
            created: 1,
            model: "m",
            plan: &plan,
            include_usage: false,
            choices: 3,
            cache_details: false,
        };
        assert_eq!(answer.full()["choices"].as_array().unwrap().len(), 3);
        assert_eq!(answer.full()["usage"]["completion_tokens"], 6);
        let steps = answer.steps();
        assert_eq!(
            steps.iter().filter(|s| s.paced).count(),
            2,
            "paced per token"
        );
        let indices: Vec<u64> = parsed(&steps)
            .iter()
            .map(|c| c["choices"][0]["index"].as_u64().unwrap())
            .collect();
        assert_eq!(indices, [0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2]);
        let req: InferenceRequest =
            serde_json::from_value(json!({"prompt": "x", "n": 2, "best_of": 4})).unwrap();
        assert_eq!(req.sequences(Endpoint::Completions), 4);
        assert_eq!(req.sequences(Endpoint::Embeddings), 1);
    }
}
