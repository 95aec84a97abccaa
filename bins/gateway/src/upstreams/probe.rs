//! Typed `GET`s against an upstream's own endpoints: health, resident models, and whatever else
//! the gateway learns from an engine (slot counts, for instance, build on the same pieces).
//!
//! [`Prober`] runs all of them, each through its upstream's probe client
//! ([`UpstreamState::probe_client`](crate::upstreams::state::UpstreamState::probe_client): the
//! same TLS settings as the request path). That client is separate from the request path's
//! pooled one on purpose: a probe must never wait behind, or take a pooled connection from,
//! client traffic, and its timeout covers the *whole* exchange (connect, head and body), where a
//! client request may legitimately stream for minutes. It keeps no idle connections: every probe
//! opens a fresh one, so a check also proves that the engine still *accepts* connections (a
//! reused keep-alive connection would hide a listener that stopped accepting). One connect per
//! upstream per interval costs nothing.
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
use serde::Deserialize;
use serde::de::DeserializeOwned;
use slotgate_exposition::Samples;

use crate::support::base::Base;
use crate::support::error::BoxError;
use crate::tls::{self, Connector};

/// Largest probe answer read: a router listing hundreds of models fits easily; anything larger
/// is not an answer to a probe.
const MAX_PROBE_BODY: usize = 1024 * 1024;

/// An upstream as a probe sees it: where it is, and the bearer token it wants, if any.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProbeTarget<'a> {
    /// The upstream's probe client (its TLS settings, no idle connections).
    pub(crate) client: &'a Client<Connector, Empty<Bytes>>,
    /// Scheme, authority and path prefix.
    pub(crate) base: &'a Base,
    /// `Authorization` to send (the upstream's `api_key`); vLLM's `--api-key` guards `/v1/*`.
    pub(crate) authorization: Option<&'a HeaderValue>,
}

/// A raw answer: status and body.
#[derive(Debug, Clone)]
pub(crate) struct Fetched {
    /// The status code.
    pub(crate) status: StatusCode,
    /// The whole body (at most 1 MiB).
    pub(crate) body: Bytes,
}

