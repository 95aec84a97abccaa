//! Typed `GET`s against an upstream's own endpoints: health, resident models, and whatever else
//! the gateway learns from an engine (slot counts, for instance, build on the same pieces).
//!
//! [`Prober`] is the one client for all of them. It is separate from the request path's pooled
//! client on purpose: a probe must never wait behind, or take a pooled connection from, client
//! traffic, and its timeout covers the *whole* exchange (connect, head and body), where a client
//! request may legitimately stream for minutes. It keeps no idle connections: every probe opens
//! a fresh one, so a check also proves that the engine still *accepts* connections (a reused
//! keep-alive connection would hide a listener that stopped accepting). One connect per upstream
//! per interval costs nothing.
//!
//! Each kind's endpoint has its own function returning a typed answer ([`Prober::llama_models`],
//! [`Prober::ollama_ps`], …), parsed leniently: unknown fields are ignored and optional ones
//! default, because builds of the same server differ (`docs/PROTOCOLS.md`). New probes are a
//! serde type plus a one-line call to [`Prober::get_json`].
//!
//! A failed probe is a [`ProbeError`], classified like a forwarded request's errors: a connect
//! error (nothing answered), a timeout, a non-success status (with the engine's own message
//! when its error envelope carries one, e.g. llama-server's `Loading model`), or an answer that
//! does not parse.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Empty, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::forward::Base;

/// Largest probe answer read: a router listing hundreds of models fits easily; anything larger
/// is not an answer to a probe.
const MAX_PROBE_BODY: usize = 1024 * 1024;

/// An upstream as a probe sees it: where it is, and the bearer token it wants, if any.
#[derive(Debug, Clone, Copy)]
pub struct ProbeTarget<'a> {
    /// Scheme, authority and path prefix.
    pub base: &'a Base,
    /// `Authorization` to send (the upstream's `api_key`); vLLM's `--api-key` guards `/v1/*`.
    pub authorization: Option<&'a HeaderValue>,
}

/// A raw answer: status and body.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// The status code.
    pub status: StatusCode,
    /// The whole body (at most 1 MiB).
    pub body: Bytes,
}

/// Why a probe did not give the expected answer.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum ProbeError {
    /// No connection: refused, unreachable, or the connect timed out. vLLM and Ollama look like
    /// this while they start (the port is bound but not listening).
    #[error("connect failed: {0}")]
    Connect(String),
    /// No complete answer within the probe timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The exchange failed after connecting (reset, malformed response, body too large).
    #[error("request failed: {0}")]
    Failed(String),
    /// An answer, but not a success.
    #[error("HTTP {status}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Status {
        /// The status code.
        status: StatusCode,
        /// The engine's own message, when its error body carries one.
        message: Option<String>,
    },
    /// A success whose body is not what this kind of server sends.
    #[error("unexpected answer: {0}")]
    Parse(String),
}

impl ProbeError {
    /// Whether nothing answered at all (as opposed to an answer that was not healthy).
    pub fn is_connect(&self) -> bool {
        matches!(self, ProbeError::Connect(_))
    }
}

/// The probing client. Cheap to clone (clones share the connection pool).
#[derive(Debug, Clone)]
pub struct Prober {
    client: Client<HttpConnector, Empty<Bytes>>,
    timeout: Duration,
}

impl Prober {
    /// A client whose every exchange (connect included) must complete within `timeout`.
    /// Needs a Tokio runtime.
    pub fn new(timeout: Duration) -> Self {
        // No connect timeout of its own: the exchange's timeout covers the connect too.
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Self { client, timeout }
    }

    /// The per-exchange timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The same client (sharing its connections) with another timeout: a reload may change
    /// `health_check_timeout`.
    #[must_use]
    pub fn with_timeout(&self, timeout: Duration) -> Self {
        Self {
            client: self.client.clone(),
            timeout,
        }
    }

