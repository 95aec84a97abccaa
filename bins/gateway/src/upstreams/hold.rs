//! How long slots are held, and what that says about when to retry.
//!
//! A refused client gets a `Retry-After` that is an estimate, not a constant. Per
//! (upstream, model) key the gateway keeps an exponentially weighted moving average of how long
//! recent requests held their slot (from grant to release: the end of the response body, or the
//! end of `cancel_grace` for a client that left before the answer began). A request that
//! would join the queue behind `ahead` others on a key with `parallel` slots can expect a slot
//! after about
//!
//! ```text
//! hold × (ahead + 1) / parallel
//! ```
//!
//! — with `parallel` slots releasing at staggered times, one frees every `hold / parallel` on
//! average, and `ahead + 1` of them must free before this request's turn. The result is rounded
//! up to whole seconds (the unit of `Retry-After`) and clamped to
//! [`MIN_RETRY_AFTER`]..=[`MAX_RETRY_AFTER`]: never `0` (which invites an immediate stampede),
//! never more than a minute (beyond that the estimate is guesswork and a client had better try
//! elsewhere or give up on its own terms).
//!
//! Before the first release on a key there is no observation; [`ASSUMED_HOLD`] stands in.
//!
//! On an engine that loads models on demand, a model that is not loaded must be loaded first:
//! its measured load time (`Target::load_cost`) is added before rounding and clamping, and to
//! the keepalive comments' estimate.
//!
//! The same estimate, unrounded, tells whether a client's deadline can be kept at all
//! ([`HoldStats::expected_wait`]); there, without an observation there is no estimate, and the
//! request queues.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The smallest `Retry-After` given.
pub(crate) const MIN_RETRY_AFTER: Duration = Duration::from_secs(1);
/// The largest `Retry-After` given.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The hold time assumed before any slot of a key has been released: a typical chat answer.
pub(crate) const ASSUMED_HOLD: Duration = Duration::from_secs(10);
/// The weight of the newest observation in the moving average. 0.2 follows a change in load
/// within about ten requests while smoothing out one long answer.
const ALPHA: f64 = 0.2;

/// The moving average of one key's slot hold times. Lock-free: recorded on every release.
#[derive(Debug, Default)]
pub(crate) struct HoldStats {
    /// The average in seconds as `f64` bits; `0` (the bits of `0.0`) means "no observation".
    seconds: AtomicU64,
}

impl HoldStats {
    /// Records one hold time.
    pub(crate) fn record(&self, held: Duration) {
        // A hold of exactly zero would read as "no observation"; a microsecond is as good.
        let sample = held.as_secs_f64().max(1e-6);
        // Relaxed is enough: this is a statistic, and each update is a single atomic CAS.
        let _ = self
            .seconds
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |bits| {
                let old = f64::from_bits(bits);
                let new = if bits == 0 {
                    sample
                } else {
                    old + ALPHA * (sample - old)
                };
                Some(new.to_bits())
            });
    }

    /// The average hold time, `None` before the first observation.
    pub(crate) fn typical(&self) -> Option<Duration> {
        let bits = self.seconds.load(Ordering::Relaxed);
        (bits != 0).then(|| Duration::from_secs_f64(f64::from_bits(bits)))
    }

    /// The `Retry-After` for a request behind `ahead` others on a key with `parallel` slots,
    /// when its model must first be loaded for `load` (zero when it is loaded).
    pub(crate) fn retry_after(&self, ahead: usize, parallel: usize, load: Duration) -> Duration {
        retry_after(
            self.typical().unwrap_or(ASSUMED_HOLD),
            ahead,
            parallel,
            load,
        )
    }

    /// The wait expected for a request behind `ahead` others on a key with `parallel` slots,
    /// unrounded and unclamped, [`ASSUMED_HOLD`] standing in before the first observation: what
    /// a queued client is told.
    /// `load` is added as in [`HoldStats::retry_after`].
    pub(crate) fn eta(&self, ahead: usize, parallel: usize, load: Duration) -> Duration {
        let hold = self.typical().unwrap_or(ASSUMED_HOLD);
        Duration::from_secs_f64(expected_secs(hold, ahead, parallel)).saturating_add(load)
    }

    /// The wait expected for a request at its upstream's gate behind the loads of
    /// `models_ahead` other models: for each of them and then its own model, the resident
    /// model's requests drain (about one hold) and a model loads (`load`, the request's own
    /// model's measured load time standing in for the others'). Unrounded, unclamped.
    pub(crate) fn eta_behind_loads(&self, models_ahead: usize, load: Duration) -> Duration {
        let turn = self.typical().unwrap_or(ASSUMED_HOLD).saturating_add(load);
        let turns = u32::try_from(models_ahead.saturating_add(1)).unwrap_or(u32::MAX);
        turn.saturating_mul(turns).min(MAX_EXPECTED)
    }

    /// The wait expected for a request behind `ahead` others on a key with `parallel` slots,
    /// unrounded; `None` before the first observation (a guess is no ground to refuse anyone).
    pub(crate) fn expected_wait(&self, ahead: usize, parallel: usize) -> Option<Duration> {
        self.typical()
            .map(|hold| Duration::from_secs_f64(expected_secs(hold, ahead, parallel)))
    }
}

