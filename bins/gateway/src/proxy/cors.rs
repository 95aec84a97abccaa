//! Cross-origin requests from browsers (CORS), when `server.cors_origins` allows them.
//!
//! A web page served from another origin (a chat UI on `https://app.example.com` calling the
//! gateway with `fetch`) may read an answer only if it carries `Access-Control-Allow-Origin`
//! for that page's origin, and a request with an `Authorization` or JSON `Content-Type` header
//! is first *preflighted*: the browser sends `OPTIONS` with `Origin`,
//! `Access-Control-Request-Method` and `Access-Control-Request-Headers`, and sends the real
//! request only if the answer allows them (the Fetch standard, "CORS protocol").
//!
//! Off by default (`cors_origins = []`): no CORS header is ever sent, a preflight is refused
//! like any `OPTIONS` (405), and browsers keep other origins' pages out. With origins listed:
//!
//! - a preflight from a listed origin is answered `204` with `Access-Control-Allow-Origin`
//!   (the origin itself), `Access-Control-Allow-Methods: GET, POST, DELETE`,
//!   `Access-Control-Allow-Headers` (the headers the browser asked for, echoed: the gateway
//!   takes any request header), `Access-Control-Max-Age: 600` and `Vary: Origin`; it is
//!   answered before authentication, as browsers never send credentials on a preflight;
//! - every other answer to a listed origin, refusals and streams included, carries
//!   `Access-Control-Allow-Origin`, `Access-Control-Expose-Headers` (the gateway's own headers
//!   a script may want: the request id, `Retry-After`, the routing headers) and `Vary: Origin`;
//! - `"*"` allows every origin and answers `Access-Control-Allow-Origin: *` (no `Vary`).
//!
//! No `Access-Control-Allow-Credentials`: the API is authenticated by a header the page sets
//! itself, never by cookies. The admin listener never answers CORS.

use bytes::Bytes;
use http::header::{
    ACCESS_CONTROL_ALLOW_HEADERS, ACCESS_CONTROL_ALLOW_METHODS, ACCESS_CONTROL_ALLOW_ORIGIN,
    ACCESS_CONTROL_EXPOSE_HEADERS, ACCESS_CONTROL_MAX_AGE, ACCESS_CONTROL_REQUEST_HEADERS,
    ACCESS_CONTROL_REQUEST_METHOD, ORIGIN, VARY,
};
use http::{HeaderMap, HeaderValue, Method, Request, Response, StatusCode};

/// The methods the API routes take.
const METHODS: HeaderValue = HeaderValue::from_static("GET, POST, DELETE");
/// How long a browser may reuse a preflight's answer, in seconds: ten minutes, so a reload of
/// `cors_origins` reaches browsers soon.
const MAX_AGE: HeaderValue = HeaderValue::from_static("600");
/// The answer headers a script may read besides the CORS-safelisted ones.
const EXPOSED: HeaderValue = HeaderValue::from_static(
    "x-request-id, request-id, retry-after, x-slotgate-upstream, x-slotgate-queue-wait-ms",
);

/// The `Access-Control-Allow-Origin` value for a request from `origin`, if `origins` allow it.
fn allowed(origins: &[String], origin: Option<&HeaderValue>) -> Option<HeaderValue> {
    let origin = origin?;
    if origins.iter().any(|o| o == "*") {
        return Some(HeaderValue::from_static("*"));
    }
    let text = origin.to_str().ok()?;
    origins
        .iter()
        .any(|o| o.eq_ignore_ascii_case(text))
        .then(|| origin.clone())
}

