//! `[cluster]`: the shared slot store, its defaults and bounds, and what it rules out.

use std::time::Duration;

use slotgate_config::{Cluster, StoreDown};

use crate::support::{VALID, assert_only_issue, issues, ok, valid_with};

fn cluster(body: &str) -> String {
    valid_with(&format!("[cluster]\n{body}"))
}

#[test]
fn absent_means_no_cluster() {
    assert_eq!(ok(VALID).cluster, None);
    assert!(!ok(VALID).to_effective_toml().contains("[cluster]"));
}

#[test]
fn one_line_turns_it_on_with_every_default() {
    let config = ok(&cluster(r#"redis_url = "redis://127.0.0.1:6379/0""#));
    let cluster = config.cluster.unwrap();
    assert_eq!(cluster.redis_url.expose(), "redis://127.0.0.1:6379/0");
    assert_eq!(cluster.key_prefix, Cluster::DEFAULT_KEY_PREFIX);
    assert_eq!(cluster.lease_ttl, Duration::from_secs(10));
    assert_eq!(cluster.store_timeout, Duration::from_secs(1));
    assert_eq!(cluster.on_store_down, StoreDown::FailClosed);
    assert_eq!(cluster.replicas, None);
}

#[test]
fn every_key_can_be_set_and_is_printed() {
    let config = ok(&cluster(
        r#"
        redis_url = "redis://:hunter2@10.0.0.9:6380/3"
        key_prefix = "prod-eu"
        lease_ttl = "6s"
        store_timeout = "2s"
        on_store_down = "local-share"
        replicas = 3
        "#,
    ));
    let cluster = config.cluster.as_ref().unwrap();
    assert_eq!(cluster.lease_ttl, Duration::from_secs(6));
    assert_eq!(cluster.store_timeout, Duration::from_secs(2));
    assert_eq!(cluster.on_store_down, StoreDown::LocalShare);
    assert_eq!(cluster.replicas, Some(3));
    let effective = config.to_effective_toml();
    assert!(effective.contains("[cluster]"), "{effective}");
    assert!(
        effective.contains(r#"redis_url = "redis://:%3Credacted%3E@10.0.0.9:6380/3""#),
        "{effective}"
    );
    assert!(!effective.contains("hunter2"), "{effective}");
    assert!(
        effective.contains(r#"on_store_down = "local-share""#),
        "{effective}"
    );
    assert!(effective.contains("replicas = 3"), "{effective}");
    assert!(effective.contains(r#"lease_ttl = "6s""#), "{effective}");
    // The printed config loads back to the same settings (the password aside).
    let again = ok(&effective).cluster.unwrap();
    assert_eq!(again.lease_ttl, cluster.lease_ttl);
    assert_eq!(again.replicas, cluster.replicas);
}

#[test]
fn a_bad_url_is_refused_without_echoing_it() {
    for (url, needle) in [
        ("http://127.0.0.1:6379", "redis://"),
        ("not a url", "not a URL"),
        ("redis://127.0.0.1:6379/zero", "database number"),
        ("rediss://127.0.0.1:6379", "not supported"),
    ] {
        let toml = cluster(&format!("redis_url = {url:?}"));
        assert_only_issue(&toml, "cluster.redis_url", needle);
        assert!(!issues(&toml)[0].message.contains(url), "{url}");
    }
    assert_only_issue(&cluster(""), "cluster.redis_url", "missing");
}

#[test]
fn bounds_are_checked() {
    let url = r#"redis_url = "redis://127.0.0.1:6379/0""#;
    assert_only_issue(
        &cluster(&format!("{url}\nlease_ttl = \"500ms\"")),
        "cluster.lease_ttl",
        "between 1s and 5m",
    );
    assert_only_issue(
        &cluster(&format!(
            "{url}\nlease_ttl = \"3s\"\nstore_timeout = \"2s\""
        )),
        "cluster.store_timeout",
        "a third of lease_ttl",
    );
    assert_only_issue(
        &cluster(&format!("{url}\nreplicas = 0")),
        "cluster.replicas",
        "at least 1",
    );
    assert_only_issue(
        &cluster(&format!("{url}\non_store_down = \"local-share\"")),
        "cluster.replicas",
        "floor(parallel / replicas)",
    );
    assert_only_issue(
        &cluster(&format!("{url}\non_store_down = \"open\"")),
        "cluster.on_store_down",
        "fail-closed",
    );
    assert_only_issue(
        &cluster(&format!("{url}\nkey_prefix = \"a b\"")),
        "cluster.key_prefix",
        "without braces or spaces",
    );
    assert_only_issue(
        &cluster(&format!("{url}\nreplica = 2")),
        "cluster.replica",
        "unknown key",
    );
}

/// The shared store keeps an engine-wide cap, fair order and priority classes (issue #33).
#[test]
fn shared_admission_settings_are_accepted_under_cluster() {
    let toml = r#"
[server]
listen = "127.0.0.1:8080"
api_keys = [{ key = "k1", priority = "high" }]

[cluster]
redis_url = "redis://127.0.0.1:6379/0"

[upstreams.a]
url = "http://10.0.0.1:8000"
kind = "vllm"
parallel = 4

[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "10s"
queue_order = "fair"
"#;
    let config = ok(toml);
    assert_eq!(config.upstreams["a"].parallel, Some(4));
}

/// The count a replica reads from the engine is written to the store (issue #33).
#[test]
fn an_auto_count_is_accepted_under_cluster() {
    let toml = r#"
[server]
listen = "127.0.0.1:8080"

[cluster]
redis_url = "redis://127.0.0.1:6379/0"

[upstreams.a]
url = "http://10.0.0.1:8000"
kind = "llama-server"

[upstreams.a.models.m]
parallel = "auto"
queue = 4
queue_timeout = "10s"
"#;
    ok(toml);
}

/// Every admission setting is shared under `[cluster]` (issue #33): fair order, priority
/// classes and `queue_keepalive` (which answers `200` only once the shared queue has taken the
/// waiter in) are accepted together.
#[test]
fn every_admission_setting_is_accepted_under_cluster() {
    let toml = r#"
[server]
listen = "127.0.0.1:8080"
api_keys = [{ key = "k1", priority = "high" }]

[cluster]
redis_url = "redis://127.0.0.1:6379/0"

[upstreams.a]
url = "http://10.0.0.1:8000"
kind = "vllm"
parallel = 4

[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "10s"
queue_order = "fair"
queue_keepalive = "10s"
"#;
    let config = ok(toml);
    assert_eq!(
        config.upstreams["a"].queueing["m"].keepalive,
        Some(std::time::Duration::from_secs(10))
    );
}
