//! The per-target state of `parallel = "auto"`: the slot count read from the engine, when it was
//! read, and why the last read failed. Owned by its [`Target`](crate::upstreams::target::Target);
//! [`slot_discovery`](crate::upstreams::slot_discovery) does the reading and the rules of when
//! are documented there.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::SystemTime;

use parking_lot::Mutex;
use slotgate_limiter::{KeyHandle, Limiter, QueueOrder};
use slotgate_limiter_redis::RedisLimiter;
use tracing::{error, info, warn};

use crate::support::error::chain;
use crate::upstreams::health::Status;
use crate::upstreams::probe::ProbeError;
use crate::upstreams::state::{UpstreamError, UpstreamState};

/// Why the slot count of a `parallel = "auto"` model could not be read.
///
/// ```no_run
/// # async fn demo(config: &slotgate_config::Config) {
/// for probed in slotgate_gateway::probe_config(config).await {
///     if let Err(error) = &probed.slots {
///         // The first line says what was asked; `source()` says why it failed.
///         let why = std::error::Error::source(error).map(ToString::to_string);
///         eprintln!("{}: {error} ({why:?})", probed.model);
///     }
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[error(transparent)]
pub struct SlotCountError(#[from] SlotCountFailure);

/// What [`SlotCountError`] wraps.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SlotCountFailure {
    /// The engine did not answer `/props` as expected.
    #[error("GET /props")]
    Props(#[source] ProbeError),
    /// The engine answered with no slots.
    #[error("GET /props: total_slots is 0")]
    NoSlots,
    /// The upstream cannot be used at all (`slotgate check` reports it per model).
    #[error(transparent)]
    Upstream(UpstreamError),
}

/// The discovered slot count of one (upstream, model) whose `parallel` is `"auto"`.
#[derive(Debug)]
pub(crate) struct AutoSlots {
    upstream: String,
    authority: String,
    model: String,
    limiter: Limiter,
    /// The key whose `parallel` is the count in force plus `prefetch`: the count lives there and
    /// nowhere else (0 while unknown).
    key: KeyHandle,
    /// Under `[cluster]`: the shared store, where a count read here is written as the key's
    /// limit for every replica (with the model's order), and nothing while none is known.
    cluster: Option<(RedisLimiter, QueueOrder)>,
    /// The model's `prefetch`: requests sent ahead beyond the engine's slots.
    prefetch: usize,
    /// Whether a count has been read: the "not known yet" state, read lock-free by every
    /// request's routing. Set only under `state`, after the key has the count.
    known: AtomicBool,
    state: Mutex<DiscoveryRecord>,
}

#[derive(Debug, Clone)]
struct DiscoveryRecord {
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
pub(crate) struct SlotsView {
    /// The count in force; `None` until a read succeeded.
    pub(crate) found: Option<usize>,
    /// When the last read ended.
    pub(crate) checked: Option<SystemTime>,
    /// Why the last read failed, until one succeeds.
    pub(crate) error: Option<String>,
}

impl AutoSlots {
    /// The discovery state of `model` on `upstream`, configuring its limiter key with the count
    /// `previous` found (same key, previous configuration) plus `prefetch`, or with 0 slots while
    /// there is none. Either way a read is due ([`AutoSlots::needs_read`]).
    pub(crate) fn new(
        upstream: &UpstreamState,
        model: &str,
        (queue, prefetch): (usize, usize),
        (limiter, cluster): (&Limiter, Option<(RedisLimiter, QueueOrder)>),
        previous: Option<&AutoSlots>,
    ) -> Self {
        let found = previous.and_then(AutoSlots::found);
        let authority = upstream.authority.as_str();
        let cap = found.map_or(0, |slots| slots.saturating_add(prefetch));
        limiter.configure(authority, model, cap, queue);
        if let (Some(_), Some((cluster, order))) = (found, &cluster) {
            share(cluster, (authority, model), (cap, queue), *order);
        }
        Self {
            cluster,
            upstream: upstream.name.clone(),
            authority: upstream.authority.clone(),
            model: model.to_owned(),
            limiter: limiter.clone(),
            key: limiter.handle(authority, model),
            prefetch,
            known: AtomicBool::new(found.is_some()),
            state: Mutex::new(DiscoveryRecord {
                checked: previous.and_then(|p| p.state.lock().checked),
                error: None,
                stale: true,
                healthy_since: None,
            }),
        }
    }

    /// Whether the count has been read (until then the model is unavailable here). Lock-free.
    pub(crate) fn is_known(&self) -> bool {
        self.known.load(Ordering::Acquire)
    }

    /// The slot count in force (the key's `parallel`, less `prefetch`), `None` while unknown.
    pub(crate) fn found(&self) -> Option<usize> {
        self.is_known()
            .then(|| self.key.limits().parallel.saturating_sub(self.prefetch))
    }

    /// Whether the count should be read now: never read, asked for, or the upstream has been
    /// through an ejection since it was read.
    pub(crate) fn needs_read(&self, upstream: &UpstreamState) -> bool {
        let state = self.state.lock();
        if state.stale || !self.is_known() {
            return true;
        }
        let health = upstream.health.view();
        health.status == Status::Healthy && state.healthy_since != Some(health.since)
    }

    /// A copy of the state.
    pub(crate) fn view(&self) -> SlotsView {
        let state = self.state.lock().clone();
        SlotsView {
            found: self.found(),
            checked: state.checked,
            error: state.error,
        }
    }

    /// Why the model is unavailable here, while it is.
    pub(crate) fn unavailable_reason(&self) -> Option<String> {
        if self.is_known() {
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
    pub(crate) fn record(&self, result: Result<usize, &SlotCountError>, upstream: &UpstreamState) {
        let mut state = self.state.lock();
        state.checked = Some(SystemTime::now());
        match result {
            Ok(slots) => {
                let before = self.found();
                if before != Some(slots) {
                    // The key's own `queue` (configured from this generation's configuration)
                    // stays; only the count changes. Under `state`, so reads do not interleave.
                    let queue = self.key.limits().queue;
                    let cap = slots.saturating_add(self.prefetch);
                    let key = (self.authority.as_str(), self.model.as_str());
                    self.limiter.configure(key.0, key.1, cap, queue);
                    if let Some((cluster, order)) = &self.cluster {
                        share(cluster, key, (cap, queue), *order);
                    }
                }
                self.known.store(true, Ordering::Release);
                state.stale = false;
                state.error = None;
                state.healthy_since = Some(upstream.health.view().since);
                drop(state);
                if before != Some(slots) {
                    info!(
                        upstream = %self.upstream,
                        model = %self.model,
                        slots,
                        previous = before.unwrap_or(0),
                        "parallel = \"auto\": slot count read from the engine's /props"
                    );
                }
            }
            Err(error) => {
                let reason = chain(error);
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

/// Writes a count read here into the shared store as the key's limit (last writer wins: every
/// replica reads the same engine).
fn share(
    cluster: &RedisLimiter,
    (authority, model): (&str, &str),
    (cap, queue): (usize, usize),
    order: QueueOrder,
) {
    use slotgate_admission::Admission as _;
    cluster.configure(authority, model, cap, queue);
    cluster.configure_order(authority, model, order);
}
