//! `Config::to_effective_toml`: defaults visible, secrets redacted, and it loads back.

use slotgate_config::Config;

use crate::support::{VALID, ok};

#[test]
fn defaults_are_written_out() {
    let text = ok(VALID).to_effective_toml();
    for line in [
        "listen = \"127.0.0.1:8080\"",
        "max_body_bytes = 33554432",
        "max_upload_bytes = 26214400",
        "response_affinity_entries = 100000",
        "response_affinity_ttl = \"1day\"",
        "affinity = \"on\"",
        "affinity_entries = 65536",
        "affinity_ttl = \"30m\"",
        "affinity_block_bytes = 512",
        "allow_model_management = false",
        "header_read_timeout = \"10s\"",
        "connect_timeout = \"5s\"",
        "first_byte_timeout = \"5m\"",
        "idle_timeout = \"1m 30s\"",
        "max_connections = 1024",
        "drain_grace = \"30s\"",
        "health_check_interval = \"5s\"",
        "health_check_timeout = \"2s\"",
        "eject_after_failures = 3",
        "restore_after_successes = 2",
        "max_ejection_percent = 50",
        "engine_error_retries = 1",
        "api_keys = []",
        "weight = 1.0",
        "cancel_grace = \"0s\"",
        "stream_timeout = \"1h\"",
        "client_write_timeout = \"1m\"",
        "kind = \"vllm\"",
        "url = \"http://10.0.0.1:8000/\"",
        "queue_timeout = \"10s\"",
    ] {
        assert!(
            text.lines().any(|l| l == line),
            "missing {line:?} in:\n{text}"
        );
    }
    assert!(
        text.contains("#   server.admin_listen (no admin listener"),
        "{text}"
    );
}

#[test]
fn it_loads_back_to_the_same_config() {
    let config = ok(r#"
        [server]
        listen = "127.0.0.1:8080"
        admin_listen = "[::1]:9090"
        drain_grace = "0s"
        idle_timeout = "1500ms"

        [aliases]
        chat = "llama3.1:8b"

        [upstreams.a]
        url = "https://llm.example/openai/"
        kind = "openai"
        weight = 0.5
        stream_timeout = "none"
        [upstreams.a.models."llama3.1:8b"]
        parallel = 3
        queue = 0
        queue_timeout = "2m"
        capacity = 4
        [upstreams.a.models.big]
        engine_model = "Org/Big-70B"
        parallel = "unlimited"
    "#);
    let text = config.to_effective_toml();
    let again = Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(again, config, "{text}");
    assert!(text.contains("parallel = \"unlimited\""), "{text}");
    assert!(text.contains("engine_model = \"Org/Big-70B\""), "{text}");
    assert_eq!(again.upstreams["a"].engine_model("big"), "Org/Big-70B");
    assert!(text.contains("stream_timeout = \"none\""), "{text}");
    assert!(
        text.contains("[upstreams.a.models.\"llama3.1:8b\"]"),
        "{text}"
    );
    assert!(
        text.contains("url = \"https://llm.example:443/openai/\""),
        "{text}"
    );
}

#[test]
fn secrets_are_redacted() {
    let config = ok(r#"
        [server]
        listen = "127.0.0.1:8080"
        api_keys = ["client-1", "client-2"]
        api_keys_file = "/run/keys"
        admin_token = "admin-3"

        [upstreams.a]
        url = "http://10.0.0.1:8000"
        kind = "vllm"
        api_key = "upstream-4"
        [upstreams.a.models.m]
        parallel = 1
        queue = 1
        queue_timeout = "1s"
    "#);
    let text = config.to_effective_toml();
    for secret in ["client-1", "client-2", "admin-3", "upstream-4"] {
        assert!(!text.contains(secret), "{secret} leaked:\n{text}");
    }
    assert!(
        text.contains(r#"api_keys = ["<redacted>", "<redacted>"]"#),
        "{text}"
    );
    assert!(text.contains(r#"admin_token = "<redacted>""#), "{text}");
    assert!(text.contains(r#"api_key = "<redacted>""#), "{text}");
    assert!(text.contains(r#"api_keys_file = "/run/keys""#), "{text}");
    // Still a valid config (the placeholders are valid secrets).
    Config::from_toml_str(&text).unwrap_or_else(|e| panic!("{e}\n{text}"));
}
