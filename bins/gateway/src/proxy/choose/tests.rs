//! The choose step: which targets serve an endpoint, and the steering layers' place in it.

use std::sync::Arc;

use super::{Chooser, Routed, Steer, eligible};
use crate::fixtures::{self, Built, cache, chat_for_m, names, routed, target, vllm_m};
use crate::proxy::endpoint::Endpoint;
use crate::proxy::problems::Error;
use crate::upstreams::target::Target;

/// `m` on three upstreams, ranked `b`, `a`, `c` by weight; `o` on an Ollama upstream that does
/// not allow model management.
fn table() -> String {
    let ollama = r#"[upstreams.ol]
url = "http://127.0.0.1:12"
kind = "ollama"

[upstreams.ol.models.o]
parallel = 1
queue = 1
queue_timeout = "5s"
"#;
    fixtures::table(
        "",
        &[
            vllm_m("a", 9, 2.0),
            vllm_m("b", 10, 3.0),
            vllm_m("c", 11, 1.0),
            ollama.to_owned(),
        ],
    )
}

/// What a prefix-cache affinity does: moves the upstream it prefers first.
#[derive(Debug)]
struct Prefer(&'static str);

impl Steer for Prefer {
    fn steer(&self, _: &Routed, ranked: &mut Vec<&Arc<Target>>) -> Result<(), Error> {
        if let Some(at) = ranked.iter().position(|t| t.upstream.name == self.0) {
            let preferred = ranked.remove(at);
            ranked.insert(0, preferred);
        }
        Ok(())
    }
}

/// Refuses every request.
#[derive(Debug)]
struct Refuse;

impl Steer for Refuse {
    fn steer(&self, _: &Routed, _: &mut Vec<&Arc<Target>>) -> Result<(), Error> {
        Err(Error::Unauthorized)
    }
}

#[tokio::test(start_paused = true)]
async fn without_steers_the_order_is_the_ranking() {
    let mut routed = chat_for_m(Arc::new(Built::new(&table()).generation)).await;
    let route = Arc::clone(&routed.route);
    let chosen = Chooser::new(Vec::new(), cache(&routed.generation))
        .choose(&mut routed, &route)
        .expect("m");
    assert_eq!(names(&chosen), ["b", "a", "c"]);
}

#[tokio::test(start_paused = true)]
async fn a_steer_moves_its_host_first_and_the_rest_keep_their_order() {
    let mut routed = chat_for_m(Arc::new(Built::new(&table()).generation)).await;
    let route = Arc::clone(&routed.route);
    let chooser = Chooser::new(vec![Box::new(Prefer("c"))], cache(&routed.generation));
    assert_eq!(
        names(&chooser.choose(&mut routed, &route).expect("m")),
        ["c", "b", "a"]
    );
    // Steers run in order: the last word is the later one's.
    let chooser = Chooser::new(
        vec![Box::new(Prefer("c")), Box::new(Prefer("a"))],
        cache(&routed.generation),
    );
    assert_eq!(
        names(&chooser.choose(&mut routed, &route).expect("m")),
        ["a", "c", "b"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_steer_only_sees_eligible_targets_and_may_refuse() {
    let built = Built::new(&table());
    built.target("m", "c").upstream.set_draining(true);
    let mut routed = chat_for_m(Arc::new(built.generation)).await;
    let route = Arc::clone(&routed.route);
    // A draining upstream is not ranked, so no steer can bring it back.
    let chooser = Chooser::new(vec![Box::new(Prefer("c"))], cache(&routed.generation));
    assert_eq!(
        names(&chooser.choose(&mut routed, &route).expect("m")),
        ["b", "a"]
    );
    let chooser = Chooser::new(
        vec![Box::new(Refuse), Box::new(Prefer("a"))],
        cache(&routed.generation),
    );
    assert!(matches!(
        chooser.choose(&mut routed, &route),
        Err(Error::Unauthorized)
    ));
}

/// Cache-aware placement comes last: a prompt sent to `c` before goes to `c` first again while
/// `c` has a free slot, and the placement stays with the request for the answer step.
#[tokio::test(start_paused = true)]
async fn the_host_that_holds_the_prompt_goes_first() {
    let generation = Arc::new(Built::new(&table()).generation);
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{}"}}]}}"#,
        "a long question ".repeat(256)
    );
    let cache = cache(&generation);
    let chooser = Chooser::new(Vec::new(), Arc::clone(&cache));
    let mut first = routed(Arc::clone(&generation), "/v1/chat/completions", &body).await;
    let route = Arc::clone(&first.route);
    let chosen = chooser.choose(&mut first, &route).expect("m");
    assert_eq!(names(&chosen), ["b", "a", "c"]);
    let placement = first
        .api
        .placement
        .as_ref()
        .expect("a chat prompt is placed");
    drop(cache.sent(&target(&generation, "m", "c"), placement));
    let mut again = routed(generation, "/v1/chat/completions", &body).await;
    let chosen = chooser.choose(&mut again, &route).expect("m");
    assert_eq!(names(&chosen), ["c", "b", "a"]);
}

#[test]
fn an_endpoint_no_upstream_serves_or_allows_is_refused_by_name() {
    let built = Built::new(&table());
    let route = built.generation.routes.resolve("o").expect("o");
    let rerank = Endpoint::find("/v1/rerank").expect("an endpoint");
    assert!(matches!(
        eligible(route, rerank),
        Err(Error::RouteNotServed { model, route: "/v1/rerank" }) if model == "o"
    ));
    let pull = Endpoint::find("/api/pull").expect("an endpoint");
    assert!(matches!(
        eligible(route, pull),
        Err(Error::RouteDisabled { model, route: "/api/pull" }) if model == "o"
    ));
    let chat = Endpoint::find("/api/chat").expect("an endpoint");
    assert_eq!(names(&eligible(route, chat).expect("served")), ["ol"]);
    // Served, but down: an empty list, not a refusal (the request ends unavailable).
    built.target("o", "ol").upstream.set_draining(true);
    assert!(eligible(route, chat).expect("served").is_empty());
}
