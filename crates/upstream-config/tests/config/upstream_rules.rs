//! `[upstreams.NAME]`: `url`, authority, `kind`, `weight`, `api_key`, `cancel_grace`, `models`,
//! unknown keys.

use slotgate_config::Kind;

use crate::support::{VALID, assert_only_issue, issues, ok, valid_with, with_upstream};

#[test]
fn upstreams_are_required() {
    let toml = r#"
        [server]
        listen = "127.0.0.1:8080"
    "#;
    assert_only_issue(toml, "upstreams", "missing");
    // Root keys come before the first table header.
    let empty = format!("upstreams = {{}}\n{toml}");
    assert_only_issue(&empty, "upstreams", "at least one upstream");
}

#[test]
fn an_upstream_is_a_table() {
    assert_only_issue(
        &valid_with("[upstreams]\nb = 3"),
        "upstreams.b",
        "expected a table",
    );
}

#[test]
fn url_is_required() {
    assert_only_issue(
        &with_upstream(r#"kind = "vllm""#),
        "upstreams.a.url",
        "missing",
    );
}

#[test]
fn url_must_parse() {
    assert_only_issue(
        &with_upstream("url = \"not a url\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "invalid URL",
    );
    assert_only_issue(
        &with_upstream("url = \"http://\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "invalid URL",
    );
}

#[test]
fn url_must_be_http_or_https() {
    assert_only_issue(
        &with_upstream("url = \"ftp://10.0.0.1\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "scheme must be http or https",
    );
    assert_only_issue(
        &with_upstream("url = \"unix:/run/llama.sock\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "scheme must be http or https",
    );
    ok(&with_upstream(
        "url = \"https://llm.example\"\nkind = \"openai\"",
    ));
}

#[test]
fn url_must_not_have_query_or_fragment() {
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000/?x=1\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "must not have a query",
    );
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000/#top\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "must not have a fragment",
    );
}

#[test]
fn url_must_not_carry_credentials_and_the_password_is_not_echoed() {
    let found = issues(&with_upstream(
        "url = \"http://user:hunter2@10.0.0.1:8000\"\nkind = \"vllm\"",
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert_eq!(found[0].path, "upstreams.a.url");
    assert!(found[0].message.contains("credentials"));
    assert!(!found[0].message.contains("hunter2"));
}

#[test]
fn url_path_prefix_is_kept() {
    let config = ok(&with_upstream(
        "url = \"http://reasoning-predictor.llm-serving/openai/\"\nkind = \"vllm\"",
    ));
    let upstream = &config.upstreams["a"];
    assert_eq!(upstream.url.path(), "/openai/");
    assert_eq!(upstream.path_prefix(), "/openai");
    assert_eq!(
        upstream.authority(),
        "http://reasoning-predictor.llm-serving:80"
    );

    let root = ok(VALID);
    assert_eq!(root.upstreams["a"].path_prefix(), "");
}

#[test]
fn url_must_not_end_in_v1() {
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000/v1\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "drop the trailing /v1",
    );
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000/openai/v1/\"\nkind = \"vllm\""),
        "upstreams.a.url",
        "drop the trailing /v1",
    );
}

#[test]
fn authority_makes_the_default_port_explicit() {
    let cases = [
        (
            "http://Reasoning-Predictor.LLM-Serving",
            "http://reasoning-predictor.llm-serving:80",
        ),
        ("https://llm.example/openai", "https://llm.example:443"),
        ("http://10.0.0.1:8000", "http://10.0.0.1:8000"),
        ("https://10.0.0.1:443", "https://10.0.0.1:443"),
        ("http://[::1]:8081", "http://[::1]:8081"),
    ];
    for (url, authority) in cases {
        let config = ok(&with_upstream(&format!("url = {url:?}\nkind = \"vllm\"")));
        assert_eq!(config.upstreams["a"].authority(), authority, "{url}");
    }
}

#[test]
fn two_upstreams_with_one_authority_are_an_error_naming_both() {
    // Different spellings, one engine: default port and a path prefix do not make it another.
    let toml = valid_with(
        r#"
        [upstreams.b]
        url = "http://10.0.0.1:8000/openai"
        kind = "vllm"
        [upstreams.b.models.m2]
        parallel = 1
        queue = 0
        queue_timeout = "1s"
        "#,
    );
    assert_only_issue(
        &toml,
        "upstreams.b.url",
        "same authority http://10.0.0.1:8000 as upstreams.a",
    );

    let toml = valid_with(
        r#"
        [upstreams.b]
        url = "http://host.example"
        kind = "vllm"
        [upstreams.b.models.m]
        parallel = "unlimited"
        [upstreams.c]
        url = "http://HOST.example:80/"
        kind = "ollama"
        [upstreams.c.models.m]
        parallel = "unlimited"
        "#,
    );
    assert_only_issue(&toml, "upstreams.c.url", "as upstreams.b");

    // Same host, other port: distinct engines.
    ok(&valid_with(
        r#"
        [upstreams.b]
        url = "http://10.0.0.1:8001"
        kind = "vllm"
        [upstreams.b.models.m]
        parallel = 1
        queue = 0
        queue_timeout = "1s"
        "#,
    ));
}

#[test]
fn kind_is_required_and_one_of_four() {
    assert_only_issue(
        &with_upstream(r#"url = "http://10.0.0.1:8000""#),
        "upstreams.a.kind",
        "missing (one of: llama-server, vllm, ollama, openai)",
    );
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000\"\nkind = \"llama.cpp\""),
        "upstreams.a.kind",
        "unknown kind \"llama.cpp\"",
    );
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000\"\nkind = \"VLLM\""),
        "upstreams.a.kind",
        "unknown kind",
    );
    for kind in Kind::ALL {
        let config = ok(&with_upstream(&format!(
            "url = \"http://10.0.0.1:8000\"\nkind = \"{kind}\""
        )));
        assert_eq!(config.upstreams["a"].kind, kind);
        assert_eq!(Kind::from_name(kind.as_str()), Some(kind));
    }
}

