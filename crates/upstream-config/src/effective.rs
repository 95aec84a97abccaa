//! The effective configuration, rendered back as TOML (what `slotgate check` prints).
//!
//! Rendered through a private serializable view rather than by deriving `Serialize` on the
//! public types: the view is where defaults become explicit, durations become human strings and
//! secrets become `<redacted>`, and none of that belongs in the types the gateway uses.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use serde::Serialize;

use crate::types::{ClientKey, Cluster, Config, ModelLimits, Queueing, Secret, Server, Upstream};

/// What a secret prints as.
const REDACTED: &str = "<redacted>";

impl Config {
    /// The validated configuration as TOML, with every default written out and every secret
    /// replaced by `"<redacted>"`. Optional keys that are unset are listed in a leading comment.
    ///
    /// The output is itself a valid configuration: loading it gives back this config (with the
    /// secrets' values replaced).
    pub fn to_effective_toml(&self) -> String {
        let mut out = String::from(
            "# Effective slotgate configuration: defaults made explicit, secrets redacted.\n",
        );
        let unset = unset_keys(&self.server);
        if !unset.is_empty() {
            out.push_str("# Not set:\n");
            for line in unset {
                let _ = writeln!(out, "#   {line}");
            }
        }
        out.push('\n');
        match toml::to_string(&View::from(self)) {
            Ok(body) => out.push_str(&body),
            // Unreachable with this view (string keys, no bare `None`), but never panic on a
            // diagnostic path: say what happened instead.
            Err(error) => {
                let _ = writeln!(out, "# cannot render the effective configuration: {error}");
            }
        }
        out
    }
}

fn unset_keys(server: &Server) -> Vec<&'static str> {
    let mut unset = Vec::new();
    if server.admin_listen.is_none() {
        unset.push(
            "server.admin_listen (no admin listener: no /metrics, /healthz, /readyz, /admin/*)",
        );
    }
    if server.api_keys.is_empty() && server.api_keys_file.is_none() {
        unset.push("server.api_keys, server.api_keys_file (clients are not authenticated)");
    } else if server.api_keys_file.is_none() {
        unset.push("server.api_keys_file");
    }
    if server.tenant_header.is_none() {
        unset.push("server.tenant_header (without API keys, all clients are one tenant)");
    }
    if server.admin_token.is_none() {
        unset.push("server.admin_token (the admin API is not authenticated)");
    }
    unset
}

#[derive(Serialize)]
struct View<'a> {
    server: ServerView<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<ClusterView<'a>>,
    upstreams: BTreeMap<&'a str, UpstreamView<'a>>,
    aliases: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct ServerView<'a> {
    listen: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_listen: Option<String>,
    max_body_bytes: usize,
    max_upload_bytes: usize,
    response_affinity_entries: usize,
    response_affinity_ttl: String,
    affinity: &'static str,
    affinity_entries: usize,
    affinity_ttl: String,
    affinity_block_bytes: usize,
    session_headers: &'a [String],
    header_read_timeout: String,
    connect_timeout: String,
    first_byte_timeout: String,
    idle_timeout: String,
    max_connections: usize,
    admin_max_connections: usize,
    body_read_timeout: String,
    max_buffered_body_bytes: usize,
    client_idle_timeout: String,
    h2_max_concurrent_streams: usize,
    h2_keep_alive_interval: String,
    tcp_keepalive: String,
    client_write_timeout: String,
    drain_grace: String,
    health_check_interval: String,
    health_check_timeout: String,
    eject_after_failures: usize,
    restore_after_successes: usize,
    max_ejection_percent: usize,
    engine_error_retries: usize,
    api_keys: Vec<KeyView<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_keys_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tenant_header: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_token: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_tls_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    admin_tls_key: Option<String>,
    access_log: bool,
    #[serde(skip_serializing_if = "<[String]>::is_empty")]
    cors_origins: &'a [String],
}

/// An `api_keys` entry: a bare key as it was written, a key with queueing attributes as a
/// table with all of them.
#[derive(Serialize)]
#[serde(untagged)]
enum KeyView<'a> {
    Bare(&'static str),
    Table {
        key: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
        priority: &'static str,
        share: u32,
    },
}

