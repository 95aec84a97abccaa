//! The Lua script's state machine against a reference model of the local limiter's semantics,
//! run on the real Redis (`127.0.0.1:6379`, or `SLOTGATE_TEST_REDIS_URL`).
//!
//! The model is what `slotgate-limiter` promises for one key: at most `parallel` holders and
//! `queue` waiters, FIFO, direct handoff on release, a full queue refused, growing `parallel`
//! granting at once, shrinking never revoking. On top of it the model has the shared store's own
//! cases: leases that expire (ids with a lease of 0 ms, which expire at the very next call),
//! renewals that report grants the replica missed, and Redis losing all its data followed by a
//! renewal that puts every lease back. Every reply is compared with the model: the status, the
//! ids granted (in order), the counts, the expiries.

use std::collections::VecDeque;

use proptest::prelude::*;
use proptest::sample::Index;

use crate::script::{self, KeyNames, Op, Reply, Status};

fn redis_url() -> String {
    std::env::var("SLOTGATE_TEST_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
}

fn connect(url: &str) -> redis::Client {
    let client = redis::Client::open(url).expect("SLOTGATE_TEST_REDIS_URL is a redis:// URL");
    let mut conn = client.get_connection().unwrap_or_else(|error| {
        panic!(
            "these tests need a Redis server at {url} ({error}); start one with \
             `redis-server --save '' --appendonly no &` or set SLOTGATE_TEST_REDIS_URL"
        )
    });
    redis::cmd("PING")
        .query::<String>(&mut conn)
        .unwrap_or_else(|error| panic!("Redis at {url} does not answer PING: {error}"));
    client
}

#[derive(Debug, Clone)]
enum Action {
    Acquire {
        mortal: bool,
    },
    /// The same id acquires again (a retry after a lost reply): it must not take a second place.
    AcquireAgain(Index),
    Release(Index),
    Configure {
        parallel: usize,
        queue: usize,
    },
    /// Renew some live leases, all claimed as waiters (a replica that missed grant messages).
    RenewAsWaiters(Vec<Index>),
    /// Redis loses every key of this limiter key, then the replica renews all its leases.
    LoseDataAndRenew,
}

fn action() -> impl Strategy<Value = Action> {
    prop_oneof![
        6 => Just(Action::Acquire { mortal: false }),
        1 => Just(Action::Acquire { mortal: true }),
        2 => any::<Index>().prop_map(Action::AcquireAgain),
        4 => any::<Index>().prop_map(Action::Release),
        1 => (0usize..4, 0usize..4)
            .prop_map(|(parallel, queue)| Action::Configure { parallel, queue }),
        1 => proptest::collection::vec(any::<Index>(), 0..4).prop_map(Action::RenewAsWaiters),
        1 => Just(Action::LoseDataAndRenew),
    ]
}

/// A lease in the model: its id and whether it expires at the next call.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lease {
    id: String,
    mortal: bool,
}

#[derive(Debug, Default)]
struct Model {
    parallel: usize,
    queue: usize,
    holders: Vec<Lease>,
    waiters: VecDeque<Lease>,
}

#[derive(Debug, PartialEq, Eq)]
struct Expected {
    status: Status,
    holders: usize,
    waiters: usize,
    expired: u64,
    granted: Vec<String>,
    reported: Vec<String>,
    restored: u64,
}

impl Model {
    fn expire(&mut self) -> u64 {
        let before = self.holders.len() + self.waiters.len();
        self.holders.retain(|lease| !lease.mortal);
        self.waiters.retain(|lease| !lease.mortal);
        (before - self.holders.len() - self.waiters.len()) as u64
    }

    fn fill(&mut self) -> Vec<String> {
        let mut granted = Vec::new();
        while self.holders.len() < self.parallel {
            let Some(head) = self.waiters.pop_front() else {
                break;
            };
            granted.push(head.id.clone());
            self.holders.push(head);
        }
        granted
    }

