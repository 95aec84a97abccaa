//! The `[server]` table, one declaration per key: its field, its default, how it is read and
//! checked, and how it shows in the effective configuration (see [`crate::key`]). The order of
//! the declarations is the order of the known-key list and of the effective configuration.
//!
//! Checks between keys (listeners that collide, an admin certificate without an admin listener,
//! a body buffer smaller than one body) run after the reads, in `validate::server`.
//!
//! Adding a key: one declaration here, then its uses (the gateway code that reads the field,
//! the row in `docs/configuration.md`); see CONTRIBUTING.md, "Adding a `[server]` key".

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use figment::value::Value;

use crate::key::{self, Flat, table};
use crate::raw::{KeyPath, Reader};
use crate::secret::Secret;
use crate::show::Shown;
use crate::values::{CertAndKey, CertPair, file_path, header_name, secret, socket_addr};

mod affinity;
mod client_key;

pub use affinity::CacheAffinity;
pub use client_key::{ClientKey, Priority};

table! {
    /// The `[server]` table, with defaults filled in.
    #[derive(Clone, Debug, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct Server, read as ServerKeys {
        /// Where the OpenAI-compatible API listens. Required.
        listen: SocketAddr = key::required(
            "listen",
            r#"the address of the OpenAI-compatible API, e.g. "127.0.0.1:8080""#,
            socket_addr,
        )
        .read_at_start();
        /// Where `/metrics`, `/healthz`, `/readyz` and `/admin/*` listen. `None` (the key is
        /// absent): no admin listener is started.
        admin_listen: Option<SocketAddr> = key::optional("admin_listen", socket_addr)
            .read_at_start()
            .unset(
                "server.admin_listen (no admin listener: no /metrics, /healthz, /readyz, /admin/*)",
            );
        /// Largest request body accepted, in bytes (default [`Server::DEFAULT_MAX_BODY_BYTES`]).
        max_body_bytes: usize = key::count("max_body_bytes", 1),
            default
            /// 32 MiB. Vision requests carry their images as base64 (a 3 MB photo is 4 MB of
            /// it), so a few photos and a long history need room.
            DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024;
        /// Largest upload (`multipart/form-data`: audio transcription and translation) accepted,
        /// in bytes (default [`Server::DEFAULT_MAX_UPLOAD_BYTES`]).
        max_upload_bytes: usize = key::count("max_upload_bytes", 1),
            default
            /// 25 MiB, OpenAI's own limit for audio files.
            DEFAULT_MAX_UPLOAD_BYTES = 25 * 1024 * 1024;
        /// Most Responses ids whose upstream is remembered for follow-ups (default
        /// [`Server::DEFAULT_RESPONSE_AFFINITY_ENTRIES`]); the oldest is forgotten first.
        response_affinity_entries: usize = key::count("response_affinity_entries", 1)
            .read_at_start(),
            default
            /// 100 000 (some 10 MB).
            DEFAULT_RESPONSE_AFFINITY_ENTRIES = 100_000;
        /// How long a Responses id's upstream is remembered (default 24h).
        response_affinity_ttl: Duration = key::duration("response_affinity_ttl").read_at_start(),
            default DEFAULT_RESPONSE_AFFINITY_TTL = Duration::from_secs(24 * 3600);
        /// Cache-aware routing (`affinity`, `affinity_entries`, `affinity_ttl`,
        /// `affinity_block_bytes`, `session_headers`): see [`CacheAffinity`].
        cache_affinity: CacheAffinity = Flat::<CacheAffinity>::new();
        /// Time allowed for a client to send the request head (default 10s).
        header_read_timeout: Duration = key::duration("header_read_timeout").read_at_start(),
            default DEFAULT_HEADER_READ_TIMEOUT = Duration::from_secs(10);
        /// Largest request head accepted, in bytes, counting the request line and each field as
        /// `name: value` with its line end (default [`Server::DEFAULT_MAX_HEADER_BYTES`], which
        /// is also the most it may be). A larger head gets 431 `headers-too-large`.
        max_header_bytes: usize = key::defaulted("max_header_bytes", header_bytes),
            default
            /// 400 KiB: as large as the HTTP layer's read buffer allows (a head that overflows
            /// it is refused there), so a real client's cookies and tokens always fit.
            DEFAULT_MAX_HEADER_BYTES = 400 * 1024;
        /// Time allowed to open a TCP connection to an upstream (default 5s).
        connect_timeout: Duration = key::duration("connect_timeout").read_at_start(),
            default DEFAULT_CONNECT_TIMEOUT = Duration::from_secs(5);
        /// Time allowed from sending a request upstream to its response head (default 300s: long
        /// prompts on a busy engine take a while before the first byte).
        first_byte_timeout: Duration = key::duration("first_byte_timeout").read_at_start(),
            default DEFAULT_FIRST_BYTE_TIMEOUT = Duration::from_secs(300);
        /// How long a pooled upstream connection may sit idle before it is closed (default 90s).
        idle_timeout: Duration = key::duration("idle_timeout").read_at_start(),
            default DEFAULT_IDLE_TIMEOUT = Duration::from_secs(90);
        /// Most client connections open at once on the API listener (default 1024).
        max_connections: usize = key::count("max_connections", 1).read_at_start(),
            default DEFAULT_MAX_CONNECTIONS = 1024;
        /// Most connections open at once on the admin listener (default 64). A cap of its own,
        /// so a flood on the API listener cannot keep a liveness probe out.
        admin_max_connections: usize = key::count("admin_max_connections", 1).read_at_start(),
            default DEFAULT_ADMIN_MAX_CONNECTIONS = 64;
        /// Time allowed for a client to send a whole request body, from the end of its head
        /// (default 30s). Past it the request gets 408 `body-timeout`; it applies to HTTP/2
        /// streams as well.
        body_read_timeout: Duration = key::duration("body_read_timeout"),
            default DEFAULT_BODY_READ_TIMEOUT = Duration::from_secs(30);
        /// Request-body bytes the gateway buffers at once over all requests, queued ones
        /// included (default 256 MiB). A request that would go past it gets 503 `overloaded`:
        /// per-request limits alone cannot bound memory.
        max_buffered_body_bytes: usize = key::count("max_buffered_body_bytes", 1).read_at_start(),
            default
            /// 64 requests at the default body limit.
            DEFAULT_MAX_BUFFERED_BODY_BYTES = 256 * 1024 * 1024;
        /// How long a client connection may stay open with no request in flight before the
        /// gateway closes it (default 60s; HTTP/2 with a `GOAWAY`). HTTP/1 connections between
        /// requests are closed sooner, after `header_read_timeout`.
        client_idle_timeout: Duration = key::duration("client_idle_timeout").read_at_start(),
            default DEFAULT_CLIENT_IDLE_TIMEOUT = Duration::from_secs(60);
        /// Most HTTP/2 streams a client may have open at once on one connection (default 32).
        h2_max_concurrent_streams: usize = key::count("h2_max_concurrent_streams", 1)
            .read_at_start(),
            default DEFAULT_H2_MAX_CONCURRENT_STREAMS = 32;
        /// How often the gateway PINGs an HTTP/2 client connection; one not answered within the
        /// same time closes the connection (default 20s).
        h2_keep_alive_interval: Duration = key::duration("h2_keep_alive_interval").read_at_start(),
            default DEFAULT_H2_KEEP_ALIVE_INTERVAL = Duration::from_secs(20);
        /// TCP keepalive idle time on client and upstream sockets (default 60s): a peer that
        /// vanished without a FIN (a dead host, a dropped NAT entry) is noticed by the kernel.
        tcp_keepalive: Duration = key::duration("tcp_keepalive").read_at_start(),
            default DEFAULT_TCP_KEEPALIVE = Duration::from_secs(60);
        /// Longest a client may leave a response unread (default 60s): once the gateway has
        /// handed it a piece of an answer that the client does not take (its TCP or HTTP/2
        /// window stays full), the connection is closed after this long, so its slot goes back.
        /// A slow reader that keeps taking bytes is never cut.
        client_write_timeout: Duration = key::duration("client_write_timeout").read_at_start(),
            default DEFAULT_CLIENT_WRITE_TIMEOUT = Duration::from_secs(60);
        /// On shutdown, how long in-flight requests get to finish (default 30s; may be 0).
        // Zero is meaningful here: stop without waiting for in-flight requests.
        drain_grace: Duration = key::duration_or_zero("drain_grace").read_at_start(),
            default DEFAULT_DRAIN_GRACE = Duration::from_secs(30);
        /// How often each upstream is health-checked (default 5s).
        health_check_interval: Duration = key::duration("health_check_interval"),
            default DEFAULT_HEALTH_CHECK_INTERVAL = Duration::from_secs(5);
        /// How long one health or residency probe may take before it counts as a failure
        /// (default 2s).
        health_check_timeout: Duration = key::duration("health_check_timeout"),
            default DEFAULT_HEALTH_CHECK_TIMEOUT = Duration::from_secs(2);
        /// Consecutive failed health checks (or refused connections) that take a healthy
        /// upstream out of rotation (default 3, at least 1).
        eject_after_failures: usize = key::count("eject_after_failures", 1),
            default
            /// One lost probe is not an outage.
            DEFAULT_EJECT_AFTER_FAILURES = 3;
        /// Consecutive successful health checks that put an ejected upstream back into rotation
        /// (default 2, at least 1).
        restore_after_successes: usize = key::count("restore_after_successes", 1),
            default
            /// A flapping engine has to answer twice in a row before it gets traffic again.
            DEFAULT_RESTORE_AFTER_SUCCESSES = 2;
        /// The largest share of a model's upstreams, in percent, that may be out of rotation
        /// (unhealthy) for passive ejection to take out one more (default
        /// [`Server::DEFAULT_MAX_EJECTION_PERCENT`], at most 100). Rounded down, but one upstream
        /// may always go as long as another stays: what forwarding sees never ejects the last
        /// upstream of a model that is still in rotation. Active health checks are not limited.
        max_ejection_percent: usize = key::defaulted("max_ejection_percent", percent),
            default
            /// Half of a model's upstreams (one of two or three), so what clients can make an
            /// engine answer never takes out most of a model.
            DEFAULT_MAX_EJECTION_PERCENT = 50;
        /// How many times a request whose engine answered 502, 503 or 504 goes on to the
        /// next-ranked upstream of its model (default 1; 0 passes such answers through at
        /// once). Only an answer the client has seen nothing of yet is retried; 4xx answers and
        /// other 5xx are always passed through.
        // Zero is meaningful: pass an engine's 502/503/504 through at once.
        engine_error_retries: usize = key::count("engine_error_retries", 0),
            default
            /// One more host, so a loading or failing engine costs a request one extra try at
            /// most.
            DEFAULT_ENGINE_ERROR_RETRIES = 1;
        /// Client API keys accepted as `Authorization: Bearer KEY`, each with the tenant,
        /// priority and share its requests queue under. Empty (the default) and no
        /// `api_keys_file`: clients are not authenticated.
        api_keys: Vec<ClientKey> = key::list("api_keys", client_key::client_keys);
        /// A file of further client API keys, one per line. This crate does not read it (it
        /// does no I/O beyond the config file); a relative path is relative to the gateway's
        /// working directory.
        api_keys_file: Option<PathBuf> = key::optional("api_keys_file", file_path)
            .unset(API_KEYS_FILE_UNSET);
        /// The request header that names a client's tenant for fair queueing when no API keys
        /// are configured (e.g. `x-tenant`, lower case). `None` (the default): without keys,
        /// every request belongs to one tenant.
        tenant_header: Option<String> = key::optional("tenant_header", header_name)
            .unset("server.tenant_header (without API keys, all clients are one tenant)");
        /// Bearer token required on `/admin/*`. `None`: the admin API is not authenticated.
        admin_token: Option<Secret> = key::optional("admin_token", secret)
            .unset("server.admin_token (the admin API is not authenticated)");
        /// `tls_cert` / `tls_key`: the API listener speaks TLS (h2 and HTTP/1.1 by ALPN) with
        /// this certificate. `None`: plain HTTP. This crate does not read the files.
        tls: Option<CertAndKey> = CertPair::new("tls_cert", "tls_key").on_off_at_start();
        /// `admin_tls_cert` / `admin_tls_key`: the same for the admin listener.
        admin_tls: Option<CertAndKey> = CertPair::new("admin_tls_cert", "admin_tls_key")
            .on_off_at_start();
        /// Write one access-log line per API request (tracing target `slotgate::access`, at
        /// `info`) when it ends (default `true`).
        access_log: bool = key::boolean("access_log"),
            default DEFAULT_ACCESS_LOG = true;
        /// Browser origins allowed to call the API listener (CORS): each
        /// `scheme://host[:port]`, or the one entry `"*"` for any origin. Empty (the default):
        /// no CORS headers are sent and preflights are refused, so browsers keep other origins'
        /// pages out. The admin listener never answers CORS.
        cors_origins: Vec<String> = key::list("cors_origins", cors_origins)
            // Left out of the effective configuration when empty, as it always was.
            .show(|origins| (!origins.is_empty()).then_some(Shown::List(origins)));
    }
}

