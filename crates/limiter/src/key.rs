//! The state of one (host, model) key: its limits, its in-flight units and its wait queue.
//!
//! Every change of state ends in [`State::fill`], the one place that grants: it hands free units
//! to the head waiter while its whole weight fits (under the key's limit and, if the host has a
//! cap, the host's: see `group.rs` for the second level), and stops at the first one that does
//! not.
//! Units left free while somebody waits are the head waiter's partial grant: nobody else may
//! take them (a newcomer queues behind, `try_acquire` refuses), so they need no bookkeeping of
//! their own and cannot leak — a head that leaves simply lets `fill` pour them into the next.
//!
//! **When the grant step is skipped.** Every change ends in `fill` (or, on a key that runs plain,
//! its one-list form `grant_plain`, below), so between changes the state is one that `fill`
//! leaves: nobody waits, or the waiter picked next does not fit. On a key without a host cap
//! that does not run plain, the scheduler's path skips it where it would change nothing:
//! - a join behind others in the same line (same class, same tenant), and a cancel of a waiter
//!   that had somebody ahead in its line: the pick, the heads of all lines, which classes have
//!   waiters and the free units are all as the last `fill` saw them, so it returns at once;
//! - otherwise, `first_step` looks first: with nobody waiting, or with the waiter picked next
//!   neither fitting nor too heavy, `fill` would stop at its first step. Picking is idempotent,
//!   so that look is exactly `fill`'s first step, and the wakers, the loop and the host are
//!   skipped.
//!
//! With a host cap the step always runs (the host's units can change between two changes of the
//! key, and a key may have to join or leave the host's line).
//!
//! **Running plain.** Most keys use none of what the scheduler is for: no host cap, FIFO order,
//! every waiter in the normal class with a share of 1. Such a key *runs plain* (`State::plain`):
//! its waiters all sit in one list ([`PLAIN_LIST`]), whose head is always the scheduler's pick, so
//! join, cancel, release and the grant step work on that list directly, as the limiter did before
//! weights and classes (issue #13: no regression at weight 1). The list's share stays the 1 that
//! the general path would write, and the count of passes over the normal class is kept (ended by a
//! grant, or by the class emptying). The scheduler's count of the class's waiters is not kept: it
//! is the list's length, written when a position reads it (`State::sync_plain`) and when the key
//! leaves plain. Nor are the class's ring, turn and credit: `Sched::unplain` rebuilds them. Under
//! FIFO order nothing reads those, and fair order forgets them when it starts (`Sched::set_order`),
//! so a key that ran plain and one that did not are indistinguishable. A key leaves plain before
//! anything the general path must do: a waiter of another class or share joins, the order changes,
//! a host cap attaches. It comes back at the end of any general step that leaves the conditions
//! true (`State::recheck_plain`). While every waiter asks for one unit
//! (`WaitQueue::all_weight_one`), the plain step does not even read the head's weight: a free unit
//! and somebody waiting is a grant, anything else is nothing to do; a release of one unit hands it
//! to the head with no wake list, and a head that leaves passes nothing on (it waited because no
//! unit was free, and the next head asks for one too). The proptests of `tests/shortcuts.rs` run
//! every sequence on a key that may run plain and on one that never does, and compare every outcome
//! and position.
//!
//! **Layout.** A contended acquisition costs what its cache lines cost: each line a core writes
//! must travel to the next core that touches it. The key's state is cache-line aligned and
//! `repr(C)`, with what a plain join, grant and cancel write first (the lock, `in_flight`, the wait
//! queue's counters and its inline list: `waiters.rs`), and each waiter's entry is a line of its
//! own. The scheduler's fields come last; a plain key only reads them. `benches/limiter-lines.sh`
//! counts the lines touched per acquisition (`docs/benchmarks.md`).
//!
//! Everything here runs under the key's own mutex and nothing else, which is what keeps keys
//! from contending with each other (rule 5). No method wakes a task while holding the lock:
//! wakers are collected, the guard dropped, and only then are they woken (tokio's
//! `add_permits_locked` does the same), so a woken task never finds the lock taken by its waker.

use std::task::Waker;

use crate::error::{AcquireError, TryAcquireError};
use crate::group::{Group, Member};
use crate::sched::{PLAIN_LIST, QueueOrder, QueuePosition, Sched, Ticket};
use crate::sync::{Arc, Mutex, MutexGuard};
use crate::waiters::{Left, Removed, Status, Token, WaitQueue};

/// The host cap a key counts against, holding the keys that wait for it.
pub(crate) type HostCap = Group<KeyState>;

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

