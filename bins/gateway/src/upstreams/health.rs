//! Whether an upstream gets new requests: its health, from active checks and from what
//! forwarding sees.
//!
//! # The check, per kind
//!
//! | kind | probe | healthy when |
//! |---|---|---|
//! | `llama-server` | `GET /health` | 200. The 503 `Loading model` it answers while loading is *not* healthy |
//! | `vllm` | `GET /health` | 200 (503 means the engine died; while loading, the port refuses connections) |
//! | `ollama` | `GET /` | 200 (`Ollama is running`) |
//! | `openai` | `GET /v1/models` | 200 with a model list |
//!
//! Every probe must complete within `server.health_check_timeout`.
//!
//! # The state machine
//!
//! An upstream is [`Status::Unknown`] until its first check, then [`Status::Healthy`] or
//! [`Status::Unhealthy`]. The first check decides at once (there is no history to smooth);
//! after that, `server.eject_after_failures` consecutive failures eject a healthy upstream and
//! `server.restore_after_successes` consecutive successes restore an ejected one, so one lost
//! probe does not empty a host and a flapping engine does not get traffic back after a single
//! good answer.
//!
//! Passive ejection: what forwarding sees counts too, without waiting for the checks.
//!
//! - A refused or failed *connect* counts as a failure (the request itself fails over to the
//!   next host), so an engine that died between two checks stops getting requests after
//!   `eject_after_failures` attempts.
//! - So does an engine's own 5xx answer ([`judge`]), so an engine that still accepts
//!   connections but fails every request (a model that did not load, a llama-server gone back
//!   to `Loading model`) is ejected the same way. A 502/503/504 answer is retried on the next
//!   host (`server.engine_error_retries`, in the request path).
//! - The exception is an engine's "busy" 503 (Ollama's and vLLM's own queue limits): the engine
//!   is well, only full, so it is retried elsewhere but neither counts as a failure nor breaks a
//!   streak.
//! - Any other answer (2xx, 3xx, 4xx) resets the failure streak.
//!
//! A failure seen while forwarding counts only if its request was *sent after* the streak's
//! last counted failure was recorded. An answer takes seconds and an error milliseconds, so a
//! burst of concurrent requests that make the engine fail (one client's malformed inputs, a
//! moment of bad luck) would otherwise be a whole streak with no success in between; under this
//! rule the burst counts once, and only requests sent after each counted failure go on with the
//! streak. An engine that fails everyone still fails the next requests too, so it is ejected
//! after `eject_after_failures` such rounds (with steady traffic, a few round trips of an error).
//!
//! A streak that reaches the threshold is only [due](Streak::Due): whether the upstream leaves
//! is decided with the other upstreams of its models in view
//! ([`ejection`](crate::upstreams::ejection): never the last one still in rotation, nor more
//! than `max_ejection_percent` of them). An upstream kept in rotation that way stays due, and
//! its next counted failure asks again.
//!
//! Only the active checks restore an upstream: an ejected one gets no traffic to prove itself
//! with.
//!
//! Unknown counts as routable: the gateway runs one round of checks before it starts serving
//! and before a reload takes effect, so in practice an upstream is only Unknown while that
//! first check runs.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime};

use http::StatusCode;
use parking_lot::Mutex;
use slotgate_config::{Kind, Server};

use crate::support::error::chain;
use crate::upstreams::probe::{ProbeError, ProbeTarget, Prober};

/// The health-check settings (from `[server]`; a reload may change them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HealthPolicy {
    /// Time between two rounds of checks.
    pub(crate) interval: Duration,
    /// Time allowed for one probe.
    pub(crate) timeout: Duration,
    /// Consecutive failures that eject a healthy upstream.
    pub(crate) eject_after: usize,
    /// Consecutive successes that restore an ejected upstream.
    pub(crate) restore_after: usize,
    /// The largest share of a model's upstreams, in percent, that may be out of rotation for
    /// passive ejection to take out one more ([`ejection`](crate::upstreams::ejection)).
    pub(crate) max_ejection_percent: usize,
}

