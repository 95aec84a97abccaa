//! The grant step's shortcuts (`key.rs`, "When the grant step is skipped") against the whole
//! step: the same random sequence of acquires (weights 0 to 3, three classes, three tenants with
//! shares), releases, cancellations, reconfigurations and switches of order runs on two
//! limiters, one of them with every shortcut off. After every step both must agree on every
//! outcome (granted, refused and why, still waiting), on every waiter's position, and on the
//! key's reading. The scheduler's hidden state (credits, turns) shows in the grant order, so a
//! shortcut that skipped a step that would have changed it is caught here.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;
use proptest::sample::Index;

use crate::key::NO_SHORTCUTS;
use crate::{Acquire, AcquireError, KeyHandle, Limiter, Permit, Priority, QueueOrder, Ticket};

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        tenant: usize,
        class: usize,
        weight: usize,
        share: u32,
        plain: bool,
    },
    Release(Index),
    Cancel(Index),
    Configure {
        parallel: usize,
        queue: usize,
    },
    Order(bool),
}

fn op() -> impl Strategy<Value = Op> {
    let acquire = (0..3usize, 0..3usize, 0..4usize, 1..3u32, any::<bool>()).prop_map(
        |(tenant, class, weight, share, plain)| Op::Acquire {
            tenant,
            class,
            weight,
            share,
            plain,
        },
    );
    prop_oneof![
        8 => acquire,
        4 => any::<Index>().prop_map(Op::Release),
        3 => any::<Index>().prop_map(Op::Cancel),
        1 => (0..5usize, 0..10usize)
            .prop_map(|(parallel, queue)| Op::Configure { parallel, queue }),
        1 => any::<bool>().prop_map(Op::Order),
    ]
}

/// What one waiter's future said when polled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    Waiting(Option<(usize, usize)>),
    Granted(usize),
    Refused(AcquireError),
}

/// One limiter under test, and what it holds.
struct Side {
    limiter: Limiter,
    key: KeyHandle,
    waiters: Vec<Option<Acquire>>,
    permits: Vec<Permit>,
    /// Run every call with the shortcuts off.
    whole: bool,
}

impl Side {
    fn new(whole: bool) -> Self {
        let limiter: Limiter = Limiter::new();
        limiter.configure("h", "m", 2, 6);
        let key = limiter.handle("h", "m");
        Self {
            limiter,
            key,
            waiters: Vec::new(),
            permits: Vec::new(),
            whole,
        }
    }

    fn with<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        NO_SHORTCUTS.set(self.whole);
        let out = f(self);
        NO_SHORTCUTS.set(false);
        out
    }

    fn apply(&mut self, op: &Op) {
        self.with(|side| match *op {
            Op::Acquire {
                tenant,
                class,
                weight,
                share,
                plain,
            } => {
                let fut = if plain {
                    side.key.acquire_many(weight)
                } else {
                    let ticket = Ticket::new()
                        .weight(weight)
                        .priority([Priority::High, Priority::Normal, Priority::Low][class])
                        .tenant(format!("t{tenant}"))
                        .share(share);
                    side.key.acquire_with(&ticket)
                };
                side.waiters.push(Some(fut));
            }
            Op::Release(i) => {
                if !side.permits.is_empty() {
                    let at = i.index(side.permits.len());
                    drop(side.permits.remove(at));
                }
            }
            Op::Cancel(i) => {
                if !side.waiters.is_empty() {
                    let at = i.index(side.waiters.len());
                    drop(side.waiters[at].take());
                }
            }
            Op::Configure { parallel, queue } => side.limiter.configure("h", "m", parallel, queue),
            Op::Order(fair) => side.limiter.configure_order(
                "h",
                "m",
                if fair {
                    QueueOrder::Fair
                } else {
                    QueueOrder::Fifo
                },
            ),
        });
    }

    /// Polls every waiter still held; returns what each said (`None` for a cancelled or
    /// finished one) and the key's reading.
    fn look(&mut self) -> (Vec<Option<Seen>>, crate::KeyReading) {
        self.with(|side| {
            let mut cx = Context::from_waker(Waker::noop());
            let mut seen = Vec::with_capacity(side.waiters.len());
            for slot in &mut side.waiters {
                let Some(fut) = slot else {
                    seen.push(None);
                    continue;
                };
                let position = fut.position().map(|p| (p.ahead, p.ahead_in_line));
                let outcome = match Pin::new(&mut *fut).poll(&mut cx) {
                    Poll::Pending => Seen::Waiting(position),
                    Poll::Ready(Ok(permit)) => {
                        let weight = permit.weight();
                        side.permits.push(permit);
                        *slot = None;
                        Seen::Granted(weight)
                    }
                    Poll::Ready(Err(error)) => {
                        *slot = None;
                        Seen::Refused(error)
                    }
                };
                seen.push(Some(outcome));
            }
            (seen, side.key.reading())
        })
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn shortcuts_change_nothing_the_whole_grant_step_would_not(
        ops in proptest::collection::vec(op(), 1..80)
    ) {
        let mut fast = Side::new(false);
        let mut whole = Side::new(true);
        for op in &ops {
            fast.apply(op);
            whole.apply(op);
            let (a, b) = (fast.look(), whole.look());
            prop_assert_eq!(&a, &b, "after {:?}", op);
        }
        // Everything drains the same way.
        fast.with(|s| { s.waiters.clear(); s.permits.clear(); });
        whole.with(|s| { s.waiters.clear(); s.permits.clear(); });
        prop_assert_eq!(fast.key.reading(), whole.key.reading());
        prop_assert_eq!(fast.key.in_flight(), 0);
    }
}
