//! The state of one (host, model) key: its limits, its in-flight units and its wait queue.
//!
//! Every change of state ends in [`State::fill`], the one place that grants: it hands free units
//! to the head waiter while its whole weight fits, and stops at the first one that does not.
//! Units left free while somebody waits are the head waiter's partial grant: nobody else may
//! take them (a newcomer queues behind, `try_acquire` refuses), so they need no bookkeeping of
//! their own and cannot leak — a head that leaves simply lets `fill` pour them into the next.
//!
//! Everything here runs under the key's own mutex and nothing else, which is what keeps keys
//! from contending with each other (rule 5). No method wakes a task while holding the lock:
//! wakers are collected, the guard dropped, and only then are they woken (tokio's
//! `add_permits_locked` does the same), so a woken task never finds the lock taken by its waker.

use std::task::Waker;

use crate::error::{AcquireError, TryAcquireError};
use crate::sync::Mutex;
use crate::waiters::{Status, Token, WaitQueue};

/// The limits of a key, as last configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Limits {
    /// How many units may be held at once (a permit of weight `w` holds `w` units).
    /// `usize::MAX` means unlimited.
    pub parallel: usize,
    /// How many acquirers may wait for a permit at once.
    pub queue: usize,
}

impl Limits {
    /// What an unconfigured key behaves as: one permit, nobody waits (rule 1).
    pub const UNCONFIGURED: Limits = Limits {
        parallel: 1,
        queue: 0,
    };

    /// No limit at all: every acquire is granted at once.
    pub const UNLIMITED: Limits = Limits {
        parallel: usize::MAX,
        queue: 0,
    };
}

/// The outcome of joining a key at acquire time.
#[derive(Debug)]
pub(crate) enum Joined {
    /// Units were free and nobody was ahead: the caller holds them.
    Granted,
    /// The caller waits in line under this token.
    Queued(Token),
}

#[derive(Debug)]
struct State {
    limits: Limits,
    /// Units held by permits (and granted waiters not yet polled).
    in_flight: usize,
    waiters: WaitQueue,
    /// Set by `remove`: waiters fail with `Closed`, new acquirers too.
    closed: bool,
}

/// One key's shared state. Permits and acquire futures hold it by `Arc`, so the hot path never
/// goes back to the limiter's map.
#[derive(Debug)]
pub(crate) struct KeyState {
    state: Mutex<State>,
}

/// A point-in-time reading of one key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reading {
    pub(crate) limits: Limits,
    pub(crate) in_flight: usize,
    pub(crate) reserved: usize,
    pub(crate) queued: usize,
    pub(crate) closed: bool,
}

/// Wakers collected under the lock, woken after it is released. The first needs no allocation,
/// which covers every release and cancel that hands over to one waiter.
#[derive(Debug, Default)]
pub(crate) struct WakeList {
    first: Option<Waker>,
    rest: Vec<Waker>,
}

impl WakeList {
    fn push(&mut self, waker: Option<Waker>) {
        let Some(waker) = waker else { return };
        if self.first.is_none() {
            self.first = Some(waker);
        } else {
            self.rest.push(waker);
        }
    }

    pub(crate) fn wake_all(self) {
        if let Some(first) = self.first {
            first.wake();
        }
        self.rest.into_iter().for_each(Waker::wake);
    }
}

impl KeyState {
    pub(crate) fn new(limits: Limits) -> Self {
        Self {
            state: Mutex::new(State {
                limits,
                in_flight: 0,
                waiters: WaitQueue::new(),
                closed: false,
            }),
        }
    }

