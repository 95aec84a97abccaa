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

/// Keys of host `h1`, which `ConfigureHost` caps.
const H1_KEYS: [usize; 2] = [0, 1];

#[derive(Debug, Clone, Default)]
struct KeyModel {
    parallel: usize,
    queue: usize,
    in_flight: usize,
    /// Waiters (id, weight) in grant order.
    waiters: VecDeque<(u64, usize)>,
    /// Counts against the host cap.
    attached: bool,
    /// In the host cap's queue of blocked keys.
    blocked: bool,
}

impl KeyModel {
    fn unconfigured(attached: bool) -> Self {
        Self {
            parallel: 1,
            queue: 0,
            attached,
            ..Self::default()
        }
    }

    fn too_heavy(&self, weight: usize) -> bool {
        self.parallel > 0 && weight > self.parallel
    }

    fn fits(&self, weight: usize) -> bool {
        self.in_flight + weight <= self.parallel
    }

    fn reserved(&self) -> usize {
        if self.waiters.is_empty() {
            0
        } else {
            self.parallel.saturating_sub(self.in_flight)
        }
    }
}

/// The host cap of `h1`.
#[derive(Debug, Clone, Default)]
struct CapModel {
    parallel: usize,
    in_flight: usize,
    /// Keys whose head waits for the cap, in line.
    blocked: VecDeque<usize>,
}

impl CapModel {
    fn too_heavy(&self, weight: usize) -> bool {
        self.parallel > 0 && weight > self.parallel
    }

    fn fits(&self, weight: usize) -> bool {
        self.in_flight + weight <= self.parallel
    }

