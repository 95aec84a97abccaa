//! The series of models that come and go, read at scrape time: each upstream's bound on models
//! held at once ([`places`](crate::upstreams::places)), the requests waiting in the gateway for
//! their model to get a place, and the loads the residency discoveries saw
//! ([`residency`](crate::upstreams::residency)). Labelled by the configured model name.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::UpstreamLabels;
use crate::metrics::TargetLabels;
use crate::proxy::live::Generation;
use crate::upstreams::residency::Loads;

/// One target's figures, read once per scrape.
struct TargetPlaces {
    labels: TargetLabels,
    waiting: usize,
    loads: Loads,
}

/// Picks one counter out of a target's [`Loads`].
type LoadsPick = fn(&Loads) -> f64;

/// Writes the bound per bounded upstream, the waiters and the load counters per target.
pub(super) fn encode(
    generation: &Generation,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(
        "upstream_max_loaded_models",
        "Models the engine holds at once (max_loaded_models, else the router's max_instances); \
         absent when not bounded",
        None,
        ConstGauge::new(0_i64).metric_type(),
    )?;
    for upstream in generation.upstreams.iter() {
        if let Some(bound) = upstream.places.capacity() {
            let labels = UpstreamLabels {
                upstream: upstream.name.clone(),
            };
            ConstGauge::new(i64::try_from(bound).unwrap_or(i64::MAX))
                .encode(metric.encode_family(&labels)?)?;
        }
    }
    let targets: Vec<TargetPlaces> = generation
        .routes
        .targets()
        .map(|target| {
            let places = target.upstream.places.view();
            let residency = target.upstream.residency.view();
            TargetPlaces {
                labels: TargetLabels {
                    upstream: target.upstream.name.clone(),
                    model: target.model.clone(),
                },
                waiting: places.get(&target.place_name).map_or(0, |p| p.waiting),
                loads: residency
                    .loads
                    .get(&*target.place_name)
                    .copied()
                    .unwrap_or_default(),
            }
        })
        .collect();
    let mut metric = encoder.encode_descriptor(
        "model_waiting_for_place",
        "Requests waiting in the gateway for their model to get a place in the engine's memory",
        None,
        ConstGauge::new(0_i64).metric_type(),
    )?;
    for target in &targets {
        let value = i64::try_from(target.waiting).unwrap_or(i64::MAX);
        ConstGauge::new(value).encode(metric.encode_family(&target.labels)?)?;
    }
    #[expect(
        clippy::cast_precision_loss,
        reason = "load counts stay far below 2^52"
    )]
    let counters: [(&str, &str, LoadsPick); 3] = [
        (
            "model_loads",
            "Model loads the residency discoveries saw start (not running, then loading or loaded)",
            |l| l.count as f64,
        ),
        (
            "model_loads_timed",
            "Model loads seen loading and then loaded, whose time is in model_load_seconds",
            |l| l.timed as f64,
        ),
        (
            "model_load_seconds",
            "Total time of the timed loads (to within one health-check interval each)",
            |l| l.seconds,
        ),
    ];
    for (name, help, pick) in counters {
        let mut metric = encoder.encode_descriptor(
            name,
            help,
            None,
            ConstCounter::new(0.0_f64).metric_type(),
        )?;
        for target in &targets {
            ConstCounter::new(pick(&target.loads)).encode(metric.encode_family(&target.labels)?)?;
        }
    }
    Ok(())
}
