//! Server configuration: which server to imitate, how many slots it has, and how it answers by
//! default. Everything here can be overridden per request with the `x-fake-*` headers (see
//! [`crate::headers`]); the failure list and pacing can also be changed at run time on the
//! [`FakeUpstream`](crate::FakeUpstream) handle.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;
use std::time::Duration;

use crate::cache::{CacheSpec, Layout};
use crate::failure::Failure;

/// Which inference server the fake imitates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Kind {
    /// llama.cpp's `llama-server` (single model, or router mode with several).
    LlamaServer,
    /// vLLM's OpenAI-compatible server.
    Vllm,
    /// Ollama.
    Ollama,
}

impl Kind {
    /// The name used on the command line and in slotgate's config (`llama-server`, `vllm`,
    /// `ollama`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::LlamaServer => "llama-server",
            Self::Vllm => "vllm",
            Self::Ollama => "ollama",
        }
    }

    /// The model name used when the configuration names none.
    pub(crate) fn default_model(self) -> &'static str {
        match self {
            Self::LlamaServer | Self::Vllm => "fake-model",
            // Ollama names always carry a tag; a bare name means `:latest`.
            Self::Ollama => "fake-model:latest",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The error for a [`Kind`] name that is not one of `llama-server`, `vllm`, `ollama`.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("unknown upstream kind {0:?} (expected llama-server, vllm or ollama)")]
pub struct UnknownKind(String);

impl FromStr for Kind {
    type Err = UnknownKind;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "llama-server" | "llama" | "llamacpp" => Ok(Self::LlamaServer),
            "vllm" => Ok(Self::Vllm),
            "ollama" => Ok(Self::Ollama),
            other => Err(UnknownKind(other.to_owned())),
        }
    }
}

/// How fast a request is answered once it holds a slot.
///
/// A non-streaming request holds its slot for the whole generation time and then answers at once;
/// a streaming request sends one event per token, `interval` apart.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Pacing {
    /// No waiting at all: every token is ready at once.
    Instant,
    /// The whole generation takes this long, spread evenly over the tokens.
    Hold(Duration),
    /// This many tokens per second.
    TokensPerSecond(f64),
    /// This gap between two consecutive tokens.
    ChunkInterval(Duration),
}

impl Pacing {
    /// The gap between two tokens when `tokens` tokens are generated.
    pub(crate) fn interval(self, tokens: u32) -> Duration {
        match self {
            Self::Hold(total) => total / tokens.max(1),
            Self::TokensPerSecond(tps) if tps.is_finite() && tps > 0.0 => {
                Duration::try_from_secs_f64(1.0 / tps).unwrap_or(Duration::ZERO)
            }
            // A non-finite or non-positive rate means "as fast as possible".
            Self::Instant | Self::TokensPerSecond(_) => Duration::ZERO,
            Self::ChunkInterval(gap) => gap,
        }
    }
}

/// A model the fake knows about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelSpec {
    /// The name clients use in `"model"`.
    pub name: String,
    /// Resident at start. Only meaningful for llama-server router mode and Ollama, where models
    /// load on demand; a single-model llama-server and vLLM always serve their model.
    pub loaded: bool,
}