/// Why a probe did not give the expected answer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum ProbeError {
    /// The probe request could not be built from the upstream URL and `path`.
    #[error("cannot build the probe request for {path:?}")]
    Request {
        /// The probed path.
        path: String,
        /// Why.
        #[source]
        source: http::Error,
    },
    /// No connection: refused, unreachable, or the connect timed out. vLLM and Ollama look like
    /// this while they start (the port is bound but not listening).
    #[error("connect failed")]
    Connect(#[source] hyper_util::client::legacy::Error),
    /// The TLS handshake failed: a certificate that does not verify, a client certificate the
    /// upstream refused, a peer that does not speak TLS.
    #[error("TLS handshake failed")]
    Tls(#[source] hyper_util::client::legacy::Error),
    /// No complete answer within the probe timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The exchange failed after connecting (reset, malformed response).
    #[error("request failed")]
    Exchange(#[source] hyper_util::client::legacy::Error),
    /// The answer's body could not be read whole (cut, or over the size limit).
    #[error("reading the answer failed")]
    Body(#[source] BoxError),
    /// An answer, but not a success.
    #[error("HTTP {status}{}", message.as_deref().map(|m| format!(": {m}")).unwrap_or_default())]
    Status {
        /// The status code.
        status: StatusCode,
        /// The engine's own message, when its error body carries one.
        message: Option<String>,
    },
    /// A success whose body is not text.
    #[error("unexpected answer: {path}: not UTF-8")]
    NotText {
        /// The probed path.
        path: String,
        /// Why.
        #[source]
        source: std::str::Utf8Error,
    },
    /// A success whose JSON is not what this kind of server sends.
    #[error("unexpected answer: {path}")]
    Json {
        /// The probed path.
        path: String,
        /// Why.
        #[source]
        source: serde_json::Error,
    },
    /// A metrics exposition without a series the reading needs.
    #[error("unexpected answer: {path} has no {metric}")]
    MissingMetric {
        /// The probed path.
        path: &'static str,
        /// The series.
        metric: &'static str,
    },
}

/// Runs probes under a timeout. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct Prober {
    timeout: Duration,
}

impl Prober {
    /// A prober whose every exchange (connect included) must complete within `timeout`.
    pub(crate) fn new(timeout: Duration) -> Self {
        Self { timeout }
    }

    /// The same with another timeout: a reload may change `health_check_timeout`.
    #[must_use]
    #[expect(
        clippy::unused_self,
        reason = "kept a method so that callers holding a Prober need not change; the timeout \
                  is all a Prober carries since each upstream has its own client"
    )]
    pub(crate) fn with_timeout(&self, timeout: Duration) -> Self {
        Self { timeout }
    }

    /// `GET path` (after the upstream's path prefix); any status is returned.
    pub(crate) async fn get(
        &self,
        target: ProbeTarget<'_>,
        path: &str,
    ) -> Result<Fetched, ProbeError> {
        let request_error = |source: http::Error| ProbeError::Request {
            path: path.to_owned(),
            source,
        };
        let path_and_query = path
            .parse()
            .map_err(|e: http::uri::InvalidUri| request_error(e.into()))?;
        let uri = target
            .base
            .uri_for(Some(&path_and_query))
            .map_err(request_error)?;
        let mut req = Request::get(uri)
            .body(Empty::new())
            .map_err(request_error)?;
        req.headers_mut().insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("slotgate/", env!("CARGO_PKG_VERSION"), " probe")),
        );
        if let Some(authorization) = target.authorization {
            req.headers_mut()
                .insert(header::AUTHORIZATION, authorization.clone());
        }
        let exchange = async {
            let response = target.client.request(req).await.map_err(|error| {
                if tls::is_tls_failure(&error) {
                    ProbeError::Tls(error)
                } else if error.is_connect() {
                    ProbeError::Connect(error)
                } else {
                    ProbeError::Exchange(error)
                }
            })?;
            let status = response.status();
            let body = Limited::new(response.into_body(), MAX_PROBE_BODY)
                .collect()
                .await
                .map_err(ProbeError::Body)?
                .to_bytes();
            Ok(Fetched { status, body })
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_elapsed| ProbeError::Timeout(self.timeout))?
    }

    /// `GET path`, which must answer 2xx; the body is returned.
    pub(crate) async fn get_ok(
        &self,
        target: ProbeTarget<'_>,
        path: &str,
    ) -> Result<Bytes, ProbeError> {
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

    /// `GET path`, which must answer 2xx with a Prometheus text exposition, read leniently (a
    /// line that is not a sample is skipped; see [`slotgate_exposition`]).
    pub(crate) async fn metrics(
        &self,
        target: ProbeTarget<'_>,
        path: &str,
    ) -> Result<Samples, ProbeError> {
        let body = self.get_ok(target, path).await?;
        decode_metrics(path, &body)
    }

    /// `GET path`, which must answer 2xx with JSON of type `T`.
    pub(crate) async fn get_json<T: DeserializeOwned>(
        &self,
        target: ProbeTarget<'_>,
        path: &str,
    ) -> Result<T, ProbeError> {
        let body = self.get_ok(target, path).await?;
        decode_json(path, &body)
    }

    // === llama-server ===

    /// llama-server `GET /health`: 200 once ready. While the model loads every path answers
    /// 503 `Loading model`, which is a [`ProbeError::Status`] here: not healthy yet.
    pub(crate) async fn llama_health(&self, target: ProbeTarget<'_>) -> Result<(), ProbeError> {
        self.get_ok(target, "/health").await.map(drop)
    }

    /// llama-server `GET /models`: in router mode every known model with its `status`; a
    /// single-model server lists its one model without a status.
    pub(crate) async fn llama_models(
        &self,
        target: ProbeTarget<'_>,
    ) -> Result<ModelList, ProbeError> {
        self.get_json(target, "/models").await
    }

    /// llama-server `GET /props` for `model`: its slot count (`total_slots`, = `--parallel`).
    /// A router needs `?model=`; a single-model server ignores the query. `autoload=false`: a
    /// probe must not make a router load a model (it answers 400 `model is not loaded`).
    pub(crate) async fn llama_props(
        &self,
        target: ProbeTarget<'_>,
        model: &str,
    ) -> Result<LlamaProps, ProbeError> {
        self.get_json(target, &model_query("/props", model)).await
    }

    /// llama-server router's own `GET /props` (no `?model=`: it loads nothing): its role and
    /// `max_instances` (`--models-max`).
    pub(crate) async fn llama_router_props(
        &self,
        target: ProbeTarget<'_>,
    ) -> Result<RouterProps, ProbeError> {
        self.get_json(target, "/props").await
    }

    /// llama-server `GET /slots` for `model` (see [`Prober::llama_props`] for the query): one
    /// entry per slot. 501 when the server runs with `--no-slots`.
    pub(crate) async fn llama_slots(
        &self,
        target: ProbeTarget<'_>,
        model: &str,
    ) -> Result<Vec<LlamaSlot>, ProbeError> {
        self.get_json(target, &model_query("/slots", model)).await
    }

    /// llama-server `GET /metrics` for `model` (needs `--metrics`; 501 otherwise), parsed.
    pub(crate) async fn llama_metrics(
        &self,
        target: ProbeTarget<'_>,
        model: &str,
    ) -> Result<Samples, ProbeError> {
        self.metrics(target, &model_query("/metrics", model)).await
    }

    // === vLLM ===

    /// vLLM `GET /health`: 200 with an empty body; 503 when the engine is dead. While the model
    /// loads the port refuses connections.
    pub(crate) async fn vllm_health(&self, target: ProbeTarget<'_>) -> Result<(), ProbeError> {
        self.get_ok(target, "/health").await.map(drop)
    }

    /// vLLM `GET /metrics`, parsed (`vllm:num_requests_running`, `vllm:num_requests_waiting`,
    /// labelled by `model_name`).
    pub(crate) async fn vllm_metrics(
        &self,
        target: ProbeTarget<'_>,
    ) -> Result<Samples, ProbeError> {
        self.metrics(target, "/metrics").await
    }

    // === Ollama ===

    /// Ollama `GET /`: 200 `Ollama is running`.
    pub(crate) async fn ollama_alive(&self, target: ProbeTarget<'_>) -> Result<(), ProbeError> {
        self.get_ok(target, "/").await.map(drop)
    }

    /// Ollama `GET /api/ps`: the models resident now.
    pub(crate) async fn ollama_ps(&self, target: ProbeTarget<'_>) -> Result<OllamaPs, ProbeError> {
        self.get_json(target, "/api/ps").await
    }

    // === any OpenAI-compatible server ===

    /// `GET /v1/models`: the served models (vLLM lists its served names and `LoRA` adapters).
    pub(crate) async fn openai_models(
        &self,
        target: ProbeTarget<'_>,
    ) -> Result<ModelList, ProbeError> {
        self.get_json(target, "/v1/models").await
    }
}