impl<'a> From<&'a ClientKey> for KeyView<'a> {
    fn from(key: &'a ClientKey) -> Self {
        if *key == ClientKey::bare(key.key.clone()) {
            return KeyView::Bare(REDACTED);
        }
        KeyView::Table {
            key: REDACTED,
            name: key.name.as_deref(),
            priority: key.priority.as_str(),
            share: key.share,
        }
    }
}

#[derive(Serialize)]
struct ClusterView<'a> {
    redis_url: String,
    key_prefix: &'a str,
    lease_ttl: String,
    store_timeout: String,
    on_store_down: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    replicas: Option<usize>,
}

#[derive(Serialize)]
struct UpstreamView<'a> {
    url: String,
    kind: &'static str,
    weight: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<&'static str>,
    cancel_grace: String,
    stream_idle_timeout: String,
    stream_timeout: String,
    allow_model_management: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_loaded_models: Option<usize>,
    collate_for: String,
    // Tables last: TOML cannot put a plain key after a sub-table.
    models: BTreeMap<&'a str, ModelEntryView<'a>>,
}

#[derive(Serialize)]
struct ModelEntryView<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_model: Option<&'a str>,
    #[serde(flatten)]
    limits: ModelView,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    queueing: Option<QueueingView>,
    affinity: &'static str,
}

#[derive(Serialize)]
struct QueueingView {
    queue_order: &'static str,
    queue_keepalive: String,
    honor_sdk_timeout: bool,
    prefetch: usize,
}

impl From<Queueing> for QueueingView {
    fn from(queueing: Queueing) -> Self {
        QueueingView {
            queue_order: queueing.order.as_str(),
            queue_keepalive: queueing.keepalive.map_or_else(|| "off".to_owned(), human),
            honor_sdk_timeout: queueing.honor_sdk_timeout,
            prefetch: queueing.prefetch,
        }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum ModelView {
    Limited {
        parallel: usize,
        queue: usize,
        queue_timeout: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        capacity: Option<usize>,
    },
    Unlimited {
        parallel: &'static str,
    },
    Auto {
        parallel: &'static str,
        queue: usize,
        queue_timeout: String,
    },
}

impl<'a> From<&'a Config> for View<'a> {
    fn from(config: &'a Config) -> Self {
        View {
            server: ServerView::from(&config.server),
            cluster: config.cluster.as_ref().map(ClusterView::from),
            upstreams: config
                .upstreams
                .iter()
                .map(|(name, upstream)| (name.as_str(), UpstreamView::from(upstream)))
                .collect(),
            aliases: &config.aliases,
        }
    }
}

impl<'a> From<&'a Server> for ServerView<'a> {
    fn from(server: &'a Server) -> Self {
        ServerView {
            listen: server.listen.to_string(),
            admin_listen: server.admin_listen.map(|addr| addr.to_string()),
            max_body_bytes: server.max_body_bytes,
            max_upload_bytes: server.max_upload_bytes,
            response_affinity_entries: server.response_affinity_entries,
            response_affinity_ttl: human(server.response_affinity_ttl),
            affinity: on_off(server.cache_affinity.enabled),
            affinity_entries: server.cache_affinity.entries,
            affinity_ttl: human(server.cache_affinity.ttl),
            affinity_block_bytes: server.cache_affinity.block_bytes,
            session_headers: &server.cache_affinity.session_headers,
            header_read_timeout: human(server.header_read_timeout),
            connect_timeout: human(server.connect_timeout),
            first_byte_timeout: human(server.first_byte_timeout),
            idle_timeout: human(server.idle_timeout),
            max_connections: server.max_connections,
            admin_max_connections: server.admin_max_connections,
            body_read_timeout: human(server.body_read_timeout),
            max_buffered_body_bytes: server.max_buffered_body_bytes,
            client_idle_timeout: human(server.client_idle_timeout),
            h2_max_concurrent_streams: server.h2_max_concurrent_streams,
            h2_keep_alive_interval: human(server.h2_keep_alive_interval),
            tcp_keepalive: human(server.tcp_keepalive),
            client_write_timeout: human(server.client_write_timeout),
            drain_grace: human(server.drain_grace),
            health_check_interval: human(server.health_check_interval),
            health_check_timeout: human(server.health_check_timeout),
            eject_after_failures: server.eject_after_failures,
            restore_after_successes: server.restore_after_successes,
            max_ejection_percent: server.max_ejection_percent,
            engine_error_retries: server.engine_error_retries,
            api_keys: server.api_keys.iter().map(KeyView::from).collect(),
            api_keys_file: server.api_keys_file.as_deref().map(display),
            tenant_header: server.tenant_header.as_deref(),
            admin_token: server.admin_token.as_ref().map(redact),
            tls_cert: server.tls.as_ref().map(|tls| display(&tls.cert)),
            tls_key: server.tls.as_ref().map(|tls| display(&tls.key)),
            admin_tls_cert: server.admin_tls.as_ref().map(|tls| display(&tls.cert)),
            admin_tls_key: server.admin_tls.as_ref().map(|tls| display(&tls.key)),
            access_log: server.access_log,
            cors_origins: &server.cors_origins,
        }
    }
}

