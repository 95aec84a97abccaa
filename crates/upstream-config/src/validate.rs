//! The validation pass: builds the strict types from the raw tree, checking every rule and
//! recording every violation with its key path.
//!
//! Each builder returns `Option<T>`: `None` exactly when it recorded at least one issue, so a
//! `Config` is only assembled when nothing was wrong. Builders keep going after a problem, and
//! cross-checks (duplicate authorities, alias targets) run on whatever could be read, so one
//! pass reports everything. Optional keys read as `Option<T>` too: absent gives the default,
//! present-but-wrong gives `None`.

use std::collections::{BTreeMap, BTreeSet, btree_map::Entry};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use figment::value::{Dict, Value};
use url::Url;

use crate::raw::{KeyPath, Reader};
use crate::types::{
    CacheAffinity, CertAndKey, ClientKey, Config, Kind, ModelLimits, Priority, QueueOrder,
    Queueing, Secret, Server, Upstream, authority,
};

mod cluster;

/// The top-level tables (also what an environment override has to start with).
pub(crate) const ROOT_KEYS: &[&str] = &["server", "upstreams", "aliases", "cluster"];
const SERVER_KEYS: &[&str] = &[
    "listen",
    "admin_listen",
    "max_body_bytes",
    "max_upload_bytes",
    "response_affinity_entries",
    "response_affinity_ttl",
    "affinity",
    "affinity_entries",
    "affinity_ttl",
    "affinity_block_bytes",
    "session_headers",
    "header_read_timeout",
    "connect_timeout",
    "first_byte_timeout",
    "idle_timeout",
    "max_connections",
    "admin_max_connections",
    "body_read_timeout",
    "max_buffered_body_bytes",
    "client_idle_timeout",
    "h2_max_concurrent_streams",
    "h2_keep_alive_interval",
    "tcp_keepalive",
    "client_write_timeout",
    "drain_grace",
    "health_check_interval",
    "health_check_timeout",
    "eject_after_failures",
    "restore_after_successes",
    "max_ejection_percent",
    "engine_error_retries",
    "api_keys",
    "api_keys_file",
    "tenant_header",
    "admin_token",
    "tls_cert",
    "tls_key",
    "admin_tls_cert",
    "admin_tls_key",
    "access_log",
    "cors_origins",
];
const UPSTREAM_KEYS: &[&str] = &[
    "url",
    "kind",
    "weight",
    "api_key",
    "cancel_grace",
    "stream_idle_timeout",
    "stream_timeout",
    "allow_model_management",
    "ca_file",
    "client_cert",
    "client_key",
    "parallel",
    "max_loaded_models",
    "collate_for",
    "models",
];
const MODEL_KEYS: &[&str] = &[
    "parallel",
    "queue",
    "queue_timeout",
    "capacity",
    "engine_model",
    "queue_order",
    "queue_keepalive",
    "honor_sdk_timeout",
    "prefetch",
    "affinity",
];
/// The keys of an `api_keys` entry written as a table.
const CLIENT_KEY_KEYS: &[&str] = &["key", "name", "priority", "share"];
/// The model keys that only mean something for a model that queues.
const QUEUEING_KEYS: &[&str] = &[
    "queue",
    "queue_timeout",
    "capacity",
    "queue_order",
    "queue_keepalive",
    "honor_sdk_timeout",
    "prefetch",
];

const UNLIMITED: &str = "unlimited";
const AUTO: &str = "auto";
const NONE: &str = "none";
const OFF: &str = "off";

/// Builds a [`Config`] from the merged tree; `None` when any issue was recorded.
pub(crate) fn build(r: &mut Reader<'_>, root: &Value) -> Option<Config> {
    let path = KeyPath::root();
    let table = r.table(&path, root, ROOT_KEYS)?;
    let server = server(r, &path.key("server"), table.get("server"));
    let upstreams = upstreams(r, &path.key("upstreams"), table.get("upstreams"));
    let aliases = aliases(
        r,
        &path.key("aliases"),
        table.get("aliases"),
        &upstreams.models,
    );
    // Every admission setting is kept by the shared store under `[cluster]`
    // (`docs/scale-out.md`): nothing of the upstreams is checked against it.
    let cluster = cluster::cluster(r, &path.key("cluster"), table.get("cluster"));
    Some(Config {
        server: server?,
        upstreams: upstreams.built?,
        aliases: aliases?,
        cluster: cluster?,
    })
}

/// Reads a key that must be present.
fn required<'f, 'v, T>(
    r: &mut Reader<'f>,
    table: &'v Dict,
    path: &KeyPath,
    key: &str,
    hint: &str,
    read: impl FnOnce(&mut Reader<'f>, &KeyPath, &'v Value) -> Option<T>,
) -> Option<T> {
    let path = path.key(key);
    let Some(value) = table.get(key) else {
        r.missing(&path, hint);
        return None;
    };
    read(r, &path, value)
}

/// Reads a key that may be absent: `Some(default)` then, `None` when present but wrong.
fn optional<'f, 'v, T>(
    r: &mut Reader<'f>,
    table: &'v Dict,
    path: &KeyPath,
    key: &str,
    default: T,
    read: impl FnOnce(&mut Reader<'f>, &KeyPath, &'v Value) -> Option<T>,
) -> Option<T> {
    match table.get(key) {
        Some(value) => read(r, &path.key(key), value),
        None => Some(default),
    }
}

// ===== [server] =====