/// How the fake upstream behaves. Build it with [`FakeConfig::llama_server`],
/// [`FakeConfig::vllm`] or [`FakeConfig::ollama`] and the chainable setters.
///
/// ```
/// use std::time::Duration;
/// use fake_upstream::FakeConfig;
///
/// let config = FakeConfig::llama_server(4)
///     .model("qwen")
///     .tokens(16)
///     .hold(Duration::from_millis(200));
/// assert_eq!(config.parallel, 4);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
// The switches are independent, like the servers' own command-line flags they mirror.
#[allow(clippy::struct_excessive_bools)]
pub struct FakeConfig {
    /// Which server to imitate.
    pub kind: Kind,
    /// Slots per model: llama-server `--parallel`, vLLM `--max-num-seqs`, Ollama
    /// `OLLAMA_NUM_PARALLEL`.
    pub parallel: usize,
    /// The models served. Empty means one model named `fake-model` (`fake-model:latest` for
    /// Ollama). A single-model llama-server takes exactly one; vLLM treats the extra ones as `LoRA`
    /// adapters of the first (they share its `max_num_seqs`).
    pub models: Vec<ModelSpec>,
    /// llama-server router mode: several models, each with its own `parallel` slots, listed by
    /// `GET /models` with a status, loaded on demand.
    pub router: bool,
    /// llama-server router: load an unloaded model when a request names it (`--models-autoload`,
    /// the default). Off gives 400 "model is not loaded".
    pub autoload: bool,
    /// llama-server router `--models-max`, Ollama `OLLAMA_MAX_LOADED_MODELS`: at most this many
    /// models running (loaded or loading) at once; 0 means no bound (the fake's default, so a
    /// test states the bound it exercises; the real router's default is 4). A load past it
    /// first unloads the least recently used model that has no request running or waiting for
    /// it; when there is none, the request waits inside the engine until one becomes idle
    /// (server-models.cpp `server_lru_sched`).
    pub models_max: usize,
    /// llama-server: model an overcommitted unified KV cache. Every request is admitted at once
    /// (no deferral); when more than `parallel` run together, every running request fails with
    /// 500 "Context size has been exceeded." (mid-stream as an error event without `[DONE]`).
    pub collapse: bool,
    /// Ollama `OLLAMA_MAX_QUEUE`: requests waiting beyond this get 503 "server busy".
    pub max_queue: usize,
    /// Context size per slot (llama-server `n_ctx`, vLLM `max_model_len`, Ollama
    /// `context_length`). A prompt of at least this many tokens is refused with the kind's 400.
    pub n_ctx: u32,
    /// Time before the server is ready. llama-server answers every path with 503 "Loading model"
    /// meanwhile; vLLM and Ollama keep the port bound but not listening, so connects are refused.
    pub startup_delay: Duration,
    /// Time to load a model on demand (llama-server router autoload, Ollama).
    pub model_load_delay: Duration,
    /// Completion tokens per answer unless the request says otherwise (`x-fake-tokens`, or a
    /// smaller `max_tokens`).
    pub tokens: u32,
    /// How fast tokens come.
    pub pacing: Pacing,
    /// Failures injected into every inference request that sends no `x-fake-fail` header.
    pub failures: Vec<Failure>,
    /// Serve `/metrics` (llama-server needs `--metrics` for this; the fake enables it by default
    /// because tests want it). Off gives llama-server's 501.
    pub metrics: bool,
    /// Serve llama-server's `/slots` (on by default, like the real server). Off gives 501.
    pub slots_endpoint: bool,
    /// Where to listen. Defaults to `127.0.0.1:0` (an ephemeral port).
    pub listen: SocketAddr,
    /// Remember Responses API answers, so `GET /v1/responses/{id}`, `DELETE`, `.../cancel`,
    /// `.../input_items` and `previous_response_id` find them on this instance (404 on any
    /// other). On by default for vLLM (which needs `VLLM_ENABLE_RESPONSES_API_STORE=1` for it);
    /// off for llama-server and Ollama, whose Responses API is stateless.
    pub responses_store: bool,
    /// Model the engine's prompt cache and report the cached tokens the kind's way (on by
    /// default; see the crate docs). Off: every prompt is computed whole and reported cached 0.
    pub prompt_cache: bool,
    /// Prompt tokens kept besides the slots: llama-server's host-RAM prompt cache (`--cache-ram`;
    /// 0 by default here, 8 GiB on the real server), vLLM's whole prefix cache (262 144 by
    /// default). Ollama keeps only its slots.
    pub cache_tokens: usize,
    /// Prefill time per uncached prompt token, before the first token (0 by default): a test
    /// can see a cache hit answer sooner.
    pub prefill_per_token: Duration,
    /// vLLM `--enable-prompt-tokens-details`: report `usage.prompt_tokens_details.cached_tokens`
    /// (vLLM sends it only when some were cached). llama-server always reports it.
    pub prompt_tokens_details: bool,
    /// Close an HTTP/1 connection right after each streamed (chunked) answer has been written,
    /// without a `Connection: close` header, as llama-server (cpp-httplib) does; JSON answers
    /// keep it. On by default for llama-server, off for vLLM and Ollama.
    pub close_after_stream: bool,
    /// How long after a streamed answer's last byte the connection is closed, with
    /// [`close_after_stream`](Self::close_after_stream) (20 ms by default). The real server's
    /// gap is not measured; it was wide enough for the gateway to send 3-6 % of its queued
    /// requests into it. The fake's default makes that race near certain for a client that
    /// reuses the connection. A request sent in the gap is never read.
    pub close_after_stream_delay: Duration,
}

