//! How requests queue: client keys with a tenant, priority and share, `tenant_header`, and a
//! model's `queue_order`, `queue_keepalive` and `honor_sdk_timeout`.

use std::time::Duration;

use slotgate_config::{Priority, QueueOrder, Queueing};

use crate::support::{assert_only_issue, ok, with_model, with_server};

const LIMITS: &str = "parallel = 2\nqueue = 4\nqueue_timeout = \"10s\"";
const LISTEN: &str = "listen = \"127.0.0.1:8080\"";

#[test]
fn keys_are_bare_or_tables_with_a_tenant_a_class_and_a_share() {
    let config = ok(&with_server(&format!(
        "{LISTEN}\napi_keys = [\"sk-1\", {{ key = \"sk-2\", name = \"team-a\", priority = \"low\", share = 3 }}, {{ key = \"sk-3\" }}]"
    )));
    let keys = &config.server.api_keys;
    assert_eq!(keys.len(), 3);
    assert_eq!(keys[0].key.expose(), "sk-1");
    assert_eq!(
        (keys[0].name.as_deref(), keys[0].priority, keys[0].share),
        (None, Priority::Normal, 1)
    );
    assert_eq!(keys[1].name.as_deref(), Some("team-a"));
    assert_eq!((keys[1].priority, keys[1].share), (Priority::Low, 3));
    assert_eq!((keys[2].priority, keys[2].share), (Priority::Normal, 1));
}

#[test]
fn an_unknown_priority_class_is_an_error_that_lists_the_classes() {
    assert_only_issue(
        &with_server(&format!(
            "{LISTEN}\napi_keys = [{{ key = \"k\", priority = \"urgent\" }}]"
        )),
        "server.api_keys[0].priority",
        r#"unknown priority class "urgent" (expected one of: high, normal, low)"#,
    );
}

#[test]
fn a_key_table_is_checked_key_by_key() {
    let server = |entry: &str| with_server(&format!("{LISTEN}\napi_keys = [{entry}]"));
    assert_only_issue(
        &server("{ name = \"a\" }"),
        "server.api_keys[0].key",
        "missing",
    );
    assert_only_issue(
        &server("{ key = \"k\", share = 0 }"),
        "server.api_keys[0].share",
        "at least 1",
    );
    assert_only_issue(
        &server("{ key = \"k\", share = 1001 }"),
        "server.api_keys[0].share",
        "at most 1000",
    );
    assert_only_issue(
        &server("{ key = \"k\", name = \"\" }"),
        "server.api_keys[0].name",
        "must not be empty",
    );
    let long = "n".repeat(129);
    assert_only_issue(
        &server(&format!("{{ key = \"k\", name = \"{long}\" }}")),
        "server.api_keys[0].name",
        "at most 128",
    );
    assert_only_issue(
        &server("{ key = \"k\", team = \"a\" }"),
        "server.api_keys[0].team",
        "unknown key",
    );
    // The key itself is never echoed.
    assert_only_issue(
        &server("{ key = \"a b\" }"),
        "server.api_keys[0].key",
        "whitespace",
    );
}

#[test]
fn tenant_header_is_a_header_name_kept_in_lower_case() {
    let config = ok(&with_server(&format!(
        "{LISTEN}\ntenant_header = \"X-Tenant\""
    )));
    assert_eq!(config.server.tenant_header.as_deref(), Some("x-tenant"));
    assert_eq!(ok(&with_server(LISTEN)).server.tenant_header, None);
    assert_only_issue(
        &with_server(&format!("{LISTEN}\ntenant_header = \"x tenant\"")),
        "server.tenant_header",
        "not an HTTP header name",
    );
}

#[test]
fn queueing_defaults_to_fifo_without_keepalive_honoring_the_sdk_timeout() {
    let config = ok(&with_model(LIMITS));
    let queueing = config.upstreams["a"].queueing("m");
    assert_eq!(queueing, Queueing::default());
    assert_eq!(queueing.order, QueueOrder::Fifo);
    assert_eq!(queueing.keepalive, None);
    assert!(queueing.honor_sdk_timeout);
    assert_eq!(queueing.prefetch, 0, "nothing sent ahead unless asked");
}

