//! Each API's clients get the gateway's refusals and stream endings in their own dialect
//! (issue #31), over real sockets against the fake engines: Anthropic's `error` object (inside
//! the problem document, and as a named `event: error` in a stream) with a `request-id` header,
//! Ollama's string `error` (as a body and as an NDJSON line), OpenAI's `error` member elsewhere.

mod support;

use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream};
use serde_json::{Value, json};
use slotgate_gateway::Gateway;
use support::{
    Open, authority, chat_body, eventually, fake, gateway, open, post, send, server, upstream,
};

const SOON: Duration = Duration::from_secs(10);

fn messages_body(model: &str, stream: bool) -> String {
    json!({
        "model": model,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": stream,
    })
    .to_string()
}

fn ollama_chat_body(model: &str, stream: bool) -> String {
    json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": stream,
    })
    .to_string()
}

async fn ollama_fake(model: &str) -> FakeUpstream {
    FakeUpstream::start(FakeConfig::ollama(4).model(model))
        .await
        .expect("fake Ollama starts")
}

fn ollama_upstream(url: &str, model: &str, parallel: usize, queue: usize) -> String {
    format!(
        "[upstreams.o]\nurl = \"{url}\"\nkind = \"ollama\"\n\n\
         [upstreams.o.models.{model}]\nparallel = {parallel}\nqueue = {queue}\n\
         queue_timeout = \"30s\"\n"
    )
}

/// The data of the SSE event named `error` in `text`, parsed; panics if there is none or it is
/// not the last event.
fn last_error_event(text: &str) -> Value {
    let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
    let data = last
        .strip_prefix("event: error\ndata: ")
        .unwrap_or_else(|| panic!("the last event is not a named error event: {text}"));
    serde_json::from_str(data).unwrap_or_else(|e| panic!("not JSON ({e}): {data}"))
}

/// A gateway in front of a fake llama-server serving "qwen" that gives up on a stream silent for
/// 300 ms (`upstream-stalled`), and the fake.
async fn stalling_gateway() -> (FakeUpstream, Gateway) {
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}[upstreams.gpu]\nurl = \"{}\"\nkind = \"llama-server\"\n\
         stream_idle_timeout = \"300ms\"\ncancel_grace = \"0s\"\n\n\
         [upstreams.gpu.models.qwen]\nparallel = 2\nqueue = 2\nqueue_timeout = \"30s\"\n",
        server(""),
        fake.url()
    ))
    .await;
    (fake, gw)
}

/// Streams `body` to `path` with the fake told to `fail` mid-stream; asserts the head is a 200
/// and the stream ends cleanly, and returns the head's headers, the request id and the whole
/// text.
async fn cut_stream(
    gw: &Gateway,
    path: &str,
    body: String,
    fail: &str,
) -> (http::HeaderMap, String, String) {
    let addr = gw.api_addr();
    let mut stream = open(addr, post(addr, path, body, &[("x-fake-fail", fail)]))
        .await
        .head()
        .await;
    assert_eq!(stream.status, 200, "{path} {fail}");
    let id = stream.headers["x-request-id"].to_str().unwrap().to_owned();
    let rest = stream.rest().await.expect("a clean end of the stream");
    let text = String::from_utf8_lossy(&rest).into_owned();
    (stream.headers, id, text)
}

/// Sends `body` to `path` with the fake told to hang: the request holds its slot until it is
/// dropped.
async fn hang(gw: &Gateway, path: &str, body: String) -> Open {
    let addr = gw.api_addr();
    open(addr, post(addr, path, body, &[("x-fake-fail", "hang")])).await
}

