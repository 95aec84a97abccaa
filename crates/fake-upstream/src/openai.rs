//! The OpenAI wire format (PROTOCOLS.md §4): reading the few request fields the fake needs, and
//! building the response bodies and stream chunks. Generated text is `tok0 tok1 tok2 ...`.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Deserialize;
use serde_json::{Value, json};

use crate::config::Kind;
use crate::control::Plan;

/// The inference endpoints.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    Chat,
    Completions,
    Embeddings,
}

impl Endpoint {
    /// The endpoint a path names, accepting llama-server's un-prefixed aliases when `bare` is
    /// allowed.
    pub(crate) fn from_path(path: &str, bare: bool) -> Option<Self> {
        let rest = match path.strip_prefix("/v1") {
            Some(rest) => rest,
            None if bare => path,
            None => return None,
        };
        match rest {
            "/chat/completions" => Some(Self::Chat),
            "/completions" => Some(Self::Completions),
            "/embeddings" => Some(Self::Embeddings),
            _ => None,
        }
    }

    /// The body field the endpoint requires besides `model`.
    pub(crate) fn required_field(self) -> &'static str {
        match self {
            Self::Chat => "messages",
            Self::Completions => "prompt",
            Self::Embeddings => "input",
        }
    }
}

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
        self.max_completion_tokens
            .or(self.max_tokens)
            .and_then(|n| u32::try_from(n).ok())
    }

    /// The body of the endpoint's required field, if present.
    pub(crate) fn required(&self, endpoint: Endpoint) -> Option<&Value> {
        match endpoint {
            Endpoint::Chat => self.messages.as_ref(),
            Endpoint::Completions => self.prompt.as_ref(),
            Endpoint::Embeddings => self.input.as_ref(),
        }
        .filter(|v| !v.is_null())
    }

    /// A rough prompt size: the words of every string in the prompt, at least 1.
    pub(crate) fn count_prompt_tokens(&self, endpoint: Endpoint) -> u32 {
        fn words(v: &Value) -> usize {
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
        let n = self.required(endpoint).map_or(0, words);
        u32::try_from(n).unwrap_or(u32::MAX).max(1)
    }

    /// How many inputs an embeddings request has.
    pub(crate) fn embedding_inputs(&self) -> usize {
        match &self.input {
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
}

impl Answer<'_> {
    fn usage(&self) -> Value {
        let prompt = self.plan.prompt_tokens;
        let completion = self.plan.tokens;
        let mut usage = json!({
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": u64::from(prompt) + u64::from(completion),
        });
        if self.kind == Kind::LlamaServer {
            // llama-server adds the details objects (PROTOCOLS.md §1).
            usage["prompt_tokens_details"] = json!({"cached_tokens": 0});
            usage["completion_tokens_details"] = json!({"reasoning_tokens": 0});
        }
        usage
    }

    fn fingerprint(&self) -> Value {
        match self.kind {
            Kind::LlamaServer => json!("b0000-fake"),
            Kind::Ollama => json!("fp_ollama"),
            Kind::Vllm => Value::Null,
        }
    }

    fn text(&self) -> String {
        (0..self.plan.tokens).map(token_text).collect()
    }

    /// The non-streaming body.
    pub(crate) fn full(&self) -> Value {
        match self.endpoint {
            Endpoint::Chat => json!({
                "id": self.id,
                "object": "chat.completion",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": self.fingerprint(),
                "choices": [{
                    "index": 0,
                    "message": {"role": "assistant", "content": self.text()},
                    "logprobs": null,
                    "finish_reason": self.plan.finish_reason,
                }],
                "usage": self.usage(),
            }),
            Endpoint::Completions => json!({
                "id": self.id,
                "object": "text_completion",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": self.fingerprint(),
                "choices": [{
                    "index": 0,
                    "text": self.text(),
                    "logprobs": null,
                    "finish_reason": self.plan.finish_reason,
                }],
                "usage": self.usage(),
            }),
            Endpoint::Embeddings => unreachable!("embeddings are built by `embeddings`"),
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

    /// The chunks before the final one: the role chunk (chat only), then one per token.
    pub(crate) fn content_chunks(&self) -> Vec<Value> {
        let mut chunks = Vec::with_capacity(self.plan.tokens as usize + 1);
        if self.endpoint == Endpoint::Chat {
            chunks.push(self.chunk(json!({
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": null,
                "finish_reason": null,
            })));
        }
        for i in 0..self.plan.tokens {
            chunks.push(self.chunk(match self.endpoint {
                Endpoint::Chat => json!({
                    "index": 0,
                    "delta": {"content": token_text(i)},
                    "logprobs": null,
                    "finish_reason": null,
                }),
                _ => json!({
                    "index": 0,
                    "text": token_text(i),
                    "logprobs": null,
                    "finish_reason": null,
                }),
            }));
        }
        chunks
    }

    /// The chunk with `finish_reason` and an empty delta, then the usage chunk if asked for.
    pub(crate) fn closing_chunks(&self) -> Vec<Value> {
        let last = match self.endpoint {
            Endpoint::Chat => json!({
                "index": 0,
                "delta": {},
                "logprobs": null,
                "finish_reason": self.plan.finish_reason,
            }),
            _ => json!({
                "index": 0,
                "text": "",
                "logprobs": null,
                "finish_reason": self.plan.finish_reason,
            }),
        };
        let mut chunks = vec![self.chunk(last)];
        if self.include_usage {
            let mut usage_chunk = self.chunk(json!(null));
            usage_chunk["choices"] = json!([]);
            usage_chunk["usage"] = self.usage();
            chunks.push(usage_chunk);
        }
        chunks
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
    fn paths_map_to_endpoints() {
        assert_eq!(
            Endpoint::from_path("/v1/chat/completions", false),
            Some(Endpoint::Chat)
        );
        assert_eq!(Endpoint::from_path("/chat/completions", false), None);
        assert_eq!(
            Endpoint::from_path("/completions", true),
            Some(Endpoint::Completions)
        );
        assert_eq!(Endpoint::from_path("/v1/models", true), None);
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
        };
        let full = answer.full();
        assert_eq!(full["choices"][0]["message"]["content"], "tok0 tok1 tok2");
        assert_eq!(full["usage"]["total_tokens"], 6);
        let chunks = answer.content_chunks();
        assert_eq!(chunks.len(), 4, "role chunk + 3 tokens");
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert!(chunks[1]["usage"].is_null());
        let closing = answer.closing_chunks();
        assert_eq!(closing[0]["choices"][0]["finish_reason"], "stop");
        assert_eq!(closing[1]["choices"], json!([]));
        assert_eq!(closing[1]["usage"]["completion_tokens"], 3);
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
        };
        let chunks = answer.content_chunks();
        assert_eq!(chunks.len(), 2);
        assert_eq!(chunks[1]["object"], "text_completion");
        assert_eq!(chunks[1]["choices"][0]["text"], " tok1");
        assert!(chunks[1].get("usage").is_none());
        assert_eq!(answer.closing_chunks().len(), 1);
    }
}
