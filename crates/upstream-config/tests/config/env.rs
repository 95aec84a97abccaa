//! Environment overrides, in a `figment::Jail` (sandboxed files, cwd and environment: the
//! workspace bans `std::env::set_var`).

#![expect(
    clippy::result_large_err,
    reason = "figment::Jail closures return figment::Error, which is large; not ours to change"
)]

use std::path::Path;
use std::time::Duration;

use figment::Jail;
use slotgate_config::{Config, ConfigError, ModelLimits};

use crate::support::VALID;

/// Runs `check` on the result of loading `slotgate.toml` (holding `file`) inside a jail with
/// `vars` set.
fn load_with_env(
    file: &str,
    vars: &[(&str, &str)],
    check: impl FnOnce(Result<Config, ConfigError>),
) {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("slotgate.toml", file)?;
        for (name, value) in vars {
            jail.set_env(name, value);
        }
        check(Config::load(Path::new("slotgate.toml")));
        Ok(())
    });
}

#[track_caller]
fn loaded(result: Result<Config, ConfigError>) -> Config {
    result.unwrap_or_else(|error| panic!("expected a valid config, got:\n{error}"))
}

#[test]
fn the_file_alone_loads() {
    load_with_env(VALID, &[], |result| {
        assert_eq!(loaded(result), Config::from_toml_str(VALID).unwrap());
    });
}

#[test]
fn env_overrides_nest_with_double_underscores() {
    load_with_env(
        VALID,
        &[
            ("SLOTGATE_SERVER__LISTEN", "127.0.0.1:9000"),
            ("SLOTGATE_SERVER__ADMIN_LISTEN", "127.0.0.1:9091"),
            ("SLOTGATE_SERVER__CONNECT_TIMEOUT", "2s"),
            ("SLOTGATE_UPSTREAMS__A__WEIGHT", "2"),
            ("SLOTGATE_UPSTREAMS__A__MODELS__M__PARALLEL", "3"),
            ("SLOTGATE_UPSTREAMS__A__MODELS__M__QUEUE_TIMEOUT", "45s"),
        ],
        |result| {
            let config = loaded(result);
            assert_eq!(config.server.listen, "127.0.0.1:9000".parse().unwrap());
            assert_eq!(
                config.server.admin_listen,
                Some("127.0.0.1:9091".parse().unwrap())
            );
            assert_eq!(config.server.connect_timeout, Duration::from_secs(2));
            let upstream = &config.upstreams["a"];
            assert!((upstream.weight - 2.0).abs() < f64::EPSILON);
            assert_eq!(
                upstream.models["m"],
                ModelLimits::Limited {
                    parallel: 3,
                    queue: 4,
                    queue_timeout: Duration::from_secs(45),
                    capacity: None,
                }
            );
        },
    );
}

#[test]
fn env_can_switch_a_model_to_unlimited_only_when_the_file_leaves_room() {
    let file = VALID.replace("queue = 4\nqueue_timeout = \"10s\"\n", "");
    load_with_env(
        &file,
        &[("SLOTGATE_UPSTREAMS__A__MODELS__M__PARALLEL", "unlimited")],
        |result| {
            assert_eq!(
                loaded(result).upstreams["a"].models["m"],
                ModelLimits::Unlimited
            );
        },
    );
}

#[test]
fn env_can_set_arrays_and_secrets() {
    load_with_env(
        VALID,
        &[
            ("SLOTGATE_SERVER__API_KEYS", "[key-a, key-b]"),
            ("SLOTGATE_SERVER__ADMIN_TOKEN", "tok-123"),
            ("SLOTGATE_UPSTREAMS__A__API_KEY", "\"12345\""),
        ],
        |result| {
            let config = loaded(result);
            let keys: Vec<_> = config
                .server
                .api_keys
                .iter()
                .map(|k| k.key.expose())
                .collect();
            assert_eq!(keys, ["key-a", "key-b"]);
            assert_eq!(config.server.admin_token.unwrap().expose(), "tok-123");
            // Quoted, so an all-digit key stays a string.
            assert_eq!(
                config.upstreams["a"].api_key.as_ref().unwrap().expose(),
                "12345"
            );
        },
    );
}

