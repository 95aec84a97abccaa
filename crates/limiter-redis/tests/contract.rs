//! One contract, every implementation: the rules of the admission trait run against the local
//! limiter, the shared limiter with one replica, and the shared limiter with two replicas (two
//! independent limiters on one Redis, acquires alternating between them).
//!
//! Each rule is one async function over a [`Harness`]; the `contract!` macro at the bottom
//! instantiates it for the three set-ups, so a rule added here is proven on all of them at once.
//! Redis is the one on `127.0.0.1:6379` (or `SLOTGATE_TEST_REDIS_URL`); each test uses its own
//! key prefix and deletes its keys.
//!
//! The shared limiter takes a place in line when the acquire's script call returns, and
//! releases in the background, so the harness waits for those (bounded by [`LIMIT`]) where the
//! local limiter has them at once: [`Harness::join`] waits until the new waiter is counted, and
//! [`Harness::settled`] until the counts every replica sees are the expected ones.

mod support;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use slotgate_admission::{Admission, AdmitError, AdmitFuture, Occupancy, Slot};
use slotgate_limiter::{Limiter, Priority, QueueOrder, Ticket};
use support::{Prefix, eventually, redis_url};

const HOST: &str = "http://gpu-1:8080";
const MODEL: &str = "llama";
/// A second model of the same host, for the engine-wide cap.
const OTHER: &str = "llama-lora";
/// A lease of the shared set-ups: short, so the expiry rule runs in about two seconds.
const TTL: Duration = Duration::from_millis(1500);
/// The bound on every wait of the harness.
const LIMIT: Duration = Duration::from_secs(20);

/// Which implementation a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Local,
    /// The shared limiter, with this many replicas.
    Shared(usize),
}

/// The replicas of one set-up, and what is needed to observe them.
struct Harness {
    kind: Kind,
    replicas: Vec<Arc<dyn Admission>>,
    prefix: Option<Prefix>,
}

impl Harness {
    fn new(kind: Kind) -> Self {
        match kind {
            Kind::Local => Self {
                kind,
                replicas: vec![Arc::new(Limiter::<String, String>::new())],
                prefix: None,
            },
            Kind::Shared(n) => {
                let prefix = Prefix::new(&redis_url());
                let replicas = (0..n)
                    .map(|_| Arc::new(prefix.limiter(TTL)) as Arc<dyn Admission>)
                    .collect();
                Self {
                    kind,
                    replicas,
                    prefix: Some(prefix),
                }
            }
        }
    }

    /// The replica the `i`-th request of a test goes to: alternating between replicas.
    fn replica(&self, i: usize) -> &Arc<dyn Admission> {
        &self.replicas[i % self.replicas.len()]
    }

    /// Configures the key on every replica (as every gateway does from its own file), and
    /// waits until the shared store has the limits.
    async fn configure(&self, parallel: usize, queue: usize) {
        for replica in &self.replicas {
            replica.configure(HOST, MODEL, parallel, queue);
        }
        if let Some(prefix) = &self.prefix {
            eventually(LIMIT, "the limits reached Redis", || {
                prefix.limits(HOST, MODEL) == Some((parallel, queue))
            })
            .await;
        }
    }

    /// Sets the key's order on every replica, and waits until the shared store has it.
    async fn order(&self, model: &str, order: QueueOrder) {
        for replica in &self.replicas {
            replica.configure_order(HOST, model, order);
        }
        if let Some(prefix) = &self.prefix {
            let fair = order == QueueOrder::Fair;
            eventually(LIMIT, "the order reached Redis", || {
                prefix.state(HOST, model).is_some_and(|s| s.fair == fair)
            })
            .await;
        }
    }

    /// Caps the host on every replica (after its models are configured), and waits until the
    /// shared store has it.
    async fn cap(&self, parallel: usize) {
        for replica in &self.replicas {
            replica.configure_host(HOST, parallel);
        }
        if let Some(prefix) = &self.prefix {
            eventually(LIMIT, "the host cap reached Redis", || {
                prefix
                    .state(HOST, MODEL)
                    .is_some_and(|s| s.cap == Some(parallel))
            })
            .await;
        }
    }

    /// The key's counts across every replica (units held, waiters): the local limiter's own,
    /// or (shared) what Redis holds now.
    fn occupancy(&self) -> Occupancy {
        self.occupancy_of(MODEL)
    }

    fn occupancy_of(&self, model: &str) -> Occupancy {
        match &self.prefix {
            None => self.replicas[0].local(HOST, model),
            Some(prefix) => Occupancy::new(
                prefix.zcard(HOST, model, "holders"),
                prefix.zcard(HOST, model, "waiters"),
            ),
        }
    }

