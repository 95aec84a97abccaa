//! The shared limiter against a real Redis, through its public API only: two independent
//! limiters in one process stand for two gateway replicas.
//!
//! Each test uses its own key prefix and deletes its keys afterwards (`support::Prefix`); the
//! down/up tests run a private `redis-server` of their own. Without a Redis on
//! `127.0.0.1:6379` (or `SLOTGATE_TEST_REDIS_URL`) they fail and say how to start one.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use slotgate_admission::{Admission, AdmitError, Occupancy};
use slotgate_limiter::Ticket;
use slotgate_limiter_redis::{OnStoreDown, RedisLimiter};
use support::{Prefix, PrivateRedis, eventually, redis_url};

const HOST: &str = "http://gpu-1:8080";
const MODEL: &str = "llama";
const TTL: Duration = Duration::from_millis(1500);
const LIMIT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_never_exceed_the_cap_and_every_request_is_served() {
    let prefix = Prefix::new(&redis_url());
    let replicas = [prefix.limiter(TTL), prefix.limiter(TTL)];
    for replica in &replicas {
        replica.configure(HOST, MODEL, 3, 64);
    }
    let in_flight = Arc::new(AtomicUsize::new(0));
    let peak = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..40 {
        let replica = replicas[i % 2].clone();
        let (in_flight, peak) = (in_flight.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            let slot = replica.acquire(HOST, MODEL).await?;
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            peak.fetch_max(now, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(5)).await;
            in_flight.fetch_sub(1, Ordering::SeqCst);
            drop(slot);
            Ok::<_, AdmitError>(())
        }));
    }
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    assert_eq!(
        peak.load(Ordering::SeqCst),
        3,
        "the cap is 3 across both replicas"
    );
    eventually(LIMIT, "every release reached Redis", || {
        prefix.zcard(HOST, MODEL, "holders") == 0
    })
    .await;
    for replica in &replicas {
        assert_eq!(replica.local(HOST, MODEL), Occupancy::default());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_holds_across_replicas() {
    let prefix = Prefix::new(&redis_url());
    let (a, b) = (prefix.limiter(TTL), prefix.limiter(TTL));
    a.configure(HOST, MODEL, 1, 16);
    let first = a.acquire(HOST, MODEL).await.unwrap();
    let granted = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let replica = if i % 3 == 0 { a.clone() } else { b.clone() };
        let granted = granted.clone();
        tasks.push(tokio::spawn(async move {
            let slot = replica.acquire(HOST, MODEL).await.unwrap();
            granted.lock().push(i);
            tokio::time::sleep(Duration::from_millis(2)).await;
            drop(slot);
        }));
        // Arrival order is the order in which they joined the global queue.
        eventually(LIMIT, "the waiter joined the global queue", || {
            prefix.zcard(HOST, MODEL, "waiters") == i + 1
        })
        .await;
    }
    drop(first);
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(*granted.lock(), (0..10).collect::<Vec<_>>());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_waiter_leaves_the_global_queue() {
    let prefix = Prefix::new(&redis_url());
    let (a, b) = (prefix.limiter(TTL), prefix.limiter(TTL));
    a.configure(HOST, MODEL, 1, 1);
    let held = a.acquire(HOST, MODEL).await.unwrap();
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { b.acquire(HOST, MODEL).await.map(drop) }
    });
    eventually(LIMIT, "B's acquire is queued", || {
        prefix.zcard(HOST, MODEL, "waiters") == 1
    })
    .await;
    // The queue (of 1) is full for everyone.
    assert!(matches!(
        a.acquire(HOST, MODEL).await,
        Err(AdmitError::QueueFull)
    ));
    // The client goes away: its wait is dropped, and its place in the global queue with it.
    waiting.abort();
    eventually(LIMIT, "the dropped waiter left the global queue", || {
        prefix.zcard(HOST, MODEL, "waiters") == 0
    })
    .await;
    assert_eq!(b.local(HOST, MODEL).queued, 0);
    let next = tokio::spawn({
        let a = a.clone();
        async move { a.acquire(HOST, MODEL).await.map(drop) }
    });
    eventually(LIMIT, "a new waiter has the place", || {
        prefix.zcard(HOST, MODEL, "waiters") == 1
    })
    .await;
    // The slot goes to the new waiter, never to the dropped one.
    drop(held);
    next.await.unwrap().unwrap();
}

