//! The background checks: every `server.health_check_interval`, each upstream's health
//! ([`crate::upstreams::health`]) and then, if it is healthy, its resident models
//! ([`crate::upstreams::residency`]) and, for a llama-server, how many models it holds at once
//! ([`places`](crate::upstreams::places)); then the slot counts of `parallel = "auto"` models that are not
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

use slotgate_config::Kind;
use tracing::{debug, info, warn};

use crate::error::chain;
use crate::shutdown::ShutdownSignal;
use crate::upstreams::fan_out::fan_out;
use crate::upstreams::health::{self, HealthPolicy};
use crate::upstreams::places::gate::BoundRead;
use crate::upstreams::probe::{ProbeError, Prober};
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
    let discovered = residency::discover(prober, upstream.kind, target).await;
    if let Ok(discovery) = &discovered
        // Engines that load on demand: a router (it reports states) and Ollama (its `/api/ps`
        // may list nothing).
        && (!discovery.states.is_empty() || upstream.kind == Kind::Ollama)
    {
        upstream.places.observe(discovery.running());
    }
    // After what is loaded is known: requests held for the bound go by it.
    report_bound(upstream, discovered.as_ref(), policy);
    match discovered {
        Ok(discovery) => {
            let names = discovery.resident.names();
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

/// Tells a llama-server's gate what the discovery read of its bound, warning when the gate
/// stops waiting for it ([`places::gate`](crate::upstreams::places::gate)).
fn report_bound(
    upstream: &UpstreamState,
    discovered: Result<&residency::Discovery, &ProbeError>,
    policy: &HealthPolicy,
) {
    if upstream.kind == Kind::LlamaServer
        && upstream
            .places
            .report(bound_read(discovered), policy.eject_after)
    {
        warn!(
            upstream = %upstream.name,
            checks = policy.eject_after,
            "could not read how many models the engine holds at once: requests no longer wait \
             for it (set max_loaded_models on a router)"
        );
    }
}

/// What a llama-server's discovery read of its bound: a router's `max_instances` (or that it
/// reports none), a single-model server's "no bound", or nothing when the engine did not answer.
fn bound_read(discovered: Result<&residency::Discovery, &ProbeError>) -> BoundRead {
    match discovered {
        Ok(discovery) if discovery.props_unread => BoundRead::Unread,
        Ok(discovery) => BoundRead::Read(discovery.max_instances),
        Err(_) => BoundRead::Unread,
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
