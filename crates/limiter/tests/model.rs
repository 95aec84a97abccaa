//! A proptest state-machine test of the limiter against a reference model.
//!
//! Random sequences of configure, acquire, try-acquire (each of weight 1 to 3), cancel, release
//! and remove over three keys (two hosts) are applied both to a plain reference model and to the
//! real limiter, whose futures are polled by hand with counting wakers so runs are
//! deterministic and shrink well. After every step the test checks, per key:
//!
//! - `QueueFull` / `TooHeavy` / `Closed` / an immediate grant exactly when the model says so;
//! - grant order: exactly the waiters the model granted are ready, each was woken, and no other
//!   waiter is ready (FIFO by units: a heavy head is never overtaken);
//! - waiters refused as too heavy after a shrink: exactly those the model refused;
//! - `in_flight` (units), `reserved`, `queued` and `free_slots(host)` equal the model's;
//! - invariants: a waiter exists only when the head's weight does not fit;
//! - the host cap of `h1` (set now and then, before or after its keys exist): its reading
//!   (limit, units in flight, units set aside, models in line) equals the model's, it counts
//!   exactly the permits taken under it, and it is work-conserving: a key whose head fits its
//!   own limit is in line for the cap, and the front of that line does not fit the cap.
//!
//! At the end every permit and waiter is dropped and every key must read zero in flight.
#![cfg(not(loom))]

use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use slotgate_limiter::{Acquire, AcquireError, Limiter, Permit, TryAcquireError};

const KEYS: [(&str, &str); 3] = [("h1", "a"), ("h1", "b"), ("h2", "a")];

// ===== the reference model =====

include!("model/reference.rs");

// ===== the system under test =====

#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

struct Waiter {
    fut: Acquire,
    wakes: Arc<CountingWaker>,
}

impl Waiter {
    fn poll(&mut self) -> Poll<Result<Permit, AcquireError>> {
        let waker = Waker::from(self.wakes.clone());
        Pin::new(&mut self.fut).poll(&mut Context::from_waker(&waker))
    }
}

struct Sut {
    limiter: Limiter,
    permits: BTreeMap<u64, Permit>,
    waiters: BTreeMap<u64, Waiter>,
}

struct LimiterTest;

impl StateMachineTest for LimiterTest {
    type SystemUnderTest = Sut;
    type Reference = LimiterModel;

    fn init_test(_ref_state: &Model) -> Self::SystemUnderTest {
        Sut {
            limiter: Limiter::new(),
            permits: BTreeMap::new(),
            waiters: BTreeMap::new(),
        }
    }

