//! The endpoint table, read by steps 3 to 5: which of the engines' APIs (endpoints) a request is
//! for, and what that endpoint needs: where the model is named, whether it takes a slot, which
//! kinds of upstream serve it. (The *routing* table, from a model to its upstreams, is
//! [`route`](crate::proxy::route).)
//!
//! The table follows what each engine really serves (the team's `PROTOCOLS.md`, §7, with
//! sources): an endpoint is sent only to upstreams whose [`Kind`] serves it, so an Ollama-native
//! request never reaches a `llama-server`. `kind = "openai"` (a server the gateway knows nothing
//! else about) gets the endpoints of OpenAI's own API.
//!
//! | endpoints | model | slot | kinds |
//! |---|---|---|---|
//! | `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings`, `/v1/responses`, `/v1/messages` | JSON | yes | all |
//! | `/v1/messages/count_tokens` | JSON | no | llama-server, vLLM |
//! | `/v1/rerank`, `/rerank` | JSON | yes | llama-server, vLLM |
//! | `/v1/reranking`, `/reranking` | JSON | yes | llama-server |
//! | `/v2/rerank`, `/v1/score`, `/score` | JSON | yes | vLLM |
//! | `/v1/audio/transcriptions` | form field | yes | all |
//! | `/v1/audio/translations` | form field | yes | vLLM, openai |
//! | `/v1/audio/speech`, `/v1/images/generations` | JSON | yes | vLLM, openai |
//! | `/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings` | JSON | yes | Ollama |
//! | `/api/show` | JSON | no | Ollama |
//! | `/api/pull`, `/api/push`, `/api/create`, `DELETE /api/delete` | JSON | no | Ollama, with `allow_model_management` |
//! | `/api/copy` | JSON `source` | no | Ollama, with `allow_model_management` |
//! | `/completion`, `/infill`, `/embedding`, `/embeddings` | JSON, optional | yes | llama-server |
//! | `/tokenize`, `/detokenize` | JSON, optional | no | llama-server, vLLM |
//! | `/apply-template` | JSON, optional | no | llama-server |
//!
//! A request holds one slot per sequence the engine runs for it ([`Weighed`]): `n` on
//! `/v1/chat/completions`, `max(n, best_of)` on `/v1/completions`, one everywhere else
//! (embeddings count one whatever their number of inputs).
//!
//! A request that names no model on an "optional" endpoint goes to the only model the serving
//! kinds have (a single-model `llama-server` ignores `model`); with several, it is a 400.

use http::Method;
use slotgate_config::Kind;

/// Every kind.
const ALL: &[Kind] = &Kind::ALL;
/// The engines that serve Anthropic's token count (Ollama does not, PROTOCOLS §7).
const LLAMA_VLLM: &[Kind] = &[Kind::LlamaServer, Kind::Vllm];
const LLAMA: &[Kind] = &[Kind::LlamaServer];
const VLLM: &[Kind] = &[Kind::Vllm];
const OLLAMA: &[Kind] = &[Kind::Ollama];
/// Served by none of the three engines; vLLM-Omni speaks the same API under `kind = "vllm"`.
const VLLM_OPENAI: &[Kind] = &[Kind::Vllm, Kind::OpenAi];

/// Which members carry an endpoint's prompt (see [`request::prompt`](crate::proxy::request::prompt)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carries {
    /// No prompt worth routing by (embeddings, rerank, audio, metadata endpoints).
    Nothing,
    /// `messages`.
    Messages,
    /// `system`, then `messages` (Anthropic's Messages API).
    SystemAndMessages,
    /// `instructions`, then `input` (the Responses API).
    InstructionsAndInput,
    /// `prompt` (completions).
    Prompt,
    /// `system`, then `prompt` (Ollama's generate).
    SystemAndPrompt,
}

