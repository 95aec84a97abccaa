//! The `[cluster]` table: the shared slot store several replicas admit through. It rules out
//! nothing elsewhere in the configuration: every admission setting is kept by the shared store
//! (`docs/scale-out.md`).

use std::time::Duration;

use figment::value::Value;
use url::Url;

use super::{optional, required};
use crate::raw::{KeyPath, Reader};
use crate::secret::Secret;
use crate::types::{Cluster, StoreDown};

const CLUSTER_KEYS: &[&str] = &[
    "redis_url",
    "key_prefix",
    "lease_ttl",
    "store_timeout",
    "on_store_down",
    "replicas",
];

/// The `[cluster]` table: `Some(None)` when absent, `None` when wrong (reported).
#[expect(
    clippy::option_option,
    reason = "the contract of `optional`: outer None = wrong (reported), inner None = absent"
)]
pub(super) fn cluster(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: Option<&Value>,
) -> Option<Option<Cluster>> {
    let Some(value) = value else {
        return Some(None);
    };
    let t = r.table(path, value, CLUSTER_KEYS)?;
    let redis_url = required(
        r,
        t,
        path,
        "redis_url",
        r#"where the shared slot store is, e.g. "redis://127.0.0.1:6379/0""#,
        redis_url,
    );
    let key_prefix = optional(
        r,
        t,
        path,
        "key_prefix",
        Cluster::DEFAULT_KEY_PREFIX.to_owned(),
        key_prefix,
    );
    let lease_ttl = optional(
        r,
        t,
        path,
        "lease_ttl",
        Cluster::DEFAULT_LEASE_TTL,
        |r, p, v| {
            let ttl = r.duration(p, v, false)?;
            if (Cluster::MIN_LEASE_TTL..=Cluster::MAX_LEASE_TTL).contains(&ttl) {
                Some(ttl)
            } else {
                let message = format!(
                    "must be between {} and {} (a dead replica's slots stay taken this long), \
                 found {}",
                    human(Cluster::MIN_LEASE_TTL),
                    human(Cluster::MAX_LEASE_TTL),
                    human(ttl),
                );
                r.invalid(p, v, message);
                None
            }
        },
    );
    let store_timeout = optional(
        r,
        t,
        path,
        "store_timeout",
        Cluster::DEFAULT_STORE_TIMEOUT,
        |r, p, v| r.duration(p, v, false),
    );
    if let (Some(ttl), Some(timeout)) = (lease_ttl, store_timeout)
        && timeout > ttl / 3
    {
        let message = format!(
            "must be at most a third of lease_ttl ({}), found {}: a renewal must fit in the \
             renewal interval",
            human(ttl / 3),
            human(timeout),
        );
        match t.get("store_timeout") {
            Some(value) => r.invalid(&path.key("store_timeout"), value, message),
            None => r.issue(&path.key("store_timeout"), message),
        }
    }
    let on_store_down = optional(
        r,
        t,
        path,
        "on_store_down",
        StoreDown::default(),
        store_down,
    );
    let replicas = optional(r, t, path, "replicas", None, |r, p, v| {
        r.count(p, v, 1).map(Some)
    });
    if on_store_down == Some(StoreDown::LocalShare) && replicas == Some(None) {
        r.missing(
            &path.key("replicas"),
            "on_store_down = \"local-share\" admits floor(parallel / replicas) per replica \
             while Redis is down, so it needs the number of replicas, e.g. `replicas = 2`",
        );
        return None;
    }
    Some(Some(Cluster {
        redis_url: redis_url?,
        key_prefix: key_prefix?,
        lease_ttl: lease_ttl?,
        store_timeout: store_timeout?,
        on_store_down: on_store_down?,
        replicas: replicas?,
    }))
}

fn redis_url(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Secret> {
    let text = r.secret_string(path, value)?;
    // Never echo the URL back: it may carry a password.
    let problem = match Url::parse(text) {
        Err(_) => Some("not a URL; expected e.g. \"redis://127.0.0.1:6379/0\""),
        Ok(url) => match url.scheme() {
            "redis" if url.host_str().is_none_or(str::is_empty) => {
                Some("a redis:// URL needs a host, e.g. \"redis://127.0.0.1:6379/0\"")
            }
            "redis" if !valid_db(url.path()) => {
                Some("the path must be a database number, e.g. \"redis://127.0.0.1:6379/0\"")
            }
            "redis" | "redis+unix" | "unix" => None,
            "rediss" => Some("rediss:// (TLS) is not supported; use redis:// on a private network"),
            _ => Some("expected a redis:// or redis+unix:// URL"),
        },
    };
    match problem {
        Some(message) => {
            r.invalid(path, value, message);
            None
        }
        None => Some(Secret::new(text)),
    }
}

/// `""`, `"/"` or `"/N"`.
fn valid_db(path: &str) -> bool {
    let db = path.trim_start_matches('/');
    db.is_empty() || db.parse::<u32>().is_ok()
}

fn key_prefix(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<String> {
    let prefix = r.string(path, value)?;
    if prefix.is_empty() || prefix.contains(['{', '}']) || prefix.contains(char::is_whitespace) {
        r.invalid(
            path,
            value,
            format!("must be non-empty, without braces or spaces, found {prefix:?}"),
        );
        return None;
    }
    Some(prefix.to_owned())
}

fn store_down(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<StoreDown> {
    match r.string(path, value)? {
        "fail-closed" => Some(StoreDown::FailClosed),
        "local-share" => Some(StoreDown::LocalShare),
        other => {
            let message = format!("expected \"fail-closed\" or \"local-share\", found {other:?}");
            r.invalid(path, value, message);
            None
        }
    }
}

fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}
