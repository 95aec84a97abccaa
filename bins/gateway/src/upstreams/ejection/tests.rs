//! Passive ejection's limits: the last upstream of a model in rotation stays, and so does one
//! past `max_ejection_percent`; checks are not limited.

use std::fmt::Write as _;
use std::time::Instant;

use crate::fixtures::Built;
use crate::upstreams::health::Status;

/// A configuration with `upstreams`, each `(name, models)`, and `server` lines.
fn table(server: &str, upstreams: &[(&str, &[&str])]) -> String {
    let mut toml = format!("[server]\nlisten = \"127.0.0.1:0\"\n{server}\n");
    for (port, (name, models)) in (9..).zip(upstreams) {
        let _ = write!(
            toml,
            "[upstreams.{name}]\nurl = \"http://127.0.0.1:{port}\"\nkind = \"llama-server\"\n"
        );
        for model in *models {
            let _ = write!(
                toml,
                "[upstreams.{name}.models.{model}]\nparallel = 1\nqueue = 0\n\
                 queue_timeout = \"1s\"\n"
            );
        }
    }
    toml
}

/// Every upstream passes its first check.
fn all_healthy(built: &Built) {
    for upstream in built.generation.upstreams.iter() {
        upstream
            .health
            .record_check(Ok(()), &built.generation.policy);
    }
}

/// `eject_after_failures` (3) failures of `upstream` seen through its `model`, each from a
/// request sent after the one before failed; returns its status after them.
fn fail_three_times(built: &Built, model: &str, upstream: &str) -> Status {
    let target = built.target(model, upstream);
    for _ in 0..3 {
        let sent = Instant::now();
        target.record_failure(
            "answered 500".into(),
            sent,
            &built.generation.policy,
            "engine errors",
        );
    }
    target.upstream.health.view().status
}

fn kept_because(built: &Built, upstream: &str) -> String {
    let upstream = built.generation.upstreams.get(upstream).unwrap();
    upstream.health.view().kept_because.unwrap_or_default()
}

#[test]
fn the_only_upstream_of_a_model_is_never_ejected_by_requests() {
    let built = Built::new(&table("", &[("a", &["m"])]));
    all_healthy(&built);
    assert_eq!(fail_three_times(&built, "m", "a"), Status::Healthy);
    assert_eq!(fail_three_times(&built, "m", "a"), Status::Healthy);
    assert!(kept_because(&built, "a").contains("last upstream of `m`"));
    // Its checks still eject it.
    let a = built.generation.upstreams.get("a").unwrap();
    let failed = Err(&crate::upstreams::probe::ProbeError::Timeout(
        std::time::Duration::from_secs(1),
    ));
    a.health.record_check(failed, &built.generation.policy);
    assert_eq!(a.health.view().status, Status::Unhealthy);
}

#[test]
fn one_of_two_may_go_but_not_the_other() {
    let built = Built::new(&table("", &[("a", &["m"]), ("b", &["m"])]));
    all_healthy(&built);
    assert_eq!(fail_three_times(&built, "m", "a"), Status::Unhealthy);
    assert_eq!(fail_three_times(&built, "m", "b"), Status::Healthy);
    assert!(kept_because(&built, "b").contains("last upstream of `m`"));
}

#[test]
fn a_draining_peer_does_not_count_as_in_rotation() {
    let built = Built::new(&table("", &[("a", &["m"]), ("b", &["m"])]));
    all_healthy(&built);
    built
        .generation
        .upstreams
        .get("b")
        .unwrap()
        .set_draining(true);
    assert_eq!(fail_three_times(&built, "m", "a"), Status::Healthy);
}

#[test]
fn at_most_the_share_of_a_model_goes_but_always_one() {
    let four: &[(&str, &[&str])] = &[("a", &["m"]), ("b", &["m"]), ("c", &["m"]), ("d", &["m"])];
    // 50 % of four: two.
    let built = Built::new(&table("", four));
    all_healthy(&built);
    assert_eq!(fail_three_times(&built, "m", "a"), Status::Unhealthy);
    assert_eq!(fail_three_times(&built, "m", "b"), Status::Unhealthy);
    assert_eq!(fail_three_times(&built, "m", "c"), Status::Healthy);
    assert!(
        kept_because(&built, "c").contains("3 of the 4 upstreams of `m`"),
        "{}",
        kept_because(&built, "c")
    );
    // 0 % still lets one go (Envoy's rule), never two.
    let built = Built::new(&table("max_ejection_percent = 0", four));
    all_healthy(&built);
    assert_eq!(fail_three_times(&built, "m", "a"), Status::Unhealthy);
    assert_eq!(fail_three_times(&built, "m", "b"), Status::Healthy);
}

#[test]
fn every_model_of_the_upstream_must_spare_it() {
    // "a" shares `m` with "b" but is the only one serving `solo`.
    let built = Built::new(&table("", &[("a", &["m", "solo"]), ("b", &["m"])]));
    all_healthy(&built);
    assert_eq!(fail_three_times(&built, "m", "a"), Status::Healthy);
    assert!(kept_because(&built, "a").contains("last upstream of `solo`"));
}
