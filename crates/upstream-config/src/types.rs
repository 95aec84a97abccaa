//! The validated configuration: what the gateway reads. The whole [`Config`], and the types of
//! the tables read by hand (`[upstreams.NAME]`, a model's limits); the tables declared key by
//! key have their types with their declarations (`server`, `cluster`, `queueing`).
//!
//! Values of these types only come out of the validation pass (the structs are
//! `#[non_exhaustive]`, so they cannot be built by hand outside this crate), so the gateway can
//! rely on every rule in the [crate docs](crate) holding.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use url::Url;

use crate::cluster::Cluster;
use crate::queueing::Queueing;
use crate::secret::Secret;
use crate::server::Server;
use crate::values::CertAndKey;

// ===== Config =====

/// A validated slotgate configuration.
///
/// Obtain one with [`Config::load`] (TOML file + `SLOTGATE_` environment),
/// [`Config::from_toml_str`] or [`Config::from_figment`]; every rule has been checked by then.
///
/// ```
/// use slotgate_config::{Config, ModelLimits};
/// use std::time::Duration;
///
/// let config = Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8080"
///
///     [aliases]
///     chat = "reasoning"
///
///     [upstreams.reasoning]
///     url = "http://reasoning-predictor.llm-serving:80"
///     kind = "vllm"
///
///     [upstreams.reasoning.models.reasoning]
///     parallel = 6
///     queue = 8
///     queue_timeout = "30s"
/// "#)?;
///
/// // Aliases resolve to a configured model; unknown names resolve to nothing (a 404).
/// assert_eq!(config.resolve_model("chat"), Some("reasoning"));
/// assert_eq!(config.resolve_model("reasoning"), Some("reasoning"));
/// assert_eq!(config.resolve_model("gpt-4"), None);
///
/// // The limiter key is the authority, with the scheme's default port made explicit.
/// let upstream = &config.candidates("reasoning")[0];
/// assert_eq!(upstream.authority(), "http://reasoning-predictor.llm-serving:80");
/// assert_eq!(
///     upstream.models["reasoning"],
///     ModelLimits::Limited {
///         parallel: 6,
///         queue: 8,
///         queue_timeout: Duration::from_secs(30),
///         capacity: None,
///     },
/// );
///
/// // Defaults are filled in, and visible in the effective config that `slotgate check` prints.
/// assert_eq!(config.server.admin_listen, None);
/// assert!(config.to_effective_toml().contains("first_byte_timeout = \"5m\""));
/// # Ok::<(), slotgate_config::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Config {
    /// The `[server]` table: listeners, timeouts, limits, client authentication.
    pub server: Server,
    /// The `[upstreams.NAME]` tables, by name. At least one.
    pub upstreams: BTreeMap<String, Upstream>,
    /// The `[aliases]` table: client-facing name → configured model name. Possibly empty.
    pub aliases: BTreeMap<String, String>,
    /// The `[cluster]` table: several gateway replicas share each (upstream, model) cap and
    /// queue through Redis. `None`: each gateway keeps its own caps, in process.
    pub cluster: Option<Cluster>,
}

impl Config {
    /// The configured model a client-supplied `model` names: itself when it is a configured
    /// model, its target when it is an alias, `None` when it is neither.
    pub fn resolve_model(&self, name: &str) -> Option<&str> {
        if let Some(target) = self.aliases.get(name) {
            return Some(target);
        }
        self.upstreams
            .values()
            .find_map(|upstream| upstream.models.get_key_value(name))
            .map(|(model, _)| model.as_str())
    }

    /// The upstreams that configure `model` (a model name, not an alias: see
    /// [`Config::resolve_model`]), in upstream-name order. Empty when none does.
    pub fn candidates(&self, model: &str) -> Vec<&Upstream> {
        self.upstreams
            .values()
            .filter(|upstream| upstream.models.contains_key(model))
            .collect()
    }

