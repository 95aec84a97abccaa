//! Per-kind checks. They live inside the crate so that the `match` in [`sample`] is exhaustive:
//! adding a `Kind` fails to compile until it has a constructor, a test sample and a row in
//! `docs/problems.md`.

use std::collections::HashSet;
use std::time::Duration;

use http::Method;
use serde_json::Value;

use crate::{BASE_URI, Kind, Problem, is_valid_extension_name, problem::RESERVED};

const RETRY: Duration = Duration::from_millis(2500);

/// One document of each kind, built by its constructor.
fn sample(kind: Kind) -> Problem {
    match kind {
        Kind::QueueFull => Problem::queue_full("http://gpu-a:8080", "llama", RETRY),
        Kind::QueueTimeout => {
            Problem::queue_timeout("http://gpu-a:8080", "llama", Duration::from_secs(30), RETRY)
        }
        Kind::ModelNotFound => Problem::model_not_found("nope"),
        Kind::NotFound => Problem::not_found("/v2/chat"),
        Kind::ResponseNotFound => Problem::response_not_found("resp_1"),
        Kind::ResponseUpstreamUnavailable => {
            Problem::response_upstream_unavailable("resp_1", "gpu-a", RETRY)
        }
        Kind::RouteNotServed => Problem::route_not_served("llama", "/api/chat"),
        Kind::RouteDisabled => Problem::route_disabled("llama", "/api/pull"),
        Kind::MethodNotAllowed => Problem::method_not_allowed(&Method::GET, &[Method::POST]),
        Kind::BadRequest => Problem::bad_request("`model` is missing."),
        Kind::BodyTooLarge => Problem::body_too_large(1 << 20),
        Kind::UnsupportedMediaType => Problem::unsupported_media_type(Some("text/plain")),
        Kind::BodyTimeout => Problem::body_timeout(Duration::from_secs(30)),
        Kind::Unauthorized => Problem::unauthorized(),
        Kind::UpstreamUnavailable => Problem::upstream_unavailable("llama", RETRY),
        Kind::UpstreamTimeout => {
            Problem::upstream_timeout("http://gpu-a:8080", "llama", Duration::from_secs(60))
        }
        Kind::UpstreamBadResponse => Problem::upstream_bad_response("http://gpu-a:8080", "llama"),
        Kind::Overloaded => Problem::overloaded(1 << 28, RETRY),
        Kind::StoreUnavailable => Problem::store_unavailable("llama", RETRY),
        Kind::UpstreamStalled => Problem::upstream_stalled("gpu-a", "llama", "no data for 30 s"),
        Kind::StreamTimeout => Problem::stream_timeout("gpu-a", "llama", Duration::from_secs(3600)),
        Kind::MalformedRequest => Problem::malformed_request(),
        Kind::UriTooLong => Problem::uri_too_long(),
        Kind::HeadersTooLarge => Problem::headers_too_large(),
        Kind::ShuttingDown => Problem::shutting_down(RETRY),
        Kind::ReloadUnavailable => Problem::reload_unavailable(),
        Kind::ConfigRefused => Problem::config_refused(&["a.b: wrong".to_owned()]),
        Kind::Internal => Problem::internal(),
    }
}

fn json(problem: &Problem) -> serde_json::Map<String, Value> {
    match serde_json::from_slice(&problem.to_json_bytes()) {
        Ok(Value::Object(map)) => map,
        other => panic!("not a JSON object: {other:?}"),
    }
}

/// The kinds whose constructor sets `Retry-After`: the retryable 503s.
fn retryable(kind: Kind) -> bool {
    kind.status() == http::StatusCode::SERVICE_UNAVAILABLE
}

#[test]
fn every_constructor_has_its_kind_status_type_and_title() {
    for &kind in Kind::ALL {
        let problem = sample(kind);
        assert_eq!(problem.kind(), kind);
        assert_eq!(problem.status(), kind.status());
        assert_eq!(problem.type_uri(), format!("{BASE_URI}{}", kind.slug()));
        let doc = json(&problem);
        assert_eq!(doc["type"], kind.type_uri(), "{kind:?}");
        assert_eq!(doc["title"], kind.title(), "{kind:?}");
        assert_eq!(doc["status"], kind.status().as_u16(), "{kind:?}");
        assert_eq!(
            problem.to_response::<bytes::Bytes>().status(),
            kind.status()
        );
    }
}

#[test]
fn statuses_are_the_documented_ones() {
    let status = |k: Kind| k.status().as_u16();
    assert_eq!(status(Kind::QueueFull), 503);
    assert_eq!(status(Kind::QueueTimeout), 503);
    assert_eq!(status(Kind::ModelNotFound), 404);
    assert_eq!(status(Kind::NotFound), 404);
    assert_eq!(status(Kind::MethodNotAllowed), 405);
    assert_eq!(status(Kind::BadRequest), 400);
    assert_eq!(status(Kind::BodyTooLarge), 413);
    assert_eq!(status(Kind::UnsupportedMediaType), 415);
    assert_eq!(status(Kind::Unauthorized), 401);
    assert_eq!(status(Kind::UpstreamUnavailable), 503);
    assert_eq!(status(Kind::UpstreamTimeout), 504);
    assert_eq!(status(Kind::UpstreamBadResponse), 502);
    assert_eq!(status(Kind::ShuttingDown), 503);
    assert_eq!(status(Kind::Internal), 500);
}