    /// A new acquire after expiry and fill: granted, refused or queued.
    fn admit(&mut self, lease: Lease) -> Status {
        if self.holders.len() < self.parallel {
            self.holders.push(lease);
            Status::Yes
        } else if self.waiters.len() >= self.queue {
            Status::No
        } else {
            self.waiters.push_back(lease);
            Status::Queued
        }
    }

    fn live(&self) -> Vec<Lease> {
        self.holders.iter().chain(&self.waiters).cloned().collect()
    }

    fn expected(&self, status: Status, expired: u64, granted: Vec<String>) -> Expected {
        Expected {
            status,
            holders: self.holders.len(),
            waiters: self.waiters.len(),
            expired,
            granted,
            reported: Vec::new(),
            restored: 0,
        }
    }
}

fn seen(reply: &Reply) -> Expected {
    Expected {
        status: reply.status,
        holders: reply.holders,
        waiters: reply.waiters,
        expired: reply.expired,
        granted: reply.granted.clone(),
        reported: reply.reported.clone(),
        restored: reply.restored,
    }
}

#[expect(
    clippy::too_many_lines,
    reason = "one arm per action, each the call, the model's step and the comparison"
)]
fn run(
    rt: &tokio::runtime::Runtime,
    conn: &redis::aio::MultiplexedConnection,
    names: &KeyNames,
    actions: Vec<Action>,
) {
    let mut model = Model {
        parallel: 1,
        queue: 0,
        ..Model::default()
    };
    let mut next = 0u32;
    for action in actions {
        let defaults = (model.parallel, model.queue);
        let call = |op: Op<'_>| {
            let mut conn = conn.clone();
            rt.block_on(script::call(&mut conn, names, defaults, &op))
                .unwrap()
        };
        match action {
            Action::Acquire { mortal } => {
                next += 1;
                let id = format!("test/{next}/{}", if mortal { 0 } else { 600_000 });
                let reply = call(Op::Acquire(&id));
                let expired = model.expire();
                let granted = model.fill();
                let status = model.admit(Lease { id, mortal });
                assert_eq!(seen(&reply), model.expected(status, expired, granted));
            }
            Action::AcquireAgain(index) => {
                let live = model.live();
                if live.is_empty() {
                    continue;
                }
                let lease = index.get(&live).clone();
                let reply = call(Op::Acquire(&lease.id));
                let expired = model.expire();
                let granted = model.fill();
                let status = if model.holders.contains(&lease) {
                    Status::Yes
                } else if model.waiters.contains(&lease) {
                    Status::Queued
                } else {
                    // It expired at this very call: a new acquire like any other.
                    model.admit(lease)
                };
                assert_eq!(seen(&reply), model.expected(status, expired, granted));
            }
            Action::Release(index) => {
                let live = model.live();
                if live.is_empty() {
                    continue;
                }
                let lease = index.get(&live).clone();
                let reply = call(Op::Release(&lease.id));
                let was_holder = model.holders.contains(&lease);
                model.holders.retain(|l| *l != lease);
                model.waiters.retain(|l| *l != lease);
                let expired = model.expire();
                let granted = model.fill();
                let status = if was_holder { Status::Yes } else { Status::No };
                assert_eq!(seen(&reply), model.expected(status, expired, granted));
            }
            Action::Configure { parallel, queue } => {
                let reply = call(Op::Configure { parallel, queue });
                model.parallel = parallel;
                model.queue = queue;
                let expired = model.expire();
                let granted = model.fill();
                assert_eq!(seen(&reply), model.expected(Status::No, expired, granted));
            }
            Action::RenewAsWaiters(picks) => {
                let live = model.live();
                let mut ids: Vec<(String, bool)> = Vec::new();
                if !live.is_empty() {
                    for pick in picks {
                        let id = pick.get(&live).id.clone();
                        if !ids.iter().any(|(seen, _)| *seen == id) {
                            ids.push((id, false));
                        }
                    }
                }
                let reply = call(Op::Renew(&ids));
                let reported = ids
                    .iter()
                    .filter(|(id, _)| model.holders.iter().any(|l| l.id == *id))
                    .map(|(id, _)| id.clone())
                    .collect();
                let expired = model.expire();
                let granted = model.fill();
                let mut expected = model.expected(Status::No, expired, granted);
                expected.reported = reported;
                assert_eq!(seen(&reply), expected);
            }
            Action::LoseDataAndRenew => {
                let keys = names.keys().to_vec();
                rt.block_on(
                    redis::cmd("DEL")
                        .arg(&keys)
                        .query_async::<()>(&mut conn.clone()),
                )
                .unwrap();
                let mut ids: Vec<(String, bool)> =
                    model.holders.iter().map(|l| (l.id.clone(), true)).collect();
                ids.extend(model.waiters.iter().map(|l| (l.id.clone(), false)));
                let reply = call(Op::Renew(&ids));
                let restored = ids.len() as u64;
                let expired = model.expire();
                let granted = model.fill();
                let mut expected = model.expected(Status::No, expired, granted);
                expected.restored = restored;
                assert_eq!(seen(&reply), expected);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn script_matches_the_reference_model(actions in proptest::collection::vec(action(), 1..40)) {
        let client = connect(&redis_url());
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let conn = rt.block_on(client.get_multiplexed_async_connection()).unwrap();
        let prefix = format!("slotgate-test-model-{}", uuid::Uuid::new_v4().simple());
        let names = KeyNames::new(&prefix, "http://gpu-1:8080", "llama");
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            run(&rt, &conn, &names, actions);
        }));
        let mut sync = client.get_connection().unwrap();
        redis::cmd("DEL").arg(names.keys().to_vec()).query::<()>(&mut sync).unwrap();
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn key_names_are_unambiguous_and_share_one_hash_tag() {
    let a = KeyNames::new("p", "h|x", "m");
    let b = KeyNames::new("p", "h", "x|m");
    assert_ne!(a.keys()[0], b.keys()[0]);
    for key in a.keys() {
        assert!(key.starts_with("p:{3:h|x|m}:"), "{key}");
    }
}

/// The bug behind a flaky `QueueFull`: an acquire retried after a timed-out call must keep its
/// one place, not take a second one (the limiter retries with the same lease id).
#[test]
fn a_retried_acquire_takes_one_place_not_two() {
    let client = connect(&redis_url());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut conn = rt
        .block_on(client.get_multiplexed_async_connection())
        .unwrap();
    let prefix = format!("slotgate-test-retry-{}", uuid::Uuid::new_v4().simple());
    let names = KeyNames::new(&prefix, "http://gpu-1:8080", "llama");
    let mut call = |op: Op<'_>| rt.block_on(script::call(&mut conn, &names, (1, 1), &op));
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let holder = call(Op::Acquire("r/1/60000")).unwrap();
        assert_eq!((holder.status, holder.holders), (Status::Yes, 1));
        let again = call(Op::Acquire("r/1/60000")).unwrap();
        assert_eq!((again.status, again.holders), (Status::Yes, 1));
        let waiter = call(Op::Acquire("r/2/60000")).unwrap();
        assert_eq!((waiter.status, waiter.waiters), (Status::Queued, 1));
        // The retry of the waiter: still queued, still one waiter, so the queue is not full
        // of one client.
        let retry = call(Op::Acquire("r/2/60000")).unwrap();
        assert_eq!((retry.status, retry.waiters), (Status::Queued, 1));
        // The holder leaves: the waiter is granted, once.
        let release = call(Op::Release("r/1/60000")).unwrap();
        assert_eq!(release.granted, vec!["r/2/60000".to_owned()]);
        assert_eq!((release.holders, release.waiters), (1, 0));
    }));
    let mut sync = client.get_connection().unwrap();
    redis::cmd("DEL")
        .arg(names.keys().to_vec())
        .query::<()>(&mut sync)
        .unwrap();
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
