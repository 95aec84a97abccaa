//! The `[cluster]` table, one declaration per key (see [`crate::key`]): the shared slot store
//! that several replicas admit through. The checks between its keys (`store_timeout` against
//! `lease_ttl`, `local-share` needs `replicas`) run after the reads, in `validate::cluster`.

use std::time::Duration;

use figment::value::Value;
use url::Url;

use crate::key::{self, table};
use crate::raw::{KeyPath, Reader};
use crate::secret::Secret;
use crate::show::{REDACTED, Show, Shown, human};

table! {
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
    pub struct Cluster, read as ClusterKeys {
        /// `redis://host:port/db` or `redis+unix:///path`: where the shared store is. A secret
        /// (it may carry a password); printed with the password redacted.
        redis_url: Secret = key::required(
            "redis_url",
            r#"where the shared slot store is, e.g. "redis://127.0.0.1:6379/0""#,
            redis_url,
        )
        .show(|url| Some(Shown::Text(redact_password(url.expose()))));
        /// Prefix of every Redis key and channel (default [`Cluster::DEFAULT_KEY_PREFIX`]), so
        /// that several deployments can share one Redis.
        key_prefix: String = key::defaulted("key_prefix", key_prefix)
            .or(Cluster::DEFAULT_KEY_PREFIX.to_owned());
        /// How long a slot's lease lives without renewal (default [`Cluster::DEFAULT_LEASE_TTL`],
        /// between [`Cluster::MIN_LEASE_TTL`] and [`Cluster::MAX_LEASE_TTL`]). Leases are
        /// renewed every third of it; a dead replica's slots come back within it.
        lease_ttl: Duration = key::defaulted("lease_ttl", lease_ttl),
            default DEFAULT_LEASE_TTL = Duration::from_secs(10);
        /// Bound on every call to Redis (default [`Cluster::DEFAULT_STORE_TIMEOUT`], at most a
        /// third of `lease_ttl`); a call that takes longer marks the store down.
        store_timeout: Duration = key::duration("store_timeout"),
            default DEFAULT_STORE_TIMEOUT = Duration::from_secs(1);
        /// What to do while Redis cannot be reached (default [`StoreDown::FailClosed`]).
        on_store_down: StoreDown = key::defaulted("on_store_down", store_down),
            default DEFAULT_ON_STORE_DOWN = StoreDown::FailClosed;
        /// How many replicas share the caps: required with [`StoreDown::LocalShare`], whose local
        /// share is `floor(parallel / replicas)`.
        replicas: Option<usize> = key::optional("replicas", |r, p, v| r.count(p, v, 1));
    }
}

impl Cluster {
    /// Default [`Cluster::key_prefix`].
    pub const DEFAULT_KEY_PREFIX: &'static str = "slotgate";
    /// Shortest `lease_ttl`: renewals every third of it must get through a busy Redis.
    pub const MIN_LEASE_TTL: Duration = Duration::from_secs(1);
    /// Longest `lease_ttl`: a dead replica's slots stay taken this long.
    pub const MAX_LEASE_TTL: Duration = Duration::from_secs(300);
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

impl Show for StoreDown {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Str(self.as_str()))
    }
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

/// Between [`Cluster::MIN_LEASE_TTL`] and [`Cluster::MAX_LEASE_TTL`].
fn lease_ttl(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Duration> {
    let ttl = r.duration(path, value, false)?;
    if (Cluster::MIN_LEASE_TTL..=Cluster::MAX_LEASE_TTL).contains(&ttl) {
        return Some(ttl);
    }
    let message = format!(
        "must be between {} and {} (a dead replica's slots stay taken this long), found {}",
        human(Cluster::MIN_LEASE_TTL),
        human(Cluster::MAX_LEASE_TTL),
        human(ttl),
    );
    r.invalid(path, value, message);
    None
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

/// A Redis URL with its password (if any) replaced by `<redacted>`: the rest is useful to see.
fn redact_password(url: &str) -> String {
    match Url::parse(url) {
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