/// The answer to `req` if it is a CORS preflight from an allowed origin; `None` otherwise (the
/// request goes on as any other).
pub(crate) fn preflight<B, R: From<Bytes>>(
    origins: &[String],
    req: &Request<B>,
) -> Option<Response<R>> {
    let headers = req.headers();
    if req.method() != Method::OPTIONS || !headers.contains_key(ACCESS_CONTROL_REQUEST_METHOD) {
        return None;
    }
    let allow_origin = allowed(origins, headers.get(ORIGIN))?;
    let mut response = Response::new(R::from(Bytes::new()));
    *response.status_mut() = StatusCode::NO_CONTENT;
    let out = response.headers_mut();
    let specific = allow_origin != "*";
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
    out.insert(ACCESS_CONTROL_ALLOW_METHODS, METHODS);
    if let Some(asked) = headers.get(ACCESS_CONTROL_REQUEST_HEADERS) {
        out.insert(ACCESS_CONTROL_ALLOW_HEADERS, asked.clone());
        out.append(
            VARY,
            HeaderValue::from_static("access-control-request-headers"),
        );
    }
    out.insert(ACCESS_CONTROL_MAX_AGE, MAX_AGE);
    if specific {
        out.append(VARY, HeaderValue::from_static("origin"));
    }
    Some(response)
}

/// Adds the CORS headers to an answer (`out`) to a request from `origin`, if `origins` allow
/// it.
pub(crate) fn decorate(origins: &[String], origin: Option<&HeaderValue>, out: &mut HeaderMap) {
    if origins.is_empty() {
        return;
    }
    let Some(allow_origin) = allowed(origins, origin) else {
        return;
    };
    let specific = allow_origin != "*";
    out.insert(ACCESS_CONTROL_ALLOW_ORIGIN, allow_origin);
    out.insert(ACCESS_CONTROL_EXPOSE_HEADERS, EXPOSED);
    if specific {
        out.append(VARY, HeaderValue::from_static("origin"));
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue, Method, Request, Response};

    use super::{decorate, preflight};

    fn origins(list: &[&str]) -> Vec<String> {
        list.iter().map(|&o| o.to_owned()).collect()
    }

    fn preflight_from(origin: &str) -> Request<()> {
        Request::builder()
            .method(Method::OPTIONS)
            .uri("/v1/chat/completions")
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                "authorization, content-type",
            )
            .body(())
            .unwrap()
    }

    #[test]
    fn a_listed_origin_is_preflighted_and_others_are_not() {
        let list = origins(&["https://app.example.com"]);
        let ok: Response<Bytes> =
            preflight(&list, &preflight_from("https://app.example.com")).expect("answered");
        assert_eq!(ok.status(), 204);
        let h = ok.headers();
        assert_eq!(h["access-control-allow-origin"], "https://app.example.com");
        assert_eq!(h["access-control-allow-methods"], "GET, POST, DELETE");
        assert_eq!(
            h["access-control-allow-headers"],
            "authorization, content-type"
        );
        assert!(h.get_all("vary").iter().any(|v| v == "origin"));
        let other: Option<Response<Bytes>> =
            preflight(&list, &preflight_from("https://evil.example"));
        assert!(other.is_none());
        let off: Option<Response<Bytes>> =
            preflight(&[], &preflight_from("https://app.example.com"));
        assert!(off.is_none(), "off by default");
        // A plain OPTIONS (no request method) is no preflight.
        let plain = Request::options("/").header("origin", "https://app.example.com");
        let plain: Option<Response<Bytes>> = preflight(&list, &plain.body(()).unwrap());
        assert!(plain.is_none());
    }

    #[test]
    fn answers_to_allowed_origins_carry_the_headers() {
        let list = origins(&["https://app.example.com"]);
        let origin = HeaderValue::from_static("https://app.example.com");
        let mut out = HeaderMap::new();
        decorate(&list, Some(&origin), &mut out);
        assert_eq!(
            out["access-control-allow-origin"],
            "https://app.example.com"
        );
        assert!(
            out["access-control-expose-headers"]
                .to_str()
                .unwrap()
                .contains("x-request-id")
        );
        let mut out = HeaderMap::new();
        decorate(
            &list,
            Some(&HeaderValue::from_static("https://evil.example")),
            &mut out,
        );
        assert!(out.is_empty());
        let mut out = HeaderMap::new();
        decorate(&origins(&["*"]), Some(&origin), &mut out);
        assert_eq!(out["access-control-allow-origin"], "*");
        assert!(out.get("vary").is_none());
        let mut out = HeaderMap::new();
        decorate(&list, None, &mut out);
        assert!(out.is_empty(), "no Origin, not a CORS request");
    }
}
