//! Step 4: from the `model` a client asked for to the upstreams that may serve it, best first.
//!
//! The routing table is built once from the configuration:
//!
//! - every configured model name and every alias maps to one [`Route`]; an alias maps to the
//!   *same* route as its target, so both names share the targets' limiter keys — one cap and one
//!   queue, whatever name the client used;
//! - a route lists one [`Target`] per upstream that configures the model, each with its limiter
//!   key resolved in advance ([`KeyHandle`]: no map lookup on the hot path) and configured with
//!   the model's limits (`parallel = "unlimited"` becomes an unlimited key, which counts requests
//!   in flight but never refuses or queues).
//!
//! [`Route::ranked`] asks `slotgate-choose` for the order to try the targets in. The score uses
//! the free slots *of the key*: it is the key's cap that decides whether this request waits.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use slotgate_choose::Info;
use slotgate_config::{Config, ModelLimits};
use slotgate_limiter::{KeyHandle, Limiter};

use crate::forward::Base;
use crate::hold::HoldStats;
use crate::metrics::{Metrics, RejectionMetrics, TargetMetrics};

/// The routing table.
#[derive(Debug)]
pub struct Routes {
    by_name: HashMap<String, Arc<Route>>,
    /// Every name a client may use (models and aliases), sorted.
    names: Vec<String>,
}

/// Where requests for one configured model can go.
#[derive(Debug)]
pub struct Route {
    /// The configured model name (what upstreams call it; an alias resolves to this).
    pub model: String,
    /// One per upstream configuring the model, in configuration order.
    pub targets: Vec<Target>,
    /// Refusals of this model, by reason.
    pub rejections: RejectionMetrics,
}

/// One upstream's offer of one model.
#[derive(Debug)]
pub struct Target {
    /// The upstream's name in the configuration.
    pub upstream: String,
    /// The limiter's host key (`scheme://host:port`).
    pub authority: String,
    /// Where to send requests.
    pub base: Base,
    /// The model's limiter key on this upstream.
    pub key: KeyHandle,
    /// The slot count; `None` when unlimited.
    pub parallel: Option<usize>,
    /// The longest wait for a slot; `None` when unlimited (never waits).
    pub queue_timeout: Option<Duration>,
    /// The operator's preference.
    pub weight: f64,
    /// Observed slot hold times, for `Retry-After`.
    pub hold: Arc<HoldStats>,
    /// `Authorization` to send upstream instead of the client's, if the upstream has a key.
    pub authorization: Option<HeaderValue>,
    /// This target's metric handles.
    pub metrics: Arc<TargetMetrics>,
}

impl Routes {
    /// Builds the table, configures `limiter` with every (upstream, model) key and creates each
    /// key's metrics.
    ///
    /// Fails on what the configuration crate accepts but this gateway cannot do yet (an `https`
    /// upstream), naming the upstream.
    pub fn build(config: &Config, limiter: &Limiter, metrics: &Metrics) -> Result<Self, String> {
        let mut routes: HashMap<String, Route> = HashMap::new();
        for upstream in config.upstreams.values() {
            let base = Base::parse(upstream.url.as_str())
                .map_err(|e| format!("upstreams.{}.url: {e}", upstream.name))?;
            let authority = upstream.authority();
            let authorization = match &upstream.api_key {
                Some(key) => {
                    let mut value = HeaderValue::try_from(format!("Bearer {}", key.expose()))
                        .map_err(|_| {
                            format!(
                                "upstreams.{}.api_key: not a valid header value",
                                upstream.name
                            )
                        })?;
                    value.set_sensitive(true);
                    Some(value)
                }
                None => None,
            };
            for (model, limits) in &upstream.models {
                let (parallel, queue, queue_timeout) = match *limits {
                    ModelLimits::Limited {
                        parallel,
                        queue,
                        queue_timeout,
                        ..
                    } => (Some(parallel), queue, Some(queue_timeout)),
                    ModelLimits::Unlimited => (None, 0, None),
                };
                limiter.configure(
                    authority.as_str(),
                    model.as_str(),
                    parallel.unwrap_or(usize::MAX),
                    queue,
                );
                let target = Target {
                    upstream: upstream.name.clone(),
                    authority: authority.clone(),
                    base: base.clone(),
                    key: limiter.handle(authority.as_str(), model.as_str()),
                    parallel,
                    queue_timeout,
                    weight: upstream.weight,
                    hold: Arc::default(),
                    authorization: authorization.clone(),
                    metrics: Arc::new(metrics.target(&upstream.name, model)),
                };
                routes
                    .entry(model.clone())
                    .or_insert_with(|| Route {
                        model: model.clone(),
                        targets: Vec::new(),
                        rejections: metrics.rejections(model),
                    })
                    .targets
                    .push(target);
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
        Ok(Self {
            by_name,
            names: names.into_iter().collect(),
        })
    }

    /// The route for a client-supplied model name (a model or an alias).
    pub fn resolve(&self, name: &str) -> Option<&Arc<Route>> {
        self.by_name.get(name)
    }

    /// Every name a client may use, sorted: configured models and aliases.
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// Every route once (aliases not repeated).
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        let mut seen = BTreeSet::new();
        self.by_name
            .values()
            .filter(move |route| seen.insert(route.model.as_str()))
    }
}

impl Route {
    /// The targets to try, best first (see `slotgate-choose` for the rules).
    pub fn ranked(&self) -> Vec<&Target> {
        slotgate_choose::ranked(&self.targets, |target| Some(target.info()))
    }
}

impl Target {
    /// What `slotgate-choose` needs to know about this target now.
    fn info(&self) -> Info {
        let limits = self.key.limits();
        Info {
            // Health checks and residency discovery are not wired yet: every configured
            // upstream counts as healthy and as having the model loaded.
            healthy: true,
            draining: false,
            loaded: true,
            can_serve: true,
            free: limits.parallel.saturating_sub(self.key.in_flight()),
            queued: self.key.queued(),
            weight: self.weight,
        }
    }

    /// The `Retry-After` for a request that would wait behind everyone queued here now.
    pub fn retry_after(&self) -> Duration {
        self.hold
            .retry_after(self.key.queued(), self.parallel.unwrap_or(usize::MAX))
    }
}
