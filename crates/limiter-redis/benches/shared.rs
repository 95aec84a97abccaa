//! Criterion benches of admission through Redis next to the local limiter, both through the
//! `Admission` trait, on the Redis at `127.0.0.1:6379` (or `SLOTGATE_TEST_REDIS_URL`).
//!
//! - `one call`: the Redis round trip itself (`PING` on a multiplexed connection, as the
//!   limiter's), an acquire granted at once (`parallel` unbounded; its release runs in the
//!   background meanwhile) next to the local limiter's, an acquire that queues (until the
//!   store's reply says queued), one round trip each; and a handoff: from the drop of a held
//!   slot to the grant of a waiter on another replica (the release's round trip, then the grant
//!   message).
//! - `acquire+release`: one task, `parallel = 1, queue = 1`: each acquire waits for the
//!   previous release to reach the store, so an iteration is one full acquire and one full
//!   release.
//! - `contended`: 16 tasks share `parallel = 4`, 25 acquisitions each (400 in all), on one
//!   replica or split across two (two independent limiters: own connections, own
//!   subscriptions).
//!
//! Results and the exact command are in `docs/benchmarks.md`.

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use slotgate_admission::Admission;
use slotgate_limiter::{Limiter, Ticket};
use slotgate_limiter_redis::{RedisLimiter, Settings, Standing};

const HOST: &str = "http://gpu-1:8080";
const MODEL: &str = "llama";

fn redis_limiter(rt: &tokio::runtime::Runtime, prefix: &str) -> Arc<dyn Admission> {
    Arc::new(shared_limiter(rt, prefix))
}

fn shared_limiter(rt: &tokio::runtime::Runtime, prefix: &str) -> RedisLimiter {
    let url = std::env::var("SLOTGATE_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let mut settings = Settings::new(url);
    prefix.clone_into(&mut settings.key_prefix);
    let _guard = rt.enter();
    RedisLimiter::start(settings).expect("valid settings")
}

/// Joins the queue behind a held slot and waits until the store's reply says queued (one
/// round trip); the acquire is then dropped (its cancel runs in the background).
async fn join_queue(limiter: &RedisLimiter) {
    let (acquire, place) = limiter.acquire_placed(HOST, MODEL, &Ticket::new());
    let mut acquire = acquire;
    tokio::select! {
        biased;
        outcome = &mut acquire => panic!("not queued: {:?}", outcome.map(|_| ())),
        standing = place.settled() => assert!(matches!(standing, Standing::Queued { .. })),
    }
}

/// A slot held on `holder` is released while `waiter`'s acquire waits in the shared queue:
/// the time from the drop to the waiter's grant (the release's round trip, then the grant
/// message to the other replica).
async fn handoff(holder: &RedisLimiter, waiter: &RedisLimiter) -> Duration {
    let held = holder.acquire(HOST, MODEL).await.expect("a free slot");
    let (acquire, place) = waiter.acquire_placed(HOST, MODEL, &Ticket::new());
    let acquire = tokio::spawn(acquire);
    place.settled().await;
    let start = std::time::Instant::now();
    drop(held);
    let slot = acquire.await.unwrap().expect("granted by the release");
    let took = start.elapsed();
    drop(slot);
    took
}

async fn acquire_release(admission: &dyn Admission) {
    let slot = admission
        .acquire(HOST, MODEL)
        .await
        .expect("a Redis server on 127.0.0.1:6379 (or SLOTGATE_TEST_REDIS_URL)");
    drop(slot);
}

async fn contended(replicas: &[Arc<dyn Admission>]) {
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let admission = replicas[i % replicas.len()].clone();
            tokio::spawn(async move {
                for _ in 0..25 {
                    acquire_release(admission.as_ref()).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
}

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let prefix = format!("slotgate-bench-{}", std::process::id());
    one_call(c, &rt, &prefix);
    in_turn(c, &rt, &prefix);
}

/// One round trip each, and the handoff between two replicas.
fn one_call(c: &mut Criterion, rt: &tokio::runtime::Runtime, prefix: &str) {
    let mut group = c.benchmark_group("one call");
    let url = std::env::var("SLOTGATE_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let conn = rt
        .block_on(
            redis::Client::open(url.as_str())
                .expect("a redis:// URL")
                .get_multiplexed_async_connection(),
        )
        .expect("a Redis server on 127.0.0.1:6379 (or SLOTGATE_TEST_REDIS_URL)");
    group.bench_function("PING", |b| {
        b.to_async(rt).iter(|| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("PING")
                    .query_async::<()>(&mut conn)
                    .await
                    .unwrap();
            }
        });
    });
    let open = redis_limiter(rt, &format!("{prefix}-open"));
    open.configure(HOST, MODEL, 1 << 40, 0);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    group.bench_function("redis acquire, granted at once", |b| {
        b.to_async(rt).iter(|| acquire_release(open.as_ref()));
    });
    let local: Arc<dyn Admission> = Arc::new(Limiter::<String, String>::new());
    local.configure(HOST, MODEL, 1 << 40, 0);
    group.bench_function("local acquire, granted at once", |b| {
        b.to_async(rt).iter(|| acquire_release(local.as_ref()));
    });
    // One slot, held for the whole bench: every acquire queues.
    let busy = shared_limiter(rt, &format!("{prefix}-busy"));
    busy.configure(HOST, MODEL, 1, 1 << 20);
    let _held = rt
        .block_on(busy.acquire(HOST, MODEL))
        .expect("the one slot");
    group.bench_function("redis acquire, queued (the join)", |b| {
        b.to_async(rt).iter(|| join_queue(&busy));
    });
    let holder = shared_limiter(rt, &format!("{prefix}-handoff"));
    let waiter = shared_limiter(rt, &format!("{prefix}-handoff"));
    holder.configure(HOST, MODEL, 1, 4);
    waiter.configure(HOST, MODEL, 1, 4);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    group.bench_function(
        "redis release -> grant message to a waiter on another replica",
        |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (holder, waiter) = (holder.clone(), waiter.clone());
                async move {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += handoff(&holder, &waiter).await;
                    }
                    total
                }
            });
        },
    );
    group.finish();
}

