//! `[server]`: listeners, defaults, durations, limits, secrets, unknown keys.

use std::path::Path;
use std::time::Duration;

use slotgate_config::{Secret, Server};

use crate::support::{VALID, assert_only_issue, issues, ok, with_server};

#[test]
fn defaults_fill_every_optional_key() {
    let server = ok(VALID).server;
    assert_eq!(server.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(server.admin_listen, None);
    assert_eq!(server.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(server.header_read_timeout, Duration::from_secs(10));
    assert_eq!(server.connect_timeout, Duration::from_secs(5));
    assert_eq!(server.first_byte_timeout, Duration::from_secs(300));
    assert_eq!(server.idle_timeout, Duration::from_secs(90));
    assert_eq!(server.max_connections, 1024);
    assert_eq!(server.drain_grace, Duration::from_secs(30));
    assert_eq!(server.health_check_interval, Duration::from_secs(5));
    assert_eq!(server.health_check_timeout, Duration::from_secs(2));
    assert_eq!(server.eject_after_failures, 3);
    assert_eq!(server.restore_after_successes, 2);
    assert_eq!(server.max_ejection_percent, 50);
    assert_eq!(server.engine_error_retries, 1);
    assert!(server.api_keys.is_empty());
    assert_eq!(server.api_keys_file, None);
    assert_eq!(server.admin_token, None);
    assert_eq!(server.max_body_bytes, Server::DEFAULT_MAX_BODY_BYTES);
}

#[test]
fn every_key_can_be_set() {
    let server = ok(&with_server(
        r#"
        listen = "0.0.0.0:8080"
        admin_listen = "127.0.0.1:9090"
        max_body_bytes = 1048576
        header_read_timeout = "2s"
        connect_timeout = "500ms"
        first_byte_timeout = "2m"
        idle_timeout = "1m 30s"
        max_connections = 64
        drain_grace = "0s"
        health_check_interval = "1s"
        health_check_timeout = "750ms"
        eject_after_failures = 1
        restore_after_successes = 5
        engine_error_retries = 0
        api_keys = ["key-one", "key-two"]
        api_keys_file = "/etc/slotgate/keys"
        admin_token = "admin-secret"
        "#,
    ))
    .server;
    assert_eq!(server.admin_listen, Some("127.0.0.1:9090".parse().unwrap()));
    assert_eq!(server.max_body_bytes, 1_048_576);
    assert_eq!(server.header_read_timeout, Duration::from_secs(2));
    assert_eq!(server.connect_timeout, Duration::from_millis(500));
    assert_eq!(server.first_byte_timeout, Duration::from_secs(120));
    assert_eq!(server.idle_timeout, Duration::from_secs(90));
    assert_eq!(server.max_connections, 64);
    assert_eq!(server.drain_grace, Duration::ZERO);
    assert_eq!(server.health_check_interval, Duration::from_secs(1));
    assert_eq!(server.health_check_timeout, Duration::from_millis(750));
    assert_eq!(server.eject_after_failures, 1);
    assert_eq!(server.restore_after_successes, 5);
    assert_eq!(server.engine_error_retries, 0);
    let keys: Vec<_> = server.api_keys.iter().map(|k| k.key.expose()).collect();
    assert_eq!(keys, ["key-one", "key-two"]);
    assert_eq!(
        server.api_keys_file.as_deref(),
        Some(Path::new("/etc/slotgate/keys"))
    );
    assert_eq!(
        server.admin_token.as_ref().map(Secret::expose),
        Some("admin-secret")
    );
}

#[test]
fn server_table_is_required() {
    let toml = VALID.replace("[server]\nlisten = \"127.0.0.1:8080\"\n", "");
    assert_only_issue(&toml, "server", "missing");
}

#[test]
fn listen_is_required() {
    assert_only_issue(&with_server(""), "server.listen", "missing");
}

#[test]
fn listen_must_be_an_ip_and_port() {
    assert_only_issue(
        &with_server(r#"listen = "localhost:8080""#),
        "server.listen",
        "invalid socket address",
    );
    assert_only_issue(
        &with_server(r#"listen = "127.0.0.1""#),
        "server.listen",
        "invalid socket address",
    );
    assert_only_issue(
        &with_server("listen = 8080"),
        "server.listen",
        "expected a string",
    );
    // IPv6 works.
    ok(&with_server(r#"listen = "[::1]:8080""#));
}

#[test]
fn admin_listen_must_differ_from_listen() {
    assert_only_issue(
        &with_server(
            r#"
            listen = "127.0.0.1:8080"
            admin_listen = "127.0.0.1:8080"
            "#,
        ),
        "server.admin_listen",
        "must differ",
    );
    // A wildcard address overlaps every address on the same port.
    assert_only_issue(
        &with_server(
            r#"
            listen = "0.0.0.0:8080"
            admin_listen = "127.0.0.1:8080"
            "#,
        ),
        "server.admin_listen",
        "must differ",
    );
    // Port 0 asks the OS for a fresh port each time, so tests can use it for both.
    ok(&with_server(
        r#"
        listen = "127.0.0.1:0"
        admin_listen = "127.0.0.1:0"
        "#,
    ));
    // Same port on two distinct addresses binds fine.
    ok(&with_server(
        r#"
        listen = "127.0.0.1:8080"
        admin_listen = "127.0.0.2:8080"
        "#,
    ));
}

#[test]
fn durations_are_human_strings() {
    let base = r#"listen = "127.0.0.1:8080""#;
    assert_only_issue(
        &with_server(&format!("{base}\nconnect_timeout = 5")),
        "server.connect_timeout",
        "expected a duration string",
    );
    assert_only_issue(
        &with_server(&format!("{base}\nconnect_timeout = \"5\"")),
        "server.connect_timeout",
        "invalid duration \"5\"",
    );
    assert_only_issue(
        &with_server(&format!("{base}\nidle_timeout = \"soon\"")),
        "server.idle_timeout",
        "invalid duration",
    );
}

#[test]
fn timeouts_must_be_positive_but_drain_grace_may_be_zero() {
    let base = r#"listen = "127.0.0.1:8080""#;
    for key in [
        "header_read_timeout",
        "connect_timeout",
        "first_byte_timeout",
        "idle_timeout",
        "health_check_interval",
        "health_check_timeout",
    ] {
        assert_only_issue(
            &with_server(&format!("{base}\n{key} = \"0s\"")),
            &format!("server.{key}"),
            "greater than zero",
        );
    }
    ok(&with_server(&format!("{base}\ndrain_grace = \"0s\"")));
}

#[test]
fn limits_must_be_positive_integers() {
    let base = r#"listen = "127.0.0.1:8080""#;
    for key in [
        "max_body_bytes",
        "max_upload_bytes",
        "max_connections",
        "eject_after_failures",
        "restore_after_successes",
    ] {
        let path = format!("server.{key}");
        assert_only_issue(
            &with_server(&format!("{base}\n{key} = 0")),
            &path,
            "at least 1",
        );
        assert_only_issue(
            &with_server(&format!("{base}\n{key} = -5")),
            &path,
            "at least 1",
        );
        assert_only_issue(
            &with_server(&format!("{base}\n{key} = 1.5")),
            &path,
            "expected an integer",
        );
        assert_only_issue(
            &with_server(&format!("{base}\n{key} = \"4MiB\"")),
            &path,
            "expected an integer",
        );
    }
}

#[test]
fn engine_error_retries_may_be_zero_but_not_negative() {
    let base = r#"listen = "127.0.0.1:8080""#;
    let server = ok(&with_server(&format!("{base}\nengine_error_retries = 0"))).server;
    assert_eq!(server.engine_error_retries, 0);
    assert_only_issue(
        &with_server(&format!("{base}\nengine_error_retries = -1")),
        "server.engine_error_retries",
        "at least 0",
    );
    assert_only_issue(
        &with_server(&format!("{base}\nengine_error_retries = \"once\"")),
        "server.engine_error_retries",
        "expected an integer",
    );
}

#[test]
fn max_header_bytes_is_from_1_kib_to_400_kib() {
    let base = r#"listen = "127.0.0.1:8080""#;
    assert_eq!(
        ok(&with_server(base)).server.max_header_bytes,
        Server::DEFAULT_MAX_HEADER_BYTES
    );
    for bytes in [1024, 32 * 1024, 400 * 1024] {
        let config = ok(&with_server(&format!("{base}\nmax_header_bytes = {bytes}")));
        assert_eq!(config.server.max_header_bytes, bytes);
    }
    assert_only_issue(
        &with_server(&format!("{base}\nmax_header_bytes = 1023")),
        "server.max_header_bytes",
        "at least 1024",
    );
    assert_only_issue(
        &with_server(&format!("{base}\nmax_header_bytes = 409601")),
        "server.max_header_bytes",
        "at most 409600",
    );
}

#[test]
fn max_ejection_percent_is_a_share_from_0_to_100() {
    let base = r#"listen = "127.0.0.1:8080""#;
    for percent in [0, 34, 100] {
        let config = ok(&with_server(&format!(
            "{base}\nmax_ejection_percent = {percent}"
        )));
        assert_eq!(config.server.max_ejection_percent, percent);
    }
    assert_only_issue(
        &with_server(&format!("{base}\nmax_ejection_percent = 101")),
        "server.max_ejection_percent",
        "at most 100",
    );
    assert_only_issue(
        &with_server(&format!("{base}\nmax_ejection_percent = -1")),
        "server.max_ejection_percent",
        "at least 0",
    );
    assert_only_issue(
        &with_server(&format!("{base}\nmax_ejection_percent = \"50%\"")),
        "server.max_ejection_percent",
        "expected an integer",
    );
}

#[test]
fn api_keys_are_checked_one_by_one_without_echoing_them() {
    let found = issues(&with_server(
        r#"
        listen = "127.0.0.1:8080"
        api_keys = ["good-key", "", "has space", 12345]
        "#,
    ));
    let paths: Vec<_> = found.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            "server.api_keys[1]",
            "server.api_keys[2]",
            "server.api_keys[3]"
        ],
        "{found:#?}"
    );
    assert!(found[0].message.contains("must not be empty"));
    assert!(found[1].message.contains("whitespace"));
    assert!(
        found[2]
            .message
            .contains("expected a string, found an integer")
    );
    for issue in &found {
        assert!(!issue.message.contains("has space"), "{issue}");
        assert!(!issue.message.contains("12345"), "{issue}");
    }
}

#[test]
fn api_keys_must_be_an_array() {
    assert_only_issue(
        &with_server(
            r#"
            listen = "127.0.0.1:8080"
            api_keys = "just-one"
            "#,
        ),
        "server.api_keys",
        "expected an array",
    );
}

#[test]
fn api_keys_file_must_not_be_empty() {
    assert_only_issue(
        &with_server(
            r#"
            listen = "127.0.0.1:8080"
            api_keys_file = ""
            "#,
        ),
        "server.api_keys_file",
        "must not be empty",
    );
}

#[test]
fn admin_token_is_a_non_empty_header_safe_string() {
    assert_only_issue(
        &with_server(
            r#"
            listen = "127.0.0.1:8080"
            admin_token = "token\n"
            "#,
        ),
        "server.admin_token",
        "trailing newline",
    );
    let found = issues(&with_server(
        r#"
        listen = "127.0.0.1:8080"
        admin_token = 987654
        "#,
    ));
    assert_eq!(found.len(), 1);
    assert!(!found[0].message.contains("987654"), "{}", found[0]);
}

#[test]
fn unknown_server_keys_are_reported() {
    assert_only_issue(
        &with_server(
            r#"
            listen = "127.0.0.1:8080"
            max_conections = 10
            "#,
        ),
        "server.max_conections",
        "unknown key (expected one of: listen, admin_listen",
    );
}

#[test]
fn server_must_be_a_table() {
    let toml = VALID.replace("[server]\nlisten = \"127.0.0.1:8080\"\n", "server = 1\n");
    assert_only_issue(&toml, "server", "expected a table");
}

#[test]
fn listener_tls_takes_a_certificate_and_its_key_together() {
    let config = ok(&with_server(
        r#"listen = "127.0.0.1:8443"
        admin_listen = "127.0.0.1:9443"
        tls_cert = "cert.pem"
        tls_key = "key.pem"
        admin_tls_cert = "admin-cert.pem"
        admin_tls_key = "admin-key.pem""#,
    ));
    let tls = config.server.tls.expect("API listener TLS");
    assert_eq!(tls.cert, std::path::Path::new("cert.pem"));
    assert_eq!(tls.key, std::path::Path::new("key.pem"));
    let admin = config.server.admin_tls.expect("admin listener TLS");
    assert_eq!(admin.cert, std::path::Path::new("admin-cert.pem"));

    assert_only_issue(
        &with_server("listen = \"127.0.0.1:8443\"\ntls_cert = \"cert.pem\""),
        "server.tls_key",
        "needs the certificate's private key",
    );
    assert_only_issue(
        &with_server("listen = \"127.0.0.1:8443\"\ntls_key = \"key.pem\""),
        "server.tls_cert",
        "needs its certificate chain",
    );
    assert_only_issue(
        &with_server("listen = \"127.0.0.1:8443\"\ntls_cert = \"\"\ntls_key = \"key.pem\""),
        "server.tls_cert",
        "must not be empty",
    );
    assert_only_issue(
        &with_server(
            "listen = \"127.0.0.1:8443\"\nadmin_tls_cert = \"c.pem\"\nadmin_tls_key = \"k.pem\"",
        ),
        "server.admin_tls_cert",
        "no admin listener",
    );
}

#[test]
fn client_write_timeout_defaults_to_a_minute_and_must_be_positive() {
    let config = ok(&with_server("listen = \"127.0.0.1:8080\""));
    assert_eq!(config.server.client_write_timeout, Duration::from_secs(60));
    let config = ok(&with_server(
        "listen = \"127.0.0.1:8080\"\nclient_write_timeout = \"5s\"",
    ));
    assert_eq!(config.server.client_write_timeout, Duration::from_secs(5));
    assert_only_issue(
        &with_server("listen = \"127.0.0.1:8080\"\nclient_write_timeout = \"0s\""),
        "server.client_write_timeout",
        "must be greater than zero",
    );
}

#[test]
fn the_body_buffer_must_hold_one_body_of_each_limit() {
    // Equal is enough: one largest body fits.
    let config = ok(&with_server(
        "listen = \"127.0.0.1:8080\"\nmax_body_bytes = 4096\nmax_upload_bytes = 4096\n\
         max_buffered_body_bytes = 4096",
    ));
    assert_eq!(config.server.max_buffered_body_bytes, 4096);
    assert_only_issue(
        &with_server(
            "listen = \"127.0.0.1:8080\"\nmax_body_bytes = 4097\nmax_upload_bytes = 1024\n\
             max_buffered_body_bytes = 4096",
        ),
        "server.max_buffered_body_bytes",
        "less than server.max_body_bytes (4097)",
    );
    // A limit left at its default counts too.
    assert_only_issue(
        &with_server(
            "listen = \"127.0.0.1:8080\"\nmax_upload_bytes = 1000\nmax_buffered_body_bytes = 1000",
        ),
        "server.max_buffered_body_bytes",
        "raise max_buffered_body_bytes to at least 33554432 or lower max_body_bytes",
    );
}

#[test]
fn cors_origins_are_exact_origins_or_a_lone_star() {
    const LISTEN: &str = "listen = \"127.0.0.1:8080\"";
    assert!(
        ok(&with_server(LISTEN)).server.cors_origins.is_empty(),
        "off by default"
    );
    let config = ok(&with_server(&format!(
        "{LISTEN}\ncors_origins = [\"https://app.example.com\", \"http://localhost:3000\"]"
    )));
    assert_eq!(
        config.server.cors_origins,
        ["https://app.example.com", "http://localhost:3000"]
    );
    let any = ok(&with_server(&format!("{LISTEN}\ncors_origins = [\"*\"]")));
    assert_eq!(any.server.cors_origins, ["*"]);
    for (bad, why) in [
        ("[\"app.example.com\"]", "scheme://host"),
        ("[\"ftp://x\"]", "http or https"),
        ("[\"https://app.example.com/\"]", "no trailing slash"),
        ("[\"https://*.example.com\"]", "no wildcard"),
        ("[\"*\", \"https://a.example\"]", "write it alone"),
        ("\"*\"", "array"),
    ] {
        let text = with_server(&format!("{LISTEN}\ncors_origins = {bad}"));
        let key = if bad.starts_with("[\"*\",") || !bad.starts_with('[') {
            "server.cors_origins"
        } else {
            "server.cors_origins[0]"
        };
        assert_only_issue(&text, key, why);
    }
}

#[test]
fn cache_affinity_is_on_by_default_and_every_setting_is_checked() {
    let affinity = ok(VALID).server.cache_affinity;
    assert_eq!(affinity, slotgate_config::CacheAffinity::default());
    assert!(affinity.enabled);
    assert_eq!(affinity.entries, 65_536);
    assert_eq!(affinity.ttl, Duration::from_secs(1800));
    assert_eq!(affinity.block_bytes, 512);
    assert_eq!(
        affinity.session_headers,
        [
            "x-session-id",
            "x-session-affinity",
            "x-claude-code-session-id",
            "session_id"
        ]
    );
    let set = ok(&with_server(
        r#"
        listen = "127.0.0.1:8080"
        affinity = "off"
        affinity_entries = 1000
        affinity_ttl = "5m"
        affinity_block_bytes = 1024
        session_headers = ["X-Conversation", "x-thread"]
        "#,
    ))
    .server
    .cache_affinity;
    assert!(!set.enabled);
    assert_eq!((set.entries, set.block_bytes), (1000, 1024));
    assert_eq!(set.ttl, Duration::from_secs(300));
    assert_eq!(set.session_headers, ["x-conversation", "x-thread"]);
    let server = |line: &str| with_server(&format!("listen = \"127.0.0.1:8080\"\n{line}"));
    assert_only_issue(
        &server("affinity = \"maybe\""),
        "server.affinity",
        r#"expected "on" or "off""#,
    );
    assert_only_issue(
        &server("affinity_entries = 1"),
        "server.affinity_entries",
        "at least 2",
    );
    assert_only_issue(
        &server("affinity_ttl = \"500ms\""),
        "server.affinity_ttl",
        "at least 1s",
    );
    assert_only_issue(
        &server("affinity_block_bytes = 16"),
        "server.affinity_block_bytes",
        "at least 64",
    );
    assert_only_issue(
        &server("affinity_block_bytes = 100000"),
        "server.affinity_block_bytes",
        "at most 65536",
    );
    assert_only_issue(
        &server("session_headers = [\"ok\", \"not a header\"]"),
        "server.session_headers[1]",
        "is not an HTTP header name",
    );
}
