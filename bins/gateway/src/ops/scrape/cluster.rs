//! The `[cluster]` series read at scrape time: the shared slot store's state and counters
//! (from [`RedisLimiter::status`](slotgate_limiter_redis::RedisLimiter::status)) and each key's holders and waiters across every replica.
//! Nothing is written without `[cluster]`.

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use slotgate_limiter_redis::StoreStatus;

use crate::metrics::TargetLabels;
use crate::proxy::live::Generation;

/// Picks one counter out of the store's status.
type StatusPick = fn(&StoreStatus) -> u64;

/// Writes the store's gauge and counters, and the global gauges of every shared key.
pub(super) fn encode(
    generation: &Generation,
    encoder: &mut DescriptorEncoder<'_>,
) -> Result<(), std::fmt::Error> {
    let Some(cluster) = &generation.cluster else {
        return Ok(());
    };
    let status = cluster.status();
    let metric = encoder.encode_descriptor(
        "store_up",
        "1 while admission goes through the shared slot store, 0 while it is down or rejoining",
        None,
        ConstGauge::new(0_i64).metric_type(),
    )?;
    ConstGauge::new(i64::from(status.up)).encode(metric)?;
    let metric = encoder.encode_descriptor(
        "cluster_replicas_seen",
        "Replicas that renewed in the shared slot store within the last lease_ttl, this one \
         included (as of this replica's last renewal round)",
        None,
        ConstGauge::new(0_i64).metric_type(),
    )?;
    ConstGauge::new(i64::try_from(status.replicas_seen.len()).unwrap_or(i64::MAX))
        .encode(metric)?;
    let counters: [(&str, &str, StatusPick); 5] = [
        (
            "store_errors",
            "Calls to the shared slot store that failed or timed out",
            |s| s.errors,
        ),
        (
            "store_down",
            "Times this replica marked the shared slot store down",
            |s| s.went_down,
        ),
        (
            "lease_renewals",
            "Leases renewed in the shared slot store (one per lease per renewal round)",
            |s| s.lease_renewals,
        ),
        (
            "leases_lost",
            "Leases of this replica the shared slot store had lost, put back at renewal",
            |s| s.leases_lost,
        ),
        (
            "leases_expired",
            "Leases (of any replica) this replica's calls found expired and removed",
            |s| s.leases_expired,
        ),
    ];
    for (name, help, pick) in counters {
        let counter = ConstCounter::new(pick(&status));
        let metric = encoder.encode_descriptor(name, help, None, counter.metric_type())?;
        counter.encode(metric)?;
    }

    let shared: Vec<_> = generation
        .routes
        .targets()
        .filter_map(|target| {
            let global = target.global()?;
            let labels = TargetLabels {
                upstream: target.upstream.name.clone(),
                model: target.model.clone(),
            };
            Some((labels, global))
        })
        .collect();
    let gauges: [(&str, &str, bool); 2] = [
        (
            "cluster_slots_in_use",
            "Slots held across every replica sharing the cap (as last seen)",
            true,
        ),
        (
            "cluster_queue_depth",
            "Requests waiting across every replica sharing the queue (as last seen)",
            false,
        ),
    ];
    for (name, help, in_use) in gauges {
        let mut metric =
            encoder.encode_descriptor(name, help, None, ConstGauge::new(0_i64).metric_type())?;
        for (labels, global) in &shared {
            let value = if in_use {
                global.in_flight
            } else {
                global.queued
            };
            let value = i64::try_from(value).unwrap_or(i64::MAX);
            ConstGauge::new(value).encode(metric.encode_family(labels)?)?;
        }
    }
    Ok(())
}
