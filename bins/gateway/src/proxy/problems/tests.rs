//! Every error's document, status and `Retry-After`; refusals counted once; a bad request's
//! detail.

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Response};

use slotgate_problem::Dialect;

use super::{BadRequest, Error, respond};
use crate::fixtures::{self, Built};

#[expect(clippy::too_many_lines, reason = "one entry per variant, written out")]
fn every_error() -> Vec<(Error, u16, &'static str, bool)> {
    let io =
        || Box::new(std::io::Error::other("connection reset")) as crate::support::error::BoxError;
    vec![
        (
            Error::NotFound { path: "/x".into() },
            404,
            "not-found",
            false,
        ),
        (
            Error::MethodNotAllowed {
                method: Method::GET,
                path: "/v1/embeddings".into(),
                allow: &[Method::POST],
            },
            405,
            "method-not-allowed",
            false,
        ),
        (
            Error::RouteNotServed {
                model: "m".into(),
                route: "/api/chat",
            },
            404,
            "route-not-served",
            false,
        ),
        (
            Error::RouteDisabled {
                model: "m".into(),
                route: "/api/pull",
            },
            403,
            "route-disabled",
            false,
        ),
        (
            Error::ResponseNotFound {
                id: "r".into(),
                in_path: false,
            },
            404,
            "response-not-found",
            false,
        ),
        (
            Error::ResponseUpstreamUnavailable {
                id: "r".into(),
                upstream: "u".into(),
                retry_after: Duration::from_secs(5),
            },
            503,
            "response-upstream-unavailable",
            true,
        ),
        (
            Error::ModelNotFound { model: "m".into() },
            404,
            "model-not-found",
            false,
        ),
        (
            Error::BadRequest(BadRequest::NoModel),
            400,
            "bad-request",
            false,
        ),
        (Error::BodyRead(io()), 400, "bad-request", false),
        (Error::BodyIncomplete(io()), 400, "bad-request", false),
        (
            Error::BodyTooLarge { limit: 10 },
            413,
            "body-too-large",
            false,
        ),
        (
            Error::HeadersTooLarge { limit: 10 },
            431,
            "headers-too-large",
            false,
        ),
        (
            Error::BodyTimeout {
                after: Duration::from_secs(30),
            },
            408,
            "body-timeout",
            false,
        ),
        (
            Error::Overloaded { budget: 1 << 20 },
            503,
            "overloaded",
            true,
        ),
        (
            Error::StoreUnavailable {
                model: "m".into(),
                retry_after: Duration::from_secs(3),
            },
            503,
            "store-unavailable",
            true,
        ),
        (
            Error::UnsupportedMediaType { got: None },
            415,
            "unsupported-media-type",
            false,
        ),
        (Error::Unauthorized, 401, "unauthorized", false),
        (
            Error::QueueFull {
                upstream: "gpu".into(),
                model: "m".into(),
                retry_after: Duration::from_secs(3),
                also_full: 0,
            },
            503,
            "queue-full",
            true,
        ),
        (
            Error::QueueTimeout {
                upstream: "gpu".into(),
                model: "m".into(),
                waited: Duration::from_secs(30),
                retry_after: Duration::from_secs(5),
                deadline: None,
            },
            503,
            "queue-timeout",
            true,
        ),
        (
            Error::UpstreamUnavailable {
                model: "m".into(),
                retry_after: Duration::from_secs(5),
                why: super::Unavailable::Unreachable,
                source: Some(io()),
            },
            503,
            "upstream-unavailable",
            true,
        ),
        (
            Error::UpstreamFailed {
                upstream: "gpu".into(),
                model: "m".into(),
                source: io(),
            },
            502,
            "upstream-bad-response",
            false,
        ),
        (
            Error::UpstreamTimeout {
                upstream: "gpu".into(),
                model: "m".into(),
                after: Duration::from_secs(1),
            },
            504,
            "upstream-timeout",
            false,
        ),
        (
            Error::ShuttingDown {
                retry_after: Duration::from_secs(30),
            },
            503,
            "shutting-down",
            true,
        ),
        (
            Error::Internal {
                what: "a test",
                source: io(),
            },
            500,
            "internal",
            false,
        ),
    ]
}

#[test]
fn every_error_becomes_its_problem_document() {
    let id = HeaderValue::from_static("req-1");
    for (error, status, slug, retry) in every_error() {
        let response: Response<Bytes> = respond(&error, &id, Dialect::OpenAi);
        assert_eq!(response.status().as_u16(), status, "{error:?}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{error:?}"
        );
        assert_eq!(
            response.headers().contains_key("retry-after"),
            retry,
            "{error:?}"
        );
        let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
        assert!(
            doc["type"].as_str().unwrap().ends_with(slug),
            "{error:?}: {doc}"
        );
        assert_eq!(doc["request_id"], "req-1");
        assert!(doc.get("instance").is_none(), "not a UUID: no instance");
        assert!(doc["error"]["message"].is_string());
    }
}

/// The rejection series of `metrics` as exposed, one `reason model value` line each.
fn rejections(metrics: &crate::metrics::Metrics) -> Vec<String> {
    let mut registry = prometheus_client::registry::Registry::default();
    metrics.register(&mut registry);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .filter(|line| line.starts_with("rejections_total{") && !line.ends_with(" 0"))
        .map(ToOwned::to_owned)
        .collect()
}

