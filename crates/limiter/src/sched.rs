//! Who is served next when several wait: priority classes, and fair queueing between tenants.
//!
//! # Implementation Details
//!
//! A key's waiters sit in FIFO lists of one slab (`waiters.rs`): under [`QueueOrder::Fifo`]
//! one list per [`Priority`] class (ids 0, 1, 2), under [`QueueOrder::Fair`] one per tenant and
//! class (ids from 3 up, found through a map and recycled when they empty). Each class keeps a
//! *ring* of its non-empty lists, served by deficit round-robin (Shreedhar and Varghese,
//! "Efficient fair queuing using deficit round robin", SIGCOMM 1995): the list at the front of
//! the ring is credited its tenant's share in units when its turn starts, serves its head while
//! the head's weight fits the credit, then goes to the back of the ring keeping what is left
//! (and loses it when it empties). With one list in the ring this is plain FIFO, which is why
//! both orders share the code, and why switching order live needs nothing special: lists made
//! before the switch are served until they empty (fair order that follows FIFO order starts a
//! fresh round: [`Sched::set_order`]).
//!
//! Classes are served highest first, except that a class passed over `PASS_LIMIT` times in a
//! row while it had waiters is served next (`passed` counts, per class, grants to higher classes
//! since the class was last served).
//!
//! The scheduler only ever *picks* the next list: [`State::fill`](crate::key) grants its head if
//! the head's weight fits, and otherwise stops with the pick unchanged, so free units stay set
//! aside for that head (its partial grant) until it fits, is cancelled, or a higher pick arrives.
//!
//! Costs: joining, granting and cancelling are O(1), except that a tenant's list that empties
//! while not at the front of its ring is taken out of the ring in O(tenants waiting in that
//! class), and a pick that finds no list with credit for its head fast-forwards every list's
//! credit in O(tenants waiting in that class). Positions are O(waiters ahead in the list) plus
//! O(tenants waiting in the class).

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc as StdArc;

use crate::waiters::{INLINE_LIST, WaitQueue};

/// The order in which a key serves its waiters (see
/// [`Limiter::configure_order`](crate::Limiter::configure_order)).
///
/// Whatever the order, a waiter is granted only when its whole weight fits, the queue is
/// bounded by the key's `queue` (a full queue refuses at once), cancelling is dropping the
/// future, and [`Priority`] classes come first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum QueueOrder {
    /// First come, first served (within a priority class): today's behaviour and the default.
    #[default]
    Fifo,
    /// Fair between tenants: waiters are grouped by the tenant named in their [`Ticket`]
    /// (waiters without one form one anonymous tenant). Within a class, tenants are served
    /// round-robin, each in proportion to its [`share`](Ticket::share) of units per round
    /// (deficit round-robin), and each tenant's own waiters first come, first served.
    ///
    /// **Bound:** with weights of 1, a tenant with a waiter in a class gets a grant in that
    /// class at least once every `1 + Σ share` of the *other* tenants waiting in the class
    /// grants; heavier waiters stretch a round by at most their weight. So one busy tenant
    /// with twenty queued cannot hold back a tenant who arrives later with two: with equal
    /// shares, the newcomer's first waiter is among the next two grants of the class.
    Fair,
}

/// A waiter's priority class; higher classes are served first.
///
/// **Starvation bound:** a class that has waiters and is passed over [`Priority::PASS_LIMIT`]
/// times in a row (grants to higher classes) is served next. So the first waiter in line of
/// the `Normal` class is served after at most `PASS_LIMIT` grants to `High`, and that of the
/// `Low` class after at most `PASS_LIMIT + 1` grants to higher classes (the one extra when
/// `Normal` reached its limit in the same instant and goes first). "First in line" is the
/// waiter the class's order would serve next: its oldest under FIFO order, the tenant whose
/// turn it is under fair order.
///
/// ```
/// use slotgate_limiter::Priority;
///
/// assert!(Priority::High < Priority::Normal && Priority::Normal < Priority::Low);
/// assert_eq!(Priority::default(), Priority::Normal);
/// assert_eq!(Priority::PASS_LIMIT, 4);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Served first.
    High,
    /// The default.
    #[default]
    Normal,
    /// Served last, within the starvation bound.
    Low,
}