#[expect(
    clippy::too_many_lines,
    reason = "one read per key of the table, in the table's order, then one assembly"
)]
fn server(r: &mut Reader<'_>, path: &KeyPath, value: Option<&Value>) -> Option<Server> {
    let Some(value) = value else {
        r.missing(
            path,
            r#"a [server] table with at least `listen = "127.0.0.1:8080"`"#,
        );
        return None;
    };
    let t = r.table(path, value, SERVER_KEYS)?;
    let listen = required(
        r,
        t,
        path,
        "listen",
        r#"the address of the OpenAI-compatible API, e.g. "127.0.0.1:8080""#,
        Reader::socket_addr,
    );
    let admin_listen = optional(r, t, path, "admin_listen", None, |r, p, v| {
        r.socket_addr(p, v).map(Some)
    });
    if let (Some(listen), Some(Some(admin))) = (listen, admin_listen)
        && listeners_collide(listen, admin)
    {
        let message = format!("{admin} collides with server.listen = {listen}; they must differ");
        r.invalid(&path.key("admin_listen"), &t["admin_listen"], message);
    }

    let duration = |key, default, allow_zero, r: &mut Reader<'_>| {
        optional(r, t, path, key, default, |r, p, v| {
            r.duration(p, v, allow_zero)
        })
    };
    let header_read_timeout = duration(
        "header_read_timeout",
        Server::DEFAULT_HEADER_READ_TIMEOUT,
        false,
        r,
    );
    let connect_timeout = duration("connect_timeout", Server::DEFAULT_CONNECT_TIMEOUT, false, r);
    let first_byte_timeout = duration(
        "first_byte_timeout",
        Server::DEFAULT_FIRST_BYTE_TIMEOUT,
        false,
        r,
    );
    let idle_timeout = duration("idle_timeout", Server::DEFAULT_IDLE_TIMEOUT, false, r);
    // Zero is meaningful here: stop without waiting for in-flight requests.
    let drain_grace = duration("drain_grace", Server::DEFAULT_DRAIN_GRACE, true, r);
    let health = health_keys(r, t, path);

    let at_least_one = |key, default, r: &mut Reader<'_>| {
        optional(r, t, path, key, default, |r, p, v| r.count(p, v, 1))
    };
    let max_body_bytes = at_least_one("max_body_bytes", Server::DEFAULT_MAX_BODY_BYTES, r);
    let max_connections = at_least_one("max_connections", Server::DEFAULT_MAX_CONNECTIONS, r);
    let max_upload_bytes = at_least_one("max_upload_bytes", Server::DEFAULT_MAX_UPLOAD_BYTES, r);
    let response_affinity_entries = at_least_one(
        "response_affinity_entries",
        Server::DEFAULT_RESPONSE_AFFINITY_ENTRIES,
        r,
    );
    let response_affinity_ttl = duration(
        "response_affinity_ttl",
        Server::DEFAULT_RESPONSE_AFFINITY_TTL,
        false,
        r,
    );

    let bounds = bound_keys(r, t, path);
    let cache_affinity = cache_affinity(r, t, path);

    let api_keys = optional(r, t, path, "api_keys", Vec::new(), client_keys);
    let tenant_header = optional(r, t, path, "tenant_header", None, |r, p, v| {
        header_name(r, p, v).map(Some)
    });
    let api_keys_file = optional(r, t, path, "api_keys_file", None, |r, p, v| {
        file_path(r, p, v).map(Some)
    });
    let admin_token = optional(r, t, path, "admin_token", None, |r, p, v| {
        secret(r, p, v).map(Some)
    });
    let (tls, admin_tls) = listener_tls(r, t, path, admin_listen.as_ref());
    buffer_fits_bodies(
        r,
        path,
        bounds.max_buffered_body_bytes,
        [
            ("max_body_bytes", max_body_bytes),
            ("max_upload_bytes", max_upload_bytes),
        ],
    );
    let access_log = optional(r, t, path, "access_log", true, Reader::boolean);
    let cors_origins = optional(r, t, path, "cors_origins", Vec::new(), cors_origins);

    Some(Server {
        listen: listen?,
        admin_listen: admin_listen?,
        max_body_bytes: max_body_bytes?,
        max_upload_bytes: max_upload_bytes?,
        response_affinity_entries: response_affinity_entries?,
        response_affinity_ttl: response_affinity_ttl?,
        cache_affinity: cache_affinity?,
        header_read_timeout: header_read_timeout?,
        connect_timeout: connect_timeout?,
        first_byte_timeout: first_byte_timeout?,
        idle_timeout: idle_timeout?,
        max_connections: max_connections?,
        admin_max_connections: bounds.admin_max_connections?,
        body_read_timeout: bounds.body_read_timeout?,
        max_buffered_body_bytes: bounds.max_buffered_body_bytes?,
        client_idle_timeout: bounds.client_idle_timeout?,
        h2_max_concurrent_streams: bounds.h2_max_concurrent_streams?,
        h2_keep_alive_interval: bounds.h2_keep_alive_interval?,
        tcp_keepalive: bounds.tcp_keepalive?,
        client_write_timeout: bounds.client_write_timeout?,
        drain_grace: drain_grace?,
        health_check_interval: health.interval?,
        health_check_timeout: health.timeout?,
        eject_after_failures: health.eject_after?,
        restore_after_successes: health.restore_after?,
        max_ejection_percent: health.max_ejection_percent?,
        engine_error_retries: health.engine_error_retries?,
        api_keys: api_keys?,
        api_keys_file: api_keys_file?,
        tenant_header: tenant_header?,
        admin_token: admin_token?,
        tls: tls?,
        admin_tls: admin_tls?,
        access_log: access_log?,
        cors_origins: cors_origins?,
    })
}

/// The listeners' certificates (`tls_cert` / `tls_key`, `admin_tls_cert` / `admin_tls_key`),
/// each `None` when wrong. The admin pair needs an admin listener.
#[expect(
    clippy::option_option,
    reason = "the contract of `optional`: outer None = wrong (reported), inner None = absent"
)]
fn listener_tls(
    r: &mut Reader<'_>,
    t: &Dict,
    path: &KeyPath,
    admin_listen: Option<&Option<SocketAddr>>,
) -> (Option<Option<CertAndKey>>, Option<Option<CertAndKey>>) {
    let tls = cert_and_key(r, t, path, ("tls_cert", "tls_key"));
    let admin_tls = cert_and_key(r, t, path, ("admin_tls_cert", "admin_tls_key"));
    if matches!(admin_listen, Some(None)) && matches!(admin_tls, Some(Some(_))) {
        r.issue(
            &path.key("admin_tls_cert"),
            "set without server.admin_listen: there is no admin listener to serve it on",
        );
    }
    (tls, admin_tls)
}