impl HealthPolicy {
    /// The policy the configuration states.
    pub(crate) fn from_config(server: &Server) -> Self {
        Self {
            interval: server.health_check_interval,
            timeout: server.health_check_timeout,
            eject_after: server.eject_after_failures.max(1),
            restore_after: server.restore_after_successes.max(1),
            max_ejection_percent: server.max_ejection_percent.min(100),
        }
    }
}

/// Where an upstream stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Not checked yet; gets requests.
    Unknown,
    /// Passing its checks; gets requests.
    Healthy,
    /// Ejected; gets no new requests until restored.
    Unhealthy,
}

impl Status {
    /// `unknown`, `healthy` or `unhealthy` (admin API, logs).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Status::Unknown => "unknown",
            Status::Healthy => "healthy",
            Status::Unhealthy => "unhealthy",
        }
    }

    /// Whether an upstream in this state may be given new requests.
    pub(crate) fn is_routable(self) -> bool {
        !matches!(self, Status::Unhealthy)
    }
}

/// One upstream's health. Shared by the request path (which reads [`Health::is_routable`] for
/// every candidate, lock-free) and the checks (which write).
#[derive(Debug)]
pub(crate) struct Health {
    routable: AtomicBool,
    state: Mutex<HealthView>,
}

/// A copy of an upstream's health, for the admin API.
#[derive(Debug, Clone)]
pub(crate) struct HealthView {
    /// Where it stands.
    pub(crate) status: Status,
    /// Consecutive successful checks (0 after a failure).
    pub(crate) successes: usize,
    /// Consecutive failures, checks and refused connections (0 after a success).
    pub(crate) failures: usize,
    /// When the status last changed (or the gateway started watching).
    pub(crate) since: SystemTime,
    /// When the last active check ended.
    pub(crate) last_check: Option<SystemTime>,
    /// The last failure's reason, until a success clears it.
    pub(crate) last_error: Option<String>,
    /// When the streak's last failure was counted: a failure seen while forwarding counts only
    /// for a request sent after it (see the [module docs](self)).
    pub(crate) counted_at: Option<Instant>,
    /// Why a streak over the threshold did not eject it (the last upstream of a model in
    /// rotation, or too many of them out), until the streak ends.
    pub(crate) kept_because: Option<String>,
}

/// What a failure seen while forwarding did to the streak.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Streak {
    /// Nothing: the upstream is out already, or the request was sent before the streak's last
    /// counted failure (a burst counts once).
    Unchanged,
    /// One more failure in the streak, still under the threshold.
    Longer,
    /// One more failure, and the streak is at the threshold: ask the other upstreams of its
    /// models whether it may go ([`Health::eject_if_due`]).
    Due,
}

impl Default for Health {
    fn default() -> Self {
        Self::new()
    }
}

impl Health {
    /// Not checked yet (routable).
    pub(crate) fn new() -> Self {
        Self {
            routable: AtomicBool::new(true),
            state: Mutex::new(HealthView {
                status: Status::Unknown,
                successes: 0,
                failures: 0,
                since: SystemTime::now(),
                last_check: None,
                last_error: None,
                counted_at: None,
                kept_because: None,
            }),
        }
    }

    /// Whether new requests may go here (healthy, or not checked yet).
    pub(crate) fn is_routable(&self) -> bool {
        // Relaxed: a request that reads a stale value a moment after a transition goes (or
        // doesn't go) to this host once more, which is all a health check can promise anyway.
        self.routable.load(Ordering::Relaxed)
    }

    /// A copy of the whole state.
    pub(crate) fn view(&self) -> HealthView {
        self.state.lock().clone()
    }

    /// Records an active check's result (a failure's causes are kept as text for the admin
    /// API); returns the new status if it changed.
    pub(crate) fn record_check(
        &self,
        result: Result<(), &ProbeError>,
        policy: &HealthPolicy,
    ) -> Option<Status> {
        let mut state = self.state.lock();
        state.last_check = Some(SystemTime::now());
        let changed = match result {
            Ok(()) => succeed(&mut state, policy),
            Err(error) => fail(&mut state, chain(error), policy),
        };
        drop(state);
        self.publish(changed)
    }

