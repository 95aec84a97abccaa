//! One test per rule. The properties that must hold for every input are in `tests/properties.rs`.

use std::cell::Cell;

use crate::{Info, best, ranked};

/// A healthy, loaded host with one free slot and weight 1: tests change one field at a time.
const UP: Info = Info {
    healthy: true,
    draining: false,
    loaded: true,
    can_serve: true,
    free: 1,
    queued: 0,
    weight: 1.0,
};

/// Names of the ranked hosts, using the candidate index as its name.
fn order(hosts: &[Option<Info>]) -> Vec<usize> {
    ranked(hosts, |h| *h)
        .into_iter()
        .map(|h| index_of(hosts, h))
        .collect()
}

fn pick(hosts: &[Option<Info>]) -> Option<usize> {
    best(hosts, |h| *h).map(|h| index_of(hosts, h))
}

/// Position of a result in the candidate slice: identity, not equality, since ties are equal.
fn index_of<T>(hosts: &[T], h: &T) -> usize {
    hosts
        .iter()
        .position(|c| std::ptr::eq(c, h))
        .expect("the result borrows from the candidates")
}

// === eligibility ===

#[test]
fn no_candidates_no_choice() {
    assert_eq!(pick(&[]), None);
    assert!(order(&[]).is_empty());
}

#[test]
fn unknown_host_is_never_chosen() {
    let hosts = [None, Some(UP)];
    assert_eq!(pick(&hosts), Some(1));
    assert_eq!(order(&hosts), [1]);
    assert_eq!(pick(&[None]), None);
}

#[test]
fn unhealthy_host_is_never_chosen() {
    let hosts = [
        Some(Info {
            healthy: false,
            free: 9,
            ..UP
        }),
        Some(UP),
    ];
    assert_eq!(order(&hosts), [1]);
}

#[test]
fn draining_host_is_never_chosen() {
    let hosts = [
        Some(Info {
            draining: true,
            free: 9,
            ..UP
        }),
        Some(UP),
    ];
    assert_eq!(order(&hosts), [1]);
}

#[test]
fn host_that_cannot_serve_the_model_is_never_chosen() {
    let hosts = [
        Some(Info {
            loaded: false,
            can_serve: false,
            free: 9,
            ..UP
        }),
        Some(UP),
    ];
    assert_eq!(order(&hosts), [1]);
}

#[test]
fn loaded_host_is_eligible_even_if_not_marked_can_serve() {
    let hosts = [Some(Info {
        can_serve: false,
        ..UP
    })];
    assert_eq!(pick(&hosts), Some(0));
}

#[test]
fn full_host_is_still_eligible() {
    let hosts = [Some(Info {
        free: 0,
        queued: 5,
        ..UP
    })];
    assert_eq!(pick(&hosts), Some(0));
    assert_eq!(order(&hosts), [0]);
}

// === passes ===

#[test]
fn loaded_host_beats_cold_host_with_more_free_slots() {
    let cold = Info {
        loaded: false,
        free: 100,
        weight: 10.0,
        ..UP
    };
    let full = Info {
        free: 0,
        queued: 7,
        ..UP
    };
    let hosts = [Some(cold), Some(full)];
    assert_eq!(order(&hosts), [1, 0]);
}

#[test]
fn cold_hosts_are_ranked_among_themselves_by_score() {
    let cold = Info {
        loaded: false,
        ..UP
    };
    let hosts = [
        Some(Info { free: 1, ..cold }),
        Some(Info { free: 3, ..cold }),
        Some(UP),
    ];
    assert_eq!(order(&hosts), [2, 1, 0]);
}

// === score and tie-breakers ===

#[test]
fn more_free_slots_win() {
    let hosts = [Some(Info { free: 1, ..UP }), Some(Info { free: 2, ..UP })];
    assert_eq!(order(&hosts), [1, 0]);
}

#[test]
fn weight_multiplies_free_slots() {
    // 2 × 3.0 = 6 beats 5 × 1.0 = 5.
    let hosts = [
        Some(Info { free: 5, ..UP }),
        Some(Info {
            free: 2,
            weight: 3.0,
            ..UP
        }),
    ];
    assert_eq!(order(&hosts), [1, 0]);
}

#[test]
fn equal_score_shorter_queue_wins() {
    // 4 × 1.0 and 2 × 2.0 score the same; the queue decides.
    let hosts = [
        Some(Info {
            free: 4,
            queued: 2,
            ..UP
        }),
        Some(Info {
            free: 2,
            weight: 2.0,
            queued: 1,
            ..UP
        }),
    ];
    assert_eq!(order(&hosts), [1, 0]);
}

