//! The status document of one upstream: what `GET /admin/upstreams` lists, what drain and
//! undrain answer, and what the status page ([`status`](crate::ops::status)) shows for each
//! upstream; and, under `[cluster]`, the shared store's document that both show beside them.
//! One builder each, so the JSON API and the page never disagree.

use std::time::{Duration, SystemTime};

use serde::Serialize;

use crate::proxy::live::Generation;
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::{Sizing, Target};

/// One upstream's status document.
pub(crate) fn upstream_status<'g>(
    generation: &'g Generation,
    upstream: &'g UpstreamState,
) -> UpstreamDoc<'g> {
    let health = upstream.health.view();
    let residency = upstream.residency.view();
    let places = upstream.places.view();
    let models: Vec<ModelDoc<'g>> = generation
        .routes
        .routes()
        .flat_map(|route| {
            route
                .targets
                .iter()
                .filter(|t| t.upstream.name == upstream.name)
                .map(|t| {
                    let mut doc = model_status(&route.model, t);
                    doc.state = residency.states.get(&*t.place_name).map(|s| s.as_str());
                    doc.waiting_for_place = places.get(&t.place_name).map_or(0, |p| p.waiting);
                    doc
                })
        })
        .collect();
    let engine_models = residency
        .states
        .iter()
        .map(|(name, state)| {
            let loads = residency.loads.get(name).copied().unwrap_or_default();
            let doc = EngineModelDoc {
                state: state.as_str(),
                loads: loads.count,
                last_load_seconds: loads.last.map(|d| d.as_secs_f64()),
                expires_at: residency.expires.get(name).cloned(),
            };
            (name.clone(), doc)
        })
        .collect();
    let loaded = models.iter().filter(|m| m.loaded).map(|m| m.name).collect();
    UpstreamDoc {
        name: &upstream.name,
        url: upstream.url.as_str(),
        kind: upstream.kind.as_str(),
        health: HealthDoc {
            status: health.status.as_str(),
            since: rfc3339(health.since),
            last_check: health.last_check.map(rfc3339),
            consecutive_successes: health.successes,
            consecutive_failures: health.failures,
            last_error: health.last_error,
            ejection_held: health.kept_because,
        },
        draining: upstream.is_draining(),
        slots: generation.routes.upstream_cap(upstream).map(|cap| CapDoc {
            parallel: cap.parallel,
            in_flight: cap.in_flight,
            blocked_models: cap.blocked_models,
        }),
        loaded,
        residency: ResidencyDoc {
            max_loaded_models: upstream.places.capacity(),
            max_instances: residency.max_instances,
            models: engine_models,
            resident: residency.resident.map(|r| r.names()),
            last_check: residency.checked.map(rfc3339),
            last_error: residency.error,
        },
        models,
    }
}

/// One model's entry in its upstream's status document.
fn model_status<'g>(model: &'g str, t: &Target) -> ModelDoc<'g> {
    // One reading: the limits and the counts shown together agree.
    let reading = t.reading();
    // The engine's count, without `prefetch` (`Target::slots` is its one home).
    let slots = t.slots(&reading);
    let (parallel, capacity) = match &t.sizing {
        // A fixed count always has its slots.
        Sizing::Fixed { capacity } => (Parallel::Count(slots.unwrap_or_default()), *capacity),
        Sizing::Unlimited => (Parallel::Word("unlimited"), None),
        Sizing::Auto(_) => (Parallel::Word("auto"), None),
    };
    let engine = t.engine.view();
    let engine = engine.checked.is_some().then(|| EngineDoc {
        busy: engine.reading.map(|r| r.busy),
        waiting: engine.reading.and_then(|r| r.waiting),
        gateway_in_flight: engine.reading.map(|r| r.gateway_in_flight),
        unaccounted: engine.reading.map(|r| r.unaccounted()),
        whole_engine: engine.reading.map(|r| r.whole_engine),
        warning: engine.warned,
        last_check: engine.checked.map(rfc3339),
        last_error: engine.error,
    });
    let discovery = t.auto().map(|auto| {
        let view = auto.view();
        DiscoveryDoc {
            source: "/props total_slots",
            slots: view.found,
            last_check: view.checked.map(rfc3339),
            last_error: view.error,
        }
    });
    let cluster = t.shared.as_ref().map(|shared| {
        let global = shared.global();
        ClusterKeyDoc {
            in_flight: global.map(|g| g.in_flight),
            queued: global.map(|g| g.queued),
            replica_queued: shared.local().queued,
        }
    });
    ModelDoc {
        cluster,
        name: model,
        loaded: t.is_loaded(),
        state: None,
        waiting_for_place: 0,
        parallel,
        slots,
        queue: reading.limits.queue,
        queue_timeout: t.queue_timeout.map(duration),
        capacity,
        prefetch: t.queueing.prefetch,
        in_flight: reading.in_flight,
        // Under `[cluster]` this replica's requests wait in the shared queue.
        queued: reading.queued + t.shared.as_ref().map_or(0, |s| s.local().queued),
        engine,
        discovery,
    }
}

/// One upstream: `GET /admin/upstreams` lists them, drain and undrain answer one.
#[derive(Debug, Serialize)]
pub(crate) struct UpstreamDoc<'g> {
    name: &'g str,
    url: &'g str,
    kind: &'static str,
    health: HealthDoc,
    draining: bool,
    /// The engine-wide cap (`parallel` of the upstream); `null` without one.
    slots: Option<CapDoc>,
    /// The models whose `loaded` is true.
    loaded: Vec<&'g str>,
    residency: ResidencyDoc,
    models: Vec<ModelDoc<'g>>,
}