#[test]
fn weight_defaults_to_one_and_accepts_integers() {
    assert!((ok(VALID).upstreams["a"].weight - 1.0).abs() < f64::EPSILON);
    let config = ok(&with_upstream(
        "url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\nweight = 3",
    ));
    assert!((config.upstreams["a"].weight - 3.0).abs() < f64::EPSILON);
    let config = ok(&with_upstream(
        "url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\nweight = 0.25",
    ));
    assert!((config.upstreams["a"].weight - 0.25).abs() < f64::EPSILON);
}

#[test]
fn weight_must_be_finite_and_positive() {
    for bad in ["0", "0.0", "-1.5", "nan", "inf", "-inf"] {
        assert_only_issue(
            &with_upstream(&format!(
                "url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\nweight = {bad}"
            )),
            "upstreams.a.weight",
            "must be finite and greater than 0",
        );
    }
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\nweight = \"high\""),
        "upstreams.a.weight",
        "expected a number",
    );
}

#[test]
fn cancel_grace_defaults_by_kind_and_may_be_zero() {
    use std::time::Duration;
    for (kind, default) in [
        ("llama-server", Duration::from_secs(2)),
        ("vllm", Duration::ZERO),
        ("ollama", Duration::ZERO),
        ("openai", Duration::ZERO),
    ] {
        let config = ok(&with_upstream(&format!(
            "url = \"http://10.0.0.1:8000\"\nkind = \"{kind}\""
        )));
        assert_eq!(config.upstreams["a"].cancel_grace, default, "{kind}");
        assert_eq!(
            Kind::from_name(kind).unwrap().default_cancel_grace(),
            default
        );
    }
    let config = ok(&with_upstream(
        "url = \"http://10.0.0.1:8000\"\nkind = \"llama-server\"\ncancel_grace = \"0s\"",
    ));
    assert_eq!(config.upstreams["a"].cancel_grace, Duration::ZERO);
    let config = ok(&with_upstream(
        "url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\ncancel_grace = \"1500ms\"",
    ));
    assert_eq!(
        config.upstreams["a"].cancel_grace,
        Duration::from_millis(1500)
    );
}

