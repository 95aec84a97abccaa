//! TLS end to end, over loopback: `https` upstreams behind a private CA (certificates made here
//! with `rcgen`), mutual TLS, and what a client sees when the handshake fails.
//!
//! The fake engines stay plain HTTP; a [`TlsFront`](tls_support::TlsFront) terminates TLS in
//! front of them.

mod support;
mod tls_support;

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::Value;
use support::{PATIENT, chat, fake, gateway, get, server};
use tls_support::{Leaf, Pki, TlsFront};

/// An `https` upstream table for the fake serving `model` behind `front`, with extra keys.
fn https_upstream(name: &str, front: &TlsFront, model: &str, tls_keys: &str) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"https://127.0.0.1:{}\"\nkind = \"llama-server\"\n{tls_keys}\n\n\
         [upstreams.{name}.models.{model}]\nparallel = 2\nqueue = 4\nqueue_timeout = \"10s\"\n",
        front.addr().port()
    )
}

fn ca_file_key(pki: &Pki) -> String {
    format!("ca_file = \"{}\"", pki.ca_file().display())
}

fn client_keys(leaf: &Leaf) -> String {
    format!(
        "client_cert = \"{}\"\nclient_key = \"{}\"",
        leaf.cert.display(),
        leaf.key.display()
    )
}

/// Waits until the admin API shows upstream `name` with health `status`; returns its entry.
async fn wait_for_health(admin: SocketAddr, name: &str, status: &str) -> Value {
    let deadline = tokio::time::Instant::now() + PATIENT;
    loop {
        let doc = get(admin, "/admin/upstreams").await.json();
        let entry = doc["upstreams"]
            .as_array()
            .and_then(|list| list.iter().find(|u| u["name"] == name).cloned())
            .unwrap_or_default();
        if entry["health"]["status"] == status {
            return entry;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "upstream {name} not {status} after {PATIENT:?}: {doc}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_behind_a_private_ca_serves_plain_and_streamed_chats() {
    let pki = Pki::new();
    let engine = fake(2, "qwen").await;
    let front = TlsFront::start(engine.addr(), &pki.server("engine", &["127.0.0.1"]), None).await;
    let gw = gateway(&format!(
        "{}{}",
        server("health_check_interval = \"100ms\""),
        https_upstream("gpu", &front, "qwen", &ca_file_key(&pki))
    ))
    .await;

    let plain = chat(gw.api_addr(), "qwen", false, &[]).await;
    assert_eq!(plain.status, 200, "{plain:?}");
    assert_eq!(plain.json()["object"], "chat.completion");
    let streamed = chat(gw.api_addr(), "qwen", true, &[]).await;
    assert_eq!(streamed.status, 200, "{streamed:?}");
    assert!(streamed.text().contains("data: [DONE]"), "{streamed:?}");

    // The health checks go through the same TLS settings.
    wait_for_health(gw.admin_addr().unwrap(), "gpu", "healthy").await;

    gw.shutdown().await;
    front.shutdown().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_upstream_certificate_is_reported_as_tls_by_checks_and_requests() {
    let pki = Pki::new();
    let engine = fake(2, "qwen").await;
    let front = TlsFront::start(engine.addr(), &pki.server("engine", &["127.0.0.1"]), None).await;
    let upstream = https_upstream("gpu", &front, "qwen", &ca_file_key(&pki));

    // Without `ca_file` the system's roots do not know the private CA: the first health check
    // (before the first request) fails, and says it was TLS.
    let untrusting = gateway(&format!(
        "{}{}",
        server(""),
        https_upstream("gpu", &front, "qwen", "")
    ))
    .await;
    let entry = wait_for_health(untrusting.admin_addr().unwrap(), "gpu", "unhealthy").await;
    let last_error = entry["health"]["last_error"].as_str().unwrap_or_default();
    assert!(last_error.contains("TLS handshake failed"), "{entry}");
    untrusting.shutdown().await;

    // A gateway that trusts the CA finds the upstream healthy; then the engine's certificate is
    // replaced by one from another CA. No health check runs in between (an hour apart), so the
    // request meets the bad certificate itself.
    let gw = gateway(&format!(
        "{}{upstream}",
        server("health_check_interval = \"1h\"")
    ))
    .await;
    wait_for_health(gw.admin_addr().unwrap(), "gpu", "healthy").await;
    let addr = front.addr();
    front.shutdown().await;
    let stranger = Pki::new();
    let front = TlsFront::start_at(
        addr,
        engine.addr(),
        &stranger.server("engine", &["127.0.0.1"]),
        None,
    )
    .await;

    let reply = chat(gw.api_addr(), "qwen", false, &[]).await;
    let doc = reply.assert_problem(502, "upstream-bad-response");
    let detail = doc["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("TLS handshake with upstream `gpu` failed"),
        "{doc}"
    );
    assert!(detail.contains("certificate"), "{doc}");
    assert_eq!(
        engine.observer().snapshot().received,
        0,
        "nothing reached the engine"
    );

    gw.shutdown().await;
    front.shutdown().await;
    engine.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_is_refused_without_a_client_certificate_and_accepted_with_one() {
    let pki = Pki::new();
    let engine = fake(2, "qwen").await;
    let front = TlsFront::start(
        engine.addr(),
        &pki.server("engine", &["127.0.0.1"]),
        Some(&pki),
    )
    .await;
    let without = gateway(&format!(
        "{}{}",
        server(""),
        https_upstream("gpu", &front, "qwen", &ca_file_key(&pki)),
    ))
    .await;
    let entry = wait_for_health(without.admin_addr().unwrap(), "gpu", "unhealthy").await;
    let last_error = entry["health"]["last_error"].as_str().unwrap_or_default();
    assert!(last_error.contains("TLS handshake failed"), "{entry}");
    let refused = chat(without.api_addr(), "qwen", false, &[]).await;
    refused.assert_problem(503, "upstream-unavailable");
    assert_eq!(engine.observer().snapshot().received, 0);
    without.shutdown().await;

    let client = pki.client("gateway");
    let with = gateway(&format!(
        "{}{}",
        server(""),
        https_upstream(
            "gpu",
            &front,
            "qwen",
            &format!("{}\n{}", ca_file_key(&pki), client_keys(&client))
        ),
    ))
    .await;
    let accepted = chat(with.api_addr(), "qwen", false, &[]).await;
    assert_eq!(accepted.status, 200, "{accepted:?}");
    with.shutdown().await;

    front.shutdown().await;
    engine.shutdown().await;
}