/// `repr(C)`, in the order of the module docs' "Layout".
#[derive(Debug)]
#[repr(C)]
struct State {
    /// Units held by permits (and granted waiters not yet polled).
    in_flight: usize,
    limits: Limits,
    /// The host cap this key counts against, from the moment its host has one.
    group: Option<Arc<HostCap>>,
    /// Set by `remove`: waiters fail with `Closed`, new acquirers too.
    closed: bool,
    /// Whether the key runs plain (module docs): no host cap, FIFO order, and nobody waiting
    /// outside the normal class's list. Read through [`State::is_plain`].
    plain: bool,
    /// Whether this key is in its host's queue of blocked keys.
    blocked: bool,
    waiters: WaitQueue,
    /// Which waiter is served next.
    sched: Sched,
}

/// One key's shared state. Permits and acquire futures hold it by `Arc`, so the hot path never
/// goes back to the limiter's map. Aligned to a cache line, so that the state's first line is
/// the key's own (module docs, "Layout").
#[derive(Debug)]
#[repr(align(64))]
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

    #[inline]
    pub(crate) fn wake_all(self) {
        // `rest` fills only after `first`: nothing to do (and no `Vec` to walk) without it.
        if let Some(first) = self.first {
            first.wake();
            self.rest.into_iter().for_each(Waker::wake);
        }
    }
}

impl KeyState {
    pub(crate) fn new(limits: Limits, group: Option<Arc<HostCap>>) -> Self {
        Self {
            state: Mutex::new(State {
                limits,
                in_flight: 0,
                waiters: WaitQueue::new(),
                sched: Sched::new(),
                closed: false,
                plain: group.is_none(),
                group,
                blocked: false,
            }),
        }
    }

    /// Takes `weight` units if they are free (at the key and its host) and nobody waits;
    /// otherwise joins the queue if it has room, in the class and tenant list of `ticket`
    /// (`None`: normal class, no tenant).
    #[inline]
    pub(crate) fn join(
        this: &Arc<Self>,
        weight: usize,
        ticket: Option<&Ticket>,
    ) -> Result<Joined, AcquireError> {
        let mut s = this.state.lock();
        if s.closed {
            return Err(AcquireError::Closed);
        }
        if let Some(parallel) = s.too_heavy(weight) {
            return Err(AcquireError::TooHeavy { weight, parallel });
        }
        match s.take_free(weight) {
            Take::Taken => return Ok(Joined::Granted),
            Take::TooHeavy(parallel) => return Err(AcquireError::TooHeavy { weight, parallel }),
            Take::NoRoom => {}
        }
        if s.waiters.len() >= s.limits.queue {
            return Err(AcquireError::QueueFull);
        }
        if s.is_plain()
            && ticket.is_none_or(|t| t.class() == crate::Priority::Normal && t.tenant_share() == 1)
        {
            // Plain: to the back of the one list. If others wait, the head and the free units
            // are as the last step left them; if nobody did, `take_free` found the newcomer
            // does not fit (and it is not too heavy). Either way no grant step could grant.
            return Ok(Joined::Queued(s.waiters.push_back(PLAIN_LIST, weight)));
        }
        Ok(Joined::Queued(Self::queue(this, s, weight, ticket)))
    }

    /// Queues a waiter through the scheduler, and runs the grant step if the newcomer may
    /// change the pick. Out of line, so the plain join stays small.
    #[inline(never)]
    fn queue(
        this: &Arc<Self>,
        mut s: MutexGuard<'_, State>,
        weight: usize,
        ticket: Option<&Ticket>,
    ) -> Token {
        s.leave_plain();
        let list = match ticket {
            None => s.sched.list_for(crate::Priority::Normal, None, 1),
            Some(t) => s
                .sched
                .list_for(t.class(), t.tenant_name(), t.tenant_share()),
        };
        let token = s.waiters.push_back(list, weight);
        let len = s.waiters.list_len(list);
        s.sched.joined(list, len);
        if len > 1 && s.group.is_none() && shortcuts() {
            // Behind others in a line that already waited: no pick, no head and no class
            // changed, so the grant step would find what the last one found (module docs).
            // Nor can the key have become plain: nobody left.
            return token;
        }
        Self::settle_join(this, s);
        token
    }

