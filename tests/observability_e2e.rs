//! End-to-end: what an operator sees of each request, over real sockets in front of the fake
//! engine. The metrics tell the truth (the first token, not the response head; the engine's
//! status classes; the tokens of `usage`; every refusal; the build and the process), every
//! request leaves one access-log line (text and JSON), and every metric the Grafana dashboard
//! (`deploy/grafana/slotgate.json`) queries exists in a real gateway's `/metrics`.

mod support;

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::Value;
use slotgate_exposition::Samples;
use support::{PATIENT, SOON, chat, fake, gateway, get, open, post, send, server, upstream};

/// The gateway's `/metrics` now.
async fn scrape(admin: SocketAddr) -> Samples {
    let reply = get(admin, "/metrics").await;
    assert_eq!(reply.status, 200);
    Samples::parse(&reply.text())
}

/// The sum of the samples `name{labels…}` (0 when there is none).
fn total(samples: &Samples, name: &str, labels: &[(&str, &str)]) -> f64 {
    samples.sum(name, labels).unwrap_or(0.0)
}

/// A chat completion body asking for a streamed answer that ends with its usage.
fn chat_with_usage(model: &str) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": true,
        "stream_options": {"include_usage": true},
    })
    .to_string()
}

// === metrics ===

/// The handoff gap: a request that queued behind the one holding the only slot is observed
/// once, from that slot's release to its own send; one that found the slot free is not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_request_observes_its_handoff_gap_and_a_free_one_does_not() {
    let fake = fake(1, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 4, "30s")
    ))
    .await;
    let (addr, admin) = (gw.api_addr(), gw.admin_addr().unwrap());
    let gpu_qwen = [("upstream", "gpu"), ("model", "qwen")];

    let reply = chat(addr, "qwen", false, &[]).await;
    assert_eq!(reply.status, 200);
    let samples = scrape(admin).await;
    assert_eq!(
        samples.sum("slotgate_handoff_gap_seconds_count", &gpu_qwen),
        Some(0.0),
        "a free slot is no handoff"
    );

    let first = tokio::spawn(chat(addr, "qwen", false, &[("x-fake-hold-ms", "400")]));
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let second = tokio::spawn(chat(addr, "qwen", false, &[]));
    support::eventually("the second request queues", SOON, || {
        gw.limiter()
            .queued(&support::authority(fake.addr()), "qwen")
            == 1
    })
    .await;
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);

    let samples = scrape(admin).await;
    assert_eq!(
        samples.sum("slotgate_handoff_gap_seconds_count", &gpu_qwen),
        Some(1.0)
    );
    let gap = total(&samples, "slotgate_handoff_gap_seconds_sum", &gpu_qwen);
    // Not a speed check: the gap is the gateway's own work, far shorter than the 400 ms hold
    // that the queue wait measured.
    let waited = total(&samples, "slotgate_queue_wait_seconds_sum", &gpu_qwen);
    assert!(
        gap > 0.0 && gap < waited,
        "gap {gap} s, queue wait {waited} s"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn first_token_is_timed_to_the_first_data_event_not_the_response_head() {
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 2, 4, "30s")
    ))
    .await;
    let gpu_qwen = [("upstream", "gpu"), ("model", "qwen")];

    // The engine sends its head at once and its first event 500 ms later (prefill).
    let reply = chat(
        gw.api_addr(),
        "qwen",
        true,
        &[("x-fake-fail", "first-token-delay-ms=500")],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().contains("data: [DONE]"), "{}", reply.text());

    let samples = scrape(gw.admin_addr().unwrap()).await;
    let ttft_count = total(
        &samples,
        "slotgate_time_to_first_token_seconds_count",
        &gpu_qwen,
    );
    let ttft = total(
        &samples,
        "slotgate_time_to_first_token_seconds_sum",
        &gpu_qwen,
    );
    let head = total(
        &samples,
        "slotgate_time_to_response_head_seconds_sum",
        &gpu_qwen,
    );
    assert!((ttft_count - 1.0).abs() < f64::EPSILON, "one answer");
    assert!(ttft >= 0.5, "TTFT {ttft} s covers the 500 ms prefill");
    assert!(
        head < ttft,
        "the head ({head} s) came before the first token"
    );
    // The whole request, queue wait included, lasted at least as long.
    let duration = total(&samples, "slotgate_request_duration_seconds_sum", &gpu_qwen);
    assert!(duration >= ttft, "duration {duration} s, TTFT {ttft} s");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_500_is_passed_through_and_counted_as_5xx_not_completed() {
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 2, 4, "30s")
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let reply = chat(
        gw.api_addr(),
        "qwen",
        false,
        &[("x-fake-fail", "status-500")],
    )
    .await;
    assert_eq!(
        reply.status,
        500,
        "the engine's own answer: {}",
        reply.text()
    );

    let class = |class| [("upstream", "gpu"), ("model", "qwen"), ("class", class)];
    let outcome = |outcome| [("upstream", "gpu"), ("model", "qwen"), ("outcome", outcome)];
    let samples = scrape(admin).await;
    let responses = "slotgate_upstream_responses_total";
    assert!((total(&samples, responses, &class("5xx")) - 1.0).abs() < f64::EPSILON);
    assert!(total(&samples, responses, &class("2xx")).abs() < f64::EPSILON);
    let requests = "slotgate_requests_total";
    assert!(
        (total(&samples, requests, &outcome("upstream_status_error")) - 1.0).abs() < f64::EPSILON
    );
    assert!(total(&samples, requests, &outcome("completed")).abs() < f64::EPSILON);

    assert_eq!(chat(gw.api_addr(), "qwen", false, &[]).await.status, 200);
    let samples = scrape(admin).await;
    assert!((total(&samples, responses, &class("2xx")) - 1.0).abs() < f64::EPSILON);
    assert!((total(&samples, requests, &outcome("completed")) - 1.0).abs() < f64::EPSILON);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_counted_from_the_usage_of_plain_and_streamed_answers() {
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 2, 4, "30s")
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let addr = gw.api_addr();
    let tokens = |samples: &Samples, kind| {
        total(
            samples,
            "slotgate_tokens_total",
            &[("upstream", "gpu"), ("model", "qwen"), ("kind", kind)],
        )
    };

    let plain = [("x-fake-prompt-tokens", "7"), ("x-fake-tokens", "5")];
    let reply = chat(addr, "qwen", false, &plain).await;
    assert_eq!(reply.json()["usage"]["completion_tokens"], 5);
    let samples = scrape(admin).await;
    assert!((tokens(&samples, "prompt") - 7.0).abs() < f64::EPSILON);
    assert!((tokens(&samples, "completion") - 5.0).abs() < f64::EPSILON);

    let streamed = [("x-fake-prompt-tokens", "11"), ("x-fake-tokens", "3")];
    let reply = send(post(
        addr,
        "/v1/chat/completions",
        chat_with_usage("qwen"),
        &streamed,
    ))
    .await;
    assert!(reply.text().contains("\"usage\""), "{}", reply.text());
    let samples = scrape(admin).await;
    assert!((tokens(&samples, "prompt") - 18.0).abs() < f64::EPSILON);
    assert!((tokens(&samples, "completion") - 8.0).abs() < f64::EPSILON);

    // A stream whose client did not ask for usage has none to count.
    let reply = chat(addr, "qwen", true, &streamed).await;
    assert!(!reply.text().contains("\"usage\""), "{}", reply.text());
    let samples = scrape(admin).await;
    assert!((tokens(&samples, "prompt") - 18.0).abs() < f64::EPSILON);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_refusal_is_counted_and_the_build_and_process_are_reported() {
    // An upstream nobody listens on: every request finds no upstream to take it.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap()
    };
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gone", &format!("http://{dead}"), "qwen", 2, 4, "30s")
    ))
    .await;
    let admin = gw.admin_addr().unwrap();
    let reply = chat(gw.api_addr(), "qwen", false, &[]).await;
    reply.assert_problem(503, "upstream-unavailable");
    let reply = chat(gw.api_addr(), "no-such-model", false, &[]).await;
    reply.assert_problem(404, "model-not-found");
    // Ollama's `/api/version` with no Ollama upstream: a refusal of no model, counted too.
    let reply = get(gw.api_addr(), "/api/version").await;
    reply.assert_ollama_error(503, "upstream-unavailable");

    let samples = scrape(admin).await;
    let unavailable = ["upstream_unavailable", "model_unavailable"]
        .iter()
        .map(|reason| {
            total(
                &samples,
                "slotgate_rejections_total",
                &[("model", "qwen"), ("reason", reason)],
            )
        })
        .sum::<f64>();
    assert!((unavailable - 1.0).abs() < f64::EPSILON, "{unavailable}");
    // A client's unknown model name never becomes a label.
    assert!(
        (total(
            &samples,
            "slotgate_rejections_total",
            &[("model", ""), ("reason", "model_not_found")]
        ) - 1.0)
            .abs()
            < f64::EPSILON
    );
    assert_eq!(
        samples.sum(
            "slotgate_rejections_total",
            &[("model", ""), ("reason", "upstream_unavailable")]
        ),
        Some(1.0)
    );

    let version = env!("CARGO_PKG_VERSION");
    assert_eq!(
        samples.sum("slotgate_build_info", &[("version", version)]),
        Some(1.0)
    );
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_virtual_memory_bytes",
        "process_start_time_seconds",
    ] {
        let value = samples
            .sum(name, &[])
            .unwrap_or_else(|| panic!("no {name}"));
        assert!(value > 0.0, "{name} = {value}");
    }
    assert!(samples.sum("process_cpu_seconds_total", &[]).is_some());
    gw.shutdown().await;
}

