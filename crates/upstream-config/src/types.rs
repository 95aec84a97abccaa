//! The validated configuration: what the gateway reads.
//!
//! Values of these types only come out of the validation pass (the structs are
//! `#[non_exhaustive]`, so they cannot be built by hand outside this crate), so the gateway can
//! rely on every rule in the [crate docs](crate) holding.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use url::Url;

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

// ===== Server =====

/// The `[server]` table, with defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Server {
    /// Where the OpenAI-compatible API listens. Required.
    pub listen: SocketAddr,
    /// Where `/metrics`, `/healthz`, `/readyz` and `/admin/*` listen. `None` (the key is
    /// absent): no admin listener is started.
    pub admin_listen: Option<SocketAddr>,
    /// Largest request body accepted, in bytes (default [`Server::DEFAULT_MAX_BODY_BYTES`]).
    pub max_body_bytes: usize,
    /// Largest upload (`multipart/form-data`: audio transcription and translation) accepted, in
    /// bytes (default [`Server::DEFAULT_MAX_UPLOAD_BYTES`]).
    pub max_upload_bytes: usize,
    /// Most Responses ids whose upstream is remembered for follow-ups (default
    /// [`Server::DEFAULT_RESPONSE_AFFINITY_ENTRIES`]); the oldest is forgotten first.
    pub response_affinity_entries: usize,
    /// How long a Responses id's upstream is remembered (default 24h).
    pub response_affinity_ttl: Duration,
    /// Cache-aware routing (`affinity`, `affinity_entries`, `affinity_ttl`,
    /// `affinity_block_bytes`, `session_headers`): see [`CacheAffinity`].
    pub cache_affinity: CacheAffinity,
    /// Time allowed for a client to send the request head (default 10s).
    pub header_read_timeout: Duration,
    /// Time allowed to open a TCP connection to an upstream (default 5s).
    pub connect_timeout: Duration,
    /// Time allowed from sending a request upstream to its response head (default 300s: long
    /// prompts on a busy engine take a while before the first byte).
    pub first_byte_timeout: Duration,
    /// How long a pooled upstream connection may sit idle before it is closed (default 90s).
    pub idle_timeout: Duration,
    /// Most client connections open at once on the API listener (default 1024).
    pub max_connections: usize,
    /// Most connections open at once on the admin listener (default 64). A cap of its own, so a
    /// flood on the API listener cannot keep a liveness probe out.
    pub admin_max_connections: usize,
    /// Time allowed for a client to send a whole request body, from the end of its head
    /// (default 30s). Past it the request gets 408 `body-timeout`; it applies to HTTP/2 streams
    /// as well.
    pub body_read_timeout: Duration,
    /// Request-body bytes the gateway buffers at once over all requests, queued ones included
    /// (default 256 MiB). A request that would go past it gets 503 `overloaded`: per-request
    /// limits alone cannot bound memory.
    pub max_buffered_body_bytes: usize,
    /// How long a client connection may stay open with no request in flight before the gateway
    /// closes it (default 60s; HTTP/2 with a `GOAWAY`). HTTP/1 connections between requests are
    /// closed sooner, after `header_read_timeout`.
    pub client_idle_timeout: Duration,
    /// Most HTTP/2 streams a client may have open at once on one connection (default 32).
    pub h2_max_concurrent_streams: usize,
    /// How often the gateway PINGs an HTTP/2 client connection; one not answered within the same
    /// time closes the connection (default 20s).
    pub h2_keep_alive_interval: Duration,
    /// TCP keepalive idle time on client and upstream sockets (default 60s): a peer that
    /// vanished without a FIN (a dead host, a dropped NAT entry) is noticed by the kernel.
    pub tcp_keepalive: Duration,
    /// Longest a client may leave a response unread (default 60s): once the gateway has handed
    /// it a piece of an answer that the client does not take (its TCP or HTTP/2 window stays
    /// full), the connection is closed after this long, so its slot goes back. A slow reader
    /// that keeps taking bytes is never cut.
    pub client_write_timeout: Duration,
    /// On shutdown, how long in-flight requests get to finish (default 30s; may be 0).
    pub drain_grace: Duration,
    /// How often each upstream is health-checked (default 5s).
    pub health_check_interval: Duration,
    /// How long one health or residency probe may take before it counts as a failure
    /// (default 2s).
    pub health_check_timeout: Duration,
    /// Consecutive failed health checks (or refused connections) that take a healthy upstream
    /// out of rotation (default 3, at least 1).
    pub eject_after_failures: usize,
    /// Consecutive successful health checks that put an ejected upstream back into rotation
    /// (default 2, at least 1).
    pub restore_after_successes: usize,
    /// The largest share of a model's upstreams, in percent, that may be out of rotation
    /// (unhealthy) for passive ejection to take out one more (default
    /// [`Server::DEFAULT_MAX_EJECTION_PERCENT`], at most 100). Rounded down, but one upstream
    /// may always go as long as another stays: what forwarding sees never ejects the last
    /// upstream of a model that is still in rotation. Active health checks are not limited.
    pub max_ejection_percent: usize,
    /// How many times a request whose engine answered 502, 503 or 504 goes on to the
    /// next-ranked upstream of its model (default 1; 0 passes such answers through at once).
    /// Only an answer the client has seen nothing of yet is retried; 4xx answers and other 5xx
    /// are always passed through.
    pub engine_error_retries: usize,
    /// Client API keys accepted as `Authorization: Bearer KEY`, each with the tenant, priority
    /// and share its requests queue under. Empty (the default) and no `api_keys_file`: clients
    /// are not authenticated.
    pub api_keys: Vec<ClientKey>,
    /// A file of further client API keys, one per line. This crate does not read it (it does no
    /// I/O beyond the config file); a relative path is relative to the gateway's working
    /// directory.
    pub api_keys_file: Option<PathBuf>,
    /// Bearer token required on `/admin/*`. `None`: the admin API is not authenticated.
    pub admin_token: Option<Secret>,
    /// The request header that names a client's tenant for fair queueing when no API keys are
    /// configured (e.g. `x-tenant`, lower case). `None` (the default): without keys, every
    /// request belongs to one tenant.
    pub tenant_header: Option<String>,
    /// `tls_cert` / `tls_key`: the API listener speaks TLS (h2 and HTTP/1.1 by ALPN) with this
    /// certificate. `None`: plain HTTP. This crate does not read the files.
    pub tls: Option<CertAndKey>,
    /// `admin_tls_cert` / `admin_tls_key`: the same for the admin listener.
    pub admin_tls: Option<CertAndKey>,
    /// Write one access-log line per API request (tracing target `slotgate::access`, at
    /// `info`) when it ends (default `true`).
    pub access_log: bool,
    /// Browser origins allowed to call the API listener (CORS): each `scheme://host[:port]`,
    /// or the one entry `"*"` for any origin. Empty (the default): no CORS headers are sent
    /// and preflights are refused, so browsers keep other origins' pages out. The admin
    /// listener never answers CORS.
    pub cors_origins: Vec<String>,
}