#[test]
fn queue_only_breaks_ties_it_does_not_beat_score() {
    let hosts = [
        Some(Info {
            free: 1,
            queued: 0,
            ..UP
        }),
        Some(Info {
            free: 2,
            queued: 9,
            ..UP
        }),
    ];
    assert_eq!(order(&hosts), [1, 0]);
}

#[test]
fn full_tie_keeps_candidate_order() {
    let hosts = [Some(UP), Some(UP), Some(UP)];
    assert_eq!(pick(&hosts), Some(0));
    assert_eq!(order(&hosts), [0, 1, 2]);
}

#[test]
fn best_is_first_of_ranked() {
    let hosts = [
        Some(Info { free: 2, ..UP }),
        None,
        Some(Info {
            free: 2,
            queued: 1,
            ..UP
        }),
        Some(Info {
            free: 7,
            loaded: false,
            ..UP
        }),
    ];
    assert_eq!(order(&hosts), [0, 2, 3]);
    assert_eq!(pick(&hosts), Some(0));
}

#[test]
fn info_is_called_once_per_candidate_in_order() {
    let hosts = [Some(UP), None, Some(UP), Some(UP)];
    let seen = Cell::new(Vec::new());
    let record = |h: &Option<Info>| {
        let mut s = seen.take();
        s.push(index_of(&hosts, h));
        seen.set(s);
        *h
    };
    let _ = best(&hosts, record);
    assert_eq!(seen.take(), [0, 1, 2, 3]);
    let _ = ranked(&hosts, record);
    assert_eq!(seen.take(), [0, 1, 2, 3]);
}

// === odd weights ===

#[test]
fn score_table() {
    let with = |free, weight| Info { free, weight, ..UP }.score();
    assert_eq!(with(3, 2.0).to_bits(), 6.0_f64.to_bits());
    assert_eq!(with(3, f64::INFINITY).to_bits(), f64::INFINITY.to_bits());
    for weight in [
        0.0,
        -0.0,
        -1.0,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::MIN,
    ] {
        // to_bits: +0.0 exactly, not -0.0 and not NaN.
        assert_eq!(
            with(3, weight).to_bits(),
            0.0_f64.to_bits(),
            "weight {weight}"
        );
    }
    for weight in [1.0, f64::INFINITY, f64::NAN, -1.0, 0.0] {
        assert_eq!(
            with(0, weight).to_bits(),
            0.0_f64.to_bits(),
            "weight {weight}"
        );
    }
}

#[test]
fn nan_weight_stays_eligible_but_ranks_behind_positive_scores() {
    let nan = Info {
        free: 9,
        weight: f64::NAN,
        ..UP
    };
    let hosts = [Some(nan), Some(UP)];
    assert_eq!(order(&hosts), [1, 0]);
    assert_eq!(pick(&[Some(nan)]), Some(0));
}

#[test]
fn zero_and_negative_weights_rank_like_a_full_host() {
    let full = Info {
        free: 0,
        queued: 3,
        ..UP
    };
    let zero = Info {
        free: 5,
        weight: 0.0,
        queued: 1,
        ..UP
    };
    let negative = Info {
        free: 5,
        weight: -2.0,
        queued: 2,
        ..UP
    };
    // All three score 0: the shorter queue wins, and any positive score beats them all.
    let hosts = [Some(full), Some(negative), Some(zero), Some(UP)];
    assert_eq!(order(&hosts), [3, 2, 1, 0]);
}

#[test]
fn infinite_weight_wins_only_when_it_has_a_free_slot() {
    let inf = Info {
        weight: f64::INFINITY,
        ..UP
    };
    let huge = Info {
        free: 1_000_000,
        weight: f64::MAX,
        ..UP
    };
    let hosts = [Some(huge), Some(Info { queued: 1, ..inf }), Some(inf)];
    // f64::MAX × 1e6 overflows to +∞ as well, so all three tie on score: the queue splits
    // host 1 from the others, and position splits hosts 0 and 2.
    assert_eq!(order(&hosts), [0, 2, 1]);

    let full_inf = Info { free: 0, ..inf };
    let hosts = [Some(full_inf), Some(UP)];
    assert_eq!(order(&hosts), [1, 0]);
}