    /// Starts the `i`-th acquire of `model` with `ticket` in a task that, once granted, writes
    /// `label` into `log` and releases at once; waits until it is queued (`queued` waiters of
    /// the model in all after it).
    async fn join_logged(
        &self,
        i: usize,
        model: &str,
        ticket: &Ticket,
        queued: usize,
        (log, label): (&Log, &'static str),
    ) -> tokio::task::JoinHandle<()> {
        let acquire = self.replica(i).acquire_with(HOST, model, ticket);
        let log = Arc::clone(log);
        let task = tokio::spawn(async move {
            let slot = acquire.await.expect("granted");
            log.lock().push(label);
            drop(slot);
        });
        eventually(LIMIT, "the waiter joined the queue", || {
            self.occupancy_of(model).queued == queued
        })
        .await;
        task
    }

    /// Waits until the key's counts are `expected` (releases and cancels of the shared limiter
    /// reach Redis in the background).
    async fn settled(&self, expected: Occupancy, what: &str) {
        eventually(LIMIT, what, || self.occupancy() == expected).await;
    }

    /// Starts the `i`-th acquire in a task and waits until it is queued (`queued` waiters in
    /// all after it), so that arrival order is the order of these calls.
    async fn join(
        &self,
        i: usize,
        queued: usize,
    ) -> tokio::task::JoinHandle<Result<Slot, AdmitError>> {
        let acquire = self.replica(i).acquire(HOST, MODEL);
        let task = tokio::spawn(acquire);
        eventually(LIMIT, "the waiter joined the queue", || {
            self.occupancy().queued == queued
        })
        .await;
        task
    }

    /// An acquire that must be granted at once (no waiting beyond the round trip).
    async fn granted(&self, i: usize) -> Slot {
        let acquire = self.replica(i).acquire(HOST, MODEL);
        match tokio::time::timeout(LIMIT, acquire).await {
            Ok(Ok(slot)) => slot,
            other => panic!(
                "{:?}: acquire {i} should be granted at once: {other:?}",
                self.kind
            ),
        }
    }

    /// An acquire that must be refused at once with `QueueFull`.
    async fn refused(&self, i: usize) {
        let outcome = tokio::time::timeout(LIMIT, self.replica(i).acquire(HOST, MODEL)).await;
        assert!(
            matches!(outcome, Ok(Err(AdmitError::QueueFull))),
            "{:?}: acquire {i} should be refused with QueueFull: {outcome:?}",
            self.kind
        );
    }
}

/// The order in which logged waiters were granted.
type Log = Arc<Mutex<Vec<&'static str>>>;

/// Awaits every task, each bounded by [`LIMIT`], and returns the log.
async fn finish(tasks: Vec<tokio::task::JoinHandle<()>>, log: &Log) -> Vec<&'static str> {
    for task in tasks {
        tokio::time::timeout(LIMIT, task)
            .await
            .expect("every waiter is granted in time")
            .expect("the task did not panic");
    }
    log.lock().clone()
}

/// Awaits a waiter's task, which must end with a slot within [`LIMIT`].
async fn slot_of(task: tokio::task::JoinHandle<Result<Slot, AdmitError>>) -> Slot {
    tokio::time::timeout(LIMIT, task)
        .await
        .expect("the waiter is granted in time")
        .expect("the task did not panic")
        .expect("the waiter is granted a slot")
}

/// Whether `task` is still waiting after a short while (a grant would arrive well within it).
async fn still_waiting<T>(task: &tokio::task::JoinHandle<T>) -> bool {
    tokio::time::sleep(Duration::from_millis(100)).await;
    !task.is_finished()
}

// ===== the rules =====

/// Rule 1: an unconfigured key behaves as `parallel = 1, queue = 0`.
async fn unconfigured_key_is_one_slot_no_queue(h: Harness) {
    let held = h.granted(0).await;
    h.refused(1).await;
    drop(held);
    h.settled(Occupancy::new(0, 0), "the release reached the store")
        .await;
    drop(h.granted(1).await);
}

/// The cap: at most `parallel` slots at once, whichever replica asks; the rest queue up to
/// `queue` and are refused at once beyond it.
async fn cap_and_queue_bound_hold(h: Harness) {
    h.configure(2, 2).await;
    let held = [h.granted(0).await, h.granted(1).await];
    let waiting = [h.join(2, 1).await, h.join(3, 2).await];
    h.refused(4).await;
    h.refused(5).await;
    assert_eq!(h.occupancy(), Occupancy::new(2, 2));
    drop(held);
    for task in waiting {
        drop(slot_of(task).await);
    }
    h.settled(Occupancy::new(0, 0), "every slot came back")
        .await;
}

