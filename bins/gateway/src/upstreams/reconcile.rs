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
//! seen in two consecutive checks at least [`EXCESS_GRACE`](crate::upstreams::engine_load::EXCESS_GRACE) apart, once per episode, and logs
//! again (at `info`) when it ends. A request with `n` > 1 takes `n` engine slots and counts as
//! one here: such traffic shows as an excess too.

use std::collections::BTreeMap;
use std::sync::Arc;

use slotgate_config::Kind;

use crate::upstreams::engine_load::{EngineReading, LoadError};
use crate::upstreams::fan_out::fan_out;
use crate::upstreams::health::HealthPolicy;
use crate::upstreams::probe::{ProbeError, ProbeTarget, Prober};
use crate::upstreams::residency::Resident;
use crate::upstreams::target::Target;

/// What an engine says about its load in one scope.
struct EngineCount {
    busy: usize,
    waiting: Option<usize>,
}

/// Reads every healthy upstream's load (see the [module docs](self)), concurrently, each probe
/// bounded by the health-check timeout.
pub(crate) async fn read_engine_loads(
    targets: Vec<Arc<Target>>,
    prober: &Prober,
    policy: HealthPolicy,
) {
    let prober = prober.with_timeout(policy.timeout);
    let mut by_upstream: BTreeMap<String, Vec<Arc<Target>>> = BTreeMap::new();
    for target in targets {
        by_upstream
            .entry(target.upstream.name.clone())
            .or_default()
            .push(target);
    }
    fan_out(by_upstream.into_values(), |targets| {
        let prober = prober.clone();
        async move { read_upstream(&targets, &prober).await }
    })
    .await;
}

/// One upstream's targets: one whole-engine reading, or one per model in router mode.
async fn read_upstream(targets: &[Arc<Target>], prober: &Prober) {
    let Some(first) = targets.first() else { return };
    let upstream = &first.upstream;
    if matches!(upstream.kind, Kind::Ollama | Kind::OpenAi) {
        // Nothing to compare with.
        return;
    }
    if !upstream.health.is_routable() {
        // Not asked; an old reading of a dead engine would be a lie in the metrics.
        for target in targets {
            target
                .engine
                .record(&upstream.name, &target.model, Err(&LoadError::NotAsked));
        }
        return;
    }
    let router = upstream.kind == Kind::LlamaServer
        && matches!(upstream.residency.view().resident, Some(Resident::Names(_)));
    let scopes: Vec<&[Arc<Target>]> = if router {
        targets.chunks(1).collect()
    } else {
        vec![targets]
    };
    for scope in scopes {
        let in_flight = || scope.iter().map(|t| t.key.in_flight()).sum::<usize>();
        let before = in_flight();
        let model = scope[0].engine_model.as_str();
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
            .map(|count| EngineReading {
                busy: count.busy,
                waiting: count.waiting,
                gateway_in_flight,
                whole_engine: !router,
            })
            .map_err(LoadError::from);
        for target in scope {
            target
                .engine
                .record(&upstream.name, &target.model, result.as_ref().copied());
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
        .ok_or(ProbeError::MissingMetric {
            path: "/metrics",
            metric: "vllm:num_requests_running",
        })?;
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
    use super::count;

    #[test]
    fn gauge_values_become_counts() {
        assert_eq!(count(2.0), 2);
        assert_eq!(count(3.000_001), 3);
        assert_eq!(count(-1.0), 0);
        assert_eq!(count(f64::NAN), 0);
    }
}