    /// Every configured model name, each once, sorted (for `/v1/models`).
    pub fn model_names(&self) -> BTreeSet<&str> {
        self.upstreams
            .values()
            .flat_map(|upstream| upstream.models.keys().map(String::as_str))
            .collect()
    }
}

// ===== Upstream =====

/// One `[upstreams.NAME]` table: an inference engine and the models it serves.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Upstream {
    /// The table's name (`NAME`), used in logs and metrics.
    pub name: String,
    /// Base URL: http or https, with a host, no query, fragment or credentials. A path prefix
    /// (e.g. `/openai` for a `KServe` predictor) is kept; see [`Upstream::path_prefix`].
    pub url: Url,
    /// What software answers there; decides health checks and residency discovery.
    pub kind: Kind,
    /// Relative preference among candidates: finite and > 0 (default 1.0).
    pub weight: f64,
    /// Bearer token the gateway sends to this upstream, replacing the client's.
    pub api_key: Option<Secret>,
    /// How long a slot stays taken after its client went away before the response head arrived
    /// (default [`Kind::default_cancel_grace`]; zero gives it back at once).
    ///
    /// The gateway closes its connection to the engine at once either way; the grace covers the
    /// time the engine needs to *notice* and stop: a llama-server only checks a non-streamed
    /// request's connection about once a second, and a slot handed on before that would make it
    /// queue the next request itself.
    pub cancel_grace: Duration,
    /// Longest silence allowed between two frames of a response body once its head has
    /// arrived (default [`Upstream::DEFAULT_STREAM_IDLE_TIMEOUT`]). Past it the gateway ends the
    /// answer (a stream with an `error` event) and gives the slot back after `cancel_grace`: a
    /// hung engine, or a dead host without a FIN, cannot pin a slot.
    pub stream_idle_timeout: Duration,
    /// Longest one answer may run, from when its request was sent to the engine to its last
    /// byte (default [`Upstream::DEFAULT_STREAM_TIMEOUT`]; `None`, written `"none"`: no bound
    /// but `stream_idle_timeout`). Past it the gateway ends the answer as after a stall, with a
    /// `stream-timeout` problem.
    pub stream_timeout: Option<Duration>,
    /// Whether the routes that change the engine's disk (Ollama's `/api/pull`, `/api/push`,
    /// `/api/create`, `/api/delete`, `/api/copy`) may be sent here (default `false`: a client of
    /// the gateway should not be able to fill or empty an engine's disk).
    pub allow_model_management: bool,
    /// `ca_file`: PEM certificates trusted for this (`https`) upstream in addition to the
    /// system's roots, for engines behind a private CA.
    pub ca_file: Option<PathBuf>,
    /// `client_cert` / `client_key`: the certificate the gateway presents to this (`https`)
    /// upstream (mutual TLS).
    pub client_identity: Option<CertAndKey>,
    /// Slots of the engine as a whole, shared by all the models served here (`None`, the
    /// default: no engine-wide cap, each model is capped on its own). For an engine whose
    /// models draw on one pool of sequences: vLLM's `LoRA` adapters, a llama-server router. A
    /// request then needs its slots free both under its model's `parallel` and under this.
    pub parallel: Option<usize>,
    /// How many models the engine holds in memory at once (`None`, the default: what the engine
    /// reports, a llama-server router's `max_instances`, its `--models-max`; an engine that
    /// reports nothing is not bounded). Set it for engines that load on demand without saying
    /// how many fit: Ollama (`OLLAMA_MAX_LOADED_MODELS`), llama-swap. A request for a model that
    /// is not loaded on a full engine then waits in the gateway (bounded by its
    /// `queue_timeout` and deadline) until a loaded model has no request left, instead of
    /// waiting inside the engine.
    pub max_loaded_models: Option<usize>,
    /// How long a request for a model that is not loaded may wait while the loaded model keeps
    /// taking new requests (default [`Upstream::DEFAULT_COLLATE_FOR`]). Past it the loaded model
    /// takes no new request until the swap. Only matters on a bounded engine
    /// ([`Upstream::max_loaded_models`]).
    pub collate_for: Duration,
    /// The models served here and their limits, by model name. At least one.
    pub models: BTreeMap<String, ModelLimits>,
    /// The models whose engine knows them by another name (`engine_model`), by model name;
    /// a model not listed is known by its own name. See [`Upstream::engine_model`].
    pub engine_models: BTreeMap<String, String>,
    /// How each model's queue serves its waiters, by model name; a model not listed (an
    /// unlimited one) has the defaults. See [`Upstream::queueing`].
    pub queueing: BTreeMap<String, Queueing>,
    /// The models whose table says `affinity = "off"`. See [`Upstream::affinity`].
    pub affinity_off: BTreeSet<String>,
}