/// A replica that dies holding two slots: its leases stop being renewed and the other
/// replica's waiters get the slots within `lease_ttl` + one renewal interval.
#[test]
fn a_dead_replicas_slots_come_back_when_its_leases_expire() {
    let prefix = Prefix::new(&redis_url());
    let settings = prefix.settings(TTL, OnStoreDown::FailClosed);
    // The doomed replica runs on a runtime of its own, shut down to simulate a crash: its
    // background tasks stop, and its slots are never released.
    let doomed_runtime = runtime();
    let slots = doomed_runtime.block_on(async move {
        let doomed = RedisLimiter::start(settings).unwrap();
        doomed.configure(HOST, MODEL, 2, 4);
        let one = doomed.acquire(HOST, MODEL).await.unwrap();
        let two = doomed.acquire(HOST, MODEL).await.unwrap();
        (one, two)
    });

    let survivor_runtime = runtime();
    survivor_runtime.block_on(async {
        let survivor = prefix.limiter(TTL);
        let waiters: Vec<_> = (0..2)
            .map(|_| {
                let survivor = survivor.clone();
                tokio::spawn(async move {
                    let slot = survivor.acquire(HOST, MODEL).await.unwrap();
                    (Instant::now(), slot)
                })
            })
            .collect();
        eventually(LIMIT, "both waiters are queued", || {
            prefix.zcard(HOST, MODEL, "waiters") == 2
        })
        .await;
        // The crash: no release, no renewal from here on.
        std::mem::forget(slots);
        let died = Instant::now();
        doomed_runtime.shutdown_background();

        for waiter in waiters {
            let (granted, slot) = waiter.await.unwrap();
            let after = granted - died;
            let bound = TTL + TTL / 3;
            assert!(
                after <= bound + Duration::from_millis(500),
                "granted {after:?} after the crash; the bound is lease_ttl + one renewal \
                 ({bound:?})"
            );
            drop(slot);
        }
        assert!(survivor.status().leases_expired >= 2);
    });
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

/// Redis killed (its data lost) and started again, fail-closed: refusals while it is down,
/// held slots stay held and are registered again, and the cap holds after the switch back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_and_back_fail_closed() {
    let mut redis = PrivateRedis::start();
    let prefix = Prefix::new(&redis.url());
    let limiter = RedisLimiter::start(prefix.settings(TTL, OnStoreDown::FailClosed)).unwrap();
    limiter.configure(HOST, MODEL, 2, 0);
    let held = limiter.acquire(HOST, MODEL).await.unwrap();
    assert!(limiter.status().up);

    redis.stop();
    let refused = limiter.acquire(HOST, MODEL).await;
    assert!(
        matches!(refused, Err(AdmitError::StoreUnavailable(_))),
        "{refused:?}"
    );
    assert!(!limiter.status().up);
    // Refused at once while down, without a round trip.
    assert!(matches!(
        limiter.acquire(HOST, MODEL).await,
        Err(AdmitError::StoreUnavailable(_))
    ));

    redis.restart();
    eventually(LIMIT, "the limiter is back up", || limiter.status().up).await;
    // Redis lost everything; the held slot was put back before admission resumed.
    assert_eq!(prefix.zcard(HOST, MODEL, "holders"), 1);
    let second = limiter.acquire(HOST, MODEL).await.unwrap();
    assert!(matches!(
        limiter.acquire(HOST, MODEL).await,
        Err(AdmitError::QueueFull)
    ));
    drop((held, second));
    eventually(LIMIT, "both released", || {
        prefix.zcard(HOST, MODEL, "holders") == 0
    })
    .await;
}

