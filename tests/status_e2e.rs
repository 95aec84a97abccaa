//! End-to-end tests of the live status page on the admin listener (`docs/operations.md`,
//! "The status page"): `GET /ui` and its files, and the event stream `GET /admin/events` it reads.
//!
//! The real gateway in-process, `fake-upstream` behind it, loopback sockets only. The browser
//! side (the page drawing what the stream says, drain buttons) is proven by `tests/ui/run.sh`
//! in a real headless Chromium.

mod support;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use serde_json::Value;
use support::{
    PATIENT, SOON, Streaming, admin_sample, chat_body, fake, gateway, open, post, send, server,
    upstream,
};
use tokio::io::AsyncWriteExt;

const TOKEN: &str = "let-me-in";

/// A request to the admin listener, with an optional bearer token.
fn admin_get(admin: SocketAddr, path: &str, token: Option<&str>) -> Request<Full<Bytes>> {
    let mut builder = Request::get(format!("http://{admin}{path}"));
    if let Some(token) = token {
        builder = builder.header("authorization", format!("Bearer {token}"));
    }
    builder.body(Full::new(Bytes::new())).unwrap()
}

fn header<'r>(headers: &'r http::HeaderMap, name: &str) -> &'r str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// Reads server-sent events from a stream, one `(event, id, data)` at a time.
struct Events {
    stream: Streaming,
    buffer: String,
}

impl Events {
    /// The next event, within [`SOON`]; `None` when the stream ended.
    async fn next(&mut self) -> Option<(String, u64, Value)> {
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let block: String = self.buffer.drain(..end + 2).collect();
                let (mut event, mut id, mut data) = (String::new(), None, String::new());
                for line in block[..end].lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        v.clone_into(&mut event);
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        id = Some(v.parse().expect("a numeric id"));
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data.push_str(v);
                    } else {
                        panic!("unexpected line {line:?} in {block:?}");
                    }
                }
                let data = serde_json::from_str(&data)
                    .unwrap_or_else(|e| panic!("data is not JSON ({e}): {data}"));
                return Some((event, id.expect("every event has an id"), data));
            }
            let chunk = tokio::time::timeout(SOON, self.stream.next_data())
                .await
                .expect("an event within the bound")
                .ok()??;
            self.buffer
                .push_str(std::str::from_utf8(&chunk).expect("UTF-8"));
        }
    }

    /// Reads events until `check` holds for one, which it returns; panics after [`SOON`].
    async fn until(&mut self, what: &str, mut check: impl FnMut(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + SOON;
        loop {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no event showed {what} within {SOON:?}"
            );
            let (_, _, data) = self.next().await.expect("the stream goes on");
            if check(&data) {
                return data;
            }
        }
    }
}

/// Opens `GET /admin/events` with `token` and checks its head.
async fn events(admin: SocketAddr, token: Option<&str>) -> Events {
    let stream = open(admin, admin_get(admin, "/admin/events", token))
        .await
        .head()
        .await;
    assert_eq!(stream.status, 200);
    assert_eq!(
        header(&stream.headers, "content-type"),
        "text/event-stream; charset=utf-8"
    );
    assert_eq!(header(&stream.headers, "cache-control"), "no-store");
    Events {
        stream,
        buffer: String::new(),
    }
}

