//! Shared fixtures and assertions.

use slotgate_config::{Config, ConfigError, Issue};

/// A small valid configuration that tests extend or break.
pub(crate) const VALID: &str = r#"
[server]
listen = "127.0.0.1:8080"

[upstreams.a]
url = "http://10.0.0.1:8000"
kind = "vllm"

[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "10s"
"#;

/// `VALID` with `extra` appended (TOML allows adding keys to a table in a later section only
/// through a new header, so `extra` brings its own headers).
pub(crate) fn valid_with(extra: &str) -> String {
    format!("{VALID}\n{extra}")
}

/// A config with one upstream `a` serving model `m` with the given model-table body.
pub(crate) fn with_model(body: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:8080"

[upstreams.a]
url = "http://10.0.0.1:8000"
kind = "vllm"

[upstreams.a.models.m]
{body}
"#
    )
}

/// A config with one upstream `a` whose table body is given, serving model `m`.
pub(crate) fn with_upstream(body: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:8080"

[upstreams.a]
{body}

[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "10s"
"#
    )
}

/// A config whose `[server]` table body is given.
pub(crate) fn with_server(body: &str) -> String {
    format!(
        r#"
[server]
{body}

[upstreams.a]
url = "http://10.0.0.1:8000"
kind = "vllm"

[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "10s"
"#
    )
}

#[track_caller]
pub(crate) fn ok(toml: &str) -> Config {
    match Config::from_toml_str(toml) {
        Ok(config) => config,
        Err(error) => panic!("expected a valid config, got:\n{error}\n--- config ---\n{toml}"),
    }
}

#[track_caller]
pub(crate) fn issues(toml: &str) -> Vec<Issue> {
    match Config::from_toml_str(toml) {
        Ok(config) => panic!("expected issues, got a valid config: {config:#?}"),
        Err(ConfigError::Invalid(issues)) => issues,
        Err(other) => panic!("expected ConfigError::Invalid, got {other:?}"),
    }
}

/// Asserts that `toml` is rejected with exactly one issue, at `path`, whose message contains
/// `needle`.
#[track_caller]
pub(crate) fn assert_only_issue(toml: &str, path: &str, needle: &str) {
    let issues = issues(toml);
    assert_eq!(
        issues.len(),
        1,
        "expected exactly one issue, got: {issues:#?}"
    );
    assert_eq!(issues[0].path, path, "{issues:#?}");
    assert!(
        issues[0].message.contains(needle),
        "message {:?} does not contain {needle:?}",
        issues[0].message
    );
}