    fn reserved(&self) -> usize {
        if self.blocked.is_empty() {
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

/// A permit held.
#[derive(Debug, Clone, Copy)]
struct Held {
    owner: Owner,
    weight: usize,
    /// Counts against the host cap.
    counted: bool,
}

#[derive(Debug, Clone, Default)]
struct Model {
    keys: Vec<Option<KeyModel>>,
    epochs: Vec<u64>,
    cap: Option<CapModel>,
    next_id: u64,
    permits: BTreeMap<u64, Held>,
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
    ConfigureHost {
        parallel: usize,
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
        let attached = self.cap.is_some() && H1_KEYS.contains(&key);
        self.keys[key].get_or_insert_with(|| KeyModel::unconfigured(attached))
    }

    fn owner(&self, key: usize) -> Owner {
        Owner {
            key,
            epoch: self.epochs[key],
        }
    }

    fn grant(&mut self, id: u64, held: Held) {
        self.waiting.remove(&id).expect("granted waiter waits");
        self.permits.insert(id, held);
        self.just_granted.push(id);
    }

    fn refuse(&mut self, id: u64) {
        self.waiting.remove(&id);
        self.just_refused.push(id);
    }

    /// The key's grant step, as the limiter's: heads in order while each fits the key and (if
    /// attached) the cap with its turn there; else the key lines up for the cap. Returns
    /// whether the cap's front changed.
    fn fill(&mut self, key: usize) -> bool {
        let owner = self.owner(key);
        let mut moved = false;
        loop {
            let Some(k) = self.keys[key].as_mut() else {
                return moved;
            };
            let Some(&(id, weight)) = k.waiters.front() else {
                break;
            };
            if k.too_heavy(weight) {
                k.waiters.pop_front();
                self.refuse(id);
                continue;
            }
            if !k.fits(weight) {
                break;
            }
            let held = Held {
                owner,
                weight,
                counted: k.attached,
            };
            if !k.attached {
                k.in_flight += weight;
                k.waiters.pop_front();
                self.grant(id, held);
                continue;
            }
            let cap = self.cap.as_mut().expect("attached keys have a cap");
            if cap.too_heavy(weight) {
                k.waiters.pop_front();
                self.refuse(id);
                continue;
            }
            let turn = cap.blocked.front().is_none_or(|&f| f == key);
            if turn && cap.fits(weight) {
                cap.in_flight += weight;
                if k.blocked {
                    cap.blocked.pop_front();
                    k.blocked = false;
                    moved = true;
                }
                k.in_flight += weight;
                k.waiters.pop_front();
                self.grant(id, held);
                continue;
            }
            if !k.blocked {
                cap.blocked.push_back(key);
                k.blocked = true;
            }
            return moved;
        }
        if let Some(k) = self.keys[key].as_mut()
            && k.blocked
        {
            k.blocked = false;
            let cap = self.cap.as_mut().expect("blocked keys have a cap");
            let at = cap.blocked.iter().position(|&f| f == key).expect("in line");
            cap.blocked.remove(at);
            moved |= at == 0;
        }
        moved
    }

    /// The cap's kick: the front key takes free cap units while it makes progress.
    fn kick(&mut self) {
        loop {
            let Some(cap) = &self.cap else { return };
            let Some(&front) = cap.blocked.front() else {
                return;
            };
            if cap.in_flight >= cap.parallel || !self.fill(front) {
                return;
            }
        }
    }

    fn configure_host(&mut self, parallel: usize) {
        if self.cap.is_none() {
            self.cap = Some(CapModel {
                parallel,
                ..CapModel::default()
            });
            for key in H1_KEYS {
                let Some(k) = self.keys[key].as_mut() else {
                    continue;
                };
                k.attached = true;
                let units = k.in_flight;
                self.cap.as_mut().expect("just made").in_flight += units;
                let owner = self.owner(key);
                for held in self.permits.values_mut() {
                    if held.owner == owner {
                        held.counted = true;
                    }
                }
                self.fill(key);
                self.kick();
            }
        }
        self.cap.as_mut().expect("made above").parallel = parallel;
        self.kick();
    }

    fn acquire(&mut self, key: usize, weight: usize, is_try: bool) {
        let owner = self.owner(key);
        let id = self.next_id;
        self.next_id += 1;
        let k = self.key_mut(key);
        let free = k.waiters.is_empty() && k.fits(weight);
        let attached = k.attached;
        let outcome = if k.too_heavy(weight) {
            Outcome::TooHeavy
        } else if attached {
            let cap = self.cap.as_mut().expect("attached keys have a cap");
            if cap.too_heavy(weight) {
                Outcome::TooHeavy
            } else if free && cap.blocked.is_empty() && cap.fits(weight) {
                cap.in_flight += weight;
                Outcome::Granted
            } else {
                Outcome::NoSlot
            }
        } else if free {
            Outcome::Granted
        } else {
            Outcome::NoSlot
        };
        let k = self.keys[key].as_mut().expect("made above");
        let outcome = match outcome {
            Outcome::Granted => {
                k.in_flight += weight;
                self.permits.insert(
                    id,
                    Held {
                        owner,
                        weight,
                        counted: attached,
                    },
                );
                Outcome::Granted
            }
            Outcome::NoSlot if is_try => Outcome::NoSlot,
            Outcome::NoSlot if k.waiters.len() >= k.queue => Outcome::QueueFull,
            Outcome::NoSlot => {
                k.waiters.push_back((id, weight));
                self.waiting.insert(id, (owner, weight));
                if attached && self.fill(key) {
                    self.kick();
                }
                Outcome::Queued
            }
            other => other,
        };
        self.last = Some(outcome);
    }

    fn release(&mut self, held: Held) {
        if held.counted {
            let cap = self.cap.as_mut().expect("counted permits have a cap");
            cap.in_flight -= held.weight;
        }
        let owner = held.owner;
        // A removed key's permit releases into its old state, gone from the limiter's view.
        if owner.epoch == self.epochs[owner.key]
            && let Some(k) = self.keys[owner.key].as_mut()
        {
            k.in_flight -= held.weight;
            self.fill(owner.key);
        }
        self.kick();
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
            1 => (0..5usize).prop_map(|parallel| Transition::ConfigureHost { parallel }),
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
                let k = state.key_mut(key);
                k.parallel = parallel;
                k.queue = queue;
                state.fill(key);
                state.kick();
            }
            Transition::ConfigureHost { parallel } => state.configure_host(parallel),
            Transition::Acquire { key, weight } => state.acquire(key, weight, false),
            Transition::TryAcquire { key, weight } => state.acquire(key, weight, true),
            Transition::Cancel(index) => {
                let id = *index.get(&state.waiting.keys().copied().collect::<Vec<_>>());
                let (owner, _) = state.waiting.remove(&id).expect("precondition");
                if let Some(k) = state.keys[owner.key].as_mut() {
                    k.waiters.retain(|(w, _)| *w != id);
                }
                // A head that leaves lets the next one take the units set aside for it.
                state.fill(owner.key);
                state.kick();
            }
            Transition::Release(index) => {
                let id = *index.get(&state.permits.keys().copied().collect::<Vec<_>>());
                let held = state.permits.remove(&id).expect("precondition");
                state.release(held);
            }
            Transition::Remove { key } => {
                if let Some(k) = state.keys[key].as_mut() {
                    for (w, _) in std::mem::take(&mut k.waiters) {
                        state.waiting.remove(&w);
                        state.just_closed.push(w);
                    }
                    // No waiter left: off the cap's line, and the next key in line goes on.
                    state.fill(key);
                    state.kick();
                }
                state.keys[key] = None;
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