/// FIFO with direct handoff: each release goes to the oldest waiter, whichever replica it
/// waits on, and never to a later arrival.
async fn fifo_with_direct_handoff(h: Harness) {
    h.configure(1, 8).await;
    let mut held = h.granted(0).await;
    let mut waiting = Vec::new();
    for i in 1..=5 {
        waiting.push(h.join(i, i).await);
    }
    for (i, task) in waiting.into_iter().enumerate() {
        // The holder leaves: the slot goes to waiter `i`, and the key never has a free slot a
        // newcomer could take (its count of holders stays 1).
        drop(held);
        held = slot_of(task).await;
        let left = 4 - i;
        h.settled(Occupancy::new(1, left), "the handoff reached the store")
            .await;
    }
    drop(held);
    h.settled(Occupancy::new(0, 0), "the last release").await;
}

/// Cancel: a dropped wait leaves the queue at once, and its place goes to the next arrival;
/// the slot is never handed to the dropped waiter.
async fn a_dropped_waiter_leaves_the_queue(h: Harness) {
    h.configure(1, 1).await;
    let held = h.granted(0).await;
    let waiting = h.join(1, 1).await;
    h.refused(2).await;
    waiting.abort();
    h.settled(Occupancy::new(1, 0), "the dropped waiter left the queue")
        .await;
    let next = h.join(2, 1).await;
    drop(held);
    drop(slot_of(next).await);
    h.settled(Occupancy::new(0, 0), "every slot came back")
        .await;
}

/// Timeout: a wait bounded by the caller (the gateway's `queue_timeout`) that runs out is a
/// dropped wait: it leaves the queue and takes nothing.
async fn a_timed_out_wait_leaves_the_queue(h: Harness) {
    h.configure(1, 4).await;
    let held = h.granted(0).await;
    let acquire: AdmitFuture = h.replica(1).acquire(HOST, MODEL);
    let timed_out = tokio::time::timeout(Duration::from_millis(300), acquire).await;
    assert!(timed_out.is_err(), "{:?}: nobody released", h.kind);
    h.settled(Occupancy::new(1, 0), "the timed-out waiter left the queue")
        .await;
    drop(held);
    h.settled(Occupancy::new(0, 0), "the release").await;
}

/// Reconfiguring: growing `parallel` grants waiters at once; shrinking it revokes nothing and
/// lets the holders drain before the next grant.
async fn reconfiguring_grants_or_drains(h: Harness) {
    h.configure(1, 4).await;
    let first = h.granted(0).await;
    let second = h.join(1, 1).await;
    let third = h.join(2, 2).await;
    h.configure(2, 4).await;
    let second = slot_of(second).await;
    assert!(
        still_waiting(&third).await,
        "{:?}: only one slot grew",
        h.kind
    );
    h.configure(1, 4).await;
    // Two held above the new cap of one: nothing revoked, and the next grant waits for both.
    drop(first);
    h.settled(Occupancy::new(1, 1), "the first release").await;
    assert!(
        still_waiting(&third).await,
        "{:?}: still above the cap",
        h.kind
    );
    drop(second);
    drop(slot_of(third).await);
    h.settled(Occupancy::new(0, 0), "every slot came back")
        .await;
}

/// Shrinking `queue` keeps the waiters already in line, and refuses newcomers until it drains.
async fn shrinking_the_queue_keeps_its_waiters(h: Harness) {
    h.configure(1, 3).await;
    let held = h.granted(0).await;
    let waiting = [h.join(1, 1).await, h.join(2, 2).await];
    h.configure(1, 1).await;
    h.refused(3).await;
    assert_eq!(h.occupancy(), Occupancy::new(1, 2));
    drop(held);
    for task in waiting {
        drop(slot_of(task).await);
    }
    h.settled(Occupancy::new(0, 0), "every slot came back")
        .await;
}

/// Release: every way of giving a slot back (drop, `release`) frees it for the next acquire,
/// and nothing leaks after many rounds.
async fn release_frees_the_slot(h: Harness) {
    h.configure(1, 0).await;
    for i in 0..6 {
        let slot = h.granted(i).await;
        if i % 2 == 0 {
            slot.release();
        } else {
            drop(slot);
        }
        h.settled(Occupancy::new(0, 0), "the release reached the store")
            .await;
    }
}

