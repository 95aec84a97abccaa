//! The engine's own load next to the gateway's, per target: the last reading, when it was taken,
//! and whether an excess has lasted long enough to be warned about. Owned by its
//! [`Target`](crate::upstreams::target::Target); [`reconcile`](crate::upstreams::reconcile)
//! takes the readings and explains what they mean.

use std::time::{Duration, Instant, SystemTime};

use parking_lot::Mutex;
use tracing::{debug, info, warn};

use crate::support::error::chain;
use crate::upstreams::probe::ProbeError;

/// Why there is no reading of an engine's load.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LoadError {
    /// An unhealthy upstream is not asked: an old reading of a dead engine would be a lie.
    #[error("the upstream is unhealthy; not asked")]
    NotAsked,
    /// The engine did not tell.
    #[error(transparent)]
    Probe(#[from] ProbeError),
}

/// How long an excess must last before it is logged.
pub(crate) const EXCESS_GRACE: Duration = Duration::from_secs(2);

/// The engine's view of one (upstream, model), as last read.
#[derive(Debug, Default)]
pub(crate) struct EngineLoad {
    state: Mutex<LoadRecord>,
}

/// What is shown, and what it takes to decide when an excess is worth a warning.
#[derive(Debug, Default)]
struct LoadRecord {
    shown: LoadView,
    /// When the current excess was first seen, and in how many checks in a row.
    excess_since: Option<Instant>,
    excess_checks: u32,
    /// Checks in a row without an excess while a warning is in force. One is not enough to end
    /// it: the engine frees a slot before the gateway has carried the answer's end, so a single
    /// reading can agree by chance while a direct client is still being served.
    calm_checks: u32,
}

/// Checks in a row without an excess, and over the grace period with one, that change the
/// warning's state.
const CHECKS_TO_CHANGE: u32 = 2;

/// One reading of the engine against the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineReading {
    /// Requests the engine is running.
    pub(crate) busy: usize,
    /// Requests the engine holds in its own queue, when it tells.
    pub(crate) waiting: Option<usize>,
    /// The gateway's requests in flight in the same scope.
    pub(crate) gateway_in_flight: usize,
    /// Whether the engine's count covers the whole engine (every model configured on the
    /// upstream) rather than this model alone.
    pub(crate) whole_engine: bool,
}

impl EngineReading {
    /// Requests the engine has beyond what the gateway sent it.
    pub(crate) fn unaccounted(&self) -> usize {
        (self.busy + self.waiting.unwrap_or(0)).saturating_sub(self.gateway_in_flight)
    }
}

/// A copy of the state, for the admin API and the metrics.
#[derive(Debug, Default, Clone)]
pub(crate) struct LoadView {
    /// The last successful reading.
    pub(crate) reading: Option<EngineReading>,
    /// When the last check ended.
    pub(crate) checked: Option<SystemTime>,
    /// Why the last check failed, until one succeeds.
    pub(crate) error: Option<String>,
    /// Whether a warning about an excess is in force.
    pub(crate) warned: bool,
}

impl EngineLoad {
    /// A copy of the state.
    pub(crate) fn view(&self) -> LoadView {
        self.state.lock().shown.clone()
    }

    /// Records a check of (`upstream`, `model`), logging an excess that lasted.
    pub(crate) fn record(
        &self,
        upstream: &str,
        model: &str,
        result: Result<EngineReading, &LoadError>,
    ) {
        self.record_at(upstream, model, result, Instant::now());
    }

