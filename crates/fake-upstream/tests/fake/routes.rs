//! The routes past chat, completions and embeddings (issue #14), each in its engine's shape:
//! OpenAI Responses (with per-instance memory), Anthropic Messages, Ollama's native API,
//! llama-server's native API, rerank and score, audio and images; each taking a slot like chat,
//! and each kind answering a route it does not serve with its own 404.

use std::fmt::Write as _;
use std::time::Duration;

use bytes::Bytes;
use fake_upstream::sse::{SseEvent, parse_events};
use fake_upstream::{FakeConfig, FakeUpstream};
use http::{HeaderMap, Method, Request};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};

use crate::support::{SOON, get, post, request, send, spawn_post, within};

/// POSTs JSON and reads the answer as text.
async fn post_text(
    addr: std::net::SocketAddr,
    path: &str,
    body: &Value,
) -> (u16, HeaderMap, String) {
    let response = send(addr, request(Method::POST, path, Some(body), &[])).await;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, String::from_utf8(bytes.to_vec()).unwrap())
}

/// The `type` of every JSON event of an SSE text.
fn event_types(text: &str) -> Vec<String> {
    parse_events(text)
        .iter()
        .map(|e| match e {
            SseEvent::Json(v) => v["type"].as_str().unwrap_or("?").to_owned(),
            other => format!("{other:?}"),
        })
        .collect()
}

fn content_type(headers: &HeaderMap) -> &str {
    headers.get("content-type").unwrap().to_str().unwrap()
}

