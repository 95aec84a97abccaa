//! Bucket counts of a timing that the gateway itself can read back: the status page's queue-wait
//! and first-byte percentiles.
//!
//! `prometheus-client` keeps its histogram buckets to itself (it only encodes them), so each
//! timing that the page shows is counted twice: into the Prometheus histogram for scrapers, and
//! here, into the same buckets, for the gateway. The counts only grow; a window is the difference
//! of two readings ([`Counts::since`]), which is how the status page gets "the last 5 minutes"
//! without keeping every observation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the buckets, in seconds: 5 ms to ~11 min (655.36 s) in ×2 steps. The
/// Prometheus histograms use the same bounds. One more bucket past the last bound counts
/// everything longer.
pub(crate) const BOUNDS: [f64; 18] = {
    let mut bounds = [0.0; 18];
    let mut i = 0;
    let mut bound = 0.005;
    while i < bounds.len() {
        bounds[i] = bound;
        bound *= 2.0;
        i += 1;
    }
    bounds
};

/// How many buckets: one per bound, and one for longer.
const BUCKETS: usize = BOUNDS.len() + 1;

/// The running bucket counts of one timing. Lock-free: recorded on the request path.
#[derive(Debug, Default)]
pub(crate) struct Recent {
    counts: [AtomicU64; BUCKETS],
}

/// One reading of a [`Recent`]: observations per bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Counts([u64; BUCKETS]);

impl Recent {
    /// Counts one observation.
    pub(crate) fn record(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        let bucket = BOUNDS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(BOUNDS.len());
        // Relaxed: a statistic; each bucket is one atomic add.
        self.counts[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub(crate) fn counts(&self) -> Counts {
        Counts(std::array::from_fn(|i| {
            self.counts[i].load(Ordering::Relaxed)
        }))
    }
}

impl Counts {
    /// The observations made after `earlier` was read (bucket by bucket; never negative).
    #[must_use]
    pub(crate) fn since(&self, earlier: &Counts) -> Counts {
        Counts(std::array::from_fn(|i| {
            self.0[i].saturating_sub(earlier.0[i])
        }))
    }

    /// How many observations.
    pub(crate) fn total(&self) -> u64 {
        self.0.iter().sum()
    }

    /// The `q` quantile (0..=1) in seconds, interpolated linearly inside its bucket the way
    /// Prometheus' `histogram_quantile` does; `None` without observations. Past the last bound
    /// the answer is that bound: "at least this long".
    pub(crate) fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.total();
        if total == 0 {
            return None;
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "observation counts are far below 2^53"
        )]
        let rank = q.clamp(0.0, 1.0) * total as f64;
        let mut below = 0_u64;
        for (i, &count) in self.0.iter().enumerate() {
            #[expect(
                clippy::cast_precision_loss,
                reason = "observation counts are far below 2^53"
            )]
            let (below_f, count_f) = (below as f64, count as f64);
            if count > 0 && below_f + count_f >= rank {
                let Some(&upper) = BOUNDS.get(i) else {
                    return Some(BOUNDS[BOUNDS.len() - 1]);
                };
                let lower = if i == 0 { 0.0 } else { BOUNDS[i - 1] };
                let within = ((rank - below_f) / count_f).clamp(0.0, 1.0);
                return Some(lower + (upper - lower) * within);
            }
            below += count;
        }
        Some(BOUNDS[BOUNDS.len() - 1])
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{BOUNDS, Counts, Recent};

    #[test]
    fn bounds_match_the_prometheus_buckets() {
        assert!((BOUNDS[0] - 0.005).abs() < 1e-12);
        assert!((BOUNDS[17] - 655.36).abs() < 1e-9);
    }

    #[test]
    fn quantiles_come_from_the_window_only() {
        let recent = Recent::default();
        assert_eq!(recent.counts().quantile(0.5), None);
        // Before the window: 10 long waits.
        for _ in 0..10 {
            recent.record(Duration::from_secs(100));
        }
        let start = recent.counts();
        // In the window: 98 quick ones (≤ 5 ms) and 2 of about 1 s.
        for _ in 0..98 {
            recent.record(Duration::from_millis(2));
        }
        for _ in 0..2 {
            recent.record(Duration::from_secs(1));
        }
        let window = recent.counts().since(&start);
        assert_eq!(window.total(), 100);
        let p50 = window.quantile(0.5).unwrap();
        assert!(p50 <= 0.005, "{p50}");
        let p99 = window.quantile(0.99).unwrap();
        // 1 s falls in the (0.64, 1.28] bucket.
        assert!(p99 > 0.64 && p99 <= 1.28, "{p99}");
        // Beyond the last bound: the last bound.
        recent.record(Duration::from_secs(10_000));
        let only_long = recent.counts().since(&recent.counts());
        assert_eq!(only_long, Counts::default());
        let all = recent.counts();
        assert!((all.quantile(1.0).unwrap() - BOUNDS[17]).abs() < 1e-9);
    }
}