// === the access log ===

/// What the test subscriber wrote: the text format's lines and the JSON format's.
#[derive(Default)]
struct Captured {
    text: Mutex<Vec<u8>>,
    json: Mutex<Vec<u8>>,
}

/// A writer appending to one of [`Captured`]'s buffers.
struct Sink(Arc<Captured>, bool);

impl io::Write for Sink {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let buffer = if self.1 { &self.0.json } else { &self.0.text };
        buffer.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Installs (once per process) a subscriber writing the access log in both formats.
fn capture() -> Arc<Captured> {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    static CAPTURED: OnceLock<Arc<Captured>> = OnceLock::new();
    Arc::clone(CAPTURED.get_or_init(|| {
        let captured = Arc::new(Captured::default());
        let (text, json) = (Arc::clone(&captured), Arc::clone(&captured));
        let filter = || {
            tracing_subscriber::filter::Targets::new().with_target(
                "slotgate::access",
                tracing_subscriber::filter::LevelFilter::INFO,
            )
        };
        tracing_subscriber::registry()
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(false)
                    .with_writer(move || Sink(Arc::clone(&text), false))
                    .with_filter(filter()),
            )
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_writer(move || Sink(Arc::clone(&json), true))
                    .with_filter(filter()),
            )
            .try_init()
            .expect("the only subscriber of this test process");
        captured
    }))
}

