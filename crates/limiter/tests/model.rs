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
//! - invariants: a waiter exists only when the head's weight does not fit.
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

#[derive(Debug, Clone, Default)]
struct KeyModel {
    parallel: usize,
    queue: usize,
    in_flight: usize,
    /// Waiters (id, weight) in grant order.
    waiters: VecDeque<(u64, usize)>,
}

impl KeyModel {
    fn unconfigured() -> Self {
        Self {
            parallel: 1,
            queue: 0,
            ..Self::default()
        }
    }

    fn too_heavy(&self, weight: usize) -> bool {
        self.parallel > 0 && weight > self.parallel
    }

    fn fits(&self, weight: usize) -> bool {
        self.in_flight + weight <= self.parallel
    }

    /// Grants heads in order while each fits; refuses heads that never can. Returns the
    /// granted and the refused ids.
    fn fill(&mut self) -> (Vec<u64>, Vec<u64>) {
        let (mut granted, mut refused) = (Vec::new(), Vec::new());
        while let Some(&(id, weight)) = self.waiters.front() {
            if self.too_heavy(weight) {
                refused.push(id);
            } else if self.fits(weight) {
                self.in_flight += weight;
                granted.push(id);
            } else {
                break;
            }
            self.waiters.pop_front();
        }
        (granted, refused)
    }

    fn reserved(&self) -> usize {
        if self.waiters.is_empty() {
            0
        } else {
            self.parallel.saturating_sub(self.in_flight)
        }
    }
}

/// What a permit or waiter belongs to: a key's current incarnation (removal starts a new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    key: usize,
    epoch: u64,
}

#[derive(Debug, Clone, Default)]
struct Model {
    keys: Vec<Option<KeyModel>>,
    epochs: Vec<u64>,
    next_id: u64,
    /// Permits held: id → (owner, weight).
    permits: BTreeMap<u64, (Owner, usize)>,
    /// Waiters queued: id → (owner, weight).
    waiting: BTreeMap<u64, (Owner, usize)>,
    /// Waiters granted by the last step, which the SUT must see ready.
    just_granted: Vec<u64>,
    /// Waiters closed by the last step.
    just_closed: Vec<u64>,
    /// Waiters refused as too heavy by the last step (a shrink).
    just_refused: Vec<u64>,
    /// Outcome of the last acquire / try-acquire.
    last: Option<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Granted,
    Queued,
    QueueFull,
    NoSlot,
    TooHeavy,
}

#[derive(Debug, Clone)]
enum Transition {
    Configure {
        key: usize,
        parallel: usize,
        queue: usize,
    },
    Acquire {
        key: usize,
        weight: usize,
    },
    TryAcquire {
        key: usize,
        weight: usize,
    },
    Cancel(Index),
    Release(Index),
    Remove {
        key: usize,
    },
}

impl Model {
    fn key_mut(&mut self, key: usize) -> &mut KeyModel {
        self.keys[key].get_or_insert_with(KeyModel::unconfigured)
    }

    fn owner(&self, key: usize) -> Owner {
        Owner {
            key,
            epoch: self.epochs[key],
        }
    }

    /// Gives `weight` units back to `owner`'s key, if that incarnation is still current.
    fn release_to(&mut self, owner: Owner, weight: usize) {
        if owner.epoch != self.epochs[owner.key] {
            return; // a removed key: its state is gone from the limiter's view
        }
        if let Some(k) = self.keys[owner.key].as_mut() {
            k.in_flight -= weight;
        }
        self.fill(owner);
    }

    /// Runs the key's fill and moves the waiters it granted or refused.
    fn fill(&mut self, owner: Owner) {
        let Some(k) = self.keys[owner.key].as_mut() else {
            return;
        };
        let (granted, refused) = k.fill();
        for w in granted {
            let (_, weight) = self.waiting.remove(&w).expect("granted waiter waits");
            self.permits.insert(w, (owner, weight));
            self.just_granted.push(w);
        }
        for w in refused {
            self.waiting.remove(&w);
            self.just_refused.push(w);
        }
    }
}

struct LimiterModel;

impl ReferenceStateMachine for LimiterModel {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Self::State> {
        Just(Model {
            keys: vec![None; KEYS.len()],
            epochs: vec![0; KEYS.len()],
            ..Model::default()
        })
        .boxed()
    }

