//! One upstream's offer of one model: its limiter key, its limits, and the state kept per
//! (upstream, model) — hold times, the `auto` slot count, the engine's own load, metric handles.
//!
//! The routing table ([`proxy::route`](crate::proxy::route)) lists targets per model; the
//! background rounds ([`slot_discovery`](crate::upstreams::slot_discovery),
//! [`reconcile`](crate::upstreams::reconcile)) work on the same `Arc<Target>`s, so none of them
//! needs to know about routes.

use std::sync::Arc;
use std::time::Duration;

use slotgate_choose::Info;
use slotgate_config::ModelLimits;
use slotgate_limiter::KeyHandle;

use crate::metrics::TargetMetrics;
use crate::upstreams::auto_slots::AutoSlots;
use crate::upstreams::engine_load::EngineLoad;
use crate::upstreams::hold::HoldStats;
use crate::upstreams::state::UpstreamState;

/// One upstream's offer of one model.
#[derive(Debug)]
pub(crate) struct Target {
    /// The upstream: where it is, and its health, draining and residency.
    pub(crate) upstream: Arc<UpstreamState>,
    /// The configured model name (what the upstream calls it).
    pub(crate) model: String,
    /// The model's limiter key on this upstream.
    pub(crate) key: KeyHandle,
    /// The configured limits.
    pub(crate) limits: ModelLimits,
    /// The model's other resident name on this upstream ([`tagged_name`](crate::upstreams::residency::tagged_name): Ollama's
    /// `name:latest`), worked out once.
    pub(crate) tagged_name: Option<String>,
    /// The configured slot count; `None` when unlimited or discovered (see
    /// [`Target::slots`]).
    pub(crate) parallel: Option<usize>,
    /// The longest wait for a slot; `None` when unlimited (never waits).
    pub(crate) queue_timeout: Option<Duration>,
    /// The operator's preference.
    pub(crate) weight: f64,
    /// The upstream's `cancel_grace`: how long a slot stays taken after its client left before
    /// the response head came (`proxy::admit::Sending`).
    pub(crate) cancel_grace: Duration,
    /// Observed slot hold times, for `Retry-After`.
    pub(crate) hold: Arc<HoldStats>,
    /// This target's metric handles.
    pub(crate) metrics: Arc<TargetMetrics>,
    /// `parallel = "auto"`: the slot count read from the engine.
    pub(crate) auto: Option<Arc<AutoSlots>>,
    /// The engine's own busy count, next to ours ([`reconcile`](crate::upstreams::reconcile)).
    pub(crate) engine: Arc<EngineLoad>,
}

impl Target {
    /// The slot count in force: the configured `parallel`, or the one discovered for
    /// `parallel = "auto"`; `None` when unlimited or not discovered yet.
    pub(crate) fn slots(&self) -> Option<usize> {
        match &self.auto {
            Some(auto) => auto.found(),
            None => self.parallel,
        }
    }

    /// Whether requests may be routed here as far as the slot count goes: always, except for
    /// an `auto` target whose count is not known (see [`slot_discovery`](crate::upstreams::slot_discovery)).
    pub(crate) fn slots_known(&self) -> bool {
        self.auto.as_ref().is_none_or(|auto| auto.found().is_some())
    }

    /// Whether the model is resident on the upstream, as last discovered.
    pub(crate) fn is_loaded(&self) -> bool {
        self.upstream
            .residency
            .is_loaded_as(&self.model, self.tagged_name.as_deref())
    }

    /// What `slotgate-choose` needs to know about this target now.
    pub(crate) fn info(&self) -> Info {
        let limits = self.key.limits();
        Info {
            healthy: self.upstream.health.is_routable(),
            draining: self.upstream.is_draining(),
            loaded: self.is_loaded(),
            // Configured here, so it can be served here (loading it first if need be); see
            // the `residency` module.
            can_serve: true,
            free: limits.parallel.saturating_sub(self.key.in_flight()),
            queued: self.key.queued(),
            weight: self.weight,
        }
    }

    /// The `Retry-After` for a request that would wait behind everyone queued here now.
    pub(crate) fn retry_after(&self) -> Duration {
        self.hold
            .retry_after(self.key.queued(), self.slots().unwrap_or(usize::MAX))
    }
}
