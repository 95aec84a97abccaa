//! The host cap: a second level of units shared by every model key of one host.
//!
//! An engine serving several models (vLLM with several adapters, a llama-server router) has one
//! pool of sequence slots for all of them. A host cap ([`Limiter::configure_host`]) counts the
//! units in flight over all the host's keys and grants only while the sum stays under its
//! `parallel`, on top of each key's own limit.
//!
//! # Implementation Details
//!
//! **Lock order.** A key's lock is always taken before its host's lock, never the other way:
//! the host's state is only ever locked from inside a key's critical section or on its own, and
//! code holding the host's lock never locks a key. So two levels cannot deadlock.
//!
//! **All or nothing.** A waiter is granted only when its whole weight fits under both its key's
//! and its host's limit, in one step under both locks. A waiter never holds host units while it
//! waits for key units or the other way round: `in_flight` at either level only counts granted
//! permits.
//!
//! **FIFO across keys.** A key whose head waiter fits its key's limit but not the host's joins
//! the host's queue of *blocked keys* (once, however many waiters it has). While that queue is
//! not empty, host units go only to its front: a newcomer on another key queues behind in its
//! own key (its `queue` bound and refusal stay per key), so light requests on one model cannot
//! starve a heavy one on another. Units free at the host while keys are blocked are set aside
//! for the front, like a key's partial grant ([`HostReading::reserved`]).
//!
//! **Kicks.** Whatever frees host units or changes the front (a release, a grant, a cancel, a
//! reconfiguration, a removal) is followed, once every lock is released, by a *kick*: look at
//! the front key under the host's lock, let go of it, then run that key's grant step under its
//! own lock (which takes the host's lock inside, in order). The step re-checks everything, so a
//! stale look costs nothing; each round either grants or takes a key off the host queue, so a
//! kick ends. Every check of host room and every change to it happens under the host's lock, so
//! a key that blocks just before a release is seen by that release's kick, and one that looks
//! just after it sees the room: no lost wake-up (the loom model `two_levels_*` checks it).
//!
//! Taking a key off the host queue from the middle (its waiters all left) is O(blocked keys),
//! at most the number of models of the host; everything else is O(1).
//!
//! **Layering.** The host level sits below the key level: it knows a key only as a [`Member`]
//! (something it can queue and ask to run its grant step), so `key.rs` uses this module and
//! not the other way round. The one member type is the limiter's key state.
//!
//! [`Limiter::configure_host`]: crate::Limiter::configure_host

use std::collections::VecDeque;

use crate::sync::{Arc, Mutex};

/// What the host level needs of a key: to run the key's grant step when host units free up.
pub(crate) trait Member {
    /// Runs the key's grant step with no lock held (it takes the key's lock, then the host's);
    /// whether it made progress (granted, or left the host's queue), so a kick goes on.
    fn unblock(this: &Arc<Self>) -> bool;
}

/// One host's cap as read at one instant, for metrics and status pages (see
/// [`Limiter::host_reading`](crate::Limiter::host_reading)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostReading {
    /// Units allowed in flight over all the host's models; `usize::MAX` is unlimited.
    pub parallel: usize,
    /// Units held now over all the host's models (including permits of removed keys still
    /// held: they still run on the engine).
    pub in_flight: usize,
    /// Units free at the host but set aside for the model whose head waiter is first in line
    /// for the host cap. 0 when no model waits for it.
    pub reserved: usize,
    /// Models whose head waiter fits its own limit and waits only for the host cap.
    pub blocked_models: usize,
}

#[derive(Debug)]
pub(crate) struct GroupState<K> {
    pub(crate) parallel: usize,
    pub(crate) in_flight: usize,
    /// Keys whose head waiter waits for host units, in the order they started to.
    pub(crate) blocked: VecDeque<Arc<K>>,
}

/// A host's shared cap. Keys of the host hold it by `Arc`.
#[derive(Debug)]
pub(crate) struct Group<K> {
    pub(crate) state: Mutex<GroupState<K>>,
}

impl<K: Member> Group<K> {
    pub(crate) fn new(parallel: usize) -> Self {
        Self {
            state: Mutex::new(GroupState {
                parallel,
                in_flight: 0,
                blocked: VecDeque::new(),
            }),
        }
    }

    /// Changes the cap live; held permits are never revoked. Growing it grants blocked keys.
    pub(crate) fn configure(&self, parallel: usize) {
        self.state.lock().parallel = parallel;
        self.kick();
    }

    /// Lets blocked keys take the host units that are free, front first, until the front does
    /// not fit. Must be called with no lock held.
    pub(crate) fn kick(&self) {
        loop {
            let front = {
                let g = self.state.lock();
                match g.blocked.front() {
                    Some(key) if g.in_flight < g.parallel => key.clone(),
                    _ => return,
                }
            };
            // No lock held here: the key's grant step takes its lock, then ours.
            if !K::unblock(&front) {
                return;
            }
        }
    }

    pub(crate) fn read(&self) -> HostReading {
        let g = self.state.lock();
        HostReading {
            parallel: g.parallel,
            in_flight: g.in_flight,
            reserved: g.reserved(),
            blocked_models: g.blocked.len(),
        }
    }
}

impl<K> GroupState<K> {
    /// `Some(parallel)` when `weight` can never fit under the cap (a paused cap refuses
    /// nothing).
    pub(crate) fn too_heavy(&self, weight: usize) -> Option<usize> {
        (self.parallel > 0 && weight > self.parallel).then_some(self.parallel)
    }

    pub(crate) fn fits(&self, weight: usize) -> bool {
        weight <= self.parallel.saturating_sub(self.in_flight)
    }

    /// Whether `key` may take host units now: nobody is blocked, or it is the front.
    pub(crate) fn turn_of(&self, key: &Arc<K>) -> bool {
        self.blocked
            .front()
            .is_none_or(|front| Arc::ptr_eq(front, key))
    }

    /// Takes `key` off the blocked queue, wherever it is; whether it was the front.
    pub(crate) fn unblock(&mut self, key: &Arc<K>) -> bool {
        let Some(at) = self.blocked.iter().position(|k| Arc::ptr_eq(k, key)) else {
            return false;
        };
        self.blocked.remove(at);
        at == 0
    }

    fn reserved(&self) -> usize {
        if self.blocked.is_empty() {
            0
        } else {
            self.parallel.saturating_sub(self.in_flight)
        }
    }
}