impl Captured {
    /// The JSON lines of request `id`, their fields.
    fn json_lines(&self, id: &str) -> Vec<Value> {
        let json = self.json.lock().unwrap();
        String::from_utf8_lossy(&json)
            .lines()
            .map(|line| serde_json::from_str::<Value>(line).expect("a JSON line"))
            .filter(|line| line["target"] == "slotgate::access")
            .map(|line| line["fields"].clone())
            .filter(|fields| fields["request_id"] == id)
            .collect()
    }

    /// The one JSON line of request `id`, once it is written.
    async fn line(&self, id: &str) -> Value {
        support::eventually(&format!("the access line of {id}"), SOON, || {
            !self.json_lines(id).is_empty()
        })
        .await;
        let lines = self.json_lines(id);
        assert_eq!(lines.len(), 1, "one line per request: {lines:?}");
        lines[0].clone()
    }

    /// The text line of request `id`.
    fn text_line(&self, id: &str) -> String {
        let text = self.text.lock().unwrap();
        let lines: Vec<String> = String::from_utf8_lossy(&text)
            .lines()
            .filter(|line| line.contains(&format!("request_id=\"{id}\"")))
            .map(str::to_owned)
            .collect();
        assert_eq!(lines.len(), 1, "one text line for {id}: {lines:?}");
        lines[0].clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "four requests and their lines, checked in order"
)]
async fn every_request_leaves_one_access_line_in_text_and_json() {
    let captured = capture();
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server("api_keys = [{ key = \"sk-secret-123\", name = \"team-a\" }]"),
        upstream("gpu", &fake.url(), "qwen", 1, 0, "30s")
    ))
    .await;
    let addr = gw.api_addr();
    let auth = ("authorization", "Bearer sk-secret-123");

    // A 200.
    let reply = chat(addr, "qwen", false, &[auth, ("x-request-id", "ok-1")]).await;
    assert_eq!(reply.status, 200);
    let line = captured.line("ok-1").await;
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/v1/chat/completions");
    assert_eq!(line["model"], "qwen");
    assert_eq!(line["upstream"], "gpu");
    assert_eq!(line["status"], 200);
    assert_eq!(line["outcome"], "completed");
    assert_eq!(line["key_name"], "team-a");
    assert!(line["queue_wait_ms"].as_f64().unwrap() >= 0.0, "{line}");
    assert!(line["ttft_ms"].as_f64().unwrap() >= 0.0, "{line}");
    assert!(line["duration_ms"].as_f64().unwrap() >= line["ttft_ms"].as_f64().unwrap());
    let sent = support::chat_body("qwen", false).len();
    assert_eq!(line["bytes_in"], sent, "{line}");
    assert_eq!(line["bytes_out"], reply.body.len(), "{line}");
    let text = captured.text_line("ok-1");
    assert!(text.contains("slotgate::access"), "{text}");
    assert!(text.contains("outcome=\"completed\""), "{text}");

    // A 503: the one slot is taken and there is no queue.
    let holder = open(
        addr,
        post(
            addr,
            "/v1/chat/completions",
            support::chat_body("qwen", false),
            &[auth, ("x-fake-hold-ms", "1500"), ("x-request-id", "held-1")],
        ),
    )
    .await;
    fake.observer().wait_for_in_flight(1, SOON).await.unwrap();
    let reply = chat(addr, "qwen", false, &[auth, ("x-request-id", "full-1")]).await;
    reply.assert_problem(503, "queue-full");
    let line = captured.line("full-1").await;
    assert_eq!(line["status"], 503);
    assert_eq!(line["outcome"], "refused");
    assert_eq!(line["reason"], "queue_full");
    assert_eq!(line["model"], "qwen");
    assert!(line.get("upstream").is_none(), "none was chosen: {line}");
    let held = holder.head().await;
    assert_eq!(held.status, 200);
    drop(held);

    // A client that leaves while the engine works on its answer.
    let gone = open(
        addr,
        post(
            addr,
            "/v1/chat/completions",
            support::chat_body("qwen", false),
            &[auth, ("x-fake-hold-ms", "5000"), ("x-request-id", "gone-1")],
        ),
    )
    .await;
    support::eventually("gone-1 reaches the engine", SOON, || {
        fake.observer().snapshot().in_flight == 1
    })
    .await;
    gone.disconnect();
    let line = captured.line("gone-1").await;
    assert_eq!(line["outcome"], "client_gone");
    assert_eq!(line["upstream"], "gpu");
    assert!(line.get("status").is_none(), "no answer began: {line}");

    // A client that leaves mid-stream. The slot comes back once the engine notices.
    support::eventually("the slot is free again", PATIENT, || {
        gw.limiter()
            .in_flight(&support::authority(fake.addr()), "qwen")
            == 0
    })
    .await;
    let mut streaming = open(
        addr,
        post(
            addr,
            "/v1/chat/completions",
            support::chat_body("qwen", true),
            &[
                auth,
                ("x-fake-chunk-interval-ms", "200"),
                ("x-fake-tokens", "50"),
                ("x-request-id", "gone-2"),
            ],
        ),
    )
    .await
    .head()
    .await;
    assert_eq!(streaming.status, 200);
    let first = streaming.next_data().await.unwrap().unwrap();
    assert!(!first.is_empty());
    drop(streaming);
    let line = captured.line("gone-2").await;
    assert_eq!(line["outcome"], "client_gone");
    assert_eq!(line["status"], 200);
    assert!(line["bytes_out"].as_u64().unwrap() > 0, "{line}");

    // The key itself is never written.
    let all = String::from_utf8_lossy(&captured.json.lock().unwrap()).into_owned()
        + &String::from_utf8_lossy(&captured.text.lock().unwrap());
    assert!(!all.contains("sk-secret-123"));
    gw.shutdown().await;
    fake.shutdown().await;
}

