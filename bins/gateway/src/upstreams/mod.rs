//! What the gateway knows about the engines, and the background checks that keep it current.
//!
//! - [`state`]: one upstream — where it is, its connection [`pool`], [`health`] (active checks
//!   and passive ejection), [`residency`] (which models are loaded), draining.
//! - [`ejection`]: when a passive ejection may take an upstream out, given the other upstreams
//!   of its models.
//! - [`target`]: one upstream's offer of one model, with the state kept per (upstream, model):
//!   [`hold`] times, the [`auto_slots`] count, the [`engine_load`].
//! - [`cluster`]: the shared slot store of `[cluster]`, and a target's key in it.
//! - [`monitor`]: every health-check interval, the checks of each upstream, then
//!   [`slot_discovery`] (`parallel = "auto"`) and [`reconcile`] (the engine's own busy count),
//!   all through [`probe`], the typed client for the engines' own endpoints, and fanned out by
//!   [`fan_out`].
//!
//! Nothing here knows about requests, routes or the admin API: the request path
//! ([`proxy`](crate::proxy)) and operations ([`ops`](crate::ops)) build on it.

pub(crate) mod auto_slots;
pub(crate) mod cluster;
pub(crate) mod ejection;
pub(crate) mod engine_load;
pub(crate) mod fan_out;
pub(crate) mod health;
pub(crate) mod hold;
pub(crate) mod monitor;
pub(crate) mod places;
pub(crate) mod pool;
pub(crate) mod probe;
pub(crate) mod reconcile;
pub(crate) mod residency;
pub(crate) mod slot_discovery;
pub(crate) mod state;
pub(crate) mod target;