/// `max_buffered_body_bytes` must hold one body of each limit: a request under its own limit
/// but over the whole buffer would be refused with `503 overloaded` every time, and its
/// `Retry-After` would be a lie. Only checked when all three values are valid (a wrong one is
/// reported already).
fn buffer_fits_bodies(
    r: &mut Reader<'_>,
    path: &KeyPath,
    buffered: Option<usize>,
    limits: [(&str, Option<usize>); 2],
) {
    let Some(buffered) = buffered else { return };
    for (key, limit) in limits {
        if let Some(limit) = limit
            && limit > buffered
        {
            r.issue(
                &path.key("max_buffered_body_bytes"),
                format!(
                    "is {buffered}, less than server.{key} ({limit}): a body under {key} but \
                     over the whole buffer could never be accepted; raise \
                     max_buffered_body_bytes to at least {limit} or lower {key}"
                ),
            );
        }
    }
}

/// A file path: a non-empty string.
fn file_path(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<PathBuf> {
    let file = r.string(path, value)?;
    if file.is_empty() {
        r.invalid(path, value, "must not be empty (leave the key out instead)");
        return None;
    }
    Some(PathBuf::from(file))
}

/// A certificate chain and its private key, named by two keys that go together: both or
/// neither. `None` when either is wrong.
#[expect(
    clippy::option_option,
    reason = "the contract of `optional`: outer None = wrong (reported), inner None = absent"
)]
fn cert_and_key(
    r: &mut Reader<'_>,
    t: &Dict,
    path: &KeyPath,
    (cert_key, key_key): (&str, &str),
) -> Option<Option<CertAndKey>> {
    let some_path = |r: &mut Reader<'_>, p: &KeyPath, v: &Value| file_path(r, p, v).map(Some);
    let cert = optional(r, t, path, cert_key, None, some_path);
    let key = optional(r, t, path, key_key, None, some_path);
    match (cert?, key?) {
        (Some(cert), Some(key)) => Some(Some(CertAndKey { cert, key })),
        (None, None) => Some(None),
        (Some(_), None) => {
            r.missing(
                &path.key(key_key),
                &format!("`{cert_key}` needs the certificate's private key (PEM) too"),
            );
            None
        }
        (None, Some(_)) => {
            r.missing(
                &path.key(cert_key),
                &format!("`{key_key}` needs its certificate chain (PEM) too"),
            );
            None
        }
    }
}

/// The health-check keys of `[server]`, and what to do about an engine's error answer, each
/// `None` when present but wrong.
struct HealthKeys {
    interval: Option<Duration>,
    timeout: Option<Duration>,
    eject_after: Option<usize>,
    restore_after: Option<usize>,
    max_ejection_percent: Option<usize>,
    engine_error_retries: Option<usize>,
}

fn health_keys(r: &mut Reader<'_>, t: &Dict, path: &KeyPath) -> HealthKeys {
    let positive = |r: &mut Reader<'_>, p: &KeyPath, v: &Value| r.duration(p, v, false);
    let at_least_one = |r: &mut Reader<'_>, p: &KeyPath, v: &Value| r.count(p, v, 1);
    HealthKeys {
        interval: optional(
            r,
            t,
            path,
            "health_check_interval",
            Server::DEFAULT_HEALTH_CHECK_INTERVAL,
            positive,
        ),
        timeout: optional(
            r,
            t,
            path,
            "health_check_timeout",
            Server::DEFAULT_HEALTH_CHECK_TIMEOUT,
            positive,
        ),
        eject_after: optional(
            r,
            t,
            path,
            "eject_after_failures",
            Server::DEFAULT_EJECT_AFTER_FAILURES,
            at_least_one,
        ),
        restore_after: optional(
            r,
            t,
            path,
            "restore_after_successes",
            Server::DEFAULT_RESTORE_AFTER_SUCCESSES,
            at_least_one,
        ),
        max_ejection_percent: optional(
            r,
            t,
            path,
            "max_ejection_percent",
            Server::DEFAULT_MAX_EJECTION_PERCENT,
            |r, p, v| {
                let percent = r.count(p, v, 0)?;
                if percent > 100 {
                    r.invalid(
                        p,
                        v,
                        format!("a share in percent, at most 100, found {percent}"),
                    );
                    return None;
                }
                Some(percent)
            },
        ),
        // Zero is meaningful: pass an engine's 502/503/504 through at once.
        engine_error_retries: optional(
            r,
            t,
            path,
            "engine_error_retries",
            Server::DEFAULT_ENGINE_ERROR_RETRIES,
            |r, p, v| r.count(p, v, 0),
        ),
    }
}

/// An upstream's timing keys, each `None` when present but wrong.
struct Timing {
    cancel_grace: Option<Duration>,
    stream_idle_timeout: Option<Duration>,
    /// `Some(None)`: `"none"`, no total bound.
    #[expect(
        clippy::option_option,
        reason = "the outer `None` is a wrong value (reported), the inner one the value \"none\""
    )]
    stream_timeout: Option<Option<Duration>>,
    collate_for: Option<Duration>,
}