/// A client that leaves while it sends its body has not been refused: its line says
/// `client_gone`, and `slotgate_rejections_total` does not count it as a `bad_request`. One
/// closes its write half after part of the body (it still reads: it gets a 400 that says the
/// body ended early), one closes the whole connection, and one resets its HTTP/2 stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_mid_body_is_client_gone_not_a_bad_request() {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    let captured = capture();
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 0, "30s")
    ))
    .await;
    let addr = gw.api_addr();
    let body = support::chat_body("qwen", false);
    let head = |id: &str| {
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nx-request-id: {id}\r\n\r\n",
            body.len() + 100
        )
    };

    // Half of the body, then the write half closed: the client still reads.
    let mut half = tokio::net::TcpStream::connect(addr).await.unwrap();
    half.write_all(head("half-1").as_bytes()).await.unwrap();
    half.write_all(&body.as_bytes()[..body.len() / 2])
        .await
        .unwrap();
    half.shutdown().await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(SOON, half.read_to_end(&mut answer))
        .await
        .expect("the gateway answers and closes")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer);
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(answer.contains("ended before"), "says why: {answer}");
    let line = captured.line("half-1").await;
    assert_eq!(line["outcome"], "client_gone", "{line}");
    assert!(line.get("reason").is_none(), "not a refusal: {line}");

    // Part of the body, then the whole connection closed.
    let mut gone = tokio::net::TcpStream::connect(addr).await.unwrap();
    gone.write_all(head("gone-body-1").as_bytes())
        .await
        .unwrap();
    gone.write_all(&body.as_bytes()[..10]).await.unwrap();
    drop(gone);
    let line = captured.line("gone-body-1").await;
    assert_eq!(line["outcome"], "client_gone", "{line}");

    // HTTP/2: part of the body, then the stream reset.
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (client, connection) = h2::client::handshake(tcp).await.unwrap();
    let connection = tokio::spawn(connection);
    let request = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header("x-request-id", "reset-body-1")
        .body(())
        .unwrap();
    let (_response, mut stream) = client
        .ready()
        .await
        .unwrap()
        .send_request(request, false)
        .unwrap();
    stream
        .send_data(bytes::Bytes::copy_from_slice(&body.as_bytes()[..10]), false)
        .unwrap();
    // Let the gateway read what came before the reset.
    tokio::time::sleep(Duration::from_millis(100)).await;
    stream.send_reset(h2::Reason::CANCEL);
    let line = captured.line("reset-body-1").await;
    assert_eq!(line["outcome"], "client_gone", "{line}");
    assert!(line.get("reason").is_none(), "not a refusal: {line}");
    connection.abort();

    let samples = scrape(gw.admin_addr().unwrap()).await;
    let refused = total(
        &samples,
        "slotgate_rejections_total",
        &[("reason", "bad_request")],
    );
    assert!(refused < 0.5, "nobody was refused: {refused}");
    assert_eq!(
        fake.observer().snapshot().received,
        0,
        "nothing reached the engine"
    );
    gw.shutdown().await;
    fake.shutdown().await;
}

