//! Hot reload: `SIGHUP` or `POST /admin/reload` reads the configuration file again and puts it in
//! force without dropping a request.
//!
//! In order:
//!
//! 1. Load and validate the file (with its `SLOTGATE_*` environment overrides), then check what
//!    the gateway itself would refuse ([`Generation::build`]). Any problem refuses the whole
//!    reload: every issue is logged and returned, and the configuration in force stays.
//! 2. Build the new generation. Limits of existing keys change in the limiter at once (live: a
//!    grown `parallel` grants waiters immediately, a shrunk one lets in-flight requests drain
//!    down); new keys are created. An upstream that keeps its name and engine keeps its health,
//!    residency and draining state.
//! 3. Check the new and changed upstreams once, so the new configuration starts with their real
//!    health, and read the slot count of every `parallel = "auto"` model again
//!    ([`slot_discovery`]).
//! 4. Swap: requests arriving from now on use the new configuration; requests already routed
//!    finish under the old one.
//! 5. Remove the limiter keys the new configuration no longer has: requests still *waiting* on
//!    them get a `503 upstream-unavailable` problem; requests *running* on them keep their slot
//!    and finish normally. Their metric series are dropped.
//!
//! The listeners' certificates are read again with the rest: a renewed certificate is presented
//! from the next TLS handshake on, and open connections are not dropped. Keys that only take
//! effect at start (the listeners' addresses, turning TLS on or off, connection and client
//! settings, the affinity indexes: [`Server::restart_required`]) are reported, and keep their
//! running values until a restart. Reloads are serialised.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use slotgate_config::{Config, ConfigError, Server};
use slotgate_limiter::Limiter;
use tracing::{error, info, warn};

use crate::metrics::Metrics;
use crate::proxy::live::{Generation, Live};
use crate::tls::listener::ListenerSlots;
use crate::upstreams::monitor;
use crate::upstreams::probe::Prober;
use crate::upstreams::slot_discovery;

/// Reloads the configuration from the file the gateway started with.
#[derive(Debug)]
pub(crate) struct Reloader {
    source: Option<PathBuf>,
    /// `max_buffered_body_bytes` as read at start: the budget in force whatever later files
    /// say, which every reloaded body limit must fit in.
    body_budget: usize,
    /// The `[server]` table the gateway started with: what the keys read only at start still
    /// are, whatever reloads came since. A reload reports those its file has otherwise.
    started: Server,
    live: Arc<Live>,
    limiter: Limiter,
    metrics: Metrics,
    prober: Prober,
    /// The TLS listeners' certificates, renewed by every reload.
    slots: ListenerSlots,
    serial: tokio::sync::Mutex<()>,
    /// The last reload, when it was refused: shown by `GET /admin/upstreams` until a reload
    /// is applied, so an operator whose `SIGHUP` did nothing can see why without the logs.
    refused: parking_lot::Mutex<Option<RefusedReload>>,
}

/// A refused reload: when, and every problem.
#[derive(Debug, Clone)]
pub(crate) struct RefusedReload {
    /// When the reload was refused.
    pub(crate) at: std::time::SystemTime,
    /// Every problem, one per entry ([`ReloadError::issues`]).
    pub(crate) issues: Vec<String>,
}

/// What a successful reload changed ([`Gateway::reload`](crate::Gateway::reload)).
///
/// ```no_run
/// # async fn demo(gateway: &slotgate_gateway::Gateway) -> Result<(), slotgate_gateway::ReloadError> {
/// let reloaded = gateway.reload().await?;
/// println!("generation {}: added {:?}", reloaded.generation, reloaded.added);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Reloaded {
    /// The new generation's number.
    pub generation: u64,
    /// Upstreams that are new.
    pub added: Vec<String>,
    /// Upstreams that are gone.
    pub removed: Vec<String>,
    /// Upstreams whose settings or models changed.
    pub changed: Vec<String>,
    /// `[server]` keys whose new value differs from the one the gateway started with, which
    /// stays in force until the next start.
    pub restart_required: Vec<&'static str>,
}

