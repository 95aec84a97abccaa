//! The admin listener's `/metrics` registry: every family of [`metrics`](crate::metrics), plus
//! the gauges read at scrape time from the configuration in force (limiter keys, upstream
//! health, draining and residency, the engines' own counts). It sits above both the live
//! configuration and the metric families, so neither imports the other.

use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use slotgate_limiter::HostReading;

use crate::metrics::process::ProcessCollector;
use crate::metrics::{Metrics, TargetLabels};
use crate::proxy::live::{Generation, Live};
use crate::upstreams::state::UpstreamState;

mod cluster;
mod places;

/// A registry with every family of `metrics`, plus the gauges read from the configuration in
/// force at scrape time (all under the `slotgate_` prefix), and the process metrics under their
/// standard names (`process_*`).
pub(crate) fn registry(metrics: &Metrics, live: Arc<Live>) -> Registry {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(ProcessCollector));
    let slotgate = registry.sub_registry_with_prefix("slotgate");
    metrics.register(slotgate);
    slotgate.register_collector(Box::new(LiveGauges { live }));
    registry
}

/// Reads every key's state from the limiter, and every upstream's health, draining and
/// residency, at scrape time.
#[derive(Debug)]
struct LiveGauges {
    live: Arc<Live>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct UpstreamLabels {
    upstream: String,
}

/// Picks one gauge's value out of a [`KeyGauges`].
type Pick = fn(&KeyGauges) -> Option<usize>;

/// Picks one per-upstream gauge's value.
type UpstreamPick = fn(&UpstreamState) -> bool;

/// Picks one engine-wide cap gauge's value.
type CapPick = fn(&HostReading) -> usize;

/// One key's state, read once per scrape so the four gauges of a key agree.
struct KeyGauges {
    labels: TargetLabels,
    capacity: Option<usize>,
    in_use: usize,
    queued: usize,
    queue_capacity: usize,
    loaded: bool,
    /// The engine's own counts at the last reconciliation (absent when it does not tell).
    engine_busy: Option<usize>,
    engine_waiting: Option<usize>,
}

/// Every key's state, read once.
fn key_gauges(generation: &Generation) -> Vec<KeyGauges> {
    generation
        .routes
        .targets()
        .map(|target| {
            let reading = target.reading();
            let engine = target.engine.view().reading;
            KeyGauges {
                engine_busy: engine.map(|e| e.busy),
                engine_waiting: engine.and_then(|e| e.waiting),
                labels: TargetLabels {
                    upstream: target.upstream.name.clone(),
                    model: target.model.clone(),
                },
                loaded: target.is_loaded(),
                // Discovered for `parallel = "auto"` (absent while unknown).
                capacity: target.slots(&reading),
                in_use: reading.in_flight,
                // Under `[cluster]` this replica's requests wait in the shared store.
                queued: reading.queued + target.shared.as_ref().map_or(0, |s| s.local().queued),
                queue_capacity: reading.limits.queue,
            }
        })
        .collect()
}

impl Collector for LiveGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let generation = self.live.current();
        let key_gauges = key_gauges(&generation);
        let gauges: [(&str, &str, Pick); 7] = [
            ("slots_in_use", "Slots held now", |r| Some(r.in_use)),
            ("slots_capacity", "Slots configured (parallel)", |r| {
                r.capacity
            }),
            ("queue_depth", "Requests waiting for a slot now", |r| {
                Some(r.queued)
            }),
            ("queue_capacity", "Requests allowed to wait (queue)", |r| {
                Some(r.queue_capacity)
            }),
            (
                "model_loaded",
                "1 when the model is resident on the upstream (last discovery)",
                |r| Some(usize::from(r.loaded)),
            ),
            (
                "engine_busy",
                "Requests the engine itself reports running (last reconciliation; the whole \
                 engine unless it runs several models)",
                |r| r.engine_busy,
            ),
            (
                "engine_waiting",
                "Requests the engine itself reports queued inside it (last reconciliation)",
                |r| r.engine_waiting,
            ),
        ];
        for (name, help, pick) in gauges {
            let mut metric = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstGauge::new(0_i64).metric_type(),
            )?;
            for key in &key_gauges {
                if let Some(value) = pick(key) {
                    let value = i64::try_from(value).unwrap_or(i64::MAX);
                    ConstGauge::new(value).encode(metric.encode_family(&key.labels)?)?;
                }
            }
        }

        let per_upstream: [(&str, &str, UpstreamPick); 2] = [
            (
                "upstream_healthy",
                "1 while the upstream passes its health checks (or is not checked yet), 0 while ejected",
                |u| u.health.is_routable(),
            ),
            (
                "upstream_draining",
                "1 while an operator drains the upstream",
                UpstreamState::is_draining,
            ),
        ];
        let metric = encoder.encode_descriptor(
            "config_generation",
            "The configuration in force: 1 at start, +1 per applied reload",
            None,
            ConstGauge::new(0_i64).metric_type(),
        )?;
        ConstGauge::new(i64::try_from(generation.number).unwrap_or(i64::MAX)).encode(metric)?;

        encode_caps(&generation, &mut encoder)?;
        cluster::encode(&generation, &mut encoder)?;
        places::encode(&generation, &mut encoder)?;

        for (name, help, pick) in per_upstream {
            let mut metric = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstGauge::new(0_i64).metric_type(),
            )?;
            for upstream in generation.upstreams.iter() {
                let labels = UpstreamLabels {
                    upstream: upstream.name.clone(),
                };
                ConstGauge::new(i64::from(pick(upstream)))
                    .encode(metric.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The engine-wide cap gauges, for the upstreams that have one.
fn encode_caps(
    generation: &Generation,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let caps: Vec<_> = generation
        .upstreams
        .iter()
        .filter_map(|u| Some((u.name.clone(), generation.routes.upstream_cap(u)?)))
        .collect();
    let cap_gauges: [(&str, &str, CapPick); 2] = [
        (
            "upstream_slots_in_use",
            "Slots held now over all the upstream's models (engine-wide cap)",
            |cap| cap.in_flight,
        ),
        (
            "upstream_slots_capacity",
            "The upstream's engine-wide slot cap (parallel of the upstream)",
            |cap| cap.parallel,
        ),
    ];
    for (name, help, pick) in cap_gauges {
        let mut metric =
            encoder.encode_descriptor(name, help, None, ConstGauge::new(0_i64).metric_type())?;
        for (upstream, cap) in &caps {
            let labels = UpstreamLabels {
                upstream: upstream.clone(),
            };
            let value = i64::try_from(pick(cap)).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
        }
    }
    Ok(())
}
