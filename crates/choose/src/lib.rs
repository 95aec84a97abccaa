//! # slotgate-choose
//!
//! Picks the upstream host for a new request. The gateway knows, for every host that could serve
//! the requested model, whether it is healthy or draining, whether the model is resident, how
//! many slots are free and how many requests already wait. This crate turns that into an order:
//! [`best`] names the host to try first, [`ranked`] lists every usable host in the order to fall
//! through when a host's queue turns out to be full.
//!
//! It is pure: no I/O, no clock, no randomness, no locks. The caller gathers the facts through the
//! `info` closure (called once per candidate), so the same inputs always give the same answer and
//! the rules can be checked exhaustively by property tests.
//!
//! # Rules
//!
//! 1. **Eligible** hosts are the ones for which `info` returns [`Some`], that are
//!    [`healthy`](Info::healthy), not [`draining`](Info::draining), and that have the model
//!    [`loaded`](Info::loaded) or [`can_serve`](Info::can_serve) it. A host with
//!    [`free`](Info::free) `== 0` is still eligible: the request will queue there.
//! 2. **Two passes.** Eligible hosts with the model *loaded* come first; hosts that can serve it
//!    but would have to load it first (a cold start of seconds to minutes) come after all of
//!    them, whatever their scores.
//! 3. **Within a pass** the higher [`score`](Info::score) (`free × weight`) wins; on an equal score
//!    fewer [`queued`](Info::queued) requests win; on a full tie the earlier candidate wins, so
//!    the caller's order (for example, the configuration order) is the final tie-breaker.
//!
//! [`best`] always equals `ranked(..).first()`.
//!
//! On top of that order, [`by_load_cost`] puts the hosts that must load the model in the order
//! of what the load costs there (a free place first, an engine busy with other models last),
//! keeping the order above within each cost.
//!
//! ## Odd weights
//!
//! Weights come from configuration, which should only allow finite positive numbers, but this
//! crate never panics and never produces an inconsistent order for any `f64`. The rule is on the
//! score, not the weight: a score that is not a number greater than zero — `NaN` (a `NaN`
//! weight, or `0 × ∞`), zero, or negative (a negative weight) — counts as `0`. Such a host stays
//! eligible and ranks like a host with no free slot: behind every host with a positive score in
//! its pass, and among the zero scores by `queued`, then by position. A weight of `+∞` gives a
//! host with free slots a score of `+∞`, ahead of every finite score; two such hosts tie and are
//! separated by `queued`. See [`Info::score`].
//!
//! # Cache affinity
//!
//! The same crate decides when a request should go to the host that holds its prompt prefix
//! in its KV cache instead: [`PrefixBuilder`] hashes the prompt into a chain of block hashes,
//! [`Holdings`] remembers which hosts were sent which blocks (bounded in entries and age), and
//! [`prefer`] moves the holder to the front of [`ranked`]'s order while that costs less than
//! the prefill it saves. A request with no useful match keeps [`ranked`]'s order exactly. All
//! three are pure: time is passed in as `now`, the hash seed by the caller.
//!
//! # Why deterministic
//!
//! Power-of-two-choices (as in tower's `p2c` balancer) spreads load when the balancer cannot see
//! the true load. The gateway can: it holds the slots itself (`slotgate-limiter`), so `free` and
//! `queued` are exact. Taking the host with the most weighted free slots fills the capacity that
//! is really idle, and every admitted request lowers that host's `free` before the next call, so
//! consecutive requests spread across hosts without any randomness.
//!
//! # Example
//!
//! ```
//! use slotgate_choose::{Info, best, ranked};
//!
//! struct Host {
//!     name: &'static str,
//!     free: usize,
//!     loaded: bool,
//! }
//!
//! let hosts = [
//!     Host { name: "gpu-a", free: 1, loaded: true },
//!     Host { name: "gpu-b", free: 3, loaded: true },
//!     Host { name: "gpu-c", free: 8, loaded: false }, // would have to load the model first
//! ];
//! let info = |h: &Host| {
//!     Some(Info {
//!         healthy: true,
//!         draining: false,
//!         loaded: h.loaded,
//!         can_serve: true,
//!         free: h.free,
//!         queued: 0,
//!         weight: 1.0,
//!     })
//! };
//!
//! assert_eq!(best(&hosts, info).map(|h| h.name), Some("gpu-b"));
//! let order: Vec<_> = ranked(&hosts, info).iter().map(|h| h.name).collect();
//! assert_eq!(order, ["gpu-b", "gpu-a", "gpu-c"]);
//! ```

mod affinity;
mod holdings;
mod info;
mod placement;
mod prefix;
mod rank;

pub use affinity::{Standing, Verdict, is_useful, prefer};
pub use holdings::{Holdings, HostId, HostSet, Limits, Longest, MAX_HOSTS, Prior, Stamp};
pub use info::Info;
pub use placement::{LoadCost, by_load_cost};
pub use prefix::{DEFAULT_BLOCK_BYTES, GROW_EVERY, Prefix, PrefixBuilder, block_size};
pub use rank::{best, ranked};

#[cfg(test)]
mod tests;
