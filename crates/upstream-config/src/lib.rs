//! Configuration for slotgate: the types, loading with [figment], and a validation pass that
//! reports *every* problem at once, each with its key path.
//!
//! ```text
//! upstreams.reasoning.models.reasoning.queue_timeout: missing (the longest wait for a slot, …)
//! upstreams.b.url: same authority http://10.0.0.5:8000 as upstreams.a; …
//! ```
//!
//! # Loading
//!
//! [`Config::load`] reads a TOML file, then applies environment overrides: the `SLOTGATE_`
//! prefix, `__` for nesting (`SLOTGATE_SERVER__LISTEN=127.0.0.1:9000`,
//! `SLOTGATE_UPSTREAMS__A__WEIGHT=2`; see [`env_provider`]). [`Config::from_toml_str`] skips the
//! environment; [`Config::from_figment`] validates any figment. This crate does no I/O beyond
//! reading the config file.
//!
//! # Rules
//!
//! - No silent defaults for limits: each model of each upstream states `parallel` (≥ 1), `queue`
//!   (≥ 0) and `queue_timeout` (> 0), or says `parallel = "unlimited"` and nothing else.
//!   `parallel = "auto"` (only for `kind = "llama-server"`, with `queue` and `queue_timeout`,
//!   without `capacity`) takes the slot count from the engine at run time. `capacity`, when
//!   given, is ≥ 1 and ≥ `parallel`.
//! - Every upstream has a `kind`, at least one model, and an http(s) `url` with a host and no
//!   query, fragment or credentials. The limiter keys on the URL's authority (scheme, host,
//!   port), so two upstreams with the same authority are an error.
//! - `weight` is finite and > 0; durations are human strings (`"30s"`, `"2m"`, `"500ms"`).
//! - Aliases point at a configured model, never at another alias, and never shadow a model.
//! - `listen` is required; `admin_listen` is optional and must not collide with it.
//! - `[cluster]` is optional; with it, `redis_url` is a `redis://` or `redis+unix://` URL,
//!   `lease_ttl` is between 1s and 5m, `store_timeout` is above zero and at most a third of
//!   `lease_ttl`, `on_store_down = "local-share"` needs `replicas` (≥ 1), and no upstream has an
//!   engine-wide `parallel` (it is not shared across replicas).
//! - Unknown keys are errors: a typo in a limits file must not be silently ignored.
//!
//! `docs/configuration.md` at the repository root documents every key and its default;
//! [`Config::to_effective_toml`] prints the validated config with every default visible.
//!
//! Secrets (`server.api_keys`, `server.admin_token`, `upstreams.*.api_key`) are [`Secret`]s:
//! redacted in `Debug`, in the effective config and in error messages.

mod cluster;
#[cfg(test)]
mod declared_tests;
mod effective;
mod error;
mod key;
mod load;
mod queueing;
mod raw;
mod secret;
mod server;
mod show;
mod types;
mod validate;
mod values;

pub use cluster::{Cluster, StoreDown};
pub use error::{ConfigError, Issue};
pub use load::{ENV_PREFIX, env_provider};
pub use queueing::{QueueOrder, Queueing};
pub use secret::Secret;
pub use server::{CacheAffinity, ClientKey, Priority, Server};
pub use types::{Config, Kind, ModelLimits, Upstream};
pub use values::CertAndKey;
