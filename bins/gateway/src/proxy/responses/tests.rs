//! The Responses API's rules: the endpoints under a response's id, and follow-ups pinned to the
//! upstream that holds their conversation.

use std::sync::Arc;
use std::time::Duration;

use http::Method;

use super::{FollowUp, find};
use crate::fixtures::{Built, cache, routed};
use crate::proxy::affinity::{LocalAffinity, ResponseAffinity};
use crate::proxy::choose::Chooser;
use crate::proxy::problems::Error;

/// `m` on two upstreams, `b` ranked first.
const TABLE: &str = r#"
[server]
listen = "127.0.0.1:0"

[upstreams.a]
url = "http://127.0.0.1:9"
kind = "vllm"

[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "5s"

[upstreams.b]
url = "http://127.0.0.1:10"
kind = "vllm"
weight = 2.0

[upstreams.b.models.m]
parallel = 2
queue = 4
queue_timeout = "5s"
"#;

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
        chosen(Built::new(TABLE), Arc::clone(&record), follow_up)
            .await
            .expect("a"),
        ["a"]
    );
    // A first request is ranked as usual.
    let first = r#"{"model":"m"}"#;
    assert_eq!(
        chosen(Built::new(TABLE), record, first)
            .await
            .expect("both"),
        ["b", "a"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_follow_up_whose_holder_is_unknown_or_down_is_refused() {
    let follow_up = r#"{"model":"m","previous_response_id":"resp_1"}"#;
    let unknown = chosen(Built::new(TABLE), affinity(), follow_up).await;
    assert!(matches!(unknown, Err(Error::ResponseNotFound { id, .. }) if id == "resp_1"));

    let record = affinity();
    record.record("resp_1", "a");
    let built = Built::new(TABLE);
    built.target("m", "a").upstream.set_draining(true);
    let down = chosen(built, record, follow_up).await;
    assert!(matches!(
        down,
        Err(Error::ResponseUpstreamUnavailable { upstream, .. }) if upstream == "a"
    ));
}
