//! The state of one (host, model) key: its limits, its in-flight count and its wait queue.
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
    /// How many permits may be held at once. `usize::MAX` means unlimited.
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
    /// A slot was free and nobody was ahead: the caller holds it.
    Granted,
    /// The caller waits in line under this token.
    Queued(Token),
}

#[derive(Debug)]
struct State {
    limits: Limits,
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
    pub(crate) queued: usize,
    pub(crate) closed: bool,
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

    /// Takes a slot if one is free and nobody waits; otherwise joins the queue if it has room.
    pub(crate) fn join(&self) -> Result<Joined, AcquireError> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(AcquireError::Closed);
        }
        if s.take_free() {
            return Ok(Joined::Granted);
        }
        if s.waiters.len() >= s.limits.queue {
            return Err(AcquireError::QueueFull);
        }
        Ok(Joined::Queued(s.waiters.push_back(None)))
    }

    /// Takes a slot only if one is free right now and nobody waits.
    pub(crate) fn try_take(&self) -> Result<(), TryAcquireError> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(TryAcquireError::Closed);
        }
        if s.take_free() {
            Ok(())
        } else {
            Err(TryAcquireError::NoSlot)
        }
    }

    /// Looks at a queued waiter on behalf of its future (see [`WaitQueue::poll`]).
    pub(crate) fn poll_waiter(&self, token: Token, waker: &Waker) -> Status {
        self.state.lock().waiters.poll(token, waker)
    }

    /// A queued waiter's future was dropped: leave the queue, or pass on a slot it was handed.
    pub(crate) fn cancel(&self, token: Token) {
        let mut s = self.state.lock();
        let waker = match s.waiters.remove(token) {
            // The slot was handed over in the same instant the future was dropped (rule 3).
            Status::Granted => s.release_one(),
            Status::Waiting | Status::Closed => None,
        };
        drop(s);
        wake(waker);
    }

    /// A permit was released.
    pub(crate) fn release(&self) {
        let mut s = self.state.lock();
        let waker = s.release_one();
        drop(s);
        wake(waker);
    }

    /// Changes the limits live. Held permits are never revoked; new room goes to waiters first.
    pub(crate) fn configure(&self, limits: Limits) {
        let mut s = self.state.lock();
        s.limits = limits;
        let mut wakers = Vec::new();
        while s.in_flight < s.limits.parallel {
            match s.waiters.grant_front() {
                Some(grant) => {
                    s.in_flight += 1;
                    wakers.extend(grant.waker);
                }
                None => break,
            }
        }
        drop(s);
        wakers.into_iter().for_each(Waker::wake);
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
            queued: s.waiters.len(),
            closed: s.closed,
        }
    }
}

impl State {
    /// Takes a slot if one is free and nobody waits for one. FIFO: a free slot with waiters
    /// ahead cannot happen (releases hand over first), but checking the queue keeps a late
    /// arrival from overtaking even if it did.
    fn take_free(&mut self) -> bool {
        let free = self.in_flight < self.limits.parallel && self.waiters.is_empty();
        if free {
            self.in_flight += 1;
        }
        free
    }

    /// Gives one held slot back: to the head waiter if the limits leave room for it (handoff,
    /// `in_flight` unchanged, rule 2), else to the pool. After a shrink, `in_flight` may exceed
    /// `parallel`; then slots drain to the pool until it fits again (rule 4).
    fn release_one(&mut self) -> Option<Waker> {
        if self.in_flight <= self.limits.parallel
            && let Some(grant) = self.waiters.grant_front()
        {
            return grant.waker;
        }
        // Saturating: a release can never underflow, whatever a caller does.
        self.in_flight = self.in_flight.saturating_sub(1);
        None
    }
}

fn wake(waker: Option<Waker>) {
    if let Some(waker) = waker {
        waker.wake();
    }
}