impl Upstream {
    /// Default [`Upstream::weight`].
    pub const DEFAULT_WEIGHT: f64 = 1.0;
    /// Default [`Upstream::stream_idle_timeout`]: as long as the first-byte timeout, since an
    /// engine that streams its head at once may spend the prompt's prefill before the first token.
    pub const DEFAULT_STREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(300);
    /// Default [`Upstream::stream_timeout`]: one hour, far above any sane generation (32k tokens
    /// at 20 tokens/s take under 30 minutes), yet an engine that trickles a token now and then
    /// cannot hold a slot forever.
    pub const DEFAULT_STREAM_TIMEOUT: Option<Duration> = Some(Duration::from_secs(3600));
    /// Default [`Upstream::collate_for`]: 10 s. A swap costs a model load, seconds on a small
    /// model and up to minutes for a large one on a GPU, and costs it for everyone; serving the
    /// loaded model's requests for a few seconds more saves loads under interleaved traffic.
    /// 10 s stays well under the default `queue_timeout` (30 s), so the waiter still has most
    /// of its queue time left for the swap itself.
    pub const DEFAULT_COLLATE_FOR: Duration = Duration::from_secs(10);

    /// The limiter key: `scheme://host:port`, with the scheme's default port made explicit and
    /// no path (two routes to one engine share its slots). Unique across a [`Config`].
    ///
    /// IPv6 hosts keep their brackets (`http://[::1]:8080`).
    pub fn authority(&self) -> String {
        authority(&self.url)
    }

    /// The URL path without its trailing `/`: `""` for `http://h:80` or `http://h:80/`,
    /// `"/openai"` for `http://h:80/openai/`. The gateway prepends it to the client's path.
    pub fn path_prefix(&self) -> &str {
        self.url.path().trim_end_matches('/')
    }

    /// What this upstream's engine calls the configured `model`: its `engine_model`, or the
    /// name itself. The gateway writes it into the `model` member of requests sent here, and
    /// asks the engine about it (residency, slot counts) by it.
    ///
    /// ```
    /// let config = slotgate_config::Config::from_toml_str(r#"
    ///     [server]
    ///     listen = "127.0.0.1:8080"
    ///
    ///     [upstreams.ollama]
    ///     url = "http://127.0.0.1:11434"
    ///     kind = "ollama"
    ///
    ///     [upstreams.ollama.models.qwen]
    ///     engine_model = "qwen2.5:7b-instruct"
    ///     parallel = 2
    ///     queue = 8
    ///     queue_timeout = "30s"
    ///
    ///     [upstreams.ollama.models.llama]
    ///     parallel = 2
    ///     queue = 8
    ///     queue_timeout = "30s"
    /// "#)?;
    /// let upstream = &config.upstreams["ollama"];
    /// assert_eq!(upstream.engine_model("qwen"), "qwen2.5:7b-instruct");
    /// assert_eq!(upstream.engine_model("llama"), "llama");
    /// # Ok::<(), slotgate_config::ConfigError>(())
    /// ```
    pub fn engine_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.engine_models.get(model).map_or(model, String::as_str)
    }

    /// How `model`'s queue here serves its waiters (the defaults for a model it does not list).
    pub fn queueing(&self, model: &str) -> Queueing {
        self.queueing.get(model).copied().unwrap_or_default()
    }

    /// Whether cache-aware routing may place `model`'s requests (its table does not say
    /// `affinity = "off"`). The gateway turns it off for a model when any upstream's table for
    /// it does.
    pub fn affinity(&self, model: &str) -> bool {
        !self.affinity_off.contains(model)
    }

    /// The limits of `model` here, if this upstream configures it.
    pub fn model(&self, model: &str) -> Option<&ModelLimits> {
        self.models.get(model)
    }
}