    /// The grant step after a join that may change the pick: the newcomer may be served first
    /// (a higher class, a tenant whose turn it is), or, at the head, have to join the host's
    /// queue of blocked keys. Out of line, so the common join stays small.
    #[inline(never)]
    fn settle_join(this: &Arc<Self>, mut s: MutexGuard<'_, State>) {
        let Step::From(first) = s.first_step() else {
            s.recheck_plain();
            return;
        };
        let mut wakers = WakeList::default();
        let moved = s.fill_from(first, this, &mut wakers);
        s.recheck_plain();
        let group = s.group.clone().filter(|_| moved);
        drop(s);
        wakers.wake_all();
        if let Some(group) = group {
            group.kick();
        }
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
        match s.take_free(weight) {
            Take::Taken => Ok(()),
            Take::TooHeavy(parallel) => Err(TryAcquireError::TooHeavy { weight, parallel }),
            Take::NoRoom => Err(TryAcquireError::NoSlot),
        }
    }

    /// Looks at a queued waiter on behalf of its future (see [`WaitQueue::poll`]).
    #[inline]
    pub(crate) fn poll_waiter(&self, token: Token, waker: &Waker) -> Status {
        self.state.lock().waiters.poll(token, waker)
    }

    /// A queued waiter of `weight` units had its future dropped: it leaves the queue, or passes
    /// on the units it was handed in the same instant (rule 3). Either way the units that were
    /// set aside for it, if it was the head, go to whoever is head now.
    pub(crate) fn cancel(this: &Arc<Self>, token: Token, weight: usize) {
        let mut s = this.state.lock();
        let left = match s.waiters.remove(token) {
            Removed::Waiting(left) => Some(left),
            Removed::Granted => {
                s.give_back(weight);
                None
            }
            Removed::Done => None,
        };
        if s.is_plain() {
            if let Some(left) = left {
                let emptied = s.waiters.is_empty();
                s.sched.plain_left(emptied);
                if !left.was_head || s.waiters.all_weight_one() {
                    // Somebody was ahead of it and still is: nothing a grant step could use.
                    // Nor when every waiter asks for one unit: the head waited because no unit
                    // was free, so none is now, and the next head asks for one too.
                    return;
                }
            }
            // A head left (its partial grant may fit the next), or a slot came back.
            Self::settle_plain(s);
            return;
        }
        Self::cancel_scheduled(this, s, left);
    }

    /// [`cancel`](Self::cancel) through the scheduler. Out of line, so the plain cancel stays
    /// small.
    #[inline(never)]
    fn cancel_scheduled(this: &Arc<Self>, mut s: MutexGuard<'_, State>, left: Option<Left>) {
        s.leave_plain();
        if let Some(left) = left {
            let State { sched, waiters, .. } = &mut *s;
            sched.left(left.list, waiters);
            if !left.was_head && s.group.is_none() && shortcuts() {
                // It had somebody ahead in its line, who is still there: no pick, no head and
                // no class changed, so the grant step would find what the last one found.
                return;
            }
        }
        Self::settle(this, s);
    }

    /// A permit of `weight` units was released.
    pub(crate) fn release(this: &Arc<Self>, weight: usize) {
        let mut s = this.state.lock();
        if s.is_plain() {
            // No host cap: the units come back to the key alone.
            s.in_flight = s.in_flight.saturating_sub(weight);
            Self::settle_plain(s);
            return;
        }
        s.give_back(weight);
        Self::settle_scheduled(this, s);
    }

    /// Changes the limits live. Held permits are never revoked; new room goes to waiters first.
    pub(crate) fn configure(this: &Arc<Self>, limits: Limits) {
        let mut s = this.state.lock();
        s.limits = limits;
        Self::settle(this, s);
    }

    /// Changes the order in which waiters are served; waiters already queued keep their place.
    pub(crate) fn set_order(this: &Arc<Self>, order: QueueOrder) {
        let mut s = this.state.lock();
        s.leave_plain();
        s.sched.set_order(order);
        Self::settle(this, s);
    }

    /// Where a queued waiter stands; `None` once it is no longer waiting.
    pub(crate) fn position(&self, token: Token) -> Option<QueuePosition> {
        let mut s = self.state.lock();
        s.sync_plain();
        let (list, ahead) = s.waiters.position(token)?;
        Some(s.sched.position(list, ahead, &s.waiters))
    }

    /// Where a newcomer with `ticket` would stand if it queued now.
    pub(crate) fn position_for(&self, ticket: &Ticket) -> QueuePosition {
        let mut s = self.state.lock();
        s.sync_plain();
        s.sched.position_for(
            ticket.class(),
            ticket.tenant_name(),
            ticket.tenant_share(),
            &s.waiters,
        )
    }

