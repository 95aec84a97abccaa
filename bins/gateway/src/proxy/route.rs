//! Step 4's routing table: from the `model` a client asked for to the upstreams that may serve
//! it, best first.
//!
//! The routing table is built once from the configuration:
//!
//! - every configured model name and every alias maps to one [`Route`]; an alias maps to the
//!   *same* route as its target, so both names share the targets' limiter keys — one cap and one
//!   queue, whatever name the client used;
//! - a route lists one [`Target`] per upstream that configures the model, each with its limiter
//!   key resolved in advance ([`KeyHandle`](slotgate_limiter::KeyHandle): no map lookup on the hot path) and configured with
//!   the model's limits (`parallel = "unlimited"` becomes an unlimited key, which counts requests
//!   in flight but never refuses or queues; `parallel = "auto"` gets the engine's own slot count
//!   from [`slot_discovery`](crate::upstreams::slot_discovery), and the target is left out until that count is known).
//!
//! [`Route::ranked`] asks `slotgate-choose` for the order to try the targets in, from what the
//! gateway knows about each upstream right now ([`UpstreamState`]): an unhealthy or draining
//! upstream is not eligible; one with the model resident ranks before one that would have to
//! load it. The score uses the free slots *of the key*: it is the key's cap that decides whether
//! this request waits.
//!
//! A reload builds a new table; [`Routes::build`] carries each key's hold-time statistics, the
//! engine's load readings and a discovered slot count over from the previous one, so
//! `Retry-After` estimates, an excess in progress and `auto` counts survive it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use slotgate_admission::Admission as _;
use slotgate_config::{Config, ModelLimits, Queueing};
use slotgate_limiter::{HostReading, Limiter, QueueOrder};
use slotgate_limiter_redis::RedisLimiter;

use crate::metrics::{Metrics, RejectionMetrics};
use crate::proxy::endpoint::Endpoint;
use crate::upstreams::auto_slots::AutoSlots;
use crate::upstreams::cluster::SharedKey;
use crate::upstreams::ejection::Ejection;
use crate::upstreams::residency;
use crate::upstreams::state::{UpstreamState, Upstreams};
use crate::upstreams::target::{AnswerNames, Sizing, Target};

/// The routing table.
#[derive(Debug)]
pub(crate) struct Routes {
    by_name: HashMap<String, Arc<Route>>,
    /// Every name a client may use (models and aliases), sorted.
    names: Vec<String>,
}

/// Where requests for one configured model can go.
#[derive(Debug)]
pub(crate) struct Route {
    /// The configured model name (what upstreams call it; an alias resolves to this).
    pub(crate) model: String,
    /// One per upstream configuring the model, in configuration order.
    pub(crate) targets: Vec<Arc<Target>>,
    /// Refusals of this model, by reason.
    pub(crate) rejections: RejectionMetrics,
    /// Whether cache-aware routing places its requests: no upstream's table for the model says
    /// `affinity = "off"`.
    pub(crate) affinity: bool,
}

