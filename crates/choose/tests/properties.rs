//! Properties of `best` and `ranked` that must hold for every input, odd weights included.
//!
//! - `best` is `ranked().first()`.
//! - `ranked` holds exactly the eligible candidates, each once; so every result is eligible.
//! - No loaded host ranks behind a host that would have to load the model.
//! - `ranked` equals a reference model written straight from the rules in DESIGN.md (two
//!   passes, selection by `>` on the score, then the shorter queue, then position).
//! - The order does not depend on the order of the candidates except through the final
//!   tie-breaker: permuting them permutes only hosts that tie on everything else.
//! - Nothing panics, for any weight and any slot count.
//!
//! Candidates are `(id, Option<Info>)`, the id being the position in the generated list, so a
//! result can be traced back after the list is shuffled.

use proptest::prelude::*;
use slotgate_choose::{Info, best, ranked};

type Host = (usize, Option<Info>);

// === strategies ===

/// Mostly ordinary positive weights, with every kind of odd `f64` mixed in.
fn weight() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => 0.1_f64..10.0,
        // A few exact values, so that equal scores (and the queue tie-breaker) happen often.
        4 => prop::sample::select(vec![0.5, 1.0, 2.0]),
        1 => Just(0.0),
        1 => Just(-0.0),
        1 => -10.0_f64..0.0,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => any::<f64>(),
    ]
}

fn info_with(free: impl Strategy<Value = usize>) -> impl Strategy<Value = Info> {
    (
        prop::bool::weighted(0.85),
        prop::bool::weighted(0.15),
        prop::bool::weighted(0.6),
        prop::bool::weighted(0.7),
        free,
        0_usize..4,
        weight(),
    )
        .prop_map(
            |(healthy, draining, loaded, can_serve, free, queued, weight)| Info {
                healthy,
                draining,
                loaded,
                can_serve,
                free,
                queued,
                weight,
            },
        )
}

fn hosts_with(free: impl Strategy<Value = usize>) -> impl Strategy<Value = Vec<Host>> {
    prop::collection::vec(prop::option::weighted(0.9, info_with(free)), 0..12)
        .prop_map(|infos| infos.into_iter().enumerate().collect())
}

fn hosts() -> impl Strategy<Value = Vec<Host>> {
    hosts_with(0_usize..6)
}

// === helpers ===

/// Eligibility as DESIGN.md words it, written independently of `Info::is_eligible`.
fn eligible(info: Option<Info>) -> bool {
    info.is_some_and(|i| i.healthy && !i.draining && (i.loaded || i.can_serve))
}

fn ids(ranked: &[&Host]) -> Vec<usize> {
    ranked.iter().map(|h| h.0).collect()
}

/// What the order compares, for a ranked host: everything but its position.
fn key(host: &Host) -> (bool, u64, usize) {
    let info = host.1.expect("ranked hosts are known");
    (info.loaded, info.score().to_bits(), info.queued)
}

/// The rules of DESIGN.md executed literally: per pass, repeatedly take the host whose score
/// is greater (`>`), or equal with a shorter queue; the earlier one on a full tie.
#[allow(
    clippy::float_cmp,
    reason = "exact equality of scores is the rule under test"
)]
fn reference(hosts: &[Host]) -> Vec<usize> {
    // The documented weight rule, phrased on the weight rather than on the product.
    #[allow(clippy::cast_precision_loss, reason = "small slot counts")]
    let score = |i: &Info| {
        if i.weight.is_nan() || i.weight <= 0.0 || i.free == 0 {
            0.0
        } else {
            i.free as f64 * i.weight
        }
    };
    let mut out = Vec::new();
    for loaded_pass in [true, false] {
        let mut left: Vec<(usize, Info)> = hosts
            .iter()
            .filter(|(_, info)| eligible(*info))
            .filter_map(|(id, info)| info.map(|i| (*id, i)))
            .filter(|(_, i)| i.loaded == loaded_pass)
            .collect();
        while !left.is_empty() {
            let mut lead = 0;
            for j in 1..left.len() {
                let (sj, sl) = (score(&left[j].1), score(&left[lead].1));
                if sj > sl || (sj == sl && left[j].1.queued < left[lead].1.queued) {
                    lead = j;
                }
            }
            out.push(left.remove(lead).0);
        }
    }
    out
}

