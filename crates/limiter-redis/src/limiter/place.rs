//! A waiter's place in the shared queue, watched from outside its acquire: what a gateway
//! needs to answer a streamed request before its slot comes (`queue_keepalive`), which it may
//! do only once a queue has accepted the waiter, and to tell the client where it stands.
//!
//! The acquire updates its [`Place`] at each step: [`Standing::Joining`] until its script call
//! has answered, [`Standing::Queued`] once the shared queue holds it (with the script's
//! count of waiters ahead), [`Standing::Done`] when it has an outcome. While the store is down
//! under `local-share`, a wait in this replica's share is a queue too: `Queued` with the local
//! queue's count.

use std::fmt;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::watch;

use super::KeyEntry;

/// Where one acquire of a [`RedisLimiter`](crate::RedisLimiter) stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Standing {
    /// Not in a queue yet: the acquire has not been polled, or its call to the store has not
    /// answered.
    Joining,
    /// Waiting in a queue that accepted it.
    Queued {
        /// Waiters expected to be granted first, as last read (the script's count, by the
        /// local limiter's rule: higher classes, then the rounds of fair order).
        ahead: usize,
    },
    /// The acquire has its outcome: a slot, or a refusal.
    Done,
}

/// A handle on one acquire's [`Standing`], given by
/// [`RedisLimiter::acquire_placed`](crate::RedisLimiter::acquire_placed). Clones watch the
/// same acquire.
#[derive(Clone)]
pub struct Place {
    shared: Arc<Shared>,
}

struct Shared {
    standing: watch::Sender<Standing>,
    /// The lease waiting in the shared queue, to ask the store about (`None` while there is
    /// none, or while the wait is in the local share).
    lease: Mutex<Option<(Arc<KeyEntry>, String)>>,
}

impl fmt::Debug for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Place")
            .field("standing", &self.standing())
            .finish_non_exhaustive()
    }
}

impl Place {
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::new(Shared {
                standing: watch::Sender::new(Standing::Joining),
                lease: Mutex::new(None),
            }),
        }
    }

    /// Where the acquire stands now.
    pub fn standing(&self) -> Standing {
        *self.shared.standing.borrow()
    }

    /// Resolves once the acquire is in a queue or has its outcome (never
    /// [`Standing::Joining`]). An acquire that is never polled never gets there: await this
    /// together with the acquire.
    pub async fn settled(&self) -> Standing {
        let mut rx = self.shared.standing.subscribe();
        match rx.wait_for(|s| *s != Standing::Joining).await {
            Ok(standing) => *standing,
            // The sender lives in `self`: it cannot be gone.
            Err(_) => Standing::Done,
        }
    }

    /// Queued in the shared store as `id` of `key`.
    pub(crate) fn queued(&self, key: &Arc<KeyEntry>, id: &str, ahead: usize) {
        *self.shared.lease.lock() = Some((key.clone(), id.to_owned()));
        self.set(Standing::Queued { ahead });
    }

    /// Queued in this replica's local share while the store is down.
    pub(crate) fn queued_locally(&self, ahead: usize) {
        *self.shared.lease.lock() = None;
        self.set(Standing::Queued { ahead });
    }

    /// A fresh count from the store for the lease waiting there; ignored once the acquire
    /// has left the queue.
    pub(crate) fn ahead(&self, ahead: usize) {
        self.shared
            .standing
            .send_if_modified(|standing| match standing {
                Standing::Queued { ahead: old } if *old != ahead => {
                    *old = ahead;
                    true
                }
                _ => false,
            });
    }

    pub(crate) fn done(&self) {
        *self.shared.lease.lock() = None;
        self.set(Standing::Done);
    }

    /// The lease to ask the store about, while one waits there.
    pub(crate) fn lease(&self) -> Option<(Arc<KeyEntry>, String)> {
        self.shared.lease.lock().clone()
    }

    fn set(&self, standing: Standing) {
        self.shared.standing.send_replace(standing);
    }
}
