//! The places rule: examples of each rule, then properties over random sequences of arrivals,
//! ends, cancellations, probe answers and time.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use proptest::prelude::*;
use tokio::time::Instant;

use super::{Arrival, Places, Ticket};

fn name(model: &str) -> Arc<str> {
    Arc::from(model)
}

fn go(places: &mut Places, model: &str, now: Instant) {
    assert_eq!(
        places.arrive(&name(model), now),
        Arrival::Go,
        "{model} goes"
    );
}

fn wait(places: &mut Places, model: &str, now: Instant) -> Ticket {
    match places.arrive(&name(model), now) {
        Arrival::Wait(ticket) => ticket,
        Arrival::Go => panic!("{model} should wait"),
    }
}

const LONG: Duration = Duration::from_secs(3600);

#[test]
fn without_a_capacity_everything_goes() {
    let now = Instant::now();
    let mut places = Places::new(None, LONG);
    for model in ["a", "b", "c", "a"] {
        go(&mut places, model, now);
    }
    let mut zero = Places::new(Some(0), LONG);
    go(&mut zero, "a", now);
    go(&mut zero, "b", now);
}

#[test]
fn a_full_engine_holds_the_other_model_until_the_loaded_one_drains() {
    let now = Instant::now();
    let mut places = Places::new(Some(1), LONG);
    go(&mut places, "a", now);
    go(&mut places, "a", now);
    let b1 = wait(&mut places, "b", now);
    // Collating: a keeps going while b's waiter is young.
    go(&mut places, "a", now);
    let b2 = wait(&mut places, "b", now);
    assert_eq!(places.leave("a", now), vec![]);
    assert_eq!(places.leave("a", now), vec![]);
    // Never switch away from a model with a request admitted.
    assert!(places.is_resident("a"));
    assert_eq!(
        places.leave("a", now),
        vec![b1, b2],
        "both b waiters, one load"
    );
    assert!(places.is_resident("b") && !places.is_resident("a"));
}

#[test]
fn after_collate_for_the_loaded_model_is_closed() {
    let start = Instant::now();
    let mut places = Places::new(Some(1), Duration::from_secs(10));
    go(&mut places, "a", start);
    let b = wait(&mut places, "b", start);
    go(&mut places, "a", start + Duration::from_secs(9));
    let later = start + Duration::from_secs(10);
    let a_late = wait(&mut places, "a", later);
    assert_eq!(places.leave("a", later), vec![]);
    assert_eq!(places.leave("a", later), vec![b]);
    // Now b is loaded and a's waiter is young: b goes on, until a's waiter has waited 10 s.
    go(&mut places, "b", later + Duration::from_secs(9));
    let last = later + Duration::from_secs(10);
    let b_late = wait(&mut places, "b", last);
    assert_eq!(places.leave("b", last), vec![]);
    assert_eq!(places.leave("b", last), vec![a_late]);
    assert_eq!(places.leave("a", last), vec![b_late]);
}

#[test]
fn an_idle_model_gives_up_its_place_at_once_least_recently_used_first() {
    let now = Instant::now();
    let mut places = Places::new(Some(2), LONG);
    go(&mut places, "a", now);
    go(&mut places, "b", now);
    places.leave("a", now);
    places.leave("b", now);
    go(&mut places, "c", now);
    assert!(!places.is_resident("a"), "a was used least recently");
    assert!(places.is_resident("b") && places.is_resident("c"));
}

#[test]
fn cancelling_a_waiter_frees_nothing_but_its_turn() {
    let now = Instant::now();
    let mut places = Places::new(Some(1), LONG);
    go(&mut places, "a", now);
    let b = wait(&mut places, "b", now);
    let c = wait(&mut places, "c", now);
    assert_eq!(places.cancel(b, now), (true, vec![]));
    assert_eq!(places.cancel(b, now), (false, vec![]), "already gone");
    assert_eq!(places.leave("a", now), vec![c]);
}

#[test]
fn first_come_first_served_across_models() {
    let now = Instant::now();
    let mut places = Places::new(Some(1), LONG);
    go(&mut places, "a", now);
    let c = wait(&mut places, "c", now);
    let b = wait(&mut places, "b", now);
    let c2 = wait(&mut places, "c", now);
    assert_eq!(places.leave("a", now), vec![c, c2]);
    assert_eq!(places.leave("c", now), vec![]);
    assert_eq!(places.leave("c", now), vec![b]);
}