impl Routes {
    /// Builds the table for `config`, configures `limiter` (and the shared store `cluster`, for
    /// the models with a cap, under `[cluster]`) with every (upstream, model) key
    /// (live: a changed limit applies to requests already waiting) and creates each key's
    /// metrics. `upstreams` must have been built from the same `config`; hold-time statistics,
    /// engine load readings and discovered slot counts are carried over from `previous`.
    pub(crate) fn build(
        config: &Config,
        upstreams: &Upstreams,
        limiter: &Limiter,
        cluster: Option<&RedisLimiter>,
        metrics: &Metrics,
        previous: Option<&Routes>,
    ) -> Self {
        // What a key keeps across a reload: hold times, the engine's load, a discovered count.
        let carried: HashMap<(&str, &str), &Target> = previous
            .into_iter()
            .flat_map(Routes::routes)
            .flat_map(|route| {
                route.targets.iter().map(|target| {
                    (
                        (target.upstream.authority.as_str(), target.model.as_str()),
                        &**target,
                    )
                })
            })
            .collect();
        let mut routes: HashMap<String, Route> = HashMap::new();
        let ejections = Ejection::for_config(config, upstreams);
        for upstream in config.upstreams.values() {
            // `Upstreams::build` made one state per configured upstream.
            let (Some(state), Some(ejection)) =
                (upstreams.get(&upstream.name), ejections.get(&upstream.name))
            else {
                continue;
            };
            let authority = state.authority.as_str();
            // The engine-wide cap, before the models' keys: a key joins its host's cap with the
            // units it holds.
            configure_host(limiter, cluster, authority, upstream.parallel);
            for (model, limits) in &upstream.models {
                let previous = carried.get(&(authority, model.as_str()));
                let (sizing, queue_timeout, shared) = configure_key(
                    (limiter, cluster),
                    (upstream, state),
                    model,
                    limits,
                    previous.and_then(|p| p.auto()),
                );
                let queueing = configure_order(limiter, authority, model, upstream);
                let engine_model = upstream.engine_model(model);
                let target = Target {
                    upstream: Arc::clone(state),
                    model: model.clone(),
                    engine_model: engine_model.to_owned(),
                    key: limiter.handle(authority, model.as_str()),
                    shared,
                    tagged_name: residency::tagged_name(state.kind, engine_model),
                    place_name: Arc::from(
                        residency::tagged_name(state.kind, engine_model)
                            .as_deref()
                            .unwrap_or(engine_model),
                    ),
                    sizing,
                    queue_timeout,
                    queueing,
                    weight: upstream.weight,
                    model_management: upstream.allow_model_management,
                    cancel_grace: upstream.cancel_grace,
                    stream_idle_timeout: upstream.stream_idle_timeout,
                    stream_timeout: upstream.stream_timeout,
                    answer_names: Arc::new(AnswerNames {
                        upstream: upstream.name.clone(),
                        model: model.clone(),
                    }),
                    hold: previous.map_or_else(Arc::default, |p| Arc::clone(&p.hold)),
                    prefill: previous.map_or_else(Arc::default, |p| Arc::clone(&p.prefill)),
                    metrics: Arc::new(metrics.target(&upstream.name, model)),
                    // Carried over so that an excess in progress is not forgotten by a reload.
                    engine: previous.map_or_else(Arc::default, |p| Arc::clone(&p.engine)),
                    ejection: Arc::clone(ejection),
                };
                let route = routes.entry(model.clone()).or_insert_with(|| Route {
                    model: model.clone(),
                    targets: Vec::new(),
                    rejections: metrics.rejections(model),
                    affinity: true,
                });
                route.affinity &= upstream.affinity(model);
                route.targets.push(Arc::new(target));
            }
        }
        let mut by_name: HashMap<String, Arc<Route>> = routes
            .into_iter()
            .map(|(name, route)| (name, Arc::new(route)))
            .collect();
        for (alias, target) in &config.aliases {
            // Validation guarantees the target is a configured model; skip rather than panic.
            if let Some(route) = by_name.get(target).cloned() {
                by_name.insert(alias.clone(), route);
            }
        }
        let names: BTreeSet<String> = by_name.keys().cloned().collect();
        Self {
            by_name,
            names: names.into_iter().collect(),
        }
    }

    /// The route for a client-supplied model name (a model or an alias).
    pub(crate) fn resolve(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
    }

    /// The route for a request that names no model, on an endpoint that allows that: the only
    /// model configured on upstreams of a kind that serves `endpoint` (a single-model
    /// `llama-server` answers with whatever it has loaded). `None` when there are none or
    /// several.
    pub(crate) fn only_model(&self, endpoint: &Endpoint) -> Option<&Arc<Route>> {
        let mut serving = self.routes().filter(|route| {
            route
                .targets
                .iter()
                .any(|t| endpoint.is_served_by(t.upstream.kind))
        });
        let only = serving.next()?;
        serving.next().is_none().then_some(only)
    }

    /// Every name a client may use, sorted: configured models and aliases.
    pub(crate) fn names(&self) -> &[String] {
        &self.names
    }

    /// Every route once (aliases not repeated), in model-name order.
    pub(crate) fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        let mut seen = BTreeSet::new();
        self.names
            .iter()
            .filter_map(|name| self.by_name.get(name))
            .filter(move |route| seen.insert(route.model.as_str()))
    }

    /// The engine-wide cap of `upstream` (`[upstreams.NAME] parallel`), read from the limiter:
    /// its limit and the slots held over all its models; `None` when it has none.
    pub(crate) fn upstream_cap(&self, upstream: &UpstreamState) -> Option<HostReading> {
        let target = self
            .targets()
            .find(|t| t.upstream.authority == upstream.authority)?;
        // A cap lifted by a reload stays in the limiter as unlimited: not a cap any more.
        target
            .key
            .host_reading()
            .filter(|cap| cap.parallel != usize::MAX)
    }

    /// Every target of the table once (aliases not repeated).
    pub(crate) fn targets(&self) -> impl Iterator<Item = &Arc<Target>> {
        self.routes().flat_map(|route| route.targets.iter())
    }

    /// Every limiter key of the table: (upstream authority, model).
    pub(crate) fn keys(&self) -> BTreeSet<(String, String)> {
        self.routes()
            .flat_map(|route| {
                route
                    .targets
                    .iter()
                    .map(|t| (t.upstream.authority.clone(), route.model.clone()))
            })
            .collect()
    }
}