fn upstream_timing(r: &mut Reader<'_>, t: &Dict, path: &KeyPath, kind: Option<Kind>) -> Timing {
    // The default depends on the kind; an unreadable kind was reported already, and then the
    // default does not matter (nothing is built).
    let default_grace = kind.map_or(Duration::ZERO, Kind::default_cancel_grace);
    let cancel_grace = optional(r, t, path, "cancel_grace", default_grace, |r, p, v| {
        r.duration(p, v, true)
    });
    let stream_idle_timeout = optional(
        r,
        t,
        path,
        "stream_idle_timeout",
        Upstream::DEFAULT_STREAM_IDLE_TIMEOUT,
        |r, p, v| r.duration(p, v, false),
    );
    let stream_timeout = optional(
        r,
        t,
        path,
        "stream_timeout",
        Upstream::DEFAULT_STREAM_TIMEOUT,
        |r, p, v| match v {
            Value::String(_, text) if text == NONE => Some(None),
            _ => r.duration(p, v, false).map(Some),
        },
    );
    let collate_for = optional(
        r,
        t,
        path,
        "collate_for",
        Upstream::DEFAULT_COLLATE_FOR,
        |r, p, v| r.duration(p, v, true),
    );
    Timing {
        cancel_grace,
        stream_idle_timeout,
        stream_timeout,
        collate_for,
    }
}

/// The `[server]` keys that bound slow, hostile or broken peers, each `None` when present but
/// wrong.
struct BoundKeys {
    admin_max_connections: Option<usize>,
    body_read_timeout: Option<Duration>,
    max_buffered_body_bytes: Option<usize>,
    client_idle_timeout: Option<Duration>,
    h2_max_concurrent_streams: Option<usize>,
    h2_keep_alive_interval: Option<Duration>,
    tcp_keepalive: Option<Duration>,
    client_write_timeout: Option<Duration>,
}

fn bound_keys(r: &mut Reader<'_>, t: &Dict, path: &KeyPath) -> BoundKeys {
    let positive = |r: &mut Reader<'_>, p: &KeyPath, v: &Value| r.duration(p, v, false);
    let at_least_one = |r: &mut Reader<'_>, p: &KeyPath, v: &Value| r.count(p, v, 1);
    BoundKeys {
        admin_max_connections: optional(
            r,
            t,
            path,
            "admin_max_connections",
            Server::DEFAULT_ADMIN_MAX_CONNECTIONS,
            at_least_one,
        ),
        body_read_timeout: optional(
            r,
            t,
            path,
            "body_read_timeout",
            Server::DEFAULT_BODY_READ_TIMEOUT,
            positive,
        ),
        max_buffered_body_bytes: optional(
            r,
            t,
            path,
            "max_buffered_body_bytes",
            Server::DEFAULT_MAX_BUFFERED_BODY_BYTES,
            at_least_one,
        ),
        client_idle_timeout: optional(
            r,
            t,
            path,
            "client_idle_timeout",
            Server::DEFAULT_CLIENT_IDLE_TIMEOUT,
            positive,
        ),
        h2_max_concurrent_streams: optional(
            r,
            t,
            path,
            "h2_max_concurrent_streams",
            Server::DEFAULT_H2_MAX_CONCURRENT_STREAMS,
            at_least_one,
        ),
        h2_keep_alive_interval: optional(
            r,
            t,
            path,
            "h2_keep_alive_interval",
            Server::DEFAULT_H2_KEEP_ALIVE_INTERVAL,
            positive,
        ),
        tcp_keepalive: optional(
            r,
            t,
            path,
            "tcp_keepalive",
            Server::DEFAULT_TCP_KEEPALIVE,
            positive,
        ),
        client_write_timeout: optional(
            r,
            t,
            path,
            "client_write_timeout",
            Server::DEFAULT_CLIENT_WRITE_TIMEOUT,
            positive,
        ),
    }
}

