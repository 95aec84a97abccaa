//! Unit tests for URL joining, header hygiene and request ids.

use http::HeaderMap;
use http::header::HeaderValue;
use http::uri::PathAndQuery;

use super::strip_hop_by_hop;
use crate::base::Base;
use crate::request_id::{REQUEST_ID, request_id};

#[test]
fn keeps_the_upstream_path_prefix() {
    let pq = PathAndQuery::from_static("/v1/chat/completions?x=1");
    let plain = Base::parse("http://127.0.0.1:8081").unwrap();
    assert_eq!(
        plain.uri_for(Some(&pq)).unwrap().to_string(),
        "http://127.0.0.1:8081/v1/chat/completions?x=1"
    );
    let prefixed = Base::parse("http://reasoning-predictor.llm-serving:80/openai/").unwrap();
    assert_eq!(
        prefixed.uri_for(Some(&pq)).unwrap().to_string(),
        "http://reasoning-predictor.llm-serving:80/openai/v1/chat/completions?x=1"
    );
    let tls = Base::parse("https://llm.example/openai").unwrap();
    assert_eq!(
        tls.uri_for(Some(&pq)).unwrap().to_string(),
        "https://llm.example/openai/v1/chat/completions?x=1"
    );
}

#[test]
fn refuses_urls_it_cannot_use() {
    assert!(Base::parse("ftp://example.com").is_err());
    assert!(Base::parse("/relative").is_err());
    assert!(Base::parse("not a url").is_err());
}

#[test]
fn strips_hop_by_hop_fields_and_those_connection_names() {
    let mut headers = HeaderMap::new();
    for (name, value) in [
        ("connection", "keep-alive, x-secret"),
        ("keep-alive", "timeout=5"),
        ("x-secret", "1"),
        ("te", "trailers"),
        ("transfer-encoding", "chunked"),
        ("upgrade", "h2c"),
        ("proxy-authorization", "Basic x"),
        ("trailer", "x-checksum"),
        ("authorization", "Bearer keep-me"),
        ("content-type", "application/json"),
    ] {
        headers.append(name, HeaderValue::from_static(value));
    }
    strip_hop_by_hop(&mut headers);
    let mut left: Vec<_> = headers.keys().map(http::HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(left, ["authorization", "content-type"]);
}

#[test]
fn propagates_a_sane_request_id_and_generates_otherwise() {
    let mut headers = HeaderMap::new();
    headers.insert(REQUEST_ID, HeaderValue::from_static("abc-123"));
    assert_eq!(request_id(&headers), "abc-123");

    headers.insert(REQUEST_ID, HeaderValue::from_static("has space"));
    let generated = request_id(&headers);
    assert_ne!(generated, "has space");
    assert_eq!(generated.len(), 36, "a hyphenated UUID");

    let a = request_id(&HeaderMap::new());
    let b = request_id(&HeaderMap::new());
    assert_ne!(a, b);
}
