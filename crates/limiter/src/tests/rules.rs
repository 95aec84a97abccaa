//! One test (or a few) per rule of the contract in the crate docs, driven by hand-polled futures
//! so every interleaving is chosen by the test, not a scheduler.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use crate::{Acquire, AcquireError, Limiter, Limits, Permit, TryAcquireError};

/// A waker that counts its wakes, to prove no wake-up is lost or spurious.
#[derive(Default)]
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// An acquire future polled by hand with its own counting waker.
struct Probe {
    fut: Acquire,
    wakes: Arc<CountingWaker>,
}

impl Probe {
    fn new(fut: Acquire) -> Self {
        Self {
            fut,
            wakes: Arc::default(),
        }
    }

    fn poll(&mut self) -> Poll<Result<Permit, AcquireError>> {
        let waker = Waker::from(self.wakes.clone());
        Pin::new(&mut self.fut).poll(&mut Context::from_waker(&waker))
    }

    fn wakes(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }

    fn granted(&mut self) -> Permit {
        match self.poll() {
            Poll::Ready(Ok(permit)) => permit,
            other => panic!("expected a permit, got {other:?}"),
        }
    }
}

fn limiter() -> Limiter {
    Limiter::new()
}

const H: &str = "http://gpu-1:8080";
const M: &str = "llama";

