//! # slotgate-limiter
//!
//! A keyed, FIFO, cancel-safe concurrency limiter with bounded queues, runtime-agnostic and
//! checked with [loom].
//!
//! An inference server has a fixed number of sequence slots; past it, requests fail or queue
//! where nobody can see or cancel them. This crate holds the line in front of it. Per key
//! (for slotgate, an upstream's authority and a model name) it hands out at most `parallel`
//! [`Permit`]s, lets at most `queue` acquirers wait first-come-first-served, and refuses the
//! rest **at once** with [`AcquireError::QueueFull`], so the caller can go elsewhere or tell its
//! client to retry.
//!
//! ## The contract
//!
//! 1. An unconfigured key behaves as `parallel = 1, queue = 0`.
//! 2. FIFO with direct handoff: a release gives the slot to the head waiter without ever
//!    decrementing `in_flight`; only with no waiter does `in_flight` go down. With weighted
//!    permits ([`Limiter::acquire_many`]) `parallel` and `in_flight` count units, and the order
//!    is still strictly FIFO: the head is granted when its whole weight fits, a heavy head is
//!    never overtaken by lighter waiters behind it, and released units it cannot use yet are set
//!    aside for it (its *partial grant*, [`KeySnapshot::reserved`]), never given to anyone else.
//! 3. An acquire future dropped in the same instant its slot was handed over passes the slot on:
//!    no leak, no double grant. A heavy head dropped while holding a partial grant passes that
//!    on to the next head.
//! 4. Reconfiguring never revokes a held permit. Shrinking `parallel` lets `in_flight` drain
//!    before new grants; growing it grants waiters at once. Shrinking `queue` keeps existing
//!    waiters.
//! 5. Never panics; `Send + Sync`; no lock held across an await (there are no awaits inside);
//!    keys do not contend with each other on the acquire/release path.
//! 6. Acquire, release and cancellation are O(1) in the number of waiters (plus O(1) per waiter
//!    a release or cancellation grants). Under a host cap, a model leaving the cap's line from
//!    the middle costs O(models of the host) (see rule 8).
//! 7. A weight above `parallel` could never be granted: it is refused at once with
//!    [`AcquireError::TooHeavy`] (and [`TryAcquireError::TooHeavy`]); a queued waiter gets the
//!    same error when a shrink of `parallel` leaves it too heavy.
//! 8. A host may carry its own cap ([`Limiter::configure_host`]) shared by all its models, for
//!    an engine whose models share one pool of slots. A request then needs its whole weight
//!    free at both levels and takes both at once: key before host, always in that order (no
//!    deadlock), nothing held at either level while it waits, its place in its own model's
//!    bounded, cancellable queue, and FIFO across the host's models for the cap. Releasing
//!    frees both. [`Limiter::host_reading`] and [`Limiter::host_snapshot`] expose the cap.
//! 9. Who waits is served in the key's [`QueueOrder`]: FIFO (the default), or fair between
//!    tenants (deficit round-robin with per-tenant shares, FIFO within a tenant). Acquires made
//!    with a [`Ticket`] carry a [`Priority`] class; higher classes are served first, and a class
//!    with waiters passed over [`Priority::PASS_LIMIT`] times in a row is served next (the
//!    starvation bound). A full queue is refused at once whatever the class;
//!    [`Acquire::position`] tells a waiter how many are expected before it.
//!
//! Rules 2 and 3 hold within whatever the order picks: the waiter picked next is never
//! overtaken by a lighter one, and the units set aside for it pass on if it leaves.
//!
//! ## Example: a limiter in front of a backend
//!
//! ```
//! use std::time::Duration;
//! use slotgate_limiter::{AcquireError, Limiter};
//!
//! async fn call_backend(prompt: &str) -> String {
//!     tokio::time::sleep(Duration::from_millis(10)).await;
//!     format!("echo: {prompt}")
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let limiter: Limiter = Limiter::new();
//! // Two slots, two places in the queue.
//! limiter.configure("http://gpu-1:8080", "llama", 2, 2);
//!
//! let mut tasks = Vec::new();
//! for i in 0..6 {
//!     let limiter = limiter.clone();
//!     tasks.push(tokio::spawn(async move {
//!         match limiter.acquire("http://gpu-1:8080", "llama").await {
//!             Ok(permit) => {
//!                 let answer = call_backend(&format!("request {i}")).await;
//!                 Ok((answer, permit.waited()))
//!                 // the permit drops here: the next waiter gets the slot
//!             }
//!             Err(AcquireError::QueueFull) => Err("busy: retry later"),
//!             Err(_) => Err("gone"),
//!         }
//!     }));
//! }
//! let mut served = 0;
//! let mut refused = 0;
//! for task in tasks {
//!     match task.await.unwrap() {
//!         Ok(_) => served += 1,
//!         Err(_) => refused += 1,
//!     }
//! }
//! assert_eq!((served, refused), (4, 2)); // 2 running + 2 queued; the rest refused at once
//! assert_eq!(limiter.in_flight("http://gpu-1:8080", "llama"), 0);
//! # }
//! ```
//!
//! # Implementation Details
//!
//! The limiter is a map `host → model → key`, behind a reader-writer lock that is only written
//! when a key is created, configured or removed. Each key is an `Arc` of its own state behind
//! its own mutex: limits, the in-flight count and a wait queue. [`Acquire`] futures and
//! [`Permit`]s hold that `Arc`, so after the first lookup nothing on the hot path touches the
//! map, and [`KeyHandle`] skips even that lookup.
//!
//! The wait queue is an indexed slab of waiter entries linked by index, which gives the O(1)
//! push, pop and removal-from-anywhere of tokio's intrusive waiter list without `unsafe`
//! (`waiters.rs`). Each entry carries its weight. Every change of a key's state (acquire,
//! release, cancel, reconfigure) ends in one `fill` step that grants head waiters while their
//! whole weight fits under `parallel` and stops at the first that does not. tokio's semaphore
//! assigns released permits to the head waiter one by one, because it has no lock around its
//! counter; under our per-key mutex, the units free while somebody waits *are* the head's partial
//! grant (no newcomer may take them), so a partial grant needs no bookkeeping and a cancelled head
//! leaks nothing: the next `fill` hands its units to the new head. A waiter handed a slot is unlinked but keeps its entry, marked granted, until
//! its future sees it; a future dropped in that state passes the slot on under the same lock,
//! which is how rule 3 holds. Wakers are always woken after the key's lock is released.
//!
//! Which waiter is next is decided by a small scheduler over several FIFO lists of the same slab
//! (one per priority class, and per tenant under fair order), with deficit round-robin between
//! the lists of a class (`sched.rs`); with one list it is the plain FIFO above. A key that
//! uses none of it (FIFO order, only normal-class waiters, no host cap) skips the scheduler
//! altogether and works on its one list directly, until a waiter or a setting needs more
//! (`key.rs`, "Running plain").
//!
//! A host cap is a second, smaller state of the same shape (`group.rs`): a limit, the units in
//! flight over the host's keys, and a FIFO of the keys whose head waits for it. Locks are taken
//! key first, host second, never the other way, and code holding the host's lock never locks a
//! key; a release that frees host units *kicks* the first key in line after letting go of every
//! lock. The details and the argument for why no wake-up is lost are in that module. The host
//! level knows a key only through a one-method trait (run your grant step), so it sits below
//! `key.rs` in the module stack.
//!
//! All locks and `Arc`s come from one `sync` module that swaps in loom's under `--cfg loom`;
//! the loom models live in `src/tests/`.
//!
//! [loom]: https://docs.rs/loom

mod error;
mod future;
mod group;
mod key;
mod limiter;
mod permit;
mod sched;
mod sync;
mod waiters;

pub use error::{AcquireError, TryAcquireError};
pub use future::Acquire;
pub use group::HostReading;
pub use key::Limits;
pub use limiter::{HostSnapshot, KeyHandle, KeyReading, KeySnapshot, Limiter};
pub use permit::Permit;
pub use sched::{Priority, QueueOrder, QueuePosition, Ticket};

#[cfg(test)]
mod tests;
