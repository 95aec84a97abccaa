//! Prometheus metrics, served on the admin listener's `/metrics`: the metric families, and the
//! per-(upstream, model) handles the request path records into.
//!
//! | name | type | labels | meaning |
//! |---|---|---|---|
//! | `slotgate_slots_in_use` | gauge | upstream, model | slots held now: one per sequence, so a request with `n = 3` holds 3 |
//! | `slotgate_slots_capacity` | gauge | upstream, model | `parallel`, or the count read for `parallel = "auto"` (absent for unlimited models, and while an auto count is unknown) |
//! | `slotgate_upstream_slots_in_use` | gauge | upstream | slots held now over all the upstream's models; only for an upstream with an engine-wide `parallel` |
//! | `slotgate_upstream_slots_capacity` | gauge | upstream | the upstream's engine-wide `parallel`; only when set |
//! | `slotgate_queue_depth` | gauge | upstream, model | requests waiting for a slot now |
//! | `slotgate_queue_capacity` | gauge | upstream, model | `queue` |
//! | `slotgate_queue_wait_seconds` | histogram | upstream, model | time from arrival in the queue to the grant (0 when a slot was free) |
//! | `slotgate_handoff_gap_seconds` | histogram | upstream, model | for a request that queued: from the release that handed it the slot (the end of another answer) to the moment it is given to the upstream connection pool, the slot paid for and idle meanwhile |
//! | `slotgate_requests_total` | counter | upstream, model, outcome | forwarded requests by how they ended: `completed`, `upstream_status_error` (the engine answered 5xx), `upstream_error`, `client_gone` |
//! | `slotgate_upstream_responses_total` | counter | upstream, model, class | the engines' response heads by status class: `2xx`, `3xx`, `4xx`, `5xx` |
//! | `slotgate_rejections_total` | counter | model, reason | refused requests by reason (`docs/metrics.md` lists them); `model` is empty when the request named no configured model |
//! | `slotgate_retries_total` | counter | upstream, model, status | engine answers of 502, 503 or 504 that were not passed through: the request went on to the next-ranked upstream (`engine_error_retries`); `upstream` is the one that answered `status` |
//! | `slotgate_client_disconnects_total` | counter | upstream, model, phase | clients that left while `queued`, while `awaiting_response` (forwarded, no response head yet) or while `streaming` |
//! | `slotgate_time_to_response_head_seconds` | histogram | upstream, model | from sending upstream to its response head |
//! | `slotgate_time_to_first_token_seconds` | histogram | upstream, model | from sending upstream to the first body frame that carries data (for SSE, the first `data:` line) |
//! | `slotgate_request_duration_seconds` | histogram | upstream, model | from joining the queue to the end of the response: the queue wait included |
//! | `slotgate_tokens_total` | counter | upstream, model, kind | tokens the engines reported in `usage`: `prompt`, `completion`, `cached_prompt` (prompt tokens taken from the engine's cache) |
//! | `slotgate_affinity_total` | counter | upstream, model, result | requests placed by cache-aware routing and sent here: `hit`, `miss`, `overridden` |
//! | `slotgate_build_info` | info | version, os, arch | 1, labelled with this build |
//! | `slotgate_upstream_healthy` | gauge | upstream | 1 while the upstream passes its health checks (or has not been checked yet), 0 while ejected |
//! | `slotgate_upstream_draining` | gauge | upstream | 1 while an operator drains the upstream |
//! | `slotgate_model_loaded` | gauge | upstream, model | 1 when the last residency discovery listed the configured model as resident |
//! | `slotgate_engine_busy` | gauge | upstream, model | requests the engine itself reports running, at the last check ([`reconcile`](crate::upstreams::reconcile)); absent when it does not tell |
//! | `slotgate_engine_waiting` | gauge | upstream, model | requests queued inside the engine, at the last check; absent when it does not tell |
//! | `slotgate_bounds_total` | counter | bound | a bound the gateway enforced on a slow or broken peer: `header_timeout` (a connection that sent no request head in time), `client_idle` (a connection closed for having no request in flight for `client_idle_timeout`), `body_timeout` (408), `body_budget` (503 `overloaded`), `stream_idle` (an upstream answer that stalled), `upstream_cut` (an upstream answer that failed mid-way) |
//! | `slotgate_config_reloads_total` | counter | result | configuration reloads: `applied`, `refused` |
//! | `slotgate_config_generation` | gauge | — | the configuration in force: 1 at start, +1 per applied reload |
//! | `slotgate_store_round_trip_seconds` | histogram | — | `[cluster]`: calls to the shared slot store that succeeded |
//! | `slotgate_store_up` | gauge | — | `[cluster]`: 1 while admission goes through the shared store, 0 while it is down or rejoining |
//! | `slotgate_store_errors_total` | counter | — | `[cluster]`: calls to the store that failed or timed out |
//! | `slotgate_store_down_total` | counter | — | `[cluster]`: times this replica marked the store down |
//! | `slotgate_lease_renewals_total` | counter | — | `[cluster]`: leases renewed (one per lease per renewal round) |
//! | `slotgate_leases_lost_total` | counter | — | `[cluster]`: leases of this replica the store had lost, put back at renewal |
//! | `slotgate_leases_expired_total` | counter | — | `[cluster]`: leases (of any replica) this replica's calls found expired and removed |
//! | `slotgate_cluster_slots_in_use` | gauge | upstream, model | `[cluster]`: slots held across every replica (as last seen) |
//! | `slotgate_cluster_queue_depth` | gauge | upstream, model | `[cluster]`: requests waiting across every replica (as last seen) |
//!
//! `docs/metrics.md` is the operator's version of this table.
//!
//! The gauges are read from the limiter and the upstream states at scrape time (the collector of
//! [`ops::scrape`](crate::ops::scrape), over the configuration in force), so they are never stale
//! and follow reloads. This module holds the counters and histograms, which sit below everything
//! that records into them: they are resolved per (upstream, model) once, when the routing table is
//! built: the request path increments pre-resolved handles and never hashes labels.
//!
//! The queue-wait and response-head timings are also counted into [`recent`] bucket counts, which
//! the gateway can read back for its status page. The process metrics (`process_*`, without the
//! prefix) are read from `/proc` at scrape time ([`process`]).

