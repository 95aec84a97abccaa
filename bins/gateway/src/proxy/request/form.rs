//! The model of an upload: `multipart/form-data` (`/v1/audio/transcriptions`,
//! `/v1/audio/translations`), read with `multer` only until its `model` field.
//!
//! The body is already in memory (it is forwarded byte for byte, so it has to be); `multer`
//! walks the parts in order and stops at `model`, so a large `file` part before it is skipped,
//! not copied. Where the upstream calls the model by another name (an alias), the value's bytes
//! are found between the part's header block and the next boundary delimiter: a delimiter
//! never occurs inside a part (RFC 2046 §5.1.1), so splitting on it cannot cut a value.

use std::convert::Infallible;
use std::ops::Range;

use bytes::Bytes;
use http::HeaderMap;
use http::header::CONTENT_TYPE;

use crate::proxy::problems::{BadRequest, Error};

/// The boundary of a `multipart/form-data` body, from its `Content-Type`; checked before a byte
/// of the body is read.
pub(super) fn boundary(headers: &HeaderMap) -> Result<String, Error> {
    let content_type = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .unwrap_or_default();
    multer::parse_boundary(content_type).map_err(|_| {
        Error::from(BadRequest::NotMultipart {
            content_type: content_type.chars().take(100).collect(),
        })
    })
}

/// The `model` field of the form in `body`, and where its value sits in `body`.
pub(super) async fn model(boundary: String, body: &Bytes) -> Result<(String, Range<usize>), Error> {
    let whole = body.clone();
    let stream = futures::stream::once(async move { Ok::<Bytes, Infallible>(whole) });
    let mut form = multer::Multipart::new(stream, boundary.clone());
    let model = loop {
        let field = form.next_field().await.map_err(BadRequest::Multipart)?;
        let Some(field) = field else {
            return Err(BadRequest::FormNoModel.into());
        };
        if field.name() == Some("model") {
            break field.text().await.map_err(BadRequest::FormModel)?;
        }
    };
    if model.is_empty() {
        return Err(BadRequest::EmptyModel.into());
    }
    let span = value_span(body, &boundary, &model).ok_or(BadRequest::FormModelNotLocated)?;
    Ok((model, span))
}

/// Where the value of the part named `model` sits in `body`, checked against `model` as
/// `multer` read it.
fn value_span(body: &[u8], boundary: &str, model: &str) -> Option<Range<usize>> {
    let delimiter = format!("\r\n--{boundary}");
    // The first delimiter may open the body without the CRLF before it.
    let mut at = find(body, &delimiter.as_bytes()[2..], 0)?;
    loop {
        let part_start = at + delimiter.len() - 2;
        let next = find(body, delimiter.as_bytes(), part_start)?;
        let part = &body[part_start..next];
        let headers_end = find(part, b"\r\n\r\n", 0)?;
        let headers = String::from_utf8_lossy(&part[..headers_end]).to_ascii_lowercase();
        let value = part_start + headers_end + 4..next;
        if headers.contains("name=\"model\"") && &body[value.clone()] == model.as_bytes() {
            return Some(value);
        }
        at = next + 2;
    }
}

fn find(haystack: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    haystack
        .get(from..)?
        .windows(needle.len())
        .position(|window| window == needle)
        .map(|i| i + from)
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use bytes::Bytes;
    use http::HeaderMap;

    use super::{boundary, model};

    fn form(fields: &[(&str, &str)]) -> (HeaderMap, Bytes) {
        let mut body = String::new();
        for (name, value) in fields {
            let filename = if *name == "file" {
                "; filename=\"a.wav\""
            } else {
                ""
            };
            write!(
                body,
                "--XyZ\r\nContent-Disposition: form-data; name=\"{name}\"{filename}\r\n\r\n{value}\r\n"
            )
            .unwrap();
        }
        body.push_str("--XyZ--\r\n");
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-type",
            "multipart/form-data; boundary=XyZ".parse().unwrap(),
        );
        (headers, Bytes::from(body))
    }

    #[tokio::test]
    async fn finds_the_model_after_the_file() {
        let (headers, body) = form(&[("file", "RIFF model\r\n--Xy"), ("model", "whisper-1")]);
        let (found, span) = model(boundary(&headers).unwrap(), &body).await.unwrap();
        assert_eq!(found, "whisper-1");
        assert_eq!(&body[span], b"whisper-1");
    }

    #[tokio::test]
    async fn refuses_a_form_without_model_and_a_json_body() {
        let (headers, body) = form(&[("file", "RIFF")]);
        assert!(model(boundary(&headers).unwrap(), &body).await.is_err());
        let mut json = HeaderMap::new();
        json.insert("content-type", "application/json".parse().unwrap());
        assert!(boundary(&json).is_err());
    }
}