/// Whether two listeners cannot both bind: same port (0 asks the OS for a fresh one, so it never
/// collides) and the same IP, or an unspecified IP (`0.0.0.0`, `[::]`) on either side.
fn listeners_collide(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

/// A credential: non-empty and header-safe. Its value never appears in a message.
fn secret(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Secret> {
    let text = r.secret_string(path, value)?;
    if text.is_empty() {
        r.invalid(path, value, "must not be empty");
        return None;
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        let message = "must not contain whitespace or control characters (it travels in an HTTP \
                       header; check for a trailing newline)";
        r.invalid(path, value, message);
        return None;
    }
    Some(Secret::new(text))
}

/// `server.api_keys`: bare keys, or tables with a key and how its requests queue.
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

fn client_keys(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Vec<ClientKey>> {
    let items = r.array(path, value)?;
    let keys: Vec<_> = items
        .iter()
        .enumerate()
        .map(|(i, item)| client_key(r, &path.index(i), item))
        .collect();
    keys.into_iter().collect()
}

fn client_key(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<ClientKey> {
    if !matches!(value, Value::Dict(..)) {
        return secret(r, path, value).map(ClientKey::bare);
    }
    let t = r.table(path, value, CLIENT_KEY_KEYS)?;
    let key = required(
        r,
        t,
        path,
        "key",
        "the key clients send as `Authorization: Bearer KEY`",
        secret,
    );
    let name = optional(r, t, path, "name", None, |r, p, v| {
        tenant_name(r, p, v).map(Some)
    });
    let priority = optional(r, t, path, "priority", Priority::Normal, |r, p, v| {
        let text = r.string(p, v)?;
        let priority = Priority::from_name(text);
        if priority.is_none() {
            let names = Priority::ALL.map(Priority::as_str).join(", ");
            let message = format!("unknown priority class {text:?} (expected one of: {names})");
            r.invalid(p, v, message);
        }
        priority
    });
    let share = optional(r, t, path, "share", 1, |r, p, v| {
        let share = r.count(p, v, 1)?;
        match u32::try_from(share) {
            Ok(share) if share <= ClientKey::MAX_SHARE => Some(share),
            _ => {
                let max = ClientKey::MAX_SHARE;
                r.invalid(p, v, format!("must be at most {max}, found {share}"));
                None
            }
        }
    });
    Some(ClientKey {
        key: key?,
        name: name?,
        priority: priority?,
        share: share?,
    })
}

/// A tenant's name: non-empty, at most [`Server::MAX_TENANT_LEN`] bytes, no control characters.
fn tenant_name(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<String> {
    let text = r.string(path, value)?;
    let max = Server::MAX_TENANT_LEN;
    let problem = if text.is_empty() {
        Some("must not be empty; leave it out for a tenant of the key's own".to_owned())
    } else if text.len() > max {
        Some(format!("must be at most {max} bytes, found {}", text.len()))
    } else if text.chars().any(char::is_control) {
        Some("must not contain control characters".to_owned())
    } else {
        None
    };
    match problem {
        Some(problem) => {
            r.invalid(path, value, problem);
            None
        }
        None => Some(text.to_owned()),
    }
}

/// `on` or `off`.
fn on_off(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<bool> {
    match r.string(path, value)? {
        "on" => Some(true),
        OFF => Some(false),
        other => {
            r.invalid(
                path,
                value,
                format!(r#"expected "on" or "off", found {other:?}"#),
            );
            None
        }
    }
}

/// The `[server]` keys of cache-aware routing, defaults for those absent; `None` when any is
/// wrong (reported).
fn cache_affinity(r: &mut Reader<'_>, t: &Dict, path: &KeyPath) -> Option<CacheAffinity> {
    let defaults = CacheAffinity::default();
    let enabled = optional(r, t, path, "affinity", defaults.enabled, on_off);
    let entries = optional(
        r,
        t,
        path,
        "affinity_entries",
        defaults.entries,
        |r, p, v| r.count(p, v, CacheAffinity::MIN_ENTRIES),
    );
    let ttl = optional(r, t, path, "affinity_ttl", defaults.ttl, |r, p, v| {
        let ttl = r.duration(p, v, false)?;
        if ttl < Duration::from_secs(1) {
            r.invalid(p, v, "must be at least 1s (the index counts whole seconds)");
            return None;
        }
        Some(ttl)
    });
    let block_bytes = optional(
        r,
        t,
        path,
        "affinity_block_bytes",
        defaults.block_bytes,
        |r, p, v| {
            let bytes = r.count(p, v, CacheAffinity::MIN_BLOCK_BYTES)?;
            if bytes > CacheAffinity::MAX_BLOCK_BYTES {
                let message = format!("must be at most {}", CacheAffinity::MAX_BLOCK_BYTES);
                r.invalid(p, v, message);
                return None;
            }
            Some(bytes)
        },
    );
    let session_headers = optional(
        r,
        t,
        path,
        "session_headers",
        defaults.session_headers,
        |r, p, v| {
            let items = r.array(p, v)?;
            let names: Vec<Option<String>> = items
                .iter()
                .enumerate()
                .map(|(i, item)| header_name(r, &p.index(i), item))
                .collect();
            names.into_iter().collect()
        },
    );
    Some(CacheAffinity {
        enabled: enabled?,
        entries: entries?,
        ttl: ttl?,
        block_bytes: block_bytes?,
        session_headers: session_headers?,
    })
}

/// An HTTP header name (RFC 9110 token characters), stored in lower case.
fn header_name(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<String> {
    const TOKEN_PUNCTUATION: &str = "!#$%&'*+-.^_`|~";
    let text = r.string(path, value)?;
    let valid = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || TOKEN_PUNCTUATION.contains(c));
    if !valid {
        let message = format!("{text:?} is not an HTTP header name (e.g. \"x-tenant\")");
        r.invalid(path, value, message);
        return None;
    }
    Some(text.to_ascii_lowercase())
}

// ===== [upstreams] =====

/// What the upstream tables gave: the upstreams when all were valid, and every model name
/// mentioned (valid or not) so alias checks do not cascade from an unrelated mistake.
struct Upstreams {
    built: Option<BTreeMap<String, Upstream>>,
    models: BTreeSet<String>,
}

fn upstreams(r: &mut Reader<'_>, path: &KeyPath, value: Option<&Value>) -> Upstreams {
    let mut out = Upstreams {
        built: None,
        models: BTreeSet::new(),
    };
    let Some(value) = value else {
        r.missing(path, "at least one [upstreams.NAME] table");
        return out;
    };
    let Some(dict) = r.dict(path, value) else {
        return out;
    };
    if dict.is_empty() {
        r.invalid(path, value, "at least one upstream is required");
        return out;
    }

    let mut built = Some(BTreeMap::new());
    // authority → the first upstream that claimed it.
    let mut authorities: BTreeMap<String, &str> = BTreeMap::new();
    for (name, value) in dict {
        let upstream_path = path.key(name);
        let read = upstream(r, &upstream_path, name, value);
        out.models.extend(read.models);
        if let Some((url, url_value)) = &read.url {
            match authorities.entry(authority(url)) {
                Entry::Vacant(entry) => {
                    entry.insert(name);
                }
                Entry::Occupied(entry) => {
                    let first = path.key(entry.get());
                    let message = format!(
                        "same authority {} as {first}; the limiter keys on scheme, host and port, \
                         so one engine is one upstream: list all its models under {first}",
                        entry.key()
                    );
                    r.invalid(&upstream_path.key("url"), url_value, message);
                    built = None;
                }
            }
        }
        match (built.as_mut(), read.built) {
            (Some(map), Some(upstream)) => {
                map.insert(name.clone(), upstream);
            }
            _ => built = None,
        }
    }
    out.built = built;
    out
}

struct ReadUpstream<'v> {
    /// The parsed URL and the value it came from, for the duplicate-authority check.
    url: Option<(Url, &'v Value)>,
    models: Vec<String>,
    built: Option<Upstream>,
}

#[expect(
    clippy::too_many_lines,
    reason = "one read per key of the table, in the table's order, then one assembly"
)]
fn upstream<'v>(
    r: &mut Reader<'_>,
    path: &KeyPath,
    name: &str,
    value: &'v Value,
) -> ReadUpstream<'v> {
    let mut out = ReadUpstream {
        url: None,
        models: Vec::new(),
        built: None,
    };
    let name_ok = !name.is_empty();
    if !name_ok {
        r.issue(path, "an upstream name must not be empty");
    }
    let Some(t) = r.table(path, value, UPSTREAM_KEYS) else {
        return out;
    };

    let url = required(
        r,
        t,
        path,
        "url",
        r#"the engine's base URL, e.g. "http://127.0.0.1:8081""#,
        upstream_url,
    );
    out.url = url.clone().zip(t.get("url"));
    let kind = required(
        r,
        t,
        path,
        "kind",
        "one of: llama-server, vllm, ollama, openai",
        |r, p, v| {
            let text = r.string(p, v)?;
            let kind = Kind::from_name(text);
            if kind.is_none() {
                let message = format!("unknown kind {text:?} (expected one of: {})", kind_names());
                r.invalid(p, v, message);
            }
            kind
        },
    );
    let weight = optional(r, t, path, "weight", Upstream::DEFAULT_WEIGHT, weight);
    let api_key = optional(r, t, path, "api_key", None, |r, p, v| {
        secret(r, p, v).map(Some)
    });
    let Timing {
        cancel_grace,
        stream_idle_timeout,
        stream_timeout,
        collate_for,
    } = upstream_timing(r, t, path, kind);
    let allow_model_management =
        optional(r, t, path, "allow_model_management", false, Reader::boolean);
    let tls = upstream_tls(r, t, path, url.as_ref());
    let parallel = optional(r, t, path, "parallel", None, |r, p, v| {
        r.count(p, v, 1).map(Some)
    });
    let max_loaded_models = optional(r, t, path, "max_loaded_models", None, |r, p, v| {
        r.count(p, v, 1).map(Some)
    });
    let models = required(
        r,
        t,
        path,
        "models",
        "at least one [upstreams.NAME.models.MODEL] table",
        |r, p, v| {
            let dict = r.dict(p, v)?;
            out.models.extend(dict.keys().cloned());
            models(r, p, v, dict, kind)
        },
    );
    let (models, engine_models, queueing, affinity_off) = models
        .map_or((None, None, None, None), |(m, e, q, a)| {
            (Some(m), Some(e), Some(q), Some(a))
        });

    if let (
        true,
        Some(url),
        Some(kind),
        Some(weight),
        Some(api_key),
        Some(cancel_grace),
        Some(stream_idle_timeout),
        Some(stream_timeout),
        Some(allow_model_management),
        Some(tls),
        Some(parallel),
        Some(max_loaded_models),
        Some(collate_for),
        Some(models),
        Some(engine_models),
        Some(queueing),
        Some(affinity_off),
    ) = (
        name_ok,
        url,
        kind,
        weight,
        api_key,
        cancel_grace,
        stream_idle_timeout,
        stream_timeout,
        allow_model_management,
        tls,
        parallel,
        max_loaded_models,
        collate_for,
        models,
        engine_models,
        queueing,
        affinity_off,
    ) {
        out.built = Some(Upstream {
            name: name.to_owned(),
            url,
            kind,
            weight,
            api_key,
            cancel_grace,
            stream_idle_timeout,
            stream_timeout,
            allow_model_management,
            ca_file: tls.ca_file,
            client_identity: tls.client_identity,
            parallel,
            max_loaded_models,
            collate_for,
            models,
            engine_models,
            queueing,
            affinity_off,
        });
    }
    out
}

/// An upstream's `weight`: finite and positive.
fn weight(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<f64> {
    let weight = r.number(path, value)?;
    if weight.is_finite() && weight > 0.0 {
        Some(weight)
    } else {
        r.invalid(
            path,
            value,
            format!("must be finite and greater than 0, found {weight}"),
        );
        None
    }
}

/// An upstream's TLS keys.
struct UpstreamTlsKeys {
    ca_file: Option<PathBuf>,
    client_identity: Option<CertAndKey>,
}

/// `ca_file` and `client_cert` / `client_key`, which only an `https` upstream uses; `None`
/// when any is wrong (reported).
fn upstream_tls(
    r: &mut Reader<'_>,
    t: &Dict,
    path: &KeyPath,
    url: Option<&Url>,
) -> Option<UpstreamTlsKeys> {
    let ca_file = optional(r, t, path, "ca_file", None, |r, p, v| {
        file_path(r, p, v).map(Some)
    });
    let client_identity = cert_and_key(r, t, path, ("client_cert", "client_key"));
    let plain_http = url.is_some_and(|url| url.scheme() == "http");
    let mut misplaced = false;
    for key in ["ca_file", "client_cert", "client_key"] {
        if plain_http && t.contains_key(key) {
            r.issue(
                &path.key(key),
                "only used with an https url: this upstream's url is http",
            );
            misplaced = true;
        }
    }
    Some(UpstreamTlsKeys {
        ca_file: ca_file?,
        client_identity: client_identity?,
    })
    .filter(|_| !misplaced)
}

fn kind_names() -> String {
    Kind::ALL.map(Kind::as_str).join(", ")
}

/// An upstream base URL: http(s), a host, no credentials, query or fragment. A path prefix is
/// kept, except a trailing `/v1`, which the client's own path already carries.
fn upstream_url(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Url> {
    let text = r.string(path, value)?;
    let url = match Url::parse(text) {
        Ok(url) => url,
        Err(error) => {
            // A URL with `@` may carry a password: describe it without echoing it.
            let message = if text.contains('@') {
                format!("invalid URL: {error}")
            } else {
                format!("invalid URL {text:?}: {error}")
            };
            r.invalid(path, value, message);
            return None;
        }
    };
    // Checked first, and the URL is not echoed from here on: it may hold a password.
    if !url.username().is_empty() || url.password().is_some() {
        let message = "must not contain credentials; set `api_key` for a bearer token instead";
        r.invalid(path, value, message);
        return None;
    }
    let mut problems = Vec::new();
    if !matches!(url.scheme(), "http" | "https") {
        problems.push(format!(
            "scheme must be http or https, found {:?}",
            url.scheme()
        ));
    } else if url.host_str().is_none_or(str::is_empty) {
        problems.push("must have a host".to_owned());
    }
    if url.query().is_some() {
        problems.push("must not have a query (`?…`)".to_owned());
    }
    if url.fragment().is_some() {
        problems.push("must not have a fragment (`#…`)".to_owned());
    }
    let prefix = url.path().trim_end_matches('/');
    if prefix.ends_with("/v1") {
        problems.push(format!(
            "path {prefix:?} ends in /v1, but clients' paths already start with /v1 and the \
             gateway appends them to this URL: drop the trailing /v1"
        ));
    }
    if problems.is_empty() {
        Some(url)
    } else {
        r.invalid(path, value, problems.join("; "));
        None
    }
}

/// The models of one upstream, the names their engine knows them by, and how they queue.
type Models = (
    BTreeMap<String, ModelLimits>,
    BTreeMap<String, String>,
    BTreeMap<String, Queueing>,
    BTreeSet<String>,
);

/// `kind` is the upstream's, when it could be read (`parallel = "auto"` depends on it).
fn models(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: &Value,
    dict: &Dict,
    kind: Option<Kind>,
) -> Option<Models> {
    if dict.is_empty() {
        r.invalid(path, value, "at least one model is required");
        return None;
    }
    let mut built = Some((
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeSet::new(),
    ));
    // Engine name → the configured model that uses it: two models that send the same name to
    // one engine would be one model there, counted against two limits.
    let mut engine_names: BTreeMap<String, &str> = BTreeMap::new();
    for (name, value) in dict {
        let model_path = path.key(name);
        if name.is_empty() {
            r.issue(&model_path, "a model name must not be empty");
            built = None;
        }
        let engine_model = engine_model(r, &model_path, value);
        let engine_name = match &engine_model {
            EngineModel::Named(engine) => engine.as_str(),
            EngineModel::Absent | EngineModel::Invalid => name.as_str(),
        };
        if let Some(first) = engine_names.insert(engine_name.to_owned(), name) {
            let message = format!(
                "models {first:?} and {name:?} both reach this engine as {engine_name:?}; \
                 configure the engine's model once (use [aliases] for a second client name)"
            );
            r.issue(&model_path, message);
            built = None;
        }
        match (
            built.as_mut(),
            model_limits(r, &model_path, value, kind),
            engine_model,
            queueing(r, &model_path, value),
            model_affinity(r, &model_path, value),
        ) {
            (_, _, EngineModel::Invalid, _, _)
            | (None, _, _, _, _)
            | (_, None, _, _, _)
            | (_, _, _, None, _)
            | (_, _, _, _, None) => {
                built = None;
            }
            (
                Some((limits_map, engines, queues, affinity_off)),
                Some(limits),
                engine,
                Some(queueing),
                Some(affinity),
            ) => {
                if !affinity {
                    affinity_off.insert(name.clone());
                }
                limits_map.insert(name.clone(), limits);
                if let EngineModel::Named(engine) = engine {
                    engines.insert(name.clone(), engine);
                }
                if !limits.is_unlimited() {
                    queues.insert(name.clone(), queueing);
                }
            }
        }
    }
    built
}

/// The model table's `affinity` (`"on"` when absent).
fn model_affinity(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<bool> {
    // Not a table: `model_limits` reports it.
    let Value::Dict(_, t) = value else {
        return Some(true);
    };
    optional(r, t, path, "affinity", true, on_off)
}

/// What a model table's `engine_model` said.
enum EngineModel {
    /// Absent: the engine knows the model by its own name.
    Absent,
    /// The engine's name for the model.
    Named(String),
    /// Not a non-empty string (already reported).
    Invalid,
}

/// The model table's `engine_model`.
fn engine_model(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> EngineModel {
    // Not a table: `model_limits` reports it.
    let Value::Dict(_, table) = value else {
        return EngineModel::Absent;
    };
    let Some(v) = table.get("engine_model") else {
        return EngineModel::Absent;
    };
    let key = path.key("engine_model");
    let Some(text) = r.string(&key, v) else {
        return EngineModel::Invalid;
    };
    if text.is_empty() {
        r.invalid(
            &key,
            v,
            "must not be empty; leave it out to send the model's own name",
        );
        return EngineModel::Invalid;
    }
    EngineModel::Named(text.to_owned())
}

/// The model table's `queue_order`, `queue_keepalive`, `honor_sdk_timeout` and `prefetch`,
/// defaults for those absent; `None` when any is wrong (reported). Whether they are allowed at
/// all (not with `parallel = "unlimited"`) is `model_limits`' business.
fn queueing(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Queueing> {
    // Not a table: `model_limits` reports it.
    let Value::Dict(_, t) = value else {
        return Some(Queueing::default());
    };
    let defaults = Queueing::default();
    let order = optional(r, t, path, "queue_order", defaults.order, |r, p, v| {
        let text = r.string(p, v)?;
        let order = QueueOrder::from_name(text);
        if order.is_none() {
            r.invalid(
                p,
                v,
                format!(r#"unknown queue order {text:?} (expected "fifo" or "fair")"#),
            );
        }
        order
    });
    let keepalive = optional(r, t, path, "queue_keepalive", None, |r, p, v| {
        if matches!(v, Value::String(_, text) if text == OFF) {
            return Some(None);
        }
        let every = r.duration(p, v, false)?;
        let (min, max) = (Queueing::MIN_KEEPALIVE, Queueing::MAX_KEEPALIVE);
        if every < min || every > max {
            let message = format!(
                "must be between {} and {} (or \"off\"), found {}",
                humantime::format_duration(min),
                humantime::format_duration(max),
                humantime::format_duration(every)
            );
            r.invalid(p, v, message);
            return None;
        }
        Some(Some(every))
    });
    let honor_sdk_timeout = optional(
        r,
        t,
        path,
        "honor_sdk_timeout",
        defaults.honor_sdk_timeout,
        Reader::boolean,
    );
    let prefetch = optional(r, t, path, "prefetch", defaults.prefetch, |r, p, v| {
        let ahead = r.count(p, v, 0)?;
        if ahead > Queueing::MAX_PREFETCH {
            let message = format!(
                "must be at most {}: it is how many requests wait inside the engine beyond its \
                 slots, a handful at most",
                Queueing::MAX_PREFETCH
            );
            r.invalid(p, v, message);
            return None;
        }
        Some(ahead)
    });
    Some(Queueing {
        order: order?,
        keepalive: keepalive?,
        honor_sdk_timeout: honor_sdk_timeout?,
        prefetch: prefetch?,
    })
}

/// What `parallel` said.
enum Parallel {
    Slots(usize),
    Unlimited,
    Auto,
    /// Missing or wrong (already reported); the other keys are still checked as if limited.
    Invalid,
}

fn model_limits(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: &Value,
    kind: Option<Kind>,
) -> Option<ModelLimits> {
    let t = r.table(path, value, MODEL_KEYS)?;
    let parallel_path = path.key("parallel");
    let parallel = match t.get("parallel") {
        None => {
            r.missing(
                &parallel_path,
                r#"the number of concurrent slots, an integer of at least 1, "auto" (llama-server), or "unlimited""#,
            );
            Parallel::Invalid
        }
        Some(v @ Value::String(_, text)) => match text.as_str() {
            UNLIMITED => Parallel::Unlimited,
            // An unreadable kind was reported already; "auto" is then checked no further.
            AUTO => match kind {
                Some(Kind::LlamaServer) | None => Parallel::Auto,
                Some(kind) => {
                    let message = format!(
                        r#"parallel = "auto" reads the slot count from llama-server's /props, but this upstream is kind = "{kind}"; state the number of slots"#
                    );
                    r.invalid(&parallel_path, v, message);
                    Parallel::Invalid
                }
            },
            other => {
                let message = format!(
                    r#"expected an integer of at least 1, "auto" or "unlimited", found {other:?}"#
                );
                r.invalid(&parallel_path, v, message);
                Parallel::Invalid
            }
        },
        Some(v) => r
            .count(&parallel_path, v, 1)
            .map_or(Parallel::Invalid, Parallel::Slots),
    };

    if let Parallel::Unlimited = parallel {
        // An unlimited model holds no slot, so it has nothing to queue for or cap.
        let mut ok = true;
        for &key in QUEUEING_KEYS {
            if let Some(v) = t.get(key) {
                let message =
                    r#"not allowed with parallel = "unlimited" (nothing waits for a slot)"#;
                r.invalid(&path.key(key), v, message);
                ok = false;
            }
        }
        return ok.then_some(ModelLimits::Unlimited);
    }

    let auto = matches!(parallel, Parallel::Auto);
    if auto && let Some(v) = t.get("capacity") {
        let message =
            r#"not allowed with parallel = "auto" (the engine reports its own slot count)"#;
        r.invalid(&path.key("capacity"), v, message);
    }

    let queue = required(
        r,
        t,
        path,
        "queue",
        "how many requests may wait for a slot, an integer of at least 0; limits never default",
        |r, p, v| r.count(p, v, 0),
    );
    let queue_timeout = required(
        r,
        t,
        path,
        "queue_timeout",
        r#"the longest wait for a slot, e.g. "30s"; limits never default"#,
        |r, p, v| r.duration(p, v, false),
    );
    let capacity = optional(r, t, path, "capacity", None, |r, p, v| {
        r.count(p, v, 1).map(Some)
    });

    if auto {
        return match (queue, queue_timeout, t.contains_key("capacity")) {
            (Some(queue), Some(queue_timeout), false) => Some(ModelLimits::Auto {
                queue,
                queue_timeout,
            }),
            _ => None,
        };
    }
    let Parallel::Slots(parallel) = parallel else {
        return None;
    };
    if let Some(Some(capacity)) = capacity
        && parallel > capacity
    {
        let message = format!(
            "{parallel} is above capacity = {capacity}, the engine's real slot count; lower \
             parallel or give the engine more slots"
        );
        r.invalid(&parallel_path, &t["parallel"], message);
        return None;
    }
    Some(ModelLimits::Limited {
        parallel,
        queue: queue?,
        queue_timeout: queue_timeout?,
        capacity: capacity?,
    })
}

// ===== [aliases] =====

fn aliases(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: Option<&Value>,
    models: &BTreeSet<String>,
) -> Option<BTreeMap<String, String>> {
    let Some(value) = value else {
        return Some(BTreeMap::new());
    };
    let dict = r.dict(path, value)?;
    let mut built = Some(BTreeMap::new());
    for (alias, value) in dict {
        let alias_path = path.key(alias);
        let Some(target) = r.string(&alias_path, value) else {
            built = None;
            continue;
        };
        let problem = if alias.is_empty() {
            Some("an alias name must not be empty".to_owned())
        } else if models.contains(alias) {
            Some(format!(
                "{alias:?} is also a configured model name; an alias must not shadow a model"
            ))
        } else if target == alias {
            Some(format!("{alias:?} points to itself"))
        } else if dict.contains_key(target) {
            Some(format!(
                "points to {target:?}, which is itself an alias; aliases do not chain: point it \
                 at a configured model"
            ))
        } else if !models.contains(target) {
            let known: Vec<_> = models.iter().map(String::as_str).collect();
            Some(format!(
                "points to {target:?}, which no upstream configures (configured models: {})",
                known.join(", ")
            ))
        } else {
            None
        };
        match (problem, built.as_mut()) {
            (Some(problem), _) => {
                r.invalid(&alias_path, value, problem);
                built = None;
            }
            (None, Some(map)) => {
                map.insert(alias.clone(), target.to_owned());
            }
            (None, None) => {}
        }
    }
    built
}