pub(crate) mod process;
pub(crate) mod recent;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::metrics::recent::Recent;

/// The labels of a per-(upstream, model) series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TargetLabels {
    /// The upstream's name.
    pub(crate) upstream: String,
    /// The configured model name.
    pub(crate) model: String,
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
struct ClassLabels {
    upstream: String,
    model: String,
    class: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    upstream: String,
    model: String,
    kind: &'static str,
}

/// The results of `slotgate_affinity_total`, in [`TargetMetrics::affinity`] order.
const AFFINITY_RESULTS: [&str; 3] = ["hit", "miss", "overridden"];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AffinityLabels {
    upstream: String,
    model: String,
    result: &'static str,
}

/// The status classes of `slotgate_upstream_responses_total`, in [`TargetMetrics::responses`]
/// order.
const CLASSES: [&str; 4] = ["2xx", "3xx", "4xx", "5xx"];

/// The outcomes of `slotgate_requests_total`.
const OUTCOMES: [&str; 4] = [
    "completed",
    "upstream_status_error",
    "upstream_error",
    "client_gone",
];

/// The reasons of `slotgate_rejections_total` for a configured model that appear only at their
/// first refusal (the request path counts them through [`Metrics::refused`]).
pub(crate) const RARE_MODEL_REASONS: [&str; 3] =
    ["too_heavy", "route_not_served", "route_disabled"];

/// The reasons of `slotgate_rejections_total` that every model has from the start (at 0), so an
/// alert on them needs no `absent()`; the rarer ones appear at their first refusal.
const MODEL_REASONS: [&str; 5] = [
    "queue_full",
    "queue_timeout",
    "store_unavailable",
    "upstream_unavailable",
    "model_unavailable",
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RetryLabels {
    upstream: String,
    model: String,
    status: &'static str,
}

/// The engine statuses that are retried on the next host, with their `status` label.
const RETRIED: [(http::StatusCode, &str); 3] = [
    (http::StatusCode::BAD_GATEWAY, "502"),
    (http::StatusCode::SERVICE_UNAVAILABLE, "503"),
    (http::StatusCode::GATEWAY_TIMEOUT, "504"),
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DisconnectLabels {
    upstream: String,
    model: String,
    phase: &'static str,
}

type HistogramFamily = Family<TargetLabels, Histogram, fn() -> Histogram>;

/// The readable bucket counts, by (upstream, model) and timing: shared by every generation's
/// handles of one key, like the Prometheus series, so a reload does not reset them.
type RecentMap = Arc<Mutex<HashMap<(TargetLabels, &'static str), Arc<Recent>>>>;

/// A timing recorded both into its Prometheus histogram and into bucket counts the gateway can
/// read ([`recent`]).
#[derive(Debug)]
pub(crate) struct Timing {
    histogram: Histogram,
    /// The same observations, readable.
    pub(crate) recent: Arc<Recent>,
}

impl Timing {
    /// Records one duration.
    pub(crate) fn observe(&self, elapsed: Duration) {
        observe(&self.histogram, elapsed);
        self.recent.record(elapsed);
    }
}

/// Waits and durations: 5 ms to ~11 min (655.36 s) in ×2 steps.
fn seconds_histogram() -> Histogram {
    Histogram::new(recent::BOUNDS)
}

/// Handoff gaps: 10 µs to ~0.33 s in ×2 steps; a gap is the gateway's own work between two
/// requests, far below the request timings' 5 ms floor.
fn gap_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_01, 2.0, 16))
}

