//! The acquire future: a place in a key's queue that turns into a [`Permit`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use crate::error::AcquireError;
use crate::key::{Joined, KeyState};
use crate::permit::Permit;
use crate::sched::{QueuePosition, Ticket};
use crate::sync::Arc;
use crate::waiters::{Status, Token};

/// A pending acquire of one key, made by [`Limiter::acquire`](crate::Limiter::acquire),
/// [`Limiter::acquire_many`](crate::Limiter::acquire_many) or their
/// [`KeyHandle`](crate::KeyHandle) twins.
///
/// The acquirer joins the key **when `acquire` is called**, not when the future is first
/// polled: a free slot is taken then, and a place in the queue is reserved then, so grant order
/// is call order. A full queue is reported by the first poll, which never waits.
///
/// **Cancel-safe:** dropping the future leaves the queue in O(1). If its units had been handed to
/// it in the same instant, they pass on to the next waiter (or back to the pool); if it was a
/// heavy head with part of its weight set aside, that part goes to the next head: nothing leaks
/// and nothing is granted twice.
///
/// The future is `Unpin`, `Send` and `'static`, so it can be stored, boxed, or polled once by
/// hand to learn at once whether the queue had room.
#[must_use = "an acquire future holds a slot or a queue place until it is polled or dropped"]
pub struct Acquire {
    key: Arc<KeyState>,
    weight: usize,
    state: State,
}

enum State {
    /// Decided at call time: a slot (`Ok`) or an error, not yet handed to the caller.
    Ready(Result<(), AcquireError>),
    /// In the queue since `since`.
    Waiting { token: Token, since: Instant },
    /// The outcome was returned; the future is spent.
    Done,
}

// === impl Acquire ===

impl Acquire {
    /// An acquire of one unit, in the normal class with no tenant: [`new`](Self::new) made
    /// for the constants, so the checks that a weight or a ticket needs fold away.
    pub(crate) fn one(key: Arc<KeyState>) -> Self {
        Self::new(key, 1, None)
    }

    // Inline so that `one` gets an instance of its own, with the constants folded in.
    #[inline]
    pub(crate) fn new(key: Arc<KeyState>, weight: usize, ticket: Option<&Ticket>) -> Self {
        let state = match KeyState::join(&key, weight, ticket) {
            Ok(Joined::Granted) => State::Ready(Ok(())),
            Ok(Joined::Queued(token)) => State::Waiting {
                token,
                since: Instant::now(),
            },
            Err(error) => State::Ready(Err(error)),
        };
        Self { key, weight, state }
    }

    /// `true` while this acquire waits in the queue (neither granted nor refused yet as far as
    /// the future has seen).
    pub fn is_queued(&self) -> bool {
        matches!(self.state, State::Waiting { .. })
    }

    /// Where this acquire stands in its key's queue, while it waits: how many waiters are
    /// expected to be served before it (see [`QueuePosition`]). `None` once it is granted or
    /// refused (as far as the key knows), or if it never queued.
    ///
    /// For a client's queue position, or a `Retry-After` per tenant. Costs O(waiters ahead in
    /// its line) plus O(tenants waiting in its class), under the key's lock.
    ///
    /// ```
    /// use slotgate_limiter::Limiter;
    ///
    /// let limiter: Limiter = Limiter::new();
    /// limiter.configure("gpu-1", "llama", 1, 8);
    /// let _held = limiter.try_acquire("gpu-1", "llama").unwrap();
    /// let first = limiter.acquire("gpu-1", "llama");
    /// let second = limiter.acquire("gpu-1", "llama");
    /// assert_eq!(first.position().unwrap().ahead, 0);
    /// assert_eq!(second.position().unwrap().ahead, 1);
    /// ```
    pub fn position(&self) -> Option<QueuePosition> {
        match self.state {
            State::Waiting { token, .. } => self.key.position(token),
            _ => None,
        }
    }

    /// The units this acquire asks for: 1 for [`acquire`](crate::Limiter::acquire), the weight
    /// given to [`acquire_many`](crate::Limiter::acquire_many).
    pub fn weight(&self) -> usize {
        self.weight
    }
}

impl Future for Acquire {
    type Output = Result<Permit, AcquireError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        match this.state {
            State::Ready(outcome) => {
                this.state = State::Done;
                Poll::Ready(
                    outcome
                        .map(|()| Permit::new(this.key.clone(), this.weight, Duration::ZERO, None)),
                )
            }
            State::Waiting { token, since } => match this.key.poll_waiter(token, cx.waker()) {
                Status::Waiting => Poll::Pending,
                Status::Granted { at } => {
                    this.state = State::Done;
                    // The wait ends at the handoff, whose instant the grant step read already:
                    // no clock read here, and the time until this poll is the handoff gap's.
                    Poll::Ready(Ok(Permit::new(
                        this.key.clone(),
                        this.weight,
                        at.saturating_duration_since(since),
                        Some(at),
                    )))
                }
                Status::Closed => {
                    this.state = State::Done;
                    Poll::Ready(Err(AcquireError::Closed))
                }
                Status::TooHeavy { parallel } => {
                    this.state = State::Done;
                    Poll::Ready(Err(AcquireError::TooHeavy {
                        weight: this.weight,
                        parallel,
                    }))
                }
            },
            // Polled again after completion: answer like a closed key rather than panic.
            State::Done => Poll::Ready(Err(AcquireError::Closed)),
        }
    }
}

impl Drop for Acquire {
    fn drop(&mut self) {
        match std::mem::replace(&mut self.state, State::Done) {
            // Granted at call time but never collected: give the slot back.
            State::Ready(Ok(())) => KeyState::release(&self.key, self.weight),
            State::Waiting { token, .. } => KeyState::cancel(&self.key, token, self.weight),
            State::Ready(Err(_)) | State::Done => {}
        }
    }
}

impl fmt::Debug for Acquire {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match self.state {
            State::Ready(Ok(())) => "granted",
            State::Ready(Err(AcquireError::QueueFull)) => "queue full",
            State::Ready(Err(AcquireError::TooHeavy { .. })) => "too heavy",
            State::Ready(Err(_)) => "closed",
            State::Waiting { .. } => "queued",
            State::Done => "done",
        };
        f.debug_struct("Acquire")
            .field("weight", &self.weight)
            .field("state", &state)
            .finish_non_exhaustive()
    }
}
