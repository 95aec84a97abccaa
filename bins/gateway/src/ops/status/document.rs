//! What one status event carries: the status of every upstream, exactly as
//! `GET /admin/upstreams` writes it ([`upstream_doc`](crate::ops::upstream_doc)), and beside it
//! what only the page shows:
//!
//! - per (upstream, model) in `live`: queue-wait and first-byte percentiles over about the last
//!   5 minutes, the prompt tokens its engine reported since start and how many of them it took
//!   from its cache (the host's cache hit share, what cache-aware routing aims at), and the
//!   in-flight and queued samples newer than the ones the page already has (all of them in the
//!   first event, about one per event after that);
//! - per model in `refusals`: the refusals (`503`, by reason) of about the last minute. The
//!   gateway refuses a model, not one of its upstreams: a request is refused once every
//!   upstream's queue is full or its wait ran out.
//!
//! ```json
//! {"tick": 42, "generation": 1, "loaded_at": "…", "sample_every_ms": 1000, "samples_kept": 300,
//!  "store": { …under [cluster], as in GET /admin/upstreams… },
//!  "upstreams": [ …as GET /admin/upstreams… ],
//!  "live": [{"upstream": "a", "model": "m", "queue_wait": {"count": 9, "p50": 0.004, "p99": 1.1},
//!            "first_byte": {"count": 9, "p50": 0.03, "p99": 0.05},
//!            "cache": {"prompt_tokens": 5200, "cached_tokens": 4900},
//!            "samples": [{"tick": 42, "in_flight": 2, "queued": 1}]}],
//!  "refusals": [{"model": "m", "queue_full": 3, "queue_timeout": 0}]}
//! ```

use serde::Serialize;

use crate::metrics::recent::Counts;
use crate::ops::status::history::{History, Load, Refusals, SAMPLE_EVERY, SAMPLES};
use crate::ops::upstream_doc::{StoreDoc, UpstreamDoc, rfc3339, upstream_status};
use crate::proxy::live::Generation;

/// One status event's document.
#[derive(Debug, Serialize)]
pub(crate) struct StatusDoc<'g> {
    /// The newest sample's number.
    pub(crate) tick: u64,
    generation: u64,
    loaded_at: String,
    sample_every_ms: u128,
    samples_kept: usize,
    /// Under `[cluster]`: the shared store and the replicas seen, as in `GET /admin/upstreams`.
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<StoreDoc>,
    upstreams: Vec<UpstreamDoc<'g>>,
    live: Vec<LiveDoc<'g>>,
    refusals: Vec<RefusalDoc<'g>>,
}

/// What the page shows of one (upstream, model) beyond its status document.
#[derive(Debug, Serialize)]
struct LiveDoc<'g> {
    upstream: &'g str,
    model: &'g str,
    queue_wait: Percentiles,
    first_byte: Percentiles,
    cache: CacheDoc,
    samples: Vec<Load>,
}

/// The prompt tokens an (upstream, model)'s engine reported since start, and of them the ones
/// it took from its cache (`slotgate_tokens_total`).
#[derive(Debug, Serialize)]
struct CacheDoc {
    prompt_tokens: u64,
    cached_tokens: u64,
}

/// Percentiles of a timing over the window, in seconds; `null` without observations.
#[derive(Debug, Serialize)]
struct Percentiles {
    count: u64,
    p50: Option<f64>,
    p99: Option<f64>,
}

impl From<&Counts> for Percentiles {
    fn from(counts: &Counts) -> Self {
        Self {
            count: counts.total(),
            p50: counts.quantile(0.5),
            p99: counts.quantile(0.99),
        }
    }
}

/// A model's refusals over about the last minute.
#[derive(Debug, Serialize)]
struct RefusalDoc<'g> {
    model: &'g str,
    #[serde(flatten)]
    counts: Refusals,
}

/// The document for `generation` from `history`, with the samples newer than `after` (all of
/// them for `None`).
pub(crate) fn build<'g>(
    generation: &'g Generation,
    history: &History,
    after: Option<u64>,
) -> StatusDoc<'g> {
    let upstreams = generation
        .upstreams
        .iter()
        .map(|u| upstream_status(generation, u))
        .collect();
    let live = generation
        .routes
        .targets()
        .map(|target| {
            let queue_wait = target.metrics.queue_wait.recent.counts();
            let first_byte = target.metrics.response_head.recent.counts();
            let key = history.key(&target.upstream.name, &target.model);
            let (queue_wait, first_byte) = key.map_or_else(
                || (Counts::default(), Counts::default()),
                |key| key.window(&queue_wait, &first_byte),
            );
            let samples = key
                .map(|key| {
                    key.load
                        .iter()
                        .filter(|load| after.is_none_or(|after| load.tick > after))
                        .copied()
                        .collect()
                })
                .unwrap_or_default();
            LiveDoc {
                upstream: &target.upstream.name,
                model: &target.model,
                queue_wait: Percentiles::from(&queue_wait),
                first_byte: Percentiles::from(&first_byte),
                cache: CacheDoc {
                    prompt_tokens: target.metrics.prompt_tokens.get(),
                    cached_tokens: target.metrics.cached_prompt_tokens.get(),
                },
                samples,
            }
        })
        .collect();
    let refusals = generation
        .routes
        .routes()
        .map(|route| RefusalDoc {
            model: &route.model,
            counts: history.refusals_last_minute(&route.model),
        })
        .collect();
    StatusDoc {
        tick: history.tick(),
        generation: generation.number,
        loaded_at: rfc3339(generation.loaded_at),
        sample_every_ms: SAMPLE_EVERY.as_millis(),
        samples_kept: SAMPLES,
        store: generation.cluster.as_ref().map(StoreDoc::new),
        upstreams,
        live,
        refusals,
    }
}