impl Priority {
    /// Grants to higher classes in a row after which a class with waiters is served next.
    pub const PASS_LIMIT: usize = 4;

    const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    fn index(self) -> usize {
        self as usize
    }
}

/// What an acquire asks for: its weight, priority class, and tenant (see
/// [`Limiter::acquire_with`](crate::Limiter::acquire_with)).
///
/// ```
/// use slotgate_limiter::{Priority, Ticket};
///
/// let ticket = Ticket::new()
///     .weight(2)
///     .priority(Priority::Low)
///     .tenant("team-a")
///     .share(3);
/// assert_eq!(ticket.weight_units(), 2);
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Ticket {
    weight: usize,
    priority: Priority,
    tenant: Option<StdArc<str>>,
    share: usize,
}

impl Ticket {
    /// Weight 1, [`Priority::Normal`], no tenant, share 1: what [`acquire`](crate::Limiter::acquire)
    /// asks for.
    pub fn new() -> Self {
        Self {
            weight: 1,
            priority: Priority::Normal,
            tenant: None,
            share: 1,
        }
    }

    /// Units to hold (see [`Limiter::acquire_many`](crate::Limiter::acquire_many)).
    #[must_use]
    pub fn weight(mut self, weight: usize) -> Self {
        self.weight = weight;
        self
    }

    /// The priority class.
    #[must_use]
    pub fn priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The tenant the waiter belongs to under [`QueueOrder::Fair`] (ignored under FIFO order).
    #[must_use]
    pub fn tenant(mut self, tenant: impl Into<StdArc<str>>) -> Self {
        self.tenant = Some(tenant.into());
        self
    }

    /// The tenant's share under fair order: units it is credited per round, relative to the
    /// other tenants' (0 counts as 1). A tenant's share is the one its latest waiter gave.
    #[must_use]
    pub fn share(mut self, share: u32) -> Self {
        self.share = usize::try_from(share.max(1)).unwrap_or(usize::MAX);
        self
    }

    /// The units this ticket asks for.
    pub fn weight_units(&self) -> usize {
        self.weight
    }

    /// The priority class (what a shared store sends along with the weight).
    pub fn class(&self) -> Priority {
        self.priority
    }

    /// The tenant, if one was named.
    pub fn tenant_name(&self) -> Option<&StdArc<str>> {
        self.tenant.as_ref()
    }

    /// The tenant's share (at least 1).
    pub fn tenant_share(&self) -> usize {
        self.share
    }
}

impl Default for Ticket {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ticket")
            .field("weight", &self.weight)
            .field("priority", &self.priority)
            .field("tenant", &self.tenant)
            .field("share", &self.share)
            .finish()
    }
}

/// Where a queued acquire stands (see [`Acquire::position`](crate::Acquire::position)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct QueuePosition {
    /// Waiters expected to be granted before this one: everyone waiting in higher classes,
    /// plus, in its own class, those ahead of it in its list and (under fair order) the
    /// grants the other tenants get in the rounds it needs. Exact under FIFO order while
    /// nobody of a higher class arrives; under fair order it counts every waiter as weight 1.
    pub ahead: usize,
    /// Waiters of the same list ahead of it: same class and, under fair order, same tenant.
    pub ahead_in_line: usize,
}

/// The list of the normal class under FIFO order: the one list of a key that runs plain
/// (`key.rs`).
pub(crate) const PLAIN_LIST: usize = Priority::Normal as usize;

// The list a plain key works on is the one whose ends the wait queue keeps inline.
const _: () = assert!(PLAIN_LIST == INLINE_LIST);

