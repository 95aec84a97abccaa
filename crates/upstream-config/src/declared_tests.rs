//! Every declared key (`[server]`, `[cluster]`, a model's queueing keys) shows in the effective
//! configuration, in declaration order, and has its row in `docs/configuration.md`, so a new
//! key cannot be forgotten in either; and a `[server]` key is declared read at start exactly
//! when its row says "Read at start", so a reload reports every key it cannot apply.

use crate::Config;
use crate::cluster::ClusterKeys;
use crate::queueing::QueueingKeys;
use crate::server::ServerKeys;

const UPSTREAMS: &str = r#"
[upstreams.a]
url = "https://10.0.0.1:8000"
kind = "vllm"
[upstreams.a.models.m]
parallel = 2
queue = 4
queue_timeout = "10s"
"#;

/// Optional `[server]` keys that the effective configuration leaves out when unset, without a
/// note (the other unset ones are listed in its leading comment).
const LEFT_OUT_WHEN_UNSET: &[&str] = &[
    "tls_cert",
    "tls_key",
    "admin_tls_cert",
    "admin_tls_key",
    "cors_origins",
];

/// The keys of the table `[header]` of an effective configuration, in order.
fn shown_keys(effective: &str, header: &str) -> Vec<String> {
    effective
        .lines()
        .skip_while(|line| *line != header)
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .filter_map(|line| line.split_once(" = ").map(|(key, _)| key.to_owned()))
        .collect()
}

fn effective(toml: &str) -> String {
    match Config::from_toml_str(toml) {
        Ok(config) => config.to_effective_toml(),
        Err(error) => panic!("{error}\n{toml}"),
    }
}

fn server_effective(server: &str) -> String {
    effective(&format!("[server]\n{server}\n{UPSTREAMS}"))
}

