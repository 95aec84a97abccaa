//! The wait queue of one key: FIFO lists of weighted waiters with O(1) push, pop and removal
//! from anywhere. A key has one list per priority class, and under fair order one per tenant
//! and class; which list is served next is the scheduler's business (`sched.rs`).
//!
//! # Implementation Details
//!
//! tokio's semaphore keeps its waiters in an intrusive linked list threaded through the
//! acquire futures themselves, which needs `unsafe`. We get the same complexity in safe code
//! with an *indexed slab*: every waiter is an entry of a `Vec`, linked to its neighbours by
//! index (`prev` / `next`), and vacant entries form a free list that new waiters reuse. A
//! [`Token`] names an entry by index plus a *generation* that changes every time the entry is
//! vacated, so a stale token can never reach somebody else's waiter.
//!
//! An entry outlives its place in the list: when a slot is handed to the head waiter the entry
//! is unlinked but stays occupied as [`Entry::Granted`] until its future observes the grant (or
//! is dropped and passes the slot on). Likewise [`Entry::Closed`] waits to be observed. Only the
//! owner of the token vacates the entry, so the slab never frees an entry a future still names.
//!
//! The ends of list [`INLINE_LIST`] (the normal class's list under FIFO order, where nearly
//! every waiter of nearly every key sits) are kept in the queue itself, beside its counters;
//! the other lists' ends are in a `Vec`. A join or a grant on that list then writes the lines of
//! the queue and of the entries it links, and no third allocation (see `docs/benchmarks.md`,
//! "Cache lines per acquisition"). Each entry fills one 64-byte line of its own.

use std::task::Waker;
use std::time::Instant;

/// Marks "no entry" in the `prev` / `next` / free-list links.
const NIL: usize = usize::MAX;

/// The list whose ends are kept inline (module docs).
pub(crate) const INLINE_LIST: usize = 1;

/// The name of one waiter's entry, held by its acquire future.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Token {
    index: usize,
    generation: u64,
}

/// What a waiter's entry says when its owner looks at it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Still in the queue.
    Waiting,
    /// A slot was handed over (at this instant: in the grant step, which is the release, cancel
    /// or reconfiguration that freed it); the waiter now counts as in flight.
    Granted {
        /// When the units were handed over.
        at: Instant,
    },
    /// The key was removed while the waiter was queued.
    Closed,
    /// The limits shrank below the waiter's weight (to this `parallel`): it could never be
    /// granted, so it was taken out of the queue.
    TooHeavy {
        /// The limit it no longer fits under.
        parallel: usize,
    },
}

/// What [`WaitQueue::remove`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removed {
    /// It was waiting, and left the queue from there.
    Waiting(Left),
    /// Units had been handed to it: the caller holds them and must pass them on.
    Granted,
    /// Nothing to pass on: it was closed or refused, or the token was stale.
    Done,
}

/// Where a removed waiter stood (see [`WaitQueue::remove`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Left {
    /// The list it left.
    pub(crate) list: usize,
    /// Whether it was the head of that list (the next to be served in it).
    pub(crate) was_head: bool,
}

#[derive(Debug)]
enum Entry {
    Vacant {
        next_free: usize,
    },
    Waiting {
        waker: Option<Waker>,
        prev: usize,
        next: usize,
        /// How many units the waiter asks for.
        weight: usize,
        /// The list it is linked into.
        list: usize,
    },
    Granted {
        at: Instant,
    },
    Closed,
    TooHeavy {
        parallel: usize,
    },
}

/// One entry and its generation. Aligned so that each one is a cache line of its own: unaligned,
/// the 64 bytes of most entries straddle two lines.
#[derive(Debug)]
#[repr(align(64))]
struct Slot {
    generation: u64,
    entry: Entry,
}

/// The two ends of one FIFO list, and its length.
#[derive(Debug, Clone, Copy)]
struct List {
    head: usize,
    tail: usize,
    len: usize,
}

impl List {
    const EMPTY: List = List {
        head: NIL,
        tail: NIL,
        len: 0,
    };
}

