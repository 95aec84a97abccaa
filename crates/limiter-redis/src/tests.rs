//! The Lua script against the local limiter, run on the real Redis (`127.0.0.1:6379`, or
//! `SLOTGATE_TEST_REDIS_URL`).
//!
//! The local limiter is the reference: it is proven against its own model (weights, host caps:
//! `slotgate-limiter/tests/model.rs`) and its shortcuts against its general path (fair order,
//! priority classes: `tests/shortcuts.rs`). [`script_matches_the_local_limiter`] applies one
//! random sequence of configure, order changes, host cap changes, acquires (weights 1 to 3,
//! the three classes, three tenants with shares 1 to 3), cancels and releases over three keys
//! of two hosts to both, and after every step compares: each acquire's outcome (granted,
//! queued, queue full, too heavy and the limit it is above), exactly which waiters were
//! granted or refused by the step, every key's units held and waiters, the host cap's units,
//! and every waiter's position. The shared store's own cases (lease expiry, retried acquires,
//! lost data put back by a renewal) have their own tests below.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use proptest::sample::Index;
use slotgate_limiter::{Acquire, AcquireError, Limiter, Permit, Priority, QueueOrder, Ticket};

use crate::script::{self, Config, Desc, KeyNames, Op, Reply, Status};

const KEYS: [(&str, &str); 3] = [("h1", "a"), ("h1", "b"), ("h2", "a")];
/// Ids of these tests' leases: an hour of lease, so nothing expires unless a test says so.
const LONG: u32 = 3_600_000;

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

/// Runs `test` with a connection and a fresh prefix, deleting every key under the prefix
/// afterwards, even when the test panics.
fn with_redis(
    test: impl FnOnce(&tokio::runtime::Runtime, &redis::aio::MultiplexedConnection, &str),
) {
    let client = connect(&redis_url());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let conn = rt
        .block_on(client.get_multiplexed_async_connection())
        .unwrap();
    let prefix = format!("slotgate-test-script-{}", uuid::Uuid::new_v4().simple());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        test(&rt, &conn, &prefix);
    }));
    let mut sync = client.get_connection().unwrap();
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{prefix}:*"))
        .query(&mut sync)
        .unwrap_or_default();
    if !keys.is_empty() {
        redis::cmd("DEL").arg(keys).query::<()>(&mut sync).unwrap();
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

// ===== the differential test =====

#[derive(Debug, Clone, Copy)]
enum Action {
    Configure {
        key: usize,
        parallel: usize,
        queue: usize,
    },
    Order {
        key: usize,
        fair: bool,
    },
    /// The engine-wide cap of `h1` changes (it exists from the start).
    Cap(usize),
    Acquire {
        key: usize,
        weight: usize,
        class: u8,
        /// 0: no tenant.
        tenant: u8,
        share: u32,
    },
    Cancel(Index),
    Release(Index),
}

fn action() -> impl Strategy<Value = Action> {
    // Mostly the first key, so that lines grow long enough for fair turns and the starvation
    // bound to matter; the second shares its host's cap, the third is on another host.
    let key = prop_oneof![4 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)];
    let weight = prop_oneof![3 => Just(1usize), 1 => 2..4usize];
    prop_oneof![
        2 => (key.clone(), 0..5usize, 0..10usize)
            .prop_map(|(key, parallel, queue)| Action::Configure { key, parallel, queue }),
        1 => (key.clone(), prop::bool::weighted(0.7))
            .prop_map(|(key, fair)| Action::Order { key, fair }),
        1 => (1..7usize).prop_map(Action::Cap),
        10 => (key, weight, 0..3u8, 0..4u8, 1..4u32).prop_map(
            |(key, weight, class, tenant, share)| Action::Acquire { key, weight, class, tenant, share }
        ),
        3 => any::<Index>().prop_map(Action::Cancel),
        5 => any::<Index>().prop_map(Action::Release),
    ]
}

/// One key's configuration, as both sides have it.
#[derive(Debug, Clone, Copy)]
struct KeyConfig {
    parallel: usize,
    queue: usize,
    order: QueueOrder,
}

struct Waiting {
    key: usize,
    fut: Acquire,
}

/// Both sides, and what the test knows of them.
struct Sides<'a> {
    rt: &'a tokio::runtime::Runtime,
    conn: redis::aio::MultiplexedConnection,
    names: Vec<KeyNames>,
    local: Limiter,
    configs: [KeyConfig; 3],
    cap: usize,
    /// Force flags for the next call of each key (a configure or order change), and for the
    /// cap (the next call of a key of `h1`).
    force: [bool; 3],
    force_cap: bool,
    next: u64,
    waiters: BTreeMap<String, Waiting>,
    holders: BTreeMap<String, (usize, Permit)>,
}