#[test]
fn a_bad_override_names_its_variable() {
    load_with_env(
        VALID,
        &[
            ("SLOTGATE_UPSTREAMS__A__WEIGHT", "0"),
            ("SLOTGATE_SERVER__LISTEN", "nowhere"),
        ],
        |result| {
            let error = result.unwrap_err();
            let issues = error.issues();
            assert_eq!(issues.len(), 2, "{error}");
            assert_eq!(issues[0].path, "server.listen");
            assert!(
                issues[0]
                    .message
                    .ends_with("(set by environment variable SLOTGATE_SERVER__LISTEN)"),
                "{}",
                issues[0]
            );
            assert_eq!(issues[1].path, "upstreams.a.weight");
            assert!(
                issues[1]
                    .message
                    .ends_with("(set by environment variable SLOTGATE_UPSTREAMS__A__WEIGHT)"),
                "{}",
                issues[1]
            );
        },
    );
}

#[test]
fn file_values_do_not_claim_an_env_origin() {
    let file = VALID.replace("parallel = 2", "parallel = 0");
    load_with_env(
        &file,
        &[("SLOTGATE_SERVER__LISTEN", "127.0.0.1:9000")],
        |result| {
            let error = result.unwrap_err();
            assert_eq!(error.issues().len(), 1, "{error}");
            assert!(
                !error.issues()[0].message.contains("environment"),
                "{error}"
            );
        },
    );
}

#[test]
fn unrelated_slotgate_variables_are_ignored() {
    load_with_env(
        VALID,
        &[
            ("SLOTGATE_LOG", "debug"),
            ("SLOTGATE_CONFIG", "/etc/slotgate.toml"),
        ],
        |result| {
            loaded(result);
        },
    );
}

#[test]
fn a_single_underscore_typo_is_reported_not_ignored() {
    load_with_env(
        VALID,
        &[("SLOTGATE_SERVER_LISTEN", "127.0.0.1:9000")],
        |result| {
            let error = result.unwrap_err();
            assert_eq!(error.issues().len(), 1, "{error}");
            let issue = &error.issues()[0];
            assert_eq!(issue.path, "server_listen");
            assert!(issue.message.starts_with("unknown key"), "{issue}");
            assert!(issue.message.contains("SLOTGATE_SERVER_LISTEN"), "{issue}");
        },
    );
}

#[test]
fn an_env_only_model_is_validated_like_any_other() {
    load_with_env(
        VALID,
        &[("SLOTGATE_UPSTREAMS__A__MODELS__EXTRA__PARALLEL", "2")],
        |result| {
            let error = result.unwrap_err();
            let paths: Vec<_> = error.issues().iter().map(|i| i.path.as_str()).collect();
            assert_eq!(
                paths,
                [
                    "upstreams.a.models.extra.queue",
                    "upstreams.a.models.extra.queue_timeout"
                ],
                "{error}"
            );
        },
    );
}

#[test]
fn a_missing_file_is_a_load_error_even_with_env() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.set_env("SLOTGATE_SERVER__LISTEN", "127.0.0.1:9000");
        let error = Config::load(Path::new("absent.toml")).unwrap_err();
        assert!(matches!(error, ConfigError::Load { .. }), "{error:?}");
        Ok(())
    });
}

#[test]
fn a_relative_path_is_not_searched_for_in_parent_directories() {
    Jail::expect_with(|jail| {
        jail.clear_env();
        jail.create_file("slotgate.toml", VALID)?;
        jail.change_dir(jail.create_dir("sub")?)?;
        let error = Config::load(Path::new("slotgate.toml")).unwrap_err();
        assert!(matches!(error, ConfigError::Load { .. }), "{error:?}");
        assert!(Config::load(Path::new("../slotgate.toml")).is_ok());
        Ok(())
    });
}