#[test]
fn pooled_connections_idle_below_each_engines_keep_alive() {
    use std::time::Duration;

    // llama-server (cpp-httplib) and uvicorn (vLLM, SGLang, KServe) close an idle keep-alive
    // connection at 5 s: the gateway's pool must let go first. Ollama (Go net/http) keeps them.
    let four = Some(Duration::from_secs(4));
    for (kind, bound) in [
        ("llama-server", four),
        ("vllm", four),
        ("openai", four),
        ("ollama", None),
    ] {
        assert_eq!(
            Kind::from_name(kind).unwrap().max_pool_idle(),
            bound,
            "{kind}"
        );
    }
}

#[test]
fn stream_timeout_defaults_to_an_hour_and_may_be_none() {
    use std::time::Duration;

    let base = "url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"";
    let config = ok(&with_upstream(base));
    assert_eq!(
        config.upstreams["a"].stream_timeout,
        Some(Duration::from_secs(3600))
    );
    let config = ok(&with_upstream(&format!(
        "{base}\nstream_timeout = \"none\""
    )));
    assert_eq!(config.upstreams["a"].stream_timeout, None);
    let config = ok(&with_upstream(&format!("{base}\nstream_timeout = \"90m\"")));
    assert_eq!(
        config.upstreams["a"].stream_timeout,
        Some(Duration::from_secs(5400))
    );
    for (bad, needle) in [
        ("\"0s\"", "must be greater than zero"),
        ("\"never\"", "invalid duration \"never\""),
        ("60", "expected a duration string"),
    ] {
        assert_only_issue(
            &with_upstream(&format!("{base}\nstream_timeout = {bad}")),
            "upstreams.a.stream_timeout",
            needle,
        );
    }
}

#[test]
fn max_loaded_models_is_optional_and_collate_for_defaults_to_ten_seconds() {
    use std::time::Duration;

    let base = "url = \"http://10.0.0.1:11434\"\nkind = \"ollama\"";
    let config = ok(&with_upstream(base));
    assert_eq!(config.upstreams["a"].max_loaded_models, None);
    assert_eq!(config.upstreams["a"].collate_for, Duration::from_secs(10));
    let config = ok(&with_upstream(&format!(
        "{base}\nmax_loaded_models = 2\ncollate_for = \"0s\""
    )));
    assert_eq!(config.upstreams["a"].max_loaded_models, Some(2));
    assert_eq!(config.upstreams["a"].collate_for, Duration::ZERO);
    assert_only_issue(
        &with_upstream(&format!("{base}\nmax_loaded_models = 0")),
        "upstreams.a.max_loaded_models",
        "",
    );
    assert_only_issue(
        &with_upstream(&format!("{base}\ncollate_for = 10")),
        "upstreams.a.collate_for",
        "expected a duration string",
    );
}

#[test]
fn cancel_grace_must_be_a_duration() {
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\ncancel_grace = 2"),
        "upstreams.a.cancel_grace",
        "expected a duration string",
    );
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\ncancel_grace = \"soon\""),
        "upstreams.a.cancel_grace",
        "invalid duration \"soon\"",
    );
}

#[test]
fn api_key_is_optional_and_redacted_in_debug() {
    let config = ok(&with_upstream(
        "url = \"http://10.0.0.1:8000\"\nkind = \"openai\"\napi_key = \"sk-very-secret\"",
    ));
    let key = config.upstreams["a"].api_key.as_ref().unwrap();
    assert_eq!(key.expose(), "sk-very-secret");
    let debug = format!("{config:?}");
    assert!(!debug.contains("sk-very-secret"), "{debug}");
    assert!(debug.contains("Secret(<redacted>)"));

    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000\"\nkind = \"openai\"\napi_key = \"\""),
        "upstreams.a.api_key",
        "must not be empty",
    );
}

#[test]
fn models_are_required_and_not_empty() {
    let toml = r#"
        [server]
        listen = "127.0.0.1:8080"
        [upstreams.a]
        url = "http://10.0.0.1:8000"
        kind = "vllm"
    "#;
    assert_only_issue(toml, "upstreams.a.models", "missing");
    assert_only_issue(
        &format!("{toml}\nmodels = {{}}"),
        "upstreams.a.models",
        "at least one model",
    );
    assert_only_issue(
        &format!("{toml}\nmodels = [\"m\"]"),
        "upstreams.a.models",
        "expected a table",
    );
}

