//! loom models of the races that matter (run with `--cfg loom`, see the README).
//!
//! Each model explores every interleaving of a few threads around one key, up to the
//! preemption bound, and checks at the end that nothing leaked (`in_flight` and `queued` back to
//! zero, every `Arc` freed — loom's leak check) and that no two permits of a one-slot key were
//! ever held at once.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Waker};

use loom::future::block_on;
use loom::sync::Arc;
use loom::sync::atomic::AtomicUsize;
use loom::thread;

use crate::{AcquireError, Limiter, Priority, Ticket};

const H: &str = "h";
const M: &str = "m";

fn run_model(name: &str, f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        // Bounded by default so the suite finishes in minutes on 2 cores; LOOM_MAX_PREEMPTIONS
        // overrides it.
        builder.preemption_bound = Some(2);
    }
    eprintln!("loom model: {name}");
    builder.check(f);
}

/// Polls a future once with a no-op waker.
fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

/// (a) A release races with the cancellation of the head waiter: the slot ends up either with
/// the second waiter or back in the pool — never leaked, never granted twice.
#[test]
fn release_races_cancel_of_head_waiter() {
    run_model("release_races_cancel_of_head_waiter", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 2);
        let held = l.try_acquire(H, M).unwrap();
        let mut head = l.acquire(H, M);
        assert!(poll_once(&mut head).is_pending());
        let second = l.acquire(H, M);

        let releaser = thread::spawn(move || drop(held));
        let canceller = thread::spawn(move || drop(head));
        releaser.join().unwrap();
        canceller.join().unwrap();

        // Whatever the order, the second waiter now holds the only slot.
        assert_eq!(l.in_flight(H, M), 1);
        assert_eq!(l.queued(H, M), 0);
        let permit = block_on(second).expect("the slot passed on");
        drop(permit);
        assert_eq!(l.in_flight(H, M), 0);
    });
}

/// (b) Two acquirers and a releaser on a key with parallel 1, queue 1: never two permits at
/// once, and no lost wake-up (a waiter that is granted always completes; `block_on` would
/// deadlock the model otherwise).
#[test]
fn two_acquirers_and_a_releaser() {
    run_model("two_acquirers_and_a_releaser", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 1);
        let held = l.try_acquire(H, M).unwrap();
        let holders = Arc::new(AtomicUsize::new(1));

        let acquirer = |l: Limiter, holders: Arc<AtomicUsize>| {
            move || match block_on(l.acquire(H, M)) {
                Ok(permit) => {
                    let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                    assert_eq!(now, 1, "two permits held at once");
                    holders.fetch_sub(1, Ordering::SeqCst);
                    drop(permit);
                    true
                }
                Err(AcquireError::QueueFull) => false,
                Err(e) => panic!("unexpected {e}"),
            }
        };
        let a = thread::spawn(acquirer(l.clone(), holders.clone()));
        let b = thread::spawn(acquirer(l.clone(), holders.clone()));
        holders.fetch_sub(1, Ordering::SeqCst);
        drop(held);

        let served = usize::from(a.join().unwrap()) + usize::from(b.join().unwrap());
        assert!(served >= 1, "at least one acquirer is served");
        assert_eq!(l.in_flight(H, M), 0);
        assert_eq!(l.queued(H, M), 0);
    });
}

/// (c) Reconfiguration races with a release: growing `parallel` while a permit is released
/// grants the queued waiters exactly once each, and everything drains to zero.
#[test]
fn reconfigure_races_release() {
    run_model("reconfigure_races_release", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 2);
        let held = l.try_acquire(H, M).unwrap();
        let mut w1 = l.acquire(H, M);
        let mut w2 = l.acquire(H, M);
        assert!(poll_once(&mut w1).is_pending());
        assert!(poll_once(&mut w2).is_pending());

        let l2 = l.clone();
        let reconfig = thread::spawn(move || l2.configure(H, M, 2, 2));
        let releaser = thread::spawn(move || drop(held));
        reconfig.join().unwrap();
        releaser.join().unwrap();

        // Two slots, two waiters, the first permit gone: both waiters hold one.
        assert_eq!(l.in_flight(H, M), 2);
        assert_eq!(l.queued(H, M), 0);
        let p1 = block_on(w1).unwrap();
        let p2 = block_on(w2).unwrap();
        drop((p1, p2));
        assert_eq!(l.in_flight(H, M), 0);
    });
}

