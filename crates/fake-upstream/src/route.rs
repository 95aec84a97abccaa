//! Which inference routes each kind serves, and what each route needs from its body. A route a
//! kind does not serve falls through to the kind's own endpoints and, from there, to its 404
//! (`kinds/*`). Sources per route are in `docs/PROTOCOLS.md`.
//!
//! | route | llama-server | vLLM | Ollama |
//! |---|---|---|---|
//! | `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings` | yes (also without `/v1`) | yes | yes |
//! | `/v1/responses` | yes (also `/responses`), stateless | yes, stored | yes, stateless |
//! | `/v1/messages` | yes | yes | yes |
//! | `/completion`, `/infill`, `/embedding` | yes | | |
//! | `/rerank`, `/v1/rerank` | yes (also `/reranking`, `/v1/reranking`) | yes (also `/v2/rerank`) | |
//! | `/score`, `/v1/score` | | yes | |
//! | `/v1/audio/transcriptions` | yes (also without `/v1`) | yes | yes |
//! | `/v1/audio/translations` | | yes | |
//! | `/v1/audio/speech`, `/v1/images/generations` | | simplified | |
//! | `/api/chat`, `/api/generate`, `/api/embed`, `/api/embeddings` | | | yes |

use crate::config::Kind;

/// The routes that run inference, and so take a slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// OpenAI chat completions.
    Chat,
    /// OpenAI completions.
    Completions,
    /// OpenAI embeddings.
    Embeddings,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Messages,
    /// Ollama `/api/chat`.
    OllamaChat,
    /// Ollama `/api/generate`.
    OllamaGenerate,
    /// Ollama `/api/embed`.
    OllamaEmbed,
    /// Ollama `/api/embeddings` (the older one).
    OllamaEmbeddings,
    /// llama-server `/completion`.
    Completion,
    /// llama-server `/infill`.
    Infill,
    /// llama-server `/embedding`.
    Embedding,
    /// Rerank (llama-server's or vLLM's shape).
    Rerank,
    /// vLLM score.
    Score,
    /// Audio transcription (multipart).
    Transcription,
    /// Audio translation (multipart).
    Translation,
    /// Text to speech.
    Speech,
    /// Image generation.
    Images,
}

impl Endpoint {
    /// The inference endpoint `kind` serves at `path` (POST), if any.
    pub(crate) fn from_path(kind: Kind, path: &str) -> Option<Self> {
        let llama = kind == Kind::LlamaServer;
        let vllm = kind == Kind::Vllm;
        let ollama = kind == Kind::Ollama;
        let endpoint = match path {
            "/v1/chat/completions" => Self::Chat,
            "/v1/completions" => Self::Completions,
            "/v1/embeddings" => Self::Embeddings,
            "/chat/completions" if llama => Self::Chat,
            "/completions" if llama => Self::Completions,
            "/embeddings" if llama => Self::Embeddings,
            "/v1/responses" => Self::Responses,
            "/responses" if llama => Self::Responses,
            "/v1/messages" => Self::Messages,
            "/completion" if llama => Self::Completion,
            "/infill" if llama => Self::Infill,
            "/embedding" if llama => Self::Embedding,
            "/rerank" | "/v1/rerank" if llama || vllm => Self::Rerank,
            "/reranking" | "/v1/reranking" if llama => Self::Rerank,
            "/v2/rerank" if vllm => Self::Rerank,
            "/score" | "/v1/score" if vllm => Self::Score,
            "/v1/audio/transcriptions" => Self::Transcription,
            "/audio/transcriptions" if llama => Self::Transcription,
            "/v1/audio/translations" if vllm => Self::Translation,
            "/v1/audio/speech" if vllm => Self::Speech,
            "/v1/images/generations" if vllm => Self::Images,
            "/api/chat" if ollama => Self::OllamaChat,
            "/api/generate" if ollama => Self::OllamaGenerate,
            "/api/embed" if ollama => Self::OllamaEmbed,
            "/api/embeddings" if ollama => Self::OllamaEmbeddings,
            _ => return None,
        };
        Some(endpoint)
    }

