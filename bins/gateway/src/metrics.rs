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
//! | `slotgate_bounds_total` | counter | bound | a bound the gateway enforced on a slow or broken peer: `header_timeout` (a connection that sent no request head in time; not one its client closed first), `client_idle` (a connection closed for having no request in flight for `client_idle_timeout`), `body_timeout` (408), `body_budget` (503 `overloaded`), `stream_idle` (an upstream answer that stalled), `upstream_cut` (an upstream answer that failed mid-way) |
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

mod family;
pub(crate) mod process;
pub(crate) mod recent;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::metrics::family::{
    BuildInfo, Counters, Declared, ModelCounters, Single, TargetCounters, TargetHistograms,
};
use crate::metrics::recent::Recent;

/// The labels of a per-(upstream, model) series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct TargetLabels {
    /// The upstream's name.
    pub(crate) upstream: String,
    /// The configured model name.
    pub(crate) model: String,
}

/// Declares the gateway's metric families, one field each: its type, and the declaration that
/// names it (name, help, labels and their values, buckets; see [`family`]). It generates the
/// struct [`Families`], its constructor, its registration (in the order of the list, which is the
/// exposition's) and the forgetting of a removed (upstream, model) or model.
macro_rules! families {
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $declare:expr;)*) => {
        /// Every metric family the gateway records into (the gauges read at scrape time aside).
        #[derive(Debug, Clone)]
        struct Families {
            $($(#[$doc])* $field: $ty,)*
        }

        impl Families {
            fn declare() -> Self {
                Self { $($field: $declare,)* }
            }

            fn register(&self, registry: &mut Registry) {
                $(Declared::register(&self.$field, registry);)*
            }

            fn forget_target(&self, target: &TargetLabels) {
                $(Declared::forget_target(&self.$field, target);)*
            }

            fn forget_model(&self, model: &str) {
                $(Declared::forget_model(&self.$field, model);)*
            }
        }
    };
}

families! {
    /// `slotgate_requests_total`: outcomes in [`TargetMetrics`] field order.
    requests: TargetCounters<4> = TargetCounters::declare(
        "requests",
        "Forwarded requests by how they ended",
        "outcome",
        ["completed", "upstream_status_error", "upstream_error", "client_gone"],
    );
    /// `slotgate_upstream_responses_total`: classes in [`TargetMetrics::response`] order.
    responses: TargetCounters<4> = TargetCounters::declare(
        "upstream_responses",
        "The engines' response heads by status class",
        "class",
        ["2xx", "3xx", "4xx", "5xx"],
    );
    /// `slotgate_tokens_total`.
    tokens: TargetCounters<3> = TargetCounters::declare(
        "tokens",
        "Tokens the engines reported in usage, by kind (prompt, completion, cached_prompt)",
        "kind",
        ["prompt", "completion", "cached_prompt"],
    );
    /// `slotgate_affinity_total`: results named as [`slotgate_choose::Verdict::as_str`] does.
    affinity: TargetCounters<3> = TargetCounters::declare(
        "affinity",
        "Requests placed by cache-aware routing, by result: hit (sent where its prompt \
         prefix is held), miss (no useful match: placed by free slots), overridden (the \
         holder was too busy)",
        "result",
        ["hit", "miss", "overridden"],
    );
    /// `slotgate_rejections_total`: the reasons every model has from the start (at 0, so an
    /// alert on them needs no `absent()`), then the rarer ones, which appear at their first
    /// refusal ([`Metrics::refused`]).
    rejections: ModelCounters<5> = ModelCounters::declare(
        "rejections",
        "Refused requests by reason",
        "reason",
        [
            "queue_full",
            "queue_timeout",
            "store_unavailable",
            "upstream_unavailable",
            "model_unavailable",
        ],
        &RARE_MODEL_REASONS,
    );
    /// `slotgate_client_disconnects_total`.
    disconnects: TargetCounters<3> = TargetCounters::declare(
        "client_disconnects",
        "Clients that went away while queued, before their answer began, or while it streamed",
        "phase",
        ["queued", "awaiting_response", "streaming"],
    );
    /// `slotgate_retries_total`: statuses in [`RETRIED`] order.
    retries: TargetCounters<3> = TargetCounters::declare(
        "retries",
        "Engine answers of 502, 503 or 504 retried on the next-ranked upstream, by the \
         upstream that answered",
        "status",
        RETRIED.map(|(_, status)| status),
    );
    /// `slotgate_queue_wait_seconds`.
    queue_wait: TargetHistograms = TargetHistograms::declare(
        "queue_wait_seconds",
        "Time from joining a queue to getting a slot",
        seconds_histogram,
    );
    /// `slotgate_handoff_gap_seconds`.
    handoff_gap: TargetHistograms = TargetHistograms::declare(
        "handoff_gap_seconds",
        "For a request that queued: time from the release that handed it its slot to \
         handing the request to the upstream connection pool (the slot idle meanwhile)",
        gap_histogram,
    );
    /// `slotgate_time_to_response_head_seconds`.
    response_head: TargetHistograms = TargetHistograms::declare(
        "time_to_response_head_seconds",
        "Time from sending a request upstream to its response head",
        seconds_histogram,
    );
    /// `slotgate_time_to_first_token_seconds`.
    first_token: TargetHistograms = TargetHistograms::declare(
        "time_to_first_token_seconds",
        "Time from sending a request upstream to the first body frame carrying data \
         (for SSE, the first data: line)",
        seconds_histogram,
    );
    /// `slotgate_request_duration_seconds`.
    duration: TargetHistograms = TargetHistograms::declare(
        "request_duration_seconds",
        "Time from joining the queue to the end of the response (queue wait included)",
        seconds_histogram,
    );
    /// `slotgate_build_info`.
    build: BuildInfo = BuildInfo;
    /// `slotgate_bounds_total`: the labels of [`Bound::ALL`], in its order.
    bounds: Counters<9> = Counters::declare(
        "bounds",
        "Bounds enforced on slow, hostile or broken clients and upstreams, by bound",
        "bound",
        Bound::ALL.map(Bound::label),
    );
    /// `slotgate_store_round_trip_seconds` (`[cluster]`): 100 µs to ~3.3 s in ×2 steps, a store
    /// call being bounded by `store_timeout`.
    store_round_trip: Single = Single::declare(
        "store_round_trip_seconds",
        "Calls to the shared slot store of [cluster] (Redis) that succeeded, by duration",
        Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
    );
    /// `slotgate_config_reloads_total`.
    reloads: Counters<2> = Counters::declare(
        "config_reloads",
        "Configuration reloads (SIGHUP, POST /admin/reload) by result",
        "result",
        ["applied", "refused"],
    );
}

/// The reasons of `slotgate_rejections_total` for a configured model that appear only at their
/// first refusal (the request path counts them through [`Metrics::refused`]).
pub(crate) const RARE_MODEL_REASONS: [&str; 3] =
    ["too_heavy", "route_not_served", "route_disabled"];

/// The engine statuses that are retried on the next host, with their `status` label.
const RETRIED: [(http::StatusCode, &str); 3] = [
    (http::StatusCode::BAD_GATEWAY, "502"),
    (http::StatusCode::SERVICE_UNAVAILABLE, "503"),
    (http::StatusCode::GATEWAY_TIMEOUT, "504"),
];

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

/// The gateway's metric families, and the readable bucket counts beside two of them.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    families: Families,
    recent: RecentMap,
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
    /// `slotgate_upstream_responses_total`, by class in the family's order.
    responses: [Counter; 4],
    /// `slotgate_tokens_total{kind="prompt"}`.
    pub(crate) prompt_tokens: Counter,
    /// `slotgate_tokens_total{kind="completion"}`.
    pub(crate) completion_tokens: Counter,
    /// `slotgate_tokens_total{kind="cached_prompt"}`: prompt tokens the engine reported it
    /// took from its cache.
    pub(crate) cached_prompt_tokens: Counter,
    /// `slotgate_affinity_total`, by result in the family's order (`hit`, `miss`, `overridden`).
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
        let at = match verdict {
            slotgate_choose::Verdict::Hit => 0,
            slotgate_choose::Verdict::Miss => 1,
            slotgate_choose::Verdict::Overridden => 2,
        };
        self.affinity[at].inc();
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
    /// Every family, declared; the per-(upstream, model) and per-model series are created when
    /// a routing table resolves them.
    pub(crate) fn new() -> Self {
        Self {
            families: Families::declare(),
            recent: RecentMap::default(),
        }
    }

    /// The histogram of the shared slot store's round trips, for the store to observe into.
    pub(crate) fn store_round_trip(&self) -> Histogram {
        self.families.store_round_trip.histogram.clone()
    }

    /// The counter of one [`Bound`], for the code that enforces it to keep.
    pub(crate) fn bound(&self, bound: Bound) -> Counter {
        self.families.bounds.counter(bound.label())
    }

    /// Counts a configuration reload, `applied` or `refused`.
    pub(crate) fn reload(&self, applied: bool) {
        let result = if applied { "applied" } else { "refused" };
        self.families.reloads.counter(result).inc();
    }

    /// The handles for one (upstream, model), created at zero.
    pub(crate) fn target(&self, upstream: &str, model: &str) -> TargetMetrics {
        let labels = TargetLabels {
            upstream: upstream.to_owned(),
            model: model.to_owned(),
        };
        let recent = |timing| {
            Arc::clone(
                self.recent
                    .lock()
                    .entry((labels.clone(), timing))
                    .or_default(),
            )
        };
        let families = &self.families;
        let [
            completed,
            upstream_status_error,
            upstream_error,
            client_gone,
        ] = families.requests.resolve(&labels);
        let [gone_queued, gone_awaiting, gone_streaming] = families.disconnects.resolve(&labels);
        let [prompt_tokens, completion_tokens, cached_prompt_tokens] =
            families.tokens.resolve(&labels);
        TargetMetrics {
            queue_wait: Timing {
                histogram: families.queue_wait.resolve(&labels),
                recent: recent("queue_wait"),
            },
            handoff_gap: families.handoff_gap.resolve(&labels),
            response_head: Timing {
                histogram: families.response_head.resolve(&labels),
                recent: recent("response_head"),
            },
            first_token: families.first_token.resolve(&labels),
            duration: families.duration.resolve(&labels),
            responses: families.responses.resolve(&labels),
            prompt_tokens,
            completion_tokens,
            cached_prompt_tokens,
            affinity: families.affinity.resolve(&labels),
            completed,
            upstream_status_error,
            upstream_error,
            client_gone,
            gone_queued,
            gone_awaiting,
            gone_streaming,
            retries: families.retries.resolve(&labels),
        }
    }

    /// The rejection counters of one model, created at zero.
    pub(crate) fn rejections(&self, model: &str) -> RejectionMetrics {
        let [
            queue_full,
            queue_timeout,
            store_unavailable,
            upstream_unavailable,
            model_unavailable,
        ] = self.families.rejections.resolve(model);
        RejectionMetrics {
            queue_full,
            queue_timeout,
            store_unavailable,
            upstream_unavailable,
            model_unavailable,
        }
    }

    /// Counts a refusal that has no pre-resolved counter: `model` is the configured model it
    /// was for, empty when the request named none (or an unknown one: a client's name never
    /// becomes a label). Refusals are the slow path; this hashes its labels.
    pub(crate) fn refused(&self, model: &str, reason: &'static str) {
        self.families.rejections.count(model, reason);
    }

    /// Drops the series of one (upstream, model) that a reload removed, so scrapes stop
    /// reporting it.
    pub(crate) fn forget_target(&self, upstream: &str, model: &str) {
        let labels = TargetLabels {
            upstream: upstream.to_owned(),
            model: model.to_owned(),
        };
        self.families.forget_target(&labels);
        self.recent
            .lock()
            .retain(|(key, _timing), _recent| *key != labels);
    }

    /// Drops the rejection series of a model that a reload removed from every upstream.
    pub(crate) fn forget_model(&self, model: &str) {
        self.families.forget_model(model);
    }

    /// Registers every family in `registry`.
    pub(crate) fn register(&self, registry: &mut Registry) {
        self.families.register(registry);
    }
}

/// Observes a duration in seconds.
pub(crate) fn observe(histogram: &Histogram, elapsed: Duration) {
    histogram.observe(elapsed.as_secs_f64());
}