/// A PEM certificate chain and the PEM private key that goes with it (two keys that are set
/// together or not at all). Relative paths are relative to the gateway's working directory.
///
/// ```
/// let config = slotgate_config::Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8443"
///     tls_cert = "/etc/slotgate/tls/cert.pem"
///     tls_key = "/etc/slotgate/tls/key.pem"
///     [upstreams.a]
///     url = "http://127.0.0.1:8081"
///     kind = "llama-server"
///     [upstreams.a.models.m]
///     parallel = 1
///     queue = 0
///     queue_timeout = "1s"
/// "#).unwrap();
/// let tls = config.server.tls.unwrap();
/// assert_eq!(tls.cert, std::path::Path::new("/etc/slotgate/tls/cert.pem"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertAndKey {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

impl Server {
    /// Default [`Server::max_body_bytes`]: 32 MiB. Vision requests carry their images as
    /// base64 (a 3 MB photo is 4 MB of it), so a few photos and a long history need room.
    pub const DEFAULT_MAX_BODY_BYTES: usize = 32 * 1024 * 1024;
    /// Default [`Server::max_upload_bytes`]: 25 MiB, OpenAI's own limit for audio files.
    pub const DEFAULT_MAX_UPLOAD_BYTES: usize = 25 * 1024 * 1024;
    /// Default [`Server::response_affinity_entries`]: 100 000 (some 10 MB).
    pub const DEFAULT_RESPONSE_AFFINITY_ENTRIES: usize = 100_000;
    /// Default [`Server::response_affinity_ttl`].
    pub const DEFAULT_RESPONSE_AFFINITY_TTL: Duration = Duration::from_secs(24 * 3600);
    /// Default [`Server::header_read_timeout`].
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default [`Server::connect_timeout`].
    pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
    /// Default [`Server::first_byte_timeout`].
    pub const DEFAULT_FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(300);
    /// Default [`Server::idle_timeout`].
    pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(90);
    /// Default [`Server::max_connections`].
    pub const DEFAULT_MAX_CONNECTIONS: usize = 1024;
    /// Default [`Server::admin_max_connections`].
    pub const DEFAULT_ADMIN_MAX_CONNECTIONS: usize = 64;
    /// Default [`Server::body_read_timeout`].
    pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default [`Server::max_buffered_body_bytes`]: 64 requests at the default body limit.
    pub const DEFAULT_MAX_BUFFERED_BODY_BYTES: usize = 256 * 1024 * 1024;
    /// Default [`Server::client_idle_timeout`].
    pub const DEFAULT_CLIENT_IDLE_TIMEOUT: Duration = Duration::from_secs(60);
    /// Default [`Server::h2_max_concurrent_streams`].
    pub const DEFAULT_H2_MAX_CONCURRENT_STREAMS: usize = 32;
    /// Default [`Server::h2_keep_alive_interval`].
    pub const DEFAULT_H2_KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(20);
    /// Default [`Server::tcp_keepalive`].
    pub const DEFAULT_TCP_KEEPALIVE: Duration = Duration::from_secs(60);
    /// Default [`Server::client_write_timeout`].
    pub const DEFAULT_CLIENT_WRITE_TIMEOUT: Duration = Duration::from_secs(60);
    /// Default [`Server::drain_grace`].
    pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(30);
    /// Default [`Server::health_check_interval`].
    pub const DEFAULT_HEALTH_CHECK_INTERVAL: Duration = Duration::from_secs(5);
    /// Default [`Server::health_check_timeout`].
    pub const DEFAULT_HEALTH_CHECK_TIMEOUT: Duration = Duration::from_secs(2);
    /// Default [`Server::eject_after_failures`]: one lost probe is not an outage.
    pub const DEFAULT_EJECT_AFTER_FAILURES: usize = 3;
    /// Default [`Server::restore_after_successes`]: a flapping engine has to answer twice in a
    /// row before it gets traffic again.
    pub const DEFAULT_RESTORE_AFTER_SUCCESSES: usize = 2;
    /// Default [`Server::max_ejection_percent`]: half of a model's upstreams (one of two or
    /// three), so what clients can make an engine answer never takes out most of a model.
    pub const DEFAULT_MAX_EJECTION_PERCENT: usize = 50;
    /// Default [`Server::engine_error_retries`]: one more host, so a loading or failing engine
    /// costs a request one extra try at most.
    pub const DEFAULT_ENGINE_ERROR_RETRIES: usize = 1;
    /// The longest tenant name, from a key's `name` or the [`Server::tenant_header`], in bytes.
    pub const MAX_TENANT_LEN: usize = 128;
}