/// Lease expiry (the shared limiter only: the local limiter's slots die with its process): a
/// replica that stops renewing loses its slots within `lease_ttl` + one renewal, and the
/// waiters get them.
async fn a_dead_holders_slot_comes_back(h: Harness) {
    if h.kind == Kind::Local {
        return;
    }
    h.configure(1, 2).await;
    // A replica of its own that dies: started on a runtime that is shut down, so it neither
    // renews nor releases.
    let prefix = h.prefix.as_ref().expect("shared set-ups have a prefix");
    let settings = prefix.settings(TTL, slotgate_limiter_redis::OnStoreDown::FailClosed);
    let doomed_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("a runtime");
    let slot = std::thread::spawn(move || {
        doomed_runtime.block_on(async move {
            let doomed = slotgate_limiter_redis::RedisLimiter::start(settings).unwrap();
            doomed.configure(HOST, MODEL, 1, 2);
            let slot = doomed.acquire(HOST, MODEL).await.unwrap();
            // The crash: no release, no renewal from here on.
            std::mem::forget(slot);
        });
        doomed_runtime.shutdown_background();
    });
    slot.join().expect("the doomed replica ran");
    let waiting = h.join(0, 1).await;
    let died = tokio::time::Instant::now();
    drop(slot_of(waiting).await);
    let after = died.elapsed();
    assert!(
        after <= TTL + TTL / 3 + Duration::from_millis(500),
        "granted {after:?} after the crash; the bound is lease_ttl + one renewal"
    );
    h.settled(Occupancy::new(0, 0), "every slot came back")
        .await;
}

/// Weighted permits: a request of weight `w` holds `w` units; a heavy head is never overtaken
/// by a lighter waiter behind it (units freed meanwhile are set aside for it); a weight above
/// `parallel` is refused at once.
async fn weighted_permits_hold_their_units_in_order(h: Harness) {
    h.configure(3, 4).await;
    let two = Ticket::new().weight(2);
    let held = h
        .replica(0)
        .acquire_with(HOST, MODEL, &two)
        .await
        .expect("2 of 3 units");
    assert_eq!(
        h.occupancy().in_flight,
        2,
        "{:?}: units, not requests",
        h.kind
    );
    let too_heavy = h
        .replica(1)
        .acquire_with(HOST, MODEL, &Ticket::new().weight(4))
        .await;
    assert!(
        matches!(
            too_heavy,
            Err(AdmitError::TooHeavy {
                weight: 4,
                parallel: 3
            })
        ),
        "{:?}: {too_heavy:?}",
        h.kind
    );
    let log = Log::default();
    // One unit is free, but the heavy head needs two: the light one behind it waits too.
    let heavy = h
        .join_logged(1, MODEL, &Ticket::new().weight(3), 1, (&log, "heavy"))
        .await;
    let light = h
        .join_logged(2, MODEL, &Ticket::new(), 2, (&log, "light"))
        .await;
    assert!(
        still_waiting(&light).await,
        "{:?}: the light one overtook",
        h.kind
    );
    drop(held);
    assert_eq!(finish(vec![heavy, light], &log).await, ["heavy", "light"]);
    h.settled(Occupancy::new(0, 0), "every unit came back")
        .await;
}

/// The engine-wide cap: the host's models share it, each within its own limit too; a model
/// whose head waits for the cap is served before a newcomer of another model.
async fn an_engine_cap_is_shared_by_the_hosts_models(h: Harness) {
    // The model alone could run 4; the engine runs 3 over both models.
    h.configure(4, 4).await;
    for replica in &h.replicas {
        replica.configure(HOST, OTHER, 3, 4);
    }
    h.cap(3).await;
    let first = h
        .replica(0)
        .acquire_with(HOST, MODEL, &Ticket::new().weight(2))
        .await
        .expect("2 of the engine's 3");
    let second = h
        .replica(1)
        .acquire(HOST, OTHER)
        .await
        .expect("the engine's third");
    let log = Log::default();
    // Both models have room of their own; the engine has none.
    let waits = h
        .join_logged(0, MODEL, &Ticket::new().weight(2), 1, (&log, "model"))
        .await;
    let other = h
        .join_logged(1, OTHER, &Ticket::new(), 1, (&log, "other"))
        .await;
    drop(second);
    // One unit came back: not enough for the model's head, and the other model's newcomer
    // may not take it (the engine's line is first come, first served across models).
    assert!(
        still_waiting(&other).await,
        "{:?}: overtook the engine's line",
        h.kind
    );
    // Both fit once the first holder leaves (granted in the same step, so either may log
    // first).
    drop(first);
    let mut order = finish(vec![waits, other], &log).await;
    order.sort_unstable();
    assert_eq!(order, ["model", "other"]);
    h.settled(Occupancy::new(0, 0), "every unit came back")
        .await;
}