/// `hold × (ahead + 1) / parallel` in seconds (finite: at most `hold` × the queue).
fn expected_secs(hold: Duration, ahead: usize, parallel: usize) -> f64 {
    #[expect(
        clippy::cast_precision_loss,
        reason = "queue and slot counts are far below 2^53"
    )]
    let rounds = (ahead.saturating_add(1)) as f64 / parallel.max(1) as f64;
    (hold.as_secs_f64() * rounds).min(MAX_EXPECTED.as_secs_f64())
}

/// Far beyond any queue wait, and small enough for a `Duration`.
const MAX_EXPECTED: Duration = Duration::from_secs(365 * 24 * 3600);

/// `hold × (ahead + 1) / parallel` plus a model's `load` time (its measured average, when it is
/// not loaded), rounded up to whole seconds, clamped to
/// [`MIN_RETRY_AFTER`]..=[`MAX_RETRY_AFTER`]. See the [module docs](self).
pub(crate) fn retry_after(
    hold: Duration,
    ahead: usize,
    parallel: usize,
    load: Duration,
) -> Duration {
    let seconds = (expected_secs(hold, ahead, parallel) + load.as_secs_f64()).ceil();
    let min = MIN_RETRY_AFTER.as_secs_f64();
    let max = MAX_RETRY_AFTER.as_secs_f64();
    // `f64::max` returns the other operand for a NaN, so even a NaN would land in range.
    Duration::from_secs_f64(seconds.max(min).min(max))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{ASSUMED_HOLD, HoldStats, MAX_RETRY_AFTER, MIN_RETRY_AFTER, retry_after};

    #[test]
    fn a_models_load_time_adds_to_the_estimate_before_the_clamp() {
        let hold = Duration::from_secs(2);
        let load = Duration::from_millis(4500);
        assert_eq!(super::retry_after(hold, 1, 2, load), Duration::from_secs(7));
        assert_eq!(
            super::retry_after(hold, 0, 1, Duration::from_secs(600)),
            MAX_RETRY_AFTER
        );
        let stats = HoldStats::default();
        assert_eq!(stats.eta(0, 1, load), ASSUMED_HOLD + load);
        assert_eq!(stats.eta_behind_loads(1, load), (ASSUMED_HOLD + load) * 2);
    }

    #[test]
    fn scales_with_the_queue_ahead_and_the_slots() {
        let hold = Duration::from_secs(2);
        // 6 slots, 8 waiting: 9 releases needed at one per 1/3 s → 3 s.
        assert_eq!(
            retry_after(hold, 8, 6, Duration::ZERO),
            Duration::from_secs(3)
        );
        // Nobody ahead, one slot: one hold.
        assert_eq!(
            retry_after(hold, 0, 1, Duration::ZERO),
            Duration::from_secs(2)
        );
        // Rounded up, never zero.
        assert_eq!(
            retry_after(Duration::from_millis(10), 0, 8, Duration::ZERO),
            MIN_RETRY_AFTER
        );
        assert_eq!(
            retry_after(Duration::from_millis(1500), 0, 1, Duration::ZERO),
            Duration::from_secs(2)
        );
        // Clamped above.
        assert_eq!(
            retry_after(Duration::from_secs(30), 100, 1, Duration::ZERO),
            MAX_RETRY_AFTER
        );
        // Degenerate inputs do not panic.
        assert_eq!(
            retry_after(Duration::ZERO, 0, 0, Duration::ZERO),
            MIN_RETRY_AFTER
        );
        assert_eq!(
            retry_after(Duration::MAX, usize::MAX, 1, Duration::ZERO),
            MAX_RETRY_AFTER
        );
        assert_eq!(
            retry_after(hold, 3, usize::MAX, Duration::ZERO),
            MIN_RETRY_AFTER
        );
    }

    #[test]
    fn averages_observations() {
        let stats = HoldStats::default();
        assert_eq!(stats.typical(), None);
        assert_eq!(stats.retry_after(0, 1, Duration::ZERO), ASSUMED_HOLD);
        stats.record(Duration::from_secs(4));
        assert_eq!(stats.typical(), Some(Duration::from_secs(4)));
        stats.record(Duration::from_secs(14));
        // 4 + 0.2 × (14 − 4) = 6
        let typical = stats.typical().unwrap().as_secs_f64();
        assert!((typical - 6.0).abs() < 1e-9, "{typical}");
        stats.record(Duration::ZERO);
        assert!(stats.typical().unwrap() < Duration::from_secs(6));
    }
}