// === answers ===

/// An OpenAI-style model list (`{"object":"list","data":[…]}`), as llama-server, vLLM and
/// OpenAI-compatible servers send it.
#[derive(Debug, Clone, Default, Deserialize)]
#[non_exhaustive]
pub(crate) struct ModelList {
    /// The models.
    #[serde(default)]
    pub(crate) data: Vec<ModelCard>,
}

/// One entry of a [`ModelList`].
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub(crate) struct ModelCard {
    /// The model's id (what clients send as `model`).
    pub(crate) id: String,
    /// Other names the server accepts for it (llama-server `--alias`). Non-string entries are
    /// ignored.
    #[serde(default, deserialize_with = "strings")]
    pub(crate) aliases: Vec<String>,
    /// llama-server router mode only: where the model is in its life.
    #[serde(default)]
    pub(crate) status: Option<ModelStatus>,
}

impl ModelCard {
    /// The id and every alias.
    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.id.as_str()).chain(self.aliases.iter().map(String::as_str))
    }
}

/// llama-server router's `status` of a model.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub(crate) struct ModelStatus {
    /// `unloaded`, `loading`, `loaded`, `sleeping`, `downloading` or `downloaded`.
    pub(crate) value: String,
    /// Set on an `unloaded` model whose last load failed (with its `exit_code`).
    #[serde(default)]
    pub(crate) failed: bool,
}

/// A llama-server router's own `/props` (server-models.cpp `get_router_props`).
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub(crate) struct RouterProps {
    /// `--models-max`: models running at once; 0 means no bound. Absent on a single-model
    /// server.
    #[serde(default)]
    pub(crate) max_instances: Option<usize>,
}

/// Ollama's `/api/ps`.
#[derive(Debug, Clone, Default, Deserialize)]
#[non_exhaustive]
pub(crate) struct OllamaPs {
    /// The resident models.
    #[serde(default)]
    pub(crate) models: Vec<OllamaModel>,
}

/// One resident Ollama model.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub(crate) struct OllamaModel {
    /// `name:tag`, e.g. `mistral:latest`.
    pub(crate) name: String,
    /// Usually the same as `name`.
    #[serde(default)]
    pub(crate) model: Option<String>,
    /// When its `keep_alive` ends and Ollama unloads it (RFC 3339).
    #[serde(default)]
    pub(crate) expires_at: Option<String>,
}

