//! One config, five unrelated mistakes: all five are reported at once, each at its path.

use slotgate_config::{Config, ConfigError};

const FIVE_MISTAKES: &str = r#"
[server]
listen = "127.0.0.1:8080"
admin_listen = "127.0.0.1:8080"          # 1: same as listen

[aliases]
chat = "reasoning-large"                 # 2: no upstream serves it

[upstreams.reasoning]
url = "ftp://reasoning-predictor.llm-serving"   # 3: not http(s)
kind = "vllm"

[upstreams.reasoning.models.reasoning]
parallel = 6
queue = 8
                                         # 4: queue_timeout missing
capacity = 8

[upstreams.small]
url = "http://10.0.0.7:8081"
kind = "llama-server"

[upstreams.small.models.tiny]
parallel = 4
queue = 2
queue_timeout = "5s"
queue_timout = "10s"                     # 5: typo
"#;

#[test]
fn five_mistakes_are_all_reported_with_their_paths() {
    let Err(ConfigError::Invalid(issues)) = Config::from_toml_str(FIVE_MISTAKES) else {
        panic!("expected ConfigError::Invalid");
    };
    let found: Vec<_> = issues.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        found,
        [
            "server.admin_listen",
            "upstreams.reasoning.url",
            "upstreams.reasoning.models.reasoning.queue_timeout",
            "upstreams.small.models.tiny.queue_timout",
            "aliases.chat",
        ],
        "{issues:#?}"
    );
    assert!(issues[0].message.contains("must differ"));
    assert!(issues[1].message.contains("scheme must be http or https"));
    assert!(issues[2].message.starts_with("missing"));
    assert!(issues[3].message.starts_with("unknown key"));
    assert!(issues[4].message.contains("no upstream configures"));

    let text = ConfigError::Invalid(issues.clone()).to_string();
    assert_eq!(text.lines().count(), 5, "{text}");
    assert!(text.contains("upstreams.reasoning.models.reasoning.queue_timeout: missing"));
}

/// The listing in `docs/configuration.md` ("Errors") is this test's output, word for word.
#[test]
fn the_documented_listing_is_what_validation_prints() {
    let error = Config::from_toml_str(FIVE_MISTAKES).unwrap_err();
    let docs = include_str!("../../../../docs/configuration.md");
    for issue in error.issues() {
        let line = format!("  {issue}\n");
        assert!(docs.contains(&line), "docs/configuration.md lacks {line:?}");
    }
}
