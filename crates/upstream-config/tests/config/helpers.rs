//! Aliases, model resolution, candidates, errors and redaction.

use std::path::Path;

use slotgate_config::{Config, ConfigError, Issue};

use crate::support::{VALID, assert_only_issue, issues, ok, valid_with};

/// Two upstreams: `b` and `a` both serve `shared`; `a` also serves `m`.
const TWO: &str = r#"
[server]
listen = "127.0.0.1:8080"

[aliases]
chat = "shared"

[upstreams.b]
url = "http://10.0.0.2:8000"
kind = "llama-server"
weight = 2
[upstreams.b.models.shared]
parallel = 4
queue = 4
queue_timeout = "10s"

[upstreams.a]
url = "http://10.0.0.1:8000"
kind = "llama-server"
[upstreams.a.models.shared]
parallel = 2
queue = 4
queue_timeout = "10s"
[upstreams.a.models.m]
parallel = "unlimited"
"#;

#[test]
fn resolve_model_follows_aliases() {
    let config = ok(TWO);
    assert_eq!(config.resolve_model("chat"), Some("shared"));
    assert_eq!(config.resolve_model("shared"), Some("shared"));
    assert_eq!(config.resolve_model("m"), Some("m"));
    assert_eq!(config.resolve_model("gpt-4o"), None);
    assert_eq!(config.resolve_model(""), None);
}

#[test]
fn candidates_are_in_upstream_name_order() {
    let config = ok(TWO);
    let names: Vec<_> = config
        .candidates("shared")
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(names, ["a", "b"]);
    let names: Vec<_> = config
        .candidates("m")
        .iter()
        .map(|u| u.name.as_str())
        .collect();
    assert_eq!(names, ["a"]);
    // Candidates take a model, not an alias.
    assert!(config.candidates("chat").is_empty());
    assert!(config.candidates("nope").is_empty());
    assert_eq!(
        config.model_names().into_iter().collect::<Vec<_>>(),
        ["m", "shared"]
    );
}

#[test]
fn aliases_are_optional() {
    assert!(ok(VALID).aliases.is_empty());
}

#[test]
fn alias_must_point_at_a_configured_model() {
    assert_only_issue(
        &valid_with("[aliases]\nchat = \"gpt-4\""),
        "aliases.chat",
        r#"points to "gpt-4", which no upstream configures (configured models: m)"#,
    );
}

#[test]
fn alias_must_not_shadow_a_model() {
    assert_only_issue(
        &valid_with("[aliases]\nm = \"m\""),
        "aliases.m",
        "an alias must not shadow a model",
    );
}

#[test]
fn aliases_do_not_chain() {
    assert_only_issue(
        &valid_with("[aliases]\nchat = \"m\"\ntalk = \"chat\""),
        "aliases.talk",
        "aliases do not chain",
    );
    assert_only_issue(
        &valid_with("[aliases]\nx = \"x\""),
        "aliases.x",
        "points to itself",
    );
}

#[test]
fn alias_targets_are_strings() {
    assert_only_issue(
        &valid_with("[aliases]\nchat = 1"),
        "aliases.chat",
        "expected a string",
    );
    assert_only_issue(
        &valid_with("[aliases]\n\"\" = \"m\""),
        "aliases.\"\"",
        "must not be empty",
    );
}

#[test]
fn unknown_root_keys_are_reported() {
    let toml = format!("listen = \"127.0.0.1:8080\"\n{VALID}");
    assert_only_issue(
        &toml,
        "listen",
        "unknown key (expected one of: server, upstreams, aliases, cluster)",
    );
}

#[test]
fn invalid_display_lists_one_issue_per_line() {
    let error = Config::from_toml_str(&valid_with("[aliases]\nx = \"y\"\nz = 1")).unwrap_err();
    let text = error.to_string();
    assert_eq!(
        text,
        "aliases.x: points to \"y\", which no upstream configures (configured models: m)\n\
         aliases.z: expected a string, found an integer (1)"
    );
    assert_eq!(error.issues().len(), 2);
    assert_eq!(
        error.issues()[1],
        Issue {
            path: "aliases.z".to_owned(),
            message: "expected a string, found an integer (1)".to_owned()
        }
    );
}

#[test]
fn toml_syntax_errors_are_load_errors() {
    let error = Config::from_toml_str("[server\nlisten = 1").unwrap_err();
    assert!(matches!(error, ConfigError::Load { .. }), "{error:?}");
    assert!(error.issues().is_empty());
    assert!(
        error
            .to_string()
            .starts_with("cannot load the configuration: ")
    );
}

#[test]
fn a_missing_file_is_a_load_error() {
    let error = Config::load(Path::new("/nonexistent/slotgate.toml")).unwrap_err();
    assert!(matches!(error, ConfigError::Load { .. }), "{error:?}");
    assert!(
        error.to_string().contains("/nonexistent/slotgate.toml"),
        "{error}"
    );
}

#[test]
fn debug_never_shows_secrets() {
    let config = ok(&format!(
        r#"
        [server]
        listen = "127.0.0.1:8080"
        api_keys = ["client-secret-1"]
        admin_token = "admin-secret-2"
        {}
        "#,
        &VALID[VALID.find("[upstreams.a]").unwrap()..]
    ));
    let debug = format!("{config:?} {config:#?}");
    assert!(!debug.contains("client-secret-1"));
    assert!(!debug.contains("admin-secret-2"));
}

#[test]
fn a_problem_in_one_upstream_does_not_hide_others() {
    let found = issues(
        r#"
        [server]
        listen = "127.0.0.1:8080"
        [aliases]
        chat = "m"
        [upstreams.a]
        url = "http://10.0.0.1:8000"
        [upstreams.a.models.m]
        parallel = 1
        queue = 1
        queue_timeout = "1s"
        [upstreams.b]
        url = "http://10.0.0.1:8000"
        kind = "vllm"
        [upstreams.b.models.m]
        parallel = 0
        queue = 1
        queue_timeout = "1s"
        "#,
    );
    let paths: Vec<_> = found.iter().map(|i| i.path.as_str()).collect();
    // No cascade: the alias still finds `m`, though neither upstream is valid.
    assert_eq!(
        paths,
        [
            "upstreams.a.kind",
            "upstreams.b.models.m.parallel",
            "upstreams.b.url"
        ],
        "{found:#?}"
    );
}

#[test]
fn aliases_must_be_a_table() {
    let toml = format!("aliases = [\"chat\"]\n{VALID}");
    assert_only_issue(&toml, "aliases", "expected a table, found an array");
}