/// The gateway's metric families.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    requests: Family<OutcomeLabels, Counter>,
    responses: Family<ClassLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    affinity: Family<AffinityLabels, Counter>,
    rejections: Family<RejectionLabels, Counter>,
    disconnects: Family<DisconnectLabels, Counter>,
    retries: Family<RetryLabels, Counter>,
    queue_wait: HistogramFamily,
    handoff_gap: HistogramFamily,
    response_head: HistogramFamily,
    first_token: HistogramFamily,
    duration: HistogramFamily,
    reloads: Family<ReloadLabels, Counter>,
    bounds: Family<BoundLabels, Counter>,
    recent: RecentMap,
    /// Every call to the shared slot store (`[cluster]`).
    store_round_trip: Histogram,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabels {
    bound: &'static str,
}

/// A bound the gateway enforces on a slow, hostile or broken peer: the `bound` label of
/// `slotgate_bounds_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Bound {
    /// A connection sent no complete request head (or, on HTTP/2, began no request) within
    /// `header_read_timeout`.
    HeaderTimeout,
    /// A connection had no request in flight for `client_idle_timeout`.
    ClientIdle,
    /// A request body was not complete within `body_read_timeout` (408).
    BodyTimeout,
    /// The buffered request-body budget was spent (503 `overloaded`).
    BodyBudget,
    /// An upstream answer sent nothing for `stream_idle_timeout`.
    StreamIdle,
    /// An upstream answer failed mid-way (the engine's connection broke).
    UpstreamCut,
    /// An upstream answer ran past its `stream_timeout`.
    StreamTimeout,
    /// A client left a piece of its answer unread for `client_write_timeout`.
    ClientStall,
    /// An idle connection was closed to admit a new one at the connection limit.
    IdleShed,
}

impl Bound {
    const ALL: [Bound; 9] = [
        Bound::HeaderTimeout,
        Bound::ClientIdle,
        Bound::BodyTimeout,
        Bound::BodyBudget,
        Bound::StreamIdle,
        Bound::UpstreamCut,
        Bound::StreamTimeout,
        Bound::ClientStall,
        Bound::IdleShed,
    ];