/// Why a reload was refused. The configuration in force stays.
///
/// ```no_run
/// # async fn demo(gateway: &slotgate_gateway::Gateway) {
/// if let Err(refused) = gateway.reload().await {
///     for issue in refused.issues() {
///         eprintln!("{issue}");
///     }
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReloadError {
    /// The gateway was started from a configuration in memory, not a file.
    #[error("the gateway was not started from a configuration file; there is nothing to reload")]
    NoSource,
    /// The file could not be read or parsed.
    #[error("cannot load the configuration file")]
    Load(#[source] ConfigError),
    /// The task that reads the file off the async workers did not finish (it panicked, or the
    /// runtime is shutting down).
    #[error("the task reading the configuration file failed")]
    Task(#[source] tokio::task::JoinError),
    /// The file parsed but breaks rules; every problem, each `path: message`.
    #[error("the new configuration has {} problem(s)", .0.len())]
    Invalid(Vec<String>),
}

impl ReloadError {
    /// Every problem, one per entry (one entry, with its cause, for the errors that are not a
    /// list).
    pub fn issues(&self) -> Vec<String> {
        match self {
            ReloadError::Invalid(issues) => issues.clone(),
            // `ConfigError` already writes its own cause into its message.
            ReloadError::Load(cause) => vec![format!("{self}: {cause}")],
            ReloadError::Task(cause) => vec![format!("{self}: {cause}")],
            ReloadError::NoSource => vec![self.to_string()],
        }
    }
}

impl Reloader {
    /// A reloader for the gateway whose configuration is in `live`; `source` is the file to
    /// read again (`None`: reloads are refused); `body_budget` is the `max_buffered_body_bytes`
    /// the gateway started with; `slots` are the TLS listeners' certificates.
    pub(crate) fn new(
        source: Option<PathBuf>,
        body_budget: usize,
        live: Arc<Live>,
        limiter: Limiter,
        metrics: Metrics,
        prober: Prober,
        slots: ListenerSlots,
    ) -> Self {
        Self {
            source,
            body_budget,
            // Made at start, before any reload: the generation in force is the first.
            started: live.current().config.server.clone(),
            live,
            limiter,
            metrics,
            prober,
            slots,
            serial: tokio::sync::Mutex::new(()),
            refused: parking_lot::Mutex::new(None),
        }
    }

    /// The last reload, if it was refused (none once a later one is applied).
    pub(crate) fn last_refused(&self) -> Option<RefusedReload> {
        self.refused.lock().clone()
    }

    /// Reads the file again and puts it in force (see the [module docs](self)). Logs the
    /// outcome either way.
    pub(crate) async fn reload(&self) -> Result<Reloaded, ReloadError> {
        let _serial = self.serial.lock().await;
        let result = self.reload_locked().await;
        self.metrics.reload(result.is_ok());
        *self.refused.lock() = result.as_ref().err().map(|refused| RefusedReload {
            at: std::time::SystemTime::now(),
            issues: refused.issues(),
        });
        match &result {
            Ok(reloaded) => {
                info!(
                    generation = reloaded.generation,
                    added = ?reloaded.added,
                    removed = ?reloaded.removed,
                    changed = ?reloaded.changed,
                    "configuration reloaded"
                );
                if !reloaded.restart_required.is_empty() {
                    warn!(
                        keys = ?reloaded.restart_required,
                        "configuration reloaded, but these keys only take effect at restart"
                    );
                }
            }
            Err(refused) => {
                for issue in refused.issues() {
                    error!(%issue, "configuration reload refused");
                }
                warn!(%refused, "configuration reload refused; the running configuration stays");
            }
        }
        result
    }

    async fn reload_locked(&self) -> Result<Reloaded, ReloadError> {
        let path = self.source.clone().ok_or(ReloadError::NoSource)?;
        // File I/O: off the async workers.
        let loaded = tokio::task::spawn_blocking(move || Config::load(&path))
            .await
            .map_err(ReloadError::Task)?;
        let config = loaded.map_err(|error| match error {
            ConfigError::Invalid(issues) => {
                ReloadError::Invalid(issues.iter().map(ToString::to_string).collect())
            }
            other => ReloadError::Load(other),
        })?;

        // The file's own budget was checked against its limits; the one in force is the start's.
        let too_big = body_limits_over_budget(&config.server, self.body_budget);
        if !too_big.is_empty() {
            return Err(ReloadError::Invalid(too_big));
        }

        let old = self.live.current();
        let new = Generation::build(config, Some(&old), &self.limiter, &self.metrics)
            .map_err(|problems| ReloadError::Invalid(problems.issues()))?;

        // New and changed engines start unknown: learn their state before they get traffic.
        let fresh = new
            .upstreams
            .iter()
            .filter(|u| !old.upstreams.contains(u))
            .cloned()
            .collect();
        monitor::check_upstreams(fresh, &self.prober, new.policy).await;
        // `parallel = "auto"`: every such model's slot count is read again.
        slot_discovery::read_slot_counts(
            new.routes.targets().cloned().collect(),
            &self.prober,
            new.policy,
            true,
        )
        .await;

        let reloaded = summarise(&old, &new, &self.started);
        let old_keys = old.routes.keys();
        let new_keys = new.routes.keys();
        let old_series = series(&old);
        let new_series = series(&new);
        let old_models: BTreeSet<&str> = old.routes.routes().map(|r| r.model.as_str()).collect();
        let new_models: BTreeSet<String> = new.routes.routes().map(|r| r.model.clone()).collect();
        // From the next handshake on; open connections keep the certificate they got.
        self.slots.renew(&new.listener_certs);
        let new_cluster = new.cluster.clone();
        self.live.replace(new);

        for (authority, model) in old_keys.difference(&new_keys) {
            // Waiters fail with `Closed` (→ 503); held permits stay valid until released.
            self.limiter.remove(authority.as_str(), model.as_str());
            if let Some(cluster) = &new_cluster {
                slotgate_admission::Admission::remove(cluster, authority.as_str(), model.as_str());
            }
        }
        for (upstream, model) in old_series.difference(&new_series) {
            self.metrics.forget_target(upstream, model);
        }
        for model in old_models {
            if !new_models.contains(model) {
                self.metrics.forget_model(model);
            }
        }
        Ok(reloaded)
    }
}

/// Every (upstream name, model) of a generation: the labels of its metric series.
fn series(generation: &Generation) -> BTreeSet<(String, String)> {
    generation
        .routes
        .routes()
        .flat_map(|route| {
            route
                .targets
                .iter()
                .map(|t| (t.upstream.name.clone(), route.model.clone()))
        })
        .collect()
}

/// What changed from `old` to `new`; the keys read only at start are compared with `started`,
/// the values still in force (against `old`, a second reload of the same file would say
/// nothing, and going back to the start's value would be reported).
fn summarise(old: &Generation, new: &Generation, started: &Server) -> Reloaded {
    let before = &old.config.upstreams;
    let after = &new.config.upstreams;
    Reloaded {
        generation: new.number,
        added: after
            .keys()
            .filter(|name| !before.contains_key(*name))
            .cloned()
            .collect(),
        removed: before
            .keys()
            .filter(|name| !after.contains_key(*name))
            .cloned()
            .collect(),
        changed: after
            .iter()
            .filter(|(name, upstream)| before.get(*name).is_some_and(|old| old != *upstream))
            .map(|(name, _)| name.clone())
            .collect(),
        // Each key read only at start says so in its declaration (`slotgate_config::Server`).
        restart_required: started.restart_required(&new.config.server),
    }
}

/// One problem per body limit of `server` that the request-body budget in force (`budget`,
/// read at start) could not hold: such a body would be refused with `503 overloaded` however
/// long its client waited.
fn body_limits_over_budget(server: &Server, budget: usize) -> Vec<String> {
    [
        ("max_body_bytes", server.max_body_bytes),
        ("max_upload_bytes", server.max_upload_bytes),
    ]
    .into_iter()
    .filter(|&(_, limit)| limit > budget)
    .map(|(key, limit)| {
        format!(
            "server.{key}: {limit} is more than the max_buffered_body_bytes in force ({budget}), \
             which only changes at restart; restart the gateway to raise both, or keep {key} at \
             most {budget}"
        )
    })
    .collect()
}
