//! The index: one test per rule, then properties against a reference model (an unbounded map
//! with the same expiry): bounds never exceeded, nothing expired reported, and the longest
//! match equal to the model's while nothing was evicted for room (never longer after).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::{Holdings, HostId, HostSet, Limits, Longest, Prior, Stamp};

fn host(n: usize) -> HostId {
    HostId::new(n).unwrap()
}

fn all() -> HostSet {
    (0..4).map(host).collect()
}

const LIMITS: Limits = Limits {
    entries: 1000,
    ttl: Duration::from_secs(60),
};

#[test]
fn host_ids_stop_at_max_hosts() {
    assert_eq!(HostId::new(63).map(HostId::index), Some(63));
    assert!(HostId::new(64).is_none());
    assert!(HostId::new(usize::MAX).is_none());
    let set: HostSet = [host(0), host(63)].into_iter().collect();
    assert!(set.contains(host(63)) && !set.contains(host(1)));
}

#[test]
fn the_longest_prefix_and_who_holds_it() {
    let t = Instant::now();
    let mut index = Holdings::new(LIMITS, t);
    assert_eq!(index.longest(&[1, 2, 3], all(), t), None);
    assert_eq!(index.record(&[1, 2], host(0), t), Prior::default());
    index.record(&[1, 2, 3, 4], host(1), t);
    let longest = index.longest(&[1, 2, 3, 4, 5], all(), t).unwrap();
    assert_eq!(longest.elements, 4);
    assert_eq!(longest.hosts, [host(1)].into_iter().collect());
    // Per host: ask about that host alone.
    let only_0 = [host(0)].into_iter().collect();
    assert_eq!(
        index.longest(&[1, 2, 3, 4, 5], only_0, t).unwrap().elements,
        2
    );
    // A host not asked about does not count.
    assert_eq!(
        index.longest(&[1, 2], [host(2)].into_iter().collect(), t),
        None
    );
    // Both hold the first two.
    let both = index.longest(&[1, 2, 9], all(), t).unwrap();
    assert_eq!(
        (both.elements, both.hosts),
        (2, [host(0), host(1)].into_iter().collect())
    );
}

#[test]
fn record_says_what_the_host_held_before() {
    let t = Instant::now();
    let mut index = Holdings::new(LIMITS, t);
    index.record(&[1, 2, 3], host(0), t);
    let later = t + Duration::from_secs(5);
    let prior = index.record(&[1, 2, 3, 4], host(0), later);
    assert_eq!(prior.elements, 3);
    assert_eq!(prior.stamp, Some(Stamp(0)));
    assert_eq!(index.record(&[1, 2, 3, 4], host(1), later).elements, 0);
}

#[test]
fn a_conversation_goes_on_and_a_shared_prefix_diverges() {
    let t = Instant::now();
    let mut index = Holdings::new(LIMITS, t);
    // One conversation: system prompt (1, 2), then its own message 3.
    index.record(&[1, 2, 3], host(0), t);
    let next_turn = index.longest(&[1, 2, 3, 4, 5], all(), t).unwrap();
    assert_eq!(next_turn.elements, 3);
    assert!(!next_turn.diverges, "its own history, going on");
    // Another conversation with the same system prompt parts from it after element 2.
    let other = index.longest(&[1, 2, 7], all(), t).unwrap();
    assert_eq!(other.elements, 2);
    assert!(other.diverges);
    // A request that stops where recorded prompts went on is a shared prefix too.
    assert!(index.longest(&[1, 2], all(), t).unwrap().diverges);
    // Once two successors were recorded, the element stays forked.
    index.record(&[1, 2, 7], host(1), t);
    assert!(index.longest(&[1, 2, 3 + 100], all(), t).unwrap().diverges);
    // The first conversation's later turn still matches its own part, undiverged.
    let own = index.longest(&[1, 2, 3, 4], all(), t).unwrap();
    assert_eq!((own.elements, own.diverges), (3, false));
}