#[test]
fn slugs_uris_and_codes_are_unique_and_well_formed() {
    let mut slugs = HashSet::new();
    let mut titles = HashSet::new();
    for &kind in Kind::ALL {
        let slug = kind.slug();
        assert!(slugs.insert(slug), "duplicate slug {slug}");
        assert!(
            titles.insert(kind.title()),
            "duplicate title {}",
            kind.title()
        );
        assert!(
            slug.chars().all(|c| c.is_ascii_lowercase() || c == '-'),
            "{slug}"
        );
        assert_eq!(kind.code(), slug.replace('-', "_"));
        assert_eq!(Kind::from_type_uri(kind.type_uri()), Some(kind));
        assert!(matches!(
            kind.openai_type(),
            "invalid_request_error" | "authentication_error" | "server_error"
        ));
        // Client mistakes are 4xx and say so to OpenAI clients; the rest are server errors.
        assert_eq!(
            kind.status().is_client_error(),
            kind.openai_type() != "server_error",
            "{kind:?}"
        );
    }
    assert_eq!(slugs.len(), Kind::ALL.len());
}

#[test]
fn every_member_name_is_a_valid_extension_name() {
    for &kind in Kind::ALL {
        let doc = json(&sample(kind));
        for name in doc.keys() {
            if ["type", "title", "status", "detail", "instance"].contains(&name.as_str()) {
                continue;
            }
            assert!(
                is_valid_extension_name(name),
                "{kind:?}: extension `{name}` breaks RFC 9457 §3.2"
            );
        }
    }
    for name in RESERVED.iter().skip(5) {
        assert!(is_valid_extension_name(name), "{name}");
    }
}

#[test]
fn every_document_has_the_openai_error_object() {
    for &kind in Kind::ALL {
        let doc = json(&sample(kind));
        let Some(Value::Object(error)) = doc.get("error") else {
            panic!("{kind:?}: no `error` object");
        };
        let mut keys: Vec<_> = error.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["code", "message", "param", "type"], "{kind:?}");
        let message = error["message"].as_str().expect("message is a string");
        assert!(message.len() > 20, "{kind:?}: message too thin: {message}");
        assert!(message.ends_with('.'), "{kind:?}: {message}");
        assert_eq!(error["type"], kind.openai_type());
        assert_eq!(error["code"], kind.code());
        assert!(error["param"].is_null() || error["param"].is_string());
    }
}

#[test]
fn retryable_problems_and_only_they_set_retry_after() {
    for &kind in Kind::ALL {
        let problem = sample(kind);
        let response = problem.to_response::<bytes::Bytes>();
        let header = response.headers().get(http::header::RETRY_AFTER);
        let member = json(&problem).get("retry_after").cloned();
        if retryable(kind) {
            assert_eq!(header.map(|h| h.to_str().unwrap()), Some("3"), "{kind:?}");
            assert_eq!(member, Some(Value::from(3)), "{kind:?}");
            // The message promises the same wait as the header.
            assert!(problem.message().contains("Retry in 3 s"), "{kind:?}");
        } else {
            assert!(header.is_none(), "{kind:?}");
            assert!(member.is_none(), "{kind:?}");
        }
    }
}

#[test]
fn docs_table_lists_every_kind() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/problems.md");
    let docs = std::fs::read_to_string(path).expect("docs/problems.md at the repository root");
    for &kind in Kind::ALL {
        let row = docs
            .lines()
            .find(|line| line.starts_with('|') && line.contains(&format!("`{}`", kind.type_uri())))
            .unwrap_or_else(|| panic!("docs/problems.md has no row for {}", kind.type_uri()));
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        // | type | status | title | when | what to do | Retry-After |
        assert_eq!(cells[2], kind.status().as_u16().to_string(), "{row}");
        assert_eq!(cells[3], kind.title(), "{row}");
        let retry = if retryable(kind) { "yes" } else { "no" };
        assert_eq!(cells[6], retry, "{row}");
    }
}

#[test]
fn optional_members_are_absent_not_null() {
    let doc = json(&Problem::unauthorized().with_param("x"));
    assert!(!doc.contains_key("instance"));
    assert!(!doc.contains_key("retry_after"));
    assert_eq!(doc["error"]["param"], "x");
}

#[test]
fn waited_and_timeout_members_are_milliseconds() {
    let p = Problem::queue_timeout("u", "m", Duration::from_millis(1234), RETRY);
    assert_eq!(p.extension("waited_ms"), Some(&Value::from(1234)));
    let p = Problem::upstream_timeout("u", "m", Duration::MAX);
    assert_eq!(p.extension("timeout_ms"), Some(&Value::from(u64::MAX)));
}

#[test]
fn unsupported_media_type_without_content_type() {
    let p = Problem::unsupported_media_type(None);
    assert_eq!(p.extension("content_type"), Some(&Value::Null));
    assert!(p.message().contains("no Content-Type"));
}

#[test]
fn display_names_status_slug_and_detail() {
    let p = Problem::not_found("/x");
    assert_eq!(p.to_string(), "404 not-found: No route for `/x`.");
}

#[test]
fn echoed_client_input_is_clipped() {
    let long = "é".repeat(10_000);
    for problem in [Problem::model_not_found(&long), Problem::not_found(&long)] {
        let bytes = problem.to_json_bytes();
        assert!(bytes.len() < 4 * 1024, "{} bytes", bytes.len());
    }
    let short = json(&Problem::model_not_found("llama"));
    assert_eq!(short["model"], "llama");
    let clipped = json(&Problem::model_not_found(&"m".repeat(300)));
    assert_eq!(
        clipped["model"].as_str().map(|m| m.chars().count()),
        Some(crate::ECHO_LIMIT + 1)
    );
}