// ===== CacheAffinity =====

/// Cache-aware routing, from the `[server]` table: a conversation's requests go to the host
/// whose engine holds its prompt prefix in its KV cache, while that costs less than the prefill
/// it saves. Read once at start (a reload does not change it); each model can still turn it
/// off ([`Upstream::affinity`]).
///
/// ```
/// use slotgate_config::{CacheAffinity, Config};
/// use std::time::Duration;
///
/// let config = Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8080"
///     affinity_ttl = "10m"
///     session_headers = ["x-conversation"]
///     [upstreams.a]
///     url = "http://127.0.0.1:8081"
///     kind = "llama-server"
///     [upstreams.a.models.m]
///     parallel = 2
///     queue = 4
///     queue_timeout = "30s"
///     affinity = "off"
/// "#)?;
/// let affinity = &config.server.cache_affinity;
/// assert!(affinity.enabled);
/// assert_eq!(affinity.ttl, Duration::from_secs(600));
/// assert_eq!(affinity.entries, CacheAffinity::DEFAULT_ENTRIES);
/// assert_eq!(affinity.session_headers, ["x-conversation"]);
/// assert!(!config.upstreams["a"].affinity("m"));
/// # Ok::<(), slotgate_config::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CacheAffinity {
    /// `affinity = "on" | "off"` (default on).
    pub enabled: bool,
    /// `affinity_entries`: the most prefix blocks remembered (about 40 bytes each).
    pub entries: usize,
    /// `affinity_ttl`: how long a block counts after it was last sent to a host.
    pub ttl: Duration,
    /// `affinity_block_bytes`: the size of a prefix block, in bytes of request text.
    pub block_bytes: usize,
    /// `session_headers`: request headers that name a session, first present wins; lower case.
    pub session_headers: Vec<String>,
}