/// Shrinking races with a release: the release must not hand the slot over while the key is
/// over its new limit.
#[test]
fn shrink_races_release() {
    run_model("shrink_races_release", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 2, 1);
        let a = l.try_acquire(H, M).unwrap();
        let b = l.try_acquire(H, M).unwrap();
        let mut w = l.acquire(H, M);
        assert!(poll_once(&mut w).is_pending());

        let l2 = l.clone();
        let shrink = thread::spawn(move || l2.configure(H, M, 1, 1));
        let releaser = thread::spawn(move || drop(a));
        shrink.join().unwrap();
        releaser.join().unwrap();

        // Either the release came first (handed to w: in flight 2) or the shrink did (drained
        // to 1, w still waits). Never more than the two slots that existed.
        let in_flight = l.in_flight(H, M);
        let queued = l.queued(H, M);
        assert!(
            (in_flight, queued) == (2, 0) || (in_flight, queued) == (1, 1),
            "unexpected state: {in_flight} in flight, {queued} queued"
        );
        drop(b);
        let p = block_on(w).unwrap();
        assert_eq!(l.in_flight(H, M), 1);
        drop(p);
        assert_eq!(l.in_flight(H, M), 0);
    });
}

/// The "poll once, then drop" model (tokio's `concurrent_cancel`): waiters enqueued and
/// dropped on two threads while a third releases; nothing leaks.
#[test]
fn concurrent_cancel() {
    run_model("concurrent_cancel", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 2);
        let held = l.try_acquire(H, M).unwrap();

        let spawn_canceller = |l: Limiter| {
            thread::spawn(move || {
                let mut fut = l.acquire(H, M);
                let _ = poll_once(&mut fut);
                drop(fut);
            })
        };
        let t1 = spawn_canceller(l.clone());
        let t2 = spawn_canceller(l.clone());
        drop(held);
        t1.join().unwrap();
        t2.join().unwrap();

        assert_eq!(l.in_flight(H, M), 0);
        assert_eq!(l.queued(H, M), 0);
    });
}

/// Removing a key races with a waiter: the waiter ends with `Closed` or a permit (if it was
/// granted first), never hangs, and a held permit stays valid.
#[test]
fn remove_races_waiter() {
    run_model("remove_races_waiter", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 1);
        let held = l.try_acquire(H, M).unwrap();
        let waiter = {
            let l = l.clone();
            thread::spawn(move || block_on(l.acquire(H, M)).map(drop))
        };
        let l2 = l.clone();
        let remover = thread::spawn(move || l2.remove(H, M));
        drop(held);
        let outcome = waiter.join().unwrap();
        assert!(remover.join().unwrap());
        assert!(matches!(
            outcome,
            Ok(()) | Err(AcquireError::Closed | AcquireError::QueueFull)
        ));
        assert_eq!(l.in_flight(H, M), 0);
    });
}

// ===== weighted permits =====

/// A heavy head (weight 2) with a light waiter behind it; the two units come back on two
/// threads while a third keeps trying to slip in. The heavy head is granted first whatever the
/// order, the light waiter is never granted ahead of it, and no newcomer takes a set-aside unit.
#[test]
fn weighted_heavy_head_with_light_waiter_behind() {
    run_model("weighted_heavy_head_with_light_waiter_behind", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 2, 2);
        let a = l.try_acquire(H, M).unwrap();
        let b = l.try_acquire(H, M).unwrap();
        let mut heavy = l.acquire_many(H, M, 2);
        let mut light = l.acquire(H, M);
        assert!(poll_once(&mut heavy).is_pending());
        assert!(poll_once(&mut light).is_pending());

        let t1 = thread::spawn(move || drop(a));
        let t2 = thread::spawn(move || drop(b));
        let sneaker = {
            let l = l.clone();
            thread::spawn(move || l.try_acquire(H, M).is_err())
        };
        t1.join().unwrap();
        t2.join().unwrap();
        assert!(sneaker.join().unwrap(), "a newcomer overtook the queue");

        // Both units went to the heavy head; the light waiter still waits.
        assert_eq!(l.in_flight(H, M), 2);
        assert_eq!(l.queued(H, M), 1);
        assert!(poll_once(&mut light).is_pending());
        let big = block_on(heavy).expect("heavy head granted");
        assert_eq!(big.weight(), 2);
        drop(big);
        let small = block_on(light).expect("then the light one");
        drop(small);
        assert_eq!(l.in_flight(H, M), 0);
    });
}