impl FakeConfig {
    /// A config for `kind` with `parallel` slots and the defaults: 8 tokens, no pacing, no
    /// failures, ready at once, `max_queue` 512, `n_ctx` 4096.
    pub fn new(kind: Kind, parallel: usize) -> Self {
        Self {
            kind,
            parallel,
            models: Vec::new(),
            router: false,
            autoload: true,
            models_max: 0,
            collapse: false,
            max_queue: 512,
            n_ctx: 4096,
            startup_delay: Duration::ZERO,
            model_load_delay: Duration::ZERO,
            tokens: 8,
            pacing: Pacing::Instant,
            failures: Vec::new(),
            metrics: true,
            slots_endpoint: true,
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            responses_store: kind == Kind::Vllm,
            prompt_cache: true,
            cache_tokens: if kind == Kind::Vllm { 262_144 } else { 0 },
            prefill_per_token: Duration::ZERO,
            prompt_tokens_details: false,
            close_after_stream: kind == Kind::LlamaServer,
            close_after_stream_delay: Duration::from_millis(20),
        }
    }

    /// A `llama-server --parallel <parallel>`.
    pub fn llama_server(parallel: usize) -> Self {
        Self::new(Kind::LlamaServer, parallel)
    }

    /// A vLLM server with `--max-num-seqs <max_num_seqs>`.
    pub fn vllm(max_num_seqs: usize) -> Self {
        Self::new(Kind::Vllm, max_num_seqs)
    }

    /// An Ollama with `OLLAMA_NUM_PARALLEL=<num_parallel>`.
    pub fn ollama(num_parallel: usize) -> Self {
        Self::new(Kind::Ollama, num_parallel)
    }

    /// Adds a model that is resident at start.
    #[must_use]
    pub fn model(mut self, name: impl Into<String>) -> Self {
        self.models.push(ModelSpec {
            name: name.into(),
            loaded: true,
        });
        self
    }

    /// Adds a model that is known but not resident at start (router mode, Ollama).
    #[must_use]
    pub fn unloaded_model(mut self, name: impl Into<String>) -> Self {
        self.models.push(ModelSpec {
            name: name.into(),
            loaded: false,
        });
        self
    }

    /// Turns llama-server router mode on or off.
    #[must_use]
    pub fn router(mut self, on: bool) -> Self {
        self.router = on;
        self
    }

    /// Sets router autoload.
    #[must_use]
    pub fn autoload(mut self, on: bool) -> Self {
        self.autoload = on;
        self
    }

    /// Sets the bound on models running at once (`--models-max`, `OLLAMA_MAX_LOADED_MODELS`).
    #[must_use]
    pub fn models_max(mut self, models_max: usize) -> Self {
        self.models_max = models_max;
        self
    }

    /// Turns the unified-KV collapse model on or off (llama-server).
    #[must_use]
    pub fn collapse(mut self, on: bool) -> Self {
        self.collapse = on;
        self
    }

    /// Sets Ollama's `OLLAMA_MAX_QUEUE`.
    #[must_use]
    pub fn max_queue(mut self, max_queue: usize) -> Self {
        self.max_queue = max_queue;
        self
    }