/// Failover and the access log: a request whose retry found no other engine gets the first
/// engine's 503 as it came, and its line names that engine (not the one tried last), with the
/// outcome its status says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_answer_sent_after_all_is_logged_as_its_engines() {
    let captured = capture();
    let a = fake(2, "qwen").await;
    let b = fake(1, "qwen").await;
    let gw = gateway(&format!(
        "{}{}{}",
        server("health_check_interval = \"1h\"\neject_after_failures = 100"),
        upstream("a", &a.url(), "qwen", 2, 0, "30s"),
        upstream("b", &b.url(), "qwen", 1, 0, "30s")
    ))
    .await;
    let addr = gw.api_addr();
    // Healthy at the start-up check, gone now: the retry's connection to "b" is refused.
    b.shutdown().await;

    // "a" is ranked first and refuses with a 503, which the gateway holds while it tries "b".
    a.set_failures(vec![fake_upstream::Failure::Status(503)]);
    let reply = chat(addr, "qwen", false, &[("x-request-id", "held-1")]).await;
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(reply.headers["x-slotgate-upstream"], "a");
    let line = captured.line("held-1").await;
    assert_eq!(line["upstream"], "a", "{line}");
    assert_eq!(line["status"], 503, "{line}");
    assert_eq!(line["outcome"], "upstream_status_error", "{line}");
    assert_eq!(line["bytes_out"], reply.body.len(), "{line}");
    gw.shutdown().await;
    a.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_access_line_when_the_log_is_off() {
    let captured = capture();
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server("access_log = false"),
        upstream("gpu", &fake.url(), "qwen", 2, 4, "30s")
    ))
    .await;
    let reply = chat(gw.api_addr(), "qwen", false, &[("x-request-id", "quiet-1")]).await;
    assert_eq!(reply.status, 200);
    let reply = chat(gw.api_addr(), "nope", false, &[("x-request-id", "quiet-2")]).await;
    assert_eq!(reply.status, 404);
    gw.shutdown().await;
    fake.shutdown().await;
    assert!(captured.json_lines("quiet-1").is_empty());
    assert!(captured.json_lines("quiet-2").is_empty());
}