    /// [`record`](Self::record) as of `now`, so that the grace period can be tested.
    fn record_at(
        &self,
        upstream: &str,
        model: &str,
        result: Result<EngineReading, &LoadError>,
        now: Instant,
    ) {
        let mut state = self.state.lock();
        state.shown.checked = Some(SystemTime::now());
        let reading = match result {
            Ok(reading) => reading,
            Err(error) => {
                let error = chain(error);
                if state.shown.error.as_deref() != Some(error.as_str()) {
                    debug!(upstream, model, %error, "reading the engine's busy count failed");
                }
                // Unknown, not zero: an old reading would be a lie in the metrics.
                state.shown.reading = None;
                state.shown.error = Some(error);
                return;
            }
        };
        state.shown.reading = Some(reading);
        state.shown.error = None;
        if reading.unaccounted() == 0 {
            if state.shown.warned {
                state.calm_checks += 1;
                if state.calm_checks < CHECKS_TO_CHANGE {
                    return;
                }
                info!(
                    upstream,
                    model,
                    engine_busy = reading.busy,
                    gateway_in_flight = reading.gateway_in_flight,
                    "the engine is no busier than slotgate accounts for again"
                );
            }
            state.excess_since = None;
            state.excess_checks = 0;
            state.calm_checks = 0;
            state.shown.warned = false;
            return;
        }
        state.calm_checks = 0;
        let since = *state.excess_since.get_or_insert(now);
        state.excess_checks += 1;
        let lasted = now.saturating_duration_since(since);
        if !state.shown.warned && state.excess_checks >= CHECKS_TO_CHANGE && lasted >= EXCESS_GRACE
        {
            state.shown.warned = true;
            warn!(
                upstream,
                model,
                engine_busy = reading.busy,
                engine_waiting = reading.waiting,
                gateway_in_flight = reading.gateway_in_flight,
                whole_engine = reading.whole_engine,
                lasted = ?lasted,
                "the engine is busier than slotgate accounts for: requests reach it without going \
                 through this gateway (direct clients, another replica), or a slot leaked; the \
                 cap no longer protects it"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{EXCESS_GRACE, EngineLoad, EngineReading, LoadError};

    fn reading(busy: usize, waiting: Option<usize>, ours: usize) -> EngineReading {
        EngineReading {
            busy,
            waiting,
            gateway_in_flight: ours,
            whole_engine: true,
        }
    }

    #[test]
    fn unaccounted_is_the_engines_excess_over_the_gateway() {
        assert_eq!(reading(2, Some(0), 2).unaccounted(), 0);
        assert_eq!(reading(1, None, 3).unaccounted(), 0);
        assert_eq!(reading(3, Some(2), 2).unaccounted(), 3);
        assert_eq!(reading(2, None, 0).unaccounted(), 2);
    }

    #[test]
    fn one_excess_reading_is_not_a_warning_and_a_failure_forgets_the_reading() {
        let load = EngineLoad::default();
        load.record("u", "m", Ok(reading(2, Some(0), 0)));
        let view = load.view();
        assert_eq!(view.reading.map(|r| r.unaccounted()), Some(2));
        assert!(!view.warned, "not before two checks over the grace period");
        load.record("u", "m", Ok(reading(1, Some(0), 1)));
        assert!(!load.view().warned);
        load.record("u", "m", Err(&LoadError::NotAsked));
        let view = load.view();
        assert_eq!(view.reading, None);
        assert_eq!(
            view.error.as_deref(),
            Some("the upstream is unhealthy; not asked")
        );
    }

    #[test]
    fn a_warning_starts_after_the_grace_and_ends_after_two_calm_checks() {
        let load = EngineLoad::default();
        let start = Instant::now();
        let at = |ms: u64| start + Duration::from_millis(ms);
        let grace = u64::try_from(EXCESS_GRACE.as_millis()).unwrap();
        load.record_at("u", "m", Ok(reading(3, Some(0), 2)), at(0));
        load.record_at("u", "m", Ok(reading(3, Some(0), 2)), at(grace - 1));
        assert!(!load.view().warned, "not before the grace period");
        load.record_at("u", "m", Ok(reading(3, Some(0), 2)), at(grace));
        assert!(load.view().warned);
        // The engine freed a slot before the gateway carried the answer's end: one agreeing
        // reading while the direct client is still served does not end the episode.
        load.record_at("u", "m", Ok(reading(2, Some(0), 2)), at(grace + 100));
        assert!(load.view().warned, "one calm check is a race, not an end");
        load.record_at("u", "m", Ok(reading(1, Some(0), 0)), at(grace + 200));
        assert!(load.view().warned);
        load.record_at("u", "m", Ok(reading(0, Some(0), 0)), at(grace + 300));
        assert!(load.view().warned);
        load.record_at("u", "m", Ok(reading(0, Some(0), 0)), at(grace + 400));
        assert!(!load.view().warned, "two calm checks end it");
        // A new excess needs a full grace period again.
        load.record_at("u", "m", Ok(reading(1, Some(0), 0)), at(grace + 500));
        load.record_at("u", "m", Ok(reading(1, Some(0), 0)), at(grace + 600));
        assert!(!load.view().warned);
    }
}