#[test]
fn rule1_unconfigured_key_is_one_slot_no_queue() {
    let l = limiter();
    let first = l.try_acquire(H, M).expect("one slot");
    assert_eq!(l.limits(H, M), Some(Limits::UNCONFIGURED));
    assert_eq!(
        l.try_acquire(H, M).unwrap_err(),
        TryAcquireError::NoSlot,
        "only one slot"
    );
    let mut probe = Probe::new(l.acquire(H, M));
    assert!(matches!(
        probe.poll(),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
    drop(first);
    assert_eq!(l.in_flight(H, M), 0);
}

#[test]
fn rule2_fifo_grant_order() {
    let l = limiter();
    l.configure(H, M, 1, 10);
    let held = l.try_acquire(H, M).unwrap();
    let mut probes: Vec<_> = (0..5).map(|_| Probe::new(l.acquire(H, M))).collect();
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    let mut current = held;
    for i in 0..5 {
        drop(current);
        for (j, p) in probes.iter_mut().enumerate().skip(i + 1) {
            assert!(p.poll().is_pending(), "waiter {j} overtook waiter {i}");
        }
        assert_eq!(
            probes[i].wakes(),
            1,
            "the head waiter is woken exactly once"
        );
        current = probes[i].granted();
    }
    drop(current);
    assert_eq!(l.in_flight(H, M), 0);
}

#[test]
fn rule2_handoff_keeps_in_flight_and_blocks_late_arrivals() {
    let l = limiter();
    l.configure(H, M, 1, 1);
    let held = l.try_acquire(H, M).unwrap();
    let mut waiter = Probe::new(l.acquire(H, M));
    assert!(waiter.poll().is_pending());
    assert_eq!((l.in_flight(H, M), l.queued(H, M)), (1, 1));

    drop(held);
    // Handed over: still one in flight, nobody queued, and the slot is not up for grabs.
    assert_eq!((l.in_flight(H, M), l.queued(H, M)), (1, 0));
    assert_eq!(l.try_acquire(H, M).unwrap_err(), TryAcquireError::NoSlot);

    let permit = waiter.granted();
    assert!(permit.waited() > std::time::Duration::ZERO || cfg!(miri));
    drop(permit);
    assert_eq!(l.in_flight(H, M), 0);
}

#[test]
fn a_handoff_is_stamped_with_the_grant_step_and_a_free_slot_is_not() {
    use std::time::Instant;
    let l = limiter();
    l.configure(H, M, 1, 1);
    let held = l.try_acquire(H, M).unwrap();
    assert_eq!(held.handed_over(), None, "try_acquire: free at once");
    let mut waiter = Probe::new(l.acquire(H, M));
    assert!(waiter.poll().is_pending());

    let before = Instant::now();
    drop(held);
    let after = Instant::now();
    let permit = waiter.granted();
    let at = permit
        .handed_over()
        .expect("a queued waiter is handed its slot");
    assert!(
        before <= at && at <= after,
        "stamped in the release's grant step"
    );
    drop(permit);

    // Free at call time through `acquire`: no handoff either.
    let mut free = Probe::new(l.acquire(H, M));
    let permit = free.granted();
    assert_eq!(permit.handed_over(), None);
}

#[test]
fn rule3_waiter_dropped_after_grant_passes_the_slot_on() {
    let l = limiter();
    l.configure(H, M, 1, 2);
    let held = l.try_acquire(H, M).unwrap();
    let mut a = Probe::new(l.acquire(H, M));
    let mut b = Probe::new(l.acquire(H, M));
    assert!(a.poll().is_pending() && b.poll().is_pending());

    drop(held); // slot handed to `a` ...
    drop(a); // ... which is dropped before it saw the grant
    assert_eq!(b.wakes(), 1, "the slot passed on to b");
    let permit = b.granted();
    assert_eq!((l.in_flight(H, M), l.queued(H, M)), (1, 0));
    drop(permit);
    assert_eq!(l.in_flight(H, M), 0, "no leak");
}

#[test]
fn rule3_granted_at_call_time_but_never_polled_is_returned() {
    let l = limiter();
    l.configure(H, M, 1, 0);
    drop(l.acquire(H, M));
    assert_eq!(l.in_flight(H, M), 0);
}

#[test]
fn cancellation_of_a_queued_waiter_frees_its_place() {
    let l = limiter();
    l.configure(H, M, 1, 1);
    let _held = l.try_acquire(H, M).unwrap();
    let mut a = Probe::new(l.acquire(H, M));
    assert!(a.poll().is_pending());
    assert!(matches!(
        Probe::new(l.acquire(H, M)).poll(),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
    drop(a);
    assert_eq!(l.queued(H, M), 0);
    let mut b = Probe::new(l.acquire(H, M));
    assert!(b.poll().is_pending(), "the place is free again");
}

#[test]
fn rule4_shrinking_parallel_drains_before_new_grants() {
    let l = limiter();
    l.configure(H, M, 3, 5);
    let permits: Vec<_> = (0..3).map(|_| l.try_acquire(H, M).unwrap()).collect();
    let mut w = Probe::new(l.acquire(H, M));
    assert!(w.poll().is_pending());

    l.configure(H, M, 1, 5);
    assert_eq!(l.in_flight(H, M), 3, "held permits are never revoked");
    let mut permits = permits.into_iter();
    drop(permits.next());
    assert_eq!(l.in_flight(H, M), 2);
    assert!(w.poll().is_pending());
    drop(permits.next());
    assert_eq!(l.in_flight(H, M), 1);
    assert!(w.poll().is_pending(), "still at the new limit");
    drop(permits.next());
    assert_eq!(l.in_flight(H, M), 1, "handed to the waiter");
    let _p = w.granted();
}

#[test]
fn rule4_growing_parallel_grants_waiters_at_once() {
    let l = limiter();
    l.configure(H, M, 1, 5);
    let _held = l.try_acquire(H, M).unwrap();
    let mut probes: Vec<_> = (0..3).map(|_| Probe::new(l.acquire(H, M))).collect();
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    l.configure(H, M, 3, 5);
    assert_eq!((l.in_flight(H, M), l.queued(H, M)), (3, 1));
    assert_eq!(probes[0].wakes(), 1);
    assert_eq!(probes[1].wakes(), 1);
    assert_eq!(probes[2].wakes(), 0);
    let _a = probes[0].granted();
    let _b = probes[1].granted();
    assert!(probes[2].poll().is_pending());
}

#[test]
fn rule4_shrinking_queue_keeps_existing_waiters() {
    let l = limiter();
    l.configure(H, M, 1, 3);
    let held = l.try_acquire(H, M).unwrap();
    let mut probes: Vec<_> = (0..3).map(|_| Probe::new(l.acquire(H, M))).collect();
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    l.configure(H, M, 1, 1);
    assert_eq!(l.queued(H, M), 3, "existing waiters stay");
    assert!(matches!(
        Probe::new(l.acquire(H, M)).poll(),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
    drop(held);
    let p0 = probes[0].granted();
    drop(p0);
    let p1 = probes[1].granted();
    // Two still queued > new queue of 1: still full for newcomers.
    assert!(matches!(
        Probe::new(l.acquire(H, M)).poll(),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
    drop(p1);
    let _p2 = probes[2].granted();
    let mut late = Probe::new(l.acquire(H, M));
    assert!(late.poll().is_pending(), "room for one again");
}

#[test]
fn remove_closes_waiters_and_keeps_held_permits() {
    let l = limiter();
    l.configure(H, M, 1, 2);
    let held = l.try_acquire(H, M).unwrap();
    let mut w = Probe::new(l.acquire(H, M));
    assert!(w.poll().is_pending());
    let handle = l.handle(H, M);

    assert!(l.remove(H, M));
    assert!(!l.remove(H, M));
    assert_eq!(w.wakes(), 1);
    assert!(matches!(w.poll(), Poll::Ready(Err(AcquireError::Closed))));
    assert!(handle.is_closed());
    assert_eq!(handle.in_flight(), 1, "the held permit is still valid");
    assert!(matches!(
        Probe::new(handle.acquire()).poll(),
        Poll::Ready(Err(AcquireError::Closed))
    ));
    assert_eq!(handle.try_acquire().unwrap_err(), TryAcquireError::Closed);

    // A fresh key under the same name does not see the old permit.
    assert_eq!(l.in_flight(H, M), 0);
    let _fresh = l.try_acquire(H, M).unwrap();
    drop(held);
    assert_eq!(handle.in_flight(), 0);
    assert_eq!(l.in_flight(H, M), 1);
}

#[test]
fn free_slots_sums_models_and_never_goes_negative() {
    let l = limiter();
    l.configure(H, "a", 4, 0);
    l.configure(H, "b", 2, 0);
    l.configure("other", "a", 8, 0);
    let b1 = l.try_acquire(H, "b").unwrap();
    let b2 = l.try_acquire(H, "b").unwrap();
    assert_eq!(l.free_slots(H), 4);
    l.configure(H, "b", 1, 0); // b is now over its limit: counts 0, not -1
    assert_eq!(l.free_slots(H), 4);
    assert_eq!(l.free_slots("nobody"), 0);
    l.configure(H, "c", usize::MAX, 0);
    assert_eq!(l.free_slots(H), usize::MAX, "saturates");
    drop((b1, b2));
}

#[test]
fn snapshot_lists_every_key() {
    let l = limiter();
    l.configure(H, "a", 4, 2);
    l.configure("h2", "b", 1, 0);
    let _p = l.try_acquire(H, "a").unwrap();
    let mut snap = l.snapshot();
    snap.sort_by(|x, y| x.model.cmp(&y.model));
    assert_eq!(snap.len(), 2);
    assert_eq!((snap[0].host.as_str(), snap[0].model.as_str()), (H, "a"));
    assert_eq!(
        snap[0].limits,
        Limits {
            parallel: 4,
            queue: 2
        }
    );
    assert_eq!((snap[0].in_flight, snap[0].queued), (1, 0));
    assert_eq!((snap[1].in_flight, snap[1].queued), (0, 0));
}

#[test]
fn unlimited_never_queues() {
    let l = limiter();
    l.configure(H, M, Limits::UNLIMITED.parallel, 0);
    let permits: Vec<_> = (0..10_000).map(|_| l.try_acquire(H, M).unwrap()).collect();
    assert_eq!(l.in_flight(H, M), 10_000);
    drop(permits);
    assert_eq!(l.in_flight(H, M), 0);
}

#[test]
fn parallel_zero_only_queues() {
    let l = limiter();
    l.configure(H, M, 0, 1);
    let mut w = Probe::new(l.acquire(H, M));
    assert!(w.poll().is_pending());
    l.configure(H, M, 1, 1);
    let _p = w.granted();
}

#[test]
fn polling_a_finished_future_does_not_panic() {
    let l = limiter();
    let mut p = Probe::new(l.acquire(H, M));
    let permit = p.granted();
    assert!(matches!(p.poll(), Poll::Ready(Err(AcquireError::Closed))));
    drop(permit);
    assert_eq!(l.in_flight(H, M), 0);
}

#[test]
fn rule5_limiter_and_futures_are_send_sync_static() {
    fn send_sync_static<T: Send + Sync + 'static>() {}
    fn send_static_unpin<T: Send + 'static + Unpin>() {}
    send_sync_static::<Limiter>();
    send_sync_static::<Permit>();
    send_sync_static::<crate::KeyHandle>();
    send_static_unpin::<Acquire>();
}

/// Rule 5: keys do not contend. Resolved keys and their permits never touch the limiter's
/// map, so even with the map write-locked (as during a reconfiguration) an idle key's
/// acquire/release path works while another key is saturated with a full queue.
#[test]
fn rule5_keys_do_not_contend() {
    let l = limiter();
    l.configure(H, "busy", 1, 1);
    l.configure(H, "idle", 1, 1);
    let _busy = l.try_acquire(H, "busy").unwrap();
    let mut queued = Probe::new(l.acquire(H, "busy"));
    assert!(queued.poll().is_pending());

    let idle = l.handle(H, "idle");
    let _map_locked = l.hosts.write();
    // The map is write-locked (as during a reconfiguration): the resolved key still works.
    let permit = idle.try_acquire().expect("idle key unaffected");
    drop(permit);
    let mut fut = Probe::new(idle.acquire());
    let _p = fut.granted();
}

/// Rule 6: cancellation is O(1): the wait queue removes from any position by index. This
/// checks the behaviour at scale (100 000 waiters, cancelled from the middle outwards) finishes
/// and leaves a consistent queue; the cost per cancel is measured by the criterion bench.
#[test]
fn rule6_cancel_anywhere_in_a_long_queue() {
    let l = limiter();
    l.configure(H, M, 1, usize::MAX);
    let held = l.try_acquire(H, M).unwrap();
    let mut waiters: Vec<Option<Acquire>> = (0..100_000).map(|_| Some(l.acquire(H, M))).collect();
    assert_eq!(l.queued(H, M), 100_000);
    // Cancel every waiter except the last one, in an order that hits the middle first.
    let n = waiters.len();
    for i in (0..n - 1).map(|i| (i * 7919) % (n - 1)) {
        waiters[i].take();
    }
    assert_eq!(l.queued(H, M), 1);
    drop(held);
    let mut last = Probe::new(waiters[n - 1].take().unwrap());
    let _p = last.granted();
}

// ===== weighted permits =====

#[test]
fn weighted_in_flight_counts_units_and_release_frees_the_whole_weight() {
    let l = limiter();
    l.configure(H, M, 5, 0);
    let three = l.try_acquire_many(H, M, 3).unwrap();
    let two = l.try_acquire_many(H, M, 2).unwrap();
    assert_eq!((three.weight(), two.weight()), (3, 2));
    assert_eq!(l.in_flight(H, M), 5);
    assert_eq!(l.try_acquire(H, M).unwrap_err(), TryAcquireError::NoSlot);
    drop(three);
    assert_eq!(l.in_flight(H, M), 2);
    assert_eq!(l.free_slots(H), 3);
    drop(two);
    assert_eq!(l.in_flight(H, M), 0);
}

#[test]
fn weighted_heavy_head_is_never_overtaken() {
    let l = limiter();
    l.configure(H, M, 3, 10);
    let held: Vec<_> = (0..3).map(|_| l.try_acquire(H, M).unwrap()).collect();
    let mut heavy = Probe::new(l.acquire_many(H, M, 3));
    let mut light = Probe::new(l.acquire(H, M));
    assert!(heavy.poll().is_pending() && light.poll().is_pending());

    let mut held = held.into_iter();
    drop(held.next());
    // One unit free: it is the heavy head's partial grant, not the light waiter's.
    let r = l.handle(H, M).reading();
    assert_eq!((r.in_flight, r.reserved, r.queued), (2, 1, 2));
    assert!(
        light.poll().is_pending(),
        "light waiter overtook the heavy head"
    );
    assert_eq!(light.wakes(), 0);
    assert_eq!(
        l.try_acquire(H, M).unwrap_err(),
        TryAcquireError::NoSlot,
        "a newcomer cannot take the set-aside unit either"
    );
    drop(held.next());
    assert!(heavy.poll().is_pending() && light.poll().is_pending());
    drop(held.next());
    assert_eq!(
        heavy.wakes(),
        1,
        "the release that completes its weight wakes it"
    );
    let big = heavy.granted();
    assert_eq!(big.weight(), 3);
    assert!(light.poll().is_pending());
    drop(big);
    let _small = light.granted();
    assert_eq!(l.in_flight(H, M), 1);
}

#[test]
fn weighted_one_release_grants_several_waiters_in_order() {
    let l = limiter();
    l.configure(H, M, 3, 10);
    let big = l.try_acquire_many(H, M, 3).unwrap();
    let mut a = Probe::new(l.acquire(H, M));
    let mut b = Probe::new(l.acquire_many(H, M, 2));
    let mut c = Probe::new(l.acquire(H, M));
    for p in [&mut a, &mut b, &mut c] {
        assert!(p.poll().is_pending());
    }
    drop(big);
    assert_eq!((a.wakes(), b.wakes(), c.wakes()), (1, 1, 0));
    assert_eq!((l.in_flight(H, M), l.queued(H, M)), (3, 1));
    let _a = a.granted();
    let _b = b.granted();
    assert!(c.poll().is_pending());
}

#[test]
fn weighted_cancelled_head_passes_its_partial_grant_on() {
    let l = limiter();
    l.configure(H, M, 3, 10);
    let two = l.try_acquire_many(H, M, 2).unwrap();
    let one = l.try_acquire(H, M).unwrap();
    let mut heavy = Probe::new(l.acquire_many(H, M, 3));
    let mut light = Probe::new(l.acquire_many(H, M, 2));
    assert!(heavy.poll().is_pending() && light.poll().is_pending());
    drop(two); // two units set aside for the heavy head
    assert_eq!(l.handle(H, M).reading().reserved, 2);
    drop(heavy); // cancelled holding its partial grant: the next head gets it
    assert_eq!(light.wakes(), 1);
    let light = light.granted();
    let r = l.handle(H, M).reading();
    assert_eq!((r.in_flight, r.reserved, r.queued), (3, 0, 0));
    drop((one, light));
    assert_eq!(l.in_flight(H, M), 0, "nothing leaked");
}

#[test]
fn weighted_above_parallel_is_refused_at_once() {
    let l = limiter();
    l.configure(H, M, 2, 10);
    let mut p = Probe::new(l.acquire_many(H, M, 3));
    assert!(!p.fut.is_queued());
    assert!(matches!(
        p.poll(),
        Poll::Ready(Err(AcquireError::TooHeavy {
            weight: 3,
            parallel: 2
        }))
    ));
    assert_eq!(
        l.try_acquire_many(H, M, 3).unwrap_err(),
        TryAcquireError::TooHeavy {
            weight: 3,
            parallel: 2
        }
    );
    assert_eq!((l.in_flight(H, M), l.queued(H, M)), (0, 0));
    // The error names the limit, for a caller that explains the refusal.
    let e = AcquireError::TooHeavy {
        weight: 3,
        parallel: 2,
    };
    assert!(e.to_string().contains("weight 3") && e.to_string().contains('2'));
}

#[test]
fn weighted_shrink_below_a_queued_weight_fails_it_when_it_reaches_the_head() {
    let l = limiter();
    l.configure(H, M, 4, 10);
    let all = l.try_acquire_many(H, M, 4).unwrap();
    let mut heavy = Probe::new(l.acquire_many(H, M, 3));
    let mut light = Probe::new(l.acquire(H, M));
    assert!(heavy.poll().is_pending() && light.poll().is_pending());
    l.configure(H, M, 2, 10);
    assert_eq!(heavy.wakes(), 1);
    assert!(matches!(
        heavy.poll(),
        Poll::Ready(Err(AcquireError::TooHeavy {
            weight: 3,
            parallel: 2
        }))
    ));
    assert!(light.poll().is_pending(), "still over the new limit");
    drop(all);
    let _light = light.granted();
    assert_eq!(l.in_flight(H, M), 1);
}

#[test]
fn weighted_paused_key_queues_any_weight() {
    let l = limiter();
    l.configure(H, M, 0, 2);
    let mut heavy = Probe::new(l.acquire_many(H, M, 5));
    assert!(heavy.poll().is_pending());
    l.configure(H, M, 5, 2);
    assert_eq!(heavy.granted().weight(), 5);
}

#[test]
fn weighted_granted_at_call_time_but_dropped_gives_the_whole_weight_back() {
    let l = limiter();
    l.configure(H, M, 3, 0);
    drop(l.acquire_many(H, M, 3));
    assert_eq!(l.in_flight(H, M), 0);
    let key = l.handle(H, M);
    let _p = key.try_acquire_many(3).unwrap();
    assert_eq!(key.in_flight(), 3);
}

// ===== host caps (two levels) =====

fn snapshot_of(l: &Limiter, model: &str) -> crate::KeySnapshot<String, String> {
    l.snapshot()
        .into_iter()
        .find(|s| s.host == H && s.model == model)
        .expect("key in the snapshot")
}

#[test]
fn host_cap_limits_the_sum_over_models_and_release_frees_both() {
    let l = limiter();
    l.configure_host(H, 3);
    l.configure(H, "a", 3, 2);
    l.configure(H, "b", 3, 2);
    let a2 = l.try_acquire_many(H, "a", 2).unwrap();
    let b1 = l.try_acquire(H, "b").unwrap();
    assert_eq!(l.try_acquire(H, "b").unwrap_err(), TryAcquireError::NoSlot);
    assert_eq!(l.free_slots(H), 0, "capped by the host's free units");
    let mut b = Probe::new(l.acquire(H, "b"));
    assert!(b.poll().is_pending());
    let cap = l.host_reading(H).unwrap();
    assert_eq!((cap.parallel, cap.in_flight, cap.blocked_models), (3, 3, 1));
    drop(a2);
    assert_eq!(b.wakes(), 1);
    let b2 = b.granted();
    let cap = l.host_reading(H).unwrap();
    assert_eq!((cap.in_flight, cap.blocked_models, cap.reserved), (2, 0, 0));
    assert_eq!((l.in_flight(H, "a"), l.in_flight(H, "b")), (0, 2));
    drop((b1, b2));
    assert_eq!(l.host_reading(H).unwrap().in_flight, 0);
}

#[test]
fn host_cap_nothing_held_at_either_level_while_waiting() {
    let l = limiter();
    l.configure_host(H, 2);
    l.configure(H, "a", 2, 0);
    l.configure(H, "b", 2, 2);
    let a = l.try_acquire_many(H, "a", 2).unwrap();
    let mut b = Probe::new(l.acquire_many(H, "b", 2));
    assert!(b.poll().is_pending());
    // b fits its own key but waits for the host: it holds nothing at either level.
    let sb = snapshot_of(&l, "b");
    assert_eq!((sb.in_flight, sb.queued), (0, 1));
    assert_eq!(l.host_reading(H).unwrap().in_flight, 2, "only a's permit");
    drop(a);
    let _b = b.granted();
    assert_eq!(l.host_reading(H).unwrap().in_flight, 2);
}

#[test]
fn host_cap_fifo_across_models_a_heavy_model_is_not_starved() {
    let l = limiter();
    l.configure_host(H, 2);
    l.configure(H, "a", 2, 4);
    l.configure(H, "heavy", 2, 4);
    l.configure(H, "light", 2, 4);
    let a1 = l.try_acquire(H, "a").unwrap();
    let a2 = l.try_acquire(H, "a").unwrap();
    let mut heavy = Probe::new(l.acquire_many(H, "heavy", 2));
    assert!(heavy.poll().is_pending());
    let mut light = Probe::new(l.acquire(H, "light"));
    assert!(light.poll().is_pending());
    assert_eq!(l.host_reading(H).unwrap().blocked_models, 2);

    drop(a1);
    // One host unit free: set aside for the heavy model first in line, not the light one.
    assert!(
        light.poll().is_pending(),
        "light model overtook the heavy one"
    );
    assert_eq!(l.host_reading(H).unwrap().reserved, 1);
    assert_eq!(
        l.try_acquire(H, "a").unwrap_err(),
        TryAcquireError::NoSlot,
        "a newcomer on another model cannot take it either"
    );
    drop(a2);
    let big = heavy.granted();
    assert!(light.poll().is_pending());
    drop(big);
    let _small = light.granted();
}

#[test]
fn host_cap_queue_full_is_still_per_key_and_immediate() {
    let l = limiter();
    l.configure_host(H, 1);
    l.configure(H, "a", 1, 0);
    l.configure(H, "b", 1, 0);
    let _a = l.try_acquire(H, "a").unwrap();
    let mut b = Probe::new(l.acquire(H, "b"));
    assert!(matches!(
        b.poll(),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
}

#[test]
fn host_cap_weight_above_the_cap_is_refused_at_once() {
    let l = limiter();
    l.configure_host(H, 2);
    l.configure(H, "a", 4, 4);
    assert_eq!(
        l.try_acquire_many(H, "a", 3).unwrap_err(),
        TryAcquireError::TooHeavy {
            weight: 3,
            parallel: 2
        }
    );
    let mut p = Probe::new(l.acquire_many(H, "a", 3));
    assert!(matches!(
        p.poll(),
        Poll::Ready(Err(AcquireError::TooHeavy {
            weight: 3,
            parallel: 2
        }))
    ));
    assert_eq!(l.queued(H, "a"), 0);
}

#[test]
fn host_cap_cancelled_front_model_passes_its_turn_on() {
    let l = limiter();
    l.configure_host(H, 1);
    for m in ["a", "b", "c"] {
        l.configure(H, m, 1, 1);
    }
    let a = l.try_acquire(H, "a").unwrap();
    let mut b = Probe::new(l.acquire(H, "b"));
    let mut c = Probe::new(l.acquire(H, "c"));
    assert!(b.poll().is_pending() && c.poll().is_pending());
    drop(b);
    assert_eq!(l.host_reading(H).unwrap().blocked_models, 1);
    drop(a);
    let _c = c.granted();
    assert_eq!(l.host_reading(H).unwrap().in_flight, 1);
}

#[test]
fn host_cap_removing_the_front_model_passes_its_turn_on() {
    let l = limiter();
    l.configure_host(H, 1);
    l.configure(H, "a", 1, 1);
    l.configure(H, "b", 1, 1);
    let mut a_wait = Probe::new(l.acquire(H, "a"));
    let a = a_wait.granted();
    let mut a2 = Probe::new(l.acquire(H, "a"));
    let mut b = Probe::new(l.acquire(H, "b"));
    assert!(a2.poll().is_pending() && b.poll().is_pending());
    assert!(l.remove(H, "a"));
    assert!(matches!(a2.poll(), Poll::Ready(Err(AcquireError::Closed))));
    assert_eq!(
        l.host_reading(H).unwrap().in_flight,
        1,
        "a removed key's permit still runs"
    );
    drop(a);
    let _b = b.granted();
    assert!(l.host_reading(H).is_some(), "the cap outlives its models");
}

#[test]
fn host_cap_set_later_counts_units_already_held_and_can_be_lifted() {
    let l = limiter();
    l.configure(H, "a", 4, 2);
    l.configure(H, "b", 4, 2);
    let a = l.try_acquire_many(H, "a", 3).unwrap();
    l.configure_host(H, 4);
    assert_eq!(l.host_reading(H).unwrap().in_flight, 3);
    let b1 = l.try_acquire(H, "b").unwrap();
    let mut b = Probe::new(l.acquire(H, "b"));
    assert!(b.poll().is_pending());
    l.configure_host(H, usize::MAX); // lifting the cap grants at once
    assert_eq!(b.wakes(), 1);
    let _b2 = b.granted();
    drop((a, b1));
    assert_eq!(l.host_reading(H).unwrap().in_flight, 1);
    let snap = l.host_snapshot();
    assert_eq!(snap.len(), 1);
    assert_eq!(
        (snap[0].host.as_str(), snap[0].cap.parallel),
        (H, usize::MAX)
    );
    assert_eq!(l.handle(H, "a").host_reading(), Some(snap[0].cap));
}

#[test]
fn host_cap_shrinking_drains_before_new_grants() {
    let l = limiter();
    l.configure_host(H, 3);
    l.configure(H, "a", 3, 2);
    let held: Vec<_> = (0..3).map(|_| l.try_acquire(H, "a").unwrap()).collect();
    let mut w = Probe::new(l.acquire(H, "a"));
    assert!(w.poll().is_pending());
    l.configure_host(H, 1);
    let mut held = held.into_iter();
    drop(held.next());
    drop(held.next());
    assert!(w.poll().is_pending(), "still at the new cap");
    drop(held.next());
    let _w = w.granted();
    assert_eq!(l.host_reading(H).unwrap().in_flight, 1);
}

// ===== fair queues and priority =====

use crate::{Priority, QueueOrder, Ticket};

/// Releases the one held permit `rounds` times and records which probe got each grant.
fn grant_order(l: &Limiter, held: Permit, probes: &mut [Probe], rounds: usize) -> Vec<usize> {
    let mut order = Vec::new();
    let mut current = Some(held);
    for _ in 0..rounds {
        drop(current.take());
        let winner = probes
            .iter_mut()
            .enumerate()
            .filter(|(i, _)| !order.contains(i))
            .find_map(|(i, p)| match p.poll() {
                Poll::Ready(Ok(permit)) => Some((i, permit)),
                Poll::Pending => None,
                Poll::Ready(Err(e)) => panic!("probe {i}: {e}"),
            });
        let Some((i, permit)) = winner else { break };
        order.push(i);
        current = Some(permit);
    }
    drop(current);
    assert!(l.in_flight(H, M) <= 1);
    order
}

fn ticket(tenant: &str) -> Ticket {
    Ticket::new().tenant(tenant)
}

#[test]
fn fair_a_late_tenant_is_not_stuck_behind_a_busy_one() {
    let l = limiter();
    l.configure(H, M, 1, 64);
    l.configure_order(H, M, QueueOrder::Fair);
    let held = l.try_acquire(H, M).unwrap();
    let mut probes: Vec<_> = (0..20)
        .map(|_| Probe::new(l.acquire_with(H, M, &ticket("busy"))))
        .collect();
    probes.extend((0..2).map(|_| Probe::new(l.acquire_with(H, M, &ticket("late")))));
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    assert_eq!(probes[20].fut.position().unwrap().ahead, 1);
    let order = grant_order(&l, held, &mut probes, 22);
    let first_late = order.iter().position(|&i| i >= 20).unwrap();
    assert!(
        first_late < 2,
        "late tenant's first grant was #{first_late}: {order:?}"
    );
    // FIFO within each tenant.
    let busy: Vec<_> = order.iter().copied().filter(|&i| i < 20).collect();
    assert!(busy.windows(2).all(|w| w[0] < w[1]), "{busy:?}");
    assert_eq!(order.len(), 22);
}

#[test]
fn fair_shares_weight_the_rounds() {
    let l = limiter();
    l.configure(H, M, 1, 64);
    l.configure_order(H, M, QueueOrder::Fair);
    let held = l.try_acquire(H, M).unwrap();
    let big = Ticket::new().tenant("big").share(2);
    let mut probes: Vec<_> = (0..6)
        .map(|_| Probe::new(l.acquire_with(H, M, &big)))
        .collect();
    probes.extend((0..3).map(|_| Probe::new(l.acquire_with(H, M, &ticket("small")))));
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    let order = grant_order(&l, held, &mut probes, 9);
    let tenants: String = order
        .iter()
        .map(|&i| if i < 6 { 'B' } else { 's' })
        .collect();
    assert_eq!(tenants, "BBsBBsBBs");
}

#[test]
fn fifo_order_ignores_tenants() {
    let l = limiter();
    l.configure(H, M, 1, 64);
    let held = l.try_acquire(H, M).unwrap();
    let mut probes: Vec<_> = ["a", "a", "b", "a"]
        .iter()
        .map(|t| Probe::new(l.acquire_with(H, M, &ticket(t))))
        .collect();
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    assert_eq!(grant_order(&l, held, &mut probes, 4), vec![0, 1, 2, 3]);
}

#[test]
fn priority_high_first_and_low_within_the_pass_limit() {
    let l = limiter();
    l.configure(H, M, 1, 64);
    let held = l.try_acquire(H, M).unwrap();
    let mut probes = vec![Probe::new(l.acquire_with(
        H,
        M,
        &Ticket::new().priority(Priority::Low),
    ))];
    probes.extend(
        (0..10).map(|_| Probe::new(l.acquire_with(H, M, &Ticket::new().priority(Priority::High)))),
    );
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    assert_eq!(probes[0].fut.position().unwrap().ahead, 10);
    let order = grant_order(&l, held, &mut probes, 11);
    let low_at = order.iter().position(|&i| i == 0).unwrap();
    assert_eq!(
        low_at,
        Priority::PASS_LIMIT,
        "served right after PASS_LIMIT high grants: {order:?}"
    );
}

#[test]
fn priority_low_waits_at_most_pass_limit_plus_one_with_three_classes() {
    let l = limiter();
    l.configure(H, M, 1, 64);
    let held = l.try_acquire(H, M).unwrap();
    let t = |p| Ticket::new().priority(p);
    let mut probes = vec![
        Probe::new(l.acquire_with(H, M, &t(Priority::Low))),
        Probe::new(l.acquire_with(H, M, &t(Priority::Normal))),
    ];
    probes.extend((0..10).map(|_| Probe::new(l.acquire_with(H, M, &t(Priority::High)))));
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    let order = grant_order(&l, held, &mut probes, 12);
    let normal_at = order.iter().position(|&i| i == 1).unwrap();
    let low_at = order.iter().position(|&i| i == 0).unwrap();
    assert_eq!(normal_at, Priority::PASS_LIMIT, "{order:?}");
    assert_eq!(low_at, Priority::PASS_LIMIT + 1, "{order:?}");
}

#[test]
fn priority_queue_full_is_still_refused_at_once() {
    let l = limiter();
    l.configure(H, M, 1, 1);
    let _held = l.try_acquire(H, M).unwrap();
    let mut low = Probe::new(l.acquire_with(H, M, &Ticket::new().priority(Priority::Low)));
    assert!(low.poll().is_pending());
    let mut high = Probe::new(l.acquire_with(H, M, &Ticket::new().priority(Priority::High)));
    assert!(matches!(
        high.poll(),
        Poll::Ready(Err(AcquireError::QueueFull))
    ));
}

#[test]
fn fair_cancelled_tenants_leave_no_trace_in_the_rounds() {
    let l = limiter();
    l.configure(H, M, 1, 64);
    l.configure_order(H, M, QueueOrder::Fair);
    let held = l.try_acquire(H, M).unwrap();
    for round in 0..50 {
        let mut p = Probe::new(l.acquire_with(H, M, &ticket(&format!("t{round}"))));
        assert!(p.poll().is_pending());
        drop(p);
    }
    assert_eq!(l.queued(H, M), 0);
    let mut a = Probe::new(l.acquire_with(H, M, &ticket("a")));
    let mut b = Probe::new(l.acquire_with(H, M, &ticket("b")));
    assert!(a.poll().is_pending() && b.poll().is_pending());
    assert_eq!(b.fut.position().unwrap().ahead, 1);
    drop(a);
    assert_eq!(b.fut.position().unwrap().ahead, 0);
    drop(held);
    let _b = b.granted();
}

#[test]
fn fair_heavy_head_keeps_its_partial_grant_until_it_fits() {
    let l = limiter();
    l.configure(H, M, 2, 64);
    l.configure_order(H, M, QueueOrder::Fair);
    let a = l.try_acquire(H, M).unwrap();
    let b = l.try_acquire(H, M).unwrap();
    let mut heavy = Probe::new(l.acquire_with(H, M, &ticket("x").weight(2)));
    let mut light = Probe::new(l.acquire_with(H, M, &ticket("y")));
    assert!(heavy.poll().is_pending() && light.poll().is_pending());
    drop(a);
    assert!(light.poll().is_pending(), "the heavy head's turn holds");
    drop(b);
    let _big = heavy.granted();
    assert!(light.poll().is_pending());
}

#[test]
fn order_switched_live_keeps_waiters_in_place() {
    let l = limiter();
    l.configure(H, M, 1, 64);
    let held = l.try_acquire(H, M).unwrap();
    let mut probes = vec![
        Probe::new(l.acquire_with(H, M, &ticket("a"))),
        Probe::new(l.acquire_with(H, M, &ticket("a"))),
    ];
    l.configure_order(H, M, QueueOrder::Fair);
    probes.push(Probe::new(l.acquire_with(H, M, &ticket("b"))));
    for p in &mut probes {
        assert!(p.poll().is_pending());
    }
    let order = grant_order(&l, held, &mut probes, 3);
    assert_eq!(order.len(), 3);
    assert!(order.iter().position(|&i| i == 0) < order.iter().position(|&i| i == 1));
}