/// Per-list scheduling state.
#[derive(Debug, Clone)]
struct ListInfo {
    class: usize,
    /// The tenant's map key, for tenant lists (to recycle the id when the list empties).
    tenant: Option<StdArc<str>>,
    share: usize,
    /// Units credited and not yet used (deficit round-robin).
    credit: usize,
}

/// The scheduler of one key. Not synchronised: the key's mutex guards it.
#[derive(Debug)]
pub(crate) struct Sched {
    pub(crate) order: QueueOrder,
    lists: Vec<ListInfo>,
    /// Tenant lists by (class, tenant).
    tenants: HashMap<(usize, StdArc<str>), usize>,
    free_lists: Vec<usize>,
    /// Per class: non-empty lists in round-robin order; the front is the one whose turn it is.
    rings: [VecDeque<usize>; 3],
    /// Per class: whether the front of the ring was credited for its current turn.
    visiting: [bool; 3],
    /// Per class: waiters queued.
    queued: [usize; 3],
    /// Per class: grants to higher classes since it was last served (while it had waiters).
    passed: [usize; 3],
}

impl Sched {
    pub(crate) fn new() -> Self {
        Self {
            order: QueueOrder::Fifo,
            lists: Priority::ALL
                .iter()
                .map(|p| ListInfo {
                    class: p.index(),
                    tenant: None,
                    share: 1,
                    credit: 0,
                })
                .collect(),
            tenants: HashMap::new(),
            free_lists: Vec::new(),
            rings: Default::default(),
            visiting: [false; 3],
            queued: [0; 3],
            passed: [0; 3],
        }
    }

    /// The list a new waiter with `ticket` joins. Allocates a tenant list if needed.
    #[inline]
    pub(crate) fn list_for(
        &mut self,
        priority: Priority,
        tenant: Option<&StdArc<str>>,
        share: usize,
    ) -> usize {
        let class = priority.index();
        if let (QueueOrder::Fair, Some(tenant)) = (self.order, tenant) {
            return self.tenant_list(class, tenant, share);
        }
        // FIFO order, or no tenant: the class's own list (the anonymous tenant).
        self.lists[class].share = share;
        class
    }

    /// The list of `tenant` in `class` under fair order, made if it has none. Kept out of line:
    /// the map lookup would weigh on every plain acquire that inlines [`list_for`](Self::list_for).
    #[inline(never)]
    fn tenant_list(&mut self, class: usize, tenant: &StdArc<str>, share: usize) -> usize {
        if let Some(&list) = self.tenants.get(&(class, tenant.clone())) {
            self.lists[list].share = share;
            return list;
        }
        let info = ListInfo {
            class,
            tenant: Some(tenant.clone()),
            share,
            credit: 0,
        };
        let list = if let Some(list) = self.free_lists.pop() {
            self.lists[list] = info;
            list
        } else {
            self.lists.push(info);
            self.lists.len() - 1
        };
        self.tenants.insert((class, tenant.clone()), list);
        list
    }

    /// A waiter joined `list` (now `len` long).
    #[inline]
    pub(crate) fn joined(&mut self, list: usize, len: usize) {
        let class = self.lists[list].class;
        self.queued[class] += 1;
        if len == 1 {
            self.rings[class].push_back(list);
        }
    }

    /// The list whose head is served next and that head's weight, `None` when nobody waits.
    /// Picking again without a grant or a departure in between gives the same list and
    /// changes nothing.
    #[inline]
    pub(crate) fn pick(&mut self, queue: &WaitQueue) -> Option<(usize, usize)> {
        // The first class with waiters, unless a class with waiters was passed over too often
        // (the first such class, then): one pass over the three.
        let mut first = None;
        for class in 0..3 {
            if self.queued[class] > 0 {
                if self.passed[class] >= Priority::PASS_LIMIT {
                    first = Some(class);
                    break;
                }
                first.get_or_insert(class);
            }
        }
        let class = first?;
        Some(if self.rings[class].len() == 1 {
            self.pick_only(class, queue)
        } else {
            self.pick_in(class, queue)
        })
    }

