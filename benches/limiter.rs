//! Criterion benches of the limiter against `tokio::sync::Semaphore`.
//!
//! - `uncontended`: acquire + release of a free slot, one thread, both polled by hand once.
//! - `contended`: 64 tasks on a 2-worker runtime share 4 slots, each task acquires and releases
//!   100 times (yielding while it holds the slot); the time is for all 6 400 acquisitions.
//! - `cancel`: with N waiters queued, one acquire joins the queue and one waiter from the middle
//!   of the queue is cancelled; the cost should not depend on N.
//! - `weighted`: the same uncontended and contended runs with weighted permits
//!   (`acquire_many`) against tokio's `Semaphore::acquire_many`: weight 3 uncontended, and
//!   64 tasks asking for weights 1, 2, 3 in turn on 4 slots.
//!
//! Results and the exact command are in `docs/benchmarks.md`.

use std::future::Future;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use slotgate::limiter::{Acquire, Limiter};
use tokio::sync::Semaphore;

fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    Pin::new(fut).poll(&mut Context::from_waker(Waker::noop()))
}

fn uncontended(c: &mut Criterion) {
    let mut group = c.benchmark_group("uncontended");

    let limiter: Limiter = Limiter::new();
    limiter.configure("h", "m", 4, 0);
    group.bench_function("slotgate acquire+release (map lookup)", |b| {
        b.iter(|| {
            let mut fut = limiter.acquire(black_box("h"), black_box("m"));
            let Poll::Ready(Ok(permit)) = poll_once(&mut fut) else {
                unreachable!()
            };
            drop(permit);
        });
    });

    let handle = limiter.handle("h", "m");
    group.bench_function("slotgate acquire+release (resolved handle)", |b| {
        b.iter(|| {
            let mut fut = black_box(&handle).acquire();
            let Poll::Ready(Ok(permit)) = poll_once(&mut fut) else {
                unreachable!()
            };
            drop(permit);
        });
    });

    let semaphore = Arc::new(Semaphore::new(4));
    group.bench_function("tokio Semaphore acquire+drop", |b| {
        b.iter(|| {
            let mut fut = Box::pin(black_box(&semaphore).acquire());
            let Poll::Ready(Ok(permit)) =
                fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
            else {
                unreachable!()
            };
            drop(permit);
        });
    });
    group.bench_function("tokio Semaphore acquire_owned+drop", |b| {
        b.iter(|| {
            let mut fut = Box::pin(black_box(&semaphore).clone().acquire_owned());
            let Poll::Ready(Ok(permit)) =
                fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
            else {
                unreachable!()
            };
            drop(permit);
        });
    });
    group.finish();
}

const TASKS: usize = 64;
const ROUNDS: usize = 100;