    /// `GET path` (after the upstream's path prefix); any status is returned.
    pub async fn get(&self, target: ProbeTarget<'_>, path: &str) -> Result<Fetched, ProbeError> {
        let uri = target
            .base
            .uri_for(Some(&path.parse().map_err(|e| {
                ProbeError::Failed(format!("invalid probe path {path:?}: {e}"))
            })?))
            .map_err(|e| ProbeError::Failed(format!("building the probe URI: {e}")))?;
        let mut req = Request::get(uri)
            .body(Empty::new())
            .map_err(|e| ProbeError::Failed(format!("building the probe request: {e}")))?;
        req.headers_mut().insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("slotgate/", env!("CARGO_PKG_VERSION"), " probe")),
        );
        if let Some(authorization) = target.authorization {
            req.headers_mut()
                .insert(header::AUTHORIZATION, authorization.clone());
        }
        let exchange = async {
            let response = self.client.request(req).await.map_err(|error| {
                let text = chain(&error);
                if error.is_connect() {
                    ProbeError::Connect(text)
                } else {
                    ProbeError::Failed(text)
                }
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_PROBE_BODY)
                .collect()
                .await
                .map_err(|e| ProbeError::Failed(format!("reading the answer: {e}")))?
                .to_bytes();
            Ok(Fetched { status, body })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_elapsed| ProbeError::Timeout(self.timeout))?
    }

    /// `GET path`, which must answer 2xx; the body is returned.
    pub async fn get_ok(&self, target: ProbeTarget<'_>, path: &str) -> Result<Bytes, ProbeError> {
        let fetched = self.get(target, path).await?;
        if fetched.status.is_success() {
            Ok(fetched.body)
        } else {
            Err(ProbeError::Status {
                status: fetched.status,
                message: error_message(&fetched.body),
            })
        }
    }

    /// `GET path`, which must answer 2xx with JSON of type `T`.
    pub async fn get_json<T: DeserializeOwned>(
        &self,
        target: ProbeTarget<'_>,
        path: &str,
    ) -> Result<T, ProbeError> {
        let body = self.get_ok(target, path).await?;
        serde_json::from_slice(&body).map_err(|e| ProbeError::Parse(format!("{path}: {e}")))
    }

    // === llama-server ===

    /// llama-server `GET /health`: 200 once ready. While the model loads every path answers
    /// 503 `Loading model`, which is a [`ProbeError::Status`] here: not healthy yet.
    pub async fn llama_health(&self, target: ProbeTarget<'_>) -> Result<(), ProbeError> {
        self.get_ok(target, "/health").await.map(drop)
    }

    /// llama-server `GET /models`: in router mode every known model with its `status`; a
    /// single-model server lists its one model without a status.
    pub async fn llama_models(&self, target: ProbeTarget<'_>) -> Result<ModelList, ProbeError> {
        self.get_json(target, "/models").await
    }

    // === vLLM ===

    /// vLLM `GET /health`: 200 with an empty body; 503 when the engine is dead. While the model
    /// loads the port refuses connections.
    pub async fn vllm_health(&self, target: ProbeTarget<'_>) -> Result<(), ProbeError> {
        self.get_ok(target, "/health").await.map(drop)
    }

    // === Ollama ===

    /// Ollama `GET /`: 200 `Ollama is running`.
    pub async fn ollama_alive(&self, target: ProbeTarget<'_>) -> Result<(), ProbeError> {
        self.get_ok(target, "/").await.map(drop)
    }

    /// Ollama `GET /api/ps`: the models resident now.
    pub async fn ollama_ps(&self, target: ProbeTarget<'_>) -> Result<OllamaPs, ProbeError> {
        self.get_json(target, "/api/ps").await
    }

    // === any OpenAI-compatible server ===

    /// `GET /v1/models`: the served models (vLLM lists its served names and `LoRA` adapters).
    pub async fn openai_models(&self, target: ProbeTarget<'_>) -> Result<ModelList, ProbeError> {
        self.get_json(target, "/v1/models").await
    }
}

// === answers ===

/// An OpenAI-style model list (`{"object":"list","data":[…]}`), as llama-server, vLLM and
/// OpenAI-compatible servers send it.
#[derive(Debug, Clone, Default, Deserialize)]
#[non_exhaustive]
pub struct ModelList {
    /// The models.
    #[serde(default)]
    pub data: Vec<ModelCard>,
}

/// One entry of a [`ModelList`].
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct ModelCard {
    /// The model's id (what clients send as `model`).
    pub id: String,
    /// Other names the server accepts for it (llama-server `--alias`). Non-string entries are
    /// ignored.
    #[serde(default, deserialize_with = "strings")]
    pub aliases: Vec<String>,
    /// llama-server router mode only: where the model is in its life.
    #[serde(default)]
    pub status: Option<ModelStatus>,
}

impl ModelCard {
    /// The id and every alias.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.id.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// llama-server router's `status` of a model.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct ModelStatus {
    /// `unloaded`, `loading`, `loaded`, `sleeping`, `downloading` or `downloaded`.
    pub value: String,
    /// Set (with `value: "unloaded"`) when the last load failed.
    #[serde(default)]
    pub failed: bool,
}

/// Ollama's `/api/ps`.
#[derive(Debug, Clone, Default, Deserialize)]
#[non_exhaustive]
pub struct OllamaPs {
    /// The resident models.
    #[serde(default)]
    pub models: Vec<OllamaModel>,
}