    /// Takes `weight` units if they are free and nobody waits; otherwise joins the queue if it
    /// has room.
    pub(crate) fn join(&self, weight: usize) -> Result<Joined, AcquireError> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(AcquireError::Closed);
        }
        if let Some(parallel) = s.too_heavy(weight) {
            return Err(AcquireError::TooHeavy { weight, parallel });
        }
        if s.take_free(weight) {
            return Ok(Joined::Granted);
        }
        if s.waiters.len() >= s.limits.queue {
            return Err(AcquireError::QueueFull);
        }
        // No fill needed: with the queue empty the weight did not fit, and with waiters ahead
        // the newcomer is not the head.
        Ok(Joined::Queued(s.waiters.push_back(weight)))
    }

    /// Takes `weight` units only if they are free right now and nobody waits.
    pub(crate) fn try_take(&self, weight: usize) -> Result<(), TryAcquireError> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(TryAcquireError::Closed);
        }
        if let Some(parallel) = s.too_heavy(weight) {
            return Err(TryAcquireError::TooHeavy { weight, parallel });
        }
        if s.take_free(weight) {
            Ok(())
        } else {
            Err(TryAcquireError::NoSlot)
        }
    }

    /// Looks at a queued waiter on behalf of its future (see [`WaitQueue::poll`]).
    pub(crate) fn poll_waiter(&self, token: Token, waker: &Waker) -> Status {
        self.state.lock().waiters.poll(token, waker)
    }

    /// A queued waiter of `weight` units had its future dropped: it leaves the queue, or passes
    /// on the units it was handed in the same instant (rule 3). Either way the units that were
    /// set aside for it, if it was the head, go to whoever is head now.
    pub(crate) fn cancel(&self, token: Token, weight: usize) {
        let mut s = self.state.lock();
        match s.waiters.remove(token) {
            Status::Granted => s.in_flight = s.in_flight.saturating_sub(weight),
            Status::Waiting | Status::Closed | Status::TooHeavy { .. } => {}
        }
        let mut wakers = WakeList::default();
        s.fill(&mut wakers);
        drop(s);
        wakers.wake_all();
    }

    /// A permit of `weight` units was released.
    pub(crate) fn release(&self, weight: usize) {
        let mut s = self.state.lock();
        // Saturating: a release can never underflow, whatever a caller does.
        s.in_flight = s.in_flight.saturating_sub(weight);
        let mut wakers = WakeList::default();
        s.fill(&mut wakers);
        drop(s);
        wakers.wake_all();
    }

    /// Changes the limits live. Held permits are never revoked; new room goes to waiters first.
    pub(crate) fn configure(&self, limits: Limits) {
        let mut s = self.state.lock();
        s.limits = limits;
        let mut wakers = WakeList::default();
        s.fill(&mut wakers);
        drop(s);
        wakers.wake_all();
    }

    /// Closes the key: every waiter fails with `Closed`; held permits stay valid.
    pub(crate) fn close(&self) {
        let mut s = self.state.lock();
        s.closed = true;
        let wakers = s.waiters.close_all();
        drop(s);
        wakers.into_iter().for_each(Waker::wake);
    }

    pub(crate) fn read(&self) -> Reading {
        let s = self.state.lock();
        Reading {
            limits: s.limits,
            in_flight: s.in_flight,
            reserved: s.reserved(),
            queued: s.waiters.len(),
            closed: s.closed,
        }
    }
}

impl State {
    /// `Some(parallel)` when `weight` can never fit under the limits. A paused key
    /// (`parallel = 0`) refuses nothing: everything queues until it grows again.
    fn too_heavy(&self, weight: usize) -> Option<usize> {
        let parallel = self.limits.parallel;
        (parallel > 0 && weight > parallel).then_some(parallel)
    }

    /// Whether `weight` more units fit under `parallel` now.
    fn fits(&self, weight: usize) -> bool {
        weight <= self.limits.parallel.saturating_sub(self.in_flight)
    }

    /// Takes `weight` units if they fit and nobody waits. FIFO: free units with a waiter ahead
    /// are that waiter's partial grant, never a newcomer's.
    fn take_free(&mut self, weight: usize) -> bool {
        let free = self.waiters.is_empty() && self.fits(weight);
        if free {
            self.in_flight += weight;
        }
        free
    }

    /// Grants head waiters in order while each one's whole weight fits (rule 2: handoff, and a
    /// heavy head is never overtaken by lighter waiters behind it). A head that can never fit
    /// after a shrink leaves with `TooHeavy`, so it does not block the queue for ever. After a
    /// shrink `in_flight` may exceed `parallel`; then nothing is granted until it drains (rule
    /// 4).
    fn fill(&mut self, wakers: &mut WakeList) {
        while let Some(weight) = self.waiters.front_weight() {
            if let Some(parallel) = self.too_heavy(weight) {
                wakers.push(self.waiters.refuse_front(parallel));
            } else if self.fits(weight) {
                self.in_flight += weight;
                wakers.push(self.waiters.grant_front());
            } else {
                break;
            }
        }
    }

    /// Units free now but set aside for the head waiter, which needs more than that.
    fn reserved(&self) -> usize {
        if self.waiters.is_empty() {
            0
        } else {
            self.limits.parallel.saturating_sub(self.in_flight)
        }
    }
}