impl CacheAffinity {
    /// Default [`CacheAffinity::entries`]: 65,536 blocks, under 3 MiB; at the default block
    /// size some 3,000 conversations of 10 KiB of text each.
    pub const DEFAULT_ENTRIES: usize = 65_536;
    /// Default [`CacheAffinity::ttl`]: 30 minutes, longer than a person's pause between turns;
    /// an engine that evicted sooner says so in its answers, which shrinks the index.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(30 * 60);
    /// Default [`CacheAffinity::block_bytes`]: 512 bytes, about 128 tokens.
    pub const DEFAULT_BLOCK_BYTES: usize = 512;
    /// The smallest [`CacheAffinity::block_bytes`].
    pub const MIN_BLOCK_BYTES: usize = 64;
    /// The largest [`CacheAffinity::block_bytes`].
    pub const MAX_BLOCK_BYTES: usize = 64 * 1024;
    /// The smallest [`CacheAffinity::entries`].
    pub const MIN_ENTRIES: usize = 2;
    /// Default [`CacheAffinity::session_headers`]: the generic ones, then the coding agents'
    /// own (Claude Code's, Codex's).
    pub const DEFAULT_SESSION_HEADERS: [&str; 4] = [
        "x-session-id",
        "x-session-affinity",
        "x-claude-code-session-id",
        "session_id",
    ];
}

impl Default for CacheAffinity {
    fn default() -> Self {
        Self {
            enabled: true,
            entries: Self::DEFAULT_ENTRIES,
            ttl: Self::DEFAULT_TTL,
            block_bytes: Self::DEFAULT_BLOCK_BYTES,
            session_headers: Self::DEFAULT_SESSION_HEADERS
                .iter()
                .map(|&name| name.to_owned())
                .collect(),
        }
    }
}

// ===== ClientKey =====

/// One `server.api_keys` entry: a key, and how its requests queue.
///
/// Written either as a bare string (the key; priority `normal`, share 1, no name) or as a
/// table `{ key = "...", name = "team-a", priority = "high", share = 2 }`. Keys from
/// `api_keys_file` are bare keys.
///
/// ```
/// use slotgate_config::{Config, Priority};
///
/// let config = Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8080"
///     api_keys = ["sk-plain", { key = "sk-ops", name = "ops", priority = "high", share = 2 }]
///     [upstreams.a]
///     url = "http://127.0.0.1:8081"
///     kind = "vllm"
///     [upstreams.a.models.m]
///     parallel = 1
///     queue = 4
///     queue_timeout = "30s"
/// "#)?;
/// let ops = &config.server.api_keys[1];
/// assert_eq!((ops.name.as_deref(), ops.priority, ops.share), (Some("ops"), Priority::High, 2));
/// assert_eq!(config.server.api_keys[0].priority, Priority::Normal);
/// # Ok::<(), slotgate_config::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientKey {
    /// The key itself.
    pub key: Secret,
    /// The tenant its requests belong to under `queue_order = "fair"`; keys with the same name
    /// are one tenant. `None`: the key is a tenant of its own.
    pub name: Option<String>,
    /// The priority class of its requests (default [`Priority::Normal`]).
    pub priority: Priority,
    /// Its tenant's share under `queue_order = "fair"`: slots per round relative to the other
    /// tenants' (default 1, at most [`ClientKey::MAX_SHARE`]).
    pub share: u32,
}