/// One resident Ollama model.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub struct OllamaModel {
    /// `name:tag`, e.g. `mistral:latest`.
    pub name: String,
    /// Usually the same as `name`.
    #[serde(default)]
    pub model: Option<String>,
}

/// A list whose non-string entries are skipped (llama-server builds differ in what `aliases`
/// holds; a residency probe must not fail over it).
fn strings<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<String>, D::Error> {
    let values: Option<Vec<serde_json::Value>> = Option::deserialize(deserializer)?;
    Ok(values
        .unwrap_or_default()
        .into_iter()
        .filter_map(|value| match value {
            serde_json::Value::String(text) => Some(text),
            _ => None,
        })
        .collect())
}

/// The message of an error body: `{"error":{"message":…}}` (llama-server, vLLM, OpenAI),
/// `{"error":"…"}` (Ollama native), `{"message":…}` (older vLLM); else a short plain-text body.
fn error_message(body: &Bytes) -> Option<String> {
    const MAX: usize = 200;
    let text = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(json) => json
            .pointer("/error/message")
            .or_else(|| json.get("error"))
            .or_else(|| json.get("message"))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)?,
        Err(_) => String::from_utf8_lossy(body).trim().to_owned(),
    };
    (!text.is_empty()).then(|| text.chars().take(MAX).collect())
}

/// An error and its sources, `: `-separated.
fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::{ModelList, OllamaPs, error_message};

    #[test]
    fn parses_a_router_listing() {
        let list: ModelList = serde_json::from_str(
            r#"{"object":"list","data":[
              {"id":"ggml-org/gemma-3-4b-it-GGUF:Q4_K_M","aliases":[],"tags":[],"object":"model",
               "owned_by":"llamacpp","created":1735142223,"source":"cache","can_remove":true,
               "architecture":{"input_modalities":["text","image"],"output_modalities":["text"]},
               "status":{"value":"loaded","args":["llama-server","-ctx","4096"]}},
              {"id":"other","status":{"value":"unloaded","failed":true,"exit_code":1}}]}"#,
        )
        .unwrap();
        assert_eq!(list.data.len(), 2);
        assert_eq!(list.data[0].status.as_ref().unwrap().value, "loaded");
        assert!(list.data[1].status.as_ref().unwrap().failed);
    }

    #[test]
    fn parses_a_single_model_llama_listing_and_odd_aliases() {
        let list: ModelList = serde_json::from_str(
            r#"{"object":"list","models":[{"name":"m"}],
                "data":[{"id":"m","aliases":["m2",7,null],"meta":null}]}"#,
        )
        .unwrap();
        let card = &list.data[0];
        assert!(card.status.is_none());
        assert_eq!(card.names().collect::<Vec<_>>(), ["m", "m2"]);
        let list: ModelList =
            serde_json::from_str(r#"{"data":[{"id":"m","aliases":null}]}"#).expect("null aliases");
        assert!(list.data[0].aliases.is_empty());
    }

    #[test]
    fn parses_vllm_and_ollama_listings() {
        let list: ModelList = serde_json::from_str(
            r#"{"object":"list","data":[{"id":"served-name","object":"model","created":1700000000,
              "owned_by":"vllm","root":"/models/x","parent":null,"max_model_len":32768,
              "permission":[{"object":"model_permission"}]}]}"#,
        )
        .unwrap();
        assert_eq!(list.data[0].id, "served-name");
        let ps: OllamaPs = serde_json::from_str(
            r#"{"models":[{"name":"mistral:latest","model":"mistral:latest","size":5137025024,
              "digest":"2ae6","details":{"format":"gguf"},"expires_at":"2024-06-04T14:38:31.83753-07:00",
              "size_vram":5137025024,"context_length":4096}]}"#,
        )
        .unwrap();
        assert_eq!(ps.models[0].name, "mistral:latest");
        let empty: OllamaPs = serde_json::from_str(r#"{"models":[]}"#).unwrap();
        assert!(empty.models.is_empty());
    }

    #[test]
    fn error_messages_come_out_of_every_envelope() {
        let message = |body: &'static str| error_message(&Bytes::from_static(body.as_bytes()));
        assert_eq!(
            message(
                r#"{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}"#
            )
            .as_deref(),
            Some("Loading model")
        );
        assert_eq!(
            message(r#"{"error":"server busy"}"#).as_deref(),
            Some("server busy")
        );
        assert_eq!(
            message(r#"{"object":"error","message":"old vllm"}"#).as_deref(),
            Some("old vllm")
        );
        assert_eq!(message("").as_deref(), None);
        assert_eq!(message(" bad gateway\n").as_deref(), Some("bad gateway"));
        assert_eq!(message(r#"{"other":1}"#), None);
    }
}
