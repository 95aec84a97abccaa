//! Every declared `[server]` key shows in the effective configuration and has its row in
//! `docs/configuration.md`, so a new key cannot be forgotten in either.

use super::ServerKeys;
use crate::Config;

const UPSTREAMS: &str = r#"
[upstreams.a]
url = "https://10.0.0.1:8000"
kind = "vllm"
[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "10s"
"#;

/// Optional keys that the effective configuration leaves out when unset, without a note (the
/// rest of the unset ones are listed in its leading comment).
const LEFT_OUT_WHEN_UNSET: &[&str] = &[
    "tls_cert",
    "tls_key",
    "admin_tls_cert",
    "admin_tls_key",
    "cors_origins",
];

/// The keys of the `[server]` table of an effective configuration, in order.
fn shown_server_keys(effective: &str) -> Vec<String> {
    effective
        .lines()
        .skip_while(|line| *line != "[server]")
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .filter_map(|line| line.split_once(" = ").map(|(key, _)| key.to_owned()))
        .collect()
}

fn effective(server: &str) -> String {
    let toml = format!("[server]\n{server}\n{UPSTREAMS}");
    match Config::from_toml_str(&toml) {
        Ok(config) => config.to_effective_toml(),
        Err(error) => panic!("{error}\n{toml}"),
    }
}

#[test]
fn every_key_shows_in_the_effective_config_in_declaration_order() {
    let names = ServerKeys::names();
    let text = effective(r#"listen = "127.0.0.1:8080""#);
    let shown = shown_server_keys(&text);
    for name in &names {
        let noted = text
            .lines()
            .take_while(|line| line.starts_with('#'))
            .any(|line| line.contains(&format!("server.{name}")));
        assert!(
            shown.contains(&(*name).to_owned()) || noted || LEFT_OUT_WHEN_UNSET.contains(name),
            "server.{name} is neither in the effective config nor in its `Not set` note:\n{text}"
        );
    }
    let in_order: Vec<&str> = names
        .iter()
        .copied()
        .filter(|name| shown.iter().any(|key| key == name))
        .collect();
    assert_eq!(shown, in_order, "{text}");
}

#[test]
fn a_full_server_table_shows_every_declared_key() {
    let text = effective(
        r#"
        listen = "127.0.0.1:8080"
        admin_listen = "127.0.0.1:9090"
        api_keys_file = "/run/keys"
        tenant_header = "x-tenant"
        admin_token = "token"
        tls_cert = "/c.pem"
        tls_key = "/k.pem"
        admin_tls_cert = "/ac.pem"
        admin_tls_key = "/ak.pem"
        cors_origins = ["*"]
        "#,
    );
    assert_eq!(shown_server_keys(&text), ServerKeys::names(), "{text}");
}

/// The keys in the first column of the `[server]` table of `docs/configuration.md` (a row may
/// name two: `tls_cert` / `tls_key`).
fn documented_server_keys(docs: &str) -> Vec<String> {
    docs.lines()
        .skip_while(|line| !line.starts_with("## `[server]`"))
        .skip(1)
        .take_while(|line| !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|row| row.split(" |").next())
        .flat_map(|cell| cell.split(" / "))
        .map(|key| key.trim_matches('`').to_owned())
        .filter(|key| key != "key")
        .collect()
}

#[test]
fn every_key_has_its_row_in_the_docs() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let docs = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let mut documented = documented_server_keys(&docs);
    let mut declared: Vec<String> = ServerKeys::names().into_iter().map(str::to_owned).collect();
    documented.sort();
    declared.sort();
    assert_eq!(
        documented, declared,
        "the `[server]` table of docs/configuration.md and the declarations differ"
    );
}
