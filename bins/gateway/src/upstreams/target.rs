//! One upstream's offer of one model: its limiter key, its limits, and the state kept per
//! (upstream, model) — hold times, the `auto` slot count, the engine's own load, metric handles.
//!
//! The routing table ([`proxy::route`](crate::proxy::route)) lists targets per model; the
//! background rounds ([`slot_discovery`](crate::upstreams::slot_discovery),
//! [`reconcile`](crate::upstreams::reconcile)) work on the same `Arc<Target>`s, so none of them
//! needs to know about routes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slotgate_admission::Occupancy;
use slotgate_choose::Info;
use slotgate_config::Queueing;
use slotgate_limiter::{KeyHandle, KeyReading, Ticket};

use crate::metrics::TargetMetrics;
use crate::upstreams::auto_slots::AutoSlots;
use crate::upstreams::cluster::SharedKey;
use crate::upstreams::ejection::Ejection;
use crate::upstreams::engine_load::EngineLoad;
use crate::upstreams::health::HealthPolicy;
use crate::upstreams::hold::HoldStats;
use crate::upstreams::state::UpstreamState;

/// The names an answer's warnings and last event carry (`proxy::body::Watch`): made once per
/// target, shared by its answers.
#[derive(Debug)]
pub(crate) struct AnswerNames {
    /// The upstream's configured name.
    pub(crate) upstream: String,
    /// The model, as the route calls it.
    pub(crate) model: String,
}

/// One upstream's offer of one model.
#[derive(Debug)]
pub(crate) struct Target {
    /// The upstream: where it is, and its health, draining and residency.
    pub(crate) upstream: Arc<UpstreamState>,
    /// The configured model name (what clients call it, after aliases).
    pub(crate) model: String,
    /// What this upstream's engine calls the model (`engine_model`, else [`Target::model`]):
    /// the name written into requests sent here and asked about in probes.
    pub(crate) engine_model: String,
    /// The model's limiter key on this upstream. Its `Limits` are the one home of `parallel`
    /// (the count in force, configured or read from the engine) and `queue`.
    pub(crate) key: KeyHandle,
    /// Under `[cluster]`, for a model with a cap: its key in the shared slot store, which every
    /// replica admits through first (see [`cluster`](crate::upstreams::cluster)).
    pub(crate) shared: Option<SharedKey>,
    /// How `parallel` is decided.
    pub(crate) sizing: Sizing,
    /// The model's other resident name on this upstream ([`tagged_name`](crate::upstreams::residency::tagged_name): Ollama's
    /// `name:latest`), worked out once.
    pub(crate) tagged_name: Option<String>,
    /// The name the upstream's [`places`](crate::upstreams::places) know the model by: what the
    /// engine reports it as (the tagged name on Ollama, else `engine_model`).
    pub(crate) place_name: Arc<str>,
    /// The longest wait for a slot (its one home); `None` when unlimited (never waits).
    pub(crate) queue_timeout: Option<Duration>,
    /// How the queue serves its waiters (the order itself is applied to the limiter key) and
    /// what a waiting client sees: `queue_keepalive`, `honor_sdk_timeout`.
    pub(crate) queueing: Queueing,
    /// The operator's preference.
    pub(crate) weight: f64,
    /// The upstream's `allow_model_management`: whether Ollama's disk-changing routes may go
    /// there.
    pub(crate) model_management: bool,
    /// The upstream's `cancel_grace`: how long a slot stays taken after its client left before
    /// the response head came (`proxy::admit::Sending`).
    pub(crate) cancel_grace: Duration,
    /// The upstream's `stream_idle_timeout`: the longest silence between frames of an answer
    /// (`proxy::body::Watch`).
    pub(crate) stream_idle_timeout: Duration,
    /// The upstream's `stream_timeout`: the longest one answer may run, from when its request
    /// is sent (`proxy::body::Watch`); `None`: no bound.
    pub(crate) stream_timeout: Option<Duration>,
    /// The upstream's and the model's names for the warnings and the last event of an answer
    /// that ends badly, shared by every answer instead of copied for each.
    pub(crate) answer_names: Arc<AnswerNames>,
    /// Observed slot hold times, for `Retry-After` and the cost of waiting for a host that
    /// holds a prompt's prefix.
    pub(crate) hold: Arc<HoldStats>,
    /// Observed prefill time per KiB of prompt text the engine did not have cached, from
    /// llama-server's own `timings` or else streamed answers' first tokens: the price of
    /// sending a request where its prefix is not ([`cache_aware`](crate::proxy::cache_aware)).
    pub(crate) prefill: Arc<HoldStats>,
    /// This target's metric handles.
    pub(crate) metrics: Arc<TargetMetrics>,
    /// The engine's own busy count, next to ours ([`reconcile`](crate::upstreams::reconcile)).
    pub(crate) engine: Arc<EngineLoad>,
    /// The other upstreams of the upstream's models, which passive ejection must leave enough
    /// of (shared by the upstream's targets).
    pub(crate) ejection: Arc<Ejection>,
}