#[test]
fn probes_correct_what_the_gateway_believes() {
    let now = Instant::now();
    let mut places = Places::new(Some(1), LONG);
    // Loaded at start: the probe says so before any request.
    assert_eq!(places.observe(["a"], now), vec![]);
    go(&mut places, "a", now);
    let b = wait(&mut places, "b", now);
    // A probe that misses a's load keeps it resident while it has a request admitted.
    assert_eq!(places.observe([], now), vec![]);
    assert!(places.is_resident("a"));
    assert_eq!(places.leave("a", now), vec![b]);
    // Someone unloaded b behind the gateway's back, with nothing admitted there: c may go.
    places.leave("b", now);
    places.observe([], now);
    go(&mut places, "c", now);
    // The router's max_instances read again.
    let d = wait(&mut places, "d", now);
    assert_eq!(places.set_capacity(Some(2), now), vec![d]);
}

/// The burst of the issue: A B A B … 8 of each, at most 2 of a model running (the slot limit)
/// and the rest queued in slotgate; one place. Counts the loads.
fn interleaved_burst(collate_for: Duration) -> usize {
    let now = Instant::now();
    let mut places = Places::new(Some(1), collate_for);
    let mut loads = 0;
    let mut resident: BTreeSet<Arc<str>> = BTreeSet::new();
    let mut admitted: Vec<&str> = Vec::new();
    let mut waiting: Vec<(Ticket, &str)> = Vec::new();
    let mut count_loads = |places: &Places, loads: &mut usize| {
        for (model, place) in places.view() {
            if place.resident && resident.insert(Arc::clone(&model)) {
                *loads += 1;
            } else if !place.resident {
                resident.remove(&model);
            }
        }
    };
    for i in 0..16 {
        let model = if i % 2 == 0 { "a" } else { "b" };
        match places.arrive(&name(model), now) {
            Arrival::Go => admitted.push(model),
            Arrival::Wait(ticket) => waiting.push((ticket, model)),
        }
        count_loads(&places, &mut loads);
    }
    while let Some(model) = admitted.pop() {
        for ticket in places.leave(model, now) {
            let at = waiting.iter().position(|(t, _)| *t == ticket).unwrap();
            admitted.push(waiting.remove(at).1);
        }
        count_loads(&places, &mut loads);
    }
    assert!(waiting.is_empty(), "every request ran");
    loads
}

#[test]
fn the_interleaved_burst_costs_two_loads_when_collating() {
    assert_eq!(interleaved_burst(LONG), 2);
    // With no collation at all it still never thrashes per request: each switch takes every
    // waiter of the model.
    assert!(interleaved_burst(Duration::ZERO) <= 3);
}

#[derive(Debug, Clone)]
enum Op {
    Arrive(u8),
    Leave(usize),
    Cancel(usize),
    Elapse(u8),
    Observe(Vec<u8>),
    Capacity(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..4_u8).prop_map(Op::Arrive),
        3 => any::<usize>().prop_map(Op::Leave),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (0..20_u8).prop_map(Op::Elapse),
        1 => proptest::collection::vec(0..4_u8, 0..3).prop_map(Op::Observe),
        1 => (0..4_u8).prop_map(Op::Capacity),
    ]
}

const MODELS: [&str; 4] = ["a", "b", "c", "d"];

