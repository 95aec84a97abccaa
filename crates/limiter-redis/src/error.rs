//! Why a call to Redis failed, and why a shared limiter could not start.

use std::time::Duration;

use crate::settings::SettingsErrors;

/// A call to the shared store that did not succeed. The store is then marked down (see
/// [`OnStoreDown`](crate::OnStoreDown)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// Redis answered with an error, or the connection failed.
    #[error("redis call failed")]
    Redis(#[from] redis::RedisError),
    /// No answer within `store_timeout`.
    #[error("no answer from redis within {0:?} (store_timeout)")]
    Timeout(Duration),
    /// The store is marked down after an earlier failure and has not been seen up again yet:
    /// nothing was sent.
    #[error("the store is marked down after an earlier failure; probing it again")]
    Down,
}

/// Why [`RedisLimiter::start`](crate::RedisLimiter::start) could not build a limiter.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The settings are invalid.
    #[error(transparent)]
    Settings(#[from] SettingsErrors),
    /// Not called from within a tokio runtime: the limiter runs background tasks.
    #[error("a shared limiter must be started inside a tokio runtime")]
    NoRuntime(#[source] tokio::runtime::TryCurrentError),
}