/// A heavy head holding a partial grant (one of its two units set aside) is cancelled while
/// another unit comes back: the light waiter behind ends up with a unit either way, and
/// nothing leaks.
#[test]
fn weighted_cancel_heavy_head_holding_a_partial_grant() {
    run_model("weighted_cancel_heavy_head_holding_a_partial_grant", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 2, 2);
        let a = l.try_acquire(H, M).unwrap();
        let b = l.try_acquire(H, M).unwrap();
        let mut heavy = l.acquire_many(H, M, 2);
        let mut light = l.acquire(H, M);
        assert!(poll_once(&mut heavy).is_pending());
        assert!(poll_once(&mut light).is_pending());
        drop(a); // the heavy head's partial grant: one unit set aside
        assert_eq!(l.in_flight(H, M), 1);

        let releaser = thread::spawn(move || drop(b));
        let canceller = thread::spawn(move || drop(heavy));
        releaser.join().unwrap();
        canceller.join().unwrap();

        // Heavy granted then cancelled (its 2 units pass on), or cancelled first: either way
        // the light waiter holds one unit and the other is free.
        assert_eq!(l.in_flight(H, M), 1);
        assert_eq!(l.queued(H, M), 0);
        let small = block_on(light).expect("the partial grant passed on");
        drop(small);
        assert_eq!(l.in_flight(H, M), 0);
    });
}

/// A release completes a heavy waiter's partial grant while the waiter blocks on another
/// thread: it is woken (no lost wake-up: `block_on` would hang the model) and holds its whole
/// weight, never more units than `parallel` are out.
#[test]
fn weighted_release_completes_a_partial_grant() {
    run_model("weighted_release_completes_a_partial_grant", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 3, 1);
        let one = l.try_acquire(H, M).unwrap();
        let two = l.try_acquire_many(H, M, 2).unwrap();
        let heavy = l.acquire_many(H, M, 3);
        drop(one); // partial grant: one of three units set aside

        let waiter = {
            let l = l.clone();
            thread::spawn(move || {
                let permit = block_on(heavy).expect("granted");
                assert_eq!(l.in_flight(H, M), 3);
                permit.weight()
            })
        };
        let releaser = thread::spawn(move || drop(two));
        releaser.join().unwrap();
        assert_eq!(waiter.join().unwrap(), 3);
        assert_eq!(l.in_flight(H, M), 0);
        assert_eq!(l.queued(H, M), 0);
    });
}

// ===== host caps (two levels) =====

/// Two models under a host cap of 1, one slot each. A permit of model `a` is released while
/// acquirers of `a` and `b` block on two threads: the host never has two permits out, nobody
/// waits for ever (no lost wake-up across the two levels: `block_on` would hang the model), no
/// deadlock between the key and host locks, and everything drains to zero.
#[test]
fn two_levels_release_races_acquirers_of_two_models() {
    run_model("two_levels_release_races_acquirers_of_two_models", || {
        let l: Limiter = Limiter::new();
        l.configure_host(H, 1);
        l.configure(H, "a", 1, 1);
        l.configure(H, "b", 1, 1);
        let held = l.try_acquire(H, "a").unwrap();
        let holders = Arc::new(AtomicUsize::new(1));

        let acquirer = |model: &'static str, l: Limiter, holders: Arc<AtomicUsize>| {
            move || {
                let permit = block_on(l.acquire(H, model)).expect("room in the queue");
                let now = holders.fetch_add(1, Ordering::SeqCst) + 1;
                assert_eq!(now, 1, "two permits under a host cap of 1");
                holders.fetch_sub(1, Ordering::SeqCst);
                drop(permit);
            }
        };
        let a = thread::spawn(acquirer("a", l.clone(), holders.clone()));
        let b = thread::spawn(acquirer("b", l.clone(), holders.clone()));
        holders.fetch_sub(1, Ordering::SeqCst);
        drop(held);
        a.join().unwrap();
        b.join().unwrap();

        let cap = l.host_reading(H).unwrap();
        assert_eq!((cap.in_flight, cap.blocked_models), (0, 0));
        assert_eq!(l.in_flight(H, "a") + l.in_flight(H, "b"), 0);
    });
}