impl<'a> From<&'a Cluster> for ClusterView<'a> {
    fn from(cluster: &'a Cluster) -> Self {
        ClusterView {
            redis_url: redact_password(cluster.redis_url.expose()),
            key_prefix: &cluster.key_prefix,
            lease_ttl: human(cluster.lease_ttl),
            store_timeout: human(cluster.store_timeout),
            on_store_down: cluster.on_store_down.as_str(),
            replicas: cluster.replicas,
        }
    }
}

/// A Redis URL with its password (if any) replaced by `<redacted>`: the rest is useful to see.
fn redact_password(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            // Only fails for URLs that cannot have credentials, which this one has.
            let _ = parsed.set_password(Some(REDACTED));
            parsed.to_string()
        }
        Ok(_) => url.to_owned(),
        // Validated as a URL; never echo something unparsed.
        Err(_) => REDACTED.to_owned(),
    }
}

impl<'a> From<&'a Upstream> for UpstreamView<'a> {
    fn from(upstream: &'a Upstream) -> Self {
        UpstreamView {
            // The default port written out, like every other default (the url crate drops it).
            // Nothing else can follow the path: validation refused queries and fragments.
            url: format!("{}{}", upstream.authority(), upstream.url.path()),
            kind: upstream.kind.as_str(),
            weight: upstream.weight,
            api_key: upstream.api_key.as_ref().map(redact),
            cancel_grace: human(upstream.cancel_grace),
            stream_idle_timeout: human(upstream.stream_idle_timeout),
            stream_timeout: upstream
                .stream_timeout
                .map_or_else(|| "none".to_owned(), human),
            allow_model_management: upstream.allow_model_management,
            ca_file: upstream.ca_file.as_deref().map(display),
            client_cert: upstream
                .client_identity
                .as_ref()
                .map(|id| display(&id.cert)),
            client_key: upstream.client_identity.as_ref().map(|id| display(&id.key)),
            parallel: upstream.parallel,
            max_loaded_models: upstream.max_loaded_models,
            collate_for: human(upstream.collate_for),
            models: upstream
                .models
                .iter()
                .map(|(name, limits)| {
                    let entry = ModelEntryView {
                        engine_model: upstream.engine_models.get(name).map(String::as_str),
                        limits: ModelView::from(*limits),
                        // Unlimited models never queue: the keys are not allowed there.
                        queueing: (!limits.is_unlimited())
                            .then(|| QueueingView::from(upstream.queueing(name))),
                        affinity: on_off(upstream.affinity(name)),
                    };
                    (name.as_str(), entry)
                })
                .collect(),
        }
    }
}

/// A switch as the configuration writes it.
fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}

impl From<ModelLimits> for ModelView {
    fn from(limits: ModelLimits) -> Self {
        match limits {
            ModelLimits::Limited {
                parallel,
                queue,
                queue_timeout,
                capacity,
            } => ModelView::Limited {
                parallel,
                queue,
                queue_timeout: human(queue_timeout),
                capacity,
            },
            ModelLimits::Unlimited => ModelView::Unlimited {
                parallel: "unlimited",
            },
            ModelLimits::Auto {
                queue,
                queue_timeout,
            } => ModelView::Auto {
                parallel: "auto",
                queue,
                queue_timeout: human(queue_timeout),
            },
        }
    }
}

/// `"5m"`, `"1m 30s"`, `"500ms"`: what humantime writes, and reads back.
fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

fn display(path: &std::path::Path) -> String {
    path.display().to_string()
}

fn redact(_: &Secret) -> &'static str {
    REDACTED
}
