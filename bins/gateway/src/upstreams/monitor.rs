//! The background checks: every `server.health_check_interval`, each upstream's health
//! ([`crate::upstreams::health`]) and then, if it is healthy, its resident models
//! ([`crate::upstreams::residency`]); then the slot counts of `parallel = "auto"` models that are not
//! known or are due again ([`crate::upstreams::slot_discovery`]), and the engines' own busy counts
//! ([`crate::upstreams::reconcile`]).
//!
//! All upstreams are checked concurrently, each probe bounded by `server.health_check_timeout`,
//! so one blackholed host never delays the verdict on the others. The next round starts one
//! interval after the previous one ended: rounds never overlap, and a slow round cannot pile up
//! probes on a struggling engine.
//!
//! The same [`check_upstreams`] runs before the gateway starts serving and before a reload takes effect,
//! so requests only go to upstreams whose state has been checked at least once.
//!
//! The loop reads the current configuration each round (a reload may change the interval, the
//! thresholds or the set of upstreams) and stops when the gateway shuts down.

use std::sync::Arc;

use tracing::{debug, info};

use crate::support::error::chain;
use crate::support::shutdown::ShutdownSignal;
use crate::upstreams::fan_out::fan_out;
use crate::upstreams::health::{self, HealthPolicy};
use crate::upstreams::probe::Prober;
use crate::upstreams::residency;
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;
use crate::upstreams::{reconcile, slot_discovery};

/// Checks every upstream in `upstreams` once, concurrently; returns when all are done.
pub(crate) async fn check_upstreams(
    upstreams: Vec<Arc<UpstreamState>>,
    prober: &Prober,
    policy: HealthPolicy,
) {
    let prober = prober.with_timeout(policy.timeout);
    fan_out(upstreams, |upstream| {
        let prober = prober.clone();
        async move { check_upstream(&upstream, &prober, &policy).await }
    })
    .await;
}

/// One upstream: its health, then, if that passed, its resident models.
pub(crate) async fn check_upstream(
    upstream: &UpstreamState,
    prober: &Prober,
    policy: &HealthPolicy,
) {
    let target = upstream.probe_target();
    let result = health::check_engine(prober, upstream.kind, target).await;
    if let Err(error) = &result {
        debug!(upstream = %upstream.name, error = %chain(error), "health check failed");
    }
    upstream.record_check(result.as_ref().map(|&()| ()), policy);
    if result.is_err() {
        return;
    }
    match residency::discover(prober, upstream.kind, target).await {
        Ok(discovery) => {
            let names = discovery.resident.names();
            // Engines that load on demand: a router (it reports states) and Ollama (its
            // `/api/ps` may list nothing).
            if !discovery.states.is_empty() || upstream.kind == slotgate_config::Kind::Ollama {
                upstream
                    .places
                    .observe(discovery.running(), discovery.max_instances);
            }
            if upstream.residency.record(Ok(discovery)) {
                info!(upstream = %upstream.name, resident = ?names, "resident models changed");
            }
        }
        Err(error) => {
            debug!(upstream = %upstream.name, error = %chain(&error), "residency discovery failed");
            upstream
                .residency
                .record::<residency::Resident>(Err(&error));
        }
    }
}

/// What the background checks look at: read afresh from the configuration in force before each
/// round, so a reload changes the interval, the thresholds and the set of upstreams.
#[derive(Debug)]
pub(crate) struct Watched {
    /// The health-check settings.
    pub(crate) policy: HealthPolicy,
    /// Every upstream.
    pub(crate) upstreams: Vec<Arc<UpstreamState>>,
    /// Every (upstream, model).
    pub(crate) targets: Vec<Arc<Target>>,
}

/// Checks everything `watched` returns every interval until `stop` fires.
///
/// `watched` is called at each round, and what it returns is not kept across rounds: a reload
/// may retire a configuration meanwhile.
pub(crate) async fn run(watched: impl Fn() -> Watched, prober: Prober, mut stop: ShutdownSignal) {
    loop {
        let interval = watched().policy.interval;
        tokio::select! {
            biased;
            () = stop.fired() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let Watched {
            policy,
            upstreams,
            targets,
        } = watched();
        tokio::select! {
            biased;
            () = stop.fired() => return,
            () = async {
                check_upstreams(upstreams, &prober, policy).await;
                // `parallel = "auto"` counts not known yet, or due after an ejection.
                slot_discovery::read_slot_counts(targets.clone(), &prober, policy, false).await;
                // The engines' own busy counts against ours.
                reconcile::read_engine_loads(targets, &prober, policy).await;
            } => {}
        }
    }
}
