//! Slot auto-discovery: `parallel = "auto"` on a `kind = "llama-server"` model takes the slot
//! count from the engine itself, `total_slots` of its `GET /props` (= its `--parallel`).
//!
//! # When it is read
//!
//! - At start, after the first round of health checks and before the first request.
//! - On every reload, for every `auto` model of the new configuration, before it takes effect.
//! - When the upstream comes back healthy after being ejected (a restarted engine may have
//!   another `--parallel`).
//! - Every health-check interval while the count is not known (the engine was down, or
//!   answered something that is not a slot count).
//!
//! # No silent default
//!
//! Until a read succeeds, the model is **unavailable on that upstream**: the router leaves the
//! target out, a request with no other place to go gets a `503 upstream-unavailable` whose
//! detail says why, and the error is logged (at `error` the first time and whenever it
//! changes). The limiter key exists meanwhile with `parallel = 0`. A count once found stays in
//! force when a later re-read fails (logged as a warning): it is the engine's own answer, not a
//! guess, and one lost probe must not empty a model.
//!
//! A count read from the engine goes into the limiter at once (live: growing grants waiters,
//! shrinking lets in-flight requests drain down), and is shown by the admin API
//! (`GET /admin/upstreams`: `slots`, `discovery`), the metric `slotgate_slots_capacity` and
//! `slotgate check`.
//!
//! In router mode (several models) the probe asks `/props?model=NAME&autoload=false`: a probe
//! never makes the router load a model, so `auto` needs the model loaded (or loaded at start);
//! for a model loaded on demand, state `parallel`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::SystemTime;

use parking_lot::Mutex;
use slotgate_config::{Config, Kind, ModelLimits};
use slotgate_limiter::Limiter;
use tokio::task::JoinSet;
use tracing::{error, info, warn};

use crate::health::{HealthPolicy, Status};
use crate::probe::{ProbeError, ProbeTarget, Prober};
use crate::route::Route;
use crate::upstream::UpstreamState;

/// The discovered slot count of one (upstream, model) whose `parallel` is `"auto"`.
#[derive(Debug)]
pub struct AutoSlots {
    upstream: String,
    authority: String,
    model: String,
    queue: usize,
    limiter: Limiter,
    /// The count in force; 0 while unknown (a real count is at least 1). Read lock-free by
    /// every request's routing.
    found: AtomicUsize,
    state: Mutex<State>,
}

#[derive(Debug, Clone)]
struct State {
    checked: Option<SystemTime>,
    error: Option<String>,
    /// A read was asked for (start, reload) and has not succeeded yet.
    stale: bool,
    /// The upstream's health `since` when the count was read: a later change through
    /// `unhealthy` means the engine may have restarted.
    healthy_since: Option<SystemTime>,
}

/// A copy of the discovery state, for the admin API.
#[derive(Debug, Clone)]
pub struct SlotsView {
    /// The count in force; `None` until a read succeeded.
    pub found: Option<usize>,
    /// When the last read ended.
    pub checked: Option<SystemTime>,
    /// Why the last read failed, until one succeeds.
    pub error: Option<String>,
}

impl AutoSlots {
    /// The discovery state of `model` on `upstream`, configuring its limiter key with the count
    /// `previous` found (same key, previous configuration) or with 0 slots while there is none.
    /// Either way a read is due ([`AutoSlots::needs_read`]).
    pub fn new(
        upstream: &UpstreamState,
        model: &str,
        queue: usize,
        limiter: &Limiter,
        previous: Option<&AutoSlots>,
    ) -> Self {
        let found = previous.and_then(AutoSlots::found);
        limiter.configure(
            upstream.authority.as_str(),
            model,
            found.unwrap_or(0),
            queue,
        );
        Self {
            upstream: upstream.name.clone(),
            authority: upstream.authority.clone(),
            model: model.to_owned(),
            queue,
            limiter: limiter.clone(),
            found: AtomicUsize::new(found.unwrap_or(0)),
            state: Mutex::new(State {
                checked: previous.and_then(|p| p.state.lock().checked),
                error: None,
                stale: true,
                healthy_since: None,
            }),
        }
    }

    /// The slot count in force, `None` while unknown (the model is then unavailable here).
    pub fn found(&self) -> Option<usize> {
        match self.found.load(Ordering::Relaxed) {
            0 => None,
            slots => Some(slots),
        }
    }

    /// Whether the count should be read now: never read, asked for, or the upstream has been
    /// through an ejection since it was read.
    pub fn needs_read(&self, upstream: &UpstreamState) -> bool {
        let state = self.state.lock();
        if state.stale || self.found().is_none() {
            return true;
        }
        let health = upstream.health.view();
        health.status == Status::Healthy && state.healthy_since != Some(health.since)
    }

    /// A copy of the state.
    pub fn view(&self) -> SlotsView {
        let state = self.state.lock().clone();
        SlotsView {
            found: self.found(),
            checked: state.checked,
            error: state.error,
        }
    }

