//! Slots: the fixed number of sequences one engine (one model instance) runs at once, and what
//! happens to the requests past that number. A request takes one slot per sequence it runs
//! (its weight: `n` choices take `n` slots, as llama-server and vLLM do), all at once.
//!
//! Two admission modes exist:
//! - **deferred** (llama-server, vLLM, Ollama): a request waits first-come-first-served for a
//!   slot, without bound. tokio's [`Semaphore`] is FIFO-fair, which is exactly llama-server's
//!   deferred `std::deque` and vLLM's waiting queue. Ollama's `max_queue` bound is applied by the
//!   caller ([`QueueBound`]), because Ollama counts pending requests across all models.
//! - **collapse** (llama-server with an overcommitted unified KV cache): every request gets a slot
//!   at once; when more than `parallel` run together, every running request fails. A watch
//!   channel carries a "collapse epoch" that each lease compares against the one it started in.
//!
//! Which idle slot a request takes, and how much of its prompt that slot still holds, is the
//! prompt cache's business (`cache.rs`): it lives under the same lock as the slot table, so the
//! choice and the busy flags never disagree.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::cache::{self, CacheSpec, PromptMemory};

/// What one slot looks like to `/slots`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct SlotInfo {
    pub(crate) busy: bool,
    /// The last task the slot ran; `None` until it has run one (llama-server omits the field).
    pub(crate) id_task: Option<u64>,
    pub(crate) n_prompt_tokens: u32,
    /// Of those, the tokens the slot found in its cache (`n_prompt_tokens_cache`).
    pub(crate) n_cached: u32,
}

/// What a request asks of the slots: its prompt size, how many sequences it runs, and the token
/// sequences the prompt cache compares and keeps (empty for a request that caches nothing).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Work<'a> {
    pub(crate) prompt_tokens: u32,
    pub(crate) weight: usize,
    pub(crate) prompt: &'a [u64],
    pub(crate) answer: &'a [u64],
}

impl Work<'_> {
    /// A request with a prompt size and nothing for the cache.
    #[cfg(test)]
    pub(crate) fn plain(prompt_tokens: u32, weight: usize) -> Self {
        Self {
            prompt_tokens,
            weight,
            prompt: &[],
            answer: &[],
        }
    }
}

/// The slots of one engine.
#[derive(Debug)]
pub(crate) struct SlotPool {
    parallel: usize,
    collapse: bool,
    /// `parallel` permits; deferred mode only.
    permits: Arc<Semaphore>,
    slots: Mutex<Vec<SlotInfo>>,
    /// What the slots hold; locked only while `slots` is.
    memory: Mutex<PromptMemory>,
    collapse_epoch: watch::Sender<u64>,
    waiting: AtomicUsize,
    next_task: AtomicU64,
    prompt_tokens_total: AtomicU64,
    cached_tokens_total: AtomicU64,
    predicted_tokens_total: AtomicU64,
    requests_total: AtomicU64,
}

impl SlotPool {
    pub(crate) fn new(parallel: usize, collapse: bool, cache: CacheSpec) -> Arc<Self> {
        Arc::new(Self {
            parallel,
            collapse,
            permits: Arc::new(Semaphore::new(parallel)),
            slots: Mutex::new(vec![SlotInfo::default(); parallel]),
            memory: Mutex::new(PromptMemory::new(cache, parallel)),
            collapse_epoch: watch::Sender::new(0),
            waiting: AtomicUsize::new(0),
            next_task: AtomicU64::new(0),
            prompt_tokens_total: AtomicU64::new(0),
            cached_tokens_total: AtomicU64::new(0),
            predicted_tokens_total: AtomicU64::new(0),
            requests_total: AtomicU64::new(0),
        })
    }

    /// Takes `weight` slots if they are free now (always, in collapse mode). A weight above
    /// the slot count takes every slot (the caller refuses such requests where the engine does).
    pub(crate) fn try_acquire(self: &Arc<Self>, work: &Work<'_>) -> Option<Lease> {
        let weight = work.weight.clamp(1, self.parallel);
        if self.collapse {
            return Some(self.admit_collapsing(work, weight));
        }
        let permit = Arc::clone(&self.permits)
            .try_acquire_many_owned(permits(weight))
            .ok()?;
        Some(self.occupy(permit, work, weight))
    }

