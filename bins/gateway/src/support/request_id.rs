//! The request id (`x-request-id`): accepted from the client when sane, generated otherwise,
//! sent upstream and back, and written into every problem document and log line of the request.

use http::header::{HeaderMap, HeaderName, HeaderValue};

/// The header that carries the request id.
pub(crate) const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// The request id to use: the client's `x-request-id` when it is sane, a new UUID otherwise.
///
/// "Sane" is 1 to 128 visible ASCII characters: ids end up in logs and in upstream requests, so
/// an arbitrary client value is not trusted beyond that.
pub(crate) fn request_id(headers: &HeaderMap) -> HeaderValue {
    if let Some(value) = headers.get(REQUEST_ID) {
        let bytes = value.as_bytes();
        if !bytes.is_empty() && bytes.len() <= 128 && bytes.iter().all(u8::is_ascii_graphic) {
            return value.clone();
        }
    }
    let id = uuid::Uuid::new_v4();
    let mut buf = uuid::Uuid::encode_buffer();
    HeaderValue::from_str(id.hyphenated().encode_lower(&mut buf))
        .unwrap_or_else(|_| HeaderValue::from_static("-"))
}