    /// Why the model is unavailable here, while it is.
    pub fn unavailable_reason(&self) -> Option<String> {
        if self.found().is_some() {
            return None;
        }
        let error = self.state.lock().error.clone();
        Some(format!(
            "upstream `{}` has parallel = \"auto\" and its slot count is not known: {}",
            self.upstream,
            error.as_deref().unwrap_or("not read yet")
        ))
    }

    /// Records a read of the engine's slot count, putting a new count in force.
    pub fn record(&self, result: Result<usize, String>, upstream: &UpstreamState) {
        let mut state = self.state.lock();
        state.checked = Some(SystemTime::now());
        match result {
            Ok(slots) => {
                let before = self.found.swap(slots, Ordering::Relaxed);
                state.stale = false;
                state.error = None;
                state.healthy_since = Some(upstream.health.view().since);
                drop(state);
                if before != slots {
                    self.limiter.configure(
                        self.authority.as_str(),
                        self.model.as_str(),
                        slots,
                        self.queue,
                    );
                    info!(
                        upstream = %self.upstream,
                        model = %self.model,
                        slots,
                        previous = before,
                        "parallel = \"auto\": slot count read from the engine's /props"
                    );
                }
            }
            Err(reason) => {
                let repeated = state.error.as_deref() == Some(reason.as_str());
                state.error = Some(reason.clone());
                drop(state);
                if repeated {
                    return;
                }
                match self.found() {
                    None => error!(
                        upstream = %self.upstream,
                        model = %self.model,
                        error = %reason,
                        "parallel = \"auto\": cannot read the slot count from the engine; the model \
                         is unavailable on this upstream until it answers (retried every health check)"
                    ),
                    Some(slots) => warn!(
                        upstream = %self.upstream,
                        model = %self.model,
                        error = %reason,
                        slots,
                        "parallel = \"auto\": re-reading the slot count failed; the count found \
                         before stays in force"
                    ),
                }
            }
        }
    }
}

/// Reads the slot count of `model` from a llama-server.
pub async fn read(
    prober: &Prober,
    target: ProbeTarget<'_>,
    model: &str,
) -> Result<usize, ProbeError> {
    let props = prober.llama_props(target, model).await?;
    if props.total_slots == 0 {
        return Err(ProbeError::Parse("/props: total_slots is 0".to_owned()));
    }
    Ok(props.total_slots)
}

/// Reads the slot count of every `auto` target of `routes` that needs it
/// ([`AutoSlots::needs_read`]), or of every one with `force` (start, reload); concurrently,
/// each probe bounded by the health-check timeout.
pub async fn round(routes: Vec<Arc<Route>>, prober: &Prober, policy: HealthPolicy, force: bool) {
    let prober = prober.with_timeout(policy.timeout);
    let mut reads = JoinSet::new();
    for route in routes {
        for index in 0..route.targets.len() {
            let target = &route.targets[index];
            let Some(auto) = &target.auto else { continue };
            if !force && !auto.needs_read(&target.upstream) {
                continue;
            }
            let route = Arc::clone(&route);
            let prober = prober.clone();
            reads.spawn(async move {
                let target = &route.targets[index];
                let upstream = &target.upstream;
                let result = read(&prober, upstream.probe_target(), &route.model)
                    .await
                    .map_err(|e| format!("GET /props: {e}"));
                if let Some(auto) = &target.auto {
                    auto.record(result, upstream);
                }
            });
        }
    }
    // Dropping the set (if this future is dropped at shutdown) aborts the reads.
    while reads.join_next().await.is_some() {}
}

/// What `slotgate check` found for one `auto` model.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Found {
    /// The upstream's name.
    pub upstream: String,
    /// Where it was asked.
    pub url: String,
    /// The model.
    pub model: String,
    /// The slot count, or why there is none.
    pub slots: Result<usize, String>,
}

/// Reads the slot count of every `parallel = "auto"` model of `config` once (for
/// `slotgate check`), each probe bounded by `server.health_check_timeout`. Needs a Tokio
/// runtime; binds nothing.
pub async fn probe_config(config: &Config) -> Vec<Found> {
    let prober = Prober::new(config.server.health_check_timeout);
    let mut found = Vec::new();
    for upstream in config.upstreams.values() {
        if upstream.kind != Kind::LlamaServer {
            continue;
        }
        let state = UpstreamState::from_config(upstream);
        for (model, limits) in &upstream.models {
            if !matches!(limits, ModelLimits::Auto { .. }) {
                continue;
            }
            let slots = match &state {
                Ok(state) => read(&prober, state.probe_target(), model)
                    .await
                    .map_err(|e| format!("GET /props: {e}")),
                Err(problem) => Err(problem.clone()),
            };
            found.push(Found {
                upstream: upstream.name.clone(),
                url: upstream.url.to_string(),
                model: model.clone(),
                slots,
            });
        }
    }
    found
}