    /// Waits first-come-first-served for `weight` slots, taken together: a heavy request at the
    /// head is not overtaken by lighter ones behind it (tokio's `acquire_many`). Dropping the
    /// future leaves the queue.
    pub(crate) async fn acquire(self: &Arc<Self>, work: &Work<'_>) -> Lease {
        if let Some(lease) = self.try_acquire(work) {
            return lease;
        }
        let weight = work.weight.clamp(1, self.parallel);
        let _waiting = WaitingGuard::new(&self.waiting);
        let permit = Arc::clone(&self.permits)
            .acquire_many_owned(permits(weight))
            .await
            .expect("the pool never closes its semaphore");
        self.occupy(permit, work, weight)
    }

    fn occupy(
        self: &Arc<Self>,
        permit: OwnedSemaphorePermit,
        work: &Work<'_>,
        weight: usize,
    ) -> Lease {
        let mut slots = self.slots.lock();
        let memory = self.memory.lock();
        let mut idle: Vec<usize> = (0..slots.len()).filter(|&i| !slots[i].busy).collect();
        // Permits guarantee idle slots: permits and slots are one to one.
        assert!(idle.len() >= weight, "permits are held, so slots are idle");
        // The first sequence goes where the cache says; the others take the next idle slots.
        let first = memory.pick(&idle, work.prompt).unwrap_or(idle[0]);
        drop(memory);
        idle.retain(|&i| i != first);
        let taken: Vec<usize> = std::iter::once(first)
            .chain(idle.into_iter().take(weight - 1))
            .collect();
        let lease = self.start_task(&mut slots, taken, work, Some(permit));
        drop(slots);
        lease
    }

    fn admit_collapsing(self: &Arc<Self>, work: &Work<'_>, weight: usize) -> Lease {
        let mut slots = self.slots.lock();
        let idle: Vec<usize> = (0..slots.len()).filter(|&i| !slots[i].busy).collect();
        let mut taken = Vec::with_capacity(weight);
        if let Some(first) = self.memory.lock().pick(&idle, work.prompt) {
            taken.push(first);
        }
        while taken.len() < weight {
            let slot = slots
                .iter()
                .enumerate()
                .position(|(i, s)| !s.busy && !taken.contains(&i))
                .unwrap_or_else(|| {
                    slots.push(SlotInfo::default());
                    slots.len() - 1
                });
            taken.push(slot);
        }
        let lease = self.start_task(&mut slots, taken, work, None);
        let running = slots.iter().filter(|s| s.busy).count();
        drop(slots);
        if running > self.parallel {
            // The new request is one of the busy ones, so it fails too: it captured the epoch
            // before this bump.
            self.collapse_epoch.send_modify(|epoch| *epoch += 1);
        }
        lease
    }

    fn start_task(
        self: &Arc<Self>,
        slots: &mut [SlotInfo],
        taken: Vec<usize>,
        work: &Work<'_>,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Lease {
        let prompt_tokens = work.prompt_tokens;
        // The first sequence's slot answers for the cache; the others copy its prompt.
        let words = self.memory.lock().run(taken[0], work.prompt, work.answer);
        let cached = cache::reported(words, work.prompt.len(), prompt_tokens);
        // Each sequence is its own task in its own slot, as llama-server runs `n` choices.
        for &slot in &taken {
            let id_task = self.next_task.fetch_add(1, Ordering::Relaxed);
            slots[slot] = SlotInfo {
                busy: true,
                id_task: Some(id_task),
                n_prompt_tokens: prompt_tokens,
                n_cached: cached,
            };
        }
        self.requests_total.fetch_add(1, Ordering::Relaxed);
        self.prompt_tokens_total
            .fetch_add(prompt_tokens.into(), Ordering::Relaxed);
        self.cached_tokens_total
            .fetch_add(cached.into(), Ordering::Relaxed);
        let rx = self.collapse_epoch.subscribe();
        let epoch = *rx.borrow();
        Lease {
            pool: Arc::clone(self),
            slots: taken,
            cached,
            signal: CollapseSignal { rx, epoch },
            _permit: permit,
        }
    }

