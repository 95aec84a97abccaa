//! `[upstreams.NAME.models.MODEL]`: `parallel`, `queue`, `queue_timeout`, `capacity`, unlimited,
//! `engine_model`.

use std::time::Duration;

use slotgate_config::ModelLimits;

use crate::support::{VALID, assert_only_issue, issues, ok, with_model};

const LIMITS: &str = "parallel = 2\nqueue = 4\nqueue_timeout = \"10s\"";

const P: &str = "upstreams.a.models.m.parallel";
const Q: &str = "upstreams.a.models.m.queue";
const QT: &str = "upstreams.a.models.m.queue_timeout";
const C: &str = "upstreams.a.models.m.capacity";

#[test]
fn limited_model_reads_every_key() {
    let config = ok(&with_model(
        "parallel = 6\nqueue = 8\nqueue_timeout = \"30s\"\ncapacity = 8",
    ));
    let limits = config.upstreams["a"].model("m").copied();
    assert_eq!(
        limits,
        Some(ModelLimits::Limited {
            parallel: 6,
            queue: 8,
            queue_timeout: Duration::from_secs(30),
            capacity: Some(8),
        })
    );
    assert_eq!(limits.and_then(|l| l.parallel()), Some(6));
}

#[test]
fn a_missing_limit_is_an_error_never_a_default() {
    assert_only_issue(
        &with_model("queue = 1\nqueue_timeout = \"1s\""),
        P,
        "missing",
    );
    assert_only_issue(
        &with_model("parallel = 1\nqueue_timeout = \"1s\""),
        Q,
        "missing",
    );
    assert_only_issue(&with_model("parallel = 1\nqueue = 1"), QT, "missing");
    // All three at once are three issues.
    let found = issues(&with_model(""));
    let paths: Vec<_> = found.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, [P, Q, QT], "{found:#?}");
    assert!(found.iter().all(|i| i.message.starts_with("missing")));
}

#[test]
fn parallel_is_an_integer_of_at_least_one() {
    let rest = "queue = 1\nqueue_timeout = \"1s\"";
    assert_only_issue(
        &with_model(&format!("parallel = 0\n{rest}")),
        P,
        "at least 1, found 0",
    );
    assert_only_issue(
        &with_model(&format!("parallel = -2\n{rest}")),
        P,
        "at least 1",
    );
    assert_only_issue(
        &with_model(&format!("parallel = 2.5\n{rest}")),
        P,
        "expected an integer",
    );
    assert_only_issue(
        &with_model(&format!("parallel = true\n{rest}")),
        P,
        "expected an integer",
    );
    assert_only_issue(
        &with_model(&format!("parallel = \"many\"\n{rest}")),
        P,
        r#"expected an integer of at least 1, "auto" or "unlimited", found "many""#,
    );
}

/// `with_model`'s upstream as a llama-server.
fn llama_model(body: &str) -> String {
    with_model(body).replace("kind = \"vllm\"", "kind = \"llama-server\"")
}

#[test]
fn parallel_auto_reads_queue_and_timeout_for_a_llama_server() {
    let config = ok(&llama_model(
        "parallel = \"auto\"\nqueue = 3\nqueue_timeout = \"20s\"",
    ));
    let limits = config.upstreams["a"].models["m"];
    assert_eq!(
        limits,
        ModelLimits::Auto {
            queue: 3,
            queue_timeout: Duration::from_secs(20),
        }
    );
    assert!(limits.is_auto());
    assert!(!limits.is_unlimited());
    assert_eq!(limits.parallel(), None, "the count comes from the engine");
    let effective = config.to_effective_toml();
    assert!(effective.contains("parallel = \"auto\""), "{effective}");
    assert_eq!(ok(&effective), config, "the effective config reads back");
}

