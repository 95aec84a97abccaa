//! The settings of a shared limiter: where Redis is, how long leases last, and what to do when
//! Redis cannot be reached.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// What a replica does while it cannot reach Redis (and while it rejoins, see
/// `docs/scale-out.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnStoreDown {
    /// Refuse new acquires at once with
    /// [`AdmitError::StoreUnavailable`](slotgate_admission::AdmitError::StoreUnavailable);
    /// waiters fail the same way. The engine never sees more than `parallel`.
    #[default]
    FailClosed,
    /// Admit locally, at most `floor(parallel / replicas)` slots and `floor(queue / replicas)`
    /// waiters per key. Slots granted through Redis before the outage count against that share.
    LocalShare,
}

impl OnStoreDown {
    /// The name used in configuration files: `fail-closed` or `local-share`.
    ///
    /// ```
    /// use slotgate_limiter_redis::OnStoreDown;
    /// assert_eq!(OnStoreDown::LocalShare.as_str(), "local-share");
    /// assert_eq!("fail-closed".parse::<OnStoreDown>().unwrap(), OnStoreDown::FailClosed);
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Self::FailClosed => "fail-closed",
            Self::LocalShare => "local-share",
        }
    }
}

impl fmt::Display for OnStoreDown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnStoreDown {
    type Err = SettingsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fail-closed" => Ok(Self::FailClosed),
            "local-share" => Ok(Self::LocalShare),
            other => Err(SettingsError::OnStoreDown(other.to_owned())),
        }
    }
}

/// How a [`RedisLimiter`](crate::RedisLimiter) reaches Redis and keeps its leases.
///
/// Every replica that shares a cap must use the same `key_prefix` and should use the same
/// `lease_ttl`, `store_timeout` and `replicas`: the bound on switching back after an outage
/// relies on it.
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use slotgate_limiter_redis::{OnStoreDown, Settings};
///
/// let mut settings = Settings::new("redis://127.0.0.1:6379/0");
/// settings.key_prefix = "prod-eu".into();
/// settings.on_store_down = OnStoreDown::LocalShare;
/// settings.replicas = 2;
/// settings.validate().unwrap();
/// assert_eq!(settings.renew_interval(), Duration::from_secs(10) / 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Settings {
    /// `redis://host:port/db` (or `redis+unix:///path`). TLS is not built in.
    pub redis_url: String,
    /// Prefix of every Redis key and channel, so that several deployments can share one Redis.
    pub key_prefix: String,
    /// How long a lease lives without renewal. Renewed every `lease_ttl / 3`; a dead replica's
    /// slots come back within it. Default 10s.
    pub lease_ttl: Duration,
    /// Bound on every call to Redis (connect included); a call that takes longer marks the
    /// store down. Default 1s; at most `lease_ttl / 3`.
    pub store_timeout: Duration,
    /// What to do while Redis cannot be reached. Default [`OnStoreDown::FailClosed`].
    pub on_store_down: OnStoreDown,
    /// How many replicas share the cap, for [`OnStoreDown::LocalShare`]. Default 1.
    pub replicas: usize,
}

impl Settings {
    /// Settings for `redis_url` with every default: prefix `slotgate`, `lease_ttl` 10s,
    /// `store_timeout` 1s, fail-closed, 1 replica.
    pub fn new(redis_url: impl Into<String>) -> Self {
        Self {
            redis_url: redis_url.into(),
            key_prefix: "slotgate".to_owned(),
            lease_ttl: Duration::from_secs(10),
            store_timeout: Duration::from_secs(1),
            on_store_down: OnStoreDown::FailClosed,
            replicas: 1,
        }
    }

    /// How often leases are renewed and a down store is probed: `lease_ttl / 3`.
    pub fn renew_interval(&self) -> Duration {
        self.lease_ttl / 3
    }

    /// Checks the settings, reporting every problem at once.
    pub fn validate(&self) -> Result<(), SettingsErrors> {
        let mut errors = Vec::new();
        if let Err(source) = redis::Client::open(self.redis_url.as_str()) {
            errors.push(SettingsError::RedisUrl(source));
        }
        if self.key_prefix.is_empty() || self.key_prefix.contains(['{', '}', ' ']) {
            errors.push(SettingsError::KeyPrefix(self.key_prefix.clone()));
        }
        if self.lease_ttl < Duration::from_millis(300) {
            errors.push(SettingsError::LeaseTtl(self.lease_ttl));
        }
        if self.store_timeout.is_zero() || self.store_timeout > self.renew_interval() {
            errors.push(SettingsError::StoreTimeout {
                store_timeout: self.store_timeout,
                lease_ttl: self.lease_ttl,
            });
        }
        if self.replicas == 0 {
            errors.push(SettingsError::Replicas);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(SettingsErrors(errors))
        }
    }
}

/// One invalid setting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SettingsError {
    /// `redis_url` does not parse.
    #[error("redis_url: not a redis:// URL")]
    RedisUrl(#[source] redis::RedisError),
    /// `key_prefix` is empty or has braces or spaces (they would break the key layout).
    #[error("key_prefix: {0:?} must be non-empty, without braces or spaces")]
    KeyPrefix(String),
    /// `lease_ttl` is too short to renew reliably.
    #[error("lease_ttl: {0:?} is below the minimum of 300ms")]
    LeaseTtl(Duration),
    /// `store_timeout` is zero or longer than a renewal interval.
    #[error(
        "store_timeout: {store_timeout:?} must be above zero and at most lease_ttl / 3 \
         ({lease_ttl:?} / 3)"
    )]
    StoreTimeout {
        /// The configured timeout.
        store_timeout: Duration,
        /// The configured lease length.
        lease_ttl: Duration,
    },
    /// `replicas` is zero.
    #[error("replicas: must be at least 1")]
    Replicas,
    /// `on_store_down` is not one of the known policies.
    #[error("on_store_down: {0:?} is neither \"fail-closed\" nor \"local-share\"")]
    OnStoreDown(String),
}

/// Every invalid setting found by [`Settings::validate`].
#[derive(Debug, thiserror::Error)]
#[error("invalid cluster settings: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
pub struct SettingsErrors(pub Vec<SettingsError>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_every_problem_is_reported() {
        Settings::new("redis://127.0.0.1:6379/0")
            .validate()
            .unwrap();
        let mut bad = Settings::new("http://nope");
        bad.key_prefix = "a{b".into();
        bad.lease_ttl = Duration::from_millis(100);
        bad.replicas = 0;
        let errors = bad.validate().unwrap_err().0;
        assert_eq!(errors.len(), 5, "{errors:?}");
        assert!("both".parse::<OnStoreDown>().is_err());
    }
}
