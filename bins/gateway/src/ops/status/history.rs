//! The status page's memory: per (upstream, model) the last 5 minutes of in-flight and queued
//! counts, one sample a second, and readings of the timing buckets to take percentiles over the
//! same window; per model, readings of the refusal counters to count the last minute's.
//!
//! Everything is a [`Ring`] of fixed capacity, filled by one task
//! ([`sampler`](crate::ops::status::sampler)) and never by requests, so memory is bounded by the
//! number of configured keys, whatever the traffic. Keys that a reload removed are dropped at the
//! next sample.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use serde::Serialize;

use crate::metrics::recent::Counts;

/// How often the sampler samples.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// Samples kept per key: 5 minutes of one-second samples.
pub(crate) const SAMPLES: usize = 300;
/// Timing readings are kept every this many samples…
const READING_EVERY: u64 = 10;
/// …this many of them: a window of 5 minutes (30 intervals of 10 s, plus the start).
const READINGS: usize = 31;
/// Refusal-counter readings kept per model: one a second over a minute, plus the start.
const REFUSAL_READINGS: usize = 61;

/// A buffer that keeps the newest `capacity` items and forgets the oldest.
#[derive(Debug, Clone)]
pub(crate) struct Ring<T> {
    items: VecDeque<T>,
    capacity: usize,
}

impl<T> Ring<T> {
    /// An empty ring that holds at most `capacity` items (at least one).
    pub(crate) fn new(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Self {
            items: VecDeque::with_capacity(capacity),
            capacity,
        }
    }

    /// Adds `item`, forgetting the oldest one when full.
    pub(crate) fn push(&mut self, item: T) {
        if self.items.len() == self.capacity {
            self.items.pop_front();
        }
        self.items.push_back(item);
    }

    /// Oldest first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &T> {
        self.items.iter()
    }

    /// The oldest item kept.
    pub(crate) fn oldest(&self) -> Option<&T> {
        self.items.front()
    }

    /// The newest item.
    pub(crate) fn newest(&self) -> Option<&T> {
        self.items.back()
    }

    /// Whether nothing is kept yet.
    pub(crate) fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// One sample of one (upstream, model) key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) struct Load {
    /// The sample's number (see [`History::tick`]).
    pub(crate) tick: u64,
    /// Slots held.
    pub(crate) in_flight: usize,
    /// Requests waiting for a slot.
    pub(crate) queued: usize,
}

/// What the sampler read of one key: its counts and its timing buckets.
#[derive(Debug, Clone)]
pub(crate) struct KeySample {
    /// The upstream's name.
    pub(crate) upstream: String,
    /// The configured model.
    pub(crate) model: String,
    /// Slots held.
    pub(crate) in_flight: usize,
    /// Requests waiting.
    pub(crate) queued: usize,
    /// The queue-wait buckets now.
    pub(crate) queue_wait: Counts,
    /// The first-byte buckets now.
    pub(crate) first_byte: Counts,
}

/// A model's refusal counters (`slotgate_rejections_total`), read together.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub(crate) struct Refusals {
    /// `reason="queue_full"`.
    pub(crate) queue_full: u64,
    /// `reason="queue_timeout"`.
    pub(crate) queue_timeout: u64,
}

/// The timing buckets of one key at one sample.
#[derive(Debug, Clone, Copy)]
struct Timings {
    queue_wait: Counts,
    first_byte: Counts,
}

/// One key's history.
#[derive(Debug)]
pub(crate) struct KeyHistory {
    /// The last [`SAMPLES`] samples.
    pub(crate) load: Ring<Load>,
    readings: Ring<Timings>,
}

impl KeyHistory {
    fn new() -> Self {
        Self {
            load: Ring::new(SAMPLES),
            readings: Ring::new(READINGS),
        }
    }

    /// The queue-wait and first-byte observations of about the last 5 minutes: `now` less the
    /// oldest reading kept (everything so far while the gateway is younger than that).
    pub(crate) fn window(&self, queue_wait: &Counts, first_byte: &Counts) -> (Counts, Counts) {
        match self.readings.oldest() {
            Some(start) => (
                queue_wait.since(&start.queue_wait),
                first_byte.since(&start.first_byte),
            ),
            None => (Counts::default(), Counts::default()),
        }
    }
}

/// Everything the status page remembers.
#[derive(Debug)]
pub(crate) struct History {
    tick: u64,
    keys: HashMap<(String, String), KeyHistory>,
    refusals: HashMap<String, Ring<Refusals>>,
}

impl Default for History {
    fn default() -> Self {
        Self::new()
    }
}

impl History {
    /// Empty.
    pub(crate) fn new() -> Self {
        Self {
            tick: 0,
            keys: HashMap::new(),
            refusals: HashMap::new(),
        }
    }

    /// The number of the newest sample: 0 before the first, then +1 per sample.
    pub(crate) fn tick(&self) -> u64 {
        self.tick
    }

