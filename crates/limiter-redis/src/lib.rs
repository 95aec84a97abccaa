//! # slotgate-limiter-redis
//!
//! Several slotgate replicas, one cap: the keyed FIFO limiter's contract shared through Redis.
//!
//! Each gateway replica that uses the same Redis and key prefix shares, per (upstream
//! authority, model), one set of `parallel` slots and one FIFO queue of `queue` places, so two
//! or more replicas never put more than one cap on an engine. [`RedisLimiter`] implements
//! [`slotgate_admission::Admission`], the interface the gateway admits through; the in-process
//! `slotgate-limiter` implements it too and stays the default. This crate is separate so that
//! users of the local limiter never pull in a Redis client.
//!
//! The design, with every failure case, is `docs/scale-out.md`. In short:
//!
//! - holders are a sorted set scored by lease expiry, waiters a sorted set ordered by an `INCR`
//!   sequence; each acquire, release, reconfiguration and renewal is one Lua script, atomic in
//!   Redis, one round trip;
//! - leases are renewed every `lease_ttl / 3` while their slot (or wait) lives, so a dead
//!   replica's slots come back within `lease_ttl`;
//! - a release hands the slot straight to the head waiter and publishes the grant; waits are
//!   local, woken by the message, with the periodic renewal as the retry behind a lost one;
//! - while Redis cannot be reached, [`OnStoreDown`] decides: refuse, or admit a local share.
//!
//! ## Example
//!
//! ```no_run
//! use slotgate_admission::{AdmitError, Admission};
//! use slotgate_limiter_redis::{OnStoreDown, RedisLimiter, Settings};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut settings = Settings::new("redis://127.0.0.1:6379/0");
//! settings.on_store_down = OnStoreDown::LocalShare;
//! settings.replicas = 2;
//! let limiter = RedisLimiter::start(settings)?;
//! limiter.configure("http://gpu-1:8080", "llama", 4, 8);
//! match limiter.acquire("http://gpu-1:8080", "llama").await {
//!     Ok(slot) => drop(slot), // call the engine while holding it
//!     Err(AdmitError::QueueFull) => {}        // 503 + Retry-After
//!     Err(AdmitError::StoreUnavailable(_)) => {} // fail-closed while Redis is down
//!     Err(_) => {}
//! }
//! # Ok(())
//! # }
//! ```

mod error;
mod limiter;
mod script;
mod settings;
mod store;

pub use error::{StartError, StoreError};
pub use limiter::{Place, RedisLimiter, Standing, StoreStatus};
pub use script::HostOccupancy;
pub use settings::{OnStoreDown, Settings, SettingsError, SettingsErrors};

#[cfg(test)]
mod tests;
