//! Unit tests for URL joining, header hygiene and request ids.

use http::HeaderMap;
use http::header::HeaderValue;
use http::uri::PathAndQuery;

use super::{CREDENTIALS, copy_end_to_end, end_to_end};
use crate::support::base::Base;
use crate::support::request_id::{REQUEST_ID, request_id};

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
fn sends_origin_form_with_the_upstream_host() {
    let pq = PathAndQuery::from_static("/v1/chat/completions?x=1");
    let plain = Base::parse("http://127.0.0.1:8081").unwrap();
    assert_eq!(
        plain.origin_for(Some(&pq)).unwrap().to_string(),
        "/v1/chat/completions?x=1"
    );
    assert_eq!(plain.origin_for(None).unwrap().to_string(), "/");
    assert_eq!(plain.host(), "127.0.0.1:8081");
    assert_eq!(plain.root().to_string(), "http://127.0.0.1:8081/");
    let prefixed = Base::parse("http://predictor.llm-serving:80/openai/").unwrap();
    assert_eq!(
        prefixed.origin_for(Some(&pq)).unwrap().to_string(),
        "/openai/v1/chat/completions?x=1"
    );
    // The scheme's default port is left out, as are user credentials.
    assert_eq!(prefixed.host(), "predictor.llm-serving");
    assert_eq!(
        Base::parse("https://llm.example:443").unwrap().host(),
        "llm.example"
    );
    assert_eq!(
        Base::parse("https://llm.example:8443").unwrap().host(),
        "llm.example:8443"
    );
    assert_eq!(
        Base::parse("http://u:p@llm.example:81").unwrap().host(),
        "llm.example:81"
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
    let headers = end_to_end(headers, 3);
    let mut left: Vec<_> = headers.keys().map(http::HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(left, ["authorization", "content-type"]);
    assert!(
        headers.capacity() >= headers.len() + 3,
        "room for the gateway's own fields"
    );
}

#[test]
fn keeps_every_end_to_end_field_and_value_in_order() {
    let mut headers = HeaderMap::new();
    headers.append("content-type", HeaderValue::from_static("application/json"));
    headers.append("x-custom", HeaderValue::from_static("1"));
    headers.append("connection", HeaderValue::from_static("keep-alive"));
    headers.append("x-custom", HeaderValue::from_static("2"));
    headers.append("x-custom", HeaderValue::from_static("3"));
    headers.append("server", HeaderValue::from_static("engine"));
    let mut expected = headers.clone();
    expected.remove("connection");
    let kept = end_to_end(headers, 0);
    assert_eq!(kept, expected);
    let values: Vec<_> = kept.get_all("x-custom").iter().collect();
    assert_eq!(
        values,
        ["1", "2", "3"],
        "repeated fields keep every value, in order"
    );
}

#[test]
fn copies_only_end_to_end_fields() {
    let mut from = HeaderMap::new();
    for (name, value) in [
        ("connection", "close, x-secret"),
        ("keep-alive", "timeout=5"),
        ("proxy-connection", "keep-alive"),
        ("x-secret", "1"),
        ("te", "trailers"),
        ("trailer", "x-checksum"),
        ("accept", "text/event-stream"),
        ("x-repeated", "a"),
        ("x-repeated", "b"),
    ] {
        from.append(name, HeaderValue::from_static(value));
    }
    from.append("host", HeaderValue::from_static("gateway"));
    let mut to = HeaderMap::new();
    copy_end_to_end(&from, &mut to, |name| name == http::header::HOST);
    let mut left: Vec<_> = to.keys().map(http::HeaderName::as_str).collect();
    left.sort_unstable();
    assert_eq!(
        left,
        ["accept", "x-repeated"],
        "`skip`'s fields left out too"
    );
    let repeated: Vec<_> = to.get_all("x-repeated").iter().collect();
    assert_eq!(
        repeated,
        ["a", "b"],
        "repeated fields keep every value, in order"
    );
}

#[test]
fn every_credential_field_is_one_a_client_sends_a_key_in() {
    let mut from = HeaderMap::new();
    for name in [
        "authorization",
        "x-api-key",
        "api-key",
        "openai-api-key",
        "accept",
    ] {
        from.append(name, HeaderValue::from_static("sk-client"));
    }
    let mut to = HeaderMap::new();
    copy_end_to_end(&from, &mut to, |name| CREDENTIALS.contains(name));
    let left: Vec<_> = to.keys().map(http::HeaderName::as_str).collect();
    assert_eq!(left, ["accept"]);
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
