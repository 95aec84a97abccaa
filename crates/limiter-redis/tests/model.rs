//! The limiter's proptest state machine driving the shared limiter on Redis, against the same
//! reference model (`crates/limiter/tests/model/reference.rs`, included here as it is there).
//!
//! Random sequences of configure, host cap, acquire (weight 1 to 3), cancel and release over
//! three keys of two hosts go to the model and to one [`RedisLimiter`] on a fresh key prefix.
//! Two of the model's transitions are left out, because the shared limiter's contract differs
//! there on purpose: `try_acquire` (not part of the [`Admission`] trait; every acquire is a
//! round trip) and `remove` (it forgets a key on one replica only, the store keeps it for the
//! others).
//!
//! The shared limiter is asynchronous (calls to Redis, releases in the background, grants by
//! message), so each step is *settled* before the next: the test waits (bounded) until the
//! store holds exactly the model's state — per key units held, waiters, `parallel` and
//! `queue`; the host cap's limit and units — and then checks, as the limiter's own test does:
//!
//! - an acquire is granted at once, refused as `QueueFull` or `TooHeavy`, or queued exactly
//!   when the model says so (queued: the store has answered, [`Standing::Queued`]);
//! - the waiters the model granted in the step get their slot, those it refused as too heavy
//!   get `TooHeavy`, and every other waiter is still waiting (FIFO by units, a heavy head not
//!   overtaken, the cap's line of blocked models);
//! - at the end, with every slot and waiter dropped, the store holds nothing.
//!
//! It needs the Redis on `127.0.0.1:6379` (or `SLOTGATE_TEST_REDIS_URL`); the case count is
//! small (`PROPTEST_CASES` raises it) since every step costs a few round trips.
#![cfg(not(loom))]
#![allow(
    dead_code,
    reason = "the reference model is shared with the limiter's own test, which reads parts of \
              it (reserved units) that this one cannot observe through the trait"
)]

mod support;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::sample::Index;
use proptest_state_machine::{ReferenceStateMachine, StateMachineTest, prop_state_machine};
use slotgate_admission::{Admission, AdmitError, Slot};
use slotgate_limiter::Ticket;
use slotgate_limiter_redis::{OnStoreDown, RedisLimiter, Standing};
use support::{Prefix, redis_url};
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;

const KEYS: [(&str, &str); 3] = [("h1", "a"), ("h1", "b"), ("h2", "a")];
/// Bound on a step settling (reached only when the test fails).
const LIMIT: Duration = Duration::from_secs(10);

// ===== the reference model =====

include!("../../limiter/tests/model/reference.rs");

/// The model without the transitions the shared limiter does not offer (module docs).
struct SharedModel;

impl ReferenceStateMachine for SharedModel {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Self::State> {
        LimiterModel::init_state()
    }

    fn transitions(state: &Self::State) -> BoxedStrategy<Self::Transition> {
        LimiterModel::transitions(state)
            .prop_filter("no try_acquire or remove on the shared limiter", |t| {
                !matches!(t, Transition::TryAcquire { .. } | Transition::Remove { .. })
            })
            .boxed()
    }

    fn preconditions(state: &Self::State, t: &Self::Transition) -> bool {
        !matches!(t, Transition::TryAcquire { .. } | Transition::Remove { .. })
            && LimiterModel::preconditions(state, t)
    }

    fn apply(state: Self::State, t: &Self::Transition) -> Self::State {
        LimiterModel::apply(state, t)
    }
}

// ===== the system under test =====

struct Sut {
    rt: Runtime,
    prefix: Prefix,
    conn: redis::Connection,
    limiter: RedisLimiter,
    permits: BTreeMap<u64, Slot>,
    waiters: BTreeMap<u64, JoinHandle<Result<Slot, AdmitError>>>,
}

/// What the store holds: per key of [`KEYS`] `[units held, waiters, parallel, queue]` (`None`
/// before the key was written), and `h1`'s cap as `(parallel, units held)`.
type StoreState = ([Option<[usize; 4]>; 3], Option<(usize, usize)>);

