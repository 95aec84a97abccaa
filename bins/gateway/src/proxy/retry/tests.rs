//! The candidate loop's state: the order of the tries, when an engine's error answer goes on to
//! the next target, and which refusal the request ends with when no target took it.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;

use super::Tries;
use crate::fixtures::{self, Built, chat_for_m, vllm_m};
use crate::proxy::problems::Error;

/// `m` on three upstreams, ranked `a`, `b`, `c`; one retry of an engine's error answer.
fn table() -> String {
    fixtures::table(
        "engine_error_retries = 1",
        &[
            vllm_m("a", 9, 3.0),
            vllm_m("b", 10, 2.0),
            vllm_m("c", 11, 1.0),
        ],
    )
}

#[test]
fn targets_come_best_first_and_an_error_answer_goes_on_while_retries_and_targets_last() {
    let built = Built::new(&table());
    let route = built.generation.routes.resolve("m").expect("m");
    let mut tries = Tries::new(route.ranked(), 1);
    let first = tries.next_target().expect("a");
    assert_eq!(first.upstream.name, "a");
    assert!(
        !tries.retry(StatusCode::INTERNAL_SERVER_ERROR),
        "a 500 is the answer"
    );
    assert!(!tries.retry(StatusCode::TOO_MANY_REQUESTS), "so is a 4xx");
    assert!(tries.retry(StatusCode::SERVICE_UNAVAILABLE));
    assert_eq!(tries.next_target().expect("b").upstream.name, "b");
    assert!(!tries.retry(StatusCode::BAD_GATEWAY), "one retry only");

    let mut tries = Tries::new(route.ranked(), 5);
    for name in ["a", "b", "c"] {
        assert_eq!(tries.next_target().expect(name).upstream.name, name);
    }
    assert!(
        !tries.retry(StatusCode::GATEWAY_TIMEOUT),
        "no target left to go on to"
    );
    assert!(tries.next_target().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_wins_naming_the_best_ranked_host_and_the_soonest_retry() {
    let routed = chat_for_m(Arc::new(Built::new(&table()).generation)).await;
    let route = Arc::clone(&routed.route);
    let mut tries = Tries::new(route.ranked(), 0);
    let a = tries.next_target().expect("a");
    tries.full(a, Duration::from_secs(9));
    let b = tries.next_target().expect("b");
    tries.too_heavy(b, 4, 2);
    tries.unreachable("connection refused".into());
    let c = tries.next_target().expect("c");
    tries.full(c, Duration::from_secs(3));
    match tries.exhausted(&routed) {
        Err(Error::QueueFull {
            upstream,
            retry_after,
            also_full,
            ..
        }) => {
            assert_eq!(upstream, "a");
            assert_eq!(retry_after, Duration::from_secs(3));
            assert_eq!(also_full, 1, "c was full too");
        }
        other => panic!("expected queue-full, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn too_heavy_only_when_nothing_else_failed() {
    let routed = chat_for_m(Arc::new(Built::new(&table()).generation)).await;
    let route = Arc::clone(&routed.route);

    let mut tries = Tries::new(route.ranked(), 0);
    let a = tries.next_target().expect("a");
    tries.too_heavy(a, 4, 2);
    let b = tries.next_target().expect("b");
    tries.too_heavy(b, 4, 3);
    assert!(matches!(
        tries.exhausted(&routed),
        Err(Error::TooHeavy { upstream, weight: 4, parallel: 2, .. }) if upstream == "a"
    ));

    // A refused connection too: another try may reach a host with room.
    let mut tries = Tries::new(route.ranked(), 0);
    let a = tries.next_target().expect("a");
    tries.too_heavy(a, 4, 2);
    tries.unreachable("connection refused".into());
    assert!(matches!(
        tries.exhausted(&routed),
        Err(Error::UpstreamUnavailable {
            source: Some(_),
            ..
        })
    ));
}

#[tokio::test(start_paused = true)]
async fn no_candidate_at_all_is_unavailable() {
    let routed = chat_for_m(Arc::new(Built::new(&table()).generation)).await;
    let tries = Tries::new(Vec::new(), 1);
    assert!(matches!(
        tries.exhausted(&routed),
        Err(Error::UpstreamUnavailable { model, .. }) if model == "m"
    ));
}
