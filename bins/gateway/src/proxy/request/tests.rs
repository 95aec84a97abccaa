//! Unit tests for reading and understanding a request body.

use bytes::Bytes;
use http::Request;
use http_body_util::Full;

use super::{BodyBudget, BodyLimits};
use crate::metrics::Metrics;
use crate::proxy::endpoint::Endpoint;
use crate::proxy::problems::{BadRequest, Error};
use crate::proxy::request::ApiRequest;
use crate::proxy::request::prompt::Shape;

fn chat() -> &'static Endpoint {
    Endpoint::find("/v1/chat/completions").unwrap()
}

/// Reads `req` as a chat completion under `limit`, with a roomy budget and deadline.
async fn read(req: Request<Full<Bytes>>, limit: usize) -> Result<ApiRequest, Error> {
    read_for(req, limit, chat()).await
}

/// Reads `req` for `endpoint` under `limit`, with a roomy budget and deadline.
async fn read_for(
    req: Request<Full<Bytes>>,
    limit: usize,
    endpoint: &Endpoint,
) -> Result<ApiRequest, Error> {
    let budget = BodyBudget::new(1 << 20, &Metrics::new());
    super::read(
        req,
        BodyLimits {
            max_bytes: limit,
            timeout: std::time::Duration::from_secs(5),
            budget: &budget,
        },
        endpoint,
    )
    .await
}

fn post(content_type: Option<&str>, body: &'static str) -> Request<Full<Bytes>> {
    let mut builder = Request::post("/v1/chat/completions");
    if let Some(ct) = content_type {
        builder = builder.header("content-type", ct);
    }
    builder
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

fn post_bytes(body: Bytes) -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(body))
        .unwrap()
}

#[tokio::test]
async fn finds_model_and_stream_and_keeps_the_bytes() {
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"model":"qwen","temperature":0.70,"stream":true}"#;
    let req = read(post(Some("application/json"), body), 1024)
        .await
        .unwrap();
    assert_eq!(req.model.as_deref(), Some("qwen"));
    assert!(req.stream);
    assert_eq!(req.body, Bytes::from_static(body.as_bytes()));
    // Same name upstream: the very same bytes (0.70 not renormalised to 0.7).
    assert_eq!(req.body_for("qwen"), req.body);
}