    /// The body field the endpoint requires besides `model`.
    pub(crate) fn required_field(self) -> &'static str {
        match self {
            Self::Chat | Self::Messages | Self::OllamaChat => "messages",
            Self::Completions
            | Self::Completion
            | Self::OllamaGenerate
            | Self::OllamaEmbeddings
            | Self::Images => "prompt",
            Self::Embeddings | Self::Responses | Self::OllamaEmbed | Self::Speech => "input",
            Self::Infill => "input_prefix",
            Self::Embedding => "content",
            Self::Rerank => "documents",
            Self::Score => "text_1",
            Self::Transcription | Self::Translation => "file",
        }
    }

    /// Whether the answer can stream, and whether it does when the body does not say
    /// (`stream` defaults to true on Ollama's `/api/chat` and `/api/generate`).
    pub(crate) fn streams(self, asked: Option<bool>) -> bool {
        match self {
            Self::Chat
            | Self::Completions
            | Self::Responses
            | Self::Messages
            | Self::Completion
            | Self::Infill => asked.unwrap_or(false),
            Self::OllamaChat | Self::OllamaGenerate => asked.unwrap_or(true),
            _ => false,
        }
    }

    /// The routes that generate from a prompt, whose engines keep it in their prompt cache.
    pub(crate) fn caches_prompt(self) -> bool {
        matches!(
            self,
            Self::Chat
                | Self::Completions
                | Self::Responses
                | Self::Messages
                | Self::Completion
                | Self::Infill
                | Self::OllamaChat
                | Self::OllamaGenerate
        )
    }

    /// The routes that carry a conversation as messages, whose next turn resends the answer as
    /// an assistant message.
    pub(crate) fn is_conversation(self) -> bool {
        matches!(
            self,
            Self::Chat | Self::Responses | Self::Messages | Self::OllamaChat
        )
    }

    /// Ollama's native routes, which answer errors as `{"error": "..."}`.
    pub(crate) fn is_ollama_native(self) -> bool {
        matches!(
            self,
            Self::OllamaChat | Self::OllamaGenerate | Self::OllamaEmbed | Self::OllamaEmbeddings
        )
    }

    /// Whether the body is `multipart/form-data` rather than JSON.
    pub(crate) fn is_multipart(self) -> bool {
        matches!(self, Self::Transcription | Self::Translation)
    }

    /// The prefix of this endpoint's answer ids.
    pub(crate) fn id_prefix(self) -> &'static str {
        match self {
            Self::Chat => "chatcmpl-fake",
            Self::Completions | Self::Completion | Self::Infill => "cmpl-fake",
            Self::Embeddings | Self::Embedding | Self::OllamaEmbed | Self::OllamaEmbeddings => {
                "embd-fake"
            }
            Self::Responses => "resp_fake",
            Self::Messages => "msg_fake",
            Self::Rerank => "rerank-fake",
            Self::Score => "score-fake",
            Self::OllamaChat | Self::OllamaGenerate => "ollama-fake",
            Self::Transcription | Self::Translation => "trsc-fake",
            Self::Speech => "speech-fake",
            Self::Images => "img-fake",
        }
    }
}

/// True for a path that runs inference on some kind: what the observer counts as received.
pub(crate) fn is_inference_path(path: &str) -> bool {
    [Kind::LlamaServer, Kind::Vllm, Kind::Ollama]
        .into_iter()
        .any(|kind| Endpoint::from_path(kind, path).is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_serve_their_own_routes() {
        assert_eq!(
            Endpoint::from_path(Kind::Ollama, "/api/chat"),
            Some(Endpoint::OllamaChat)
        );
        assert_eq!(Endpoint::from_path(Kind::Vllm, "/api/chat"), None);
        assert_eq!(
            Endpoint::from_path(Kind::LlamaServer, "/infill"),
            Some(Endpoint::Infill)
        );
        assert_eq!(Endpoint::from_path(Kind::Ollama, "/infill"), None);
        assert_eq!(
            Endpoint::from_path(Kind::Vllm, "/v2/rerank"),
            Some(Endpoint::Rerank)
        );
        assert_eq!(Endpoint::from_path(Kind::LlamaServer, "/v2/rerank"), None);
        assert_eq!(Endpoint::from_path(Kind::Vllm, "/chat/completions"), None);
        assert!(is_inference_path("/api/generate"));
        assert!(!is_inference_path("/v1/models"));
    }

    #[test]
    fn ollama_streams_by_default() {
        assert!(Endpoint::OllamaChat.streams(None));
        assert!(!Endpoint::OllamaChat.streams(Some(false)));
        assert!(!Endpoint::Chat.streams(None));
        assert!(!Endpoint::OllamaEmbed.streams(Some(true)));
    }
}
