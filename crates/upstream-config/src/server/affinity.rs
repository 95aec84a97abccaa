//! The `[server]` keys of cache-aware routing, declared as a table of their own
//! ([`CacheAffinity`]) and written inline in `[server]`.

use std::time::Duration;

use figment::value::Value;

use crate::key::{self, table};
use crate::raw::{KeyPath, Reader};
use crate::show::{Shown, on_off};
use crate::values::{header_name, on_off as read_on_off};

table! {
    /// Cache-aware routing, from the `[server]` table: a conversation's requests go to the host
    /// whose engine holds its prompt prefix in its KV cache, while that costs less than the
    /// prefill it saves. Read once at start (a reload does not change it); each model can still
    /// turn it off ([`Upstream::affinity`](crate::Upstream::affinity)).
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
    pub struct CacheAffinity, read as AffinityKeys {
        /// `affinity = "on" | "off"` (default on).
        enabled: bool = key::defaulted("affinity", read_on_off)
            .read_at_start()
            .show(|on| Some(Shown::Str(on_off(*on)))),
            default DEFAULT_ENABLED = true;
        /// `affinity_entries`: the most prefix blocks remembered (about 40 bytes each).
        entries: usize = key::count("affinity_entries", CacheAffinity::MIN_ENTRIES).read_at_start(),
            default
            /// 65,536 blocks, under 3 MiB; at the default block size some 3,000
            /// conversations of 10 KiB of text each.
            DEFAULT_ENTRIES = 65_536;
        /// `affinity_ttl`: how long a block counts after it was last sent to a host.
        ttl: Duration = key::defaulted("affinity_ttl", ttl).read_at_start(),
            default
            /// 30 minutes, longer than a person's pause between turns; an engine that evicted
            /// sooner says so in its answers, which shrinks the index.
            DEFAULT_TTL = Duration::from_secs(30 * 60);
        /// `affinity_block_bytes`: the size of a prefix block, in bytes of request text.
        block_bytes: usize = key::defaulted("affinity_block_bytes", block_bytes).read_at_start(),
            default
            /// 512 bytes, about 128 tokens.
            DEFAULT_BLOCK_BYTES = 512;
        /// `session_headers`: request headers that name a session, first present wins; lower
        /// case.
        session_headers: Vec<String> = key::defaulted("session_headers", session_headers)
            .read_at_start()
            .or(default_session_headers());
    }
}

impl CacheAffinity {
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
            enabled: Self::DEFAULT_ENABLED,
            entries: Self::DEFAULT_ENTRIES,
            ttl: Self::DEFAULT_TTL,
            block_bytes: Self::DEFAULT_BLOCK_BYTES,
            session_headers: default_session_headers(),
        }
    }
}

fn default_session_headers() -> Vec<String> {
    CacheAffinity::DEFAULT_SESSION_HEADERS
        .iter()
        .map(|&name| name.to_owned())
        .collect()
}

/// At least a second: the index counts whole seconds.
fn ttl(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Duration> {
    let ttl = r.duration(path, value, false)?;
    if ttl < Duration::from_secs(1) {
        r.invalid(
            path,
            value,
            "must be at least 1s (the index counts whole seconds)",
        );
        return None;
    }
    Some(ttl)
}

fn block_bytes(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<usize> {
    let bytes = r.count(path, value, CacheAffinity::MIN_BLOCK_BYTES)?;
    if bytes > CacheAffinity::MAX_BLOCK_BYTES {
        let message = format!("must be at most {}", CacheAffinity::MAX_BLOCK_BYTES);
        r.invalid(path, value, message);
        return None;
    }
    Some(bytes)
}

fn session_headers(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Vec<String>> {
    let items = r.array(path, value)?;
    let names: Vec<Option<String>> = items
        .iter()
        .enumerate()
        .map(|(i, item)| header_name(r, &path.index(i), item))
        .collect();
    names.into_iter().collect()
}