/// llama-server's `/props`, the part the gateway reads.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub(crate) struct LlamaProps {
    /// The server's slots (`--parallel`). Required: a `/props` without it is not one this
    /// gateway can take a slot count from.
    pub(crate) total_slots: usize,
}

/// One entry of llama-server's `/slots`.
#[derive(Debug, Clone, Deserialize)]
#[non_exhaustive]
pub(crate) struct LlamaSlot {
    /// Whether the slot is running a task now (its other members come and go across builds).
    pub(crate) is_processing: bool,
}

/// A 2xx body of `GET path` read as a Prometheus text exposition: it must be UTF-8; lines that
/// are not samples are skipped (separate from [`Prober::metrics`] so the fuzz targets drive this
/// very code).
pub(crate) fn decode_metrics(path: &str, body: &[u8]) -> Result<Samples, ProbeError> {
    let text = std::str::from_utf8(body).map_err(|source| ProbeError::NotText {
        path: path.to_owned(),
        source,
    })?;
    Ok(Samples::parse(text))
}

/// A 2xx body of `GET path` read as JSON of type `T`.
pub(crate) fn decode_json<T: DeserializeOwned>(path: &str, body: &[u8]) -> Result<T, ProbeError> {
    serde_json::from_slice(body).map_err(|source| ProbeError::Json {
        path: path.to_owned(),
        source,
    })
}

/// `path?model=NAME&autoload=false`, the name percent-encoded.
fn model_query(path: &str, model: &str) -> String {
    let name: String = url::form_urlencoded::byte_serialize(model.as_bytes()).collect();
    format!("{path}?model={name}&autoload=false")
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
pub(crate) fn error_message(body: &[u8]) -> Option<String> {
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::{
        LlamaProps, LlamaSlot, ModelList, OllamaPs, decode_json, error_message, model_query,
    };

    /// Found by the `engine_json` fuzz target: `serde_json` does not check UTF-8 inside a string
    /// it skips, so an answer with a bad byte in a member the gateway ignores is read (harmless:
    /// nothing of it is kept), while a bad byte in a member it keeps is refused.
    #[test]
    fn skipped_members_are_not_checked_for_utf8() {
        let skipped = b"{\"models\":[{\"name\":\"m:latest\",\"digest\":\"14:3\xf8\"}]}";
        let ps: OllamaPs = decode_json("/api/ps", skipped).expect("read");
        assert_eq!(ps.models[0].name, "m:latest");
        let kept = b"{\"models\":[{\"name\":\"m\xf8\"}]}";
        assert!(decode_json::<OllamaPs>("/api/ps", kept).is_err());
    }

    /// Found by the same target: a number too large for an `f64` in a member the gateway skips
    /// does not refuse the answer either.
    #[test]
    fn skipped_members_are_not_checked_for_range() {
        let listing = br#"{"data":[{"id":"m","created":4.1e11111125}]}"#;
        let list: ModelList = decode_json("/v1/models", listing).expect("read");
        assert_eq!(list.data[0].id, "m");
        assert!(serde_json::from_slice::<serde_json::Value>(listing).is_err());
    }

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
        assert_eq!(list.data[1].status.as_ref().unwrap().value, "unloaded");
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
    fn parses_llama_props_and_slots_as_the_real_server_sends_them() {
        let props: LlamaProps = serde_json::from_str(
            r#"{"default_generation_settings":{"n_ctx":512},"total_slots":2,
                "model_alias":"tiny","build_info":"b1-0c1e570","is_sleeping":false}"#,
        )
        .unwrap();
        assert_eq!(props.total_slots, 2);
        assert!(serde_json::from_str::<LlamaProps>(r#"{"model_alias":"x"}"#).is_err());
        let slots: Vec<LlamaSlot> = serde_json::from_str(
            r#"[{"id":0,"n_ctx":512,"speculative":false,"is_processing":false},
                {"id":1,"n_ctx":512,"is_processing":true,"id_task":7,
                 "next_token":[{"has_next_token":true,"n_decoded":3}]}]"#,
        )
        .unwrap();
        assert_eq!(slots.iter().filter(|s| s.is_processing).count(), 1);
        assert_eq!(
            model_query("/props", "qwen2.5:7b instruct"),
            "/props?model=qwen2.5%3A7b+instruct&autoload=false"
        );
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