    /// Deficit round-robin within one class whose ring holds several lists. Out of line, so
    /// [`pick_only`](Self::pick_only) stays small where it is inlined.
    #[inline(never)]
    fn pick_in(&mut self, class: usize, queue: &WaitQueue) -> (usize, usize) {
        let mut skipped = 0;
        loop {
            let (list, weight, credit) = self.front_turn(class, queue);
            if weight <= credit {
                return (list, weight);
            }
            // Not enough credit: its turn ends, keeping what it has.
            self.rings[class].rotate_left(1);
            self.visiting[class] = false;
            skipped += 1;
            if skipped >= self.rings[class].len() {
                self.fast_forward(class, queue);
                skipped = 0;
            }
        }
    }

    /// [`pick_in`](Self::pick_in) when one list of the class has waiters (every FIFO key, and a
    /// fair one with one tenant waiting): the loop above would end its turn, go round the ring
    /// of one, fast-forward and credit it again until its head fits. This does the same in one
    /// step, leaving the same credit: a share when its turn starts, then as many shares as its
    /// head still needs.
    #[inline]
    fn pick_only(&mut self, class: usize, queue: &WaitQueue) -> (usize, usize) {
        let (list, weight, _) = self.front_turn(class, queue);
        let info = &mut self.lists[list];
        if weight > info.credit {
            let need = weight - info.credit;
            // A share of 1 (every FIFO list) needs no division.
            let rounds = if info.share <= 1 {
                need
            } else {
                need.div_ceil(info.share)
            };
            info.credit = info
                .credit
                .saturating_add(rounds.saturating_mul(info.share));
        }
        (list, weight)
    }

    /// The list at the front of the class's ring, credited its share if its turn starts now:
    /// the list, its head's weight and its credit.
    #[inline]
    fn front_turn(&mut self, class: usize, queue: &WaitQueue) -> (usize, usize, usize) {
        let list = self.rings[class][0];
        let info = &mut self.lists[list];
        if !self.visiting[class] {
            info.credit = info.credit.saturating_add(info.share);
            self.visiting[class] = true;
        }
        (list, queue.front_weight(list).unwrap_or(0), info.credit)
    }

    /// A whole round passed without a list having credit for its head (heavy heads, small
    /// shares): credit every list the rounds that the first of them still needs, at once,
    /// instead of going round for each.
    fn fast_forward(&mut self, class: usize, queue: &WaitQueue) {
        let rounds = self.rings[class]
            .iter()
            .map(|&list| {
                let info = &self.lists[list];
                let need = queue
                    .front_weight(list)
                    .unwrap_or(0)
                    .saturating_sub(info.credit);
                need.div_ceil(info.share)
            })
            .min()
            .unwrap_or(0)
            .saturating_sub(1);
        for &list in &self.rings[class] {
            let info = &mut self.lists[list];
            info.credit = info
                .credit
                .saturating_add(rounds.saturating_mul(info.share));
        }
    }

    /// The head of `list` was granted `weight` units (and has left the queue).
    pub(crate) fn served(&mut self, list: usize, weight: usize, queue: &WaitQueue) {
        let class = self.lists[list].class;
        let info = &mut self.lists[list];
        info.credit = info.credit.saturating_sub(weight);
        for lower in class + 1..3 {
            if self.queued[lower] > 0 {
                self.passed[lower] = self.passed[lower].saturating_add(1);
            }
        }
        self.passed[class] = 0;
        self.left(list, queue);
    }