/// The model entry `model` of upstream `name` in a status event.
fn model_of<'d>(doc: &'d Value, name: &str, model: &str) -> &'d Value {
    doc["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .and_then(|u| {
            u["models"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == model)
        })
        .unwrap_or_else(|| panic!("no {name}/{model} in {doc}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_without_data_with_a_strict_policy() {
    let fake = fake(1, "m").await;
    let gw = gateway(&format!(
        "{}{}",
        server(&format!("admin_token = \"{TOKEN}\"")),
        upstream("secret-host", &fake.url(), "m", 1, 0, "5s"),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    for (path, content_type) in [
        ("/ui", "text/html; charset=utf-8"),
        ("/ui/status.css", "text/css; charset=utf-8"),
        ("/ui/status.js", "text/javascript; charset=utf-8"),
        ("/ui/favicon.svg", "image/svg+xml"),
    ] {
        // No token: a browser cannot send one when it opens the page.
        let reply = send(admin_get(admin, path, None)).await;
        assert_eq!(reply.status, 200, "{path}");
        assert_eq!(header(&reply.headers, "content-type"), content_type);
        let policy = header(&reply.headers, "content-security-policy");
        assert!(policy.contains("default-src 'none'"), "{policy}");
        assert!(policy.contains("script-src 'self'"), "{policy}");
        assert_eq!(header(&reply.headers, "x-content-type-options"), "nosniff");
        // The page is code only: what it shows comes from the stream, behind the token.
        assert!(!reply.text().contains("secret-host"), "{path}");
    }
    let page = send(admin_get(admin, "/ui", None)).await.text();
    assert!(page.contains(r#"data-admin-token="required""#), "{page}");
    // Mistakes are problem documents, as everywhere.
    send(
        Request::post(format!("http://{admin}/ui"))
            .body(Full::new(Bytes::new()))
            .unwrap(),
    )
    .await
    .assert_problem(405, "method-not-allowed");
    send(admin_get(admin, "/ui/missing.js", None))
        .await
        .assert_problem(404, "not-found");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_event_stream_wants_the_token_and_shows_slots_and_queues_live() {
    let fake = fake(2, "m").await;
    let gw = gateway(&format!(
        "{}{}",
        server(&format!("admin_token = \"{TOKEN}\"")),
        upstream("a", &fake.url(), "m", 2, 2, "30s"),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let api = gw.api_addr();
    for wrong in [None, Some("let-me-out")] {
        send(admin_get(admin, "/admin/events", wrong))
            .await
            .assert_problem(401, "unauthorized");
    }

    let mut events = events(admin, Some(TOKEN)).await;
    // The first event: every upstream and model, idle.
    let (event, first_id, doc) = events.next().await.expect("a first event");
    assert_eq!(event, "status");
    assert_eq!(doc["tick"], first_id);
    assert_eq!(doc["samples_kept"], 300);
    let m = model_of(&doc, "a", "m");
    assert_eq!(
        (m["slots"].as_u64(), m["queue"].as_u64()),
        (Some(2), Some(2))
    );
    assert_eq!(doc["live"][0]["upstream"], "a");
    assert_eq!(doc["live"][0]["model"], "m");
    assert_eq!(doc["live"][0]["queue_wait"]["count"], 0);
    assert_eq!(doc["refusals"][0]["model"], "m");

    // A burst: 2 run, 2 queue, 1 is refused at once (queue full).
    let hold = [("x-fake-hold-ms", "2500")];
    let burst: Vec<_> = (0..4)
        .map(|_| {
            tokio::spawn(send(post(
                api,
                "/v1/chat/completions",
                chat_body("m", false),
                &hold,
            )))
        })
        .collect();
    let busy = events
        .until("2 in flight and 2 queued", |doc| {
            let m = model_of(doc, "a", "m");
            m["in_flight"] == 2 && m["queued"] == 2
        })
        .await;
    let samples = busy["live"][0]["samples"].as_array().unwrap();
    assert!(
        samples.len() <= 2,
        "only new samples after the first event: {busy}"
    );
    let refused = send(post(
        api,
        "/v1/chat/completions",
        chat_body("m", false),
        &hold,
    ))
    .await;
    refused.assert_problem(503, "queue-full");
    events
        .until("the refusal counted", |doc| {
            doc["refusals"][0]["queue_full"] == 1
        })
        .await;
    for request in burst {
        assert_eq!(request.await.unwrap().status, 200);
    }
    // Back to idle, with the waits of the queued ones in the window.
    let idle = events
        .until("back to 0 in flight and 0 queued", |doc| {
            let m = model_of(doc, "a", "m");
            m["in_flight"] == 0 && m["queued"] == 0
        })
        .await;
    let live = &idle["live"][0];
    assert_eq!(live["queue_wait"]["count"], 4, "{live}");
    // Two waited about a whole hold (2.5 s): the p99 is in the bucket around it.
    let p99 = live["queue_wait"]["p99"].as_f64().unwrap();
    assert!((1.28..=5.12).contains(&p99), "{live}");
    assert_eq!(live["first_byte"]["count"], 4, "{live}");
    // The engine's prompt tokens, and its cached share, since start.
    assert!(
        live["cache"]["prompt_tokens"].as_u64().unwrap() > 0,
        "{live}"
    );
    assert!(live["cache"]["cached_tokens"].is_u64(), "{live}");
    // The sparkline samples saw the burst.
    let (_, _, later) = events.next().await.unwrap();
    assert!(later["tick"].as_u64().unwrap() > first_id);

    // Shutdown ends the stream rather than waiting for the drain timeout.
    let stop = tokio::spawn(gw.shutdown());
    let ended = tokio::time::timeout(SOON, async { while events.next().await.is_some() {} }).await;
    assert!(ended.is_ok(), "the stream ended on shutdown");
    stop.await.unwrap();
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn event_streams_count_under_the_admin_connection_limit() {
    let fake = fake(1, "m").await;
    let gw = gateway(&format!(
        "{}{}",
        server("admin_max_connections = 2"),
        upstream("a", &fake.url(), "m", 1, 0, "5s"),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    // No token configured: the stream is open, like /admin/upstreams.
    let mut first = events(admin, None).await;
    let second = events(admin, None).await;
    assert!(first.next().await.is_some());
    // A third connection waits for a place: its probe is not answered while both streams run.
    let probe = tokio::spawn(send(admin_get(admin, "/healthz", None)));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!probe.is_finished(), "a third admin connection was served");
    // One stream goes away: the probe gets its place.
    second.stream.disconnect();
    let reply = tokio::time::timeout(SOON, probe)
        .await
        .expect("the probe is served once a stream closed")
        .unwrap();
    assert_eq!(reply.status, 200);
    drop(first);
    gw.shutdown().await;
    fake.shutdown().await;
}

/// A page that stops reading is cut by `client_write_timeout`, but only once what it left unread
/// has filled the buffers on the way: hyper's (a few events) and the kernel's send buffer, which
/// Linux grows up to `net.ipv4.tcp_wmem`'s maximum (4 MiB by default) for a peer that stops
/// reading. Six hundred models make each event about 200 KiB, so that takes seconds here
/// rather than the better part of an hour that a small deployment's page would take.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_stops_reading_is_cut_by_the_write_timeout() {
    let fake = fake(1, "m").await;
    let mut models = String::new();
    for i in 0..600 {
        let _ = write!(
            models,
            "[upstreams.a.models.model-{i}]\nparallel = 1\nqueue = 0\nqueue_timeout = \"5s\"\n"
        );
    }
    let gw = gateway(&format!(
        "{}[upstreams.a]\nurl = \"{}\"\nkind = \"llama-server\"\n{models}",
        server("client_write_timeout = \"1s\""),
        fake.url(),
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let stalls = "slotgate_bounds_total{bound=\"client_stall\"}";
    assert_eq!(admin_sample(admin, stalls).await, Some(0.0));
    // A small receive window, and nothing read after the request.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut stream = socket.connect(admin).await.unwrap();
    stream
        .write_all(b"GET /admin/events HTTP/1.1\r\nhost: admin\r\n\r\n")
        .await
        .unwrap();
    // Some 4 MiB at about 200 KiB a second, then the timeout: twice that as the bound.
    let cut = tokio::time::timeout(2 * PATIENT, async {
        while admin_sample(admin, stalls).await < Some(1.0) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(cut.is_ok(), "the stalled event stream was never cut");
    drop(stream);
    gw.shutdown().await;
    fake.shutdown().await;
}
