//! What a reload carries from one generation to the next (see [`Generation::build`]):
//! upstream states of the same engine, a draining flag by name, and per key the hold times,
//! the engine's load and a discovered `auto` count.

use std::sync::Arc;
use std::time::Duration;

use crate::fixtures::{Built, target};

const BEFORE: &str = r#"
[server]
listen = "127.0.0.1:0"

[upstreams.a]
url = "http://127.0.0.1:9"
kind = "llama-server"

[upstreams.a.models.m]
parallel = "auto"
queue = 2
queue_timeout = "5s"

[upstreams.a.models.n]
parallel = 1
queue = 0
queue_timeout = "5s"

[upstreams.b]
url = "http://127.0.0.1:10"
kind = "vllm"

[upstreams.b.models.m]
parallel = 1
queue = 0
queue_timeout = "5s"
"#;

#[test]
fn the_same_engine_keeps_its_state_and_each_key_its_statistics() {
    let built = Built::new(BEFORE);
    let a_m = built.target("m", "a");
    a_m.auto().expect("auto").record(Ok(4), &a_m.upstream);
    a_m.hold.record(Duration::from_secs(3));
    let a = Arc::clone(&a_m.upstream);
    a.set_draining(true);

    // Same file with `n`'s queue grown: a reload that changes one limit.
    let next = built.next(&BEFORE.replacen("queue = 0", "queue = 3", 1));
    assert_eq!(next.number, 2);
    let new_a_m = target(&next, "m", "a");
    assert!(
        Arc::ptr_eq(&new_a_m.upstream, &a),
        "same engine, same state"
    );
    assert!(new_a_m.upstream.is_draining());
    assert!(
        Arc::ptr_eq(&new_a_m.hold, &a_m.hold),
        "hold times carry over"
    );
    assert!(
        Arc::ptr_eq(&new_a_m.engine, &a_m.engine),
        "engine load carries over"
    );
    assert_eq!(
        new_a_m.slots(&new_a_m.reading()),
        Some(4),
        "the auto count read before stays in force"
    );
    assert!(new_a_m.slots_known());
    assert_eq!(target(&next, "n", "a").reading().limits.queue, 3);
}

#[test]
fn a_changed_engine_starts_fresh_but_keeps_its_draining_flag() {
    let built = Built::new(BEFORE);
    let old = built.target("m", "b");
    old.upstream.set_draining(true);
    old.hold.record(Duration::from_secs(3));

    let next = built.next(&BEFORE.replace("http://127.0.0.1:10", "http://127.0.0.1:12"));
    let new = target(&next, "m", "b");
    assert!(!Arc::ptr_eq(&new.upstream, &old.upstream), "another engine");
    assert!(
        new.upstream.is_draining(),
        "the operator's intent for the name stays"
    );
    assert!(
        !Arc::ptr_eq(&new.hold, &old.hold),
        "another host key: its own statistics"
    );
    // `a` did not change: its state is the same object.
    assert!(Arc::ptr_eq(
        &target(&next, "m", "a").upstream,
        &built.target("m", "a").upstream
    ));
}

#[test]
fn an_auto_count_not_read_yet_stays_unknown_and_due() {
    let built = Built::new(BEFORE);
    let next = built.next(BEFORE);
    let m = target(&next, "m", "a");
    assert!(!m.slots_known(), "no count was found before the reload");
    assert_eq!(m.slots(&m.reading()), None);
    assert!(m.auto().expect("auto").needs_read(&m.upstream));
}