fn contended(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("contended 64 tasks x 100, parallel 4");

    group.bench_function("slotgate", |b| {
        b.to_async(&runtime).iter(|| async {
            let limiter: Limiter = Limiter::new();
            limiter.configure("h", "m", 4, TASKS);
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let key = limiter.handle("h", "m");
                    tokio::spawn(async move {
                        for _ in 0..ROUNDS {
                            let permit = key.acquire().await.expect("queue fits every task");
                            tokio::task::yield_now().await;
                            drop(permit);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
        });
    });

    group.bench_function("tokio Semaphore", |b| {
        b.to_async(&runtime).iter(|| async {
            let semaphore = Arc::new(Semaphore::new(4));
            let tasks: Vec<_> = (0..TASKS)
                .map(|_| {
                    let semaphore = semaphore.clone();
                    tokio::spawn(async move {
                        for _ in 0..ROUNDS {
                            let permit = semaphore.acquire().await.expect("open");
                            tokio::task::yield_now().await;
                            drop(permit);
                        }
                    })
                })
                .collect();
            for t in tasks {
                t.await.expect("task");
            }
        });
    });
    group.finish();
}

fn cancel(c: &mut Criterion) {
    let mut group = c.benchmark_group("cancel");
    for waiters in [10usize, 1_000, 100_000] {
        group.bench_with_input(
            BenchmarkId::new("slotgate join+cancel", waiters),
            &waiters,
            |b, &n| {
                let limiter: Limiter = Limiter::new();
                limiter.configure("h", "m", 1, usize::MAX);
                let key = limiter.handle("h", "m");
                let _held = key.try_acquire().expect("free");
                let mut queue: Vec<Acquire> = (0..n).map(|_| key.acquire()).collect();
                let mut i = 0usize;
                b.iter(|| {
                    // Cancel a waiter somewhere in the queue (swap_remove is O(1) on our side
                    // of the benchmark) and let a new one join at the back.
                    i = (i + 7919) % n;
                    drop(queue.swap_remove(i));
                    queue.push(key.acquire());
                });
                assert_eq!(limiter.queued("h", "m"), n);
            },
        );
        group.bench_with_input(
            BenchmarkId::new("tokio Semaphore join+cancel", waiters),
            &waiters,
            |b, &n| {
                let semaphore = Arc::new(Semaphore::new(0));
                let mut queue: Vec<_> = (0..n)
                    .map(|_| {
                        let mut fut = Box::pin(semaphore.clone().acquire_owned());
                        assert!(
                            fut.as_mut()
                                .poll(&mut Context::from_waker(Waker::noop()))
                                .is_pending()
                        );
                        fut
                    })
                    .collect();
                let mut i = 0usize;
                b.iter(|| {
                    i = (i + 7919) % n;
                    drop(queue.swap_remove(i));
                    let mut fut = Box::pin(semaphore.clone().acquire_owned());
                    assert!(
                        fut.as_mut()
                            .poll(&mut Context::from_waker(Waker::noop()))
                            .is_pending()
                    );
                    queue.push(fut);
                });
            },
        );
    }
    group.finish();
}

/// Weight of task `i` in the mixed contended run: 1, 2, 3, 1, 2, 3, …
fn mixed_weight(task: usize) -> u32 {
    u32::try_from(task % 3 + 1).expect("small")
}

fn weighted(c: &mut Criterion) {
    let mut group = c.benchmark_group("weighted");

    let limiter: Limiter = Limiter::new();
    limiter.configure("h", "m", 4, 0);
    let handle = limiter.handle("h", "m");
    group.bench_function("slotgate acquire_many(3)+release (resolved handle)", |b| {
        b.iter(|| {
            let mut fut = black_box(&handle).acquire_many(black_box(3));
            let Poll::Ready(Ok(permit)) = poll_once(&mut fut) else {
                unreachable!()
            };
            drop(permit);
        });
    });
    let semaphore = Arc::new(Semaphore::new(4));
    group.bench_function("tokio Semaphore acquire_many(3)+drop", |b| {
        b.iter(|| {
            let mut fut = Box::pin(black_box(&semaphore).acquire_many(black_box(3)));
            let Poll::Ready(Ok(permit)) =
                fut.as_mut().poll(&mut Context::from_waker(Waker::noop()))
            else {
                unreachable!()
            };
            drop(permit);
        });
    });

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .build()
        .expect("runtime");
    group.bench_function(
        "slotgate contended 64 tasks x 100, weights 1-3, parallel 4",
        |b| {
            b.to_async(&runtime).iter(|| async {
                let limiter: Limiter = Limiter::new();
                limiter.configure("h", "m", 4, TASKS);
                let tasks: Vec<_> = (0..TASKS)
                    .map(|task| {
                        let key = limiter.handle("h", "m");
                        let weight = mixed_weight(task) as usize;
                        tokio::spawn(async move {
                            for _ in 0..ROUNDS {
                                let permit = key.acquire_many(weight).await.expect("fits");
                                tokio::task::yield_now().await;
                                drop(permit);
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("task");
                }
            });
        },
    );
    group.bench_function(
        "tokio Semaphore contended 64 tasks x 100, weights 1-3, parallel 4",
        |b| {
            b.to_async(&runtime).iter(|| async {
                let semaphore = Arc::new(Semaphore::new(4));
                let tasks: Vec<_> = (0..TASKS)
                    .map(|task| {
                        let semaphore = semaphore.clone();
                        let weight = mixed_weight(task);
                        tokio::spawn(async move {
                            for _ in 0..ROUNDS {
                                let permit = semaphore.acquire_many(weight).await.expect("open");
                                tokio::task::yield_now().await;
                                drop(permit);
                            }
                        })
                    })
                    .collect();
                for t in tasks {
                    t.await.expect("task");
                }
            });
        },
    );
    group.finish();
}

criterion_group!(benches, uncontended, contended, cancel, weighted);
criterion_main!(benches);
