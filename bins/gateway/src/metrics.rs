//! Prometheus metrics, served on the admin listener's `/metrics`.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `slotgate_slots_in_use` | gauge | upstream, model | permits held now |
//! | `slotgate_slots_capacity` | gauge | upstream, model | `parallel` (absent for unlimited models) |
//! | `slotgate_queue_depth` | gauge | upstream, model | requests waiting for a slot now |
//! | `slotgate_queue_capacity` | gauge | upstream, model | `queue` |
//! | `slotgate_queue_wait_seconds` | histogram | upstream, model | time from arrival in the queue to the grant (0 when a slot was free) |
//! | `slotgate_requests_total` | counter | upstream, model, outcome | forwarded requests by how they ended: `completed`, `upstream_error`, `client_gone` |
//! | `slotgate_rejections_total` | counter | model, reason | requests refused with 503: `queue_full`, `queue_timeout` |
//! | `slotgate_client_disconnects_total` | counter | upstream, model, phase | clients that left while `queued` or while `streaming` |
//! | `slotgate_time_to_first_byte_seconds` | histogram | upstream, model | from sending upstream to its response head |
//! | `slotgate_request_duration_seconds` | histogram | upstream, model | from the slot grant to the end of the response |
//!
//! The gauges are read from the limiter at scrape time (a [`Collector`]), so they are never
//! stale. Counters and histograms are resolved per (upstream, model) once, when the routing
//! table is built: the request path increments pre-resolved handles and never hashes labels.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::route::Routes;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    upstream: String,
    model: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    upstream: String,
    model: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RejectionLabels {
    model: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DisconnectLabels {
    upstream: String,
    model: String,
    phase: &'static str,
}

type HistogramFamily = Family<TargetLabels, Histogram, fn() -> Histogram>;

/// Waits and durations: 5 ms to ~20 min in ×2 steps.
fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 18))
}

/// The gateway's metric families.
#[derive(Debug, Clone)]
pub struct Metrics {
    requests: Family<OutcomeLabels, Counter>,
    rejections: Family<RejectionLabels, Counter>,
    disconnects: Family<DisconnectLabels, Counter>,
    queue_wait: HistogramFamily,
    first_byte: HistogramFamily,
    duration: HistogramFamily,
}

/// Pre-resolved handles for one (upstream, model).
#[derive(Debug)]
pub struct TargetMetrics {
    /// `slotgate_queue_wait_seconds`.
    pub queue_wait: Histogram,
    /// `slotgate_time_to_first_byte_seconds`.
    pub first_byte: Histogram,
    /// `slotgate_request_duration_seconds`.
    pub duration: Histogram,
    /// `slotgate_requests_total{outcome="completed"}`.
    pub completed: Counter,
    /// `slotgate_requests_total{outcome="upstream_error"}`.
    pub upstream_error: Counter,
    /// `slotgate_requests_total{outcome="client_gone"}`.
    pub client_gone: Counter,
    /// `slotgate_client_disconnects_total{phase="queued"}`.
    pub gone_queued: Counter,
    /// `slotgate_client_disconnects_total{phase="streaming"}`.
    pub gone_streaming: Counter,
}

/// Pre-resolved rejection counters for one model.
#[derive(Debug)]
pub struct RejectionMetrics {
    /// `slotgate_rejections_total{reason="queue_full"}`.
    pub queue_full: Counter,
    /// `slotgate_rejections_total{reason="queue_timeout"}`.
    pub queue_timeout: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty families.
    pub fn new() -> Self {
        Self {
            requests: Family::default(),
            rejections: Family::default(),
            disconnects: Family::default(),
            queue_wait: Family::new_with_constructor(seconds_histogram),
            first_byte: Family::new_with_constructor(seconds_histogram),
            duration: Family::new_with_constructor(seconds_histogram),
        }
    }

    /// The handles for one (upstream, model), created at zero.
    pub fn target(&self, upstream: &str, model: &str) -> TargetMetrics {
        let labels = TargetLabels {
            upstream: upstream.to_owned(),
            model: model.to_owned(),
        };
        let outcome = |outcome| {
            self.requests.get_or_create_owned(&OutcomeLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                outcome,
            })
        };
        let phase = |phase| {
            self.disconnects.get_or_create_owned(&DisconnectLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                phase,
            })
        };
        TargetMetrics {
            queue_wait: self.queue_wait.get_or_create_owned(&labels),
            first_byte: self.first_byte.get_or_create_owned(&labels),
            duration: self.duration.get_or_create_owned(&labels),
            completed: outcome("completed"),
            upstream_error: outcome("upstream_error"),
            client_gone: outcome("client_gone"),
            gone_queued: phase("queued"),
            gone_streaming: phase("streaming"),
        }
    }

    /// The rejection counters of one model, created at zero.
    pub fn rejections(&self, model: &str) -> RejectionMetrics {
        let reason = |reason| {
            self.rejections.get_or_create_owned(&RejectionLabels {
                model: model.to_owned(),
                reason,
            })
        };
        RejectionMetrics {
            queue_full: reason("queue_full"),
            queue_timeout: reason("queue_timeout"),
        }
    }

    /// A registry with every family, plus the limiter gauges read from `routes` at scrape time.
    pub fn registry(&self, routes: Arc<Routes>) -> Registry {
        let mut registry = Registry::with_prefix("slotgate");
        registry.register(
            "requests",
            "Forwarded requests by how they ended",
            self.requests.clone(),
        );
        registry.register(
            "rejections",
            "Requests refused with 503 because no slot was to be had",
            self.rejections.clone(),
        );
        registry.register(
            "client_disconnects",
            "Clients that went away while queued or while their answer streamed",
            self.disconnects.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time from joining a queue to getting a slot",
            self.queue_wait.clone(),
        );
        registry.register(
            "time_to_first_byte_seconds",
            "Time from sending a request upstream to its response head",
            self.first_byte.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from getting a slot to the end of the response",
            self.duration.clone(),
        );
        registry.register_collector(Box::new(LimiterGauges { routes }));
        registry
    }
}

/// Observes a duration in seconds.
pub fn observe(histogram: &Histogram, elapsed: Duration) {
    histogram.observe(elapsed.as_secs_f64());
}

/// Reads every key's state from the limiter at scrape time.
#[derive(Debug)]
struct LimiterGauges {
    routes: Arc<Routes>,
}

/// Picks one gauge's value out of a [`Reading`].
type Pick = fn(&Reading) -> Option<usize>;

/// One key's state, read once per scrape so the four gauges of a key agree.
struct Reading {
    labels: TargetLabels,
    capacity: Option<usize>,
    in_use: usize,
    queued: usize,
    queue_capacity: usize,
}

impl Collector for LimiterGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let readings: Vec<Reading> = self
            .routes
            .routes()
            .flat_map(|route| {
                route.targets.iter().map(|target| Reading {
                    labels: TargetLabels {
                        upstream: target.upstream.clone(),
                        model: route.model.clone(),
                    },
                    capacity: target.parallel,
                    in_use: target.key.in_flight(),
                    queued: target.key.queued(),
                    queue_capacity: target.key.limits().queue,
                })
            })
            .collect();
        let gauges: [(&str, &str, Pick); 4] = [
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
        ];
        for (name, help, pick) in gauges {
            let mut metric = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstGauge::new(0_i64).metric_type(),
            )?;
            for reading in &readings {
                if let Some(value) = pick(reading) {
                    let value = i64::try_from(value).unwrap_or(i64::MAX);
                    ConstGauge::new(value).encode(metric.encode_family(&reading.labels)?)?;
                }
            }
        }
        Ok(())
    }
}