/// Each acquire after the previous release: one task, then 16 in contention.
fn in_turn(c: &mut Criterion, rt: &tokio::runtime::Runtime, prefix: &str) {
    let mut group = c.benchmark_group("acquire+release");
    let local: Arc<dyn Admission> = Arc::new(Limiter::<String, String>::new());
    local.configure(HOST, MODEL, 1, 1);
    group.bench_function("local limiter", |b| {
        b.to_async(rt).iter(|| acquire_release(local.as_ref()));
    });
    let shared = redis_limiter(rt, &format!("{prefix}-single"));
    shared.configure(HOST, MODEL, 1, 1);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    group.bench_function("redis, 1 replica", |b| {
        b.to_async(rt).iter(|| acquire_release(shared.as_ref()));
    });
    group.finish();

    let mut group = c.benchmark_group("contended 16 tasks x 25, parallel 4");
    let local: Arc<dyn Admission> = Arc::new(Limiter::<String, String>::new());
    local.configure(HOST, MODEL, 4, 64);
    group.bench_function("local limiter", |b| {
        b.to_async(rt)
            .iter(|| contended(std::slice::from_ref(&local)));
    });
    let one = redis_limiter(rt, &format!("{prefix}-one"));
    one.configure(HOST, MODEL, 4, 64);
    let two = [
        redis_limiter(rt, &format!("{prefix}-two")),
        redis_limiter(rt, &format!("{prefix}-two")),
    ];
    two[0].configure(HOST, MODEL, 4, 64);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    group.bench_function("redis, 1 replica", |b| {
        b.to_async(rt)
            .iter(|| contended(std::slice::from_ref(&one)));
    });
    group.bench_function("redis, 2 replicas", |b| {
        b.to_async(rt).iter(|| contended(&two));
    });
    group.finish();

    // Leave nothing behind: every key of these prefixes.
    if let Ok(mut conn) = redis::Client::open(
        std::env::var("SLOTGATE_TEST_REDIS_URL")
            .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into())
            .as_str(),
    )
    .and_then(|client| client.get_connection())
    {
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}-*"))
            .query(&mut conn)
            .unwrap_or_default();
        if !keys.is_empty() {
            let _ = redis::cmd("DEL").arg(keys).query::<()>(&mut conn);
        }
    }
}

criterion_group!(shared, benches);
criterion_main!(shared);