/// `scheme://host:port` of a URL the validation pass accepted (so it has a host and a known
/// default port).
pub(crate) fn authority(url: &Url) -> String {
    let host = url.host_str().unwrap_or_default();
    match url.port_or_known_default() {
        Some(port) => format!("{}://{host}:{port}", url.scheme()),
        None => format!("{}://{host}", url.scheme()),
    }
}

// ===== Kind =====

/// The software an upstream runs.
///
/// Adding a kind is deliberately a breaking change: each kind needs its own health check and
/// residency discovery in the gateway, and an exhaustive `match` there is what finds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    /// llama.cpp's `llama-server` (`kind = "llama-server"`).
    LlamaServer,
    /// vLLM's OpenAI-compatible server, including the vLLM runtime of `KServe` (`kind = "vllm"`).
    Vllm,
    /// Ollama (`kind = "ollama"`).
    Ollama,
    /// Any other OpenAI-compatible server: no kind-specific discovery (`kind = "openai"`).
    OpenAi,
}

impl Kind {
    /// Every kind, in documentation order.
    pub const ALL: [Kind; 4] = [Kind::LlamaServer, Kind::Vllm, Kind::Ollama, Kind::OpenAi];

    /// The name used in the configuration file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Kind::LlamaServer => "llama-server",
            Kind::Vllm => "vllm",
            Kind::Ollama => "ollama",
            Kind::OpenAi => "openai",
        }
    }

    /// The default [`Upstream::cancel_grace`] of this kind: how long the engine may take to stop
    /// a request whose client went away before the answer began.
    ///
    /// - `llama-server`: 2 s. It notices a closed connection of a non-streamed request only at
    ///   its next 1 s poll; measured 0.9–1.8 s after the close (`docs/real-engine-notes.md`).
    /// - `vllm`: 0 s. Its API server aborts the request as soon as the client disconnects.
    /// - `ollama`: 0 s. Go's HTTP server cancels the request's context when the connection
    ///   closes, and Ollama passes that context to its runner; not measured here.
    /// - `openai`: 0 s. Nothing is known about the server behind it.
    pub const fn default_cancel_grace(self) -> Duration {
        match self {
            Kind::LlamaServer => Duration::from_secs(2),
            Kind::Vllm | Kind::Ollama | Kind::OpenAi => Duration::ZERO,
        }
    }

    /// The longest a pooled connection to this kind may sit idle before the gateway closes it,
    /// whatever `[server] idle_timeout` says: below the engine's own keep-alive timeout, so that
    /// the gateway never hands a request to a connection the engine is closing at that moment
    /// (the request would be lost with `502 upstream-bad-response`, "connection closed before message
    /// completed", issue #30's affinity benchmark).
    ///
    /// - `llama-server`: 4 s. Its HTTP server, cpp-httplib, closes a keep-alive connection idle
    ///   for `CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND` = 5 s (`vendor/cpp-httplib/httplib.h`;
    ///   llama-server does not change it); one second of margin for a loaded machine.
    /// - `vllm`: 4 s. `vllm serve` runs uvicorn with `timeout_keep_alive` =
    ///   `VLLM_HTTP_TIMEOUT_KEEP_ALIVE`, 5 s unless set (`vllm/envs.py`).
    /// - `openai`: 4 s. The servers most often behind it (`SGLang`, KServe's model server,
    ///   `LiteLLM`) are uvicorn, whose `timeout_keep_alive` is 5 s by default; a connection
    ///   closed early only costs a new TCP connection, one reused while closing costs a request.
    /// - `ollama`: no bound of its own (`idle_timeout` alone): Go's `net/http` server, which
    ///   Ollama starts without an `IdleTimeout`, keeps idle connections open.
    pub const fn max_pool_idle(self) -> Option<Duration> {
        match self {
            Kind::LlamaServer | Kind::Vllm | Kind::OpenAi => Some(Duration::from_secs(4)),
            Kind::Ollama => None,
        }
    }

    /// Whether this kind's server closes a connection right after a chunked (streamed) answer,
    /// although the answer did not say `Connection: close`: a request sent on that connection
    /// at once meets the close and is lost (`502 upstream-bad-response`, "connection closed
    /// before message completed"), so such a connection must not be reused.
    ///
    /// - `llama-server`: yes. Its streamed answers are cpp-httplib chunked content providers that
    ///   end the body (`sink.done()`) and then return `false`, and cpp-httplib's
    ///   `write_content_chunked` takes that `false` as a cancel: the request "fails", so the
    ///   keep-alive loop ends and the socket is closed after the complete answer
    ///   (`tools/server/server-http.cpp` `process_handler_response`, `vendor/cpp-httplib`).
    ///   Seen as 3–6 % of the turns of issue #30's affinity benchmark: each queued request that
    ///   was handed the connection of the stream that had just freed its slot.
    /// - others: no.
    pub const fn closes_after_chunked_answer(self) -> bool {
        matches!(self, Kind::LlamaServer)
    }

    /// The kind with configuration name `name`, exactly as [`Kind::as_str`] spells it.
    pub fn from_name(name: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|kind| kind.as_str() == name)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// ===== ModelLimits =====

