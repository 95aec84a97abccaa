//! The ordering itself: [`best`] and [`ranked`] share one comparison, so they cannot disagree.

use std::cmp::Ordering;

use crate::Info;

/// Picks the host to try first for a new request, or [`None`] when no candidate is eligible.
///
/// `info` is called exactly once per candidate, in order. The rules (eligibility, the loaded
/// pass before the can-serve pass, score, then `queued`, then position) are described in the
/// [crate documentation](crate#rules); odd weights (`NaN`, `±∞`, zero, negative) are handled as
/// described under [`Info::score`] and never panic.
///
/// The result is always the first element of [`ranked`] for the same input, but `best` needs no
/// allocation.
///
/// # Example
///
/// ```
/// use slotgate_choose::{Info, best};
///
/// let up = Info {
///     healthy: true,
///     draining: false,
///     loaded: true,
///     can_serve: true,
///     free: 2,
///     queued: 0,
///     weight: 1.0,
/// };
/// // (name, free, queued, healthy)
/// let hosts = [("a", 2, 3, true), ("b", 2, 1, true), ("c", 9, 0, false)];
/// let pick = best(&hosts, |&(_, free, queued, healthy)| {
///     Some(Info { free, queued, healthy, ..up })
/// });
/// // "c" has the most free slots but is unhealthy; "a" and "b" tie on score and
/// // "b" has the shorter queue.
/// assert_eq!(pick.map(|h| h.0), Some("b"));
/// ```
pub fn best<'a, C>(candidates: &'a [C], mut info: impl FnMut(&C) -> Option<Info>) -> Option<&'a C> {
    let mut best: Option<(Key, &'a C)> = None;
    for (index, candidate) in candidates.iter().enumerate() {
        let Some(key) = info(candidate).and_then(|info| Key::new(index, &info)) else {
            continue;
        };
        if best
            .as_ref()
            .is_none_or(|(leader, _)| key.cmp(leader).is_lt())
        {
            best = Some((key, candidate));
        }
    }
    best.map(|(_, candidate)| candidate)
}

/// Every eligible host, best first: the order in which the gateway tries to join a host's
/// queue, falling through to the next one when a queue is full.
///
/// `info` is called exactly once per candidate, in order. Ineligible candidates are left out;
/// every eligible one appears exactly once. The first element is what [`best`] returns. The
/// rules are described in the [crate documentation](crate#rules); odd weights are handled as
/// described under [`Info::score`] and never panic.
///
/// # Example
///
/// ```
/// use slotgate_choose::{Info, ranked};
///
/// let base = Info {
///     healthy: true,
///     draining: false,
///     loaded: true,
///     can_serve: true,
///     free: 0,
///     queued: 0,
///     weight: 1.0,
/// };
/// let hosts = [
///     Info { free: 1, ..base },
///     Info { free: 4, loaded: false, ..base }, // cold: after every loaded host
///     Info { free: 2, ..base },
///     Info { free: 5, draining: true, ..base }, // draining: left out
/// ];
/// let order: Vec<usize> = ranked(&hosts, |h| Some(*h))
///     .into_iter()
///     .map(|h| h.free)
///     .collect();
/// assert_eq!(order, [2, 1, 4]);
/// ```
pub fn ranked<'a, C>(candidates: &'a [C], mut info: impl FnMut(&C) -> Option<Info>) -> Vec<&'a C> {
    let mut keyed: Vec<(Key, &'a C)> = candidates
        .iter()
        .enumerate()
        .filter_map(|(index, candidate)| {
            let key = Key::new(index, &info(candidate)?)?;
            Some((key, candidate))
        })
        .collect();
    // Keys are unique (they end with the index), so an unstable sort gives the same order as a
    // stable one without its allocation.
    keyed.sort_unstable_by(|(a, _), (b, _)| a.cmp(b));
    keyed.into_iter().map(|(_, candidate)| candidate).collect()
}

/// Which of the two passes a host belongs to; the derived order puts `Loaded` first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Pass {
    /// The model is resident.
    Loaded,
    /// The host can serve the model but has to load it first.
    CanServe,
}

/// Everything the order looks at, for one eligible candidate.
#[derive(Debug, Clone, Copy)]
struct Key {
    pass: Pass,
    /// Never NaN and never -0.0 (see [`Info::score`]), so `total_cmp` agrees with `>`.
    score: f64,
    queued: usize,
    index: usize,
}

impl Key {
    /// The key of an eligible candidate, `None` for an ineligible one.
    fn new(index: usize, info: &Info) -> Option<Self> {
        if !info.is_eligible() {
            return None;
        }
        let pass = if info.loaded {
            Pass::Loaded
        } else {
            Pass::CanServe
        };
        Some(Self {
            pass,
            score: info.score(),
            queued: info.queued,
            index,
        })
    }

    /// `Less` means `self` ranks ahead of `other`. Total, and never `Equal` for two different
    /// candidates because the index is the last tie-breaker.
    fn cmp(&self, other: &Self) -> Ordering {
        self.pass
            .cmp(&other.pass)
            // Reversed: the higher score ranks first.
            .then_with(|| other.score.total_cmp(&self.score))
            .then_with(|| self.queued.cmp(&other.queued))
            .then_with(|| self.index.cmp(&other.index))
    }
}