#[tokio::test]
async fn stream_defaults_to_false_and_accepts_null() {
    let req = read(
        post(Some("Application/JSON; charset=utf-8"), r#"{"model":"m"}"#),
        64,
    )
    .await
    .unwrap();
    assert!(!req.stream);
    let req = read(
        post(Some("application/json"), r#"{"model":"m","stream":null}"#),
        64,
    )
    .await
    .unwrap();
    assert!(!req.stream);
}

#[tokio::test]
async fn unescapes_the_model_and_rewrites_only_its_value() {
    let body = r#" { "a": 1, "model" : "fa\u0073t", "b": [1, 2] } "#;
    let req = read(post(Some("application/json"), body), 1024)
        .await
        .unwrap();
    assert_eq!(req.model.as_deref(), Some("fast"));
    let rewritten = req.body_for("llama-3.1-8b \"q4\"");
    assert_eq!(
        std::str::from_utf8(&rewritten).unwrap(),
        r#" { "a": 1, "model" : "llama-3.1-8b \"q4\"", "b": [1, 2] } "#
    );
    let value: serde_json::Value = serde_json::from_slice(&rewritten).unwrap();
    assert_eq!(value["model"], "llama-3.1-8b \"q4\"");
}

#[tokio::test]
async fn refuses_what_is_not_json() {
    let err = read(post(None, r#"{"model":"m"}"#), 64).await.unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedMediaType { got: None }),
        "{err:?}"
    );
    let err = read(post(Some("text/plain"), r#"{"model":"m"}"#), 64)
        .await
        .unwrap_err();
    assert!(
        matches!(err, Error::UnsupportedMediaType { got: Some(_) }),
        "{err:?}"
    );
    let err = read(post(Some("application/jsonx"), r#"{"model":"m"}"#), 64)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::UnsupportedMediaType { .. }), "{err:?}");
}

#[tokio::test]
async fn ollama_routes_read_json_whatever_the_content_type() {
    let generate = Endpoint::find("/api/generate").unwrap();
    for content_type in [None, Some("application/x-www-form-urlencoded")] {
        let req = read_for(post(content_type, r#"{"model":"m"}"#), 64, generate)
            .await
            .unwrap();
        assert_eq!(req.model.as_deref(), Some("m"), "{content_type:?}");
    }
    // Still JSON, still under the limit.
    let err = read_for(post(None, "model=m"), 64, generate)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
    let err = read_for(
        post(None, r#"{"model":"mmmmmmmmmmmmmmmmmmmm"}"#),
        8,
        generate,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::BodyTooLarge { .. }), "{err:?}");
}

#[tokio::test]
async fn refuses_bodies_over_the_limit() {
    // Declared too large: refused before reading.
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .header("content-length", "100000")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let err = read(req, 1000).await.unwrap_err();
    assert!(
        matches!(err, Error::BodyTooLarge { limit: 1000 }),
        "{err:?}"
    );
    // Undeclared, but grows past the limit.
    let err = read(
        post(Some("application/json"), r#"{"model":"mmmmmmmmmmmmm"}"#),
        10,
    )
    .await
    .unwrap_err();
    assert!(matches!(err, Error::BodyTooLarge { limit: 10 }), "{err:?}");
}

#[tokio::test]
async fn refuses_bad_bodies_with_400() {
    for body in [
        "",
        "not json",
        "[\"m\", true]",
        r#"{"model":"m""#,
        r#"{"messages":[]}"#,
        r#"{"model":42}"#,
        r#"{"model":null}"#,
        r#"{"model":""}"#,
        r#"{"model":"m","stream":"yes"}"#,
        r#"{"model":"a","model":"b"}"#,
        r#"{"model":"m"} trailing"#,
    ] {
        let err = read(post(Some("application/json"), body), 1024)
            .await
            .unwrap_err();
        assert!(matches!(err, Error::BadRequest(_)), "{body:?} gave {err:?}");
    }
    let req = Request::post("/v1/completions")
        .header("content-type", "application/json")
        .header("content-length", "ten")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    assert!(matches!(
        read(req, 100).await.unwrap_err(),
        Error::BadRequest(_)
    ));
}

mod properties {
    use bytes::Bytes;
    use proptest::prelude::*;

    use super::super::parse;
    use super::{chat, post_bytes, read};

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap()
            .block_on(future)
    }

    proptest! {
        /// Any bytes at all: an answer or a refusal, never a panic.
        #[test]
        fn any_body_is_read_or_refused(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = parse(&body, chat());
            let _ = block_on(read(post_bytes(Bytes::from(body)), 128));
        }

        /// Renaming the model changes that value and nothing else.
        #[test]
        fn renaming_the_model_keeps_every_other_member(
            model in "[a-zA-Z0-9:._/-]{1,20}",
            upstream in "\\PC{0,20}",
            // Two letters at least: `n` is a count the gateway checks (any integer is no `n`).
            extra in proptest::collection::btree_map("[a-z]{2,8}", any::<i64>(), 0..5),
            spaces in "[ \n\t]{0,3}",
        ) {
            let mut object = serde_json::Map::new();
            for (key, value) in &extra {
                object.insert(key.clone(), (*value).into());
            }
            object.insert("model".into(), model.clone().into());
            let text = format!("{spaces}{}{spaces}", serde_json::Value::Object(object.clone()));
            let req = block_on(read(post_bytes(Bytes::from(text.clone())), 4096)).unwrap();
            prop_assert_eq!(req.model.as_deref(), Some(model.as_str()));
            prop_assert_eq!(req.body_for(&model), Bytes::from(text));
            let renamed: serde_json::Value = serde_json::from_slice(&req.body_for(&upstream)).unwrap();
            object.insert("model".into(), upstream.clone().into());
            prop_assert_eq!(renamed, serde_json::Value::Object(object));
        }
    }
}

/// A body whose client never sends another byte.
struct Silent;

impl http_body::Body for Silent {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        std::task::Poll::Pending
    }
}

#[tokio::test(start_paused = true)]
async fn a_body_not_complete_within_the_deadline_is_a_body_timeout() {
    let metrics = Metrics::new();
    let budget = BodyBudget::new(1 << 20, &metrics);
    let req = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("content-length", "100")
        .body(Silent)
        .unwrap();
    let limits = BodyLimits {
        max_bytes: 1024,
        timeout: std::time::Duration::from_secs(30),
        budget: &budget,
    };
    let started = tokio::time::Instant::now();
    let err = super::read(req, limits, chat()).await.unwrap_err();
    assert!(
        matches!(err, Error::BodyTimeout { after } if after.as_secs() == 30),
        "{err:?}"
    );
    assert_eq!(started.elapsed().as_secs(), 30);
    assert_eq!(
        budget.in_use(),
        0,
        "the declared bytes went back to the budget"
    );
    assert_eq!(budget.timed_out.get(), 1);
}

#[tokio::test]
async fn the_budget_is_shared_and_given_back_when_the_request_is_dropped() {
    let metrics = Metrics::new();
    let budget = BodyBudget::new(100, &metrics);
    let limits = BodyLimits {
        max_bytes: 1024,
        timeout: std::time::Duration::from_secs(5),
        budget: &budget,
    };
    let body = |len: usize| {
        let text = format!(r#"{{"model":"m","pad":"{}"}}"#, "x".repeat(len - 22));
        assert_eq!(text.len(), len);
        Bytes::from(text)
    };
    // Declared: taken up front.
    let declared = Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .header("content-length", "80")
        .body(Full::new(body(80)))
        .unwrap();
    let first = super::read(declared, limits, chat()).await.unwrap();
    assert_eq!(budget.in_use(), 80);
    // Chunked (no length): refused once it would overdraw.
    let err = super::read(post_bytes(body(40)), limits, chat())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Overloaded { budget: 100 }), "{err:?}");
    assert_eq!(budget.spent.get(), 1);
    assert_eq!(budget.in_use(), 80, "the refused body gave its bytes back");
    drop(first);
    assert_eq!(budget.in_use(), 0);
    let second = super::read(post_bytes(body(40)), limits, chat())
        .await
        .unwrap();
    assert_eq!((second.model.as_deref(), budget.in_use()), (Some("m"), 40));
}

fn json_post(path: &'static str, body: &'static str) -> Request<Full<Bytes>> {
    Request::post(path)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap()
}

#[tokio::test]
async fn a_native_llama_server_route_may_name_no_model() {
    let infill = Endpoint::find("/infill").unwrap();
    let body = r#"{"input_prefix":"fn main() {","input_suffix":"}"}"#;
    let req = read_for(json_post("/infill", body), 1024, infill)
        .await
        .unwrap();
    assert_eq!(req.model, None);
    // Nothing to rename: the body goes as it came.
    assert_eq!(req.body_for("qwen"), Bytes::from_static(body.as_bytes()));
    // A chat completion still needs one.
    let err = read(json_post("/v1/chat/completions", body), 1024)
        .await
        .unwrap_err();
    assert!(matches!(err, Error::BadRequest(_)), "{err:?}");
}

#[tokio::test]
async fn ollama_chat_and_generate_stream_unless_told_not_to() {
    let chat = Endpoint::find("/api/chat").unwrap();
    let req = read_for(json_post("/api/chat", r#"{"model":"m"}"#), 64, chat)
        .await
        .unwrap();
    assert!(req.stream);
    let req = read_for(
        json_post("/api/chat", r#"{"model":"m","stream":false}"#),
        64,
        chat,
    )
    .await
    .unwrap();
    assert!(!req.stream);
    let embed = Endpoint::find("/api/embed").unwrap();
    let req = read_for(json_post("/api/embed", r#"{"model":"m"}"#), 64, embed)
        .await
        .unwrap();
    assert!(!req.stream);
}

#[tokio::test]
async fn weighs_n_on_chat_max_of_n_and_best_of_on_completions_and_one_elsewhere() {
    let json = Some("application/json");
    let sequences = |endpoint: &'static str, body: &'static str| async move {
        read_for(post(json, body), 1024, Endpoint::find(endpoint).unwrap())
            .await
            .map(|req| req.sequences)
    };
    let chat = "/v1/chat/completions";
    let completions = "/v1/completions";
    assert_eq!(sequences(chat, r#"{"model":"m"}"#).await.unwrap(), 1);
    assert_eq!(
        sequences(chat, r#"{"model":"m","n":null}"#).await.unwrap(),
        1
    );
    assert_eq!(sequences(chat, r#"{"model":"m","n":3}"#).await.unwrap(), 3);
    // `best_of` is not a chat member: left to the engine.
    assert_eq!(
        sequences(chat, r#"{"model":"m","best_of":5}"#)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        sequences(completions, r#"{"model":"m","n":2,"best_of":5}"#)
            .await
            .unwrap(),
        5
    );
    assert_eq!(
        sequences(completions, r#"{"model":"m","n":4,"best_of":1}"#)
            .await
            .unwrap(),
        4
    );
    // Embeddings count one, whatever they carry.
    assert_eq!(
        sequences(
            "/v1/embeddings",
            r#"{"model":"m","input":["a","b"],"n":"x"}"#
        )
        .await
        .unwrap(),
        1
    );
    for bad in [
        r#"{"model":"m","n":0}"#,
        r#"{"model":"m","n":"2"}"#,
        r#"{"model":"m","n":2.5}"#,
    ] {
        assert!(
            matches!(
                sequences(chat, bad).await,
                Err(Error::BadRequest(BadRequest::Count { member: "n" }))
            ),
            "{bad}"
        );
    }
    assert!(matches!(
        sequences(completions, r#"{"model":"m","best_of":-1}"#).await,
        Err(Error::BadRequest(BadRequest::Count { member: "best_of" }))
    ));
}

/// The prompt pieces `body` gives on `path`, as text.
async fn pieces(path: &'static str, body: &'static str) -> (Vec<(String, Shape)>, Option<String>) {
    let endpoint = Endpoint::find(path).unwrap();
    let api = read_for(json_post(path, body), 1 << 16, endpoint)
        .await
        .unwrap();
    let text = |range: std::ops::Range<usize>| String::from_utf8(api.body[range].to_vec()).unwrap();
    let pieces = api
        .prompt
        .pieces
        .iter()
        .map(|(range, shape)| (text(range.clone()), *shape))
        .collect();
    (pieces, api.prompt.user.clone().map(text))
}

#[tokio::test]
async fn the_prompt_is_found_in_the_engines_reading_order() {
    use Shape::{Elements, Message, Text};
    let (chat, user) = pieces(
        "/v1/chat/completions",
        r#"{"model":"m","user":"u-1","messages":[{"role":"system","content":"be brief"}, {"role":"user","content":"hi"}]}"#,
    )
    .await;
    assert_eq!(
        chat,
        [
            (
                r#"{"role":"system","content":"be brief"}"#.to_owned(),
                Message
            ),
            (r#"{"role":"user","content":"hi"}"#.to_owned(), Message),
        ]
    );
    assert_eq!(user.as_deref(), Some(r#""u-1""#));
    // Anthropic's Messages API: `system` first, whatever the member order; the user id from
    // its metadata.
    let (messages, user) = pieces(
        "/v1/messages",
        r#"{"messages":[{"role":"user","content":"hi"}],"model":"m","system":"sys","metadata":{"user_id":"a"}}"#,
    )
    .await;
    assert_eq!(messages[0], (r#""sys""#.to_owned(), Message));
    assert_eq!(messages.len(), 2);
    assert_eq!(user.as_deref(), Some(r#""a""#));
    // Responses: instructions, then the input as it is (split when hashed).
    let (responses, _) = pieces(
        "/v1/responses",
        r#"{"model":"m","input":[{"role":"user","content":"x"}],"instructions":"be kind"}"#,
    )
    .await;
    assert_eq!(
        responses,
        [
            (r#""be kind""#.to_owned(), Message),
            (r#"[{"role":"user","content":"x"}]"#.to_owned(), Elements),
        ]
    );
    // A growing prompt: its text without the closing quote.
    let (completion, _) = pieces("/v1/completions", r#"{"model":"m","prompt":"once upon"}"#).await;
    assert_eq!(completion, [(r#""once upon"#.to_owned(), Text)]);
    let (generate, _) = pieces(
        "/api/generate",
        r#"{"model":"m","system":"s","prompt":"p"}"#,
    )
    .await;
    assert_eq!(
        generate,
        [(r#""s""#.to_owned(), Message), (r#""p"#.to_owned(), Text)]
    );
    // Routes that carry no prompt worth routing by.
    let (embeddings, _) = pieces("/v1/embeddings", r#"{"model":"m","input":"x"}"#).await;
    assert!(embeddings.is_empty());
}

#[tokio::test]
async fn a_prompt_member_of_an_odd_shape_is_the_engines_business() {
    // `messages` that is not an array, a null system: no pieces, and no refusal.
    for body in [
        r#"{"model":"m","messages":{"role":"user"}}"#,
        r#"{"model":"m","messages":"hi"}"#,
        r#"{"model":"m","messages":null}"#,
        r#"{"model":"m","messages":7}"#,
    ] {
        let (chat, _) = pieces("/v1/chat/completions", body).await;
        assert!(chat.is_empty(), "{body}");
    }
    let (messages, _) = pieces(
        "/v1/messages",
        r#"{"model":"m","system":null,"messages":[]}"#,
    )
    .await;
    assert!(messages.is_empty());
    let (_, user) = pieces(
        "/v1/messages",
        r#"{"model":"m","metadata":"not an object","messages":[]}"#,
    )
    .await;
    assert_eq!(user, None);
}

/// A chat body of `frames` frames of `each` bytes, with no declared length (chunked).
fn chunked(
    frames: usize,
    each: usize,
) -> Request<impl http_body::Body<Data = Bytes, Error = std::convert::Infallible>> {
    let mut text = br#"{"model":"m","pad":""#.to_vec();
    text.resize(frames * each - 2, b'x');
    text.extend_from_slice(br#""}"#);
    let parts: Vec<_> = text
        .chunks(each)
        .map(|part| Ok(http_body::Frame::data(Bytes::copy_from_slice(part))))
        .collect();
    let body = http_body_util::StreamBody::new(futures::stream::iter(parts));
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(body)
        .unwrap()
}

#[tokio::test]
async fn a_chunked_body_is_charged_for_its_buffer_while_it_arrives_and_its_length_after() {
    // Issue 28: a chunked body's buffer grows by doubling, up to twice its length; the budget
    // counted only the length, so RSS reached 2x `max_buffered_body_bytes`.
    let metrics = Metrics::new();
    let limits = |budget| BodyLimits {
        max_bytes: 1 << 20,
        timeout: std::time::Duration::from_secs(5),
        budget,
    };
    // 1 000 bytes in ten frames: buffers of 100, 200, 400, 800 and 1 600 bytes.
    let tight = BodyBudget::new(1_500, &metrics);
    let err = super::read(chunked(10, 100), limits(&tight), chat())
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Overloaded { .. }), "{err:?}");
    assert_eq!(tight.in_use(), 0);

    let roomy = BodyBudget::new(1_600, &metrics);
    let read = super::read(chunked(10, 100), limits(&roomy), chat())
        .await
        .unwrap();
    assert_eq!(read.body.len(), 1_000);
    assert_eq!(roomy.in_use(), 1_000, "the spare capacity went back");
}
