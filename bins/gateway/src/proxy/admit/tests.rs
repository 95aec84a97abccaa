//! The admission step on tokio's paused clock: queue timeouts, a full queue answered at once (so
//! the caller falls through to the next host), a client leaving while queued, and the
//! cancel-grace guard.

use std::time::Duration;

use tokio::time::Instant;
use tokio_test::task;

use slotgate_limiter::Ticket;

use super::{Admitted, Fallback, Refused, admit, take};
use crate::fixtures::Built;
use crate::proxy::client::Deadlines;
use crate::proxy::problems::Error;
use crate::support::shutdown::shutdown_pair;

/// One slot and one place in the queue on `a`; the same on `b`, which is there to fall through
/// to. `a` keeps its slot 2 s after a client leaves mid-send.
const TWO_HOSTS: &str = r#"
[server]
listen = "127.0.0.1:0"

[upstreams.a]
url = "http://127.0.0.1:9"
kind = "llama-server"
cancel_grace = "2s"

[upstreams.a.models.m]
parallel = 1
queue = 1
queue_timeout = "5s"

[upstreams.b]
url = "http://127.0.0.1:10"
kind = "vllm"

[upstreams.b.models.m]
parallel = 1
queue = 0
queue_timeout = "5s"
"#;

#[tokio::test(start_paused = true)]
async fn a_queued_request_is_refused_after_queue_timeout_and_leaves_the_queue() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let (_trigger, mut stop) = shutdown_pair();
    let _held = take(&a, 1, &mut stop).await.expect("the free slot");

    let start = Instant::now();
    let refused = take(&a, 1, &mut stop)
        .await
        .expect_err("no slot comes free");
    let Refused::Timeout { waited, wait } = refused else {
        panic!("{refused:?}");
    };
    assert_eq!(
        (waited, wait.bound),
        (Duration::from_secs(5), Duration::from_secs(5))
    );
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(5),
        "exactly queue_timeout"
    );
    assert_eq!(a.key.queued(), 0, "the place in the queue is given up");
    assert_eq!(a.key.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_is_refused_at_once_so_the_next_host_is_tried() {
    let built = Built::new(TWO_HOSTS);
    let (a, b) = (built.target("m", "a"), built.target("m", "b"));
    let (_trigger, mut stop) = shutdown_pair();
    let _held = take(&a, 1, &mut stop).await.expect("a's slot");
    let mut stop_waiting = stop.clone();
    let mut waiting = task::spawn(take(&a, 1, &mut stop_waiting));
    assert!(waiting.poll().is_pending(), "a's one queue place is taken");

    let start = Instant::now();
    assert_eq!(
        take(&a, 1, &mut stop).await.expect_err("a is full"),
        Refused::Full
    );
    let slot = take(&b, 1, &mut stop).await.expect("b has a free slot");
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "no waiting on the full host"
    );
    assert_eq!((a.key.in_flight(), a.key.queued()), (1, 1));
    assert_eq!(b.key.in_flight(), 1);
    drop(slot);
    assert_eq!(b.key.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_leaving_while_queued_gives_its_place_up_and_is_counted() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let (_trigger, mut stop) = shutdown_pair();
    let held = take(&a, 1, &mut stop).await.expect("the free slot");
    let mut stop_waiting = stop.clone();
    let mut waiting = task::spawn(take(&a, 1, &mut stop_waiting));
    assert!(waiting.poll().is_pending());
    assert_eq!(a.key.queued(), 1);

    // hyper drops the request's future when the client goes away.
    drop(waiting);
    assert_eq!(a.key.queued(), 0);
    assert_eq!(a.metrics.gone_queued.get(), 1);
    // The slot goes to the next arrival, not to the request that left.
    drop(held);
    let _next = take(&a, 1, &mut stop)
        .await
        .expect("the slot is free again");
    assert_eq!(a.key.in_flight(), 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_a_wait_in_the_queue() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let (trigger, mut stop) = shutdown_pair();
    let _held = take(&a, 1, &mut stop).await.expect("the free slot");
    let mut stop_waiting = stop.clone();
    let mut waiting = task::spawn(take(&a, 1, &mut stop_waiting));
    assert!(waiting.poll().is_pending());
    trigger.fire();
    assert!(waiting.is_woken());
    match waiting.poll() {
        std::task::Poll::Ready(Err(refused)) => assert_eq!(refused, Refused::ShuttingDown),
        other => panic!("expected a refusal, got {other:?}"),
    }
    assert_eq!(a.key.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_client_leaving_before_the_answer_keeps_the_slot_for_cancel_grace() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    assert_eq!(a.cancel_grace, Duration::from_secs(2));
    let (_trigger, mut stop) = shutdown_pair();
    let slot = take(&a, 1, &mut stop).await.expect("the free slot");
    let sending = slot.sending(a.cancel_grace);

    // A request queued behind it, which must not get the slot while the engine winds down.
    let queued = {
        let a = std::sync::Arc::clone(&a);
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let slot = take(&a, 1, &mut stop).await;
            (slot.map(drop), Instant::now())
        })
    };
    tokio::task::yield_now().await;
    assert_eq!(a.key.queued(), 1);

    let left = Instant::now();
    // The client goes away mid-send: hyper drops the future holding the guard.
    drop(sending);
    assert_eq!(a.metrics.gone_awaiting.get(), 1);
    tokio::time::sleep(Duration::from_millis(1_999)).await;
    assert_eq!(a.key.in_flight(), 1, "still held within the grace");
    assert_eq!(a.key.queued(), 1);

    let (granted, at) = queued.await.expect("the queued task ends");
    granted.expect("the queued request gets the slot");
    assert_eq!(
        at - left,
        Duration::from_secs(2),
        "exactly after cancel_grace"
    );
}

#[tokio::test(start_paused = true)]
async fn an_answered_send_gives_the_slot_back_with_the_body_not_after_a_grace() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let (_trigger, mut stop) = shutdown_pair();
    let slot = take(&a, 1, &mut stop).await.expect("the free slot");
    let slot = slot.sending(a.cancel_grace).answered();
    assert_eq!(a.key.in_flight(), 1);
    slot.abandon();
    assert_eq!(a.key.in_flight(), 0, "at once");
    assert_eq!(a.metrics.gone_awaiting.get(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_request_heavier_than_parallel_is_refused_at_once_and_takes_nothing() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let (_trigger, mut stop) = shutdown_pair();
    let refused = take(&a, 2, &mut stop).await.expect_err("two slots of one");
    assert_eq!(
        refused,
        Refused::TooHeavy {
            weight: 2,
            parallel: 1
        }
    );
    assert_eq!((a.key.in_flight(), a.key.queued()), (0, 0));
    // A weight that fits is still served.
    let slot = take(&a, 1, &mut stop).await.expect("the free slot");
    assert_eq!(a.key.in_flight(), 1);
    drop(slot);
}

fn no_deadlines() -> Deadlines {
    Deadlines::read(&http::HeaderMap::new(), Instant::now()).expect("no deadline headers")
}

#[tokio::test(start_paused = true)]
async fn the_admit_step_takes_no_slot_where_the_endpoint_takes_none() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let (_trigger, mut stop) = shutdown_pair();
    let _held = take(&a, 1, &mut stop).await.expect("a's slot");
    let ticket = Ticket::new();
    let admitted = admit(&a, false, &ticket, &no_deadlines(), &stop, None).await;
    assert!(matches!(admitted, Ok(Admitted::Go(None))), "{admitted:?}");
    assert_eq!((a.key.in_flight(), a.key.queued()), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn the_admit_step_hands_a_queued_request_to_its_keepalive_body_or_waits() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let (_trigger, mut stop) = shutdown_pair();
    let (ticket, deadlines) = (Ticket::new(), no_deadlines());
    let free = admit(
        &a,
        true,
        &ticket,
        &deadlines,
        &stop,
        Some(Duration::from_secs(1)),
    )
    .await;
    assert!(
        matches!(free, Ok(Admitted::Go(Some(_)))),
        "a free slot is taken at once, keepalive or not"
    );
    let every = Duration::from_secs(2);
    let queued = admit(&a, true, &ticket, &deadlines, &stop, Some(every)).await;
    let Ok(Admitted::KeepAlive(queued, interval)) = queued else {
        panic!("{queued:?}");
    };
    assert_eq!(interval, every);
    assert_eq!(a.key.queued(), 1, "it waits in the queue, in its body");
    drop(queued);
    assert_eq!(a.key.queued(), 0);

    let start = Instant::now();
    let waited = admit(&a, true, &ticket, &deadlines, &stop, None).await;
    assert!(matches!(waited, Err(Refused::Timeout { .. })), "{waited:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(5));
    drop(free);
    let _ = &mut stop;
}

#[tokio::test(start_paused = true)]
async fn every_refusal_becomes_its_error() {
    let built = Built::new(TWO_HOSTS);
    let a = built.target("m", "a");
    let ticket = Ticket::new();
    let fallback = Fallback {
        shutting_down: Duration::from_secs(30),
        unavailable: Duration::from_secs(7),
    };
    let error = |refused: Refused| refused.into_error(&a, &ticket, "m", fallback);
    assert!(matches!(
        error(Refused::ShuttingDown),
        Error::ShuttingDown { retry_after } if retry_after == Duration::from_secs(30)
    ));
    assert!(matches!(
        error(Refused::Closed),
        Error::UpstreamUnavailable { retry_after, source: Some(why), .. }
            if retry_after == Duration::from_secs(7) && why.to_string().contains("reload")
    ));
    assert!(matches!(
        error(Refused::Full),
        Error::QueueFull { upstream, model, .. } if upstream == "a" && model == "m"
    ));
    assert!(matches!(
        error(Refused::TooHeavy {
            weight: 3,
            parallel: 1
        }),
        Error::TooHeavy {
            weight: 3,
            parallel: 1,
            ..
        }
    ));
    assert!(matches!(
        error(Refused::StoreUnavailable {
            retry_after: Duration::from_secs(2)
        }),
        Error::StoreUnavailable { .. }
    ));
    let deadlines = no_deadlines();
    let wait = deadlines.wait(Instant::now(), Duration::from_secs(5), true);
    assert!(matches!(
        error(Refused::Timeout {
            waited: Duration::from_secs(5),
            wait
        }),
        Error::QueueTimeout { deadline: None, .. }
    ));
}