impl Sut {
    fn read_store(&mut self) -> StoreState {
        const READ: &str = r"
            local out = {}
            for i = 1, #KEYS do
              local raw = redis.call('GET', KEYS[i])
              local S = raw and cmsgpack.unpack(raw) or {m = {}}
              local K = (S.m or {})[ARGV[i]]
              if K then
                out[#out + 1] = {K.inf, K.n, K.p, K.q}
              else
                out[#out + 1] = {}
              end
              if i == 1 then
                if S.cap then out[#out + 1] = {S.cap.p, S.hinf} else out[#out + 1] = {} end
              end
            end
            return out
        ";
        let mut call = redis::cmd("EVAL");
        call.arg(READ).arg(KEYS.len());
        for (host, _) in KEYS {
            call.arg(format!(
                "{}:{{{}:{host}}}:state",
                self.prefix.prefix,
                host.len()
            ));
        }
        for (_, model) in KEYS {
            call.arg(model);
        }
        let read: Vec<Vec<i64>> = call.query(&mut self.conn).expect("the store answers");
        let count = |v: &i64| usize::try_from(*v).unwrap_or(0);
        let key = |i: usize| -> Option<[usize; 4]> {
            let v: Vec<usize> = read[i].iter().map(count).collect();
            v.try_into().ok()
        };
        let cap = (read[1].len() == 2).then(|| (count(&read[1][0]), count(&read[1][1])));
        ([key(0), key(2), key(3)], cap)
    }

    /// Waits until the store holds the model's state.
    fn settle(&mut self, model: &Model) {
        let want: [Option<[usize; 4]>; 3] = std::array::from_fn(|i| {
            model.keys[i]
                .as_ref()
                .map(|k| [k.in_flight, k.waiters.len(), k.parallel, k.queue])
        });
        // The cap reaches the store with the first call about one of `h1`'s keys.
        let h1_known = H1_KEYS.iter().any(|&i| model.keys[i].is_some());
        let want_cap = model
            .cap
            .as_ref()
            .filter(|_| h1_known)
            .map(|c| (c.parallel, c.in_flight));
        let deadline = Instant::now() + LIMIT;
        loop {
            let (keys, cap) = self.read_store();
            let keys_match = keys.iter().zip(&want).all(|(got, want)| match want {
                Some(want) => got.as_ref() == Some(want),
                None => got.is_none_or(|got| got[0] == 0 && got[1] == 0),
            });
            let cap_match = want_cap.is_none() || cap == want_cap;
            if keys_match && cap_match {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the store does not settle on the model's state: store {keys:?} cap {cap:?}, \
                 model {want:?} cap {want_cap:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The outcome of a waiter's task, which must end within [`LIMIT`].
    fn outcome(&self, handle: JoinHandle<Result<Slot, AdmitError>>) -> Result<Slot, AdmitError> {
        self.rt
            .block_on(tokio::time::timeout(LIMIT, handle))
            .expect("the waiter's outcome within LIMIT")
            .expect("the waiter's task does not panic")
    }

    fn acquire(&mut self, key: usize, weight: usize, id: u64, model: &Model) {
        let (h, m) = KEYS[key];
        let ticket = Ticket::new().weight(weight);
        let (acquire, place) = self.limiter.acquire_placed(h, m, &ticket);
        let handle = self.rt.spawn(acquire);
        // Settled: an outcome, or the store's answer that it waits (arrival order kept).
        let deadline = Instant::now() + LIMIT;
        while !handle.is_finished() && place.standing() == Standing::Joining {
            assert!(Instant::now() < deadline, "acquire {id}: no answer");
            std::thread::sleep(Duration::from_millis(1));
        }
        if model.last == Some(Outcome::Queued) {
            // Granted in the same step or not, the model lists it as a waiter first.
            self.waiters.insert(id, handle);
            return;
        }
        match (self.outcome(handle), model.last) {
            (Ok(slot), Some(Outcome::Granted)) => {
                self.permits.insert(id, slot);
            }
            (Err(AdmitError::QueueFull), Some(Outcome::QueueFull)) => {}
            (Err(AdmitError::TooHeavy { weight: w, .. }), Some(Outcome::TooHeavy)) => {
                assert_eq!(w, weight);
            }
            (got, want) => panic!(
                "acquire {id}: got {:?}, model says {want:?}; store {:?}",
                got.err(),
                self.limiter.status()
            ),
        }
    }

    /// The waiters the model moved in the last step end so; every other one still waits.
    fn observe_moved(&mut self, model: &Model) {
        for w in &model.just_granted {
            let handle = self.waiters.remove(w).expect("a granted waiter exists");
            match self.outcome(handle) {
                Ok(slot) => {
                    self.permits.insert(*w, slot);
                }
                Err(error) => panic!("waiter {w} should be granted, got {error:?}"),
            }
        }
        for w in &model.just_refused {
            let handle = self.waiters.remove(w).expect("a refused waiter exists");
            let outcome = self.outcome(handle);
            assert!(
                matches!(outcome, Err(AdmitError::TooHeavy { .. })),
                "waiter {w} should be refused as too heavy, got {:?}",
                outcome.err()
            );
        }
        for (w, handle) in &self.waiters {
            assert!(!handle.is_finished(), "waiter {w} overtook the queue");
        }
    }
}

struct SharedTest;

impl StateMachineTest for SharedTest {
    type SystemUnderTest = Sut;
    type Reference = SharedModel;

    fn init_test(_model: &Model) -> Self::SystemUnderTest {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let prefix = Prefix::new(&redis_url());
        // Renewals out of the way: a case lasts well under a lease.
        let limiter = {
            let _guard = rt.enter();
            let mut settings = prefix.settings(Duration::from_secs(60), OnStoreDown::FailClosed);
            // A loaded machine must not pass for a store that is down.
            settings.store_timeout = Duration::from_secs(5);
            RedisLimiter::start(settings).expect("valid settings")
        };
        let conn = redis::Client::open(prefix.url.as_str())
            .and_then(|client| client.get_connection())
            .expect("a connection to the store");
        Sut {
            rt,
            prefix,
            conn,
            limiter,
            permits: BTreeMap::new(),
            waiters: BTreeMap::new(),
        }
    }

    fn apply(mut sut: Sut, model: &Model, t: Transition) -> Sut {
        let id = model.next_id.wrapping_sub(1);
        // Timers and sockets of the limiter's calls need the runtime's context.
        let handle = sut.rt.handle().clone();
        let _context = handle.enter();
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
            Transition::Acquire { key, weight } => sut.acquire(key, weight, id, model),
            Transition::Cancel(_) => {
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
                let handle = sut.waiters.remove(&gone[0]).expect("listed");
                handle.abort();
                // Dropped (cancelled) once the abort is seen.
                let _ = sut.rt.block_on(handle);
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
            Transition::TryAcquire { .. } | Transition::Remove { .. } => {
                unreachable!("left out by SharedModel")
            }
        }
        sut.settle(model);
        sut.observe_moved(model);
        sut
    }

    fn check_invariants(sut: &Sut, model: &Model) {
        assert_eq!(sut.permits.len(), model.permits.len());
        assert_eq!(sut.waiters.len(), model.waiting.len());
    }

    fn teardown(mut sut: Sut, _model: Model) {
        let handle = sut.rt.handle().clone();
        let _context = handle.enter();
        for (_, handle) in std::mem::take(&mut sut.waiters) {
            handle.abort();
            let _ = sut.rt.block_on(handle);
        }
        sut.permits.clear();
        let deadline = Instant::now() + LIMIT;
        loop {
            let (keys, cap) = sut.read_store();
            let empty = keys.iter().flatten().all(|k| k[0] == 0 && k[1] == 0)
                && cap.is_none_or(|(_, held)| held == 0);
            if empty {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "left in the store: {keys:?} {cap:?}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

prop_state_machine! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        failure_persistence: Some(Box::new(
            proptest::test_runner::FileFailurePersistence::WithSource("regressions"),
        )),
        ..ProptestConfig::default()
    })]

    #[test]
    fn shared_limiter_matches_the_limiters_model(sequential 1..40 => SharedTest);
}
