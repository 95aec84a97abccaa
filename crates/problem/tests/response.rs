//! The wire form through the public API only: JSON members, the `error` object, and the
//! response headers (content type, caching, `Retry-After` rounding, challenges).

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Response, StatusCode, header};
use proptest::prelude::*;
use serde_json::{Value, json};
use slotgate_problem::{CONTENT_TYPE, Kind, Problem, is_valid_extension_name};

fn body(response: &Response<Bytes>) -> Value {
    serde_json::from_slice(response.body()).expect("the body is JSON")
}

fn retry_after_header(problem: &Problem) -> Option<String> {
    problem
        .to_response::<Bytes>()
        .headers()
        .get(header::RETRY_AFTER)
        .map(|v| v.to_str().expect("ASCII").to_owned())
}

// === JSON shape ===

#[test]
fn full_document_has_every_member() {
    let problem = Problem::queue_full("http://gpu-a:8080", "llama", Duration::from_secs(5))
        .with_instance("urn:uuid:3c1a")
        .with_extension("request_id", "3c1a");
    let doc = body(&problem.to_response());
    assert_eq!(
        doc,
        json!({
            "type": "https://slotgate.dev/problems/queue-full",
            "title": "Queue full",
            "status": 503,
            "detail": "Every slot and queue place for model `llama` on upstream `http://gpu-a:8080` is taken.",
            "instance": "urn:uuid:3c1a",
            "upstream": "http://gpu-a:8080",
            "model": "llama",
            "request_id": "3c1a",
            "retry_after": 5,
            "error": {
                "message": "Model `llama` is at capacity: every slot and every queue place is taken. Retry in 5 s.",
                "type": "server_error",
                "param": null,
                "code": "queue_full",
            },
        })
    );
}

#[test]
fn standard_members_come_first() {
    let bytes = Problem::not_found("/nope").to_json_bytes();
    let text = std::str::from_utf8(&bytes).expect("UTF-8");
    assert!(text.starts_with(r#"{"type":"https://slotgate.dev/problems/not-found","title":"#));
}

#[test]
fn openai_error_object_has_exactly_four_keys() {
    let doc = body(&Problem::model_not_found("gpt-x").to_response());
    let error = doc["error"].as_object().expect("object");
    assert_eq!(error.len(), 4);
    assert_eq!(error["param"], "model");
    assert_eq!(error["code"], "model_not_found");
    assert_eq!(error["type"], "invalid_request_error");
    assert!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("GET /v1/models"))
    );

    let doc = body(&Problem::internal().to_response());
    assert!(doc["error"]["param"].is_null());
    assert_eq!(doc["error"].as_object().map(serde_json::Map::len), Some(4));
}

#[test]
fn builders_set_what_they_name() {
    let problem = Problem::bad_request("`messages` must be an array.")
        .with_param("messages")
        .with_detail("custom")
        .with_instance("/v1/chat/completions")
        .with_extension("model", "other")
        .with_retry_after(Duration::from_millis(100));
    assert_eq!(problem.detail(), Some("custom"));
    assert_eq!(problem.instance(), Some("/v1/chat/completions"));
    assert_eq!(problem.param(), Some("messages"));
    assert_eq!(problem.extension("model"), Some(&Value::from("other")));
    assert_eq!(problem.retry_after(), Some(Duration::from_millis(100)));
    assert_eq!(problem.retry_after_secs(), Some(1));
    // The message keeps the constructor's wording; the detail is free to change.
    assert_eq!(
        problem.message(),
        "The request body is invalid: `messages` must be an array. Fix it and send the request again."
    );
}

#[test]
fn constructor_extensions_can_be_replaced() {
    let problem = Problem::not_found("/a").with_extension("path", "/b");
    assert_eq!(body(&problem.to_response())["path"], "/b");
}

#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "overwrite a member"))]
fn reserved_extension_name_is_a_bug() {
    // Release builds drop it instead of writing `status` twice.
    let problem = Problem::internal().with_extension("status", 200);
    let doc = body(&problem.to_response());
    assert_eq!(doc["status"], 500);
}

#[test]
#[cfg_attr(debug_assertions, should_panic(expected = "RFC 9457"))]
fn badly_named_extension_is_a_bug() {
    // Release builds keep it: the JSON is still valid and consumers ignore unknown members.
    let problem = Problem::internal().with_extension("x", 1);
    assert_eq!(body(&problem.to_response())["x"], 1);
}

#[test]
fn extension_name_rule() {
    for good in ["abc", "model", "retry_after", "a1_", "Zed"] {
        assert!(is_valid_extension_name(good), "{good}");
    }
    for bad in ["", "ab", "1abc", "_abc", "ab-c", "ab c", "modèle", "a.bc"] {
        assert!(!is_valid_extension_name(bad), "{bad}");
    }
}

#[test]
fn display_and_error() {
    let problem = Problem::upstream_bad_response("http://gpu-a:8080", "llama");
    let error: Box<dyn std::error::Error> = Box::new(problem.clone());
    assert_eq!(error.to_string(), problem.to_string());
    assert!(error.to_string().starts_with("502 upstream-bad-response: "));
}

// === headers ===