    fn transitions(_state: &Self::State) -> BoxedStrategy<Self::Transition> {
        let key = 0..KEYS.len();
        // Mostly weight 1 (today's traffic), some heavier, now and then above `parallel`.
        let weight = prop_oneof![3 => Just(1usize), 2 => 2..4usize];
        prop_oneof![
            2 => (key.clone(), 0..5usize, 0..4usize)
                .prop_map(|(key, parallel, queue)| Transition::Configure { key, parallel, queue }),
            6 => (key.clone(), weight.clone())
                .prop_map(|(key, weight)| Transition::Acquire { key, weight }),
            2 => (key.clone(), weight)
                .prop_map(|(key, weight)| Transition::TryAcquire { key, weight }),
            3 => any::<Index>().prop_map(Transition::Cancel),
            5 => any::<Index>().prop_map(Transition::Release),
            1 => key.prop_map(|key| Transition::Remove { key }),
        ]
        .boxed()
    }

    fn preconditions(state: &Self::State, t: &Self::Transition) -> bool {
        match t {
            Transition::Cancel(_) => !state.waiting.is_empty(),
            Transition::Release(_) => !state.permits.is_empty(),
            _ => true,
        }
    }

    fn apply(mut state: Self::State, t: &Self::Transition) -> Self::State {
        state.just_granted.clear();
        state.just_closed.clear();
        state.just_refused.clear();
        state.last = None;
        match *t {
            Transition::Configure {
                key,
                parallel,
                queue,
            } => {
                let owner = state.owner(key);
                let k = state.key_mut(key);
                k.parallel = parallel;
                k.queue = queue;
                state.fill(owner);
            }
            Transition::Acquire { key, weight } | Transition::TryAcquire { key, weight } => {
                let is_try = matches!(t, Transition::TryAcquire { .. });
                let owner = state.owner(key);
                let id = state.next_id;
                state.next_id += 1;
                let k = state.key_mut(key);
                let outcome = if k.too_heavy(weight) {
                    Outcome::TooHeavy
                } else if k.fits(weight) && k.waiters.is_empty() {
                    k.in_flight += weight;
                    Outcome::Granted
                } else if is_try {
                    Outcome::NoSlot
                } else if k.waiters.len() >= k.queue {
                    Outcome::QueueFull
                } else {
                    k.waiters.push_back((id, weight));
                    Outcome::Queued
                };
                match outcome {
                    Outcome::Granted => {
                        state.permits.insert(id, (owner, weight));
                    }
                    Outcome::Queued => {
                        state.waiting.insert(id, (owner, weight));
                    }
                    Outcome::QueueFull | Outcome::NoSlot | Outcome::TooHeavy => {}
                }
                state.last = Some(outcome);
            }
            Transition::Cancel(index) => {
                let id = *index.get(&state.waiting.keys().copied().collect::<Vec<_>>());
                let (owner, _) = state.waiting.remove(&id).expect("precondition");
                if let Some(k) = state.keys[owner.key].as_mut() {
                    k.waiters.retain(|(w, _)| *w != id);
                }
                // A head that leaves lets the next one take the units set aside for it.
                state.fill(owner);
            }
            Transition::Release(index) => {
                let id = *index.get(&state.permits.keys().copied().collect::<Vec<_>>());
                let (owner, weight) = state.permits.remove(&id).expect("precondition");
                state.release_to(owner, weight);
            }
            Transition::Remove { key } => {
                if let Some(k) = state.keys[key].take() {
                    for (w, _) in k.waiters {
                        state.waiting.remove(&w);
                        state.just_closed.push(w);
                    }
                }
                state.epochs[key] += 1;
            }
        }
        state
    }
}

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
                // The model removed exactly one waiter: drop the same one here.
                let gone: Vec<u64> = sut
                    .waiters
                    .keys()
                    .copied()
                    .filter(|w| !model.waiting.contains_key(w) && !model.permits.contains_key(w))
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
                // A waiter exists only when the head's weight does not fit.
                if let Some(&(_, weight)) = k.waiters.front() {
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
            let free: usize = KEYS
                .iter()
                .enumerate()
                .filter(|(_, (h, _))| *h == host)
                .filter_map(|(i, _)| model.keys[i].as_ref())
                .map(|k| k.parallel.saturating_sub(k.in_flight))
                .sum();
            assert_eq!(sut.limiter.free_slots(host), free, "free_slots({host})");
        }
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