    /// Makes the key count against its host's cap from now on, with the units it holds now.
    pub(crate) fn attach(this: &Arc<Self>, group: &Arc<HostCap>) {
        let mut s = this.state.lock();
        if s.group.is_some() {
            return;
        }
        group.state.lock().in_flight += s.in_flight;
        s.leave_plain();
        s.group = Some(group.clone());
        Self::settle(this, s);
    }

    /// Closes the key: every waiter fails with `Closed`; held permits stay valid.
    pub(crate) fn close(this: &Arc<Self>) {
        let mut s = this.state.lock();
        s.closed = true;
        let wakers = s.waiters.close_all();
        s.sched.clear();
        let mut rest = WakeList::default();
        // No waiter left: this takes the key off its host's queue if it was there.
        let moved = s.fill(this, &mut rest);
        let group = s.group.clone().filter(|_| moved);
        drop(s);
        wakers.into_iter().for_each(Waker::wake);
        rest.wake_all();
        if let Some(group) = group {
            group.kick();
        }
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

    /// The host cap this key counts against, if any.
    pub(crate) fn group(&self) -> Option<Arc<HostCap>> {
        self.state.lock().group.clone()
    }

    /// Runs the grant step, releases the lock, wakes who was granted, and kicks the host if
    /// host units may now be free for another key.
    #[inline]
    fn settle(this: &Arc<Self>, s: MutexGuard<'_, State>) {
        if s.is_plain() {
            Self::settle_plain(s);
            return;
        }
        Self::settle_scheduled(this, s);
    }

    /// [`settle`](Self::settle) through the scheduler.
    #[inline(never)]
    fn settle_scheduled(this: &Arc<Self>, mut s: MutexGuard<'_, State>) {
        s.leave_plain();
        let Step::From(first) = s.first_step() else {
            s.recheck_plain();
            return;
        };
        let mut wakers = WakeList::default();
        s.fill_from(first, this, &mut wakers);
        s.recheck_plain();
        let group = s.group.clone();
        drop(s);
        wakers.wake_all();
        if let Some(group) = group {
            group.kick();
        }
    }

    /// [`settle`](Self::settle) of a plain key: the grant step over its one list. The common
    /// cases of nothing to do are looked at here (nobody waits; every waiter asks for one unit
    /// and none is free), the rest is out of line.
    #[inline]
    fn settle_plain(s: MutexGuard<'_, State>) {
        if s.waiters.is_empty() || (s.waiters.all_weight_one() && !s.fits(1)) {
            return;
        }
        Self::grant_plain(s);
    }

    /// The rest of [`settle_plain`](Self::settle_plain), with somebody waiting: grants (or
    /// refuses) heads, releases the lock, wakes them.
    #[inline(never)]
    fn grant_plain(mut s: MutexGuard<'_, State>) {
        let mut first = None;
        if s.waiters.all_weight_one() {
            // One unit per waiter, and one is free (`settle_plain` looked): a grant per free
            // unit. After a release of one unit that is one grant, woken without the list.
            first = s.grant_plain_head(1);
            if s.waiters.is_empty() || !s.fits(1) {
                drop(s);
                if let Some(waker) = first {
                    waker.wake();
                }
                return;
            }
        }
        let mut wakers = WakeList::default();
        wakers.push(first);
        if let Some(head) = s.plain_head() {
            s.fill_plain(head, &mut wakers);
        }
        drop(s);
        wakers.wake_all();
    }
}

impl Member for KeyState {
    /// A kick from the host: runs the grant step; whether it made progress on the host's queue
    /// (this key was granted from its front, or left it).
    fn unblock(this: &Arc<Self>) -> bool {
        let mut s = this.state.lock();
        let mut wakers = WakeList::default();
        let moved = s.fill(this, &mut wakers);
        drop(s);
        wakers.wake_all();
        moved
    }
}

#[cfg(all(test, not(loom)))]
thread_local! {
    /// Set by the tests that run every change through the whole grant step, to compare the
    /// shortcuts of the module docs with it (`tests/shortcuts.rs`).
    pub(crate) static NO_SHORTCUTS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Whether the grant step may be skipped where it would change nothing (module docs); always,
/// except in the tests that compare with the whole step.
#[inline]
fn shortcuts() -> bool {
    #[cfg(all(test, not(loom)))]
    if NO_SHORTCUTS.get() {
        return false;
    }
    true
}

/// What [`State::first_step`] found.
enum Step {
    /// The grant step would change nothing.
    Settled,
    /// Run the grant step from this first pick.
    From(Option<(usize, usize)>),
}

/// What [`State::take_free`] did.
enum Take {
    Taken,
    NoRoom,
    /// The weight is above the host cap's `parallel`.
    TooHeavy(usize),
}

impl State {
    /// Whether the key runs plain now (module docs); never in the tests that compare the
    /// shortcuts with the whole grant step.
    #[inline]
    fn is_plain(&self) -> bool {
        self.plain && shortcuts()
    }

    /// Before the scheduler's general path: a plain key's scheduler gets back what running
    /// plain left out.
    #[inline]
    fn leave_plain(&mut self) {
        if self.plain {
            self.plain = false;
            self.sched.unplain(&self.waiters);
        }
    }

    /// Before positions are read: a plain key's scheduler gets the count of waiters it does not
    /// keep.
    fn sync_plain(&mut self) {
        if self.plain {
            self.sched.sync_plain(&self.waiters);
        }
    }

    /// After the general path: whether the key can run plain from here on. From a state the
    /// general path keeps whole, running plain needs nothing more.
    #[inline]
    fn recheck_plain(&mut self) {
        self.plain = self.group.is_none() && shortcuts() && self.sched.can_be_plain();
    }

    /// The weight of a plain key's head waiter if the grant step has something to do with it
    /// (it fits, or is too heavy and must be refused); `None` when nobody waits or the head
    /// waits for units. While every waiter asks for one unit, the head's weight is not even
    /// read: a free unit and somebody waiting is a grant.
    #[inline]
    fn plain_head(&self) -> Option<usize> {
        if self.waiters.all_weight_one() {
            return (!self.waiters.is_empty() && self.fits(1)).then_some(1);
        }
        self.waiters
            .front_weight(PLAIN_LIST)
            .filter(|&weight| self.fits(weight) || self.too_heavy(weight).is_some())
    }

    /// The grant step of a plain key: [`fill`](Self::fill) over its one list, whose pick is
    /// always that list's head, so no scheduler is asked. `head` is the first
    /// [`plain_head`](Self::plain_head), looked at already.
    fn fill_plain(&mut self, head: usize, wakers: &mut WakeList) {
        let mut next = Some(head);
        while let Some(weight) = next {
            // Fitting first, the common case: a weight that fits is never too heavy.
            if self.fits(weight) {
                wakers.push(self.grant_plain_head(weight));
            } else if let Some(parallel) = self.too_heavy(weight) {
                wakers.push(self.waiters.refuse_front(PLAIN_LIST, parallel));
                self.sched.plain_left(self.waiters.is_empty());
            } else {
                // `plain_head` never names such a head; stop rather than look at it again.
                return;
            }
            next = self.plain_head();
        }
    }

    /// Hands a plain key's head waiter its `weight` units (which fit); returns its waker.
    #[inline]
    fn grant_plain_head(&mut self, weight: usize) -> Option<Waker> {
        self.in_flight += weight;
        let waker = self.waiters.grant_front(PLAIN_LIST);
        self.sched.plain_served();
        waker
    }

    /// `Some(parallel)` when `weight` can never fit under the limits. A paused key
    /// (`parallel = 0`) refuses nothing: everything queues until it grows again.
    #[inline]
    fn too_heavy(&self, weight: usize) -> Option<usize> {
        let parallel = self.limits.parallel;
        (parallel > 0 && weight > parallel).then_some(parallel)
    }

    /// Whether `weight` more units fit under `parallel` now.
    #[inline]
    fn fits(&self, weight: usize) -> bool {
        weight <= self.limits.parallel.saturating_sub(self.in_flight)
    }

    /// Whether a newcomer may take `weight` units of the key now: nobody waits, and they fit.
    #[inline]
    fn free_for(&self, weight: usize) -> bool {
        self.waiters.is_empty() && self.fits(weight)
    }

    /// Takes `weight` units if they fit and nobody waits, at the key and at its host. FIFO:
    /// free units with a waiter ahead are that waiter's partial grant, never a newcomer's; free
    /// host units with a model blocked on the host are that model's.
    #[inline]
    fn take_free(&mut self, weight: usize) -> Take {
        let Some(group) = &self.group else {
            if self.free_for(weight) {
                self.in_flight += weight;
                return Take::Taken;
            }
            return Take::NoRoom;
        };
        let free = self.free_for(weight);
        let mut g = group.state.lock();
        if let Some(parallel) = g.too_heavy(weight) {
            return Take::TooHeavy(parallel);
        }
        if free && g.blocked.is_empty() && g.fits(weight) {
            g.in_flight += weight;
            drop(g);
            self.in_flight += weight;
            return Take::Taken;
        }
        Take::NoRoom
    }

    /// The grant step's first look (module docs): [`Step::Settled`] when the step would change
    /// nothing, because the key has no host cap and nobody waits, or the waiter picked next
    /// neither fits nor is too heavy (the step would stop at once); otherwise the step's first
    /// pick, to start it from.
    #[inline]
    fn first_step(&mut self) -> Step {
        if self.group.is_some() || !shortcuts() {
            return Step::From(self.sched.pick(&self.waiters));
        }
        if self.waiters.is_empty() {
            return Step::Settled;
        }
        match self.sched.pick(&self.waiters) {
            Some((_, weight)) if self.too_heavy(weight).is_none() && !self.fits(weight) => {
                Step::Settled
            }
            None => Step::Settled,
            first => Step::From(first),
        }
    }

    /// Units of a permit come back, at the key and at its host.
    fn give_back(&mut self, weight: usize) {
        // Saturating: a release can never underflow, whatever a caller does.
        self.in_flight = self.in_flight.saturating_sub(weight);
        if let Some(group) = &self.group {
            let mut g = group.state.lock();
            g.in_flight = g.in_flight.saturating_sub(weight);
        }
    }

    /// Grants head waiters in order while each one's whole weight fits (rule 2: handoff, and a
    /// heavy head is never overtaken by lighter waiters behind it). A head that can never fit
    /// after a shrink leaves with `TooHeavy`, so it does not block the queue for ever. After a
    /// shrink `in_flight` may exceed `parallel`; then nothing is granted until it drains (rule
    /// 4).
    ///
    /// With a host cap, a head that fits the key also needs its whole weight free at the host,
    /// and its turn there; if not, the key joins the host's queue of blocked keys (`me` is the
    /// key's own `Arc`, for that queue) and the step stops. Returns whether the host queue's
    /// front changed (this key was granted from it, or left it), after which the host must be
    /// kicked for the next front.
    fn fill(&mut self, me: &Arc<KeyState>, wakers: &mut WakeList) -> bool {
        let first = self.sched.pick(&self.waiters);
        self.fill_from(first, me, wakers)
    }

    /// [`fill`](Self::fill) whose first pick was made already (picking is idempotent, so a
    /// pick made under the same lock with nothing changed since is the step's own).
    fn fill_from(
        &mut self,
        first: Option<(usize, usize)>,
        me: &Arc<KeyState>,
        wakers: &mut WakeList,
    ) -> bool {
        let mut moved = false;
        let mut first = Some(first);
        while let Some((list, weight)) = match first.take() {
            Some(pick) => pick,
            None => self.sched.pick(&self.waiters),
        } {
            if let Some(parallel) = self.too_heavy(weight) {
                self.refuse(list, parallel, wakers);
                continue;
            }
            if !self.fits(weight) {
                break;
            }
            let Some(group) = &self.group else {
                self.in_flight += weight;
                self.grant(list, weight, wakers);
                continue;
            };
            let mut g = group.state.lock();
            if let Some(parallel) = g.too_heavy(weight) {
                drop(g);
                self.refuse(list, parallel, wakers);
                continue;
            }
            if g.turn_of(me) && g.fits(weight) {
                g.in_flight += weight;
                if self.blocked {
                    g.blocked.pop_front();
                    self.blocked = false;
                    moved = true;
                }
                drop(g);
                self.in_flight += weight;
                self.grant(list, weight, wakers);
                continue;
            }
            if !self.blocked {
                g.blocked.push_back(me.clone());
                self.blocked = true;
            }
            return moved;
        }
        // Nobody waits, or the head waits for the key's own units: not blocked on the host.
        if self.blocked {
            self.blocked = false;
            if let Some(group) = &self.group {
                moved |= group.state.lock().unblock(me);
            }
        }
        moved
    }

    /// Hands the head of `list` its units (already counted in `in_flight`).
    fn grant(&mut self, list: usize, weight: usize, wakers: &mut WakeList) {
        wakers.push(self.waiters.grant_front(list));
        self.sched.served(list, weight, &self.waiters);
    }

    /// Takes the head of `list` out as too heavy for `parallel`.
    fn refuse(&mut self, list: usize, parallel: usize, wakers: &mut WakeList) {
        wakers.push(self.waiters.refuse_front(list, parallel));
        self.sched.left(list, &self.waiters);
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
