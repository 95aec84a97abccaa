//! The limiter's hot paths, one at a time, for instruction counts under callgrind.
//!
//! Wall-clock benches (`benches/limiter.rs` at the workspace root) need a quiet machine; an
//! instruction count does not, since the same binary doing the same work executes the same
//! instructions however loaded the machine is. This driver runs one scenario `N` times and
//! nothing else, so `benches/limiter-instructions.sh` can run it under callgrind twice (with
//! `N` and with 0) and divide the difference by `N`: setup, start-up and exit cancel out.
//!
//! ```sh
//! cargo bench -p slotgate-limiter --bench instructions --no-run
//! target/release/deps/instructions-* <scenario> <N>
//! ```
//!
//! Scenarios (each against `tokio::sync::Semaphore` doing the same):
//!
//! - `uncontended` / `uncontended-map` / `tokio-uncontended`: acquire + release of a free slot
//!   through a resolved handle, through the map (two `String` lookups), and tokio's
//!   `acquire` + drop, each polled once by hand;
//! - `weighted` / `tokio-weighted`: the same with a weight of 3;
//! - `cancel-W` / `tokio-cancel-W` with W waiters queued: one acquire joins the back of the
//!   queue and one from the middle is dropped;
//! - `contended` / `tokio-contended`: 64 tasks on a current-thread runtime share 4 slots, each
//!   acquiring and releasing N times in all (N/64 rounds each, yielding while it holds the
//!   slot). One thread keeps the count deterministic; it includes tokio's scheduler.
//! - `cancel-fair-W`: `cancel-W` on a key with fair order and every waiter a tenant of its own
//!   out of 8, the scheduler's worst common case (limiter only).
//! - `contended-lines` / `tokio-contended-lines`: `contended` with a marker for a memory trace:
//!   it prints the address of a counter to stderr (`marker 0x…`) and adds one to the counter
//!   before every acquire, so that `benches/limiter-lines.sh` can cut valgrind lackey's trace
//!   into one window per acquisition and count the cache lines each touches.
//! - `contended-mt` / `tokio-contended-mt`: `contended` on a 2-worker runtime, as in the
//!   criterion bench, where two cores pass the key's state between them: for timing whole
//!   processes A/B. Not for callgrind, whose count then depends on the threads' interleaving.
//!
//! The binary prints nothing on success but the `*-lines` scenarios' marker; a bad scenario
//! name exits with status 2. Without a scenario (`cargo bench`, `cargo test --benches`) it runs
//! each one briefly, as a smoke test.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use slotgate_limiter::{Acquire, Limiter, QueueOrder, Ticket};
use tokio::sync::Semaphore;

fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

fn uncontended(n: usize, weight: usize, through_map: bool) {
    let limiter: Limiter = Limiter::new();
    limiter.configure("h", "m", 4, 0);
    let handle = limiter.handle("h", "m");
    for _ in 0..n {
        let mut fut = match (through_map, weight) {
            (true, _) => limiter.acquire(black_box("h"), black_box("m")),
            (false, 1) => black_box(&handle).acquire(),
            (false, w) => black_box(&handle).acquire_many(black_box(w)),
        };
        let Poll::Ready(Ok(permit)) = poll_once(&mut fut) else {
            unreachable!("a free slot")
        };
        drop(black_box(permit));
    }
}

fn tokio_uncontended(n: usize, weight: u32) {
    let semaphore = Arc::new(Semaphore::new(4));
    for _ in 0..n {
        let mut fut = Box::pin(black_box(&semaphore).acquire_many(black_box(weight)));
        let Poll::Ready(Ok(permit)) = fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
        else {
            unreachable!("a free slot")
        };
        drop(black_box(permit));
    }
}

fn cancel(n: usize, waiters: usize, fair: bool) {
    let limiter: Limiter = Limiter::new();
    limiter.configure("h", "m", 1, usize::MAX);
    if fair {
        limiter.configure_order("h", "m", QueueOrder::Fair);
    }
    let key = limiter.handle("h", "m");
    let tickets: Vec<Ticket> = (0..8)
        .map(|t| Ticket::new().tenant(format!("t{t}")))
        .collect();
    let join = |i: usize| {
        if fair {
            key.acquire_with(&tickets[i % tickets.len()])
        } else {
            key.acquire()
        }
    };
    let _held = key.try_acquire().expect("free");
    let mut queue: Vec<Acquire> = (0..waiters).map(join).collect();
    let mut i = 0usize;
    for round in 0..n {
        // A waiter somewhere in the middle leaves (swap_remove is O(1) on this side), and a
        // new one joins at the back.
        i = (i + 7919) % waiters;
        drop(queue.swap_remove(i));
        queue.push(join(round));
    }
    assert_eq!(limiter.queued("h", "m"), waiters);
    // Not dropped: the order the waiters would leave in depends on `n`, so their cost would
    // not cancel out between the two runs. The process ends right after.
    std::mem::forget(queue);
}

