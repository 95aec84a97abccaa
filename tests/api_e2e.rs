//! End-to-end tests of the engines' routes past chat (#14): the real gateway in-process, real
//! loopback sockets, `fake-upstream` behind it as each kind of engine.
//!
//! What is checked here: every route that runs inference is capped like chat (with
//! `parallel = 2` the engine never sees a third request), metadata routes answer while every
//! slot is taken, a route goes only to upstreams of a kind that serves it, and the refusals
//! (`route-not-served`, `route-disabled`, a model-less request with several models) are
//! problems.

mod support;

use std::net::SocketAddr;

use bytes::Bytes;
use fake_upstream::{FakeConfig, FakeUpstream};
use http::Request;
use http_body_util::Full;
use support::{
    SOON, eventually, gateway, gateway_with, get, open, post, replies, send, server, spawn_burst,
};

/// An `[upstreams.NAME]` table of `kind` with one model, `parallel` slots and a queue of 16,
/// plus `extra` lines in the upstream table.
fn upstream_of(
    kind: &str,
    name: &str,
    url: &str,
    model: &str,
    parallel: usize,
    extra: &str,
) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"{url}\"\nkind = \"{kind}\"\n{extra}\n\n\
         [upstreams.{name}.models.\"{model}\"]\nparallel = {parallel}\nqueue = 16\nqueue_timeout = \"30s\"\n"
    )
}

async fn start(config: FakeConfig) -> FakeUpstream {
    FakeUpstream::start(config)
        .await
        .expect("fake upstream starts")
}

/// A body every inference route of the fakes accepts: each route reads the members it needs.
fn body(model: Option<&str>) -> String {
    let mut body = serde_json::json!({
        "messages": [{"role": "user", "content": "hello"}],
        "prompt": "hello",
        "input": "hello",
        "input_prefix": "fn main() {",
        "input_suffix": "}",
        "content": "hello",
        "query": "which?",
        "documents": ["a", "b"],
        "text_1": "a",
        "text_2": "b",
        "max_tokens": 4,
        "stream": false,
    });
    if let Some(model) = model {
        body["model"] = model.into();
    }
    body.to_string()
}