    /// Records a failure seen while forwarding (passive ejection), a refused connection or an
    /// engine's error answer to a request sent at `sent`. It never ejects by itself: a
    /// [`Streak::Due`] streak leaves through [`Health::eject_if_due`], once the other upstreams
    /// of its models allow it.
    pub(crate) fn record_forward_failure(
        &self,
        reason: String,
        sent: Instant,
        policy: &HealthPolicy,
    ) -> Streak {
        let mut state = self.state.lock();
        if state.status == Status::Unhealthy {
            // Already out; the active checks decide when it comes back. Keep the streak of
            // check successes intact: a request routed here just before the ejection should
            // not reset a recovery in progress.
            return Streak::Unchanged;
        }
        if state.counted_at.is_some_and(|counted| sent < counted) {
            // Under way when the streak's last failure was counted: the same burst.
            return Streak::Unchanged;
        }
        state.successes = 0;
        state.failures = state.failures.saturating_add(1);
        state.last_error = Some(reason);
        state.counted_at = Some(Instant::now());
        // The first result decides at once, as for a check.
        if state.status == Status::Unknown || state.failures >= policy.eject_after {
            Streak::Due
        } else {
            Streak::Longer
        }
    }

    /// Ejects the upstream if its streak is still [due](Streak::Due) (nothing came in between
    /// to break it): the caller has checked that the other upstreams of its models allow it.
    /// Returns the new status if it changed.
    pub(crate) fn eject_if_due(&self, policy: &HealthPolicy) -> Option<Status> {
        let mut state = self.state.lock();
        let due = match state.status {
            Status::Unhealthy => false,
            Status::Unknown => state.failures > 0,
            Status::Healthy => state.failures >= policy.eject_after,
        };
        let changed = due.then(|| transition(&mut state, Status::Unhealthy));
        drop(state);
        self.publish(changed)
    }

    /// Notes why a due streak did not eject the upstream; returns whether that is news (the
    /// first time in this streak, or a different reason), so it is logged once.
    pub(crate) fn keep(&self, because: &str) -> bool {
        let mut state = self.state.lock();
        if state.kept_because.as_deref() == Some(because) {
            return false;
        }
        state.kept_because = Some(because.to_owned());
        true
    }

    /// Records a forwarded request that got an answer: the failure streak is broken.
    pub(crate) fn record_answer(&self) {
        let mut state = self.state.lock();
        if state.failures != 0 && state.status != Status::Unhealthy {
            state.failures = 0;
            state.counted_at = None;
            state.kept_because = None;
        }
    }

    fn publish(&self, changed: Option<Status>) -> Option<Status> {
        if let Some(status) = changed {
            self.routable.store(status.is_routable(), Ordering::Relaxed);
        }
        changed
    }
}

/// A success: restores after `restore_after` in a row (the first check decides at once).
fn succeed(state: &mut HealthView, policy: &HealthPolicy) -> Option<Status> {
    state.failures = 0;
    state.counted_at = None;
    state.kept_because = None;
    state.successes = state.successes.saturating_add(1);
    state.last_error = None;
    let restore = match state.status {
        Status::Healthy => false,
        Status::Unknown => true,
        Status::Unhealthy => state.successes >= policy.restore_after,
    };
    restore.then(|| transition(state, Status::Healthy))
}

/// A failed check: ejects after `eject_after` in a row (the first check decides at once),
/// whatever the other upstreams do: a check sees the engine itself fail, not a request.
fn fail(state: &mut HealthView, reason: String, policy: &HealthPolicy) -> Option<Status> {
    state.successes = 0;
    state.failures = state.failures.saturating_add(1);
    state.last_error = Some(reason);
    state.counted_at = Some(Instant::now());
    let eject = match state.status {
        Status::Unhealthy => false,
        Status::Unknown => true,
        Status::Healthy => state.failures >= policy.eject_after,
    };
    eject.then(|| transition(state, Status::Unhealthy))
}