    fn label(self) -> &'static str {
        match self {
            Bound::HeaderTimeout => "header_timeout",
            Bound::ClientIdle => "client_idle",
            Bound::BodyTimeout => "body_timeout",
            Bound::BodyBudget => "body_budget",
            Bound::StreamIdle => "stream_idle",
            Bound::UpstreamCut => "upstream_cut",
            Bound::StreamTimeout => "stream_timeout",
            Bound::ClientStall => "client_stall",
            Bound::IdleShed => "idle_shed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: &'static str,
}

/// Pre-resolved handles for one (upstream, model).
#[derive(Debug)]
pub(crate) struct TargetMetrics {
    /// `slotgate_queue_wait_seconds`.
    pub(crate) queue_wait: Timing,
    /// `slotgate_handoff_gap_seconds`.
    pub(crate) handoff_gap: Histogram,
    /// `slotgate_time_to_response_head_seconds`.
    pub(crate) response_head: Timing,
    /// `slotgate_time_to_first_token_seconds`.
    pub(crate) first_token: Histogram,
    /// `slotgate_request_duration_seconds`.
    pub(crate) duration: Histogram,
    /// `slotgate_upstream_responses_total`, by class in [`CLASSES`] order.
    responses: [Counter; 4],
    /// `slotgate_tokens_total{kind="prompt"}`.
    pub(crate) prompt_tokens: Counter,
    /// `slotgate_tokens_total{kind="completion"}`.
    pub(crate) completion_tokens: Counter,
    /// `slotgate_tokens_total{kind="cached_prompt"}`: prompt tokens the engine reported it
    /// took from its cache.
    pub(crate) cached_prompt_tokens: Counter,
    /// `slotgate_affinity_total`, by result in [`AFFINITY_RESULTS`] order.
    affinity: [Counter; 3],
    /// `slotgate_requests_total{outcome="completed"}`.
    pub(crate) completed: Counter,
    /// `slotgate_requests_total{outcome="upstream_status_error"}`: the engine answered 5xx.
    pub(crate) upstream_status_error: Counter,
    /// `slotgate_requests_total{outcome="upstream_error"}`.
    pub(crate) upstream_error: Counter,
    /// `slotgate_requests_total{outcome="client_gone"}`.
    pub(crate) client_gone: Counter,
    /// `slotgate_client_disconnects_total{phase="queued"}`.
    pub(crate) gone_queued: Counter,
    /// `slotgate_client_disconnects_total{phase="awaiting_response"}`: forwarded, no response
    /// head yet.
    pub(crate) gone_awaiting: Counter,
    /// `slotgate_client_disconnects_total{phase="streaming"}`.
    pub(crate) gone_streaming: Counter,
    /// `slotgate_retries_total`, one counter per retried status (in [`RETRIED`]'s order).
    retries: [Counter; 3],
}

impl TargetMetrics {
    /// Counts how cache-aware routing placed a request sent here.
    pub(crate) fn affinity(&self, verdict: slotgate_choose::Verdict) {
        let at = AFFINITY_RESULTS
            .iter()
            .position(|&result| result == verdict.as_str());
        if let Some(at) = at {
            self.affinity[at].inc();
        }
    }

    /// Counts an engine answer of `status` that the request did not pass through but retried
    /// on the next host; only 502, 503 and 504 are retried, and counted.
    pub(crate) fn retried(&self, status: http::StatusCode) {
        let counter = RETRIED
            .iter()
            .zip(&self.retries)
            .find(|((retried, _), _)| *retried == status);
        if let Some((_, counter)) = counter {
            counter.inc();
        }
    }

    /// Counts an engine's response head with `status` in `slotgate_upstream_responses_total`
    /// (a status past 599 counts as `5xx`: an engine that broke HTTP).
    pub(crate) fn response(&self, status: http::StatusCode) {
        let class = match status.as_u16() / 100 {
            0..=2 => 0,
            3 => 1,
            4 => 2,
            _ => 3,
        };
        self.responses[class].inc();
    }
}

/// Pre-resolved rejection counters for one model.
#[derive(Debug)]
pub(crate) struct RejectionMetrics {
    /// `slotgate_rejections_total{reason="queue_full"}`.
    pub(crate) queue_full: Counter,
    /// `slotgate_rejections_total{reason="queue_timeout"}`.
    pub(crate) queue_timeout: Counter,
    /// `slotgate_rejections_total{reason="store_unavailable"}` (`[cluster]`, fail-closed).
    pub(crate) store_unavailable: Counter,
    /// `slotgate_rejections_total{reason="upstream_unavailable"}`: every upstream that could
    /// take the request refused the connection.
    pub(crate) upstream_unavailable: Counter,
    /// `slotgate_rejections_total{reason="model_unavailable"}`: no upstream of the model could
    /// take requests (unhealthy, draining, an unknown `auto` slot count, removed by a reload).
    pub(crate) model_unavailable: Counter,
}

impl RejectionMetrics {
    /// Counts one refusal for `reason` if it is one of the pre-resolved ones; `false` when it
    /// is not (the caller counts it by its labels, [`Metrics::refused`]).
    pub(crate) fn count(&self, reason: &str) -> bool {
        let counter = match reason {
            "queue_full" => &self.queue_full,
            "queue_timeout" => &self.queue_timeout,
            "store_unavailable" => &self.store_unavailable,
            "upstream_unavailable" => &self.upstream_unavailable,
            "model_unavailable" => &self.model_unavailable,
            _ => return false,
        };
        counter.inc();
        true
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Empty families.
    pub(crate) fn new() -> Self {
        Self {
            requests: Family::default(),
            rejections: Family::default(),
            disconnects: Family::default(),
            responses: Family::default(),
            tokens: Family::default(),
            affinity: Family::default(),
            retries: Family::default(),
            queue_wait: Family::new_with_constructor(seconds_histogram),
            handoff_gap: Family::new_with_constructor(gap_histogram),
            response_head: Family::new_with_constructor(seconds_histogram),
            first_token: Family::new_with_constructor(seconds_histogram),
            duration: Family::new_with_constructor(seconds_histogram),
            reloads: Family::default(),
            bounds: Family::default(),
            recent: RecentMap::default(),
            // 100 µs to ~3.3 s in ×2 steps: a store call is bounded by `store_timeout`.
            store_round_trip: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
        }
    }

    /// The histogram of the shared slot store's round trips, for the store to observe into.
    pub(crate) fn store_round_trip(&self) -> Histogram {
        self.store_round_trip.clone()
    }

    /// The counter of one [`Bound`], for the code that enforces it to keep.
    pub(crate) fn bound(&self, bound: Bound) -> Counter {
        self.bounds.get_or_create_owned(&BoundLabels {
            bound: bound.label(),
        })
    }

    /// Counts a configuration reload, `applied` or `refused`.
    pub(crate) fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }

    /// The handles for one (upstream, model), created at zero.
    pub(crate) fn target(&self, upstream: &str, model: &str) -> TargetMetrics {
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
        let recent = |timing| {
            Arc::clone(
                self.recent
                    .lock()
                    .entry((labels.clone(), timing))
                    .or_default(),
            )
        };
        let class = |class| {
            self.responses.get_or_create_owned(&ClassLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                class,
            })
        };
        let tokens = |kind| {
            self.tokens.get_or_create_owned(&TokenLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                kind,
            })
        };
        TargetMetrics {
            queue_wait: Timing {
                histogram: self.queue_wait.get_or_create_owned(&labels),
                recent: recent("queue_wait"),
            },
            handoff_gap: self.handoff_gap.get_or_create_owned(&labels),
            response_head: Timing {
                histogram: self.response_head.get_or_create_owned(&labels),
                recent: recent("response_head"),
            },
            first_token: self.first_token.get_or_create_owned(&labels),
            duration: self.duration.get_or_create_owned(&labels),
            responses: CLASSES.map(class),
            prompt_tokens: tokens("prompt"),
            completion_tokens: tokens("completion"),
            cached_prompt_tokens: tokens("cached_prompt"),
            affinity: AFFINITY_RESULTS.map(|result| {
                self.affinity.get_or_create_owned(&AffinityLabels {
                    upstream: upstream.to_owned(),
                    model: model.to_owned(),
                    result,
                })
            }),
            completed: outcome("completed"),
            upstream_status_error: outcome("upstream_status_error"),
            upstream_error: outcome("upstream_error"),
            client_gone: outcome("client_gone"),
            gone_queued: phase("queued"),
            gone_awaiting: phase("awaiting_response"),
            gone_streaming: phase("streaming"),
            retries: RETRIED.map(|(_, status)| {
                self.retries.get_or_create_owned(&RetryLabels {
                    upstream: upstream.to_owned(),
                    model: model.to_owned(),
                    status,
                })
            }),
        }
    }

    /// The rejection counters of one model, created at zero.
    pub(crate) fn rejections(&self, model: &str) -> RejectionMetrics {
        let reason = |reason| {
            self.rejections.get_or_create_owned(&RejectionLabels {
                model: model.to_owned(),
                reason,
            })
        };
        RejectionMetrics {
            queue_full: reason("queue_full"),
            queue_timeout: reason("queue_timeout"),
            store_unavailable: reason("store_unavailable"),
            upstream_unavailable: reason("upstream_unavailable"),
            model_unavailable: reason("model_unavailable"),
        }
    }

    /// Counts a refusal that has no pre-resolved counter: `model` is the configured model it
    /// was for, empty when the request named none (or an unknown one: a client's name never
    /// becomes a label). Refusals are the slow path; this hashes its labels.
    pub(crate) fn refused(&self, model: &str, reason: &'static str) {
        self.rejections
            .get_or_create(&RejectionLabels {
                model: model.to_owned(),
                reason,
            })
            .inc();
    }

    /// Drops the series of one (upstream, model) that a reload removed, so scrapes stop
    /// reporting it.
    pub(crate) fn forget_target(&self, upstream: &str, model: &str) {
        let labels = TargetLabels {
            upstream: upstream.to_owned(),
            model: model.to_owned(),
        };
        self.queue_wait.remove(&labels);
        self.handoff_gap.remove(&labels);
        self.response_head.remove(&labels);
        self.first_token.remove(&labels);
        self.recent
            .lock()
            .retain(|(key, _timing), _recent| *key != labels);
        self.duration.remove(&labels);
        for class in CLASSES {
            self.responses.remove(&ClassLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                class,
            });
        }
        for result in AFFINITY_RESULTS {
            self.affinity.remove(&AffinityLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                result,
            });
        }
        for kind in ["prompt", "completion", "cached_prompt"] {
            self.tokens.remove(&TokenLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                kind,
            });
        }
        for outcome in OUTCOMES {
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
        for (_, status) in RETRIED {
            self.retries.remove(&RetryLabels {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                status,
            });
        }
    }

    /// Drops the rejection series of a model that a reload removed from every upstream.
    pub(crate) fn forget_model(&self, model: &str) {
        for reason in MODEL_REASONS.iter().chain(&RARE_MODEL_REASONS) {
            self.rejections.remove(&RejectionLabels {
                model: model.to_owned(),
                reason,
            });
        }
    }

    /// Registers every family in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "requests",
            "Forwarded requests by how they ended",
            self.requests.clone(),
        );
        registry.register(
            "upstream_responses",
            "The engines' response heads by status class",
            self.responses.clone(),
        );
        registry.register(
            "tokens",
            "Tokens the engines reported in usage, by kind (prompt, completion, cached_prompt)",
            self.tokens.clone(),
        );
        registry.register(
            "affinity",
            "Requests placed by cache-aware routing, by result: hit (sent where its prompt \
             prefix is held), miss (no useful match: placed by free slots), overridden (the \
             holder was too busy)",
            self.affinity.clone(),
        );
        registry.register(
            "rejections",
            "Refused requests by reason",
            self.rejections.clone(),
        );
        registry.register(
            "client_disconnects",
            "Clients that went away while queued, before their answer began, or while it streamed",
            self.disconnects.clone(),
        );
        registry.register(
            "retries",
            "Engine answers of 502, 503 or 504 retried on the next-ranked upstream, by the \
             upstream that answered",
            self.retries.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time from joining a queue to getting a slot",
            self.queue_wait.clone(),
        );
        registry.register(
            "handoff_gap_seconds",
            "For a request that queued: time from the release that handed it its slot to \
             handing the request to the upstream connection pool (the slot idle meanwhile)",
            self.handoff_gap.clone(),
        );
        registry.register(
            "time_to_response_head_seconds",
            "Time from sending a request upstream to its response head",
            self.response_head.clone(),
        );
        registry.register(
            "time_to_first_token_seconds",
            "Time from sending a request upstream to the first body frame carrying data \
             (for SSE, the first data: line)",
            self.first_token.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Time from joining the queue to the end of the response (queue wait included)",
            self.duration.clone(),
        );
        registry.register(
            "build",
            "This build of slotgate",
            Info::new(vec![
                ("version", env!("CARGO_PKG_VERSION")),
                ("os", std::env::consts::OS),
                ("arch", std::env::consts::ARCH),
            ]),
        );
        // Both results exist from the start, so an alert on `refused` needs no `absent()`.
        for result in ["applied", "refused"] {
            let _ = self.reloads.get_or_create_owned(&ReloadLabels { result });
        }
        // Every bound exists from the start, so a rate() over it needs no `absent()`.
        for bound in Bound::ALL {
            let _ = self.bound(bound);
        }
        registry.register(
            "bounds",
            "Bounds enforced on slow, hostile or broken clients and upstreams, by bound",
            self.bounds.clone(),
        );
        registry.register(
            "store_round_trip_seconds",
            "Calls to the shared slot store of [cluster] (Redis) that succeeded, by duration",
            self.store_round_trip.clone(),
        );
        registry.register(
            "config_reloads",
            "Configuration reloads (SIGHUP, POST /admin/reload) by result",
            self.reloads.clone(),
        );
    }
}

/// Observes a duration in seconds.
pub(crate) fn observe(histogram: &Histogram, elapsed: Duration) {
    histogram.observe(elapsed.as_secs_f64());
}