// === the dashboard ===

/// Every `slotgate_…` and `process_…` name in `text`.
fn metric_names(text: &str, into: &mut BTreeSet<String>) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let starts_word = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
        let rest = &text[i..];
        if starts_word && (rest.starts_with("slotgate_") || rest.starts_with("process_")) {
            let len = rest
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(rest.len());
            into.insert(rest[..len].to_owned());
            i += len;
        } else {
            i += 1;
        }
    }
}

/// Every string in a JSON document.
fn strings(value: &Value, into: &mut Vec<String>) {
    match value {
        Value::String(text) => into.push(text.clone()),
        Value::Array(items) => items.iter().for_each(|item| strings(item, into)),
        Value::Object(members) => members.values().for_each(|member| strings(member, into)),
        _ => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_queries_exists() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/grafana/slotgate.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .expect("the dashboard is JSON");
    assert!(
        dashboard["panels"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    );
    let mut texts = Vec::new();
    strings(&dashboard, &mut texts);
    let mut queried = BTreeSet::new();
    for text in &texts {
        metric_names(text, &mut queried);
    }
    for needed in [
        "slotgate_slots_in_use",
        "slotgate_slots_capacity",
        "slotgate_queue_depth",
        "slotgate_queue_wait_seconds_bucket",
        "slotgate_rejections_total",
        "slotgate_time_to_first_token_seconds_bucket",
        "slotgate_tokens_total",
        "slotgate_engine_busy",
    ] {
        assert!(queried.contains(needed), "the dashboard shows {needed}");
    }

    // A gateway that has served a request, and whose engine has told its busy count.
    let fake = fake(2, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server("health_check_interval = \"1s\""),
        upstream("gpu", &fake.url(), "qwen", 2, 4, "30s")
    ))
    .await;
    assert_eq!(chat(gw.api_addr(), "qwen", false, &[]).await.status, 200);
    let admin = gw.admin_addr().unwrap();
    let deadline = tokio::time::Instant::now() + PATIENT;
    loop {
        let text = get(admin, "/metrics").await.text();
        let exposed: BTreeSet<String> = Samples::parse(&text)
            .iter()
            .map(|sample| sample.name.clone())
            .collect();
        let missing: Vec<&String> = queried.difference(&exposed).collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the dashboard queries metrics /metrics does not have: {missing:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    gw.shutdown().await;
    fake.shutdown().await;
}