fn transition(state: &mut HealthView, to: Status) -> Status {
    state.status = to;
    state.kept_because = None;
    state.since = SystemTime::now();
    to
}

/// What an engine's answer to a forwarded request says about the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// It works: 2xx, 3xx, and 4xx (the client's mistake); the failure streak is broken.
    Well,
    /// It failed the request: a 5xx that counts towards ejection.
    Failing,
    /// It is well but full (its own queue limit): neither a failure nor a success.
    Busy,
}

/// Judges an engine of `kind` by the `status` of its answer to a forwarded request.
///
/// On an inference route, a 503 means different things per engine: llama-server answers it
/// only while its model loads (`Loading model`), and a generic `openai` upstream is unavailable
/// for reasons unknown, so both count as failing. Ollama answers 503 when its pending queue
/// (`OLLAMA_MAX_QUEUE`) is full, and vLLM when its opt-in `--max-num-queued-reqs` limit is
/// reached (while it loads it refuses connections instead): both are busy.
pub(crate) fn judge(kind: Kind, status: StatusCode) -> Verdict {
    if !status.is_server_error() {
        return Verdict::Well;
    }
    match (kind, status) {
        (Kind::Ollama | Kind::Vllm, StatusCode::SERVICE_UNAVAILABLE) => Verdict::Busy,
        _ => Verdict::Failing,
    }
}