/// Redis killed and started again, local-share with two replicas: each admits its share
/// (`floor(4 / 2)`) counting the slots it already held, and after the switch back Redis counts
/// every slot of both, so the cap of 4 is never exceeded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_down_and_back_local_share() {
    let mut redis = PrivateRedis::start();
    let prefix = Prefix::new(&redis.url());
    let start = || {
        let mut settings = prefix.settings(TTL, OnStoreDown::LocalShare);
        settings.replicas = 2;
        RedisLimiter::start(settings).unwrap()
    };
    let (a, b) = (start(), start());
    a.configure(HOST, MODEL, 4, 0);
    b.configure(HOST, MODEL, 4, 0);
    let mut held_a = vec![
        a.acquire(HOST, MODEL).await.unwrap(),
        a.acquire(HOST, MODEL).await.unwrap(),
    ];

    redis.stop();
    // The first call finds it down; under local-share it is then admitted locally, or not.
    let a_more = a.acquire(HOST, MODEL).await;
    assert!(
        matches!(a_more, Err(AdmitError::QueueFull)),
        "A already holds its share of 2: {a_more:?}"
    );
    let mut held_b = vec![
        b.acquire(HOST, MODEL).await.unwrap(),
        b.acquire(HOST, MODEL).await.unwrap(),
    ];
    assert!(matches!(
        b.acquire(HOST, MODEL).await,
        Err(AdmitError::QueueFull)
    ));
    assert!(!a.status().up && !b.status().up);

    redis.restart();
    eventually(LIMIT, "both replicas are back up", || {
        a.status().up && b.status().up
    })
    .await;
    assert_eq!(
        prefix.zcard(HOST, MODEL, "holders"),
        4,
        "every slot of both replicas is registered again"
    );
    // No overshoot when switching back: the cap is full.
    assert!(matches!(
        a.acquire(HOST, MODEL).await,
        Err(AdmitError::QueueFull)
    ));
    assert!(matches!(
        b.acquire(HOST, MODEL).await,
        Err(AdmitError::QueueFull)
    ));
    held_b.pop();
    eventually(LIMIT, "the release reached Redis", || {
        prefix.zcard(HOST, MODEL, "holders") == 3
    })
    .await;
    held_a.push(a.acquire(HOST, MODEL).await.unwrap());
    drop((held_a, held_b));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_are_shared_and_the_last_writer_wins() {
    let prefix = Prefix::new(&redis_url());
    let (a, b) = (prefix.limiter(TTL), prefix.limiter(TTL));
    a.configure(HOST, MODEL, 1, 0);
    let held = a.acquire(HOST, MODEL).await.unwrap();
    // B knows nothing of the key (unconfigured: 1, 0) and still reads A's limits from Redis.
    assert!(matches!(
        b.acquire(HOST, MODEL).await,
        Err(AdmitError::QueueFull)
    ));
    // B raises parallel to 2: A's next acquire sees it.
    b.configure(HOST, MODEL, 2, 0);
    eventually(LIMIT, "B's limits reached Redis", || {
        a.global(HOST, MODEL).is_some()
    })
    .await;
    let mut second = None;
    for _ in 0..100 {
        if let Ok(slot) = a.acquire(HOST, MODEL).await {
            second = Some(slot);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(second.is_some(), "parallel = 2 written by B applies to A");
    assert_eq!(a.global(HOST, MODEL), Some(Occupancy::new(2, 0)));
    drop((held, second));
}

/// Round trips (issue #33): an acquire granted at once is one call to Redis, a release is one,
/// and a queued acquire is one to join and none to be granted (the grant comes in the reply of
/// the release that made it, or as a message). Counted by the limiter's own round-trip counter,
/// with leases long enough that no renewal runs meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_operation_is_one_round_trip() {
    let prefix = Prefix::new(&redis_url());
    let long = Duration::from_secs(60);
    let (a, b) = (prefix.limiter(long), prefix.limiter(long));
    a.configure(HOST, MODEL, 1, 4);
    b.configure(HOST, MODEL, 1, 4);
    // Each configure is written in the background (and the renewer's first round may run).
    eventually(LIMIT, "the limits are written", || {
        prefix.limits(HOST, MODEL) == Some((1, 4))
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (a0, b0) = (a.status().round_trips, b.status().round_trips);

    let held = a.acquire(HOST, MODEL).await.unwrap();
    assert_eq!(
        a.status().round_trips,
        a0 + 1,
        "granted at once: one round trip"
    );
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            b.acquire(HOST, MODEL)
                .await
                .map(|slot| (slot, b.status().round_trips))
        }
    });
    // The counter moves when B's client has read the reply, which may be a moment after Redis
    // shows the waiter: wait for both, then check that the join took exactly one.
    eventually(LIMIT, "B's acquire is queued and its reply read", || {
        prefix.zcard(HOST, MODEL, "waiters") == 1 && b.status().round_trips > b0
    })
    .await;
    assert_eq!(
        b.status().round_trips,
        b0 + 1,
        "queued: one round trip to join"
    );
    drop(held);
    let (slot, b_trips) = waiter.await.unwrap().unwrap();
    assert_eq!(
        b_trips,
        b0 + 1,
        "granted by the message: no round trip of its own"
    );
    eventually(LIMIT, "A's release reached Redis", || {
        a.status().round_trips == a0 + 2
    })
    .await;
    drop(slot);
    eventually(
        LIMIT,
        "B's release reached Redis and its reply was read",
        || prefix.zcard(HOST, MODEL, "holders") == 0 && b.status().round_trips > b0 + 1,
    )
    .await;
    assert_eq!(b.status().round_trips, b0 + 2, "a release: one round trip");
    assert_eq!(a.status().round_trips, a0 + 2);
}