impl Server {
    /// The longest tenant name, from a key's `name` or the [`Server::tenant_header`], in bytes.
    pub const MAX_TENANT_LEN: usize = client_key::MAX_TENANT_LEN;

    /// The keys that take effect only at start and differ between `self` (the table the
    /// gateway started with) and `new`, as `server.KEY`, in declaration order: a reload to
    /// `new` applies everything else and leaves these as they are until a restart. Turning TLS on or off
    /// counts under `server.tls_cert` (`server.admin_tls_cert`); a renewed certificate does
    /// not count, a reload puts it in force.
    ///
    /// ```
    /// use slotgate_config::Config;
    ///
    /// let config = |server: &str| Config::from_toml_str(&format!(r#"
    ///     [server]
    ///     listen = "127.0.0.1:8080"
    ///     {server}
    ///     [upstreams.a]
    ///     url = "http://127.0.0.1:8081"
    ///     kind = "llama-server"
    ///     models.m = {{ parallel = 2, queue = 4, queue_timeout = "30s" }}
    /// "#));
    /// let old = config("")?.server;
    /// let new = config(r#"affinity_ttl = "5m"
    ///     max_body_bytes = 1024
    ///     tcp_keepalive = "10s""#)?.server;
    /// assert_eq!(old.restart_required(&new), ["server.affinity_ttl", "server.tcp_keepalive"]);
    /// # Ok::<(), slotgate_config::ConfigError>(())
    /// ```
    pub fn restart_required(&self, new: &Server) -> Vec<&'static str> {
        let mut changed = Vec::new();
        ServerKeys::restart_required(self, new, &mut changed);
        changed.into_iter().map(qualified).collect()
    }
}