/// Sends 5 requests to `path` at once, each holding its slot for a while, and checks that all
/// succeed and the engine never had more than 2 running.
async fn assert_capped(gw: SocketAddr, fake: &FakeUpstream, path: &str) {
    fake.observer().reset_peak();
    let tasks = spawn_burst(5, |i| {
        let path = path.to_owned();
        async move {
            let id = format!("cap{}-{i}", path.replace('/', "_"));
            send(post(
                gw,
                &path,
                body(Some("m")),
                &[("x-fake-hold-ms", "300"), ("x-request-id", &id)],
            ))
            .await
        }
    });
    for reply in replies(tasks).await {
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
    }
    assert_eq!(
        fake.observer().peak_in_flight(),
        2,
        "{path}: the engine saw exactly the cap"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_inference_route_is_capped_like_chat() {
    let routes: [(&str, FakeConfig, &[&str]); 3] = [
        (
            "llama-server",
            FakeConfig::llama_server(8),
            &[
                "/v1/responses",
                "/v1/messages",
                "/v1/rerank",
                "/rerank",
                "/v1/reranking",
                "/reranking",
                "/completion",
                "/infill",
                "/embedding",
                "/embeddings",
            ],
        ),
        (
            "vllm",
            FakeConfig::vllm(8),
            &[
                "/v1/responses",
                "/v1/messages",
                "/v2/rerank",
                "/v1/score",
                "/score",
                "/v1/audio/speech",
                "/v1/images/generations",
            ],
        ),
        (
            "ollama",
            FakeConfig::ollama(8),
            &[
                "/v1/responses",
                "/v1/messages",
                "/api/chat",
                "/api/generate",
                "/api/embed",
                "/api/embeddings",
            ],
        ),
    ];
    for (kind, config, paths) in routes {
        let fake = start(config.model("m")).await;
        let gw = gateway(&format!(
            "{}{}",
            server(""),
            upstream_of(kind, "engine", &fake.url(), "m", 2, "")
        ))
        .await;
        for path in paths {
            assert_capped(gw.api_addr(), &fake, path).await;
        }
        fake.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metadata_routes_answer_while_every_slot_is_busy() {
    let llama = start(FakeConfig::llama_server(4).model("m")).await;
    let ollama = start(FakeConfig::ollama(4).model("o")).await;
    let gw = gateway_with(
        "",
        &[
            upstream_of("llama-server", "llama", &llama.url(), "m", 1, ""),
            upstream_of("ollama", "ollama", &ollama.url(), "o", 1, ""),
        ],
    )
    .await;
    let addr = gw.api_addr();
    // Every slot taken, on both.
    let hung_completion = open(
        addr,
        post(
            addr,
            "/completion",
            body(Some("m")),
            &[("x-fake-fail", "hang")],
        ),
    )
    .await;
    let hung_chat = open(
        addr,
        post(
            addr,
            "/api/chat",
            body(Some("o")),
            &[("x-fake-fail", "hang")],
        ),
    )
    .await;
    eventually("both slots taken", SOON, || {
        llama.observer().in_flight() == 1 && ollama.observer().in_flight() == 1
    })
    .await;

    for path in [
        "/tokenize",
        "/detokenize",
        "/apply-template",
        "/v1/messages/count_tokens",
    ] {
        let reply = send(post(addr, path, body(Some("m")), &[])).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
    }
    // A llama-server native route without `model`: the only model it has.
    let reply = send(post(addr, "/tokenize", body(None), &[])).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let reply = send(post(addr, "/api/show", body(Some("o")), &[])).await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    let reply = get(addr, "/v1/models/m").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["id"], "m");
    get(addr, "/v1/models/nope")
        .await
        .assert_problem(404, "model-not-found");

    // The Ollama listings come from the routing table: Ollama's models only.
    let tags = get(addr, "/api/tags").await;
    assert_eq!(tags.status, 200, "{}", tags.text());
    assert_eq!(
        tags.json()["models"],
        serde_json::json!([{"name": "o", "model": "o"}])
    );
    let ps = get(addr, "/api/ps").await;
    assert_eq!(ps.status, 200, "{}", ps.text());
    let version = get(addr, "/api/version").await;
    assert_eq!(version.status, 200, "{}", version.text());
    assert!(version.json()["version"].is_string(), "{}", version.text());

    // None of that reached an inference slot.
    assert_eq!(llama.observer().peak_in_flight(), 1);
    assert_eq!(ollama.observer().peak_in_flight(), 1);
    hung_completion.disconnect();
    hung_chat.disconnect();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_goes_only_to_upstreams_of_a_kind_that_serves_it() {
    let llama = start(FakeConfig::llama_server(4).model("m")).await;
    let ollama = start(FakeConfig::ollama(4).model("m")).await;
    let gw = gateway_with(
        "",
        &[
            upstream_of("llama-server", "llama", &llama.url(), "m", 4, ""),
            upstream_of("ollama", "ollama", &ollama.url(), "m", 4, ""),
        ],
    )
    .await;
    let addr = gw.api_addr();
    for _ in 0..3 {
        let reply = send(post(addr, "/api/generate", body(Some("m")), &[])).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let reply = send(post(addr, "/infill", body(Some("m")), &[])).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let paths = |fake: &FakeUpstream| -> Vec<String> {
        fake.observer()
            .inference_requests()
            .into_iter()
            .map(|r| r.path)
            .collect()
    };
    assert_eq!(paths(&ollama), ["/api/generate"; 3]);
    assert_eq!(paths(&llama), ["/infill"; 3]);

    // No kind behind `m` serves vLLM's score.
    let problem = send(post(addr, "/v1/score", body(Some("m")), &[]))
        .await
        .assert_problem(404, "route-not-served");
    assert_eq!(problem["route"], "/v1/score");
    // Disk-changing routes are off unless an upstream allows them.
    send(post(addr, "/api/pull", body(Some("m")), &[]))
        .await
        .assert_ollama_error(403, "route-disabled");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_management_goes_only_where_allowed() {
    let closed = start(FakeConfig::ollama(4).model("m")).await;
    let open_one = start(FakeConfig::ollama(4).model("m")).await;
    let gw = gateway(&format!(
        "{}{}{}",
        server(""),
        upstream_of("ollama", "closed", &closed.url(), "m", 4, ""),
        upstream_of(
            "ollama",
            "open",
            &open_one.url(),
            "m",
            4,
            "allow_model_management = true"
        )
    ))
    .await;
    let addr = gw.api_addr();
    // Ollama's real methods and bodies (api/client.go): `DELETE /api/delete {"model"}`, `POST
    // /api/copy {"source","destination"}` routed by `source`.
    let delete = || {
        let mut req = post(addr, "/api/delete", body(Some("m")), &[]);
        *req.method_mut() = http::Method::DELETE;
        req
    };
    for _ in 0..3 {
        let reply = send(delete()).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let copy = serde_json::json!({"source": "m", "destination": "m-backup"}).to_string();
    let reply = send(post(addr, "/api/copy", copy, &[])).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // The old guesses are refused, each with a problem that says why.
    send(post(addr, "/api/delete", body(Some("m")), &[]))
        .await
        .assert_ollama_error(405, "method-not-allowed");
    let no_source = serde_json::json!({"model": "m"}).to_string();
    let problem = send(post(addr, "/api/copy", no_source, &[]))
        .await
        .assert_ollama_error(400, "bad-request");
    assert!(
        problem["detail"].as_str().unwrap().contains("source"),
        "{problem}"
    );
    let count = |fake: &FakeUpstream, method: &str, path: &str| {
        fake.observer()
            .requests()
            .iter()
            .filter(|r| r.path == path && r.method == method)
            .count()
    };
    assert_eq!(count(&open_one, "DELETE", "/api/delete"), 3);
    assert_eq!(count(&open_one, "POST", "/api/copy"), 1);
    assert_eq!(count(&closed, "DELETE", "/api/delete"), 0);
    assert_eq!(count(&closed, "POST", "/api/copy"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_less_native_request_needs_a_single_model() {
    let one = start(FakeConfig::llama_server(4).model("a")).await;
    let two = start(FakeConfig::llama_server(4).model("b")).await;
    let gw = gateway_with(
        "",
        &[
            upstream_of("llama-server", "one", &one.url(), "a", 4, ""),
            upstream_of("llama-server", "two", &two.url(), "b", 4, ""),
        ],
    )
    .await;
    let addr = gw.api_addr();
    let problem = send(post(addr, "/completion", body(None), &[]))
        .await
        .assert_problem(400, "bad-request");
    assert!(
        problem["detail"].as_str().unwrap().contains("model"),
        "{problem}"
    );
    // Naming it works.
    let reply = send(post(addr, "/completion", body(Some("b")), &[])).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(two.observer().inference_requests().len(), 1);
}

/// A transcription upload as the OpenAI SDK sends it: the file first, then `model`.
fn transcription(
    addr: SocketAddr,
    path: &str,
    model: &str,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut body = Vec::new();
    body.extend_from_slice(
        b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
          Content-Type: audio/wav\r\n\r\nRIFF\x00\x01\x02 name=\"model\"\r\n",
    );
    body.extend_from_slice(
        format!(
            "--b0undary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n\
             --b0undary--\r\n"
        )
        .as_bytes(),
    );
    let mut builder = Request::post(format!("http://{addr}{path}"))
        .header("content-type", "multipart/form-data; boundary=b0undary");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_is_routed_by_its_model_field_capped_and_renamed_for_an_alias() {
    let fake = start(FakeConfig::vllm(8).model("m")).await;
    let gw = gateway(&format!(
        "{}{}\n[aliases]\nwhisper = \"m\"\n",
        server("max_upload_bytes = 4096"),
        upstream_of("vllm", "engine", &fake.url(), "m", 2, "")
    ))
    .await;
    let addr = gw.api_addr();
    for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
        fake.observer().reset_peak();
        let tasks = spawn_burst(5, |i| {
            let id = format!("upload{}-{i}", path.replace('/', "_"));
            async move {
                // Through the alias: the engine must get its own name.
                send(transcription(
                    addr,
                    path,
                    "whisper",
                    &[("x-fake-hold-ms", "300"), ("x-request-id", &id)],
                ))
                .await
            }
        });
        for reply in replies(tasks).await {
            assert_eq!(reply.status, 200, "{path}: {}", reply.text());
            assert!(reply.json()["text"].is_string(), "{}", reply.text());
        }
        assert_eq!(fake.observer().peak_in_flight(), 2, "{path}");
    }
    let renamed = fake
        .observer()
        .request("upload_v1_audio_transcriptions-0")
        .expect("recorded");
    assert_eq!(renamed.model.as_deref(), Some("m"));

    // Its own limit, and a form is what it takes.
    let mut big = transcription(addr, "/v1/audio/transcriptions", "m", &[]);
    *big.body_mut() = Full::new(Bytes::from(vec![b'x'; 5000]));
    send(big).await.assert_problem(413, "body-too-large");
    send(post(addr, "/v1/audio/transcriptions", body(Some("m")), &[]))
        .await
        .assert_problem(400, "bad-request");
    // Ollama serves transcriptions but not translations.
    let ollama = start(FakeConfig::ollama(2).model("o")).await;
    let gw = gateway_with(
        "",
        &[upstream_of("ollama", "ollama", &ollama.url(), "o", 2, "")],
    )
    .await;
    let reply = send(transcription(
        gw.api_addr(),
        "/v1/audio/transcriptions",
        "o",
        &[],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    send(transcription(
        gw.api_addr(),
        "/v1/audio/translations",
        "o",
        &[],
    ))
    .await
    .assert_problem(404, "route-not-served");
}

/// The `id` of a Responses answer, JSON or SSE (the first `"id"` member is the response's).
fn response_id(text: &str) -> String {
    let at = text.find("\"id\":\"").expect("an id in the answer") + 6;
    text[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn responses_follow_ups_go_to_the_upstream_that_holds_the_response() {
    // Each fake remembers only its own responses: a follow-up anywhere else is a 404.
    let a = start(FakeConfig::vllm(4).model("m")).await;
    let b = start(FakeConfig::vllm(4).model("m")).await;
    let gw = gateway_with(
        "",
        &[
            upstream_of("vllm", "a", &a.url(), "m", 4, ""),
            upstream_of("vllm", "b", &b.url(), "m", 4, ""),
        ],
    )
    .await;
    let addr = gw.api_addr();
    let create = move |stream: bool, previous: Option<&str>| {
        let mut body = serde_json::json!({"model": "m", "input": "hello", "stream": stream});
        if let Some(previous) = previous {
            body["previous_response_id"] = previous.into();
        }
        post(
            addr,
            "/v1/responses",
            body.to_string(),
            &[("x-fake-hold-ms", "300")],
        )
    };
    // At once, so that both upstreams make some (the one with more free slots is chosen).
    let tasks: Vec<_> = [false, true, false, true, false, true, false, true]
        .into_iter()
        .map(|stream| tokio::spawn(send(create(stream, None))))
        .collect();
    let mut ids = Vec::new();
    for task in tasks {
        let reply = task.await.unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        ids.push(response_id(&reply.text()));
    }
    let made = |fake: &FakeUpstream| fake.observer().inference_requests().len();
    assert!(
        made(&a) > 0 && made(&b) > 0,
        "both upstreams made responses"
    );
    for id in &ids {
        for stream in [false, true] {
            let reply = send(create(stream, Some(id))).await;
            assert_eq!(reply.status, 200, "follow-up of {id}: {}", reply.text());
        }
        let reply = get(addr, &format!("/v1/responses/{id}")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["id"], id.as_str());
        // Issue #31: the routing headers on an answer by id too.
        let upstream = reply.headers["x-slotgate-upstream"].to_str().unwrap();
        assert!(upstream == "a" || upstream == "b", "{upstream}");
        assert_eq!(reply.headers["x-slotgate-queue-wait-ms"], "0");
        let reply = get(addr, &format!("/v1/responses/{id}/input_items")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }

    // Unknown and deleted ids are the gateway's 404, not another host's guess.
    let doc = send(create(false, Some("resp_unknown")))
        .await
        .assert_problem(404, "response-not-found");
    assert_eq!(doc["error"]["param"], "previous_response_id");
    let gone = &ids[0];
    let delete = http::Request::delete(format!("http://{addr}/v1/responses/{gone}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let deleted = send(delete).await;
    assert_eq!(deleted.status, 200);
    assert!(deleted.headers.contains_key("x-slotgate-upstream"));
    let doc = get(addr, &format!("/v1/responses/{gone}"))
        .await
        .assert_problem(404, "response-not-found");
    // Named in the path, not in a body member.
    assert!(doc["error"]["param"].is_null(), "{doc}");

    // Drained, the holder keeps its conversations: a clear 503, never the other host.
    let admin = gw.admin_addr().unwrap();
    let drain = http::Request::post(format!("http://{admin}/admin/upstreams/a/drain"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    assert_eq!(send(drain).await.status, 200);
    let before_b = made(&b);
    let mut refused = 0;
    for id in ids.iter().skip(1) {
        let reply = send(create(false, Some(id))).await;
        match reply.status.as_u16() {
            200 => {}
            503 => {
                let problem = reply.assert_problem(503, "response-upstream-unavailable");
                assert_eq!(problem["upstream"], "a");
                refused += 1;
            }
            other => panic!("{other}: {}", reply.text()),
        }
    }
    assert!(refused > 0, "some ids were a's");
    assert_eq!(
        made(&b) - before_b,
        ids.len() - 1 - refused,
        "b got only its own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::too_many_lines,
    reason = "one scenario over two engines, told in order"
)]
async fn one_client_name_reaches_each_engine_under_its_own_engine_model() {
    // The same model, called differently by each engine (#14, `engine_model`).
    let ollama = start(FakeConfig::ollama(4).model("qwen2.5:7b-instruct")).await;
    let vllm = start(FakeConfig::vllm(4).model("Qwen/Qwen2.5-7B-Instruct")).await;
    let with_engine_model = |kind: &str, name: &str, url: &str, engine: &str| {
        format!(
            "[upstreams.{name}]\nurl = \"{url}\"\nkind = \"{kind}\"\n\n\
             [upstreams.{name}.models.qwen]\nengine_model = \"{engine}\"\n\
             parallel = 2\nqueue = 16\nqueue_timeout = \"30s\"\n"
        )
    };
    let gw = gateway(&format!(
        "{}{}{}\n[aliases]\nchat = \"qwen\"\n",
        server("health_check_interval = \"100ms\""),
        with_engine_model("ollama", "o", &ollama.url(), "qwen2.5:7b-instruct"),
        with_engine_model("vllm", "v", &vllm.url(), "Qwen/Qwen2.5-7B-Instruct"),
    ))
    .await;
    let addr = gw.api_addr();
    let seen = |fake: &FakeUpstream, id: &str| fake.observer().request(id).and_then(|r| r.model);

    // A route only one kind serves lands there, under that engine's name.
    let reply = send(post(
        addr,
        "/api/chat",
        body(Some("qwen")),
        &[("x-request-id", "em-ollama")],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        seen(&ollama, "em-ollama").as_deref(),
        Some("qwen2.5:7b-instruct")
    );
    // Its answer names the model as the client did.
    let text = reply.text();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert!(!lines.is_empty(), "{text}");
    for line in &lines {
        assert_eq!(line["model"], "qwen", "{text}");
    }
    let reply = send(post(
        addr,
        "/v1/score",
        body(Some("qwen")),
        &[("x-request-id", "em-vllm")],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        seen(&vllm, "em-vllm").as_deref(),
        Some("Qwen/Qwen2.5-7B-Instruct")
    );
    // A shared route, through an alias: whichever engine got each, it got its own name.
    for i in 0..6 {
        let id = format!("em-chat-{i}");
        let reply = send(post(
            addr,
            "/v1/chat/completions",
            body(Some("chat")),
            &[("x-request-id", &id)],
        ))
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["model"], "chat", "the alias comes back");
        let names = (seen(&ollama, &id), seen(&vllm, &id));
        assert!(
            matches!(
                (names.0.as_deref(), names.1.as_deref()),
                (Some("qwen2.5:7b-instruct"), None) | (None, Some("Qwen/Qwen2.5-7B-Instruct"))
            ),
            "{id}: {names:?}"
        );
    }

    // Streamed: every SSE event names the alias, whichever engine answered.
    for i in 0..4 {
        let mut streamed: serde_json::Value = serde_json::from_str(&body(Some("chat"))).unwrap();
        streamed["stream"] = serde_json::Value::Bool(true);
        let reply = send(post(
            addr,
            "/v1/chat/completions",
            streamed.to_string(),
            &[("x-request-id", &format!("em-sse-{i}"))],
        ))
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let text = reply.text();
        let events: Vec<serde_json::Value> = text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter(|data| *data != "[DONE]")
            .map(|data| serde_json::from_str(data).unwrap())
            .collect();
        assert!(events.len() > 1, "{text}");
        for event in &events {
            assert_eq!(event["model"], "chat", "{text}");
        }
    }

    // Clients see their own name; residency is asked by the engine's (Ollama lists
    // `qwen2.5:7b-instruct` as running, and that makes `qwen` running here).
    let models = get(addr, "/v1/models").await.json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, ["chat", "qwen"], "{models}");
    let deadline = tokio::time::Instant::now() + SOON;
    loop {
        let ps = get(addr, "/api/ps").await.json();
        if ps["models"]
            == serde_json::json!([{"name": "chat", "model": "chat"}, {"name": "qwen", "model": "qwen"}])
        {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "qwen never showed as running: {ps}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    gw.shutdown().await;
    ollama.shutdown().await;
    vllm.shutdown().await;
}

/// Sends only a request head declaring a `Content-Length` of `declared` bytes to `path`, and
/// reads the answer the gateway gives before any of the body is sent: (head, body).
async fn declared_only(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    declared: usize,
) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: {content_type}\r\n\
         content-length: {declared}\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    let mut got = Vec::new();
    let read = async {
        let mut chunk = [0_u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.unwrap();
            got.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&got);
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(str::to_owned)
                    })
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .expect("a content-length on the answer");
                if body.len() >= length {
                    return (head.to_owned(), body[..length].to_owned());
                }
            }
            assert!(n > 0, "closed before a whole answer: {text}");
        }
    };
    tokio::time::timeout(SOON, read)
        .await
        .expect("an answer before the body")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_bodies_may_be_32_mib_and_larger_ones_get_a_413_problem() {
    let fake = start(FakeConfig::llama_server(4).model("m")).await;
    let gw = gateway_with(
        "",
        &[upstream_of(
            "llama-server",
            "llama",
            &fake.url(),
            "m",
            2,
            "",
        )],
    )
    .await;
    let addr = gw.api_addr();
    // A vision request above the old 4 MiB default: 6 MiB of base64 "image" goes through.
    let image = "A".repeat(6 << 20);
    let vision = serde_json::json!({
        "model": "m",
        "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{image}")}},
        ]}],
    })
    .to_string();
    let reply = send(post(
        addr,
        "/v1/chat/completions",
        vision,
        &[("x-request-id", "vision")],
    ))
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(fake.observer().request("vision").is_some());

    // Past the limit, on every kind of route: refused from the declared length, before a byte
    // of the body, as a problem document naming the limit in force.
    for (path, content_type, limit) in [
        ("/v1/chat/completions", "application/json", 32 << 20),
        ("/completion", "application/json", 32 << 20),
        (
            "/v1/audio/transcriptions",
            "multipart/form-data; boundary=x",
            25 << 20,
        ),
    ] {
        let (head, body) = declared_only(addr, path, content_type, limit + 1).await;
        assert!(head.starts_with("HTTP/1.1 413"), "{path}: {head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("content-type: application/problem+json"),
            "{path}: {head}"
        );
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(
            doc["type"], "https://slotgate.dev/problems/body-too-large",
            "{doc}"
        );
        assert_eq!(doc["limit_bytes"], limit, "{path}: {doc}");
    }
    // None of the refused ones reached the engine.
    assert_eq!(fake.observer().inference_requests().len(), 1);
    gw.shutdown().await;
    fake.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_draws_on_the_shared_body_budget() {
    let fake = start(FakeConfig::vllm(4).model("m")).await;
    let gw = gateway(&format!(
        "{}{}",
        server(
            "max_body_bytes = 4096\nmax_upload_bytes = 4096\nmax_buffered_body_bytes = 4096\n\
             body_read_timeout = \"30s\""
        ),
        upstream_of("vllm", "engine", &fake.url(), "m", 2, "")
    ))
    .await;
    let addr = gw.api_addr();
    // Under the budget: through.
    let reply = send(transcription(addr, "/v1/audio/transcriptions", "m", &[])).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // A JSON body declared at 3000 bytes holds that much of the budget from its head on.
    let mut holder = tokio::net::TcpStream::connect(addr).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut holder,
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\n\
          Content-Type: application/json\r\nContent-Length: 3000\r\n\r\n{",
    )
    .await
    .unwrap();
    // Within the upload limit but past what is left of the budget: refused, the engine never
    // asked.
    let big = || {
        let mut big = transcription(addr, "/v1/audio/transcriptions", "m", &[]);
        let mut bytes = b"--b0undary\r\nContent-Disposition: form-data; name=\"file\"; \
                          filename=\"a.wav\"\r\n\r\n"
            .to_vec();
        bytes.extend_from_slice(&[b'x'; 2000]);
        bytes.extend_from_slice(
            b"\r\n--b0undary\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n\
              --b0undary--\r\n",
        );
        *big.body_mut() = Full::new(Bytes::from(bytes));
        big
    };
    // The holder's head may not have been read yet: the refusal comes once it has.
    let mut reply = send(big()).await;
    for _ in 0..100 {
        if reply.status == 503 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        reply = send(big()).await;
    }
    reply.assert_problem(503, "overloaded");
    assert_eq!(fake.observer().inference_requests().len(), 1);
    // The holder gone, its bytes come back and the same upload goes through.
    drop(holder);
    let mut status = 0;
    for _ in 0..100 {
        status = send(big()).await.status.as_u16();
        if status == 200 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(status, 200, "the budget came back once the holder left");
    assert_eq!(fake.observer().inference_requests().len(), 2);
    gw.shutdown().await;
    fake.shutdown().await;
}
