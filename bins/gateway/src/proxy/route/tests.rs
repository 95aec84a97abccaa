//! The routing step: aliases, ranking, and requests in flight while a reload builds the next
//! table.

use std::sync::Arc;

use crate::fixtures::{self, Built, names, vllm_m};
use crate::proxy::admit::take;
use crate::support::shutdown::shutdown_pair;

/// `m` on two upstreams (`b` preferred by weight), `auto` on a third, and an alias.
fn table() -> String {
    let auto = r#"[upstreams.c]
url = "http://127.0.0.1:11"
kind = "llama-server"

[upstreams.c.models.m]
parallel = "auto"
queue = 4
queue_timeout = "5s"
"#;
    fixtures::table(
        "",
        &[
            "[aliases]\nchat = \"m\"\n".to_owned(),
            vllm_m("a", 9, 1.0),
            vllm_m("b", 10, 2.0),
            auto.to_owned(),
        ],
    )
}

#[test]
fn an_alias_is_the_same_route_with_the_same_keys() {
    let built = Built::new(&table());
    let routes = &built.generation.routes;
    let by_model = routes.resolve("m").expect("m");
    let by_alias = routes.resolve("chat").expect("chat");
    assert!(
        Arc::ptr_eq(by_model, by_alias),
        "one route, one cap and one queue"
    );
    assert_eq!(
        by_alias.model, "m",
        "the upstream is asked for the configured name"
    );
    assert_eq!(routes.names(), ["chat", "m"]);
    assert_eq!(routes.routes().count(), 1, "an alias is not a second route");
    assert!(routes.resolve("other").is_none());
}

#[tokio::test(start_paused = true)]
async fn ranking_follows_free_slots_times_weight_and_leaves_out_what_cannot_serve() {
    let built = Built::new(&table());
    let route = Arc::clone(built.generation.routes.resolve("m").expect("m"));
    // c's slot count is not known yet: left out; b has the larger weight.
    assert_eq!(names(&route.ranked()), ["b", "a"]);
    assert!(
        route
            .unavailable_reason()
            .is_some_and(|r| r.contains("`c`"))
    );

    // b busy on both slots: a has free slots and goes first.
    let b = built.target("m", "b");
    let (_trigger, mut stop) = shutdown_pair();
    let _one = take(&b, 1, &mut stop).await.expect("b slot 1");
    let _two = take(&b, 1, &mut stop).await.expect("b slot 2");
    assert_eq!(names(&route.ranked()), ["a", "b"]);

    // Draining a: only b (busy, but it may queue) remains.
    built.target("m", "a").upstream.set_draining(true);
    assert_eq!(names(&route.ranked()), ["b"]);

    // c's count read from the engine: it ranks, first with its 3 free slots.
    let c = built.target("m", "c");
    c.auto().expect("auto").record(Ok(3), &c.upstream);
    assert_eq!(names(&route.ranked()), ["c", "b"]);
    assert!(route.unavailable_reason().is_none());
}

#[tokio::test(start_paused = true)]
async fn a_request_in_flight_keeps_its_slot_across_a_reload_and_counts_in_the_new_table() {
    let built = Built::new(&table());
    let old = built.target("m", "a");
    let (_trigger, mut stop) = shutdown_pair();
    let slot = take(&old, 1, &mut stop).await.expect("a slot");

    // The reload grows a's `parallel` to 3.
    let next = built.next(&table().replacen("parallel = 2", "parallel = 3", 1));
    let new = crate::fixtures::target(&next, "m", "a");
    assert!(!Arc::ptr_eq(&old, &new), "a new table");
    let reading = new.reading();
    assert_eq!(
        reading.in_flight, 1,
        "the old table's request counts against the new cap"
    );
    assert_eq!(new.slots(&reading), Some(3));
    assert_eq!(
        old.slots(&old.reading()),
        Some(3),
        "one key: the old table sees it too"
    );
    assert!(!old.key.is_closed(), "the request keeps its slot");

    drop(slot);
    assert_eq!(
        new.reading().in_flight,
        0,
        "released into the key both tables share"
    );
}