/// Runs the health check of an upstream of `kind` (see the [module docs](self)).
pub(crate) async fn check_engine(
    prober: &Prober,
    kind: Kind,
    target: ProbeTarget<'_>,
) -> Result<(), ProbeError> {
    match kind {
        Kind::LlamaServer => prober.llama_health(target).await,
        Kind::Vllm => prober.vllm_health(target).await,
        Kind::Ollama => prober.ollama_alive(target).await,
        Kind::OpenAi => prober.openai_models(target).await.map(drop),
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use http::StatusCode;
    use slotgate_config::Kind;

    use super::{Health, HealthPolicy, ProbeError, Status, Streak, Verdict, judge};

    const POLICY: HealthPolicy = HealthPolicy {
        interval: Duration::from_secs(5),
        timeout: Duration::from_secs(2),
        eject_after: 3,
        restore_after: 2,
        max_ejection_percent: 50,
    };

    fn fail(health: &Health) -> Option<Status> {
        health.record_check(Err(&ProbeError::Timeout(Duration::from_secs(1))), &POLICY)
    }

    fn pass(health: &Health) -> Option<Status> {
        health.record_check(Ok(()), &POLICY)
    }

    #[test]
    fn the_first_check_decides_at_once() {
        let health = Health::new();
        assert!(health.is_routable());
        assert_eq!(health.view().status, Status::Unknown);
        assert_eq!(fail(&health), Some(Status::Unhealthy));
        assert!(!health.is_routable());

        let health = Health::new();
        assert_eq!(pass(&health), Some(Status::Healthy));
        assert!(health.is_routable());
    }

    #[test]
    fn thresholds_eject_and_restore() {
        let health = Health::new();
        pass(&health);
        assert_eq!(fail(&health), None);
        assert_eq!(fail(&health), None);
        // A success in between breaks the streak.
        assert_eq!(pass(&health), None);
        assert_eq!(fail(&health), None);
        assert_eq!(fail(&health), None);
        assert_eq!(fail(&health), Some(Status::Unhealthy));
        assert!(!health.is_routable());
        assert_eq!(
            health.view().last_error.as_deref(),
            Some("no answer within 1s")
        );
        assert_eq!(fail(&health), None);
        assert_eq!(pass(&health), None);
        assert!(!health.is_routable());
        assert_eq!(pass(&health), Some(Status::Healthy));
        assert!(health.is_routable());
        assert_eq!(health.view().last_error, None);
    }

    /// A failure seen while forwarding a request sent at `sent`.
    fn refused(health: &Health, sent: Instant) -> Streak {
        health.record_forward_failure("refused".into(), sent, &POLICY)
    }

    #[test]
    fn forwarding_failures_come_due_and_answers_reset_the_streak() {
        let health = Health::new();
        pass(&health);
        assert_eq!(refused(&health, Instant::now()), Streak::Longer);
        assert_eq!(refused(&health, Instant::now()), Streak::Longer);
        health.record_answer();
        assert_eq!(health.view().failures, 0);
        for _ in 0..2 {
            assert_eq!(refused(&health, Instant::now()), Streak::Longer);
        }
        // Due, but only `eject_if_due` ejects (once the other upstreams allow it).
        assert_eq!(refused(&health, Instant::now()), Streak::Due);
        assert!(health.is_routable());
        assert!(health.keep("the last upstream"));
        assert!(!health.keep("the last upstream"), "noted once");
        assert_eq!(health.eject_if_due(&POLICY), Some(Status::Unhealthy));
        assert!(!health.is_routable());
        assert_eq!(health.view().kept_because, None);
        // Passive results never restore, nor disturb a recovery in progress.
        pass(&health);
        assert_eq!(refused(&health, Instant::now()), Streak::Unchanged);
        health.record_answer();
        assert_eq!(health.view().successes, 1);
        assert_eq!(pass(&health), Some(Status::Healthy));
    }

    #[test]
    fn a_due_streak_broken_before_the_decision_does_not_eject() {
        let health = Health::new();
        pass(&health);
        for _ in 0..2 {
            refused(&health, Instant::now());
        }
        assert_eq!(refused(&health, Instant::now()), Streak::Due);
        health.record_answer();
        assert_eq!(health.eject_if_due(&POLICY), None);
        assert!(health.is_routable());
    }

    #[test]
    fn a_burst_of_concurrent_failures_counts_once() {
        let health = Health::new();
        pass(&health);
        // Ten requests sent together, all failing: one failure.
        let burst = Instant::now();
        assert_eq!(refused(&health, burst), Streak::Longer);
        for _ in 0..9 {
            assert_eq!(refused(&health, burst), Streak::Unchanged);
        }
        assert_eq!(health.view().failures, 1);
        // Requests sent after each counted failure go on with the streak: an engine that fails
        // everyone is still ejected.
        assert_eq!(refused(&health, Instant::now()), Streak::Longer);
        let late = Instant::now();
        assert_eq!(refused(&health, late), Streak::Due);
        assert_eq!(refused(&health, late), Streak::Unchanged);
        assert_eq!(health.eject_if_due(&POLICY), Some(Status::Unhealthy));
    }

    #[test]
    fn the_first_forwarding_failure_decides_as_the_first_check_does() {
        let health = Health::new();
        assert_eq!(refused(&health, Instant::now()), Streak::Due);
        assert_eq!(health.eject_if_due(&POLICY), Some(Status::Unhealthy));
    }

    #[test]
    fn engine_answers_are_judged_per_kind() {
        let all = [Kind::LlamaServer, Kind::Vllm, Kind::Ollama, Kind::OpenAi];
        for kind in all {
            for well in [200, 204, 301, 400, 404, 413, 429] {
                let status = StatusCode::from_u16(well).unwrap();
                assert_eq!(judge(kind, status), Verdict::Well, "{kind:?} {well}");
            }
            for failing in [500, 501, 502, 504] {
                let status = StatusCode::from_u16(failing).unwrap();
                assert_eq!(judge(kind, status), Verdict::Failing, "{kind:?} {failing}");
            }
        }
        let unavailable = StatusCode::SERVICE_UNAVAILABLE;
        assert_eq!(judge(Kind::LlamaServer, unavailable), Verdict::Failing);
        assert_eq!(judge(Kind::OpenAi, unavailable), Verdict::Failing);
        assert_eq!(judge(Kind::Vllm, unavailable), Verdict::Busy);
        assert_eq!(judge(Kind::Ollama, unavailable), Verdict::Busy);
    }
}