    fn apply(mut sut: Sut, model: &Model, t: Transition) -> Sut {
        let id = model.next_id.wrapping_sub(1);
        match t {
            Transition::Configure {
                key,
                parallel,
                queue,
            } => {
                let (h, m) = KEYS[key];
                sut.limiter.configure(h, m, parallel, queue);
            }
            Transition::ConfigureHost { parallel } => sut.limiter.configure_host("h1", parallel),
            Transition::Acquire { key, weight } => {
                let (h, m) = KEYS[key];
                // Weight 1 through `acquire`, so the original entry point stays covered.
                let fut = if weight == 1 {
                    sut.limiter.acquire(h, m)
                } else {
                    sut.limiter.acquire_many(h, m, weight)
                };
                let mut waiter = Waiter {
                    fut,
                    wakes: Arc::default(),
                };
                match (waiter.poll(), model.last) {
                    (Poll::Ready(Ok(permit)), Some(Outcome::Granted)) => {
                        assert_eq!(permit.waited(), std::time::Duration::ZERO);
                        assert_eq!(permit.weight(), weight);
                        sut.permits.insert(id, permit);
                    }
                    (
                        Poll::Ready(Err(AcquireError::TooHeavy { weight: w, .. })),
                        Some(Outcome::TooHeavy),
                    ) => assert_eq!(w, weight),
                    (Poll::Pending, Some(Outcome::Queued)) => {
                        sut.waiters.insert(id, waiter);
                    }
                    (Poll::Ready(Err(AcquireError::QueueFull)), Some(Outcome::QueueFull)) => {}
                    (got, want) => panic!("acquire: got {got:?}, model says {want:?}"),
                }
            }
            Transition::TryAcquire { key, weight } => {
                let (h, m) = KEYS[key];
                let outcome = if weight == 1 {
                    sut.limiter.try_acquire(h, m)
                } else {
                    sut.limiter.try_acquire_many(h, m, weight)
                };
                match (outcome, model.last) {
                    (Ok(permit), Some(Outcome::Granted)) => {
                        assert_eq!(permit.weight(), weight);
                        sut.permits.insert(id, permit);
                    }
                    (Err(TryAcquireError::NoSlot), Some(Outcome::NoSlot))
                    | (Err(TryAcquireError::TooHeavy { .. }), Some(Outcome::TooHeavy)) => {}
                    (got, want) => panic!("try_acquire: got {got:?}, model says {want:?}"),
                }
            }
            Transition::Cancel(_) => {
                // The model removed exactly one waiter: drop the same one here. The head that
                // leaves can expose a next head too heavy for the key; the model refuses that one
                // in the same step, and `observe_moved` checks it, so it is not the cancelled one.
                let gone: Vec<u64> = sut
                    .waiters
                    .keys()
                    .copied()
                    .filter(|w| {
                        !model.waiting.contains_key(w)
                            && !model.permits.contains_key(w)
                            && !model.just_refused.contains(w)
                    })
                    .collect();
                assert_eq!(gone.len(), 1, "cancel: exactly one waiter leaves");
                sut.waiters.remove(&gone[0]);
            }
            Transition::Release(_) => {
                let gone: Vec<u64> = sut
                    .permits
                    .keys()
                    .copied()
                    .filter(|p| !model.permits.contains_key(p))
                    .collect();
                assert_eq!(gone.len(), 1, "release: exactly one permit leaves");
                sut.permits.remove(&gone[0]).expect("held").release();
            }
            Transition::Remove { key } => {
                let (h, m) = KEYS[key];
                sut.limiter.remove(h, m);
            }
        }

        observe_moved(&mut sut, model);
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        for (i, (h, m)) in KEYS.iter().enumerate() {
            let (in_flight, queued) = model.keys[i]
                .as_ref()
                .map_or((0, 0), |k| (k.in_flight, k.waiters.len()));
            assert_eq!(
                sut.limiter.in_flight(*h, *m),
                in_flight,
                "in_flight of {h}/{m}"
            );
            assert_eq!(sut.limiter.queued(*h, *m), queued, "queued of {h}/{m}");
            if let Some(k) = &model.keys[i] {
                // A waiter exists only when the head's weight does not fit (or, under a host
                // cap, it waits for the cap: `check_cap`).
                if let Some(&(_, weight)) = k.waiters.front()
                    && !k.attached
                {
                    assert!(!k.fits(weight));
                }
                let snapshot = sut
                    .limiter
                    .snapshot()
                    .into_iter()
                    .find(|s| s.host == *h && s.model == *m)
                    .expect("configured key in the snapshot");
                assert_eq!(snapshot.reserved, k.reserved(), "reserved of {h}/{m}");
            }
        }
        for host in ["h1", "h2"] {
            let mut free: usize = KEYS
                .iter()
                .enumerate()
                .filter(|(_, (h, _))| *h == host)
                .filter_map(|(i, _)| model.keys[i].as_ref())
                .map(|k| k.parallel.saturating_sub(k.in_flight))
                .sum();
            if host == "h1"
                && let Some(cap) = &model.cap
            {
                free = free.min(cap.parallel.saturating_sub(cap.in_flight));
            }
            assert_eq!(sut.limiter.free_slots(host), free, "free_slots({host})");
        }
        check_cap(sut, model);
        assert_eq!(sut.permits.len(), model.permits.len());
        assert_eq!(sut.waiters.len(), model.waiting.len());
    }