impl ClientKey {
    /// The largest `share`.
    pub const MAX_SHARE: u32 = 1000;

    /// A bare key: no name, priority `normal`, share 1.
    pub fn bare(key: Secret) -> Self {
        ClientKey {
            key,
            name: None,
            priority: Priority::Normal,
            share: 1,
        }
    }
}

/// A client key's priority class: higher classes are served first from a model's queue, and a
/// lower class waits at most a bounded number of grants (see `docs/configuration.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// `"high"`.
    High,
    /// `"normal"`, the default.
    #[default]
    Normal,
    /// `"low"`.
    Low,
}

impl Priority {
    /// Every class, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The name used in the configuration file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The class named `name`, exactly as [`Priority::as_str`] spells it.
    pub fn from_name(name: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

// ===== Queueing =====

/// How one model's queue on one upstream serves its waiters, what a waiting client sees, and how
/// many requests may wait inside the engine instead (`prefetch`).
///
/// ```
/// use std::time::Duration;
/// use slotgate_config::{Config, QueueOrder, Queueing};
///
/// let config = Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8080"
///     [upstreams.a]
///     url = "http://127.0.0.1:8081"
///     kind = "vllm"
///     [upstreams.a.models.m]
///     parallel = 1
///     queue = 4
///     queue_timeout = "30s"
///     queue_order = "fair"
///     queue_keepalive = "5s"
///     honor_sdk_timeout = false
///     prefetch = 1
/// "#)?;
/// let q = config.upstreams["a"].queueing("m");
/// assert_eq!(q.order, QueueOrder::Fair);
/// assert_eq!(q.keepalive, Some(Duration::from_secs(5)));
/// assert!(!q.honor_sdk_timeout);
/// assert_eq!(q.prefetch, 1);
/// assert_eq!(config.upstreams["a"].queueing("other"), Queueing::default());
/// # Ok::<(), slotgate_config::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Queueing {
    /// `queue_order`: first come first served, or fair between tenants (default FIFO).
    pub order: QueueOrder,
    /// `queue_keepalive`: a streamed request that has to queue is answered `200` at once and
    /// sent an SSE comment this often while it waits. `None` (the default): off.
    pub keepalive: Option<Duration>,
    /// `honor_sdk_timeout`: whether the OpenAI SDKs' `x-stainless-timeout` header caps the
    /// queue wait (default `true`).
    pub honor_sdk_timeout: bool,
    /// `prefetch`: how many requests beyond `parallel` the gateway sends ahead, to wait in the
    /// engine's own queue and start the instant one of its slots frees (default 0: never more
    /// than `parallel` at the engine). The model's cap in the limiter is `parallel + prefetch`.
    pub prefetch: usize,
}

impl Queueing {
    /// The shortest `queue_keepalive`.
    pub const MIN_KEEPALIVE: Duration = Duration::from_secs(1);
    /// The longest `queue_keepalive`: proxies commonly cut a connection idle for 60 s.
    pub const MAX_KEEPALIVE: Duration = Duration::from_secs(60);
    /// The largest `prefetch`.
    pub const MAX_PREFETCH: usize = 64;
}

impl Default for Queueing {
    fn default() -> Self {
        Queueing {
            order: QueueOrder::Fifo,
            keepalive: None,
            honor_sdk_timeout: true,
            prefetch: 0,
        }
    }
}

/// `queue_order`: the order in which a model's queue serves its waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QueueOrder {
    /// `"fifo"`: first come, first served (within a priority class). The default.
    #[default]
    Fifo,
    /// `"fair"`: round-robin between tenants, weighted by their shares (deficit round-robin),
    /// first come first served within a tenant.
    Fair,
}

