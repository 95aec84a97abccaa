//! The rule, one test per clause; a property that a request without a useful match keeps the
//! chooser's order exactly; and simulations of the two workloads of the cache-aware benchmark
//! (distinct prompts, one shared system prompt) over the whole pipeline: chain, index, rule.

use std::time::{Duration, Instant};

use proptest::prelude::*;

use crate::{
    Holdings, HostId, HostSet, Info, Limits, PrefixBuilder, Standing, Verdict, is_useful, prefer,
    ranked,
};

const IDLE: Standing = Standing {
    free: 2,
    queued: 0,
    loaded: true,
    wait: Duration::ZERO,
};

fn names(order: &[(&'static str, Standing)]) -> Vec<&'static str> {
    order.iter().map(|h| h.0).collect()
}

fn run(order: &mut [(&'static str, Standing)], holder: Option<usize>, saved: u64) -> Verdict {
    prefer(order, holder, 1, Duration::from_millis(saved), |h| h.1)
}

#[test]
fn no_holder_keeps_the_order() {
    let mut order = [("a", IDLE), ("b", IDLE), ("c", IDLE)];
    assert_eq!(run(&mut order, None, 0), Verdict::Miss);
    assert_eq!(run(&mut order, Some(7), 0), Verdict::Miss, "out of range");
    assert_eq!(names(&order), ["a", "b", "c"]);
}

#[test]
fn a_holder_with_room_goes_first_and_the_rest_keep_their_order() {
    let mut order = [
        ("a", IDLE),
        ("b", IDLE),
        ("c", Standing { free: 1, ..IDLE }),
    ];
    assert_eq!(run(&mut order, Some(2), 0), Verdict::Hit);
    assert_eq!(names(&order), ["c", "a", "b"]);
    let mut first = [("a", IDLE), ("b", IDLE)];
    assert_eq!(run(&mut first, Some(0), 0), Verdict::Hit);
    assert_eq!(names(&first), ["a", "b"]);
}

#[test]
fn a_full_holder_with_a_queue_loses_to_a_free_slot_whatever_it_saves() {
    let busy = Standing {
        free: 0,
        queued: 1,
        loaded: true,
        wait: Duration::from_millis(1),
    };
    let mut order = [("a", IDLE), ("b", busy)];
    assert_eq!(run(&mut order, Some(1), 60_000), Verdict::Overridden);
    assert_eq!(names(&order), ["a", "b"]);
}

#[test]
fn a_full_holder_without_a_queue_is_worth_its_wait_only_if_the_prefill_it_saves_is_longer() {
    let full = Standing {
        free: 0,
        queued: 0,
        loaded: true,
        wait: Duration::from_millis(500),
    };
    let mut order = [("a", IDLE), ("b", full)];
    assert_eq!(run(&mut order, Some(1), 400), Verdict::Overridden);
    assert_eq!(run(&mut order, Some(1), 500), Verdict::Hit);
    assert_eq!(names(&order), ["b", "a"]);
}

#[test]
fn when_nobody_has_room_the_waits_are_compared() {
    let wait = |ms| Standing {
        free: 0,
        queued: 2,
        loaded: true,
        wait: Duration::from_millis(ms),
    };
    let mut order = [("a", wait(1000)), ("b", wait(1500))];
    assert_eq!(run(&mut order, Some(1), 400), Verdict::Overridden);
    assert_eq!(run(&mut order, Some(1), 600), Verdict::Hit);
    assert_eq!(names(&order), ["b", "a"]);
}

#[test]
fn a_holder_whose_model_is_not_loaded_holds_no_cache() {
    let cold = Standing {
        loaded: false,
        ..IDLE
    };
    let mut order = [("a", IDLE), ("b", cold)];
    assert_eq!(run(&mut order, Some(1), 0), Verdict::Miss);
    // Among cold hosts only (nothing is loaded anywhere), it may still go first.
    let mut order = [("a", cold), ("b", cold)];
    assert_eq!(run(&mut order, Some(1), 0), Verdict::Hit);
}

#[test]
fn a_request_needing_several_slots_needs_them_free() {
    let one = Standing {
        free: 1,
        wait: Duration::from_secs(1),
        ..IDLE
    };
    let mut order = [("a", IDLE), ("b", one)];
    assert_eq!(
        prefer(&mut order, Some(1), 2, Duration::ZERO, |h| h.1),
        Verdict::Overridden
    );
}

#[test]
fn usefulness_needs_enough_text_and_no_divergence_unless_pinned() {
    let mut b = PrefixBuilder::new(4, 100, 0);
    b.message(b"0123456789");
    let prefix = b.finish();
    let longest = |elements, diverges| crate::Longest {
        hosts: HostSet::EMPTY,
        elements,
        diverges,
    };
    assert!(is_useful(&longest(2, false), &prefix, 8));
    assert!(!is_useful(&longest(1, false), &prefix, 8), "4 bytes < 8");
    assert!(!is_useful(&longest(3, true), &prefix, 8), "a shared prefix");
    let mut b = PrefixBuilder::new(4, 100, 0);
    b.pin(b"session");
    b.message(b"0123");
    let pinned = b.finish();
    assert!(is_useful(&longest(1, true), &pinned, 1000));
}

fn standing() -> impl Strategy<Value = Standing> {
    (0..4_usize, 0..4_usize, any::<bool>(), 0..5_000_u64).prop_map(|(free, queued, loaded, ms)| {
        Standing {
            free,
            queued,
            loaded,
            wait: Duration::from_millis(ms),
        }
    })
}

proptest! {
    /// Without a holder the order is exactly the chooser's; with one, only the holder moves,
    /// and only to the front.
    #[test]
    fn only_the_holder_moves(
        hosts in prop::collection::vec(standing(), 0..6),
        holder in prop::option::of(0..8_usize),
        need in 0..3_usize,
        saved in 0..5_000_u64,
    ) {
        let before: Vec<(usize, Standing)> = hosts.into_iter().enumerate().collect();
        let mut after = before.clone();
        let verdict = prefer(&mut after, holder, need, Duration::from_millis(saved), |h| h.1);
        let moved = match holder {
            Some(at) if at < before.len() && verdict == Verdict::Hit => Some(at),
            _ => None,
        };
        let mut want = before.clone();
        if let Some(at) = moved {
            let h = want.remove(at);
            want.insert(0, h);
        }
        prop_assert_eq!(after, want);
        if holder.is_none() {
            prop_assert_eq!(verdict, Verdict::Miss);
        }
    }
}

// === the two benchmark workloads, simulated ===

/// A host of the simulation: two slots, a queue.
#[derive(Debug, Clone, Copy, Default)]
struct Host {
    busy: usize,
    queued: usize,
    served: usize,
}

const SLOTS: usize = 2;
const BLOCK: usize = 512;
/// About the text of a 2,600-token system prompt.
const SYSTEM_BYTES: usize = 10_000;

/// What the simulation measured.
#[derive(Debug)]
struct Outcome {
    served: Vec<usize>,
    /// Of the later turns' prompt bytes, the share the chosen host held.
    cached_share: f64,
    /// Whether every first turn went where `ranked` put it.
    first_turns_ranked: bool,
}

/// Nine conversations, six turns each, on three hosts of two slots: in each round every
/// conversation sends its next turn, in order, holding its slot (or queueing) until the round
/// ends. `shared`: one system prompt for all; else one each.
fn simulate(shared: bool, affinity: bool) -> Outcome {
    let t = Instant::now();
    let limits = Limits {
        entries: 65_536,
        ttl: Duration::from_secs(600),
    };
    let mut index = Holdings::new(limits, t);
    let mut hosts = [Host::default(); 3];
    let ids: Vec<HostId> = (0..3).map(|n| HostId::new(n).unwrap()).collect();
    let (mut later, mut cached) = (0_usize, 0_usize);
    let mut first_turns_ranked = true;
    for turn in 0..6 {
        for h in &mut hosts {
            (h.busy, h.queued) = (0, 0);
        }
        for conv in 0..9 {
            let mut b = PrefixBuilder::new(BLOCK, 1024, 42);
            b.salt(b"model");
            let system = if shared { 0 } else { conv + 1 };
            b.message(&vec![b'a' + u8::try_from(system).unwrap(); SYSTEM_BYTES]);
            for t in 0..=turn {
                b.message(format!("user {conv} turn {t}: {}", "x".repeat(200)).as_bytes());
                if t < turn {
                    b.message(format!("assistant {conv} turn {t}: {}", "y".repeat(300)).as_bytes());
                }
            }
            let prefix = b.finish();
            let info = |&n: &usize| {
                let h: &Host = &hosts[n];
                Some(Info {
                    healthy: true,
                    draining: false,
                    loaded: true,
                    can_serve: true,
                    free: SLOTS.saturating_sub(h.busy),
                    queued: h.queued,
                    weight: 1.0,
                })
            };
            let candidates = [0_usize, 1, 2];
            let mut order: Vec<usize> = ranked(&candidates, info).into_iter().copied().collect();
            let chooser_first = order[0];
            let among: HostSet = ids.iter().copied().collect();
            let holder = index
                .longest(prefix.hashes(), among, t)
                .filter(|l| !affinity || is_useful(l, &prefix, BLOCK))
                .and_then(|l| order.iter().position(|&n| l.hosts.contains(ids[n])));
            let standing = |&n: &usize| {
                let h = &hosts[n];
                Standing {
                    free: SLOTS.saturating_sub(h.busy),
                    queued: h.queued,
                    loaded: true,
                    wait: Duration::from_millis(1000 * (h.queued as u64 + 1) / SLOTS as u64),
                }
            };
            prefer(&mut order, holder, 1, Duration::from_millis(800), standing);
            let chosen = order[0];
            if turn == 0 && chosen != chooser_first {
                first_turns_ranked = false;
            }
            let h = &mut hosts[chosen];
            if h.busy < SLOTS {
                h.busy += 1;
            } else {
                h.queued += 1;
            }
            h.served += 1;
            let prior = index.record(prefix.hashes(), ids[chosen], t);
            if turn > 0 {
                later += prefix.total_bytes();
                cached += prefix.bytes_through(prior.elements);
            }
        }
    }
    #[expect(clippy::cast_precision_loss, reason = "small counts")]
    let cached_share = cached as f64 / later as f64;
    Outcome {
        served: hosts.iter().map(|h| h.served).collect(),
        cached_share,
        first_turns_ranked,
    }
}

#[test]
fn distinct_prompts_stay_where_they_are_cached() {
    let outcome = simulate(false, true);
    assert!(outcome.cached_share > 0.95, "{outcome:?}");
    assert!(outcome.first_turns_ranked, "{outcome:?}");
}

#[test]
fn a_shared_system_prompt_does_not_pile_up_on_one_host() {
    let outcome = simulate(true, true);
    let total: usize = outcome.served.iter().sum();
    for &served in &outcome.served {
        assert!(served * 100 >= total * 15, "{outcome:?}");
    }
    // New conversations are placed by the chooser alone, later turns follow their cache.
    assert!(outcome.first_turns_ranked, "{outcome:?}");
    assert!(outcome.cached_share > 0.9, "{outcome:?}");
}

#[test]
fn a_naive_longest_match_would_pile_them_up() {
    // The control: the same pipeline without the usefulness rule sends new conversations to
    // the first host that saw the shared prompt while it has room.
    let outcome = simulate(true, false);
    assert!(!outcome.first_turns_ranked, "{outcome:?}");
}