/// A gateway whose model "qwen" (on a fake llama-server) has one slot, taken by a request that
/// hangs, and `queue` places waiting at most `queue_timeout`; `extra` is added to the model's
/// table. The fake, the gateway and the request holding the slot.
async fn one_slot_held(
    queue: usize,
    queue_timeout: &str,
    extra: &str,
) -> (FakeUpstream, Gateway, Open) {
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}{extra}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, queue, queue_timeout)
    ))
    .await;
    let held = hang(&gw, "/v1/chat/completions", chat_body("qwen", false)).await;
    let key = authority(fake.addr());
    eventually("the slot taken", SOON, || {
        gw.limiter().in_flight(&key, "qwen") == 1
    })
    .await;
    (fake, gw, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_stream_that_stalls_ends_with_a_named_error_event() {
    let (fake, gw) = stalling_gateway().await;
    for fail in ["stall-after-chunks=3", "die-after-chunks=3"] {
        let (headers, id, text) =
            cut_stream(&gw, "/v1/messages", messages_body("qwen", true), fail).await;
        assert_eq!(headers["request-id"].to_str().unwrap(), id, "{fail}");
        let event = last_error_event(&text);
        assert_eq!(event["type"], "error", "{fail}: {event}");
        assert_eq!(event["error"]["type"], "timeout_error", "{fail}: {event}");
        assert_eq!(
            event["error"]["code"], "upstream_stalled",
            "{fail}: {event}"
        );
        assert!(event["error"]["message"].is_string(), "{event}");
        assert_eq!(event["request_id"], id.as_str(), "{event}");
        assert!(
            event["problem"]["type"]
                .as_str()
                .unwrap()
                .ends_with("/upstream-stalled"),
            "{event}"
        );
    }
    gw.shutdown().await;
    fake.shutdown().await;
}

/// OpenAI's Responses stream names every event after its `type`; OpenAI's own in-stream error
/// is `{"type":"error","code","message",…}` with no `error` member, which openai-python 3.57
/// yields as a `ResponseErrorEvent` and does not raise. The gateway's ending is a `data:` event
/// whose JSON has an `error` member, the one thing both OpenAI SDKs raise `APIError` at
/// (`_streaming.py` `Stream.__stream__`; `tests/api_sdk/check.py` sees it raised).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_stream_that_stalls_ends_with_the_error_event_the_openai_sdks_raise() {
    let (fake, gw) = stalling_gateway().await;
    let body = json!({"model": "qwen", "input": "hello there", "stream": true}).to_string();
    for fail in ["stall-after-chunks=3", "die-after-chunks=3"] {
        let (_, id, text) = cut_stream(&gw, "/v1/responses", body.clone(), fail).await;
        assert!(
            text.starts_with("event: response.created\n"),
            "{fail}: {text}"
        );
        let last = text.trim_end().rsplit("\n\n").next().unwrap_or_default();
        let data = last
            .strip_prefix("data: ")
            .unwrap_or_else(|| panic!("{fail}: the last event is no data event: {text}"));
        let doc: Value = serde_json::from_str(data).unwrap_or_else(|e| panic!("{e}: {data}"));
        assert_eq!(doc["error"]["code"], "upstream_stalled", "{fail}: {doc}");
        assert_eq!(doc["error"]["type"], "server_error", "{fail}: {doc}");
        assert!(doc["error"]["message"].is_string(), "{doc}");
        assert!(
            doc["type"].as_str().unwrap().ends_with("/upstream-stalled"),
            "{doc}"
        );
        assert_eq!(doc["request_id"], id.as_str(), "{doc}");
        assert!(!text.contains("response.completed"), "{fail}: {text}");
    }
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ollama_stream_that_dies_ends_with_a_string_error_line() {
    let o = ollama_fake("o").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        ollama_upstream(&o.url(), "o", 2, 2)
    ))
    .await;
    let (_, _, text) = cut_stream(
        &gw,
        "/api/chat",
        ollama_chat_body("o", true),
        "die-after-chunks=2",
    )
    .await;
    assert!(text.ends_with('\n'), "{text}");
    let lines: Vec<Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}")))
        .collect();
    assert_eq!(lines.len(), 3, "two lines, then the error: {text}");
    let last = &lines[2];
    assert!(last["error"].is_string(), "{last}");
    assert!(
        last["type"]
            .as_str()
            .unwrap()
            .ends_with("/upstream-stalled"),
        "{last}"
    );
    gw.shutdown().await;
    o.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_speak_the_routes_dialect() {
    let fake = fake(4, "qwen").await;
    let o = ollama_fake("o").await;
    let gw = gateway(&format!(
        "{}{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 0, "30s"),
        ollama_upstream(&o.url(), "o", 1, 0),
    ))
    .await;
    let addr = gw.api_addr();
    // Fill both models' only slot.
    let held = hang(&gw, "/v1/messages", messages_body("qwen", false)).await;
    let held_o = hang(&gw, "/api/chat", ollama_chat_body("o", false)).await;
    let (key, key_o) = (authority(fake.addr()), authority(o.addr()));
    eventually("both slots taken", SOON, || {
        gw.limiter().in_flight(&key, "qwen") == 1 && gw.limiter().in_flight(&key_o, "o") == 1
    })
    .await;

    // Anthropic: a problem document whose `error` is Anthropic's, `request-id` beside
    // `x-request-id`, 503 with `Retry-After`.
    let reply = send(post(
        addr,
        "/v1/messages",
        messages_body("qwen", false),
        &[],
    ))
    .await;
    let doc = reply.assert_problem(503, "queue-full");
    reply.retry_after();
    assert_eq!(doc["error"]["type"], "overloaded_error", "{doc}");
    assert_eq!(doc["error"]["code"], "queue_full", "{doc}");
    assert_eq!(doc["error"]["details"]["error_code"], "queue_full", "{doc}");
    assert_eq!(reply.headers["request-id"], reply.headers["x-request-id"]);
    assert_eq!(
        doc["request_id"],
        reply.headers["x-request-id"].to_str().unwrap()
    );

    // Ollama: `{"error": "<text>"}` as JSON, the problem's type and request id beside it.
    let reply = send(post(addr, "/api/chat", ollama_chat_body("o", false), &[])).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.headers["content-type"], "application/json");
    reply.retry_after();
    let doc = reply.json();
    assert!(doc["error"].is_string(), "{doc}");
    assert!(
        doc["type"].as_str().unwrap().ends_with("/queue-full"),
        "{doc}"
    );
    assert_eq!(
        doc["request_id"],
        reply.headers["x-request-id"].to_str().unwrap()
    );
    assert!(!reply.headers.contains_key("request-id"));
    // …unless the client asks for a problem document.
    let reply = send(post(
        addr,
        "/api/chat",
        ollama_chat_body("o", false),
        &[("accept", "application/problem+json")],
    ))
    .await;
    reply.assert_problem(503, "queue-full");

    // OpenAI routes: unchanged.
    let reply = send(post(
        addr,
        "/v1/chat/completions",
        chat_body("qwen", false),
        &[],
    ))
    .await;
    let doc = reply.assert_problem(503, "queue-full");
    assert_eq!(doc["error"]["type"], "server_error", "{doc}");
    assert!(!reply.headers.contains_key("request-id"));

    held.disconnect();
    held_o.disconnect();
    gw.shutdown().await;
    fake.shutdown().await;
    o.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_anthropic_stream_refused_ends_with_a_named_error_event() {
    let (fake, gw, held) = one_slot_held(8, "500ms", "queue_keepalive = \"1s\"\n").await;
    let addr = gw.api_addr();
    let mut queued = open(
        addr,
        post(addr, "/v1/messages", messages_body("qwen", true), &[]),
    )
    .await
    .head()
    .await;
    assert_eq!(queued.status, 200, "a keepalive stream answers at once");
    let rest = queued.rest().await.expect("a clean end of the stream");
    let text = String::from_utf8_lossy(&rest);
    let event = last_error_event(&text);
    assert_eq!(event["error"]["type"], "overloaded_error", "{event}");
    assert_eq!(event["error"]["code"], "queue_timeout", "{event}");
    assert!(
        event["problem"]["retry_after"].as_u64().is_some(),
        "{event}"
    );
    held.disconnect();
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ollamas_heartbeat_and_curl_bodies_are_answered_as_ollama_does() {
    let o = ollama_fake("o").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        ollama_upstream(&o.url(), "o", 2, 2)
    ))
    .await;
    let addr = gw.api_addr();
    // The CLI's heartbeat (`HEAD /`) and a browser's `GET /`.
    let reply = support::get(addr, "/").await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.text(), "Ollama is running");
    let head = http::Request::head(format!("http://{addr}/"))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let reply = send(head).await;
    assert_eq!(reply.status, 200);
    assert!(reply.body.is_empty());
    // The Ollama docs' `curl … -d '{…}'`: a form content type, read as JSON all the same.
    let curl = http::Request::post(format!("http://{addr}/api/generate"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            json!({"model": "o", "prompt": "hi", "stream": false}).to_string(),
        )))
        .unwrap();
    let reply = send(curl).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["done"], true);
    gw.shutdown().await;
    o.shutdown().await;

    // Without an Ollama upstream, `/` is no route.
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")
    ))
    .await;
    support::get(gw.api_addr(), "/")
        .await
        .assert_problem(404, "not-found");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropics_key_header_and_encoded_model_ids_are_understood() {
    let fake = FakeUpstream::start(FakeConfig::vllm(4).model("Qwen/Qwen2.5-7B-Instruct"))
        .await
        .expect("fake starts");
    let gw = gateway(&format!(
        "{}[upstreams.gpu]\nurl = \"{}\"\nkind = \"vllm\"\n\n\
         [upstreams.gpu.models.\"Qwen/Qwen2.5-7B-Instruct\"]\nparallel = 2\nqueue = 2\n\
         queue_timeout = \"30s\"\n",
        server("api_keys = [\"sk-one\"]\n"),
        fake.url()
    ))
    .await;
    let addr = gw.api_addr();
    let model = "Qwen/Qwen2.5-7B-Instruct";
    // Anthropic's `x-api-key`, as its SDKs and curl examples send it.
    let reply = send(post(
        addr,
        "/v1/messages",
        messages_body(model, false),
        &[("x-api-key", "sk-one")],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = send(post(
        addr,
        "/v1/messages",
        messages_body(model, false),
        &[("x-api-key", "sk-wrong")],
    ))
    .await;
    let doc = reply.assert_problem(401, "unauthorized");
    assert_eq!(doc["error"]["type"], "authentication_error", "{doc}");
    // `models.retrieve("Qwen/Qwen2.5-7B-Instruct")`: the SDKs send the slash as `%2F`.
    let get = |path: &str| {
        http::Request::get(format!("http://{addr}{path}"))
            .header("authorization", "Bearer sk-one")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    let reply = send(get("/v1/models/Qwen%2FQwen2.5-7B-Instruct")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["id"], model);
    let reply = send(get("/v1/models/Qwen%2FNope")).await;
    let doc = reply.assert_problem(404, "model-not-found");
    assert_eq!(doc["model"], "Qwen/Nope");
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_pythons_read_timeout_bounds_the_queue_wait() {
    let (fake, gw, held) = one_slot_held(4, "60s", "").await;
    let addr = gw.api_addr();
    // All openai-python 3.x sends for `timeout=0.5`.
    let reply = send(post(
        addr,
        "/v1/chat/completions",
        chat_body("qwen", false),
        &[("x-stainless-read-timeout", "0.5")],
    ))
    .await;
    let doc = reply.assert_problem(503, "queue-timeout");
    assert_eq!(doc["deadline"], "x-stainless-read-timeout", "{doc}");
    assert_eq!(doc["deadline_ms"], 500, "{doc}");
    held.disconnect();
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_answers_preflights_and_marks_every_answer_for_listed_origins() {
    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server("cors_origins = [\"https://app.example.com\"]\napi_keys = [\"sk-one\"]\n"),
        upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")
    ))
    .await;
    let addr = gw.api_addr();
    let preflight = |origin: &'static str| {
        http::Request::options(format!("http://{addr}/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap()
    };
    // Answered before authentication: browsers send no credentials on a preflight.
    let reply = send(preflight("https://app.example.com")).await;
    assert_eq!(reply.status, 204, "{}", reply.text());
    assert_eq!(
        reply.headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    assert_eq!(
        reply.headers["access-control-allow-headers"],
        "authorization, content-type"
    );
    // Another origin gets no CORS answer.
    let reply = send(preflight("https://evil.example")).await;
    assert!(!reply.headers.contains_key("access-control-allow-origin"));
    // The real request, and a refusal, both carry the headers.
    let ok = send(post(
        addr,
        "/v1/chat/completions",
        chat_body("qwen", false),
        &[
            ("origin", "https://app.example.com"),
            ("authorization", "Bearer sk-one"),
        ],
    ))
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(
        ok.headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    let refused = send(post(
        addr,
        "/v1/chat/completions",
        chat_body("qwen", false),
        &[("origin", "https://app.example.com")],
    ))
    .await;
    refused.assert_problem(401, "unauthorized");
    assert_eq!(
        refused.headers["access-control-allow-origin"],
        "https://app.example.com"
    );
    assert!(
        refused.headers["access-control-expose-headers"]
            .to_str()
            .unwrap()
            .contains("retry-after")
    );
    // The admin listener never answers CORS.
    let admin = gw.admin_addr().unwrap();
    let metrics = http::Request::get(format!("http://{admin}/metrics"))
        .header("origin", "https://app.example.com")
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let reply = send(metrics).await;
    assert!(!reply.headers.contains_key("access-control-allow-origin"));
    gw.shutdown().await;
    fake.shutdown().await;

    // Off by default: a preflight is an OPTIONS like any other.
    let fake = support::fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 2, 2, "30s")
    ))
    .await;
    let addr = gw.api_addr();
    let reply = send(
        http::Request::options(format!("http://{addr}/v1/chat/completions"))
            .header("origin", "https://app.example.com")
            .header("access-control-request-method", "POST")
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap(),
    )
    .await;
    reply.assert_problem(405, "method-not-allowed");
    assert!(!reply.headers.contains_key("access-control-allow-origin"));
    gw.shutdown().await;
    fake.shutdown().await;
}
