//! TLS end to end, over loopback: `https` upstreams behind a private CA (certificates made here
//! with `rcgen`), mutual TLS, and what a client sees when the handshake fails; the gateway's own
//! listeners over TLS (h2 and HTTP/1.1 by ALPN), and a certificate renewed by a reload.
//!
//! The fake engines stay plain HTTP; a [`TlsFront`](tls_support::TlsFront) terminates TLS in
//! front of them.

mod support;
mod tls_support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2::SendRequest;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use slotgate_config::Config;
use slotgate_gateway::Gateway;
use support::{PATIENT, chat, chat_body, fake, gateway, get, server, upstream};
use tls_support::{Leaf, Pki, TlsFront, https_client, read_leaf, server_leaf, tls_connect};

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
    // Under TLS 1.3 the engine refuses a missing client certificate after the client's side of
    // the handshake has finished, so the refusal reaches the gateway either as a TLS alert or,
    // when the engine's close wins the race, as a connection closed before any answer. Both
    // must leave the upstream unhealthy and the engine untouched, which is what is checked.
    let last_error = entry["health"]["last_error"].as_str().unwrap_or_default();
    assert!(
        last_error.contains("TLS handshake failed") || last_error.contains("not ready"),
        "{entry}"
    );
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

/// `[server]` keys that make both listeners speak TLS with `leaf`.
fn listener_tls_keys(leaf: &Leaf) -> String {
    format!(
        "tls_cert = \"{cert}\"\ntls_key = \"{key}\"\nadmin_tls_cert = \"{cert}\"\nadmin_tls_key = \"{key}\"",
        cert = leaf.cert.display(),
        key = leaf.key.display()
    )
}

/// Sends `req` with `client` and reads the whole answer: status, HTTP version, body.
async fn exchange(
    client: &Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    req: Request<Full<Bytes>>,
) -> (StatusCode, Version, Bytes) {
    let response = client
        .request(req)
        .await
        .expect("the gateway answers over TLS");
    let (head, body) = response.into_parts();
    let body = body.collect().await.expect("the whole body").to_bytes();
    (head.status, head.version, body)
}

fn https_chat(addr: SocketAddr, stream: bool) -> Request<Full<Bytes>> {
    Request::post(format!("https://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_body("qwen", stream))))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_listeners_speak_tls_with_h2_and_http1_by_alpn() {
    let pki = Pki::new();
    let engine = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(&listener_tls_keys(&pki.server("gateway", &["127.0.0.1"]))),
        upstream("gpu", &engine.url(), "qwen", 2, 4, "10s")
    ))
    .await;
    let api = gw.api_addr();
    let admin = gw.admin_addr().unwrap();

    // ALPN picks h2 when the client offers it: plain and streamed chats.
    let h2 = https_client(&pki, true);
    let (status, version, body) = exchange(&h2, https_chat(api, false)).await;
    assert_eq!(
        (status, version),
        (StatusCode::OK, Version::HTTP_2),
        "{body:?}"
    );
    let (status, version, body) = exchange(&h2, https_chat(api, true)).await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_2));
    assert!(
        String::from_utf8_lossy(&body).contains("data: [DONE]"),
        "{body:?}"
    );

    // A client offering HTTP/1.1 only gets it.
    let http1 = https_client(&pki, false);
    let (status, version, _) = exchange(&http1, https_chat(api, false)).await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_11));

    // The admin listener too.
    let healthz = Request::get(format!("https://{admin}/healthz"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (status, version, _) = exchange(&h2, healthz).await;
    assert_eq!((status, version), (StatusCode::OK, Version::HTTP_2));

    // Plain HTTP to a TLS listener gets no answer: the handshake fails and the connection closes.
    let plain = support::client()
        .request(
            Request::get(format!("http://{api}/v1/models"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await;
    assert!(
        plain.is_err(),
        "plain HTTP answered on a TLS listener: {plain:?}"
    );

    gw.shutdown().await;
    engine.shutdown().await;
}

/// A chat on an open h2 connection; its status once the whole answer arrived.
async fn h2_chat(sender: &mut SendRequest<Full<Bytes>>, api: SocketAddr) -> StatusCode {
    sender.ready().await.expect("the connection is open");
    let response = sender
        .send_request(https_chat(api, false))
        .await
        .expect("an answer");
    let status = response.status();
    response
        .into_body()
        .collect()
        .await
        .expect("the whole body");
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_renews_the_listener_certificate_without_dropping_connections() {
    let pki = Pki::new();
    let engine = fake(2, "qwen").await;
    let first = pki.server("gateway", &["127.0.0.1"]);
    let toml = format!(
        "{}{}",
        server(&listener_tls_keys(&first)),
        upstream("gpu", &engine.url(), "qwen", 2, 4, "10s")
    );
    let path = pki.dir().join("slotgate.toml");
    std::fs::write(&path, &toml).unwrap();
    let config = Config::from_toml_str(&toml).unwrap();
    let gw = Gateway::bind_file(&config, &path)
        .await
        .expect("gateway starts");
    let api = gw.api_addr();

    // An h2 connection opened before the renewal.
    let tls = tls_connect(&pki, api, &[b"h2"]).await;
    let before = server_leaf(&tls);
    assert_eq!(before, read_leaf(&first).0[0]);
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
            .await
            .expect("h2 over TLS");
    let conn = tokio::spawn(conn);
    assert_eq!(h2_chat(&mut sender, api).await, StatusCode::OK);

    // The same paths, a new certificate and key; then a reload.
    let renewed = pki.server("gateway", &["127.0.0.1"]);
    let reloaded = gw.reload().await.expect("the reload is applied");
    assert!(reloaded.restart_required.is_empty(), "{reloaded:?}");

    // New connections get the new certificate; the open one still serves.
    let after = server_leaf(&tls_connect(&pki, api, &[b"h2"]).await);
    assert_eq!(after, read_leaf(&renewed).0[0]);
    assert_ne!(after, before);
    assert_eq!(h2_chat(&mut sender, api).await, StatusCode::OK);

    // A certificate file that is not one refuses the reload; the certificate in force stays.
    std::fs::write(&renewed.cert, "not a certificate").unwrap();
    let refused = gw
        .reload()
        .await
        .expect_err("an unusable certificate is refused");
    assert!(
        refused
            .issues()
            .iter()
            .any(|issue| issue.starts_with("server.tls_cert: ")),
        "{refused:?}"
    );
    let kept = server_leaf(&tls_connect(&pki, api, &[b"h2"]).await);
    assert_eq!(kept, after);

    drop(sender);
    conn.abort();
    gw.shutdown().await;
    engine.shutdown().await;
}