/// The engine-wide cap changed live only lets the blocked models take what is free (the local
/// limiter's `configure_host`): a waiter heavier than a shrunk cap that is full stays queued
/// (held units drain first, as for a key), and once the cap grows back it is granted when its
/// units come back, not refused for the cap it had a moment before.
async fn an_engine_cap_changed_live_keeps_a_heavy_waiter(h: Harness) {
    h.configure(4, 4).await;
    h.cap(2).await;
    let held = h.granted(0).await;
    let log = Log::default();
    // One unit of the engine's two is free; the heavy one needs both.
    let heavy = h
        .join_logged(1, MODEL, &Ticket::new().weight(2), 1, (&log, "heavy"))
        .await;
    // The engine full at its new cap of one: nothing is decided for the heavy one yet.
    h.cap(1).await;
    h.cap(2).await;
    assert!(
        still_waiting(&heavy).await,
        "{:?}: the heavy waiter left the queue while the engine was full",
        h.kind
    );
    assert_eq!(h.occupancy(), Occupancy::new(1, 1), "{:?}", h.kind);
    drop(held);
    assert_eq!(finish(vec![heavy], &log).await, ["heavy"]);
    h.settled(Occupancy::new(0, 0), "every unit came back")
        .await;
}

/// Fair order: a tenant that floods the queue does not hold back another tenant's single
/// request, which is served within the next two grants (equal shares).
async fn fair_order_does_not_starve_a_quiet_tenant(h: Harness) {
    h.configure(1, 16).await;
    h.order(MODEL, QueueOrder::Fair).await;
    let held = h.granted(0).await;
    let log = Log::default();
    let busy = Ticket::new().tenant("busy");
    let mut tasks = Vec::new();
    for i in 0..5 {
        tasks.push(h.join_logged(i, MODEL, &busy, i + 1, (&log, "busy")).await);
    }
    let quiet = Ticket::new().tenant("quiet");
    tasks.push(h.join_logged(5, MODEL, &quiet, 6, (&log, "quiet")).await);
    drop(held);
    let order = finish(tasks, &log).await;
    assert_eq!(
        order,
        ["busy", "quiet", "busy", "busy", "busy", "busy"],
        "{:?}",
        h.kind
    );
}

/// Priority classes: higher first, and a class with waiters passed over
/// [`Priority::PASS_LIMIT`] times in a row is served next.
async fn priority_classes_keep_their_starvation_bound(h: Harness) {
    h.configure(1, 16).await;
    let held = h.granted(0).await;
    let log = Log::default();
    let mut tasks = vec![
        h.join_logged(
            0,
            MODEL,
            &Ticket::new().priority(Priority::Low),
            1,
            (&log, "low"),
        )
        .await,
    ];
    let high = Ticket::new().priority(Priority::High);
    for i in 0..6 {
        tasks.push(
            h.join_logged(i + 1, MODEL, &high, i + 2, (&log, "high"))
                .await,
        );
    }
    drop(held);
    let order = finish(tasks, &log).await;
    let mut expected = vec!["high"; Priority::PASS_LIMIT];
    expected.extend(["low", "high", "high"]);
    assert_eq!(order, expected, "{:?}", h.kind);
}

// ===== one test per rule and set-up =====

macro_rules! contract {
    ($($rule:ident),* $(,)?) => {
        mod local {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::run(super::$rule(super::Harness::new(super::Kind::Local))).await;
                }
            )*
        }
        mod shared_one_replica {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::run(super::$rule(super::Harness::new(super::Kind::Shared(1)))).await;
                }
            )*
        }
        mod shared_two_replicas {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $rule() {
                    super::run(super::$rule(super::Harness::new(super::Kind::Shared(2)))).await;
                }
            )*
        }
    };
}

/// Runs one rule, bounded as a whole.
async fn run(rule: impl Future<Output = ()>) {
    tokio::time::timeout(Duration::from_secs(60), rule)
        .await
        .expect("the rule ran to its end within a minute");
}

contract!(
    unconfigured_key_is_one_slot_no_queue,
    cap_and_queue_bound_hold,
    fifo_with_direct_handoff,
    a_dropped_waiter_leaves_the_queue,
    a_timed_out_wait_leaves_the_queue,
    reconfiguring_grants_or_drains,
    shrinking_the_queue_keeps_its_waiters,
    release_frees_the_slot,
    a_dead_holders_slot_comes_back,
    weighted_permits_hold_their_units_in_order,
    an_engine_cap_is_shared_by_the_hosts_models,
    an_engine_cap_changed_live_keeps_a_heavy_waiter,
    fair_order_does_not_starve_a_quiet_tenant,
    priority_classes_keep_their_starvation_bound,
);