    /// Sets the per-slot context size.
    #[must_use]
    pub fn n_ctx(mut self, n_ctx: u32) -> Self {
        self.n_ctx = n_ctx;
        self
    }

    /// Sets the startup (model load) time of the server.
    #[must_use]
    pub fn startup_delay(mut self, delay: Duration) -> Self {
        self.startup_delay = delay;
        self
    }

    /// Sets the time to load a model on demand.
    #[must_use]
    pub fn model_load_delay(mut self, delay: Duration) -> Self {
        self.model_load_delay = delay;
        self
    }

    /// Sets the default number of completion tokens.
    #[must_use]
    pub fn tokens(mut self, tokens: u32) -> Self {
        self.tokens = tokens;
        self
    }

    /// Sets the pacing.
    #[must_use]
    pub fn pacing(mut self, pacing: Pacing) -> Self {
        self.pacing = pacing;
        self
    }

    /// Each request holds its slot this long in total ([`Pacing::Hold`]).
    #[must_use]
    pub fn hold(self, total: Duration) -> Self {
        self.pacing(Pacing::Hold(total))
    }

    /// Tokens come at this rate ([`Pacing::TokensPerSecond`]).
    #[must_use]
    pub fn tokens_per_second(self, tps: f64) -> Self {
        self.pacing(Pacing::TokensPerSecond(tps))
    }

    /// Tokens come this far apart ([`Pacing::ChunkInterval`]).
    #[must_use]
    pub fn chunk_interval(self, gap: Duration) -> Self {
        self.pacing(Pacing::ChunkInterval(gap))
    }

    /// Adds a failure injected into every request that sends no `x-fake-fail` header.
    #[must_use]
    pub fn fail(mut self, failure: Failure) -> Self {
        self.failures.push(failure);
        self
    }

    /// Turns `/metrics` on or off.
    #[must_use]
    pub fn metrics(mut self, on: bool) -> Self {
        self.metrics = on;
        self
    }

    /// Turns llama-server's `/slots` on or off.
    #[must_use]
    pub fn slots_endpoint(mut self, on: bool) -> Self {
        self.slots_endpoint = on;
        self
    }

    /// Turns the Responses API's memory on or off (see [`FakeConfig::responses_store`]).
    #[must_use]
    pub fn responses_store(mut self, on: bool) -> Self {
        self.responses_store = on;
        self
    }

    /// Turns the prompt cache on or off (see [`FakeConfig::prompt_cache`]).
    #[must_use]
    pub fn prompt_cache(mut self, on: bool) -> Self {
        self.prompt_cache = on;
        self
    }

    /// Sets the prompt tokens kept besides the slots (see [`FakeConfig::cache_tokens`]).
    #[must_use]
    pub fn cache_tokens(mut self, tokens: usize) -> Self {
        self.cache_tokens = tokens;
        self
    }

    /// Sets the prefill time per uncached prompt token.
    #[must_use]
    pub fn prefill_per_token(mut self, per_token: Duration) -> Self {
        self.prefill_per_token = per_token;
        self
    }

    /// vLLM's `--enable-prompt-tokens-details`.
    #[must_use]
    pub fn prompt_tokens_details(mut self, on: bool) -> Self {
        self.prompt_tokens_details = on;
        self
    }

    /// Whether a connection is closed after each streamed answer (llama-server's way; see
    /// [`FakeConfig::close_after_stream`](Self#structfield.close_after_stream)).
    #[must_use]
    pub fn close_after_stream(mut self, on: bool) -> Self {
        self.close_after_stream = on;
        self
    }

    /// Sets how long after a streamed answer the connection is closed.
    #[must_use]
    pub fn close_after_stream_delay(mut self, delay: Duration) -> Self {
        self.close_after_stream_delay = delay;
        self
    }