#[tokio::test]
async fn responses_plain_and_streamed() {
    let fake = FakeUpstream::start(FakeConfig::vllm(2).tokens(3))
        .await
        .unwrap();
    let addr = fake.addr();
    let body = json!({"model": "fake-model", "input": "hello there"});
    let (status, _, answer) = post(addr, "/v1/responses", &body, &[]).await;
    assert_eq!(status, 200);
    assert!(answer["id"].as_str().unwrap().starts_with("resp_"));
    assert_eq!(answer["object"], "response");
    assert_eq!(answer["status"], "completed");
    assert_eq!(answer["output"][0]["type"], "message");
    assert_eq!(answer["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(answer["output"][0]["content"][0]["text"], "tok0 tok1 tok2");
    assert_eq!(answer["usage"]["output_tokens"], 3);

    let streamed = json!({"model": "fake-model", "input": "hi", "stream": true});
    let (status, headers, text) = post_text(addr, "/v1/responses", &streamed).await;
    assert_eq!(status, 200);
    assert!(content_type(&headers).starts_with("text/event-stream"));
    assert!(text.starts_with("event: response.created\ndata: "));
    assert_eq!(
        event_types(&text),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    assert!(!text.contains("[DONE]"), "no [DONE] in a Responses stream");
    let events = parse_events(&text);
    let last = events.last().unwrap().json().unwrap();
    assert_eq!(
        last["response"]["output"][0]["content"][0]["text"],
        "tok0 tok1 tok2"
    );
    assert_eq!(last["sequence_number"], 10);
    assert_eq!(fake.observer().snapshot().received, 2);
}

/// An error inside a Responses stream is OpenAI's `error` event (PROTOCOLS.md §8), numbered
/// after the events before it.
#[tokio::test]
async fn a_responses_stream_error_is_openais_error_event() {
    let fake = FakeUpstream::start(FakeConfig::vllm(2).tokens(3))
        .await
        .unwrap();
    let streamed = json!({"model": "fake-model", "input": "hi", "stream": true});
    let fail = [("x-fake-fail", "error-after-chunks=2")];
    let response = send(
        fake.addr(),
        request(Method::POST, "/v1/responses", Some(&streamed), &fail),
    )
    .await;
    assert_eq!(response.status(), 200);
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(bytes.to_vec()).unwrap();
    let last = text.trim_end().rsplit("\n\n").next().unwrap();
    let data = last.strip_prefix("event: error\ndata: ").expect(&text);
    let error: Value = serde_json::from_str(data).unwrap();
    assert_eq!(error["type"], "error");
    assert_eq!(error["code"], "server_error");
    assert!(error["message"].is_string());
    assert_eq!(error["param"], Value::Null);
    assert_eq!(error["sequence_number"], 2);
    assert!(
        error.get("error").is_none(),
        "OpenAI's event has no `error` member"
    );
}

#[tokio::test]
async fn responses_are_remembered_only_where_they_were_made() {
    let a = FakeUpstream::start(FakeConfig::vllm(2)).await.unwrap();
    let b = FakeUpstream::start(FakeConfig::vllm(2)).await.unwrap();
    let body = json!({"model": "fake-model", "input": "remember me"});
    let (_, _, created) = post(a.addr(), "/v1/responses", &body, &[]).await;
    let id = created["id"].as_str().unwrap().to_owned();

    let (status, _, found) = get(a.addr(), &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        serde_json::from_str::<Value>(&found).unwrap()["id"],
        id.as_str()
    );
    let (status, _, missing) = get(b.addr(), &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404, "another instance does not know it");
    let missing: Value = serde_json::from_str(&missing).unwrap();
    assert_eq!(
        missing["error"]["message"],
        format!("Response with id '{id}' not found.")
    );

    let follow = json!({"model": "fake-model", "input": "and then?", "previous_response_id": id});
    let (status, _, _) = post(b.addr(), "/v1/responses", &follow, &[]).await;
    assert_eq!(status, 404);
    let (status, _, next) = post(a.addr(), "/v1/responses", &follow, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(next["previous_response_id"], id.as_str());

    let (status, _, items) = get(a.addr(), &format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(status, 200);
    let items: Value = serde_json::from_str(&items).unwrap();
    assert_eq!(items["object"], "list");
    assert_eq!(items["data"][0]["content"][0]["text"], "remember me");
    let (status, _, _) = get(b.addr(), &format!("/v1/responses/{id}/input_items")).await;
    assert_eq!(status, 404);

    let (status, _, cancelled) = post(
        a.addr(),
        &format!("/v1/responses/{id}/cancel"),
        &json!({}),
        &[],
    )
    .await;
    assert_eq!((status, cancelled["id"].as_str()), (200, Some(id.as_str())));
    let (status, _, _) = post(
        b.addr(),
        &format!("/v1/responses/{id}/cancel"),
        &json!({}),
        &[],
    )
    .await;
    assert_eq!(status, 404);

    let delete = |addr| {
        send(
            addr,
            request(Method::DELETE, &format!("/v1/responses/{id}"), None, &[]),
        )
    };
    assert_eq!(delete(b.addr()).await.status(), 404);
    let deleted = delete(a.addr()).await;
    assert_eq!(deleted.status(), 200);
    let (status, _, _) = get(a.addr(), &format!("/v1/responses/{id}")).await;
    assert_eq!(status, 404, "deleted");
    // Only the creations ran inference; the look-ups took no slot.
    assert_eq!(a.observer().snapshot().received, 2);

    // llama-server's Responses API is stateless: no look-up route at all.
    let llama = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let (status, _, body) = get(llama.addr(), "/v1/responses/resp_x").await;
    assert_eq!(status, 404);
    assert!(body.contains("File Not Found"));
}

#[tokio::test]
async fn anthropic_messages_plain_streamed_and_counted() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(2))
        .await
        .unwrap();
    let addr = fake.addr();
    let body = json!({"model": "m", "max_tokens": 64,
                      "messages": [{"role": "user", "content": "hello world"}]});
    let (status, _, message) = post(addr, "/v1/messages", &body, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(message["type"], "message");
    assert_eq!(message["role"], "assistant");
    assert_eq!(message["content"][0]["text"], "tok0 tok1");
    assert_eq!(message["stop_reason"], "end_turn");
    assert_eq!(message["usage"]["output_tokens"], 2);

    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let (status, _, text) = post_text(addr, "/v1/messages", &streamed).await;
    assert_eq!(status, 200);
    assert!(text.starts_with("event: message_start\n"));
    assert_eq!(
        event_types(&text),
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop",
        ]
    );

    let (status, _, counted) = post(addr, "/v1/messages/count_tokens", &body, &[]).await;
    assert_eq!((status, counted["input_tokens"].as_u64()), (200, Some(2)));
    assert_eq!(
        fake.observer().snapshot().received,
        2,
        "counting takes no slot"
    );

    let (status, _, refused) = post(addr, "/v1/messages", &json!({"model": "m"}), &[]).await;
    assert_eq!(status, 400);
    assert_eq!(refused["type"], "error");
    assert_eq!(refused["error"]["type"], "invalid_request_error");

    // Ollama serves /v1/messages but not count_tokens.
    let ollama = FakeUpstream::start(FakeConfig::ollama(1)).await.unwrap();
    let mut body = body;
    body["model"] = json!("fake-model");
    let (status, _, _) = post(ollama.addr(), "/v1/messages", &body, &[]).await;
    assert_eq!(status, 200);
    let (status, _, text) = post_text(ollama.addr(), "/v1/messages/count_tokens", &body).await;
    assert_eq!((status, text.as_str()), (404, "404 page not found"));
}

#[tokio::test]
async fn ollama_native_chat_and_generate_stream_ndjson_by_default() {
    let fake = FakeUpstream::start(FakeConfig::ollama(1).model("llama3").tokens(3))
        .await
        .unwrap();
    let addr = fake.addr();
    let chat = json!({"model": "llama3", "messages": [{"role": "user", "content": "hi"}]});
    let (status, headers, text) = post_text(addr, "/api/chat", &chat).await;
    assert_eq!(status, 200);
    assert_eq!(content_type(&headers), "application/x-ndjson");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4, "three tokens and the done line");
    assert_eq!(lines[0]["message"]["content"], "tok0");
    assert_eq!(lines[0]["done"], false);
    assert_eq!(lines[3]["done"], true);
    assert_eq!(lines[3]["done_reason"], "stop");
    assert_eq!(lines[3]["eval_count"], 3);

    let mut plain = chat.clone();
    plain["stream"] = json!(false);
    let (status, _, answer) = post(addr, "/api/chat", &plain, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(answer["message"]["content"], "tok0 tok1 tok2");
    assert_eq!(answer["done"], true);

    let generate = json!({"model": "llama3", "prompt": "why", "stream": false,
                          "options": {"num_predict": 2}});
    let (_, _, answer) = post(addr, "/api/generate", &generate, &[]).await;
    assert_eq!(answer["response"], "tok0 tok1");
    assert_eq!(answer["done_reason"], "length");
    let (_, _, text) = post_text(
        addr,
        "/api/generate",
        &json!({"model": "llama3", "prompt": "x"}),
    )
    .await;
    assert_eq!(text.lines().count(), 4);

    let (_, _, embed) = post(
        addr,
        "/api/embed",
        &json!({"model": "llama3", "input": ["a", "b"]}),
        &[],
    )
    .await;
    assert_eq!(embed["embeddings"].as_array().unwrap().len(), 2);
    let (_, _, old) = post(
        addr,
        "/api/embeddings",
        &json!({"model": "llama3", "prompt": "a"}),
        &[],
    )
    .await;
    assert!(old["embedding"].is_array());

    let (status, _, shown) = post(addr, "/api/show", &json!({"model": "llama3"}), &[]).await;
    assert_eq!(status, 200);
    assert!(shown["capabilities"].is_array());
    let (status, _, missing) = post(addr, "/api/show", &json!({"model": "nope"}), &[]).await;
    assert_eq!(
        (status, missing),
        (404, json!({"error": "model 'nope' not found"}))
    );
    let (status, _, missing) = post(
        addr,
        "/api/chat",
        &json!({"model": "nope", "messages": []}),
        &[],
    )
    .await;
    assert_eq!(
        (status, missing),
        (404, json!({"error": "model 'nope' not found"}))
    );
    // 3 chats/generates streamed or not, 2 embeddings; show took no slot.
    assert_eq!(fake.observer().snapshot().received, 7);

    let llama = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let (status, _, body) = post(llama.addr(), "/api/chat", &chat, &[]).await;
    assert_eq!(
        (status, &body["error"]["message"]),
        (404, &json!("File Not Found"))
    );
}

#[tokio::test]
async fn llama_server_native_routes() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1).tokens(2))
        .await
        .unwrap();
    let addr = fake.addr();
    let (status, _, answer) = post(addr, "/completion", &json!({"prompt": "once upon"}), &[]).await;
    assert_eq!(status, 200);
    assert_eq!(answer["content"], "tok0 tok1");
    assert_eq!(answer["stop"], true);
    assert_eq!(answer["tokens_predicted"], 2);

    let (_, _, text) =
        post_text(addr, "/completion", &json!({"prompt": "x", "stream": true})).await;
    let events = parse_events(&text);
    assert_eq!(events.len(), 3);
    assert_eq!(events[0].json().unwrap()["stop"], false);
    assert_eq!(events[2].json().unwrap()["stop"], true);
    assert!(!text.contains("[DONE]"));

    let infill = json!({"input_prefix": "fn main() {", "input_suffix": "}"});
    let (status, _, answer) = post(addr, "/infill", &infill, &[]).await;
    assert_eq!((status, &answer["content"]), (200, &json!("tok0 tok1")));
    let (_, _, embedding) = post(addr, "/embedding", &json!({"content": "x"}), &[]).await;
    assert!(embedding[0]["embedding"][0].is_array());

    let (_, _, tokens) = post(addr, "/tokenize", &json!({"content": "a b c"}), &[]).await;
    assert_eq!(tokens["tokens"].as_array().unwrap().len(), 3);
    let (_, _, text) = post(addr, "/detokenize", &json!({"tokens": [1, 2]}), &[]).await;
    assert!(text["content"].is_string());
    let messages = json!({"messages": [{"role": "user", "content": "hi"}]});
    let (_, _, prompt) = post(addr, "/apply-template", &messages, &[]).await;
    assert!(prompt["prompt"].as_str().unwrap().contains("hi"));
    assert_eq!(
        fake.observer().snapshot().received,
        4,
        "the helpers take no slot"
    );

    let vllm = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    let (status, _, body) = post(vllm.addr(), "/infill", &infill, &[]).await;
    assert_eq!((status, body), (404, json!({"detail": "Not Found"})));
}