/// An upstream's engine-wide cap, shared by its models.
#[derive(Debug, Serialize)]
struct CapDoc {
    parallel: usize,
    in_flight: usize,
    /// Models whose next request waits only for the engine-wide cap.
    blocked_models: usize,
}

#[derive(Debug, Serialize)]
struct HealthDoc {
    status: &'static str,
    since: String,
    last_check: Option<String>,
    consecutive_successes: usize,
    consecutive_failures: usize,
    last_error: Option<String>,
    /// Why a failure streak over the threshold did not eject it (passive ejection's limits).
    ejection_held: Option<String>,
}

#[derive(Debug, Serialize)]
struct ResidencyDoc {
    /// The bound in force on models held at once: the upstream's `max_loaded_models`, else the
    /// router's `max_instances`; `null`: not bounded.
    max_loaded_models: Option<usize>,
    /// What a llama-server router reports (`--models-max`; 0: no bound).
    max_instances: Option<usize>,
    /// Each model the engine reports a state for, by its name there (empty for engines that
    /// do not load on demand).
    models: std::collections::BTreeMap<String, EngineModelDoc>,
    resident: Option<Vec<String>>,
    last_check: Option<String>,
    last_error: Option<String>,
}

/// One model as its engine reports it.
#[derive(Debug, Serialize)]
struct EngineModelDoc {
    /// `loaded`, `loading`, `unloaded`, `sleeping`, `failed` or `other`.
    state: &'static str,
    /// Loads seen since the gateway started.
    loads: u64,
    /// The last load's time, when a discovery saw it loading (to within one check interval).
    last_load_seconds: Option<f64>,
    /// Ollama: when its `keep_alive` ends.
    expires_at: Option<String>,
}

#[derive(Debug, Serialize)]
struct ModelDoc<'g> {
    name: &'g str,
    loaded: bool,
    /// The engine's state of the model (`null` for engines that do not report one).
    state: Option<&'static str>,
    /// Requests waiting in the gateway for the model to get a place in the engine's memory.
    waiting_for_place: usize,
    parallel: Parallel,
    /// The count in force: `parallel`, or the one read for "auto" (null while unknown, and for
    /// unlimited models).
    slots: Option<usize>,
    queue: usize,
    /// As the configuration writes it (`30s`).
    queue_timeout: Option<String>,
    capacity: Option<usize>,
    /// Requests sent ahead to wait inside the engine (`prefetch`): `in_flight` may reach
    /// `slots` plus this.
    prefetch: usize,
    in_flight: usize,
    queued: usize,
    /// The engine's own counts, once the reconciliation has looked (see
    /// [`reconcile`](crate::upstreams::reconcile)).
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: Option<EngineDoc>,
    /// How the slot count of `parallel = "auto"` was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    discovery: Option<DiscoveryDoc>,
    /// Under `[cluster]`: the key across every replica (`in_flight`, `queued`: as last seen,
    /// `null` before the first call) next to this replica's own (`in_flight` and `queued`
    /// above; `replica_queued` of them waiting in the shared queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<ClusterKeyDoc>,
}

#[derive(Debug, Serialize)]
struct ClusterKeyDoc {
    in_flight: Option<usize>,
    queued: Option<usize>,
    replica_queued: usize,
}

/// `parallel` as configured: a count, or `"unlimited"` / `"auto"`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Parallel {
    Count(usize),
    Word(&'static str),
}

#[derive(Debug, Serialize)]
struct EngineDoc {
    busy: Option<usize>,
    waiting: Option<usize>,
    gateway_in_flight: Option<usize>,
    unaccounted: Option<usize>,
    whole_engine: Option<bool>,
    warning: bool,
    last_check: Option<String>,
    last_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct DiscoveryDoc {
    source: &'static str,
    slots: Option<usize>,
    last_check: Option<String>,
    last_error: Option<String>,
}

/// A configured duration as the configuration writes it (`30s`).
fn duration(value: Duration) -> String {
    humantime::format_duration(value).to_string()
}

pub(crate) fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

/// `[cluster]`: the shared slot store as this replica sees it, with the replicas seen alive in
/// it (`GET /admin/upstreams` and the status page).
#[derive(Debug, Serialize)]
pub(crate) struct StoreDoc {
    up: bool,
    rejoining: bool,
    on_store_down: &'static str,
    /// This replica's id in the store.
    replica: String,
    /// How many replicas said they were alive within the last `lease_ttl` (this one
    /// included), as of this replica's last renewal round; 0 before the first.
    replicas_seen: usize,
    /// Their ids.
    replicas: Vec<String>,
    round_trips: u64,
    last_round_trip_ms: f64,
    errors: u64,
    went_down: u64,
    lease_renewals: u64,
    leases_lost: u64,
    leases_expired: u64,
}

impl StoreDoc {
    pub(crate) fn new(cluster: &slotgate_limiter_redis::RedisLimiter) -> Self {
        let status = cluster.status();
        Self {
            up: status.up,
            rejoining: status.rejoining,
            on_store_down: cluster.settings().on_store_down.as_str(),
            replica: status.replica,
            replicas_seen: status.replicas_seen.len(),
            replicas: status.replicas_seen,
            round_trips: status.round_trips,
            last_round_trip_ms: status.last_round_trip.as_secs_f64() * 1000.0,
            errors: status.errors,
            went_down: status.went_down,
            lease_renewals: status.lease_renewals,
            leases_lost: status.leases_lost,
            leases_expired: status.leases_expired,
        }
    }
}