/// The model first in line for the host cap is cancelled while the unit it waits for comes
/// back: the next model in line gets it either way, and the host queue empties.
#[test]
fn two_levels_cancel_of_the_front_model_races_a_release() {
    run_model(
        "two_levels_cancel_of_the_front_model_races_a_release",
        || {
            let l: Limiter = Limiter::new();
            l.configure_host(H, 1);
            l.configure(H, "a", 1, 0);
            l.configure(H, "b", 1, 1);
            l.configure(H, "c", 1, 1);
            let held = l.try_acquire(H, "a").unwrap();
            let mut b = l.acquire(H, "b");
            let mut c = l.acquire(H, "c");
            assert!(poll_once(&mut b).is_pending());
            assert!(poll_once(&mut c).is_pending());

            let releaser = thread::spawn(move || drop(held));
            let canceller = thread::spawn(move || drop(b));
            releaser.join().unwrap();
            canceller.join().unwrap();

            let cap = l.host_reading(H).unwrap();
            assert_eq!((cap.in_flight, cap.blocked_models), (1, 0));
            let permit = block_on(c).expect("c got the unit");
            drop(permit);
            assert_eq!(l.host_reading(H).unwrap().in_flight, 0);
        },
    );
}

/// The grant step's shortcuts (`key.rs`, issue #13), each racing the release that could make it
/// wrong; on these keys (FIFO, normal class, no host cap) they are the key running plain.
/// (1) A waiter behind the head is cancelled (no grant step) while the permit is released: the
/// head gets the slot whichever goes first, nothing is left over.
#[test]
fn shortcut_cancel_behind_the_head_races_release() {
    run_model("shortcut_cancel_behind_the_head_races_release", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 2);
        let held = l.try_acquire(H, M).unwrap();
        let head = l.acquire(H, M);
        let mut behind = l.acquire(H, M);
        assert!(poll_once(&mut behind).is_pending());

        let releaser = thread::spawn(move || drop(held));
        let canceller = thread::spawn(move || drop(behind));
        releaser.join().unwrap();
        canceller.join().unwrap();

        assert_eq!(l.in_flight(H, M), 1);
        assert_eq!(l.queued(H, M), 0);
        drop(block_on(head).expect("the head got the slot"));
        assert_eq!(l.in_flight(H, M), 0);
    });
}

/// (2) A join behind a waiting head (no grant step) races the release that grants the head:
/// the newcomer either queues behind the head or, once the head is granted, is the head itself;
/// either way it is served when the head lets go, with no lost wake-up.
#[test]
fn shortcut_join_behind_a_waiter_races_release() {
    run_model("shortcut_join_behind_a_waiter_races_release", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 2);
        let held = l.try_acquire(H, M).unwrap();
        let head = l.acquire(H, M);

        let releaser = thread::spawn(move || drop(held));
        let l2 = l.clone();
        let joiner = thread::spawn(move || {
            let permit = block_on(l2.acquire(H, M)).expect("served after the head");
            drop(permit);
        });
        // The head is served first (FIFO) and lets go, which serves the joiner.
        drop(block_on(head).expect("the head got the slot"));
        releaser.join().unwrap();
        joiner.join().unwrap();
        assert_eq!(l.in_flight(H, M), 0);
        assert_eq!(l.queued(H, M), 0);
    });
}

/// (3) A release with nobody waiting (no grant step) races a newcomer: the newcomer takes the
/// slot at once or queues and is woken by the release; it never waits for ever.
#[test]
fn shortcut_release_with_nobody_waiting_races_a_join() {
    run_model("shortcut_release_with_nobody_waiting_races_a_join", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 1);
        let held = l.try_acquire(H, M).unwrap();
        let l2 = l.clone();
        let joiner = thread::spawn(move || {
            drop(block_on(l2.acquire(H, M)).expect("served"));
        });
        drop(held);
        joiner.join().unwrap();
        assert_eq!(l.in_flight(H, M), 0);
        assert_eq!(l.queued(H, M), 0);
    });
}

/// (4) A key running plain (`key.rs`: FIFO, nobody waiting outside the normal class) leaves it
/// when a high-class waiter joins, while a release races: whichever goes first, both waiters
/// are served, no wake-up is lost and nothing is left over.
#[test]
fn plain_key_leaves_plain_as_a_release_races() {
    run_model("plain_key_leaves_plain_as_a_release_races", || {
        let l: Limiter = Limiter::new();
        l.configure(H, M, 1, 2);
        let held = l.try_acquire(H, M).unwrap();
        let normal = l.acquire(H, M);

        let releaser = thread::spawn(move || drop(held));
        let l2 = l.clone();
        let high = thread::spawn(move || {
            let ticket = Ticket::new().priority(Priority::High);
            drop(block_on(l2.acquire_with(H, M, &ticket)).expect("served"));
        });
        drop(block_on(normal).expect("served"));
        releaser.join().unwrap();
        high.join().unwrap();
        assert_eq!(l.in_flight(H, M), 0);
        assert_eq!(l.queued(H, M), 0);
        // Nothing left over: a new acquire is granted at once.
        drop(l.try_acquire(H, M).expect("free"));
    });
}