/// FIFO lists of waiters backed by one indexed slab. Not synchronised: the key's mutex guards
/// it.
///
/// `repr(C)`: the fields a join, a grant and a cancel on [`INLINE_LIST`] write come first, so
/// that they share the key's hot lines (`key.rs`, "Layout").
#[derive(Debug)]
#[repr(C)]
pub(crate) struct WaitQueue {
    /// Entries in the list (state `Waiting`).
    waiting: usize,
    /// Entries not vacant (waiting, granted or closed but not yet observed).
    occupied: usize,
    free: usize,
    slots: Vec<Slot>,
    /// The ends of [`INLINE_LIST`].
    inline: List,
    /// Whether a waiter whose weight is not 1 may be queued: set when one joins, cleared when
    /// the queue empties.
    odd: bool,
    /// The ends of the other lists, by id (the entry at [`INLINE_LIST`] is not used).
    lists: Vec<List>,
}

impl Default for WaitQueue {
    fn default() -> Self {
        Self::new()
    }
}

impl WaitQueue {
    /// Once the slab is this large and drains empty, its memory is given back.
    const SHRINK_ABOVE: usize = 1024;

    pub(crate) const fn new() -> Self {
        Self {
            waiting: 0,
            occupied: 0,
            free: NIL,
            slots: Vec::new(),
            inline: List::EMPTY,
            odd: false,
            lists: Vec::new(),
        }
    }

    /// The ends of `list`, `None` for an id no waiter ever joined.
    #[inline]
    fn list(&self, list: usize) -> Option<&List> {
        if list == INLINE_LIST {
            Some(&self.inline)
        } else {
            self.lists.get(list)
        }
    }

    /// The ends of `list`, which a waiter joined before.
    #[inline]
    fn list_mut(&mut self, list: usize) -> &mut List {
        if list == INLINE_LIST {
            &mut self.inline
        } else {
            &mut self.lists[list]
        }
    }

