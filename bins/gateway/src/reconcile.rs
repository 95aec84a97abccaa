//! Reconciliation: the engine's own count of busy and waiting requests, next to the gateway's
//! count of slots in use, so that traffic bypassing the gateway (or a leaked slot) shows.
//!
//! Every health-check round, for each healthy upstream whose engine tells:
//!
//! | kind | busy | waiting | scope |
//! |---|---|---|---|
//! | `llama-server` | `/slots`: entries with `is_processing` (else `/metrics` `llamacpp:requests_processing`) | `/metrics` `llamacpp:requests_deferred` (needs `--metrics`) | the whole engine; per model in router mode (`?model=`) |
//! | `vllm` | `/metrics` `vllm:num_requests_running` | `vllm:num_requests_waiting` | the whole engine (summed over `model_name`: adapters share its sequences) |
//! | `ollama`, `openai` | — | — | not told: `/api/ps` lists resident models, not requests |
//!
//! The engine's count is compared with the gateway's requests in flight *in the same scope*:
//! for a whole-engine count, the sum over every model configured on that upstream. Both are
//! exported (`slotgate_engine_busy`, `slotgate_engine_waiting` beside `slotgate_slots_in_use`)
//! and shown by `GET /admin/upstreams` (`engine` of each model).
//!
//! # The warning
//!
//! When the engine is busier (busy + waiting) than the gateway's in-flight count, something the
//! gateway does not see uses the engine: clients going straight to it, another gateway replica,
//! or a slot the gateway leaked. Then the gateway's cap no longer protects the engine. A single
//! reading proves little: the two counts are taken a few milliseconds apart, and llama-server
//! keeps running a non-streamed request for up to a second or two after its client left
//! (`docs/real-engine-notes.md`). So the gateway logs a warning only once the excess has been
//! seen in two consecutive checks at least [`EXCESS_GRACE`] apart, once per episode, and logs
//! again (at `info`) when it ends. A request with `n` > 1 takes `n` engine slots and counts as
//! one here: such traffic shows as an excess too.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use slotgate_config::Kind;
use tokio::task::JoinSet;
use tracing::{debug, info, warn};

use crate::health::HealthPolicy;
use crate::probe::{ProbeError, ProbeTarget, Prober};
use crate::residency::Resident;
use crate::route::{Route, Target};

/// How long an excess must last before it is logged.
pub const EXCESS_GRACE: Duration = Duration::from_secs(2);

/// The engine's view of one (upstream, model), as last read.
#[derive(Debug, Default)]
pub struct EngineLoad {
    state: Mutex<State>,
}

#[derive(Debug, Default, Clone)]
struct State {
    reading: Option<Reading>,
    checked: Option<SystemTime>,
    error: Option<String>,
    /// When the current excess was first seen, and in how many checks in a row.
    excess_since: Option<Instant>,
    excess_checks: u32,
    warned: bool,
}

/// One reading of the engine against the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Requests the engine is running.
    pub busy: usize,
    /// Requests the engine holds in its own queue, when it tells.
    pub waiting: Option<usize>,
    /// The gateway's requests in flight in the same scope.
    pub gateway_in_flight: usize,
    /// Whether the engine's count covers the whole engine (every model configured on the
    /// upstream) rather than this model alone.
    pub whole_engine: bool,
}

impl Reading {
    /// Requests the engine has beyond what the gateway sent it.
    pub fn unaccounted(&self) -> usize {
        (self.busy + self.waiting.unwrap_or(0)).saturating_sub(self.gateway_in_flight)
    }
}

/// A copy of the state, for the admin API and the metrics.
#[derive(Debug, Clone)]
pub struct LoadView {
    /// The last successful reading.
    pub reading: Option<Reading>,
    /// When the last check ended.
    pub checked: Option<SystemTime>,
    /// Why the last check failed, until one succeeds.
    pub error: Option<String>,
    /// Whether a warning about an excess is in force.
    pub warned: bool,
}

impl EngineLoad {
    /// Nothing read yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the state.
    pub fn view(&self) -> LoadView {
        let state = self.state.lock().clone();
        LoadView {
            reading: state.reading,
            checked: state.checked,
            error: state.error,
            warned: state.warned,
        }
    }