    /// A waiter left `list` (granted, refused or cancelled; already unlinked from `queue`).
    #[inline]
    pub(crate) fn left(&mut self, list: usize, queue: &WaitQueue) {
        let class = self.lists[list].class;
        self.queued[class] -= 1;
        if self.queued[class] == 0 {
            self.passed[class] = 0;
        }
        if queue.list_len(list) > 0 {
            return;
        }
        // The list emptied: out of the ring, credit lost, tenant id recycled.
        let ring = &mut self.rings[class];
        if ring.front() == Some(&list) {
            ring.pop_front();
            self.visiting[class] = false;
        } else if let Some(at) = ring.iter().position(|&l| l == list) {
            ring.remove(at);
        }
        let info = &mut self.lists[list];
        info.credit = 0;
        if let Some(tenant) = info.tenant.take() {
            self.tenants.remove(&(class, tenant));
            self.free_lists.push(list);
        }
    }

    /// Changes the order; waiters already queued keep their lists.
    ///
    /// Under FIFO order with no tenant list left from a fair period, each class's ring holds
    /// the class's own list alone, and a ring of one never looks at credit (`pick_only` only
    /// tops it up). So when fair order starts from there, every turn and credit is forgotten:
    /// fair order starts a fresh round, and a key that ran plain (`key.rs`), which keeps no
    /// credit, starts it exactly as one that did not.
    pub(crate) fn set_order(&mut self, order: QueueOrder) {
        if self.order == QueueOrder::Fifo && order == QueueOrder::Fair && self.tenants.is_empty() {
            self.visiting = [false; 3];
            for info in &mut self.lists[..3] {
                info.credit = 0;
            }
        }
        self.order = order;
    }

    /// Whether the key may run plain (`key.rs`): FIFO order, no tenant list left from a fair
    /// period, nobody waiting outside the normal class, and the normal list's share 1 (the
    /// last to join it gave no other). Then [`PLAIN_LIST`] is the only list anybody waits in,
    /// and the only one anybody joins until a waiter of another class or share arrives or the
    /// order changes.
    #[inline]
    pub(crate) fn can_be_plain(&self) -> bool {
        self.order == QueueOrder::Fifo
            && self.tenants.is_empty()
            && self.queued[Priority::High.index()] == 0
            && self.queued[Priority::Low.index()] == 0
            && self.lists[PLAIN_LIST].share == 1
    }

    // A plain key's waiters join [`PLAIN_LIST`] with nothing to tell the scheduler: the list's
    // share stays the 1 that `list_for` would write (a key with another share does not run
    // plain), and the class's count, its ring, turn and credit are left for `sync_plain` and
    // `unplain`. Only the class's count of passes is kept: a grant ends it, and so does the
    // class emptying.

    /// A plain key's waiter left [`PLAIN_LIST`] without being granted (cancelled, refused);
    /// `emptied`: nobody waits any more.
    #[inline]
    pub(crate) fn plain_left(&mut self, emptied: bool) {
        if emptied {
            self.not_passed();
        }
    }

    /// A plain key granted the head of [`PLAIN_LIST`]: the class was served.
    #[inline]
    pub(crate) fn plain_served(&mut self) {
        self.not_passed();
    }

    /// The normal class was served, or has nobody left: it was passed over by nobody since.
    /// Written only when it changes: while a key runs plain it is zero after its first grant,
    /// and its line is then only read.
    #[inline]
    fn not_passed(&mut self) {
        if self.passed[PLAIN_LIST] != 0 {
            self.passed[PLAIN_LIST] = 0;
        }
    }

    /// The count of the normal class's waiters, which a plain key does not keep, from its list
    /// (every waiter of a plain key is in it): before positions read it, and when the key
    /// leaves plain.
    pub(crate) fn sync_plain(&mut self, queue: &WaitQueue) {
        self.queued[PLAIN_LIST] = queue.list_len(PLAIN_LIST);
    }

    /// The key stops running plain: the class's count is synced, the ring of the normal class is
    /// rebuilt from its list, and its turn and credit start afresh. Under FIFO order, with no
    /// tenant list, nothing reads those until fair order starts, which forgets them anyway
    /// ([`set_order`](Self::set_order)).
    pub(crate) fn unplain(&mut self, queue: &WaitQueue) {
        self.sync_plain(queue);
        let ring = &mut self.rings[PLAIN_LIST];
        ring.clear();
        if queue.list_len(PLAIN_LIST) > 0 {
            ring.push_back(PLAIN_LIST);
        }
        self.visiting[PLAIN_LIST] = false;
        self.lists[PLAIN_LIST].credit = 0;
    }