#[test]
fn every_server_key_shows_in_the_effective_config_in_declaration_order() {
    let names = ServerKeys::names();
    let text = server_effective(r#"listen = "127.0.0.1:8080""#);
    let shown = shown_keys(&text, "[server]");
    for name in &names {
        let noted = text
            .lines()
            .take_while(|line| line.starts_with('#'))
            .any(|line| line.contains(&format!("server.{name}")));
        assert!(
            shown.iter().any(|key| key == name) || noted || LEFT_OUT_WHEN_UNSET.contains(name),
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
    let text = server_effective(
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
    assert_eq!(shown_keys(&text, "[server]"), ServerKeys::names(), "{text}");
}

#[test]
fn a_full_cluster_table_shows_every_declared_key() {
    let text = effective(&format!(
        "[server]\nlisten = \"127.0.0.1:8080\"\n[cluster]\nredis_url = \"redis://h:1/0\"\n\
         replicas = 2\n{UPSTREAMS}"
    ));
    assert_eq!(
        shown_keys(&text, "[cluster]"),
        ClusterKeys::names(),
        "{text}"
    );
}

#[test]
fn a_queueing_model_shows_every_queueing_key_in_order() {
    let text = server_effective(r#"listen = "127.0.0.1:8080""#);
    let shown = shown_keys(&text, "[upstreams.a.models.m]");
    let queueing: Vec<&str> = shown
        .iter()
        .map(String::as_str)
        .filter(|key| QueueingKeys::names().contains(key))
        .collect();
    assert_eq!(queueing, QueueingKeys::names(), "{text}");
}

/// The keys in the first column of the tables of the section of `docs/configuration.md` whose
/// heading starts with `heading`, up to its first subsection (a cell may name several:
/// `tls_cert` / `tls_key`).
fn documented_keys(docs: &str, heading: &str) -> Vec<String> {
    docs.lines()
        .skip_while(|line| !line.starts_with(heading))
        .skip(1)
        .take_while(|line| !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|row| row.split(" |").next())
        .flat_map(|cell| cell.split([',', '/']))
        .map(|key| key.trim().trim_matches('`').to_owned())
        .collect()
}

fn docs() -> String {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn sorted(keys: Vec<&'static str>) -> Vec<String> {
    let mut keys: Vec<String> = keys.into_iter().map(str::to_owned).collect();
    keys.sort();
    keys
}

#[test]
fn every_server_key_has_its_row_in_the_docs() {
    let mut documented = documented_keys(&docs(), "## `[server]`");
    documented.sort();
    assert_eq!(
        documented,
        sorted(ServerKeys::names()),
        "the `[server]` table of docs/configuration.md and the declarations differ"
    );
}

#[test]
fn every_cluster_key_has_its_row_in_the_docs() {
    let mut documented = documented_keys(&docs(), "## `[cluster]`");
    documented.sort();
    assert_eq!(
        documented,
        sorted(ClusterKeys::names()),
        "the `[cluster]` table of docs/configuration.md and the declarations differ"
    );
}

#[test]
fn every_queueing_key_has_its_row_in_the_docs() {
    let docs = docs();
    let models = docs
        .split_once("## `[upstreams.NAME.models.MODEL]`")
        .map_or("", |(_, rest)| rest);
    for name in QueueingKeys::names() {
        assert!(
            models.contains(&format!("\n| `{name}` |")),
            "{name} has no row of its own under `[upstreams.NAME.models.MODEL]` in \
             docs/configuration.md"
        );
    }
}

/// The default column of each row of a docs section: key → cell (`column` counts from 0, the
/// key being column 0).
fn documented_defaults(docs: &str, heading: &str, column: usize) -> Vec<(String, String)> {
    docs.lines()
        .skip_while(|line| !line.starts_with(heading))
        .skip(1)
        .take_while(|line| !line.starts_with('#'))
        .filter(|line| line.starts_with("| `"))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split(" | ").collect();
            let key = cells.first()?.trim_start_matches("| ").trim_matches('`');
            Some((key.to_owned(), (*cells.get(column)?).to_owned()))
        })
        .collect()
}

/// Each default the effective configuration writes for a key is the one its docs row states
/// (as written, or "printed as" it).
fn assert_documented_defaults(text: &str, header: &str, heading: &str, column: usize) {
    let docs = docs();
    let defaults = documented_defaults(&docs, heading, column);
    let lines = text
        .lines()
        .skip_while(|line| *line != header)
        .skip(1)
        .take_while(|line| !line.starts_with('['));
    for (key, value) in lines.filter_map(|line| line.split_once(" = ")) {
        let Some((_, cell)) = defaults.iter().find(|(documented, _)| documented == key) else {
            continue;
        };
        if cell.contains("required") {
            continue;
        }
        assert!(
            cell.contains(&format!("`{value}`")),
            "{header} {key}: the effective config says {value}, its docs row says {cell:?}"
        );
    }
}

#[test]
fn documented_defaults_are_the_declared_ones() {
    let text = effective(&format!(
        "[server]\nlisten = \"127.0.0.1:8080\"\n[cluster]\nredis_url = \"redis://h:1/0\"\n\
         {UPSTREAMS}"
    ));
    assert_documented_defaults(&text, "[server]", "## `[server]`", 2);
    assert_documented_defaults(&text, "[cluster]", "## `[cluster]`", 1);
    assert_documented_defaults(
        &text,
        "[upstreams.a.models.m]",
        "## `[upstreams.NAME.models.MODEL]`",
        2,
    );
}

/// The `[server]` keys whose docs row says "Read at start" (in its last column, the rule).
fn documented_at_start(docs: &str) -> Vec<String> {
    docs.lines()
        .skip_while(|line| !line.starts_with("## `[server]`"))
        .skip(1)
        .take_while(|line| !line.starts_with('#'))
        .filter_map(|line| line.strip_prefix("| `"))
        .filter(|row| {
            row.rsplit(" | ")
                .next()
                .is_some_and(|rule| rule.contains("Read at start"))
        })
        .filter_map(|row| row.split(" |").next())
        .flat_map(|cell| cell.split([',', '/']))
        .map(|key| key.trim().trim_matches('`').to_owned())
        .collect()
}

/// A key the gateway takes only at start is declared so (then a reload that changes it is
/// reported in `restart_required`) exactly when its docs row tells the operator so.
#[test]
fn keys_read_at_start_are_the_ones_the_docs_say() {
    let mut documented = documented_at_start(&docs());
    documented.sort();
    assert_eq!(
        documented,
        sorted(ServerKeys::at_start()),
        "the `[server]` rows of docs/configuration.md that say \"Read at start\" and the keys \
         declared `read_at_start` differ"
    );
}

/// Every key read at start is reported by a reload that changes it, under its `server.` name,
/// in declaration order; a key read live is not.
#[test]
fn restart_required_names_each_changed_key_read_at_start() {
    let config = |server: &str| {
        Config::from_toml_str(&format!("[server]\n{server}\n{UPSTREAMS}"))
            .unwrap_or_else(|e| panic!("{e}\n{server}"))
            .server
    };
    let old = config("listen = \"127.0.0.1:8080\"");
    let new = config(
        r#"
        listen = "127.0.0.1:8081"
        admin_listen = "127.0.0.1:9090"
        response_affinity_entries = 10
        response_affinity_ttl = "1h"
        affinity = "off"
        affinity_entries = 1024
        affinity_ttl = "5m"
        affinity_block_bytes = 1024
        session_headers = []
        header_read_timeout = "1s"
        connect_timeout = "1s"
        first_byte_timeout = "1s"
        idle_timeout = "1s"
        max_connections = 10
        admin_max_connections = 10
        max_buffered_body_bytes = 1073741824
        client_idle_timeout = "1s"
        h2_max_concurrent_streams = 10
        h2_keep_alive_interval = "1s"
        tcp_keepalive = "1s"
        client_write_timeout = "1s"
        drain_grace = "1s"
        tls_cert = "/c.pem"
        tls_key = "/k.pem"
        admin_tls_cert = "/ac.pem"
        admin_tls_key = "/ak.pem"
        max_body_bytes = 1024
        body_read_timeout = "1s"
        health_check_interval = "1s"
        access_log = false
        "#,
    );
    let expected: Vec<String> = ServerKeys::at_start()
        .into_iter()
        .filter(|key| !matches!(*key, "tls_key" | "admin_tls_key"))
        .map(|key| format!("server.{key}"))
        .collect();
    assert_eq!(old.restart_required(&new), expected);
    assert!(old.restart_required(&old).is_empty());

    // A renewed certificate is put in force by the reload; only turning TLS on or off waits.
    let renewed = config(
        r#"
        listen = "127.0.0.1:8080"
        admin_listen = "127.0.0.1:9090"
        tls_cert = "/new.pem"
        tls_key = "/new-key.pem"
        admin_tls_cert = "/ac.pem"
        admin_tls_key = "/ak.pem"
        "#,
    );
    let with_tls = config(
        r#"
        listen = "127.0.0.1:8080"
        admin_listen = "127.0.0.1:9090"
        tls_cert = "/c.pem"
        tls_key = "/k.pem"
        admin_tls_cert = "/ac.pem"
        admin_tls_key = "/ak.pem"
        "#,
    );
    assert!(with_tls.restart_required(&renewed).is_empty());
    let without_admin_tls = config(
        "listen = \"127.0.0.1:8080\"\nadmin_listen = \"127.0.0.1:9090\"\ntls_cert = \"/c.pem\"\ntls_key = \"/k.pem\"",
    );
    assert_eq!(
        with_tls.restart_required(&without_admin_tls),
        ["server.admin_tls_cert"]
    );
}