    /// Records a check of (`upstream`, `model`), logging an excess that lasted.
    fn record(&self, upstream: &str, model: &str, result: Result<Reading, String>) {
        let mut state = self.state.lock();
        state.checked = Some(SystemTime::now());
        let reading = match result {
            Ok(reading) => reading,
            Err(error) => {
                if state.error.as_deref() != Some(error.as_str()) {
                    debug!(upstream, model, %error, "reading the engine's busy count failed");
                }
                // Unknown, not zero: an old reading would be a lie in the metrics.
                state.reading = None;
                state.error = Some(error);
                return;
            }
        };
        state.reading = Some(reading);
        state.error = None;
        if reading.unaccounted() == 0 {
            if state.warned {
                info!(
                    upstream,
                    model,
                    engine_busy = reading.busy,
                    gateway_in_flight = reading.gateway_in_flight,
                    "the engine is no busier than slotgate accounts for again"
                );
            }
            state.excess_since = None;
            state.excess_checks = 0;
            state.warned = false;
            return;
        }
        let since = *state.excess_since.get_or_insert_with(Instant::now);
        state.excess_checks += 1;
        if !state.warned && state.excess_checks >= 2 && since.elapsed() >= EXCESS_GRACE {
            state.warned = true;
            warn!(
                upstream,
                model,
                engine_busy = reading.busy,
                engine_waiting = reading.waiting,
                gateway_in_flight = reading.gateway_in_flight,
                whole_engine = reading.whole_engine,
                lasted = ?since.elapsed(),
                "the engine is busier than slotgate accounts for: requests reach it without going \
                 through this gateway (direct clients, another replica), or a slot leaked; the \
                 cap no longer protects it"
            );
        }
    }
}

/// What an engine says about its load in one scope.
struct EngineCount {
    busy: usize,
    waiting: Option<usize>,
}

/// Reads every healthy upstream's load (see the [module docs](self)), concurrently, each probe
/// bounded by the health-check timeout.
pub async fn round(routes: Vec<Arc<Route>>, prober: &Prober, policy: HealthPolicy) {
    let prober = prober.with_timeout(policy.timeout);
    // The targets of each upstream, as (route, index) pairs.
    let mut by_upstream: BTreeMap<String, Vec<(Arc<Route>, usize)>> = BTreeMap::new();
    for route in &routes {
        for (index, target) in route.targets.iter().enumerate() {
            by_upstream
                .entry(target.upstream.name.clone())
                .or_default()
                .push((Arc::clone(route), index));
        }
    }
    let mut checks = JoinSet::new();
    for targets in by_upstream.into_values() {
        let prober = prober.clone();
        checks.spawn(async move { check_upstream(&targets, &prober).await });
    }
    // Dropping the set (if this future is dropped at shutdown) aborts the checks.
    while checks.join_next().await.is_some() {}
}

fn target(pair: &(Arc<Route>, usize)) -> &Target {
    &pair.0.targets[pair.1]
}

/// One upstream's targets: one whole-engine reading, or one per model in router mode.
async fn check_upstream(targets: &[(Arc<Route>, usize)], prober: &Prober) {
    let Some(first) = targets.first() else { return };
    let upstream = &target(first).upstream;
    if matches!(upstream.kind, Kind::Ollama | Kind::OpenAi) {
        // Nothing to compare with.
        return;
    }
    if !upstream.health.is_routable() {
        // Not asked; an old reading of a dead engine would be a lie in the metrics.
        for pair in targets {
            target(pair).engine.record(
                &upstream.name,
                &pair.0.model,
                Err("the upstream is unhealthy; not asked".to_owned()),
            );
        }
        return;
    }
    let router = upstream.kind == Kind::LlamaServer
        && matches!(upstream.residency.view().resident, Some(Resident::Names(_)));
    let scopes: Vec<&[(Arc<Route>, usize)]> = if router {
        targets.chunks(1).collect()
    } else {
        vec![targets]
    };
    for scope in scopes {
        let in_flight = || {
            scope
                .iter()
                .map(|t| target(t).key.in_flight())
                .sum::<usize>()
        };
        let before = in_flight();
        let model = scope[0].0.model.as_str();
        let count = match upstream.kind {
            Kind::LlamaServer => read_llama(prober, upstream.probe_target(), model).await,
            Kind::Vllm => read_vllm(prober, upstream.probe_target()).await,
            // Left out above.
            Kind::Ollama | Kind::OpenAi => return,
        };
        // The larger of the two: a request that started or ended while the engine was asked
        // is counted, so only a real excess remains.
        let gateway_in_flight = before.max(in_flight());
        let result = count
            .map(|count| Reading {
                busy: count.busy,
                waiting: count.waiting,
                gateway_in_flight,
                whole_engine: !router,
            })
            .map_err(|e| e.to_string());
        for pair in scope {
            target(pair)
                .engine
                .record(&upstream.name, &pair.0.model, result.clone());
        }
    }
}

