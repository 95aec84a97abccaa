//! The background checks: every `server.health_check_interval`, each upstream's health
//! ([`crate::health`]) and then, if it is healthy, its resident models
//! ([`crate::residency`]); then the slot counts of `parallel = "auto"` models that are not
//! known or are due again ([`crate::slots`]), and the engines' own busy counts
//! ([`crate::reconcile`]).
//!
//! All upstreams are checked concurrently, each probe bounded by `server.health_check_timeout`,
//! so one blackholed host never delays the verdict on the others. The next round starts one
//! interval after the previous one ended: rounds never overlap, and a slow round cannot pile up
//! probes on a struggling engine.
//!
//! The same [`round`] runs before the gateway starts serving and before a reload takes effect,
//! so requests only go to upstreams whose state has been checked at least once.
//!
//! The loop reads the current configuration each round (a reload may change the interval, the
//! thresholds or the set of upstreams) and stops when the gateway shuts down.

use std::sync::Arc;

use tokio::task::JoinSet;
use tracing::{debug, info};

use crate::health::{self, HealthPolicy};
use crate::live::Live;
use crate::probe::Prober;
use crate::reconcile;
use crate::residency;
use crate::server::ShutdownSignal;
use crate::slots;
use crate::upstream::UpstreamState;

/// Checks every upstream in `upstreams` once, concurrently; returns when all are done.
pub async fn round(upstreams: Vec<Arc<UpstreamState>>, prober: &Prober, policy: HealthPolicy) {
    let prober = prober.with_timeout(policy.timeout);
    let mut checks = JoinSet::new();
    for upstream in upstreams {
        let prober = prober.clone();
        checks.spawn(async move { check(&upstream, &prober, &policy).await });
    }
    // Dropping the set (if this future is dropped at shutdown) aborts the checks.
    while checks.join_next().await.is_some() {}
}

/// One upstream: its health, then, if that passed, its resident models.
pub async fn check(upstream: &UpstreamState, prober: &Prober, policy: &HealthPolicy) {
    let target = upstream.probe_target();
    let result = health::check(prober, upstream.kind, target)
        .await
        .map_err(|e| e.to_string());
    let healthy = result.is_ok();
    if let Err(error) = &result {
        debug!(upstream = %upstream.name, %error, "health check failed");
    }
    upstream.record_check(result, policy);
    if !healthy {
        return;
    }
    match residency::discover(prober, upstream.kind, target).await {
        Ok(resident) => {
            let names = resident.names();
            if upstream.residency.record(Ok(resident)) {
                info!(upstream = %upstream.name, resident = ?names, "resident models changed");
            }
        }
        Err(error) => {
            debug!(upstream = %upstream.name, %error, "residency discovery failed");
            upstream.residency.record(Err(error.to_string()));
        }
    }
}

/// Checks every upstream of the current configuration every interval until `stop` fires.
pub async fn run(live: Arc<Live>, prober: Prober, mut stop: ShutdownSignal) {
    loop {
        let interval = live.current().policy.interval;
        tokio::select! {
            biased;
            () = stop.fired() => return,
            () = tokio::time::sleep(interval) => {}
        }
        let generation = live.current();
        let policy = generation.policy;
        let upstreams = generation.upstreams.iter().cloned().collect();
        let routes: Vec<_> = generation.routes.routes().cloned().collect();
        // Not held across the round: a reload may retire this generation meanwhile.
        drop(generation);
        tokio::select! {
            biased;
            () = stop.fired() => return,
            () = async {
                round(upstreams, &prober, policy).await;
                // `parallel = "auto"` counts not known yet, or due after an ejection.
                slots::round(routes.clone(), &prober, policy, false).await;
                // The engines' own busy counts against ours.
                reconcile::round(routes, &prober, policy).await;
            } => {}
        }
    }
}