#[test]
fn common_headers() {
    // Every kind goes through the same path (the per-kind checks are unit tests); these are
    // the kinds without any optional header.
    for problem in [
        Problem::internal(),
        Problem::body_too_large(10),
        Problem::upstream_timeout("u", "m", Duration::from_secs(1)),
    ] {
        let response = problem.to_response::<Bytes>();
        assert_eq!(response.status(), problem.status());
        assert_eq!(response.headers()[header::CONTENT_TYPE], CONTENT_TYPE);
        assert_eq!(response.headers()[header::CACHE_CONTROL], "no-store");
        assert!(!response.headers().contains_key(header::RETRY_AFTER));
        assert!(!response.headers().contains_key(header::WWW_AUTHENTICATE));
        assert!(!response.headers().contains_key(header::ALLOW));
        assert_eq!(response.body(), &problem.to_json_bytes());
    }
}

#[test]
fn unauthorized_carries_a_bearer_challenge() {
    let response = Problem::unauthorized().to_response::<Bytes>();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()[header::WWW_AUTHENTICATE], "Bearer");
    // The key itself is never in the body.
    assert!(!body(&response).to_string().contains("sk-"));
}

#[test]
fn method_not_allowed_carries_allow() {
    let response = Problem::method_not_allowed(&Method::DELETE, &[Method::GET, Method::POST])
        .to_response::<Bytes>();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(response.headers()[header::ALLOW], "GET, POST");
    let doc = body(&response);
    assert_eq!(doc["method"], "DELETE");
    assert_eq!(doc["allowed"], json!(["GET", "POST"]));

    let none = Problem::method_not_allowed(&Method::GET, &[]).to_response::<Bytes>();
    assert_eq!(none.headers()[header::ALLOW], "");
}

#[test]
fn retry_after_rounds_up_to_whole_seconds_at_least_one() {
    let cases = [
        (Duration::ZERO, "1"),
        (Duration::from_nanos(1), "1"),
        (Duration::from_millis(999), "1"),
        (Duration::from_secs(1), "1"),
        (Duration::from_millis(1001), "2"),
        (Duration::from_millis(2500), "3"),
        (Duration::from_secs(120), "120"),
        (Duration::MAX, "18446744073709551615"),
    ];
    for (wait, want) in cases {
        let problem = Problem::internal().with_retry_after(wait);
        assert_eq!(
            retry_after_header(&problem).as_deref(),
            Some(want),
            "{wait:?}"
        );
    }
    assert_eq!(retry_after_header(&Problem::internal()), None);
}

#[test]
fn body_type_is_generic() {
    let response: Response<Vec<u8>> = {
        // Any `From<Bytes>` body works; Vec<u8> is one.
        let r: Response<Bytes> = Problem::internal().to_response();
        r.map(|b| b.to_vec())
    };
    assert!(!response.body().is_empty());
    let response: Response<String> = Problem::internal().to_response::<Wrapped>().map(|w| w.0);
    assert!(response.body().starts_with('{'));
}

/// A caller-defined body type, as the gateway's boxed body would be.
struct Wrapped(String);

impl From<Bytes> for Wrapped {
    fn from(bytes: Bytes) -> Self {
        Self(String::from_utf8_lossy(&bytes).into_owned())
    }
}

proptest! {
    /// The header is `ceil(seconds)`, at least 1, agrees with the body member, and parses as
    /// RFC 9110 delay-seconds (digits only).
    #[test]
    fn retry_after_is_ceiling_seconds(secs in any::<u64>(), nanos in 0_u32..1_000_000_000) {
        let wait = Duration::new(secs, nanos);
        let problem = Problem::queue_full("u", "m", wait);
        let header = retry_after_header(&problem).expect("queue_full sets Retry-After");
        prop_assert!(header.bytes().all(|b| b.is_ascii_digit()));
        let got: u64 = header.parse().expect("delay-seconds");
        let want = secs.saturating_add(u64::from(nanos > 0)).max(1);
        prop_assert_eq!(got, want);
        prop_assert_eq!(&body(&problem.to_response())["retry_after"], &Value::from(want));
        let promise = format!("Retry in {want} s");
        prop_assert!(problem.message().contains(&promise));
    }

    /// Whatever strings the gateway passes in, the body is valid JSON with the right status.
    #[test]
    fn any_input_gives_a_valid_document(upstream in ".*", model in ".*", path in ".*") {
        for problem in [
            Problem::queue_full(&upstream, &model, Duration::ZERO),
            Problem::model_not_found(&model),
            Problem::not_found(&path),
            Problem::bad_request(path.clone()),
            Problem::unsupported_media_type(Some(&path)),
        ] {
            let doc = body(&problem.to_response());
            prop_assert_eq!(&doc["status"], &Value::from(problem.status().as_u16()));
            prop_assert!(doc["error"]["message"].is_string());
        }
    }
}

/// The constructor table in the crate docs lists every kind with its status: a kind added
/// without a row (as happened five times) fails here.
#[test]
fn the_crate_docs_list_every_kind_with_its_status() {
    let docs = include_str!("../src/lib.rs");
    for kind in Kind::ALL {
        let row = format!("| {} | `{}` |", kind.status().as_u16(), kind.slug());
        assert!(
            docs.contains(&row),
            "lib.rs's table lacks a row with `{row}`"
        );
    }
}