#[test]
fn entries_expire_after_ttl_and_refresh_when_sent_again() {
    let t = Instant::now();
    let mut index = Holdings::new(LIMITS, t);
    index.record(&[1, 2], host(0), t);
    let almost = t + Duration::from_secs(59);
    assert!(index.longest(&[1, 2], all(), almost).is_some());
    index.record(&[1], host(1), almost);
    let expired = t + Duration::from_secs(60);
    let longest = index.longest(&[1, 2], all(), expired).unwrap();
    assert_eq!(
        longest.elements, 1,
        "element 2 expired, element 1 was refreshed"
    );
    assert!(
        index
            .longest(&[1, 2], all(), t + Duration::from_secs(200))
            .is_none()
    );
    // An expired entry starts afresh: it claims nothing about the host that held it before.
    let prior = index.record(&[1, 2], host(0), t + Duration::from_secs(200));
    assert_eq!(prior, Prior::default());
}

#[test]
fn memory_shrinks_once_traffic_stops() {
    let t = Instant::now();
    let mut index = Holdings::new(LIMITS, t);
    index.record(&[1, 2, 3, 4], host(0), t);
    assert_eq!(index.len(), 4);
    // Two lifetimes later, one request: everything old is gone.
    index.record(&[9], host(0), t + Duration::from_secs(61));
    index.record(&[9], host(0), t + Duration::from_secs(122));
    assert_eq!(index.len(), 1);
}

#[test]
fn the_oldest_generation_goes_when_full() {
    let t = Instant::now();
    let mut index = Holdings::new(
        Limits {
            entries: 4,
            ttl: Duration::from_secs(60),
        },
        t,
    );
    index.record(&[1, 2], host(0), t);
    index.record(&[3, 4], host(0), t);
    // 1 is used again: moved into the current generation, it outlives 2.
    index.record(&[1], host(0), t);
    index.record(&[5, 6], host(0), t);
    assert!(index.len() <= 4);
    assert!(index.longest(&[1], all(), t).is_some());
    assert!(index.longest(&[2], all(), t).is_none());
}

#[test]
fn forgetting_a_host() {
    let t = Instant::now();
    let mut index = Holdings::new(LIMITS, t);
    index.record(&[1, 2], host(0), t);
    index.record(&[1, 2], host(1), t);
    let later = t + Duration::from_secs(10);
    index.record(&[5, 6], host(0), later);
    // What host 0 was sent until second 0 goes; what it was sent later stays.
    index.forget_until(host(0), Stamp(0));
    let longest = index.longest(&[1, 2], all(), later).unwrap();
    assert_eq!(longest.hosts, [host(1)].into_iter().collect());
    assert!(index.longest(&[5, 6], all(), later).is_some());
    index.forget(host(0));
    assert!(index.longest(&[5, 6], all(), later).is_none());
    assert_eq!(index.len(), 2, "entries no host holds are dropped");
    // Trimming: host 1 keeps the first element only.
    index.trim(&[1, 2], host(1), 1);
    assert_eq!(index.longest(&[1, 2], all(), later).unwrap().elements, 1);
}

// === properties ===

/// The reference: an unbounded map with the same expiry and bookkeeping.
#[derive(Debug, Default)]
struct Model {
    entries: HashMap<u64, (u64, u32, u64, bool)>, // hosts, stamp, next, forked
}

const TTL: u32 = 5;

impl Model {
    fn live(&self, hash: u64, now: u32) -> Option<&(u64, u32, u64, bool)> {
        self.entries
            .get(&hash)
            .filter(|e| now.saturating_sub(e.1) < TTL)
    }

    fn record(&mut self, chain: &[u64], host: HostId, now: u32) {
        for (k, &hash) in chain.iter().enumerate() {
            let entry = self.entries.entry(hash).or_insert((0, now, 0, false));
            if now.saturating_sub(entry.1) >= TTL {
                *entry = (0, now, 0, false);
            }
            entry.0 |= 1 << host.index();
            entry.1 = now;
            if let Some(&next) = chain.get(k + 1) {
                if entry.2 != 0 && entry.2 != next {
                    entry.3 = true;
                }
                entry.2 = next;
            }
        }
    }

