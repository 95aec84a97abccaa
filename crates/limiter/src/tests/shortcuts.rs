//! The grant step's shortcuts (`key.rs`, "When the grant step is skipped") against the whole
//! step: the same random sequence of acquires (weights 0 to 3, three classes, three tenants with
//! shares), releases, cancellations, reconfigurations and switches of order runs on two
//! limiters, one of them with every shortcut off. After every step both must agree on every
//! outcome (granted, refused and why, still waiting), on every waiter's position, on where a
//! newcomer of each class would stand, and on the key's reading. The scheduler's hidden state
//! (credits, turns) shows in the grant order, so a shortcut that skipped a step that would have
//! changed it is caught here.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use proptest::prelude::*;

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
    /// Drops the permit at this index, modulo the permits held.
    Release(usize),
    /// Drops the waiter at this index, modulo the waiters made.
    Cancel(usize),
    Configure {
        parallel: usize,
        queue: usize,
    },
    Order(bool),
}

fn op() -> impl Strategy<Value = Op> {
    ops_with(0..3usize, 1..3u32)
}

/// Mostly normal-class acquires with shares up to 4: the key runs plain (`key.rs`) for long
/// stretches, leaves it when a high or low waiter arrives or fair order starts, and comes back.
fn plain_op() -> impl Strategy<Value = Op> {
    let class = prop_oneof![1 => Just(0usize), 6 => Just(1usize), 1 => Just(2usize)];
    ops_with(class, 1..5u32)
}

fn ops_with(
    class: impl Strategy<Value = usize>,
    share: impl Strategy<Value = u32>,
) -> impl Strategy<Value = Op> {
    let acquire = (0..3usize, class, 0..4usize, share, any::<bool>()).prop_map(
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
        4 => any::<usize>().prop_map(Op::Release),
        3 => any::<usize>().prop_map(Op::Cancel),
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
                    let at = i % side.permits.len();
                    drop(side.permits.remove(at));
                }
            }
            Op::Cancel(i) => {
                if !side.waiters.is_empty() {
                    let at = i % side.waiters.len();
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
    /// finished one), where a newcomer of each class would stand, and the key's reading.
    fn look(&mut self) -> (Vec<Option<Seen>>, Vec<(usize, usize)>, crate::KeyReading) {
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
            // A low newcomer counts the normal waiters, which a plain key does not count itself.
            let newcomers = [Priority::High, Priority::Normal, Priority::Low]
                .map(|class| side.key.position_for(&Ticket::new().priority(class)))
                .iter()
                .map(|p| (p.ahead, p.ahead_in_line))
                .collect();
            (seen, newcomers, side.key.reading())
        })
    }
}

/// Runs `ops` on a limiter with the shortcuts and one without, comparing after every step.
fn same_on_both(ops: &[Op]) -> Result<(), TestCaseError> {
    let mut fast = Side::new(false);
    let mut whole = Side::new(true);
    for op in ops {
        fast.apply(op);
        whole.apply(op);
        let (a, b) = (fast.look(), whole.look());
        prop_assert_eq!(&a, &b, "after {:?}", op);
    }
    Ok(())
}

/// An acquire of weight 1 with a ticket in `class` (0 high, 1 normal, 2 low).
fn ticketed(class: usize) -> Op {
    Op::Acquire {
        tenant: 0,
        class,
        weight: 1,
        share: 1,
        plain: false,
    }
}

const HIGH: usize = 0;
const NORMAL: usize = 1;

/// One slot, held by a normal acquire; two normal waiters (waiters 1 and 2), then three high
/// ones. Three high grants pass the normal waiters; the third leaves only normal ones, so the
/// key runs plain with the class's count of passes at 3.
fn normal_waiters_passed_over() -> Vec<Op> {
    let mut ops = vec![Op::Configure {
        parallel: 1,
        queue: 10,
    }];
    ops.extend([ticketed(NORMAL), ticketed(NORMAL), ticketed(NORMAL)]);
    ops.extend([ticketed(HIGH), ticketed(HIGH), ticketed(HIGH)]);
    ops.extend([Op::Release(0), Op::Release(0), Op::Release(0)]);
    ops
}

/// A normal waiter passed over by high ones, then served while the key ran plain: the count of
/// passes starts again from there, as the whole step keeps it, so the next normal waiter is not
/// served ahead of high ones too early.
#[test]
fn a_normal_grant_while_plain_restarts_the_pass_count() {
    let mut ops = normal_waiters_passed_over();
    // A normal grant while plain; then high waiters again.
    ops.extend([Op::Release(0), ticketed(HIGH), ticketed(HIGH)]);
    ops.extend([Op::Release(0), Op::Release(0), Op::Release(0)]);
    same_on_both(&ops).expect("the same on both");
}

/// Normal waiters passed over by high ones, then all cancelled while the key ran plain: the
/// count of passes ends with them, as the whole step ends it when the class empties.
#[test]
fn the_last_normal_waiter_leaving_while_plain_ends_the_pass_count() {
    let mut ops = normal_waiters_passed_over();
    ops.extend([Op::Cancel(1), Op::Cancel(2)]);
    // High and normal waiters again: the normal one waits for four high grants, not one.
    ops.extend([ticketed(HIGH), ticketed(HIGH), ticketed(NORMAL)]);
    ops.extend([ticketed(HIGH), ticketed(HIGH), ticketed(HIGH)]);
    ops.extend(std::iter::repeat_n(Op::Release(0), 4));
    same_on_both(&ops).expect("the same on both");
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

    #[test]
    fn a_key_running_plain_behaves_as_the_whole_grant_step(
        ops in proptest::collection::vec(plain_op(), 1..160)
    ) {
        same_on_both(&ops)?;
    }
}