impl QueueOrder {
    /// The name used in the configuration file.
    pub const fn as_str(self) -> &'static str {
        match self {
            QueueOrder::Fifo => "fifo",
            QueueOrder::Fair => "fair",
        }
    }

    /// The order named `name`, exactly as [`QueueOrder::as_str`] spells it.
    pub fn from_name(name: &str) -> Option<QueueOrder> {
        [QueueOrder::Fifo, QueueOrder::Fair]
            .into_iter()
            .find(|o| o.as_str() == name)
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

// ===== Cluster =====

/// The `[cluster]` table: the shared slot store that several gateway replicas admit through
/// (`docs/scale-out.md`). Every replica that shares a cap must have the same table.
///
/// ```
/// use std::time::Duration;
/// use slotgate_config::{Config, StoreDown};
///
/// let config = Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8080"
///
///     [cluster]
///     redis_url = "redis://10.0.0.9:6379/0"
///     on_store_down = "local-share"
///     replicas = 2
///
///     [upstreams.a]
///     url = "http://10.0.0.5:8000"
///     kind = "vllm"
///     models.m = { parallel = 4, queue = 8, queue_timeout = "30s" }
/// "#)?;
/// let cluster = config.cluster.as_ref().unwrap();
/// assert_eq!(cluster.lease_ttl, Duration::from_secs(10));
/// assert_eq!(cluster.on_store_down, StoreDown::LocalShare);
/// assert_eq!(cluster.replicas, Some(2));
/// # Ok::<(), slotgate_config::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Cluster {
    /// `redis://host:port/db` or `redis+unix:///path`: where the shared store is. A secret
    /// (it may carry a password); printed with the password redacted.
    pub redis_url: Secret,
    /// Prefix of every Redis key and channel (default [`Cluster::DEFAULT_KEY_PREFIX`]), so that
    /// several deployments can share one Redis.
    pub key_prefix: String,
    /// How long a slot's lease lives without renewal (default [`Cluster::DEFAULT_LEASE_TTL`],
    /// between [`Cluster::MIN_LEASE_TTL`] and [`Cluster::MAX_LEASE_TTL`]). Leases are renewed
    /// every third of it; a dead replica's slots come back within it.
    pub lease_ttl: Duration,
    /// Bound on every call to Redis (default [`Cluster::DEFAULT_STORE_TIMEOUT`], at most a third
    /// of `lease_ttl`); a call that takes longer marks the store down.
    pub store_timeout: Duration,
    /// What to do while Redis cannot be reached (default [`StoreDown::FailClosed`]).
    pub on_store_down: StoreDown,
    /// How many replicas share the caps: required with [`StoreDown::LocalShare`], whose local
    /// share is `floor(parallel / replicas)`.
    pub replicas: Option<usize>,
}

impl Cluster {
    /// Default `key_prefix`.
    pub const DEFAULT_KEY_PREFIX: &'static str = "slotgate";
    /// Default `lease_ttl`.
    pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
    /// Shortest `lease_ttl`: renewals every third of it must get through a busy Redis.
    pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);
    /// Longest `lease_ttl`: a dead replica's slots stay taken this long.
    pub const MAX_LEASE_TTL: Duration = Duration::from_secs(300);
    /// Default `store_timeout`.
    pub const DEFAULT_STORE_TIMEOUT: Duration = Duration::from_secs(1);
}

/// `[cluster] on_store_down`: what a replica does while it cannot reach Redis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum StoreDown {
    /// `"fail-closed"`: refuse new requests with `503 store-unavailable` and `Retry-After`;
    /// the engine never sees more than `parallel`.
    #[default]
    FailClosed,
    /// `"local-share"`: admit locally up to `floor(parallel / replicas)` per key.
    LocalShare,
}

impl StoreDown {
    /// The name in the configuration file.
    ///
    /// ```
    /// assert_eq!(slotgate_config::StoreDown::LocalShare.as_str(), "local-share");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            StoreDown::FailClosed => "fail-closed",
            StoreDown::LocalShare => "local-share",
        }
    }
}

// ===== Secret =====

/// A credential. `Debug` prints `Secret(<redacted>)` and there is no `Display`, so it cannot end
/// up in a log by accident; [`Secret::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The credential itself: for building a header or comparing, never for logging.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