    /// Records one round of samples: every configured key, and every model's refusal counters.
    /// Keys and models missing from the round (removed by a reload) are forgotten.
    pub(crate) fn record(
        &mut self,
        keys: impl IntoIterator<Item = KeySample>,
        refusals: impl IntoIterator<Item = (String, Refusals)>,
    ) {
        self.tick += 1;
        let tick = self.tick;
        let mut kept = HashMap::with_capacity(self.keys.len());
        for sample in keys {
            let id = (sample.upstream, sample.model);
            let mut history = self.keys.remove(&id).unwrap_or_else(KeyHistory::new);
            history.load.push(Load {
                tick,
                in_flight: sample.in_flight,
                queued: sample.queued,
            });
            if history.readings.is_empty() || tick.is_multiple_of(READING_EVERY) {
                history.readings.push(Timings {
                    queue_wait: sample.queue_wait,
                    first_byte: sample.first_byte,
                });
            }
            kept.insert(id, history);
        }
        self.keys = kept;
        let mut kept = HashMap::with_capacity(self.refusals.len());
        for (model, counts) in refusals {
            let mut ring = self
                .refusals
                .remove(&model)
                .unwrap_or_else(|| Ring::new(REFUSAL_READINGS));
            ring.push(counts);
            kept.insert(model, ring);
        }
        self.refusals = kept;
    }

    /// One key's history, once sampled.
    pub(crate) fn key(&self, upstream: &str, model: &str) -> Option<&KeyHistory> {
        self.keys.get(&(upstream.to_owned(), model.to_owned()))
    }

    /// A model's refusals over about the last minute (since the gateway started, when younger).
    pub(crate) fn refusals_last_minute(&self, model: &str) -> Refusals {
        let Some(ring) = self.refusals.get(model) else {
            return Refusals::default();
        };
        match (ring.oldest(), ring.newest()) {
            (Some(old), Some(new)) => Refusals {
                queue_full: new.queue_full.saturating_sub(old.queue_full),
                queue_timeout: new.queue_timeout.saturating_sub(old.queue_timeout),
            },
            _ => Refusals::default(),
        }
    }

    /// How many samples are kept over all keys, and how many timing and refusal readings: what
    /// bounds this structure's memory.
    #[cfg(test)]
    fn kept(&self) -> (usize, usize, usize) {
        (
            self.keys.values().map(|k| k.load.iter().count()).sum(),
            self.keys.values().map(|k| k.readings.iter().count()).sum(),
            self.refusals.values().map(|r| r.iter().count()).sum(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{History, KeySample, READINGS, REFUSAL_READINGS, Refusals, Ring, SAMPLES};
    use crate::metrics::recent::Counts;

    fn sample(upstream: &str, model: &str, in_flight: usize) -> KeySample {
        KeySample {
            upstream: upstream.to_owned(),
            model: model.to_owned(),
            in_flight,
            queued: in_flight / 2,
            queue_wait: Counts::default(),
            first_byte: Counts::default(),
        }
    }

    #[test]
    fn a_ring_keeps_only_the_newest() {
        let mut ring = Ring::new(3);
        for i in 0..10 {
            ring.push(i);
            assert!(ring.iter().count() <= 3);
        }
        assert_eq!(ring.iter().copied().collect::<Vec<_>>(), [7, 8, 9]);
        assert_eq!(ring.oldest(), Some(&7));
        assert_eq!(ring.newest(), Some(&9));
        // A zero capacity still keeps the newest item rather than panicking.
        let mut one = Ring::new(0);
        one.push('a');
        one.push('b');
        assert_eq!(one.iter().copied().collect::<Vec<_>>(), ['b']);
    }

    #[test]
    fn history_is_bounded_however_long_it_runs() {
        let mut history = History::new();
        let rounds = 10 * SAMPLES;
        for i in 0..rounds {
            history.record(
                [sample("a", "m", i), sample("b", "m", i)],
                [(
                    "m".to_owned(),
                    Refusals {
                        queue_full: i as u64,
                        queue_timeout: 0,
                    },
                )],
            );
        }
        assert_eq!(history.tick(), rounds as u64);
        let (samples, readings, refusals) = history.kept();
        assert_eq!(samples, 2 * SAMPLES);
        assert_eq!(readings, 2 * READINGS);
        assert_eq!(refusals, REFUSAL_READINGS);
        // The newest samples, in order.
        let a = history.key("a", "m").unwrap();
        let last = a.load.newest().unwrap();
        assert_eq!((last.tick, last.in_flight), (rounds as u64, rounds - 1));
        assert_eq!(a.load.oldest().unwrap().tick, (rounds - SAMPLES + 1) as u64);
        // 60 rounds apart, one refusal each: 60 in the last minute.
        assert_eq!(history.refusals_last_minute("m").queue_full, 60);
        assert_eq!(history.refusals_last_minute("gone"), Refusals::default());
    }

    #[test]
    fn keys_a_reload_removed_are_forgotten() {
        let mut history = History::new();
        history.record([sample("a", "m", 1), sample("b", "m", 1)], []);
        history.record([sample("a", "m", 2)], []);
        assert!(history.key("b", "m").is_none());
        assert_eq!(history.key("a", "m").unwrap().load.iter().count(), 2);
    }
}
