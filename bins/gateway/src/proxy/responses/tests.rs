//! The Responses API's rules: the endpoints under a response's id, and follow-ups pinned to the
//! upstream that holds their conversation.

use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::{FollowUp, find};
use crate::fixtures::{self, Built, cache, routed, vllm_m};
use crate::proxy::affinity::{LocalAffinity, ResponseAffinity};
use crate::proxy::choose::Chooser;
use crate::proxy::problems::Error;

/// `m` on two upstreams, `b` ranked first.
fn table() -> String {
    fixtures::table("", &[vllm_m("a", 9, 1.0), vllm_m("b", 10, 2.0)])
}

#[test]
fn the_endpoints_under_an_id_and_their_methods() {
    let (id, methods) = find("resp_1").expect("the response");
    assert_eq!(id, "resp_1");
    assert!(methods.contains(&Method::DELETE) && methods.contains(&Method::GET));
    assert_eq!(
        find("resp_1/cancel").expect("cancel"),
        ("resp_1", &[Method::POST][..])
    );
    assert_eq!(find("resp_1/input_items").expect("items").0, "resp_1");
    assert!(find("resp_1/other").is_none());
}

/// The upstreams a Responses request with `body` may go to, or the error that ends it.
async fn chosen(
    built: Built,
    affinity: Arc<LocalAffinity>,
    body: &str,
) -> Result<Vec<String>, Error> {
    let mut routed = routed(Arc::new(built.generation), "/v1/responses", body).await;
    let route = Arc::clone(&routed.route);
    let cache = cache(&routed.generation);
    let chooser = Chooser::new(vec![Box::new(FollowUp::new(affinity))], cache);
    let ranked = chooser.choose(&mut routed, &route)?;
    Ok(ranked.iter().map(|t| t.upstream.name.clone()).collect())
}

fn affinity() -> Arc<LocalAffinity> {
    Arc::new(LocalAffinity::new(16, Duration::from_secs(60)))
}

#[tokio::test(start_paused = true)]
async fn a_follow_up_goes_only_to_the_upstream_that_holds_its_conversation() {
    let record = affinity();
    record.record("resp_1", "a");
    let follow_up = r#"{"model":"m","previous_response_id":"resp_1"}"#;
    assert_eq!(
        chosen(Built::new(&table()), Arc::clone(&record), follow_up)
            .await
            .expect("a"),
        ["a"]
    );
    // A first request is ranked as usual.
    let first = r#"{"model":"m"}"#;
    assert_eq!(
        chosen(Built::new(&table()), record, first)
            .await
            .expect("both"),
        ["b", "a"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_follow_up_whose_holder_is_unknown_or_down_is_refused() {
    let follow_up = r#"{"model":"m","previous_response_id":"resp_1"}"#;
    let unknown = chosen(Built::new(&table()), affinity(), follow_up).await;
    assert!(matches!(unknown, Err(Error::ResponseNotFound { id, .. }) if id == "resp_1"));

    let record = affinity();
    record.record("resp_1", "a");
    let built = Built::new(&table());
    built.target("m", "a").upstream.set_draining(true);
    let down = chosen(built, record, follow_up).await;
    assert!(matches!(
        down,
        Err(Error::ResponseUpstreamUnavailable { upstream, .. }) if upstream == "a"
    ));
}