/// `server.KEY` for the `[server]` key `name`. The names are made once for the whole process
/// (one short string per key, kept for good): a reload's answer lists `&'static str`s, and a
/// declaration knows its key's name within its table only.
fn qualified(name: &'static str) -> &'static str {
    static QUALIFIED: OnceLock<Vec<(&'static str, &'static str)>> = OnceLock::new();
    QUALIFIED
        .get_or_init(|| {
            ServerKeys::names()
                .into_iter()
                .map(|key| {
                    let full: &'static str = Box::leak(format!("server.{key}").into_boxed_str());
                    (key, full)
                })
                .collect()
        })
        .iter()
        .find(|(key, _)| *key == name)
        .map_or(name, |&(_, full)| full)
}

/// The effective configuration's note for an unset `api_keys_file`; `effective` widens it when
/// `api_keys` is empty too (then no client is authenticated).
pub(crate) const API_KEYS_FILE_UNSET: &str = "server.api_keys_file";

/// The fewest bytes `max_header_bytes` may be: a request line and a few ordinary fields.
const MIN_HEADER_BYTES: usize = 1024;

/// `server.max_header_bytes`: from [`MIN_HEADER_BYTES`] up to the default, the most the HTTP
/// layer's read buffer (hyper's, a little over 400 KiB) lets through whole.
fn header_bytes(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<usize> {
    let bytes = r.count(path, value, MIN_HEADER_BYTES)?;
    if bytes > Server::DEFAULT_MAX_HEADER_BYTES {
        r.invalid(
            path,
            value,
            format!(
                "at most {} (the HTTP layer's read buffer), found {bytes}",
                Server::DEFAULT_MAX_HEADER_BYTES
            ),
        );
        return None;
    }
    Some(bytes)
}

/// A share in percent: 0 to 100.
fn percent(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<usize> {
    let percent = r.count(path, value, 0)?;
    if percent > 100 {
        r.invalid(
            path,
            value,
            format!("a share in percent, at most 100, found {percent}"),
        );
        return None;
    }
    Some(percent)
}

/// `server.cors_origins`: `["*"]`, or origins as a browser sends them in `Origin`
/// (`scheme://host[:port]`, no path, no trailing slash), compared exactly.
fn cors_origins(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Vec<String>> {
    let items = r.array(path, value)?;
    let origins: Vec<Option<String>> = items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let p = path.index(i);
            let text = r.string(&p, item)?;
            if let Some(why) = bad_origin(text) {
                r.invalid(&p, item, why.to_owned());
                return None;
            }
            Some(text.to_owned())
        })
        .collect();
    let origins: Vec<String> = origins.into_iter().collect::<Option<_>>()?;
    if origins.len() > 1 && origins.iter().any(|origin| origin == "*") {
        r.invalid(
            path,
            value,
            "\"*\" allows every origin: write it alone, or list origins without it".to_owned(),
        );
        return None;
    }
    Some(origins)
}

/// Why `text` is not an origin a browser sends (`None`: it is one, or `*`).
fn bad_origin(text: &str) -> Option<&'static str> {
    if text == "*" {
        return None;
    }
    let Some((scheme, host)) = text.split_once("://") else {
        return Some("an origin is scheme://host[:port], e.g. \"https://app.example.com\"");
    };
    if !matches!(scheme, "http" | "https") {
        return Some("an origin's scheme is http or https");
    }
    if host.is_empty() || host.contains(['/', '?', '#', ' ', '*']) {
        return Some(
            "an origin has a host and nothing after it (no path, no trailing slash, no wildcard)",
        );
    }
    None
}