/// How many requests for one model on one upstream may run and wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelLimits {
    /// At most `parallel` requests run at once; at most `queue` more wait, first come first
    /// served, each for at most `queue_timeout`; the rest are refused at once.
    Limited {
        /// Concurrent slots handed out (≥ 1, ≤ `capacity` when that is given).
        parallel: usize,
        /// Requests allowed to wait for a slot (may be 0: refuse at once when all slots are
        /// busy).
        queue: usize,
        /// Longest wait for a slot (> 0).
        queue_timeout: Duration,
        /// The engine's real slot count, when the operator stated it (documentation and a
        /// check: `parallel` may not exceed it).
        capacity: Option<usize>,
    },
    /// `parallel = "unlimited"`: the gateway forwards without holding a slot and never queues.
    Unlimited,
    /// `parallel = "auto"` (`kind = "llama-server"` only): like [`ModelLimits::Limited`], with
    /// the slot count the engine itself reports (`total_slots` of its `GET /props`), which the
    /// gateway reads at start and on reload. Until a read succeeds the model is unavailable on
    /// that upstream: there is no fallback count.
    Auto {
        /// Requests allowed to wait for a slot (may be 0).
        queue: usize,
        /// Longest wait for a slot (> 0).
        queue_timeout: Duration,
    },
}

impl ModelLimits {
    /// The configured slot count; `None` when unlimited or discovered (`"auto"`).
    pub fn parallel(&self) -> Option<usize> {
        match self {
            ModelLimits::Limited { parallel, .. } => Some(*parallel),
            ModelLimits::Unlimited | ModelLimits::Auto { .. } => None,
        }
    }

    /// Whether this is [`ModelLimits::Auto`]: the slot count comes from the engine.
    pub fn is_auto(&self) -> bool {
        matches!(self, ModelLimits::Auto { .. })
    }

    /// Whether this is [`ModelLimits::Unlimited`].
    pub fn is_unlimited(&self) -> bool {
        matches!(self, ModelLimits::Unlimited)
    }
}