fn poll(fut: &mut Acquire) -> Poll<Result<Permit, AcquireError>> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

impl Sides<'_> {
    fn call(&mut self, key: usize, op: &Op<'_>) -> Reply {
        let c = self.configs[key];
        let on_h1 = KEYS[key].0 == "h1";
        let config = Config {
            parallel: c.parallel,
            queue: c.queue,
            order: c.order,
            cap: on_h1.then_some(self.cap),
            force_key: std::mem::take(&mut self.force[key]),
            force_cap: on_h1 && std::mem::take(&mut self.force_cap),
        };
        let mut conn = self.conn.clone();
        self.rt
            .block_on(script::call(&mut conn, &self.names[key], &config, op))
            .expect("the script runs")
    }

    fn new_id(&mut self) -> String {
        self.next += 1;
        format!("test/{}/{LONG}", self.next)
    }

    /// Applies one action to both sides; compares the outcome and what the step moved.
    fn apply(&mut self, action: Action) {
        let (reply, key) = match action {
            Action::Configure {
                key,
                parallel,
                queue,
            } => {
                let (h, m) = KEYS[key];
                self.configs[key].parallel = parallel;
                self.configs[key].queue = queue;
                self.local.configure(h, m, parallel, queue);
                self.force[key] = true;
                (self.call(key, &Op::Configure), key)
            }
            Action::Order { key, fair } => {
                let (h, m) = KEYS[key];
                let order = if fair {
                    QueueOrder::Fair
                } else {
                    QueueOrder::Fifo
                };
                self.configs[key].order = order;
                self.local.configure_order(h, m, order);
                self.force[key] = true;
                (self.call(key, &Op::Configure), key)
            }
            Action::Cap(cap) => {
                self.cap = cap;
                self.local.configure_host("h1", cap);
                self.force_cap = true;
                (self.call(0, &Op::Configure), 0)
            }
            Action::Acquire {
                key,
                weight,
                class,
                tenant,
                share,
            } => (self.acquire(key, weight, class, tenant, share), key),
            Action::Cancel(index) => {
                let Some(id) = self
                    .waiters
                    .keys()
                    .nth(index.index(self.waiters.len().max(1)))
                    .cloned()
                else {
                    return;
                };
                let waiting = self.waiters.remove(&id).expect("listed");
                drop(waiting.fut);
                (self.call(waiting.key, &Op::Release(&id)), waiting.key)
            }
            Action::Release(index) => {
                let Some(id) = self
                    .holders
                    .keys()
                    .nth(index.index(self.holders.len().max(1)))
                    .cloned()
                else {
                    return;
                };
                let (key, permit) = self.holders.remove(&id).expect("listed");
                drop(permit);
                (self.call(key, &Op::Release(&id)), key)
            }
        };
        self.compare_moved(&reply);
        self.compare_counts(key, &reply);
    }

    fn acquire(&mut self, key: usize, weight: usize, class: u8, tenant: u8, share: u32) -> Reply {
        let (h, m) = KEYS[key];
        let mut ticket = Ticket::new()
            .weight(weight)
            .share(share)
            .priority(match class {
                0 => Priority::High,
                1 => Priority::Normal,
                _ => Priority::Low,
            });
        if tenant > 0 {
            ticket = ticket.tenant(format!("t{tenant}"));
        }
        let id = self.new_id();
        let mut fut = self.local.acquire_with(h, m, &ticket);
        let local = poll(&mut fut);
        let desc = Desc::of(&ticket);
        let reply = self.call(key, &Op::Acquire(&id, &desc));
        match (local, reply.status) {
            (Poll::Ready(Ok(permit)), Status::Yes) => {
                self.holders.insert(id, (key, permit));
            }
            (Poll::Pending, Status::Queued) => {
                self.waiters.insert(id, Waiting { key, fut });
            }
            (Poll::Ready(Err(AcquireError::QueueFull)), Status::No) => {}
            (Poll::Ready(Err(AcquireError::TooHeavy { parallel, .. })), Status::TooHeavy(p))
                if parallel == p => {}
            (local, status) => panic!("acquire {id} on {h}/{m}: local {local:?}, store {status:?}"),
        }
        reply
    }

    /// Exactly the waiters the store granted or refused in this step are ready locally.
    fn compare_moved(&mut self, reply: &Reply) {
        let mut granted = BTreeSet::new();
        let mut refused = BTreeSet::new();
        let ids: Vec<String> = self.waiters.keys().cloned().collect();
        for id in ids {
            let waiting = self.waiters.get_mut(&id).expect("listed");
            match poll(&mut waiting.fut) {
                Poll::Pending => {}
                Poll::Ready(Ok(permit)) => {
                    let key = waiting.key;
                    self.waiters.remove(&id);
                    self.holders.insert(id.clone(), (key, permit));
                    granted.insert(id);
                }
                Poll::Ready(Err(AcquireError::TooHeavy { parallel, .. })) => {
                    self.waiters.remove(&id);
                    refused.insert((id, parallel));
                }
                Poll::Ready(Err(other)) => panic!("waiter {id}: {other:?}"),
            }
        }
        // An acquire granted by its own join (a higher class, say) is in the store's list too;
        // locally it was never a waiter here.
        let store_granted: BTreeSet<String> = reply
            .granted
            .iter()
            .filter(|id| !self.holders.contains_key(*id) || granted.contains(*id))
            .cloned()
            .collect();
        assert_eq!(store_granted, granted, "granted by this step");
        let store_refused: BTreeSet<(String, usize)> = reply.refused.iter().cloned().collect();
        assert_eq!(store_refused, refused, "refused by this step");
    }

    /// Units held, waiters and the host cap of the key the step was about equal; and every
    /// waiter's position.
    fn compare_counts(&mut self, key: usize, reply: &Reply) {
        let (h, m) = KEYS[key];
        assert_eq!(
            reply.holders,
            self.local.in_flight(h, m),
            "units held on {h}/{m}"
        );
        assert_eq!(reply.waiters, self.local.queued(h, m), "waiters on {h}/{m}");
        let cap = reply
            .cap
            .map(|c| (c.parallel, c.in_flight, c.blocked_models));
        let local_cap = self
            .local
            .host_reading(h)
            .map(|c| (c.parallel, c.in_flight, c.blocked_models));
        assert_eq!(cap, local_cap, "the host cap of {h}");
        let ids: Vec<(String, usize)> = self
            .waiters
            .iter()
            .map(|(id, w)| (id.clone(), w.key))
            .collect();
        for (id, key) in ids {
            let local = self.waiters[&id].fut.position().map(|p| p.ahead);
            let store = self.call(key, &Op::Position(&id)).ahead;
            assert_eq!(store, local, "position of {id}");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn script_matches_the_local_limiter(actions in proptest::collection::vec(action(), 1..80)) {
        with_redis(|rt, conn, prefix| {
            let local = Limiter::new();
            // The cap of `h1` exists before its keys, as the gateway configures it.
            local.configure_host("h1", 4);
            let mut sides = Sides {
                rt,
                conn: conn.clone(),
                names: KEYS.iter().map(|(h, m)| KeyNames::new(prefix, h, m)).collect(),
                local,
                configs: [KeyConfig { parallel: 1, queue: 0, order: QueueOrder::Fifo }; 3],
                cap: 4,
                force: [false; 3],
                force_cap: true,
                next: 0,
                waiters: BTreeMap::new(),
                holders: BTreeMap::new(),
            };
            for action in actions {
                sides.apply(action);
            }
        });
    }
}

// ===== the shared store's own cases =====

fn call(
    rt: &tokio::runtime::Runtime,
    conn: &redis::aio::MultiplexedConnection,
    names: &KeyNames,
    config: (usize, usize),
    op: &Op<'_>,
) -> Reply {
    let config = Config {
        parallel: config.0,
        queue: config.1,
        order: QueueOrder::Fifo,
        cap: None,
        force_key: false,
        force_cap: false,
    };
    rt.block_on(script::call(&mut conn.clone(), names, &config, op))
        .unwrap()
}

#[test]
fn key_names_are_unambiguous_and_one_host_shares_one_hash_tag() {
    let a = KeyNames::new("p", "h|x", "m");
    let b = KeyNames::new("p", "h", "x|m");
    assert_ne!(a.keys()[0], b.keys()[0]);
    let c = KeyNames::new("p", "h|x", "other");
    assert_eq!(a.keys(), c.keys(), "the models of one host share its data");
    for key in a.keys() {
        assert!(key.starts_with("p:{3:h|x}:"), "{key}");
    }
}

/// The bug behind a flaky `QueueFull`: an acquire retried after a timed-out call must keep its
/// one place, not take a second one (the limiter retries with the same lease id).
#[test]
fn a_retried_acquire_takes_one_place_not_two() {
    with_redis(|rt, conn, prefix| {
        let names = KeyNames::new(prefix, "http://gpu-1:8080", "llama");
        let one = Desc::of(&Ticket::new());
        let call = |op: Op<'_>| call(rt, conn, &names, (1, 1), &op);
        let holder = call(Op::Acquire("r/1/60000", &one));
        assert_eq!((holder.status, holder.holders), (Status::Yes, 1));
        let again = call(Op::Acquire("r/1/60000", &one));
        assert_eq!((again.status, again.holders), (Status::Yes, 1));
        let waiter = call(Op::Acquire("r/2/60000", &one));
        assert_eq!((waiter.status, waiter.waiters), (Status::Queued, 1));
        // The retry of the waiter: still queued, still one waiter, so the queue is not full
        // of one client.
        let retry = call(Op::Acquire("r/2/60000", &one));
        assert_eq!((retry.status, retry.waiters), (Status::Queued, 1));
        // The holder leaves: the waiter is granted, once.
        let release = call(Op::Release("r/1/60000"));
        assert_eq!(release.granted, vec!["r/2/60000".to_owned()]);
        assert_eq!((release.holders, release.waiters), (1, 0));
        // A release that arrives before its acquire (a cancel that overtook it) wins.
        call(Op::Release("r/3/60000"));
        assert_eq!(call(Op::Acquire("r/3/60000", &one)).status, Status::Gone);
    });
}

/// Leases that expire (a lease of 0 ms expires at the very next call): a holder's units pass
/// to the head waiter, a waiter leaves its line, and the expiries are counted.
#[test]
fn expired_leases_pass_their_units_on() {
    with_redis(|rt, conn, prefix| {
        let names = KeyNames::new(prefix, "h", "m");
        let two = Desc::of(&Ticket::new().weight(2));
        let one = Desc::of(&Ticket::new());
        let call = |op: Op<'_>| call(rt, conn, &names, (2, 4), &op);
        // A holder whose lease runs out at the next call.
        assert_eq!(call(Op::Acquire("dies/1/0", &two)).status, Status::Yes);
        let next = call(Op::Position("nobody/0/1"));
        assert_eq!((next.expired, next.holders), (1, 0));
        // A waiter whose lease runs out leaves its line: the one behind it is next.
        assert_eq!(call(Op::Acquire("h/2/60000", &two)).status, Status::Yes);
        assert_eq!(call(Op::Acquire("dies/3/0", &one)).status, Status::Queued);
        let behind = call(Op::Acquire("w/4/60000", &one));
        assert_eq!(
            (behind.status, behind.expired, behind.waiters),
            (Status::Queued, 1, 1)
        );
        assert_eq!(behind.ahead, Some(0));
        let released = call(Op::Release("h/2/60000"));
        assert_eq!(released.granted, vec!["w/4/60000".to_owned()]);
    });
}

/// Redis lost every key of a host; the replica's renewal puts its holders back (above the cap
/// if need be) and its waiters at the back of their line.
#[test]
fn a_renewal_puts_lost_leases_back() {
    with_redis(|rt, conn, prefix| {
        let names = KeyNames::new(prefix, "h", "m");
        let one = Desc::of(&Ticket::new());
        let call = |op: Op<'_>| call(rt, conn, &names, (1, 4), &op);
        assert_eq!(call(Op::Acquire("a/1/60000", &one)).status, Status::Yes);
        assert_eq!(call(Op::Acquire("a/2/60000", &one)).status, Status::Queued);
        rt.block_on(
            redis::cmd("DEL")
                .arg(names.keys().to_vec())
                .query_async::<()>(&mut conn.clone()),
        )
        .unwrap();
        // Meanwhile another replica took the one slot of the empty store.
        assert_eq!(call(Op::Acquire("b/1/60000", &one)).status, Status::Yes);
        let renewals = [
            ("a/1/60000".to_owned(), true, one.clone()),
            ("a/2/60000".to_owned(), false, one.clone()),
        ];
        let renewed = call(Op::Renew(&renewals));
        assert_eq!(renewed.restored, 2);
        assert_eq!(
            (renewed.holders, renewed.waiters),
            (2, 1),
            "above the cap until it drains"
        );
        assert_eq!(call(Op::Release("b/1/60000")).granted, Vec::<String>::new());
        assert_eq!(
            call(Op::Release("a/1/60000")).granted,
            vec!["a/2/60000".to_owned()]
        );
        // A renewal of a waiter that was granted meanwhile reports it.
        let reported = call(Op::Renew(&renewals[1..]));
        assert_eq!(reported.reported, vec!["a/2/60000".to_owned()]);
    });
}
