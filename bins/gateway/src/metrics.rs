//! Prometheus metrics, served on the admin listener's `/metrics`.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `slotgate_slots_in_use` | gauge | upstream, model | permits held now |
//! | `slotgate_slots_capacity` | gauge | upstream, model | `parallel`, or the count read for `parallel = "auto"` (absent for unlimited models, and while an auto count is unknown) |
//! | `slotgate_queue_depth` | gauge | upstream, model | requests waiting for a slot now |
//! | `slotgate_queue_capacity` | gauge | upstream, model | `queue` |
//! | `slotgate_queue_wait_seconds` | histogram | upstream, model | time from arrival in the queue to the grant (0 when a slot was free) |
//! | `slotgate_requests_total` | counter | upstream, model, outcome | forwarded requests by how they ended: `completed`, `upstream_error`, `client_gone` |
//! | `slotgate_rejections_total` | counter | model, reason | requests refused with 503: `queue_full`, `queue_timeout` |
//! | `slotgate_client_disconnects_total` | counter | upstream, model, phase | clients that left while `queued`, while `awaiting_response` (forwarded, no response head yet) or while `streaming` |
//! | `slotgate_time_to_first_byte_seconds` | histogram | upstream, model | from sending upstream to its response head |
//! | `slotgate_request_duration_seconds` | histogram | upstream, model | from the slot grant to the end of the response |
//! | `slotgate_upstream_healthy` | gauge | upstream | 1 while the upstream passes its health checks (or has not been checked yet), 0 while ejected |
//! | `slotgate_upstream_draining` | gauge | upstream | 1 while an operator drains the upstream |
//! | `slotgate_model_loaded` | gauge | upstream, model | 1 when the last residency discovery listed the configured model as resident |
//! | `slotgate_engine_busy` | gauge | upstream, model | requests the engine itself reports running, at the last check ([`reconcile`](crate::reconcile)); absent when it does not tell |
//! | `slotgate_engine_waiting` | gauge | upstream, model | requests queued inside the engine, at the last check; absent when it does not tell |
//! | `slotgate_config_reloads_total` | counter | result | configuration reloads: `applied`, `refused` |
//! | `slotgate_config_generation` | gauge | — | the configuration in force: 1 at start, +1 per applied reload |
//!
//! `docs/metrics.md` is the operator's version of this table.
//!
//! The gauges are read from the limiter and the upstream states at scrape time (a
//! [`Collector`] over the configuration in force), so they are never stale and follow reloads.
//! Counters and histograms are resolved per (upstream, model) once, when the routing table is
//! built: the request path increments pre-resolved handles and never hashes labels.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::live::{Generation, Live};
use crate::upstream::UpstreamState;

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

/// Waits and durations: 5 ms to ~11 min (655.36 s) in ×2 steps.
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
    reloads: Family<ReloadLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
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
    /// `slotgate_client_disconnects_total{phase="awaiting_response"}`: forwarded, no response
    /// head yet.
    pub gone_awaiting: Counter,
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
            reloads: Family::default(),
        }
    }

    /// Counts a configuration reload, `applied` or `refused`.
    pub fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
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
            gone_awaiting: phase("awaiting_response"),
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

    /// Drops the series of one (upstream, model) that a reload removed, so scrapes stop
    /// reporting it.
    pub fn forget_target(&self, upstream: &str, model: &str) {
        let labels = TargetLabels {
            upstream: upstream.to_owned(),
            model: model.to_owned(),
        };
        self.queue_wait.remove(&labels);
        self.first_byte.remove(&labels);
        self.duration.remove(&labels);
        for outcome in ["completed", "upstream_error", "client_gone"] {
            self.requests.remove(&OutcomeLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                outcome,
            });
        }
        for phase in ["queued", "awaiting_response", "streaming"] {
            self.disconnects.remove(&DisconnectLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                phase,
            });
        }
    }

    /// Drops the rejection series of a model that a reload removed from every upstream.
    pub fn forget_model(&self, model: &str) {
        for reason in ["queue_full", "queue_timeout"] {
            self.rejections.remove(&RejectionLabels {
                model: model.to_owned(),
                reason,
            });
        }
    }

    /// A registry with every family, plus the gauges read from the configuration in force at
    /// scrape time.
    pub fn registry(&self, live: Arc<Live>) -> Registry {
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
            "Clients that went away while queued, before their answer began, or while it streamed",
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
        // Both results exist from the start, so an alert on `refused` needs no `absent()`.
        for result in ["applied", "refused"] {
            let _ = self.reloads.get_or_create_owned(&ReloadLabels { result });
        }
        registry.register(
            "config_reloads",
            "Configuration reloads (SIGHUP, POST /admin/reload) by result",
            self.reloads.clone(),
        );
        registry.register_collector(Box::new(LiveGauges { live }));
        registry
    }
}

/// Observes a duration in seconds.
pub fn observe(histogram: &Histogram, elapsed: Duration) {
    histogram.observe(elapsed.as_secs_f64());
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

/// Picks one gauge's value out of a [`Reading`].
type Pick = fn(&Reading) -> Option<usize>;

/// Picks one per-upstream gauge's value.
type UpstreamPick = fn(&UpstreamState) -> bool;

/// One key's state, read once per scrape so the four gauges of a key agree.
struct Reading {
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
fn readings(generation: &Generation) -> Vec<Reading> {
    generation
        .routes
        .routes()
        .flat_map(|route| {
            route.targets.iter().map(|target| {
                let engine = target.engine.view().reading;
                Reading {
                    engine_busy: engine.map(|e| e.busy),
                    engine_waiting: engine.and_then(|e| e.waiting),
                    labels: TargetLabels {
                        upstream: target.upstream.name.clone(),
                        model: route.model.clone(),
                    },
                    loaded: target.is_loaded(&route.model),
                    // Discovered for `parallel = "auto"` (absent while unknown).
                    capacity: target.slots(),
                    in_use: target.key.in_flight(),
                    queued: target.key.queued(),
                    queue_capacity: target.key.limits().queue,
                }
            })
        })
        .collect()
}

impl Collector for LiveGauges {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let generation = self.live.current();
        let readings = readings(&generation);
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
            for reading in &readings {
                if let Some(value) = pick(reading) {
                    let value = i64::try_from(value).unwrap_or(i64::MAX);
                    ConstGauge::new(value).encode(metric.encode_family(&reading.labels)?)?;
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