/// llama-server: busy slots from `/slots`, the deferred queue from `/metrics`; either may be
/// switched off (`--no-slots`, no `--metrics`), so each stands in for the other where it can.
async fn read_llama(
    prober: &Prober,
    target: ProbeTarget<'_>,
    model: &str,
) -> Result<EngineCount, ProbeError> {
    let (slots, metrics) = tokio::join!(
        prober.llama_slots(target, model),
        prober.llama_metrics(target, model)
    );
    let metrics = metrics.ok();
    let waiting = metrics
        .as_ref()
        .and_then(|m| m.sum("llamacpp:requests_deferred", &[]))
        .map(count);
    let busy = match slots {
        Ok(slots) => slots.iter().filter(|slot| slot.is_processing).count(),
        Err(error) => metrics
            .as_ref()
            .and_then(|m| m.sum("llamacpp:requests_processing", &[]))
            .map(count)
            .ok_or(error)?,
    };
    Ok(EngineCount { busy, waiting })
}

/// vLLM: running and waiting requests over every `model_name` (adapters share the engine).
async fn read_vllm(prober: &Prober, target: ProbeTarget<'_>) -> Result<EngineCount, ProbeError> {
    let metrics = prober.vllm_metrics(target).await?;
    let busy = metrics
        .sum("vllm:num_requests_running", &[])
        .ok_or_else(|| ProbeError::Parse("/metrics has no vllm:num_requests_running".into()))?;
    Ok(EngineCount {
        busy: count(busy),
        waiting: metrics.sum("vllm:num_requests_waiting", &[]).map(count),
    })
}

/// A gauge's value as a count: engines print whole numbers (`2`, `3.0`); anything negative or
/// not finite is 0.
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "rounded, finite and non-negative first"
)]
fn count(value: f64) -> usize {
    if value.is_finite() && value > 0.0 {
        value.round() as usize
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::{EngineLoad, Reading, count};

    fn reading(busy: usize, waiting: Option<usize>, ours: usize) -> Reading {
        Reading {
            busy,
            waiting,
            gateway_in_flight: ours,
            whole_engine: true,
        }
    }

    #[test]
    fn unaccounted_is_the_engines_excess_over_the_gateway() {
        assert_eq!(reading(2, Some(0), 2).unaccounted(), 0);
        assert_eq!(reading(1, None, 3).unaccounted(), 0);
        assert_eq!(reading(3, Some(2), 2).unaccounted(), 3);
        assert_eq!(reading(2, None, 0).unaccounted(), 2);
    }

    #[test]
    fn one_excess_reading_is_not_a_warning_and_a_failure_forgets_the_reading() {
        let load = EngineLoad::new();
        load.record("u", "m", Ok(reading(2, Some(0), 0)));
        let view = load.view();
        assert_eq!(view.reading.map(|r| r.unaccounted()), Some(2));
        assert!(!view.warned, "not before two checks over the grace period");
        load.record("u", "m", Ok(reading(1, Some(0), 1)));
        assert!(!load.view().warned);
        load.record("u", "m", Err("refused".into()));
        let view = load.view();
        assert_eq!(view.reading, None);
        assert_eq!(view.error.as_deref(), Some("refused"));
    }

    #[test]
    fn gauge_values_become_counts() {
        assert_eq!(count(2.0), 2);
        assert_eq!(count(3.000_001), 3);
        assert_eq!(count(-1.0), 0);
        assert_eq!(count(f64::NAN), 0);
    }
}