/// How a target's slot count is decided. The count itself lives in the limiter key's `Limits`.
#[derive(Debug)]
pub(crate) enum Sizing {
    /// `parallel = N`, with the engine's real count when the operator stated it.
    Fixed {
        /// `capacity` from the configuration.
        capacity: Option<usize>,
    },
    /// `parallel = "unlimited"`: the key counts requests but never refuses or queues.
    Unlimited,
    /// `parallel = "auto"`: read from the engine, and not known until a read succeeds.
    Auto(Arc<AutoSlots>),
}

impl Target {
    /// The key's limits and counts, read together under one lock: every figure shown or used
    /// for one decision comes from one reading, so they agree.
    pub(crate) fn reading(&self) -> KeyReading {
        self.key.reading()
    }

    /// The slot count in force in `reading`: the configured `parallel`, or the one read for
    /// `parallel = "auto"`; `None` when unlimited or not known yet. The key's own cap is this
    /// plus `prefetch`; the engine runs this many at once.
    pub(crate) fn slots(&self, reading: &KeyReading) -> Option<usize> {
        let slots = reading
            .limits
            .parallel
            .saturating_sub(self.queueing.prefetch);
        match &self.sizing {
            Sizing::Fixed { .. } => Some(slots),
            Sizing::Unlimited => None,
            Sizing::Auto(auto) => auto.is_known().then_some(slots),
        }
    }

    /// The discovery state, for `parallel = "auto"`.
    pub(crate) fn auto(&self) -> Option<&AutoSlots> {
        match &self.sizing {
            Sizing::Auto(auto) => Some(auto),
            Sizing::Fixed { .. } | Sizing::Unlimited => None,
        }
    }

    /// Whether requests may be routed here as far as the slot count goes: always, except for
    /// an `auto` target whose count is not known (see [`slot_discovery`](crate::upstreams::slot_discovery)).
    pub(crate) fn slots_known(&self) -> bool {
        self.auto().is_none_or(AutoSlots::is_known)
    }

    /// Records a failure of the upstream seen while forwarding a request sent at `sent` (`by`:
    /// `connect errors`, `engine errors`), towards a passive ejection within the limits of
    /// [`ejection`](crate::upstreams::ejection).
    pub(crate) fn record_failure(
        &self,
        reason: String,
        sent: Instant,
        policy: &HealthPolicy,
        by: &'static str,
    ) {
        self.ejection
            .record_failure(&self.upstream, reason, sent, policy, by);
    }

    /// Whether the model is resident on the upstream, as last discovered.
    pub(crate) fn is_loaded(&self) -> bool {
        self.upstream
            .residency
            .is_loaded_as(&self.engine_model, self.tagged_name.as_deref())
    }

    /// What `slotgate-choose` needs to know about this target now.
    pub(crate) fn info(&self) -> Info {
        let reading = self.reading();
        let mut free = reading.limits.parallel.saturating_sub(reading.in_flight);
        // Under an engine-wide cap, a model's own free slots are only free if the engine has
        // them too.
        if let Some(cap) = self.key.host_reading() {
            free = free.min(cap.parallel.saturating_sub(cap.in_flight));
        }
        // Under `[cluster]` the caps are shared: every replica's holders count.
        if let Some(global) = self.global() {
            free = reading.limits.parallel.saturating_sub(global.in_flight);
            if let Some(cap) = self.shared.as_ref().and_then(SharedKey::host_global) {
                free = free.min(cap.parallel.saturating_sub(cap.in_flight));
            }
        }
        Info {
            healthy: self.upstream.health.is_routable(),
            draining: self.upstream.is_draining(),
            loaded: self.is_loaded(),
            // Configured here, so it can be served here (loading it first if need be); see
            // the `residency` module.
            can_serve: true,
            free,
            queued: self.waiting(&reading),
            weight: self.weight,
        }
    }

    /// The `Retry-After` for a request with `ticket`: where it would stand in the queue now
    /// (its class, and its tenant's place under fair order), not behind everyone.
    pub(crate) fn retry_after_for(&self, ticket: &Ticket) -> Duration {
        // Under `[cluster]` the queue is shared (and FIFO): everyone waiting is ahead.
        let ahead = self
            .global()
            .map_or_else(|| self.key.position_for(ticket).ahead, |g| g.queued);
        let reading = self.reading();
        self.hold
            .retry_after(ahead, self.slots(&reading).unwrap_or(usize::MAX))
    }

    /// The wait expected for a request with `ahead` waiters before it, from observed hold
    /// times; `None` before any was observed.
    pub(crate) fn expected_wait(&self, ahead: usize) -> Option<Duration> {
        let reading = self.reading();
        self.hold
            .expected_wait(ahead, self.slots(&reading).unwrap_or(usize::MAX))
    }

    /// Requests waiting for this target's slots: across every replica under `[cluster]` (as
    /// last seen), else here.
    pub(crate) fn waiting(&self, reading: &KeyReading) -> usize {
        self.global().map_or(reading.queued, |global| global.queued)
    }

    /// The shared key's holders and waiters across every replica, under `[cluster]`.
    pub(crate) fn global(&self) -> Option<Occupancy> {
        self.shared.as_ref().and_then(SharedKey::global)
    }
}