    /// Every waiter was closed.
    pub(crate) fn clear(&mut self) {
        let order = self.order;
        *self = Self::new();
        self.order = order;
    }

    /// Where a newcomer with this class, tenant and share would stand if it joined now.
    pub(crate) fn position_for(
        &self,
        priority: Priority,
        tenant: Option<&StdArc<str>>,
        share: usize,
        queue: &WaitQueue,
    ) -> QueuePosition {
        let class = priority.index();
        let list = match (self.order, tenant) {
            (QueueOrder::Fair, Some(tenant)) => self.tenants.get(&(class, tenant.clone())).copied(),
            _ => Some(class),
        };
        let ahead_in_line = list.map_or(0, |l| queue.list_len(l));
        let higher: usize = self.queued[..class].iter().sum();
        let rounds = (ahead_in_line + 1).div_ceil(share.max(1));
        let others: usize = self.rings[class]
            .iter()
            .filter(|&&l| Some(l) != list)
            .map(|&l| {
                queue
                    .list_len(l)
                    .min(rounds.saturating_mul(self.lists[l].share))
            })
            .sum();
        QueuePosition {
            ahead: higher + ahead_in_line + others,
            ahead_in_line,
        }
    }

    /// See [`QueuePosition`].
    pub(crate) fn position(
        &self,
        list: usize,
        ahead_in_line: usize,
        queue: &WaitQueue,
    ) -> QueuePosition {
        let class = self.lists[list].class;
        let higher: usize = self.queued[..class].iter().sum();
        let share = self.lists[list].share;
        // Rounds this waiter needs in its list, and what the other lists get meanwhile.
        let rounds = (ahead_in_line + 1).div_ceil(share);
        let others: usize = self.rings[class]
            .iter()
            .filter(|&&l| l != list)
            .map(|&l| {
                queue
                    .list_len(l)
                    .min(rounds.saturating_mul(self.lists[l].share))
            })
            .sum();
        QueuePosition {
            ahead: higher + ahead_in_line + others,
            ahead_in_line,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::waiters::Removed;

    #[test]
    fn tenant_lists_are_recycled_when_they_empty() {
        let mut queue = WaitQueue::new();
        let mut sched = Sched::new();
        sched.order = QueueOrder::Fair;
        for round in 0..50 {
            let tenant: StdArc<str> = format!("t{round}").into();
            let list = sched.list_for(Priority::Normal, Some(&tenant), 1);
            let token = queue.push_back(list, 1);
            sched.joined(list, queue.list_len(list));
            assert_eq!(sched.pick(&queue), Some((list, 1)));
            let Removed::Waiting(left) = queue.remove(token) else {
                panic!("was waiting")
            };
            sched.left(left.list, &queue);
        }
        assert_eq!(
            sched.lists.len(),
            4,
            "three class lists and one recycled tenant list"
        );
        assert!(sched.tenants.is_empty());
        assert_eq!(sched.pick(&queue), None);
    }

    #[test]
    fn fast_forward_credits_heavy_heads_without_going_round_for_each_unit() {
        let mut queue = WaitQueue::new();
        let mut sched = Sched::new();
        sched.order = QueueOrder::Fair;
        let (a, b): (StdArc<str>, StdArc<str>) = ("a".into(), "b".into());
        let la = sched.list_for(Priority::Normal, Some(&a), 1);
        queue.push_back(la, 1_000_000);
        sched.joined(la, 1);
        let lb = sched.list_for(Priority::Normal, Some(&b), 1);
        queue.push_back(lb, 3);
        sched.joined(lb, 1);
        // b needs 3 rounds, a a million: b is picked after one fast-forward.
        assert_eq!(sched.pick(&queue), Some((lb, 3)));
    }
}