    fn teardown(sut: Sut, _model: Model) {
        let Sut {
            limiter,
            permits,
            waiters,
        } = sut;
        drop(waiters);
        drop(permits);
        for (h, m) in KEYS {
            assert_eq!(limiter.in_flight(h, m), 0, "leak on {h}/{m}");
            assert_eq!(limiter.queued(h, m), 0);
        }
        if let Some(cap) = limiter.host_reading("h1") {
            assert_eq!(
                (cap.in_flight, cap.blocked_models),
                (0, 0),
                "leak on the cap"
            );
        }
    }
}

/// The host cap of `h1`: its reading equals the model's, it is work-conserving (a key whose
/// head fits its own limit is in line for the cap, and the front of the line does not fit, or
/// the cap is full), and counted permits add up.
fn check_cap(sut: &Sut, model: &Model) {
    let reading = sut.limiter.host_reading("h1");
    let Some(cap) = &model.cap else {
        assert!(reading.is_none());
        return;
    };
    let reading = reading.expect("h1 has a cap");
    assert_eq!(
        (
            reading.parallel,
            reading.in_flight,
            reading.reserved,
            reading.blocked_models
        ),
        (
            cap.parallel,
            cap.in_flight,
            cap.reserved(),
            cap.blocked.len()
        ),
        "cap of h1"
    );
    let counted: usize = model
        .permits
        .values()
        .filter(|held| held.counted)
        .map(|held| held.weight)
        .sum();
    assert_eq!(cap.in_flight, counted, "the cap counts exactly its permits");
    for key in H1_KEYS {
        let Some(k) = &model.keys[key] else { continue };
        if let Some(&(_, weight)) = k.waiters.front() {
            assert_eq!(
                k.blocked,
                k.fits(weight),
                "key {key} in line iff its head fits it"
            );
        }
    }
    if let Some(&front) = cap.blocked.front() {
        let k = model.keys[front].as_ref().expect("keys in line exist");
        let &(_, weight) = k.waiters.front().expect("keys in line have a head");
        assert!(
            cap.in_flight >= cap.parallel || !cap.fits(weight),
            "the front of the line fits the cap but was not granted"
        );
    }
}

/// Grants, closes and refusals of the last step: exactly the waiters the model moved are ready
/// (each was woken), and every other waiter is still pending.
fn observe_moved(sut: &mut Sut, model: &Model) {
    for w in &model.just_granted {
        let mut waiter = sut.waiters.remove(w).expect("granted waiter exists");
        assert!(
            waiter.wakes.0.load(Ordering::SeqCst) >= 1,
            "granted waiter {w} was woken"
        );
        match waiter.poll() {
            Poll::Ready(Ok(permit)) => {
                sut.permits.insert(*w, permit);
            }
            other => panic!("waiter {w} should be granted, got {other:?}"),
        }
    }
    for w in &model.just_closed {
        let mut waiter = sut.waiters.remove(w).expect("closed waiter exists");
        assert!(waiter.wakes.0.load(Ordering::SeqCst) >= 1);
        assert!(matches!(
            waiter.poll(),
            Poll::Ready(Err(AcquireError::Closed))
        ));
    }
    for w in &model.just_refused {
        let mut waiter = sut.waiters.remove(w).expect("refused waiter exists");
        assert!(waiter.wakes.0.load(Ordering::SeqCst) >= 1);
        assert!(matches!(
            waiter.poll(),
            Poll::Ready(Err(AcquireError::TooHeavy { .. }))
        ));
    }
    for (w, waiter) in &mut sut.waiters {
        assert!(waiter.poll().is_pending(), "waiter {w} overtook the queue");
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: 512,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn limiter_matches_model(sequential 1..60 => LimiterTest);
}