#[test]
fn a_model_may_send_requests_ahead_to_wait_in_the_engine() {
    const M: &str = "upstreams.a.models.m";
    let config = ok(&with_model(&format!("{LIMITS}\nprefetch = 2")));
    assert_eq!(config.upstreams["a"].queueing("m").prefetch, 2);
    let auto = ok(&with_model(
        "parallel = \"auto\"\nqueue = 1\nqueue_timeout = \"1s\"\nprefetch = 1",
    )
    .replace("kind = \"vllm\"", "kind = \"llama-server\""));
    assert_eq!(auto.upstreams["a"].queueing("m").prefetch, 1);
    assert_only_issue(
        &with_model(&format!("{LIMITS}\nprefetch = 65")),
        &format!("{M}.prefetch"),
        "must be at most 64",
    );
    assert_only_issue(
        &with_model(&format!("{LIMITS}\nprefetch = -1")),
        &format!("{M}.prefetch"),
        "",
    );
    assert_only_issue(
        &with_model(&format!("{LIMITS}\nprefetch = \"1\"")),
        &format!("{M}.prefetch"),
        "",
    );
    // An unlimited model holds no slot, so there is nothing to send ahead of.
    assert_only_issue(
        &with_model("parallel = \"unlimited\"\nprefetch = 1"),
        &format!("{M}.prefetch"),
        "not allowed with parallel = \"unlimited\"",
    );
}

#[test]
fn a_model_sets_its_queue_order_keepalive_and_sdk_timeout() {
    let config = ok(&with_model(&format!(
        "{LIMITS}\nqueue_order = \"fair\"\nqueue_keepalive = \"5s\"\nhonor_sdk_timeout = false"
    )));
    let queueing = config.upstreams["a"].queueing("m");
    assert_eq!(queueing.order, QueueOrder::Fair);
    assert_eq!(queueing.keepalive, Some(Duration::from_secs(5)));
    assert!(!queueing.honor_sdk_timeout);
    let off = ok(&with_model(&format!("{LIMITS}\nqueue_keepalive = \"off\"")));
    assert_eq!(off.upstreams["a"].queueing("m").keepalive, None);
}

#[test]
fn queueing_keys_are_checked() {
    const M: &str = "upstreams.a.models.m";
    assert_only_issue(
        &with_model(&format!("{LIMITS}\nqueue_order = \"lifo\"")),
        &format!("{M}.queue_order"),
        r#"unknown queue order "lifo" (expected "fifo" or "fair")"#,
    );
    for bad in ["500ms", "2m"] {
        assert_only_issue(
            &with_model(&format!("{LIMITS}\nqueue_keepalive = \"{bad}\"")),
            &format!("{M}.queue_keepalive"),
            "must be between 1s and 1m",
        );
    }
    assert_only_issue(
        &with_model(&format!("{LIMITS}\nhonor_sdk_timeout = \"yes\"")),
        &format!("{M}.honor_sdk_timeout"),
        "expected true or false",
    );
    // An unlimited model never queues: nothing to order or keep alive.
    assert_only_issue(
        &with_model("parallel = \"unlimited\"\nqueue_order = \"fair\""),
        &format!("{M}.queue_order"),
        "not allowed with parallel = \"unlimited\"",
    );
}

#[test]
fn the_effective_config_shows_how_each_model_queues_and_reloads_the_same() {
    let config = ok(&with_server(&format!(
        "{LISTEN}\ntenant_header = \"x-team\"\napi_keys = [\"sk-1\", {{ key = \"sk-2\", name = \"ops\", priority = \"high\" }}]"
    )));
    let text = config.to_effective_toml();
    for line in [
        "queue_order = \"fifo\"",
        "queue_keepalive = \"off\"",
        "honor_sdk_timeout = true",
        "prefetch = 0",
        "tenant_header = \"x-team\"",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
    assert!(
        text.contains(r#"{ key = "<redacted>", name = "ops", priority = "high", share = 1 }"#),
        "{text}"
    );
    assert!(!text.contains("sk-2"), "{text}");
    let again = ok(&text);
    assert_eq!(again.server.api_keys[1].priority, Priority::High);
    assert_eq!(
        again.upstreams["a"].queueing("m"),
        config.upstreams["a"].queueing("m")
    );
}