    /// The configured slot count (`total_slots`, `max_num_seqs`, `num_parallel`).
    pub(crate) fn parallel(&self) -> usize {
        self.parallel
    }

    /// Requests holding a slot now (`requests_processing`, `num_requests_running`).
    pub(crate) fn running(&self) -> usize {
        self.slots.lock().iter().filter(|s| s.busy).count()
    }

    /// Requests waiting for a slot now (`requests_deferred`, `num_requests_waiting`).
    pub(crate) fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }

    /// A copy of the slot table.
    pub(crate) fn slots(&self) -> Vec<SlotInfo> {
        self.slots.lock().clone()
    }

    /// Counts generated tokens for the metrics.
    pub(crate) fn add_predicted(&self, tokens: u32) {
        self.predicted_tokens_total
            .fetch_add(tokens.into(), Ordering::Relaxed);
    }

    /// Prompt tokens found in the cache, in total (`llamacpp:prompt_tokens_cached_total`).
    pub(crate) fn cached_total(&self) -> u64 {
        self.cached_tokens_total.load(Ordering::Relaxed)
    }

    /// Forgets what every slot holds, as a restarted engine would.
    pub(crate) fn clear_cache(&self) {
        self.memory.lock().clear();
    }

    /// Totals for the metrics: (requests, prompt tokens, predicted tokens).
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        (
            self.requests_total.load(Ordering::Relaxed),
            self.prompt_tokens_total.load(Ordering::Relaxed),
            self.predicted_tokens_total.load(Ordering::Relaxed),
        )
    }
}

/// Permits for a weight (slot counts are small).
fn permits(weight: usize) -> u32 {
    u32::try_from(weight).unwrap_or(u32::MAX)
}

/// Held slots. Dropping it frees the slot and, in deferred mode, hands it to the next waiter.
#[derive(Debug)]
pub(crate) struct Lease {
    pool: Arc<SlotPool>,
    /// The slots held, one per sequence.
    slots: Vec<usize>,
    /// Prompt tokens the engine found in its cache, in the plan's units.
    cached: u32,
    signal: CollapseSignal,
    // Dropped after `Drop::drop` has marked the slot idle, so the next waiter finds it free.
    _permit: Option<OwnedSemaphorePermit>,
}

impl Lease {
    /// The pool this slot belongs to.
    pub(crate) fn pool(&self) -> &Arc<SlotPool> {
        &self.pool
    }

    /// Prompt tokens the engine found in its cache (`cache_n`, `cached_tokens`).
    pub(crate) fn cached(&self) -> u32 {
        self.cached
    }

    /// How many slots (sequences) it holds.
    pub(crate) fn weight(&self) -> usize {
        self.slots.len()
    }

    /// A handle that tells when the engine collapses under this request.
    pub(crate) fn signal(&self) -> CollapseSignal {
        self.signal.clone()
    }
}

/// Tells a running request that the engine collapsed under it (collapse mode only).
#[derive(Clone, Debug)]
pub(crate) struct CollapseSignal {
    rx: watch::Receiver<u64>,
    epoch: u64,
}

impl CollapseSignal {
    /// True once the engine has collapsed since the request started.
    pub(crate) fn is_collapsed(&self) -> bool {
        *self.rx.borrow() != self.epoch
    }

    /// Resolves when the engine collapses; never, outside collapse mode.
    pub(crate) async fn collapsed(&mut self) {
        let epoch = self.epoch;
        // The sender lives in the pool, which the lease keeps alive; should the pool go anyway,
        // nothing can collapse any more.
        if self.rx.wait_for(|now| *now != epoch).await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut slots = self.pool.slots.lock();
        for &slot in &self.slots {
            if let Some(slot) = slots.get_mut(slot) {
                slot.busy = false;
            }
        }
    }
}