/// Where an endpoint's body names the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelIn {
    /// The JSON body's `model` member, required.
    Json,
    /// The JSON body's `model` member, or, when absent, the only model the serving kinds have.
    JsonOptional,
    /// The `model` field of a `multipart/form-data` body (an upload), required; the body limit
    /// is `max_upload_bytes`.
    Form,
    /// The JSON body's `source` member, required: Ollama's `/api/copy`
    /// (`{"source": …, "destination": …}`) acts on the model it copies from.
    JsonSource,
}

/// One endpoint of the engines' APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Endpoint {
    /// The path, exactly.
    pub(crate) path: &'static str,
    /// Where the model is named.
    pub(crate) model: ModelIn,
    /// Whether the request runs inference, and so waits for and holds a slot.
    pub(crate) slot: bool,
    /// The kinds of upstream that serve it.
    pub(crate) kinds: &'static [Kind],
    /// What `stream` means when the body does not say (`true` on Ollama's chat and generate).
    pub(crate) stream_default: bool,
    /// Whether the endpoint changes an engine's disk (sent only where `allow_model_management`).
    pub(crate) manages_models: bool,
    /// How many engine slots (sequences) one request takes.
    pub(crate) weighed: Weighed,
    /// The methods the route takes: `POST`, except Ollama's `DELETE /api/delete`.
    pub(crate) methods: &'static [Method],
    /// Which members carry the prompt that cache-aware routing hashes.
    pub(crate) carries: Carries,
}

/// How many engine slots one request on an endpoint takes: its weight at the limiter.
///
/// An engine runs each generated choice as its own sequence, in its own slot
/// (`docs/real-engine-notes.md`: llama-server showed `requests_processing 2` for one `"n": 2`
/// request), so a request with `n` choices holds `n` slots, not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Weighed {
    /// One slot, whatever the body says (embeddings, rerank, Ollama's native endpoints, ...).
    One,
    /// `n` slots: the number of choices (chat completions).
    Choices,
    /// `max(n, best_of)` slots: the engine generates `best_of` candidates and returns the best
    /// `n` (legacy completions; `best_of` below `n` is refused by the engines).
    ChoicesOrBestOf,
}

impl Endpoint {
    const fn new(path: &'static str, model: ModelIn, slot: bool, kinds: &'static [Kind]) -> Self {
        Self {
            path,
            model,
            slot,
            kinds,
            stream_default: false,
            manages_models: false,
            weighed: Weighed::One,
            carries: Carries::Nothing,
            methods: POST_ONLY,
        }
    }

    const fn taking(mut self, methods: &'static [Method]) -> Self {
        self.methods = methods;
        self
    }

    const fn carrying(mut self, carries: Carries) -> Self {
        self.carries = carries;
        self
    }

    const fn weighed(mut self, weighed: Weighed) -> Self {
        self.weighed = weighed;
        self
    }

    const fn streaming_by_default(mut self) -> Self {
        self.stream_default = true;
        self
    }

    const fn managing_models(mut self) -> Self {
        self.manages_models = true;
        self
    }

    /// The endpoint for a POST to `path`, if the gateway routes it by model.
    pub(crate) fn find(path: &str) -> Option<&'static Endpoint> {
        ENDPOINTS.iter().find(|endpoint| endpoint.path == path)
    }

    /// Whether a streamed answer on this endpoint is Server-Sent Events, which can carry a
    /// queued client's keepalive comments (`queue_keepalive`) and a late `error` event. Ollama's
    /// native endpoints stream NDJSON, which has no comments: keepalive is off there.
    pub(crate) fn streams_sse(&self) -> bool {
        matches!(
            self.path,
            "/v1/chat/completions"
                | "/v1/completions"
                | "/v1/responses"
                | "/v1/messages"
                | "/completion"
                | "/infill"
        )
    }

    /// Whether the route takes a JSON body whatever its `Content-Type` says, as Ollama does on
    /// its native routes (`/api/…`); every other JSON route wants `application/json`.
    pub(crate) fn takes_any_content_type(&self) -> bool {
        self.path.starts_with("/api/")
    }

    /// Whether this is the Responses API (`/v1/responses`), whose answers are recorded for
    /// their follow-ups ([`responses`](crate::proxy::responses)).
    pub(crate) fn is_responses(&self) -> bool {
        self.path == "/v1/responses"
    }

    /// Whether an upstream of `kind` serves this endpoint.
    pub(crate) fn is_served_by(&self, kind: Kind) -> bool {
        self.kinds.contains(&kind)
    }
}