    /// The shape of one engine instance's prompt cache.
    pub(crate) fn cache_spec(&self) -> CacheSpec {
        CacheSpec {
            enabled: self.prompt_cache,
            layout: match self.kind {
                Kind::Vllm => Layout::Blocks,
                Kind::LlamaServer | Kind::Ollama => Layout::Slots,
            },
            store_tokens: match self.kind {
                Kind::Ollama => 0,
                Kind::LlamaServer | Kind::Vllm => self.cache_tokens,
            },
        }
    }

    /// Listens on `127.0.0.1:<port>` (0 picks a free port).
    #[must_use]
    pub fn port(mut self, port: u16) -> Self {
        self.listen = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        self
    }

    /// Listens on this address.
    #[must_use]
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// The models to serve, with the kind's default filled in when none is named, names
    /// normalised the way the kind does it (Ollama adds `:latest`).
    pub(crate) fn effective_models(&self) -> Vec<ModelSpec> {
        if self.models.is_empty() {
            return vec![ModelSpec {
                name: self.kind.default_model().to_owned(),
                loaded: true,
            }];
        }
        self.models
            .iter()
            .map(|m| ModelSpec {
                name: normalise_model_name(self.kind, &m.name),
                loaded: m.loaded,
            })
            .collect()
    }

    /// Checks what would make the fake ambiguous rather than faithful.
    pub(crate) fn validate(&self) -> Result<(), String> {
        if self.parallel == 0 {
            return Err("parallel must be at least 1".to_owned());
        }
        if self.kind == Kind::LlamaServer && !self.router && self.models.len() > 1 {
            return Err("a single-model llama-server serves one model; use router mode".to_owned());
        }
        if self.router && self.kind != Kind::LlamaServer {
            return Err("router mode exists only for llama-server".to_owned());
        }
        if self.collapse && self.kind != Kind::LlamaServer {
            return Err("collapse models llama-server's unified KV cache only".to_owned());
        }
        Ok(())
    }
}

/// Ollama resolves a bare model name to its `:latest` tag; the other kinds use names verbatim.
pub(crate) fn normalise_model_name(kind: Kind, name: &str) -> String {
    if kind == Kind::Ollama && !name.contains(':') {
        format!("{name}:latest")
    } else {
        name.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_intervals() {
        assert_eq!(Pacing::Instant.interval(10), Duration::ZERO);
        assert_eq!(
            Pacing::Hold(Duration::from_millis(100)).interval(10),
            Duration::from_millis(10)
        );
        assert_eq!(
            Pacing::Hold(Duration::from_millis(100)).interval(0),
            Duration::from_millis(100)
        );
        assert_eq!(
            Pacing::TokensPerSecond(4.0).interval(1),
            Duration::from_millis(250)
        );
        assert_eq!(Pacing::TokensPerSecond(0.0).interval(1), Duration::ZERO);
        assert_eq!(
            Pacing::TokensPerSecond(f64::NAN).interval(1),
            Duration::ZERO
        );
    }

    #[test]
    fn kinds_parse_and_print() {
        for kind in [Kind::LlamaServer, Kind::Vllm, Kind::Ollama] {
            assert_eq!(kind.as_str().parse::<Kind>(), Ok(kind));
        }
        assert!("tgi".parse::<Kind>().is_err());
    }

    #[test]
    fn ollama_names_get_latest() {
        let config = FakeConfig::ollama(1).model("llama3").model("qwen:7b");
        let names: Vec<_> = config
            .effective_models()
            .into_iter()
            .map(|m| m.name)
            .collect();
        assert_eq!(names, ["llama3:latest", "qwen:7b"]);
    }

    #[test]
    fn validation_rejects_ambiguous_setups() {
        assert!(FakeConfig::llama_server(0).validate().is_err());
        assert!(
            FakeConfig::llama_server(1)
                .model("a")
                .model("b")
                .validate()
                .is_err()
        );
        assert!(
            FakeConfig::llama_server(1)
                .router(true)
                .model("a")
                .model("b")
                .validate()
                .is_ok()
        );
        assert!(FakeConfig::vllm(1).collapse(true).validate().is_err());
    }
}
