//! Turning a [`Problem`] into bytes and into an HTTP response.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};

use crate::{CONTENT_TYPE, Kind, Problem};

/// Sent if serialisation ever failed. It cannot for this type (string keys, JSON values, a
/// serialiser writing to memory), but the gateway must never panic on an error path, so the
/// impossible case still yields a well-formed `internal` document.
pub(crate) const FALLBACK_JSON: &str = concat!(
    r#"{"type":"https://slotgate.dev/problems/internal","title":"Internal gateway error","#,
    r#""status":500,"error":{"message":"The gateway hit an unexpected error.","#,
    r#""type":"server_error","param":null,"code":"internal"}}"#
);

impl Problem {
    /// The document as `application/problem+json` bytes.
    pub fn to_json_bytes(&self) -> Bytes {
        serde_json::to_vec(self).map_or_else(
            |_| Bytes::from_static(FALLBACK_JSON.as_bytes()),
            Bytes::from,
        )
    }

    /// The complete HTTP response for this problem.
    ///
    /// - status: [`Problem::status`];
    /// - `content-type: application/problem+json`;
    /// - `cache-control: no-store`: the answer is about this moment (a full queue, a host
    ///   down), and a cache that kept it would refuse requests that would now succeed;
    /// - `retry-after`: [`Problem::retry_after_secs`] (whole seconds, rounded up, at least 1),
    ///   when set;
    /// - `www-authenticate: Bearer` on 401, as RFC 9110 §11.6.1 requires;
    /// - `allow` on 405, listing the methods the route accepts (RFC 9110 §15.5.6).
    ///
    /// The body type is anything that can be built from [`Bytes`]: `Full<Bytes>` from
    /// `http-body-util`, `Bytes` itself, or a boxed body via a `From` impl of the caller's.
    ///
    /// ```
    /// use std::time::Duration;
    /// use bytes::Bytes;
    /// use slotgate_problem::Problem;
    ///
    /// let res: http::Response<Bytes> =
    ///     Problem::shutting_down(Duration::from_millis(1500)).to_response();
    /// assert_eq!(res.status(), 503);
    /// assert_eq!(res.headers()["content-type"], "application/problem+json");
    /// assert_eq!(res.headers()["retry-after"], "2");
    /// assert_eq!(res.headers()["cache-control"], "no-store");
    /// ```
    pub fn to_response<B: From<Bytes>>(&self) -> Response<B> {
        let mut response = Response::new(B::from(self.to_json_bytes()));
        *response.status_mut() = self.status();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(CONTENT_TYPE));
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        if let Some(secs) = self.retry_after_secs() {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if self.status() == StatusCode::UNAUTHORIZED {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if self.kind() == Kind::MethodNotAllowed {
            // An empty `Allow` is valid and means "no method", so it is sent even then.
            let list = self
                .allow
                .iter()
                .map(http::Method::as_str)
                .collect::<Vec<_>>()
                .join(", ");
            // Method names are tokens, which are always valid header values.
            if let Ok(value) = HeaderValue::from_str(&list) {
                headers.insert(header::ALLOW, value);
            }
        }
        response
    }
}