/// A path segment that carries an id (`/v1/models/{id}`, `/v1/responses/{id}`),
/// percent-decoded: both OpenAI SDKs encode the `/` of `Qwen/Qwen2.5-7B-Instruct` as `%2F`.
/// `None` when the decoded bytes are not UTF-8 (no model or response has such an id).
pub(crate) fn id_segment(raw: &str) -> Option<std::borrow::Cow<'_, str>> {
    percent_encoding::percent_decode_str(raw).decode_utf8().ok()
}

use ModelIn::{Form, Json, JsonOptional, JsonSource};

/// `POST`, the method of every route but one.
const POST_ONLY: &[Method] = &[Method::POST];
/// Ollama deletes a model with `DELETE /api/delete` and a JSON body (api/client.go `Delete`).
const DELETE_ONLY: &[Method] = &[Method::DELETE];

/// The model-routed endpoints (see the module documentation).
static ENDPOINTS: &[Endpoint] = &[
    Endpoint::new("/v1/chat/completions", Json, true, ALL)
        .weighed(Weighed::Choices)
        .carrying(Carries::Messages),
    Endpoint::new("/v1/completions", Json, true, ALL)
        .weighed(Weighed::ChoicesOrBestOf)
        .carrying(Carries::Prompt),
    Endpoint::new("/v1/embeddings", Json, true, ALL),
    Endpoint::new("/v1/responses", Json, true, ALL).carrying(Carries::InstructionsAndInput),
    Endpoint::new("/v1/messages", Json, true, ALL).carrying(Carries::SystemAndMessages),
    Endpoint::new("/v1/messages/count_tokens", Json, false, LLAMA_VLLM),
    Endpoint::new("/v1/rerank", Json, true, LLAMA_VLLM),
    Endpoint::new("/rerank", Json, true, LLAMA_VLLM),
    Endpoint::new("/v1/reranking", Json, true, LLAMA),
    Endpoint::new("/reranking", Json, true, LLAMA),
    Endpoint::new("/v2/rerank", Json, true, VLLM),
    Endpoint::new("/v1/score", Json, true, VLLM),
    Endpoint::new("/score", Json, true, VLLM),
    Endpoint::new("/v1/audio/transcriptions", Form, true, ALL),
    Endpoint::new("/v1/audio/translations", Form, true, VLLM_OPENAI),
    Endpoint::new("/v1/audio/speech", Json, true, VLLM_OPENAI),
    Endpoint::new("/v1/images/generations", Json, true, VLLM_OPENAI),
    Endpoint::new("/api/chat", Json, true, OLLAMA)
        .streaming_by_default()
        .carrying(Carries::Messages),
    Endpoint::new("/api/generate", Json, true, OLLAMA)
        .streaming_by_default()
        .carrying(Carries::SystemAndPrompt),
    Endpoint::new("/api/embed", Json, true, OLLAMA),
    Endpoint::new("/api/embeddings", Json, true, OLLAMA),
    Endpoint::new("/api/show", Json, false, OLLAMA),
    Endpoint::new("/api/pull", Json, false, OLLAMA).managing_models(),
    Endpoint::new("/api/push", Json, false, OLLAMA).managing_models(),
    Endpoint::new("/api/create", Json, false, OLLAMA).managing_models(),
    Endpoint::new("/api/delete", Json, false, OLLAMA)
        .managing_models()
        .taking(DELETE_ONLY),
    Endpoint::new("/api/copy", JsonSource, false, OLLAMA).managing_models(),
    Endpoint::new("/completion", JsonOptional, true, LLAMA).carrying(Carries::Prompt),
    Endpoint::new("/infill", JsonOptional, true, LLAMA),
    Endpoint::new("/embedding", JsonOptional, true, LLAMA),
    Endpoint::new("/embeddings", JsonOptional, true, LLAMA),
    Endpoint::new("/tokenize", JsonOptional, false, LLAMA_VLLM),
    Endpoint::new("/detokenize", JsonOptional, false, LLAMA_VLLM),
    Endpoint::new("/apply-template", JsonOptional, false, LLAMA),
];

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use slotgate_config::Kind;

    use super::{ENDPOINTS, Endpoint, ModelIn};

    #[test]
    fn every_path_is_listed_once() {
        let paths: BTreeSet<&str> = ENDPOINTS.iter().map(|e| e.path).collect();
        assert_eq!(paths.len(), ENDPOINTS.len());
    }

    #[test]
    fn native_endpoints_go_only_to_their_engine() {
        let chat = Endpoint::find("/api/chat").unwrap();
        assert!(chat.slot && chat.stream_default);
        assert!(chat.is_served_by(Kind::Ollama));
        assert!(!chat.is_served_by(Kind::LlamaServer));
        let infill = Endpoint::find("/infill").unwrap();
        assert_eq!(infill.model, ModelIn::JsonOptional);
        assert!(infill.is_served_by(Kind::LlamaServer));
        assert!(!infill.is_served_by(Kind::Vllm) && !infill.is_served_by(Kind::Ollama));
        let count = Endpoint::find("/v1/messages/count_tokens").unwrap();
        assert!(!count.slot && !count.is_served_by(Kind::Ollama));
    }

    #[test]
    fn metadata_endpoints_take_no_slot_and_inference_endpoints_do() {
        for path in ["/tokenize", "/detokenize", "/apply-template", "/api/show"] {
            assert!(!Endpoint::find(path).unwrap().slot, "{path}");
        }
        for path in [
            "/v1/responses",
            "/v1/messages",
            "/v1/rerank",
            "/completion",
            "/api/embed",
        ] {
            assert!(Endpoint::find(path).unwrap().slot, "{path}");
        }
    }

    #[test]
    fn only_ollamas_disk_endpoints_manage_models() {
        let managing: Vec<&str> = ENDPOINTS
            .iter()
            .filter(|e| e.manages_models)
            .map(|e| e.path)
            .collect();
        assert_eq!(
            managing,
            [
                "/api/pull",
                "/api/push",
                "/api/create",
                "/api/delete",
                "/api/copy"
            ]
        );
    }

    #[test]
    fn id_segments_are_percent_decoded() {
        use super::id_segment;
        assert_eq!(
            id_segment("Qwen%2FQwen2.5-7B-Instruct").as_deref(),
            Some("Qwen/Qwen2.5-7B-Instruct")
        );
        assert_eq!(id_segment("plain:7b").as_deref(), Some("plain:7b"));
        assert_eq!(id_segment("a%3Ab%20c").as_deref(), Some("a:b c"));
        assert_eq!(id_segment("bad%FF"), None);
    }

    #[test]
    fn ollamas_management_routes_take_their_real_methods_and_members() {
        let delete = Endpoint::find("/api/delete").unwrap();
        assert_eq!(delete.methods, &[http::Method::DELETE]);
        let copy = Endpoint::find("/api/copy").unwrap();
        assert_eq!(copy.model, ModelIn::JsonSource);
        assert_eq!(copy.methods, &[http::Method::POST]);
    }

    #[test]
    fn unknown_paths_are_not_endpoints() {
        assert!(Endpoint::find("/v1/nope").is_none());
        assert!(
            Endpoint::find("/api/tags").is_none(),
            "answered by the gateway"
        );
    }
}