/// The state the caller keeps: admitted requests by model, and waiting tickets.
#[derive(Default)]
struct World {
    admitted: Vec<&'static str>,
    waiting: Vec<(Ticket, &'static str, Instant)>,
}

impl World {
    fn granted(&mut self, tickets: Vec<Ticket>) {
        for ticket in tickets {
            let at = self
                .waiting
                .iter()
                .position(|(t, _, _)| *t == ticket)
                .expect("only waiting tickets are granted");
            let (_, model, _) = self.waiting.remove(at);
            self.admitted.push(model);
        }
    }
}

fn check(places: &Places, world: &World, now: Instant, collate_for: Duration) {
    let view = places.view();
    // Never more places than the capacity... unless a probe showed more running.
    // A model with an admitted request holds its place (never given up while in use).
    for model in &world.admitted {
        assert!(
            places.is_resident(model),
            "{model} admitted but not resident"
        );
    }
    for model in MODELS {
        let admitted = world.admitted.iter().filter(|m| **m == model).count();
        let waiting = world.waiting.iter().filter(|(_, m, _)| *m == model).count();
        let place = view.get(model).copied();
        assert_eq!(
            place.map_or(0, |p| p.admitted),
            admitted,
            "{model} admitted"
        );
        assert_eq!(places.waiting(model), waiting, "{model} waiting");
    }
    // Work-conserving: nothing that may go is left waiting.
    let closed = world.waiting.iter().any(|(_, m, since)| {
        !places.is_resident(m) && now.saturating_duration_since(*since) >= collate_for
    });
    for (_, model, _) in &world.waiting {
        if places.is_resident(model) {
            assert!(closed, "{model} is resident, not closed, and waits");
        }
    }
    if let Some((_, oldest, _)) = world
        .waiting
        .iter()
        .find(|(_, m, _)| !places.is_resident(m))
        && let Some(capacity) = places.capacity()
    {
        let resident = view.values().filter(|p| p.resident).count();
        let idle = view.values().any(|p| p.resident && p.admitted == 0);
        assert!(
            resident >= capacity && !idle,
            "{oldest} waits though a place could be had"
        );
    }
}

proptest! {
    #[test]
    fn the_rule_holds_over_any_history(
        capacity in 1..4_usize,
        collate in 0..30_u64,
        ops in proptest::collection::vec(op(), 1..80),
    ) {
        let collate_for = Duration::from_secs(collate);
        let mut now = Instant::now();
        let mut places = Places::new(Some(capacity), collate_for);
        let mut world = World::default();
        // A lowered capacity evicts nothing (a place is given up only to a model that needs
        // it): the bound is the highest capacity in force so far.
        let mut highest = capacity;
        for op in ops {
            let before = places.view().values().filter(|p| p.resident).count();
            let probe = matches!(op, Op::Observe(_));
            match op {
                Op::Arrive(m) => {
                    let model = MODELS[usize::from(m)];
                    match places.arrive(&name(model), now) {
                        Arrival::Go => world.admitted.push(model),
                        Arrival::Wait(ticket) => world.waiting.push((ticket, model, now)),
                    }
                }
                Op::Leave(i) if !world.admitted.is_empty() => {
                    let model = world.admitted.remove(i % world.admitted.len());
                    let granted = places.leave(model, now);
                    world.granted(granted);
                }
                Op::Cancel(i) if !world.waiting.is_empty() => {
                    let (ticket, _, _) = world.waiting.remove(i % world.waiting.len());
                    let (was_waiting, granted) = places.cancel(ticket, now);
                    prop_assert!(was_waiting);
                    world.granted(granted);
                }
                Op::Elapse(s) => now += Duration::from_secs(u64::from(s)),
                Op::Observe(running) => {
                    let running: BTreeSet<&str> =
                        running.iter().map(|m| MODELS[usize::from(*m)]).collect();
                    let granted = places.observe(running, now);
                    world.granted(granted);
                }
                Op::Capacity(c) => {
                    highest = highest.max(usize::from(c) + capacity);
                    let granted = places.set_capacity(Some(usize::from(c) + capacity), now);
                    world.granted(granted);
                }
                Op::Leave(_) | Op::Cancel(_) => {}
            }
            check(&places, &world, now, collate_for);
            // Only a probe may show more models running than the capacity (someone else
            // loaded them); the gateway's own admissions never take a place beyond it.
            let resident = places.view().values().filter(|p| p.resident).count();
            if !probe {
                prop_assert!(
                    resident <= highest.max(before),
                    "{resident} resident > {highest} (and > {before} before)"
                );
            }
        }
        // Liveness: when every admitted request ends, every waiter is granted.
        while let Some(model) = world.admitted.pop() {
            let granted = places.leave(model, now);
            world.granted(granted);
        }
        prop_assert!(world.waiting.is_empty(), "{} still waiting", world.waiting.len());
    }
}