impl Route {
    /// The targets to try, best first (see `slotgate-choose` for the rules). Unhealthy and
    /// draining upstreams are left out, and so are `auto` targets whose slot count is unknown.
    pub(crate) fn ranked(&self) -> Vec<&Arc<Target>> {
        slotgate_choose::ranked(&self.targets, |target| {
            target.slots_known().then(|| target.info())
        })
    }

    /// Whether any target may take new requests now (healthy, not draining, slot count known).
    pub(crate) fn is_available(&self) -> bool {
        self.targets
            .iter()
            .any(|t| t.upstream.is_available() && t.slots_known())
    }

    /// Why targets cannot take requests as far as slot counts go: `auto` counts not known yet
    /// (with the engine's answer). `None` when there is no such target.
    pub(crate) fn unavailable_reason(&self) -> Option<String> {
        let reasons: Vec<String> = self
            .targets
            .iter()
            .filter_map(|t| t.auto()?.unavailable_reason())
            .collect();
        (!reasons.is_empty()).then(|| reasons.join("; "))
    }
}

/// Makes or lifts an upstream's engine-wide cap, in `limiter` and (under `[cluster]`) in the
/// shared store. A reload that takes the cap away lifts it (the limiter keeps a cap once made);
/// an upstream that never had one gets none, so its models stay capped one by one with nothing
/// shared to lock.
fn configure_host(
    limiter: &Limiter,
    cluster: Option<&RedisLimiter>,
    authority: &str,
    parallel: Option<usize>,
) {
    match parallel {
        Some(parallel) => {
            limiter.configure_host(authority, parallel);
            // Under `[cluster]` the replicas share it (last writer wins).
            if let Some(cluster) = cluster {
                cluster.configure_host(authority, parallel);
            }
        }
        None if limiter.host_reading(authority).is_some() => {
            limiter.configure_host(authority, usize::MAX);
            if let Some(cluster) = cluster {
                cluster.configure_host(authority, usize::MAX);
            }
        }
        None => {}
    }
}

/// Configures the limiter key (and the shared key, under `[cluster]`) of one (upstream, model)
/// for its `limits`: how its slots are sized, how long a request may queue, and its shared key.
/// Requests sent ahead to wait in the engine's own queue (`prefetch`) add to the key's cap
/// (`Target::slots` gives the engine's slots alone).
fn configure_key(
    (limiter, cluster): (&Limiter, Option<&RedisLimiter>),
    (upstream, state): (&slotgate_config::Upstream, &Arc<UpstreamState>),
    model: &str,
    limits: &ModelLimits,
    carried_auto: Option<&AutoSlots>,
) -> (Sizing, Option<std::time::Duration>, Option<SharedKey>) {
    let authority = state.authority.as_str();
    let mut shared = None;
    let prefetch = upstream.queueing(model).prefetch;
    let (sizing, queue_timeout) = match *limits {
        ModelLimits::Limited {
            parallel,
            queue,
            queue_timeout,
            capacity,
        } => {
            let cap = parallel.saturating_add(prefetch);
            limiter.configure(authority, model, cap, queue);
            shared = cluster.map(|cluster| {
                let order = order_of(upstream.queueing(model).order);
                SharedKey::configure(cluster, authority, model, (cap, queue), order)
            });
            (Sizing::Fixed { capacity }, Some(queue_timeout))
        }
        ModelLimits::Unlimited => {
            limiter.configure(authority, model, usize::MAX, 0);
            (Sizing::Unlimited, None)
        }
        ModelLimits::Auto {
            queue,
            queue_timeout,
        } => {
            // Configures the key with the count found so far (0 while none); under
            // `[cluster]` the count is written to the store once known.
            let order = order_of(upstream.queueing(model).order);
            let auto = AutoSlots::new(
                state,
                model,
                (queue, prefetch),
                (limiter, cluster.map(|cluster| (cluster.clone(), order))),
                carried_auto,
            );
            shared = cluster.map(|cluster| SharedKey::attach(cluster, authority, model));
            (Sizing::Auto(Arc::new(auto)), Some(queue_timeout))
        }
    };
    (sizing, queue_timeout, shared)
}

/// Applies `model`'s `queue_order` on `upstream` to its limiter key, and returns how the model
/// queues. Live: waiters already queued are served as before until their line empties.
fn configure_order(
    limiter: &Limiter,
    authority: &str,
    model: &str,
    upstream: &slotgate_config::Upstream,
) -> Queueing {
    let queueing = upstream.queueing(model);
    limiter.configure_order(authority, model, order_of(queueing.order));
    queueing
}

/// The limiter's order for a configured `queue_order`.
fn order_of(order: slotgate_config::QueueOrder) -> QueueOrder {
    match order {
        slotgate_config::QueueOrder::Fifo => QueueOrder::Fifo,
        slotgate_config::QueueOrder::Fair => QueueOrder::Fair,
    }
}

#[cfg(test)]
mod tests;