/// Ollama's pending-request bound (`OLLAMA_MAX_QUEUE`), shared by all models of a server.
#[derive(Debug)]
pub(crate) struct QueueBound {
    max: usize,
    pending: AtomicUsize,
}

impl QueueBound {
    pub(crate) fn new(max: usize) -> Self {
        Self {
            max,
            pending: AtomicUsize::new(0),
        }
    }

    /// Joins the pending requests, or `None` when `max` are already pending.
    pub(crate) fn try_enter(&self) -> Option<WaitingGuard<'_>> {
        self.pending
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .ok()
            .map(|_| WaitingGuard {
                count: &self.pending,
            })
    }
}

/// Counts one waiter for as long as it lives.
#[derive(Debug)]
pub(crate) struct WaitingGuard<'a> {
    count: &'a AtomicUsize,
}

impl<'a> WaitingGuard<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::AcqRel);
        Self { count }
    }
}

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn deferred_waiters_are_served_in_order() {
        let pool = SlotPool::new(1, false, CacheSpec::off());
        let first = pool.try_acquire(&Work::plain(1, 1)).expect("a free slot");
        assert!(pool.try_acquire(&Work::plain(1, 1)).is_none());

        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..3 {
            let waiter = Arc::clone(&pool);
            let tx = tx.clone();
            tokio::spawn(async move {
                let lease = waiter.acquire(&Work::plain(1, 1)).await;
                tx.send(i).unwrap();
                drop(lease);
            });
            // Let each waiter reach the queue before the next one.
            while pool.waiting() != i + 1 {
                tokio::task::yield_now().await;
            }
        }
        assert_eq!(pool.running(), 1);
        drop(first);
        let order = [
            rx.recv().await.unwrap(),
            rx.recv().await.unwrap(),
            rx.recv().await.unwrap(),
        ];
        assert_eq!(order, [0, 1, 2]);
        assert_eq!(pool.waiting(), 0);
    }

    #[test]
    fn collapse_fails_everyone_running() {
        let pool = SlotPool::new(2, true, CacheSpec::off());
        let a = pool.try_acquire(&Work::plain(1, 1)).unwrap();
        let b = pool.try_acquire(&Work::plain(1, 1)).unwrap();
        let collapsed = |lease: &Lease| lease.signal().is_collapsed();
        assert!(!collapsed(&a) && !collapsed(&b));
        let c = pool.try_acquire(&Work::plain(1, 1)).unwrap();
        assert!(collapsed(&a) && collapsed(&b) && collapsed(&c));
        drop((a, b, c));
        let d = pool.try_acquire(&Work::plain(1, 1)).unwrap();
        assert!(!collapsed(&d), "a fresh request after the collapse runs");
    }

    #[tokio::test]
    async fn a_heavy_request_takes_its_slots_together_and_in_order() {
        let pool = SlotPool::new(3, false, CacheSpec::off());
        let one = pool.try_acquire(&Work::plain(1, 1)).unwrap();
        assert!(
            pool.try_acquire(&Work::plain(1, 3)).is_none(),
            "three slots are not free"
        );
        let heavy = {
            let pool = Arc::clone(&pool);
            tokio::spawn(async move { pool.acquire(&Work::plain(1, 3)).await })
        };
        while pool.waiting() != 1 {
            tokio::task::yield_now().await;
        }
        // A light request behind the heavy one does not overtake it (FIFO).
        assert!(pool.try_acquire(&Work::plain(1, 1)).is_none());
        drop(one);
        let heavy = heavy.await.unwrap();
        assert_eq!((heavy.weight(), pool.running()), (3, 3));
        drop(heavy);
        assert_eq!(pool.running(), 0);
        assert_eq!(
            pool.try_acquire(&Work::plain(1, 9)).unwrap().weight(),
            3,
            "clamped to the slot count"
        );
    }

    #[test]
    fn queue_bound_counts_and_releases() {
        let bound = QueueBound::new(1);
        let first = bound.try_enter();
        assert!(first.is_some());
        assert!(bound.try_enter().is_none());
        drop(first);
        assert!(bound.try_enter().is_some());
    }
}