/// The replicas seen (issue #33): every replica says it is alive at each renewal round, so
/// each sees the other; one that stops is no longer seen within `lease_ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_replica_sees_the_others_and_forgets_a_gone_one() {
    let prefix = Prefix::new(&redis_url());
    let a = prefix.limiter(TTL);
    let b = prefix.limiter(TTL);
    let (id_a, id_b) = (a.status().replica, b.status().replica);
    assert_ne!(id_a, id_b);
    let mut both = vec![id_a.clone(), id_b.clone()];
    both.sort();
    eventually(LIMIT, "each sees both", || {
        [&a, &b].iter().all(|l| {
            let mut seen = l.status().replicas_seen;
            seen.sort();
            seen == both
        })
    })
    .await;
    drop(b);
    eventually(LIMIT, "A no longer sees B", || {
        a.status().replicas_seen == [id_a.clone()]
    })
    .await;
}

/// A waiter that another replica's call refuses in Redis (a shrink written there made it too
/// heavy) is told by that call's message, as a waiter granted there is: its acquire ends with
/// the refusal at once, not at its own replica's next renewal (which would queue it again and
/// be refused in its own reply). The leases are long, so no renewal runs within the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_refused_by_another_replicas_write_is_told_at_once() {
    let prefix = Prefix::new(&redis_url());
    let long = Duration::from_secs(120);
    let (a, b) = (prefix.limiter(long), Arc::new(prefix.limiter(long)));
    a.configure(HOST, MODEL, 2, 4);
    b.configure(HOST, MODEL, 2, 4);
    eventually(LIMIT, "the limits reached Redis", || {
        prefix.limits(HOST, MODEL) == Some((2, 4))
    })
    .await;
    let held = a.acquire(HOST, MODEL).await.expect("1 of 2 units");
    // B's weight-2 waiter queues behind it.
    let waiter = tokio::spawn({
        let b = Arc::clone(&b);
        async move { b.acquire_with(HOST, MODEL, &Ticket::new().weight(2)).await }
    });
    eventually(LIMIT, "B's waiter is queued in Redis", || {
        prefix.counts(HOST, MODEL).is_some_and(|c| c[1] == 1)
    })
    .await;
    // A alone shrinks `parallel` to 1 (its gateway reloaded first): its write refuses B's
    // waiter as too heavy.
    a.configure(HOST, MODEL, 1, 4);
    let outcome = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("B's waiter was told within 20 s (its next renewal is 40 s away)")
        .expect("the waiter's task");
    assert!(
        matches!(
            outcome,
            Err(AdmitError::TooHeavy {
                weight: 2,
                parallel: 1
            })
        ),
        "{outcome:?}"
    );
    drop(held);
}

/// A replica talks to Redis over one connection (and one subscription), however many of its
/// first calls start at the same time: they wait for the one connection being made rather than
/// each making its own. Redis is reached through a proxy that holds every new connection for
/// 50 ms before it forwards a byte, as a network would: on loopback a connection is made before
/// any other call can look.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_calls_at_once_share_one_connection() {
    let prefix = Prefix::new(&redis_url());
    let (proxy, connections) = slow_proxy(&redis_url(), Duration::from_millis(50)).await;
    let mut settings = prefix.settings(Duration::from_secs(120), OnStoreDown::FailClosed);
    settings.redis_url = proxy;
    // Room for the proxy's hold on a loaded machine: a call that timed out would be refused.
    settings.store_timeout = Duration::from_secs(2);
    let limiter = Arc::new(RedisLimiter::start(settings).unwrap());
    let calls: Vec<_> = (0..8)
        .map(|i| {
            let limiter = Arc::clone(&limiter);
            tokio::spawn(async move {
                let model = format!("model-{i}");
                limiter.configure(HOST, &model, 1, 0);
                limiter.acquire(HOST, &model).await.map(drop)
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap().expect("granted");
    }
    // The calls' connection, and the subscription's.
    let made = connections.load(Ordering::SeqCst);
    assert!(made <= 2, "{made} connections to Redis");
}

/// A TCP proxy on a free loopback port to the Redis at `url`: each connection it accepts waits
/// `delay` before it is connected through. Returns its URL and the count of connections.
async fn slow_proxy(url: &str, delay: Duration) -> (String, Arc<AtomicUsize>) {
    let upstream = url
        .trim_start_matches("redis://")
        .split('/')
        .next()
        .unwrap()
        .to_owned();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let count = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&count);
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let upstream = upstream.clone();
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                if let Ok(mut redis) = tokio::net::TcpStream::connect(&upstream).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut redis).await;
                }
            });
        }
    });
    (format!("redis://{addr}/0"), count)
}
