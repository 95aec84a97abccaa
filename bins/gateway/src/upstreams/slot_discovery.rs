//! Slot auto-discovery: `parallel = "auto"` on a `kind = "llama-server"` model takes the slot
//! count from the engine itself, `total_slots` of its `GET /props` (= its `--parallel`).
//!
//! # When it is read
//!
//! - At start, after the first round of health checks and before the first request.
//! - On every reload, for every `auto` model of the new configuration, before it takes effect.
//! - When the upstream comes back healthy after being ejected (a restarted engine may have
//!   another `--parallel`).
//! - Every health-check interval while the count is not known (the engine was down, or
//!   answered something that is not a slot count).
//!
//! # No silent default
//!
//! Until a read succeeds, the model is **unavailable on that upstream**: the router leaves the
//! target out, a request with no other place to go gets a `503 upstream-unavailable` whose
//! detail says why, and the error is logged (at `error` the first time and whenever it
//! changes). The limiter key exists meanwhile with `parallel = 0`. A count once found stays in
//! force when a later re-read fails (logged as a warning): it is the engine's own answer, not a
//! guess, and one lost probe must not empty a model.
//!
//! A count read from the engine goes into the limiter at once (live: growing grants waiters,
//! shrinking lets in-flight requests drain down), and is shown by the admin API
//! (`GET /admin/upstreams`: `slots`, `discovery`), the metric `slotgate_slots_capacity` and
//! `slotgate check`.
//!
//! In router mode (several models) the probe asks `/props?model=NAME&autoload=false`: a probe
//! never makes the router load a model, so `auto` needs the model loaded (or loaded at start);
//! for a model loaded on demand, state `parallel`.

use std::sync::Arc;

use slotgate_config::{Config, Kind, ModelLimits};

use crate::upstreams::auto_slots::{SlotCountError, SlotCountFailure};
use crate::upstreams::fan_out::fan_out;
use crate::upstreams::health::HealthPolicy;
use crate::upstreams::probe::{ProbeTarget, Prober};
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;

/// Reads the slot count of `model` from a llama-server.
pub(crate) async fn read(
    prober: &Prober,
    target: ProbeTarget<'_>,
    model: &str,
) -> Result<usize, SlotCountError> {
    let props = prober
        .llama_props(target, model)
        .await
        .map_err(SlotCountFailure::Props)?;
    if props.total_slots == 0 {
        return Err(SlotCountFailure::NoSlots.into());
    }
    Ok(props.total_slots)
}

/// Reads the slot count of every `auto` target among `targets` that needs it
/// ([`AutoSlots::needs_read`](crate::upstreams::auto_slots::AutoSlots::needs_read)), or of every
/// one with `force` (start, reload); concurrently, each probe bounded by the health-check timeout.
pub(crate) async fn read_slot_counts(
    targets: Vec<Arc<Target>>,
    prober: &Prober,
    policy: HealthPolicy,
    force: bool,
) {
    let prober = prober.with_timeout(policy.timeout);
    let due = targets.into_iter().filter(|target| {
        target
            .auto()
            .is_some_and(|auto| force || auto.needs_read(&target.upstream))
    });
    fan_out(due, |target| {
        let prober = prober.clone();
        async move {
            let upstream = &target.upstream;
            let result = read(&prober, upstream.probe_target(), &target.engine_model).await;
            if let Some(auto) = target.auto() {
                auto.record(result.as_ref().copied(), upstream);
            }
        }
    })
    .await;
}

/// What [`probe_config`] found for one `parallel = "auto"` model.
///
/// ```no_run
/// # async fn demo(config: &slotgate_config::Config) {
/// for probed in slotgate_gateway::probe_config(config).await {
///     match probed.slots {
///         Ok(slots) => println!("{}/{}: {slots} slots", probed.upstream, probed.model),
///         Err(why) => println!("{}/{}: unknown ({why})", probed.upstream, probed.model),
///     }
/// }
/// # }
/// ```
#[derive(Debug)]
#[non_exhaustive]
pub struct ProbedSlots {
    /// The upstream's name.
    pub upstream: String,
    /// Where it was asked.
    pub url: String,
    /// The model.
    pub model: String,
    /// The slot count, or why there is none.
    pub slots: Result<usize, SlotCountError>,
}

/// Reads the slot count of every `parallel = "auto"` model of `config` once (for
/// `slotgate check`), each probe bounded by `server.health_check_timeout`. Needs a Tokio
/// runtime; binds nothing. See [`ProbedSlots`] for an example.
pub async fn probe_config(config: &Config) -> Vec<ProbedSlots> {
    let prober = Prober::new(config.server.health_check_timeout);
    let mut found = Vec::new();
    for upstream in config.upstreams.values() {
        if upstream.kind != Kind::LlamaServer {
            continue;
        }
        for (model, limits) in &upstream.models {
            if !matches!(limits, ModelLimits::Auto { .. }) {
                continue;
            }
            let slots = match UpstreamState::from_config(upstream, &config.server) {
                Ok(state) => {
                    read(&prober, state.probe_target(), upstream.engine_model(model)).await
                }
                Err(problem) => Err(SlotCountFailure::Upstream(problem).into()),
            };
            found.push(ProbedSlots {
                upstream: upstream.name.clone(),
                url: upstream.url.to_string(),
                model: model.clone(),
                slots,
            });
        }
    }
    found
}
