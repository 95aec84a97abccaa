//! Criterion benches of admission through Redis next to the local limiter, both through the
//! `Admission` trait, on the Redis at `127.0.0.1:6379` (or `SLOTGATE_TEST_REDIS_URL`).
//!
//! - `one call`: the Redis round trip itself (`PING` on a multiplexed connection, as the
//!   limiter's), and an acquire granted at once (`parallel` unbounded; its release runs in the
//!   background meanwhile), one round trip each.
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
use slotgate_limiter::Limiter;
use slotgate_limiter_redis::{RedisLimiter, Settings};

const HOST: &str = "http://gpu-1:8080";
const MODEL: &str = "llama";

fn redis_limiter(rt: &tokio::runtime::Runtime, prefix: &str) -> Arc<dyn Admission> {
    let url = std::env::var("SLOTGATE_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/0".into());
    let mut settings = Settings::new(url);
    prefix.clone_into(&mut settings.key_prefix);
    let _guard = rt.enter();
    Arc::new(RedisLimiter::start(settings).expect("valid settings"))
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
        b.to_async(&rt).iter(|| {
            let mut conn = conn.clone();
            async move {
                redis::cmd("PING")
                    .query_async::<()>(&mut conn)
                    .await
                    .unwrap()
            }
        });
    });
    let open = redis_limiter(&rt, &format!("{prefix}-open"));
    open.configure(HOST, MODEL, 1 << 40, 0);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    group.bench_function("redis acquire, granted at once", |b| {
        b.to_async(&rt).iter(|| acquire_release(open.as_ref()));
    });
    group.finish();

    let mut group = c.benchmark_group("acquire+release");
    let local: Arc<dyn Admission> = Arc::new(Limiter::<String, String>::new());
    local.configure(HOST, MODEL, 1, 1);
    group.bench_function("local limiter", |b| {
        b.to_async(&rt).iter(|| acquire_release(local.as_ref()));
    });
    let shared = redis_limiter(&rt, &format!("{prefix}-single"));
    shared.configure(HOST, MODEL, 1, 1);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    group.bench_function("redis, 1 replica", |b| {
        b.to_async(&rt).iter(|| acquire_release(shared.as_ref()));
    });
    group.finish();

    let mut group = c.benchmark_group("contended 16 tasks x 25, parallel 4");
    let local: Arc<dyn Admission> = Arc::new(Limiter::<String, String>::new());
    local.configure(HOST, MODEL, 4, 64);
    group.bench_function("local limiter", |b| {
        b.to_async(&rt)
            .iter(|| contended(std::slice::from_ref(&local)));
    });
    let one = redis_limiter(&rt, &format!("{prefix}-one"));
    one.configure(HOST, MODEL, 4, 64);
    let two = [
        redis_limiter(&rt, &format!("{prefix}-two")),
        redis_limiter(&rt, &format!("{prefix}-two")),
    ];
    two[0].configure(HOST, MODEL, 4, 64);
    rt.block_on(async { tokio::time::sleep(Duration::from_millis(100)).await });
    group.bench_function("redis, 1 replica", |b| {
        b.to_async(&rt)
            .iter(|| contended(std::slice::from_ref(&one)));
    });
    group.bench_function("redis, 2 replicas", |b| {
        b.to_async(&rt).iter(|| contended(&two));
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
