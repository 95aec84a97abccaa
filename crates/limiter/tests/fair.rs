//! Property tests of fair queues and priority classes: random arrivals (three tenants, three
//! classes, weights 1 and 2), releases and cancellations on one key under
//! `QueueOrder::Fair`, with futures polled by hand after every step. Checked throughout:
//!
//! - **order within a tenant:** a waiter is never granted while an older waiter of the same
//!   tenant and class still waits;
//! - **no tenant starves:** while a tenant has waiters in a class, the other tenants get at most
//!   `TENANT_BOUND` grants in that class between two of its own (deficit round-robin: at most
//!   two turns for a head of weight 2 at share 1, at most two grants per other tenant per turn);
//! - **no class starves:** while a class has waiters, at most `Priority::PASS_LIMIT + 1` grants
//!   in a row go to higher classes;
//! - never more units in flight than `parallel`, and everything drains at the end.
#![cfg(not(loom))]

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use proptest::sample::Index;
use slotgate_limiter::{Acquire, Limiter, Permit, Priority, QueueOrder, Ticket};

const TENANTS: usize = 3;
const CLASSES: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];
/// Other tenants' grants in a class between two of one tenant's: 2 turns × 2 other tenants ×
/// 2 grants per turn.
const TENANT_BOUND: usize = 8;

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        tenant: usize,
        class: usize,
        weight: usize,
    },
    Release(Index),
    Cancel(Index),
}

/// Skewed on purpose: tenant 0 is busy, most waiters are of the normal class, and arrivals
/// outpace releases, so queues build up and a FIFO would make the quiet tenants wait.
fn op() -> impl Strategy<Value = Op> {
    let tenant = prop_oneof![6 => Just(0usize), 1 => Just(1usize), 1 => Just(2usize)];
    let class = prop_oneof![1 => Just(0usize), 4 => Just(1usize), 1 => Just(2usize)];
    let weight = prop_oneof![3 => Just(1usize), 1 => Just(2usize)];
    prop_oneof![
        6 => (tenant, class, weight)
            .prop_map(|(tenant, class, weight)| Op::Acquire { tenant, class, weight }),
        4 => any::<Index>().prop_map(Op::Release),
        1 => any::<Index>().prop_map(Op::Cancel),
    ]
}

struct Waiter {
    seq: usize,
    tenant: usize,
    class: usize,
    fut: Acquire,
}

fn poll(fut: &mut Acquire) -> Poll<Result<Permit, slotgate_limiter::AcquireError>> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

/// Starvation counters, updated once per step from the grants of that step.
#[derive(Default)]
struct Counters {
    /// [class][tenant]: grants in the class to other tenants since this tenant's last grant.
    others: [[usize; TENANTS]; 3],
    /// [class]: grants to higher classes since this class's last grant.
    higher: [usize; 3],
}

impl Counters {
    /// Grants of one step, as (tenant, class), given who waited before and after it.
    fn step(&mut self, granted: &[(usize, usize)], waiting_after: &[(usize, usize)]) {
        for class in 0..3 {
            let in_class: Vec<usize> = granted
                .iter()
                .filter(|(_, c)| *c == class)
                .map(|(t, _)| *t)
                .collect();
            for tenant in 0..TENANTS {
                let still = waiting_after.contains(&(tenant, class));
                if in_class.contains(&tenant) || !still {
                    // Served (grants of one step have no order: count it in its favour), or
                    // nothing left to wait for.
                    self.others[class][tenant] = 0;
                } else {
                    self.others[class][tenant] += in_class.len();
                    assert!(
                        self.others[class][tenant] <= TENANT_BOUND,
                        "tenant {tenant} starved in class {class}"
                    );
                }
            }
            let to_higher = granted.iter().filter(|(_, c)| *c < class).count();
            let still = waiting_after.iter().any(|(_, c)| *c == class);
            if !in_class.is_empty() || !still {
                self.higher[class] = 0;
            } else {
                self.higher[class] += to_higher;
                assert!(
                    self.higher[class] <= Priority::PASS_LIMIT + 1,
                    "class {class} passed over {} times",
                    self.higher[class]
                );
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn fair_queues_keep_tenant_order_and_starve_nobody(
        parallel in 1..4usize,
        ops in proptest::collection::vec(op(), 1..120),
    ) {
        let limiter: Limiter = Limiter::new();
        limiter.configure("h", "m", parallel, 64);
        limiter.configure_order("h", "m", QueueOrder::Fair);
        let mut waiters: Vec<Waiter> = Vec::new();
        let mut permits: Vec<Permit> = Vec::new();
        let mut counters = Counters::default();
        for (seq, op) in ops.into_iter().enumerate() {
            match op {
                Op::Acquire { tenant, class, weight } => {
                    let ticket = Ticket::new()
                        .tenant(format!("t{tenant}"))
                        .priority(CLASSES[class])
                        .weight(weight.min(parallel));
                    waiters.push(Waiter { seq, tenant, class, fut: limiter.acquire_with("h", "m", &ticket) });
                }
                Op::Release(i) if !permits.is_empty() => drop(permits.swap_remove(i.index(permits.len()))),
                Op::Cancel(i) if !waiters.is_empty() => drop(waiters.remove(i.index(waiters.len()))),
                Op::Release(_) | Op::Cancel(_) => {}
            }
            // Poll everyone, oldest first (`waiters` stays in arrival order); collect this
            // step's grants.
            let mut granted = Vec::new();
            let mut index = 0;
            while index < waiters.len() {
                match poll(&mut waiters[index].fut) {
                    Poll::Ready(Ok(permit)) => {
                        let w = waiters.remove(index);
                        prop_assert!(
                            !waiters.iter().any(|o| o.tenant == w.tenant && o.class == w.class && o.seq < w.seq),
                            "waiter {} of tenant {} overtook an older one of its tenant", w.seq, w.tenant
                        );
                        granted.push((w.tenant, w.class));
                        permits.push(permit);
                    }
                    Poll::Pending => index += 1,
                    Poll::Ready(Err(e)) => prop_assert!(false, "unexpected {e}"),
                }
            }
            let waiting_after: Vec<_> = waiters.iter().map(|w| (w.tenant, w.class)).collect();
            counters.step(&granted, &waiting_after);
            let units: usize = permits.iter().map(Permit::weight).sum();
            prop_assert_eq!(limiter.in_flight("h", "m"), units);
            prop_assert!(units <= parallel);
            prop_assert_eq!(limiter.queued("h", "m"), waiters.len());
        }
        drop(waiters);
        drop(permits);
        prop_assert_eq!(limiter.in_flight("h", "m"), 0);
        prop_assert_eq!(limiter.queued("h", "m"), 0);
    }
}