    fn forget(&mut self, host: HostId) {
        self.entries.retain(|_, e| {
            e.0 &= !(1 << host.index());
            e.0 != 0
        });
    }

    fn longest(&self, chain: &[u64], now: u32) -> Option<Longest> {
        (1..=chain.len()).rev().find_map(|n| {
            let &(hosts, _, next, forked) = self.live(chain[n - 1], now)?;
            if hosts == 0 {
                return None;
            }
            let diverges = forked
                || match chain.get(n) {
                    Some(&x) => next != 0 && next != x,
                    None => next != 0,
                };
            Some(Longest {
                hosts: HostSet(hosts),
                elements: n,
                diverges,
            })
        })
    }
}

#[derive(Debug, Clone)]
enum Op {
    Record(Vec<u64>, usize),
    Look(Vec<u64>),
    Forget(usize),
    Wait(u32),
}

fn chain() -> impl Strategy<Value = Vec<u64>> {
    // Few distinct values, so that chains share prefixes and fork.
    prop::collection::vec(1..6_u64, 1..6).prop_map(|steps| {
        // Make element k stand for the whole prefix, as a real chain does.
        let mut acc = 0_u64;
        steps
            .into_iter()
            .map(|s| {
                acc = acc.wrapping_mul(31).wrapping_add(s);
                acc.max(1)
            })
            .collect()
    })
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            4 => (chain(), 0..4_usize).prop_map(|(c, h)| Op::Record(c, h)),
            4 => chain().prop_map(Op::Look),
            1 => (0..4_usize).prop_map(Op::Forget),
            2 => (0..4_u32).prop_map(Op::Wait),
        ],
        1..60,
    )
}

/// Runs `ops` on an index with room for `entries`, checking after each step; returns whether
/// the index ever dropped an entry for room (its matches may be shorter than the model's).
fn run(ops: &[Op], entries: usize) -> Result<(), TestCaseError> {
    let start = Instant::now();
    let limits = Limits {
        entries,
        ttl: Duration::from_secs(u64::from(TTL)),
    };
    let mut index = Holdings::new(limits, start);
    let mut model = Model::default();
    let mut now = 0_u32;
    // Room enough that nothing is ever evicted: every element of every chain fits.
    let roomy = entries >= 2 * 60 * 6;
    for op in ops {
        let at = start + Duration::from_secs(u64::from(now));
        match op {
            Op::Record(chain, h) => {
                index.record(chain, host(*h), at);
                model.record(chain, host(*h), now);
            }
            Op::Look(chain) => {
                let got = index.longest(chain, all(), at);
                let want = model.longest(chain, now);
                if roomy {
                    prop_assert_eq!(got, want);
                } else if let Some(got) = got {
                    // Never claims more than the model.
                    let want = want.expect("the index holds nothing the model does not");
                    prop_assert!(got.elements <= want.elements);
                    if got.elements == want.elements {
                        prop_assert_eq!(got.hosts.intersection(want.hosts), got.hosts);
                    }
                }
                // Per host: the longest for one host is never above the longest for all.
                for h in 0..4 {
                    let one = index.longest(chain, [host(h)].into_iter().collect(), at);
                    let any = index.longest(chain, all(), at);
                    prop_assert!(one.map_or(0, |l| l.elements) <= any.map_or(0, |l| l.elements));
                }
            }
            Op::Forget(h) => {
                index.forget(host(*h));
                model.forget(host(*h));
            }
            Op::Wait(secs) => now += secs,
        }
        prop_assert!(index.len() <= entries.max(2), "{} > {entries}", index.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn longest_match_equals_the_model_with_room(ops in ops()) {
        run(&ops, 10_000)?;
    }

    #[test]
    fn bounds_hold_and_nothing_is_invented_when_tight(ops in ops(), entries in 0..12_usize) {
        run(&ops, entries)?;
    }
}