#[test]
fn every_refusal_is_counted_once_and_nothing_else_is() {
    let built = Built::new(&fixtures::table("", &[fixtures::vllm_m("a", 9, 1.0)]));
    let (routes, metrics) = (&built.generation.routes, &built.metrics);
    let access = crate::proxy::access::Access::default();
    let io = || Box::new(std::io::Error::other("refused")) as crate::support::error::BoxError;
    let errors = [
        Error::QueueFull {
            upstream: "a".into(),
            model: "m".into(),
            retry_after: Duration::from_secs(1),
            also_full: 0,
        },
        Error::UpstreamUnavailable {
            model: "m".into(),
            retry_after: Duration::from_secs(1),
            why: super::Unavailable::Down,
            source: None,
        },
        Error::UpstreamUnavailable {
            model: "m".into(),
            retry_after: Duration::from_secs(1),
            why: super::Unavailable::Unreachable,
            source: Some(io()),
        },
        Error::TooHeavy {
            upstream: "a".into(),
            model: "m".into(),
            weight: 2,
            parallel: 1,
        },
        Error::ModelNotFound {
            model: "unknown".into(),
        },
        Error::ShuttingDown {
            retry_after: Duration::from_secs(1),
        },
        // Not refusals: the client left, the engine failed.
        Error::BodyIncomplete(io()),
        Error::UpstreamTimeout {
            upstream: "a".into(),
            model: "m".into(),
            after: Duration::from_secs(1),
        },
    ];
    for error in &errors {
        super::record(error, routes, metrics, &access);
    }
    let route = routes.resolve("m").unwrap();
    assert_eq!(route.rejections.queue_full.get(), 1);
    assert_eq!(route.rejections.model_unavailable.get(), 1);
    assert_eq!(route.rejections.upstream_unavailable.get(), 1);
    assert_eq!(route.rejections.queue_timeout.get(), 0);
    let mut lines = rejections(metrics);
    lines.sort();
    assert_eq!(
        lines,
        [
            r#"rejections_total{model="",reason="model_not_found"} 1"#,
            r#"rejections_total{model="",reason="shutting_down"} 1"#,
            r#"rejections_total{model="m",reason="model_unavailable"} 1"#,
            r#"rejections_total{model="m",reason="queue_full"} 1"#,
            r#"rejections_total{model="m",reason="too_heavy"} 1"#,
            r#"rejections_total{model="m",reason="upstream_unavailable"} 1"#,
        ]
    );
}

#[test]
fn a_uuid_request_id_becomes_the_instance() {
    let id = HeaderValue::from_static("0b7c6f3e-1d2a-4c5b-9e8f-7a6b5c4d3e2f");
    let response: Response<Bytes> = respond(&Error::Unauthorized, &id, Dialect::OpenAi);
    let doc: serde_json::Value = serde_json::from_slice(response.body()).unwrap();
    assert_eq!(
        doc["instance"],
        "urn:uuid:0b7c6f3e-1d2a-4c5b-9e8f-7a6b5c4d3e2f"
    );
}

#[test]
fn a_bad_request_reads_as_its_detail_with_the_parsers_words() {
    let json = serde_json::from_str::<serde_json::Value>("{bad").unwrap_err();
    let cases = [
        (
            BadRequest::Count { member: "n" },
            "`n` must be a positive integer".to_owned(),
        ),
        (
            BadRequest::Json(json),
            "the request body is not valid JSON: key must be a string at line 1 column 2"
                .to_owned(),
        ),
        (
            BadRequest::TenantTooLong {
                header: "x-tenant".into(),
                len: 200,
            },
            "the `x-tenant` header is 200 bytes long; a tenant name has at most 128".to_owned(),
        ),
        (
            BadRequest::ModelNeeded {
                route: "/v1/embeddings",
            },
            "the request body has no `model` member, and /v1/embeddings does not serve \
             exactly one model; name one"
                .to_owned(),
        ),
    ];
    for (bad, detail) in cases {
        assert_eq!(bad.detail(), detail);
        let doc = Error::BadRequest(bad).to_problem();
        assert_eq!(doc.detail(), Some(detail.as_str()));
    }
}

#[test]
fn a_bad_header_is_not_called_a_bad_body() {
    let doc = Error::BadRequest(BadRequest::MaxWait {
        header: http::HeaderName::from_static("x-slotgate-max-wait"),
    })
    .to_problem();
    assert!(
        doc.message()
            .starts_with("The `x-slotgate-max-wait` header is invalid"),
        "{doc:?}"
    );
    assert_eq!(doc.param(), Some("x-slotgate-max-wait"));
    let body = Error::BadRequest(BadRequest::NoModel).to_problem();
    assert!(body.message().starts_with("The request body is invalid"));
}

#[test]
fn an_upstream_failure_names_its_cause() {
    let error = Error::UpstreamFailed {
        upstream: "gpu".into(),
        model: "m".into(),
        source: Box::new(std::io::Error::other("connection reset")),
    };
    let doc = error.to_problem();
    assert!(
        doc.detail().unwrap().contains("connection reset"),
        "{doc:?}"
    );
}

#[test]
fn a_full_queue_says_how_many_other_upstreams_were_full_too() {
    let full = |also_full| {
        Error::QueueFull {
            upstream: "gpu-a".into(),
            model: "m".into(),
            retry_after: Duration::from_secs(2),
            also_full,
        }
        .to_problem()
    };
    assert_eq!(
        full(0).detail(),
        Some("Every slot and queue place for model `m` on upstream `gpu-a` is taken.")
    );
    assert_eq!(
        full(1).detail(),
        Some(
            "Every slot and queue place for model `m` is taken on upstream `gpu-a` and on 1 other upstream."
        )
    );
    let three = full(2);
    assert_eq!(
        three.detail(),
        Some(
            "Every slot and queue place for model `m` is taken on upstream `gpu-a` and on 2 other upstreams."
        )
    );
    assert_eq!(
        three.retry_after_secs(),
        Some(2),
        "the rest of the document is unchanged"
    );
}