#[test]
fn parallel_auto_is_for_llama_server_only() {
    for kind in ["vllm", "ollama", "openai"] {
        let toml = llama_model("parallel = \"auto\"\nqueue = 1\nqueue_timeout = \"1s\"")
            .replace("kind = \"llama-server\"", &format!("kind = \"{kind}\""));
        assert_only_issue(
            &toml,
            P,
            &format!(r#"this upstream is kind = "{kind}"; state the number of slots"#),
        );
    }
}

#[test]
fn parallel_auto_still_needs_queue_and_timeout_and_takes_no_capacity() {
    let found = issues(&llama_model("parallel = \"auto\""));
    let paths: Vec<_> = found.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, [Q, QT], "{found:#?}");
    assert!(found.iter().all(|i| i.message.starts_with("missing")));
    assert_only_issue(
        &llama_model("parallel = \"auto\"\nqueue = 1\nqueue_timeout = \"1s\"\ncapacity = 4"),
        C,
        r#"not allowed with parallel = "auto""#,
    );
}

#[test]
fn unlimited_stands_alone() {
    let config = ok(&with_model("parallel = \"unlimited\""));
    let limits = config.upstreams["a"].models["m"];
    assert_eq!(limits, ModelLimits::Unlimited);
    assert!(limits.is_unlimited());
    assert_eq!(limits.parallel(), None);

    let found = issues(&with_model(
        "parallel = \"unlimited\"\nqueue = 1\nqueue_timeout = \"1s\"\ncapacity = 4",
    ));
    let paths: Vec<_> = found.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(paths, [Q, QT, C], "{found:#?}");
    assert!(found.iter().all(|i| {
        i.message
            .contains(r#"not allowed with parallel = "unlimited""#)
    }));
}

#[test]
fn queue_is_an_integer_of_at_least_zero() {
    let config = ok(&with_model(
        "parallel = 1\nqueue = 0\nqueue_timeout = \"1s\"",
    ));
    assert!(matches!(
        config.upstreams["a"].models["m"],
        ModelLimits::Limited { queue: 0, .. }
    ));
    assert_only_issue(
        &with_model("parallel = 1\nqueue = -1\nqueue_timeout = \"1s\""),
        Q,
        "at least 0, found -1",
    );
    assert_only_issue(
        &with_model("parallel = 1\nqueue = \"8\"\nqueue_timeout = \"1s\""),
        Q,
        "expected an integer",
    );
}

#[test]
fn queue_timeout_is_a_positive_human_duration() {
    for (text, expected) in [
        ("30s", Duration::from_secs(30)),
        ("2m", Duration::from_secs(120)),
        ("500ms", Duration::from_millis(500)),
    ] {
        let config = ok(&with_model(&format!(
            "parallel = 1\nqueue = 1\nqueue_timeout = \"{text}\""
        )));
        assert!(matches!(
            config.upstreams["a"].models["m"],
            ModelLimits::Limited { queue_timeout, .. } if queue_timeout == expected
        ));
    }
    assert_only_issue(
        &with_model("parallel = 1\nqueue = 1\nqueue_timeout = \"0s\""),
        QT,
        "greater than zero",
    );
    assert_only_issue(
        &with_model("parallel = 1\nqueue = 1\nqueue_timeout = 30"),
        QT,
        "expected a duration string",
    );
    assert_only_issue(
        &with_model("parallel = 1\nqueue = 1\nqueue_timeout = \"thirty seconds\""),
        QT,
        "invalid duration",
    );
}

#[test]
fn capacity_bounds_parallel() {
    let base = "queue = 1\nqueue_timeout = \"1s\"";
    ok(&with_model(&format!("parallel = 4\ncapacity = 4\n{base}")));
    ok(&with_model(&format!("parallel = 2\ncapacity = 4\n{base}")));
    assert_only_issue(
        &with_model(&format!("parallel = 6\ncapacity = 4\n{base}")),
        P,
        "6 is above capacity = 4",
    );
    assert_only_issue(
        &with_model(&format!("parallel = 1\ncapacity = 0\n{base}")),
        C,
        "at least 1, found 0",
    );
}

#[test]
fn unknown_model_keys_are_reported() {
    assert_only_issue(
        &with_model("parallel = 1\nqueue = 1\nqueue_timeout = \"1s\"\nqueue_timout = \"2s\""),
        "upstreams.a.models.m.queue_timout",
        "unknown key (expected one of: parallel, queue, queue_timeout, capacity, engine_model, queue_order, queue_keepalive, honor_sdk_timeout, prefetch, affinity)",
    );
}

#[test]
fn a_model_is_a_table() {
    let toml = r#"
        [server]
        listen = "127.0.0.1:8080"
        [upstreams.a]
        url = "http://10.0.0.1:8000"
        kind = "vllm"
        models = { m = 4 }
    "#;
    assert_only_issue(
        toml,
        "upstreams.a.models.m",
        "expected a table, found an integer (4)",
    );
}

#[test]
fn engine_model_names_the_model_for_this_upstream_only() {
    let config = ok(&format!(
        "{}\nengine_model = \"Qwen/Qwen2.5-7B-Instruct\"\n\n\
         [upstreams.o]\nurl = \"http://10.0.0.2:11434\"\nkind = \"ollama\"\n\
         [upstreams.o.models.m]\nengine_model = \"qwen2.5:7b-instruct\"\n{LIMITS}\n\
         [upstreams.o.models.other]\n{LIMITS}\n",
        with_model(LIMITS)
    ));
    assert_eq!(
        config.upstreams["a"].engine_model("m"),
        "Qwen/Qwen2.5-7B-Instruct"
    );
    assert_eq!(
        config.upstreams["o"].engine_model("m"),
        "qwen2.5:7b-instruct"
    );
    // Unset: the model's own name. The client-facing name is the key either way.
    assert_eq!(config.upstreams["o"].engine_model("other"), "other");
    assert_eq!(config.resolve_model("m"), Some("m"));
    assert_eq!(config.resolve_model("qwen2.5:7b-instruct"), None);
}

#[test]
fn engine_model_is_a_non_empty_string() {
    const E: &str = "upstreams.a.models.m.engine_model";
    assert_only_issue(
        &with_model(&format!("{LIMITS}\nengine_model = \"\"")),
        E,
        "must not be empty",
    );
    assert_only_issue(
        &with_model(&format!("{LIMITS}\nengine_model = 3")),
        E,
        "expected a string",
    );
}

#[test]
fn two_models_may_not_reach_one_engine_under_one_name() {
    // `m` sent as "x", next to a model really called "x": one model there, two limits.
    let toml = format!(
        "{}\nengine_model = \"x\"\n\n[upstreams.a.models.x]\n{LIMITS}\n",
        with_model(LIMITS)
    );
    let found = issues(&toml);
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(
        found[0].path.starts_with("upstreams.a.models."),
        "{found:#?}"
    );
    assert!(
        found[0].message.contains("both reach this engine as \"x\""),
        "{found:#?}"
    );
    // On two different upstreams the same engine name is fine.
    ok(&format!(
        "{}\nengine_model = \"x\"\n\n[upstreams.b]\nurl = \"http://10.0.0.2:8000\"\n\
         kind = \"vllm\"\n[upstreams.b.models.m]\nengine_model = \"x\"\n{LIMITS}\n",
        with_model(LIMITS)
    ));
}

#[test]
fn a_model_can_turn_cache_affinity_off() {
    let config = ok(&with_model(
        "parallel = 1\nqueue = 1\nqueue_timeout = \"1s\"\naffinity = \"off\"",
    ));
    assert!(!config.upstreams["a"].affinity("m"));
    assert!(
        ok(VALID)
            .upstreams
            .values()
            .all(|u| u.models.keys().all(|m| u.affinity(m)))
    );
    // Unlimited models may say it too.
    let unlimited = ok(&with_model("parallel = \"unlimited\"\naffinity = \"off\""));
    assert!(!unlimited.upstreams["a"].affinity("m"));
    assert_only_issue(
        &with_model("parallel = 1\nqueue = 1\nqueue_timeout = \"1s\"\naffinity = true"),
        "upstreams.a.models.m.affinity",
        "expected a string",
    );
}