fn tokio_cancel(n: usize, waiters: usize) {
    let semaphore = Arc::new(Semaphore::new(0));
    let join = || {
        let mut fut = Box::pin(semaphore.clone().acquire_owned());
        assert!(poll_once(&mut fut).is_pending());
        fut
    };
    let mut queue: Vec<_> = (0..waiters).map(|_| join()).collect();
    let mut i = 0usize;
    for _ in 0..n {
        i = (i + 7919) % waiters;
        drop(queue.swap_remove(i));
        queue.push(join());
    }
    std::mem::forget(queue);
}

const TASKS: usize = 64;

/// Counts acquisitions in the `*-lines` scenarios: every store to it starts a trace window.
static MARKER: AtomicUsize = AtomicUsize::new(0);

fn contended(n: usize, tokio_semaphore: bool, marked: bool, two_workers: bool) {
    if marked {
        eprintln!("marker {:p}", &MARKER);
    }
    let mark = move || {
        if marked {
            MARKER.fetch_add(1, Ordering::Relaxed);
        }
    };
    let rounds = n / TASKS;
    let runtime = if two_workers {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
    } else {
        tokio::runtime::Builder::new_current_thread().build()
    }
    .expect("runtime");
    runtime.block_on(async {
        let limiter: Limiter = Limiter::new();
        limiter.configure("h", "m", 4, TASKS);
        let semaphore = Arc::new(Semaphore::new(4));
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let key = limiter.handle("h", "m");
                let semaphore = semaphore.clone();
                tokio::spawn(async move {
                    for _ in 0..rounds {
                        mark();
                        if tokio_semaphore {
                            let permit = semaphore.acquire().await.expect("open");
                            tokio::task::yield_now().await;
                            drop(permit);
                        } else {
                            let permit = key.acquire().await.expect("queue fits every task");
                            tokio::task::yield_now().await;
                            drop(permit);
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("task");
        }
    });
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // A test runner asking for the list of tests (nextest runs `--list --format terse` on every
    // target): there are none.
    if args.iter().any(|a| a == "--list") {
        return ExitCode::SUCCESS;
    }
    // `cargo bench` runs every bench target with `--bench`, `cargo test --benches` with no
    // scenario: a short run of each scenario then.
    if args.first().is_none_or(|a| a.starts_with("--")) {
        for scenario in [
            "uncontended",
            "uncontended-map",
            "tokio-uncontended",
            "weighted",
            "tokio-weighted",
            "cancel-1000",
            "tokio-cancel-1000",
            "cancel-fair-1000",
            "contended",
            "tokio-contended",
            "contended-lines",
            "contended-mt",
        ] {
            run(scenario, 6_400);
        }
        return ExitCode::SUCCESS;
    }
    let (Some(scenario), Some(Ok(n))) = (args.first(), args.get(1).map(|n| n.parse::<usize>()))
    else {
        eprintln!("usage: instructions <scenario> <N>");
        return ExitCode::from(2);
    };
    if run(scenario, n) {
        ExitCode::SUCCESS
    } else {
        eprintln!("unknown scenario {scenario}");
        ExitCode::from(2)
    }
}

/// Runs `scenario` `n` times; `false` for an unknown name.
fn run(scenario: &str, n: usize) -> bool {
    let waiters = |prefix: &str| {
        scenario
            .strip_prefix(prefix)
            .and_then(|w| w.parse::<usize>().ok())
    };
    match scenario {
        "uncontended" => uncontended(n, 1, false),
        "uncontended-map" => uncontended(n, 1, true),
        "tokio-uncontended" => tokio_uncontended(n, 1),
        "weighted" => uncontended(n, 3, false),
        "tokio-weighted" => tokio_uncontended(n, 3),
        "contended" => contended(n, false, false, false),
        "tokio-contended" => contended(n, true, false, false),
        "contended-lines" => contended(n, false, true, false),
        "tokio-contended-lines" => contended(n, true, true, false),
        "contended-mt" => contended(n, false, false, true),
        "tokio-contended-mt" => contended(n, true, false, true),
        _ => {
            if let Some(w) = waiters("cancel-fair-") {
                cancel(n, w, true);
            } else if let Some(w) = waiters("cancel-") {
                cancel(n, w, false);
            } else if let Some(w) = waiters("tokio-cancel-") {
                tokio_cancel(n, w);
            } else {
                return false;
            }
        }
    }
    true
}
