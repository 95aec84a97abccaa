//! The route table, read by steps 3 to 5: which of the engines' APIs a request is for, and what that route needs: where the
//! model is named, whether it takes a slot, which kinds of upstream serve it.
//!
//! The table follows what each engine really serves (the team's `PROTOCOLS.md`, §7, with
//! sources): a route is sent only to upstreams whose [`Kind`] serves it, so an Ollama-native
//! request never reaches a `llama-server`. `kind = "openai"` (a server the gateway knows nothing
//! else about) gets the routes of OpenAI's own API.
//!
//! | routes | model | slot | kinds |
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
//! | `/api/pull`, `/api/push`, `/api/create`, `/api/delete`, `/api/copy` | JSON | no | Ollama, with `allow_model_management` |
//! | `/completion`, `/infill`, `/embedding`, `/embeddings` | JSON, optional | yes | llama-server |
//! | `/tokenize`, `/detokenize` | JSON, optional | no | llama-server, vLLM |
//! | `/apply-template` | JSON, optional | no | llama-server |
//!
//! A request holds one slot per sequence the engine runs for it ([`Weighed`]): `n` on
//! `/v1/chat/completions`, `max(n, best_of)` on `/v1/completions`, one everywhere else
//! (embeddings count one whatever their number of inputs).
//!
//! A request that names no model on an "optional" route goes to the only model the serving
//! kinds have (a single-model `llama-server` ignores `model`); with several, it is a 400.

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

/// Which members carry a route's prompt (see [`request::prompt`](crate::proxy::request::prompt)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Carries {
    /// No prompt worth routing by (embeddings, rerank, audio, metadata routes).
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

/// Where a route's body names the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelIn {
    /// The JSON body's `model` member, required.
    Json,
    /// The JSON body's `model` member, or, when absent, the only model the serving kinds have.
    JsonOptional,
    /// The `model` field of a `multipart/form-data` body (an upload), required; the body limit
    /// is `max_upload_bytes`.
    Form,
}

/// One route of the engines' APIs.
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
    /// Whether the route changes an engine's disk (sent only where `allow_model_management`).
    pub(crate) manages_models: bool,
    /// How many engine slots (sequences) one request takes.
    pub(crate) weighed: Weighed,
    /// Which members carry the prompt that cache-aware routing hashes.
    pub(crate) carries: Carries,
}

/// How many engine slots one request on a route takes: its weight at the limiter.
///
/// An engine runs each generated choice as its own sequence, in its own slot
/// (`docs/real-engine-notes.md`: llama-server showed `requests_processing 2` for one `"n": 2`
/// request), so a request with `n` choices holds `n` slots, not one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Weighed {
    /// One slot, whatever the body says (embeddings, rerank, Ollama's native routes, ...).
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
        }
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

    /// Whether a streamed answer on this route is Server-Sent Events, which can carry a
    /// queued client's keepalive comments (`queue_keepalive`) and a late `error` event. Ollama's
    /// native routes stream NDJSON, which has no comments: keepalive is off there.
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

    /// Whether this is the Responses API (`/v1/responses`), whose answers are recorded for
    /// their follow-ups ([`responses`](crate::proxy::responses)).
    pub(crate) fn is_responses(&self) -> bool {
        self.path == "/v1/responses"
    }

    /// Whether an upstream of `kind` serves this route.
    pub(crate) fn is_served_by(&self, kind: Kind) -> bool {
        self.kinds.contains(&kind)
    }
}

use ModelIn::{Form, Json, JsonOptional};

/// The model-routed routes (see the module documentation).
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
    Endpoint::new("/api/delete", Json, false, OLLAMA).managing_models(),
    Endpoint::new("/api/copy", Json, false, OLLAMA).managing_models(),
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
    fn native_routes_go_only_to_their_engine() {
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
    fn metadata_routes_take_no_slot_and_inference_routes_do() {
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
    fn only_ollamas_disk_routes_manage_models() {
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
    fn unknown_paths_are_not_routes() {
        assert!(Endpoint::find("/v1/nope").is_none());
        assert!(
            Endpoint::find("/api/tags").is_none(),
            "answered by the gateway"
        );
    }
}