    /// How many waiters are queued (granted and closed entries not counted).
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.waiting
    }

    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting == 0
    }

    /// Whether every waiter queued asks for exactly one unit (conservative: `false` may also
    /// mean that one that did has left). Then the head is granted exactly when a unit is free,
    /// and is never too heavy for a key with room for one.
    #[inline]
    pub(crate) fn all_weight_one(&self) -> bool {
        !self.odd
    }

    /// How many waiters are in `list`.
    #[inline]
    pub(crate) fn list_len(&self, list: usize) -> usize {
        self.list(list).map_or(0, |l| l.len)
    }

    /// The weight of the head waiter of `list`, `None` when it is empty.
    #[inline]
    pub(crate) fn front_weight(&self, list: usize) -> Option<usize> {
        match self.slots.get(self.list(list)?.head)?.entry {
            Entry::Waiting { weight, .. } => Some(weight),
            _ => None,
        }
    }

    /// Queues a waiter of `weight` units at the back of `list`.
    #[inline]
    pub(crate) fn push_back(&mut self, list: usize, weight: usize) -> Token {
        if list != INLINE_LIST && self.lists.len() <= list {
            self.grow_lists(list);
        }
        let tail = self.list_mut(list).tail;
        let entry = Entry::Waiting {
            waker: None,
            prev: tail,
            next: NIL,
            weight,
            list,
        };
        // `free` is NIL (no entry) when the free list is empty, as `tail` is for an empty list:
        // both lookups then find nothing.
        let (index, generation) = if let Some(slot) = self.slots.get_mut(self.free) {
            let index = self.free;
            self.free = match slot.entry {
                Entry::Vacant { next_free } => next_free,
                // The free list only ever links vacant entries.
                _ => NIL,
            };
            slot.entry = entry;
            (index, slot.generation)
        } else {
            self.slots.push(Slot {
                generation: 0,
                entry,
            });
            (self.slots.len() - 1, 0)
        };
        if let Some(Slot {
            entry: Entry::Waiting { next, .. },
            ..
        }) = self.slots.get_mut(tail)
        {
            *next = index;
        }
        let l = self.list_mut(list);
        if tail == NIL {
            l.head = index;
        }
        l.tail = index;
        l.len += 1;
        self.waiting += 1;
        self.odd |= weight != 1;
        self.occupied += 1;
        Token { index, generation }
    }

    /// Hands the head waiter of `list` its units: unlinks it, marks it granted and returns its
    /// waker (absent if it was never polled, or if nobody waits).
    pub(crate) fn grant_front(&mut self, list: usize) -> Option<Waker> {
        // Read under the key's lock, in the step that freed the units: the moment of the
        // handoff, for the gap until the waiter uses them (`Permit::handed_over`).
        self.settle_front(list, Entry::Granted { at: Instant::now() })
    }

    /// Takes the head waiter of `list` out of the queue because its weight is above
    /// `parallel`; returns its waker.
    pub(crate) fn refuse_front(&mut self, list: usize, parallel: usize) -> Option<Waker> {
        self.settle_front(list, Entry::TooHeavy { parallel })
    }

    fn settle_front(&mut self, list: usize, outcome: Entry) -> Option<Waker> {
        let index = self.list(list)?.head;
        if index == NIL {
            return None;
        }
        self.unlink(index, outcome)
    }

    /// Marks every queued waiter closed and returns their wakers, emptying every list.
    pub(crate) fn close_all(&mut self) -> Vec<Waker> {
        let mut wakers = Vec::with_capacity(self.waiting);
        for list in 0..self.lists.len().max(INLINE_LIST + 1) {
            while let Some(&List { head, .. }) = self.list(list).filter(|l| l.head != NIL) {
                if let Some(waker) = self.unlink(head, Entry::Closed) {
                    wakers.push(waker);
                }
            }
        }
        wakers
    }

    /// Where a waiting entry stands: its list and how many waiters are ahead of it in that
    /// list. O(that count): it walks the list backwards.
    pub(crate) fn position(&self, token: Token) -> Option<(usize, usize)> {
        let slot = self
            .slots
            .get(token.index)
            .filter(|slot| slot.generation == token.generation)?;
        let Entry::Waiting { mut prev, list, .. } = slot.entry else {
            return None;
        };
        let mut ahead = 0;
        while prev != NIL {
            ahead += 1;
            prev = match self.slots[prev].entry {
                Entry::Waiting { prev, .. } => prev,
                _ => NIL,
            };
        }
        Some((list, ahead))
    }

    /// Looks at a waiter's entry on behalf of its future.
    ///
    /// While it waits, the waker is stored (replacing an older one that would not wake the same
    /// task). Once granted or closed, the entry is vacated: the caller now owns the outcome. A
    /// stale token reads as `Closed`, which cannot happen while only the owner vacates entries.
    #[inline]
    pub(crate) fn poll(&mut self, token: Token, waker: &Waker) -> Status {
        let Some(slot) = self.slot_mut(token) else {
            return Status::Closed;
        };
        match &mut slot.entry {
            Entry::Waiting { waker: stored, .. } => {
                match stored {
                    Some(stored) if stored.will_wake(waker) => {}
                    _ => *stored = Some(waker.clone()),
                }
                Status::Waiting
            }
            &mut Entry::Granted { at } => {
                self.vacate(token.index);
                Status::Granted { at }
            }
            &mut Entry::TooHeavy { parallel } => {
                self.vacate(token.index);
                Status::TooHeavy { parallel }
            }
            Entry::Closed | Entry::Vacant { .. } => {
                self.vacate(token.index);
                Status::Closed
            }
        }
    }

    /// Removes a waiter on behalf of its dropped future, wherever it stands: O(1).
    ///
    /// Returns what the entry was: for a waiting one the list it left and whether it was that
    /// list's head; `Granted` means the caller holds units it must pass on.
    #[inline]
    pub(crate) fn remove(&mut self, token: Token) -> Removed {
        let Some(slot) = self.slot_mut(token) else {
            return Removed::Done;
        };
        let removed = match slot.entry {
            Entry::Waiting { list, prev, .. } => Removed::Waiting(Left {
                list,
                was_head: prev == NIL,
            }),
            Entry::Granted { .. } => Removed::Granted,
            Entry::TooHeavy { .. } | Entry::Closed | Entry::Vacant { .. } => Removed::Done,
        };
        let vacant = Entry::Vacant {
            next_free: self.free,
        };
        if let Removed::Waiting(_) = removed {
            // Dropping the waker here is fine: the caller holds the lock, and a waker's drop
            // never re-enters the limiter.
            drop(self.unlink(token.index, vacant));
        } else {
            self.slots[token.index].entry = vacant;
        }
        self.vacated(token.index);
        removed
    }

    #[inline]
    fn slot_mut(&mut self, token: Token) -> Option<&mut Slot> {
        self.slots
            .get_mut(token.index)
            .filter(|slot| slot.generation == token.generation)
            .filter(|slot| !matches!(slot.entry, Entry::Vacant { .. }))
    }

    /// Unlinks a `Waiting` entry from its list, leaves `outcome` in its place (what the entry
    /// is from now on: granted, refused, closed or vacant) and returns its waker. Called only
    /// on list members (a list's head, an entry just seen waiting); on anything else it only
    /// writes `outcome`.
    #[inline]
    fn unlink(&mut self, index: usize, outcome: Entry) -> Option<Waker> {
        // One write: the old entry is moved out whole, so nothing of it is dropped here.
        let Entry::Waiting {
            waker,
            prev,
            next,
            list,
            ..
        } = std::mem::replace(&mut self.slots[index].entry, outcome)
        else {
            return None;
        };
        let l = self.list_mut(list);
        if prev == NIL {
            l.head = next;
        }
        if next == NIL {
            l.tail = prev;
        }
        l.len -= 1;
        if prev != NIL
            && let Entry::Waiting { next: p_next, .. } = &mut self.slots[prev].entry
        {
            *p_next = next;
        }
        if next != NIL
            && let Entry::Waiting { prev: n_prev, .. } = &mut self.slots[next].entry
        {
            *n_prev = prev;
        }
        self.waiting -= 1;
        if self.waiting == 0 {
            self.odd = false;
        }
        waker
    }

    /// Vacates an entry that is no longer in a list (granted, refused or closed, and now
    /// observed).
    #[inline]
    fn vacate(&mut self, index: usize) {
        self.slots[index].entry = Entry::Vacant {
            next_free: self.free,
        };
        self.vacated(index);
    }

    /// The entry at `index` was just made vacant (pointing at the old free list): it becomes
    /// the free list's head under a new generation, so old tokens no longer reach it.
    #[inline]
    fn vacated(&mut self, index: usize) {
        let slot = &mut self.slots[index];
        slot.generation = slot.generation.wrapping_add(1);
        self.free = index;
        self.occupied -= 1;
        if self.occupied == 0 && self.slots.len() > Self::SHRINK_ABOVE {
            self.shrink();
        }
    }

    /// A burst of waiters is over: gives its memory back. Tokens into the old slab are all
    /// gone (nothing is occupied), so resetting generations is safe. Out of line, so that
    /// [`vacate`](Self::vacate) stays small where it is inlined.
    #[cold]
    #[inline(never)]
    fn shrink(&mut self) {
        self.slots = Vec::new();
        self.free = NIL;
    }

    /// Makes room for lists up to `list`: once per list id a key ever uses.
    #[cold]
    #[inline(never)]
    fn grow_lists(&mut self, list: usize) {
        self.lists.resize(list + 1, List::EMPTY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noop() -> Waker {
        Waker::noop().clone()
    }

    #[test]
    fn fifo_order_with_weights() {
        let mut q = WaitQueue::new();
        let a = q.push_back(0, 3);
        let b = q.push_back(0, 1);
        let c = q.push_back(0, 2);
        assert_eq!(q.len(), 3);
        assert_eq!(q.front_weight(0), Some(3));
        assert_eq!(q.poll(a, &noop()), Status::Waiting);
        assert!(
            q.grant_front(0).is_some(),
            "a was polled: its waker comes back"
        );
        assert!(matches!(q.poll(a, &noop()), Status::Granted { .. }));
        assert_eq!(q.poll(b, &noop()), Status::Waiting);
        assert_eq!(q.front_weight(0), Some(1));
        assert!(q.grant_front(0).is_some());
        assert!(matches!(q.poll(b, &noop()), Status::Granted { .. }));
        assert_eq!(q.front_weight(0), Some(2));
        assert!(q.refuse_front(0, 1).is_none(), "c was never polled");
        assert_eq!(q.poll(c, &noop()), Status::TooHeavy { parallel: 1 });
        assert_eq!(q.front_weight(0), None);
        assert!(q.grant_front(0).is_none());
        assert!(q.is_empty());
        assert_eq!(q.occupied, 0);
    }

    #[test]
    fn remove_from_middle_head_and_tail() {
        let mut q = WaitQueue::new();
        let tokens: Vec<_> = (0..5).map(|_| q.push_back(0, 1)).collect();
        let left = |list, was_head| Removed::Waiting(Left { list, was_head });
        assert_eq!(q.remove(tokens[2]), left(0, false));
        assert_eq!(q.remove(tokens[0]), left(0, true));
        assert_eq!(q.remove(tokens[4]), left(0, false));
        assert_eq!(q.len(), 2);
        q.grant_front(0);
        assert!(matches!(q.poll(tokens[1], &noop()), Status::Granted { .. }));
        q.grant_front(0);
        assert!(matches!(q.poll(tokens[3], &noop()), Status::Granted { .. }));
        assert!(q.grant_front(0).is_none());
    }

    #[test]
    fn stale_tokens_never_touch_a_reused_entry() {
        let mut q = WaitQueue::new();
        let a = q.push_back(0, 1);
        let left = Removed::Waiting(Left {
            list: 0,
            was_head: true,
        });
        assert_eq!(q.remove(a), left);
        let b = q.push_back(0, 1);
        assert_eq!(a.index, b.index, "the vacant entry is reused");
        assert_eq!(q.remove(a), Removed::Done, "stale token is inert");
        assert_eq!(q.len(), 1);
        assert_eq!(q.poll(b, &noop()), Status::Waiting);
    }

    #[test]
    fn granted_entry_removed_reports_granted() {
        let mut q = WaitQueue::new();
        let a = q.push_back(0, 1);
        q.grant_front(0);
        assert_eq!(q.remove(a), Removed::Granted);
        assert_eq!(q.occupied, 0);
    }

    #[test]
    fn close_all_wakes_everyone_once() {
        let mut q = WaitQueue::new();
        let a = q.push_back(0, 1);
        let b = q.push_back(0, 1);
        assert_eq!(q.poll(a, &noop()), Status::Waiting, "stores a waker");
        let wakers = q.close_all();
        assert_eq!(wakers.len(), 1);
        assert!(q.is_empty());
        assert_eq!(q.poll(a, &noop()), Status::Closed);
        assert_eq!(q.remove(b), Removed::Done);
        assert_eq!(q.occupied, 0);
    }

    #[test]
    fn lists_are_independent_fifos_and_positions_count_within_a_list() {
        let mut q = WaitQueue::new();
        let w0 = q.push_back(0, 1);
        let w1 = q.push_back(2, 2);
        let w2 = q.push_back(0, 3);
        let w3 = q.push_back(2, 1);
        assert_eq!((q.list_len(0), q.list_len(1), q.list_len(2)), (2, 0, 2));
        assert_eq!(q.position(w2), Some((0, 1)));
        assert_eq!(q.position(w3), Some((2, 1)));
        assert_eq!(q.front_weight(2), Some(2));
        q.grant_front(2);
        assert_eq!(q.position(w3), Some((2, 0)));
        assert!(matches!(q.poll(w1, &noop()), Status::Granted { .. }));
        let left = Removed::Waiting(Left {
            list: 0,
            was_head: true,
        });
        assert_eq!(q.remove(w0), left);
        assert_eq!(q.position(w2), Some((0, 0)));
        assert_eq!(q.front_weight(1), None);
        let wakers = q.close_all();
        assert!(wakers.is_empty());
        assert_eq!(q.len(), 0);
        assert_eq!(q.poll(w2, &noop()), Status::Closed);
        assert_eq!(q.poll(w3, &noop()), Status::Closed);
    }

    #[test]
    fn memory_is_returned_after_a_burst() {
        let mut q = WaitQueue::new();
        let tokens: Vec<_> = (0..5000).map(|_| q.push_back(0, 1)).collect();
        for t in tokens {
            q.remove(t);
        }
        assert_eq!(q.slots.capacity(), 0);
        let t = q.push_back(0, 1);
        assert_eq!(q.poll(t, &noop()), Status::Waiting);
    }
}