#[tokio::test]
async fn rerank_and_score_in_each_engines_shape() {
    let docs =
        json!({"model": "fake-model", "query": "q", "documents": ["a", "b", "c"], "top_n": 2});
    let llama = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    for path in ["/v1/rerank", "/rerank", "/v1/reranking"] {
        let (status, _, answer) = post(llama.addr(), path, &docs, &[]).await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(answer["object"], "list");
        assert_eq!(answer["results"].as_array().unwrap().len(), 2);
        assert!(answer["results"][0]["relevance_score"].is_number());
    }
    let (status, _, _) = post(llama.addr(), "/v1/score", &docs, &[]).await;
    assert_eq!(status, 404);

    let vllm = FakeUpstream::start(FakeConfig::vllm(1)).await.unwrap();
    let (status, _, answer) = post(vllm.addr(), "/v2/rerank", &docs, &[]).await;
    assert_eq!(status, 200);
    assert!(answer["id"].as_str().unwrap().starts_with("rerank-"));
    assert_eq!(answer["results"][0]["document"]["text"], "a");
    let score = json!({"model": "fake-model", "text_1": "q", "text_2": ["a", "b"]});
    let (status, _, answer) = post(vllm.addr(), "/v1/score", &score, &[]).await;
    assert_eq!(status, 200);
    assert_eq!(answer["data"].as_array().unwrap().len(), 2);
    assert_eq!(answer["data"][0]["object"], "score");
}