#[test]
fn unknown_upstream_keys_are_reported() {
    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\nwieght = 2"),
        "upstreams.a.wieght",
        "unknown key (expected one of: url, kind, weight, api_key, cancel_grace, stream_idle_timeout, stream_timeout, allow_model_management, ca_file, client_cert, client_key, parallel, max_loaded_models, collate_for, models)",
    );
}

#[test]
fn names_that_are_not_bare_keys_are_quoted_in_paths() {
    let toml = r#"
        [server]
        listen = "127.0.0.1:8080"
        [upstreams."gpu box"]
        kind = "ollama"
        [upstreams."gpu box".models."llama3.1:8b"]
        parallel = 1
        queue = 0
    "#;
    let found = issues(toml);
    let paths: Vec<_> = found.iter().map(|i| i.path.as_str()).collect();
    assert_eq!(
        paths,
        [
            r#"upstreams."gpu box".url"#,
            r#"upstreams."gpu box".models."llama3.1:8b".queue_timeout"#,
        ],
        "{found:#?}"
    );
}

#[test]
fn a_malformed_url_with_credentials_is_not_echoed() {
    let found = issues(&with_upstream(
        "url = \"http://user:hunter2@10.0.0.1:99999\"\nkind = \"vllm\"",
    ));
    assert_eq!(found.len(), 1, "{found:#?}");
    assert!(found[0].message.starts_with("invalid URL"), "{}", found[0]);
    assert!(!found[0].message.contains("hunter2"), "{}", found[0]);
}

#[test]
fn names_must_not_be_empty() {
    let toml = r#"
        [server]
        listen = "127.0.0.1:8080"
        [upstreams.""]
        url = "http://10.0.0.1:8000"
        kind = "vllm"
        [upstreams."".models.""]
        parallel = 1
        queue = 0
        queue_timeout = "1s"
    "#;
    let found = issues(toml);
    let listed: Vec<_> = found
        .iter()
        .map(|i| (i.path.as_str(), i.message.as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            (r#"upstreams."""#, "an upstream name must not be empty"),
            (
                r#"upstreams."".models."""#,
                "a model name must not be empty"
            ),
        ]
    );
}

#[test]
fn upstreams_as_an_array_of_tables_is_refused() {
    let toml = r#"
        [server]
        listen = "127.0.0.1:8080"
        [[upstreams]]
        url = "http://10.0.0.1:8000"
    "#;
    assert_only_issue(toml, "upstreams", "expected a table, found an array");
}

#[test]
fn upstream_tls_files_need_an_https_url_and_come_in_pairs() {
    let config = ok(&with_upstream(
        r#"url = "https://10.0.0.1:8443"
        kind = "vllm"
        ca_file = "ca.pem"
        client_cert = "client.pem"
        client_key = "client-key.pem""#,
    ));
    let upstream = &config.upstreams["a"];
    assert_eq!(
        upstream.ca_file.as_deref(),
        Some(std::path::Path::new("ca.pem"))
    );
    let identity = upstream.client_identity.as_ref().expect("client identity");
    assert_eq!(identity.key, std::path::Path::new("client-key.pem"));

    assert_only_issue(
        &with_upstream("url = \"http://10.0.0.1\"\nkind = \"vllm\"\nca_file = \"ca.pem\""),
        "upstreams.a.ca_file",
        "only used with an https url",
    );
    assert_only_issue(
        &with_upstream("url = \"https://10.0.0.1\"\nkind = \"vllm\"\nclient_cert = \"c.pem\""),
        "upstreams.a.client_key",
        "needs the certificate's private key",
    );
}

#[test]
fn parallel_of_an_upstream_is_optional_and_at_least_one() {
    assert_eq!(ok(VALID).upstreams["a"].parallel, None);
    let config = ok(&with_upstream(
        "url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\nparallel = 6",
    ));
    assert_eq!(config.upstreams["a"].parallel, Some(6));
    for (bad, why) in [
        ("0", "at least 1"),
        ("-1", "at least 1"),
        ("\"auto\"", "expected an integer"),
    ] {
        assert_only_issue(
            &with_upstream(&format!(
                "url = \"http://10.0.0.1:8000\"\nkind = \"vllm\"\nparallel = {bad}"
            )),
            "upstreams.a.parallel",
            why,
        );
    }
}