// === properties ===

proptest! {
    #[test]
    fn best_is_first_of_ranked(hosts in hosts()) {
        let first = ranked(&hosts, |h| h.1).first().copied();
        let chosen = best(&hosts, |h| h.1);
        prop_assert_eq!(chosen.map(|h| h.0), first.map(|h| h.0));
        // Same element, not merely an equal one.
        let same = match (chosen, first) {
            (Some(a), Some(b)) => std::ptr::eq(a, b),
            (None, None) => true,
            _ => false,
        };
        prop_assert!(same);
    }

    #[test]
    fn ranked_holds_exactly_the_eligible(hosts in hosts()) {
        let mut got = ids(&ranked(&hosts, |h| h.1));
        got.sort_unstable();
        let want: Vec<usize> =
            hosts.iter().filter(|h| eligible(h.1)).map(|h| h.0).collect();
        prop_assert_eq!(got, want);
        if let Some(chosen) = best(&hosts, |h| h.1) {
            prop_assert!(eligible(chosen.1));
        } else {
            prop_assert!(!hosts.iter().any(|h| eligible(h.1)));
        }
    }

    #[test]
    fn loaded_hosts_come_before_cold_ones(hosts in hosts()) {
        let order = ranked(&hosts, |h| h.1);
        let loaded: Vec<bool> = order.iter().map(|h| key(h).0).collect();
        // Once a cold host appears, no loaded host follows.
        let first_cold = loaded.iter().position(|l| !l).unwrap_or(loaded.len());
        prop_assert!(loaded[first_cold..].iter().all(|l| !l), "order: {:?}", loaded);
    }

    #[test]
    fn ranked_matches_the_reference_model(hosts in hosts()) {
        prop_assert_eq!(ids(&ranked(&hosts, |h| h.1)), reference(&hosts));
    }

    #[test]
    fn candidate_order_only_breaks_full_ties(
        (hosts, shuffled) in hosts().prop_flat_map(|h| (Just(h.clone()), Just(h).prop_shuffle()))
    ) {
        let a = ranked(&hosts, |h| h.1);
        let b = ranked(&shuffled, |h| h.1);
        let keys_a: Vec<_> = a.iter().map(|h| key(h)).collect();
        let keys_b: Vec<_> = b.iter().map(|h| key(h)).collect();
        // The sequence of keys never depends on the input order ...
        prop_assert_eq!(&keys_a, &keys_b);
        // ... and where no two hosts tie, neither does the sequence of hosts.
        let mut distinct = keys_a.clone();
        distinct.dedup();
        if distinct.len() == keys_a.len() {
            prop_assert_eq!(ids(&a), ids(&b));
        }
        // The winner is the same host whenever it is strictly ahead of the runner-up.
        if keys_a.len() < 2 || keys_a[0] != keys_a[1] {
            prop_assert_eq!(
                best(&hosts, |h| h.1).map(|h| h.0),
                best(&shuffled, |h| h.1).map(|h| h.0)
            );
        }
        // And on the permuted input the reference model agrees too.
        prop_assert_eq!(ids(&b), reference(&shuffled));
    }

    #[test]
    fn never_panics_for_any_weight_or_slot_count(hosts in hosts_with(any::<usize>())) {
        let order = ranked(&hosts, |h| h.1);
        let chosen = best(&hosts, |h| h.1);
        prop_assert_eq!(chosen.map(|h| h.0), order.first().map(|h| h.0));
        for h in order {
            let score = h.1.expect("ranked hosts are known").score();
            prop_assert!(score.is_sign_positive() && !score.is_nan(), "score {}", score);
        }
    }
}