/// A multipart audio upload, as the OpenAI SDK sends it.
fn audio_form(path: &str, model: &str, format: Option<&str>) -> Request<Full<Bytes>> {
    let mut body =
        format!("--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\n{model}\r\n");
    if let Some(format) = format {
        let _ = write!(
            body,
            "--b\r\nContent-Disposition: form-data; name=\"response_format\"\r\n\r\n{format}\r\n"
        );
    }
    body.push_str(
        "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
         Content-Type: audio/wav\r\n\r\nRIFF....WAVE\r\n--b--\r\n",
    );
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("host", "127.0.0.1")
        .header("content-type", "multipart/form-data; boundary=b")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

#[tokio::test]
async fn audio_and_images() {
    let vllm = FakeUpstream::start(FakeConfig::vllm(1).tokens(2))
        .await
        .unwrap();
    let addr = vllm.addr();
    for path in ["/v1/audio/transcriptions", "/v1/audio/translations"] {
        let response = send(addr, audio_form(path, "fake-model", None)).await;
        assert_eq!(response.status(), 200, "{path}");
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(answer, json!({"text": "tok0 tok1"}));
    }
    let response = send(
        addr,
        audio_form("/v1/audio/transcriptions", "fake-model", Some("text")),
    )
    .await;
    assert!(content_type(response.headers()).starts_with("text/plain"));
    let records = vllm.observer().inference_requests();
    assert_eq!(
        records[0].model.as_deref(),
        Some("fake-model"),
        "read from the form"
    );

    let response = send(
        addr,
        request(
            Method::POST,
            "/v1/audio/speech",
            Some(&json!({"model": "fake-model", "input": "hi", "voice": "x"})),
            &[],
        ),
    )
    .await;
    assert_eq!(content_type(response.headers()), "audio/wav");
    let (status, _, images) = post(
        addr,
        "/v1/images/generations",
        &json!({"model": "fake-model", "prompt": "a cat"}),
        &[],
    )
    .await;
    assert_eq!(status, 200);
    assert!(images["data"][0]["b64_json"].is_string());

    // llama-server transcribes but does not translate.
    let llama = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let ok = send(
        llama.addr(),
        audio_form("/v1/audio/transcriptions", "m", None),
    )
    .await;
    assert_eq!(ok.status(), 200);
    let missing = send(
        llama.addr(),
        audio_form("/v1/audio/translations", "m", None),
    )
    .await;
    assert_eq!(missing.status(), 404);
}

/// Every inference route holds a slot while it runs, exactly like chat: with one slot, a
/// second request waits.
#[tokio::test]
async fn every_inference_route_takes_a_slot() {
    let cases: [(FakeConfig, &'static str, Value); 11] = [
        (
            FakeConfig::vllm(1),
            "/v1/responses",
            json!({"model": "fake-model", "input": "x"}),
        ),
        (
            FakeConfig::llama_server(1),
            "/v1/messages",
            json!({"model": "m", "max_tokens": 5, "messages": []}),
        ),
        (
            FakeConfig::ollama(1),
            "/api/chat",
            json!({"model": "fake-model", "messages": []}),
        ),
        (
            FakeConfig::ollama(1),
            "/api/generate",
            json!({"model": "fake-model", "prompt": "x"}),
        ),
        (
            FakeConfig::ollama(1),
            "/api/embed",
            json!({"model": "fake-model", "input": "x"}),
        ),
        (
            FakeConfig::llama_server(1),
            "/completion",
            json!({"prompt": "x"}),
        ),
        (
            FakeConfig::llama_server(1),
            "/infill",
            json!({"input_prefix": "x"}),
        ),
        (
            FakeConfig::llama_server(1),
            "/embedding",
            json!({"content": "x"}),
        ),
        (
            FakeConfig::llama_server(1),
            "/v1/rerank",
            json!({"query": "q", "documents": ["a"]}),
        ),
        (
            FakeConfig::vllm(1),
            "/v1/score",
            json!({"text_1": "a", "text_2": "b"}),
        ),
        (
            FakeConfig::vllm(1),
            "/v1/images/generations",
            json!({"prompt": "x"}),
        ),
    ];
    for (config, path, body) in cases {
        let fake = FakeUpstream::start(config).await.unwrap();
        let observer = fake.observer().clone();
        let hang = [("x-fake-fail", "hang")];
        let first = spawn_post(fake.addr(), path, body.clone(), &hang);
        within(path, observer.wait_for_in_flight(1, SOON))
            .await
            .unwrap();
        let second = spawn_post(fake.addr(), path, body, &hang);
        within(path, observer.wait_for_queued(1, SOON))
            .await
            .unwrap();
        assert_eq!(observer.peak_in_flight(), 1, "{path}");
        first.abort();
        second.abort();
        within(
            path,
            observer.wait_until("idle", SOON, |s| s.in_flight == 0 && s.queued == 0),
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
