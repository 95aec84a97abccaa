//! Reading a `multipart/form-data` body (audio transcription and translation, as OpenAI's API
//! sends them) with `multer`: the text fields and the size of the `file` part.

use std::collections::BTreeMap;
use std::convert::Infallible;

use bytes::Bytes;

/// What an audio request's form held.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Form {
    /// The text fields (`model`, `language`, `response_format`, `prompt`, ...).
    pub(crate) fields: BTreeMap<String, String>,
    /// The `file` part's size in bytes, if one was sent.
    pub(crate) file_len: Option<usize>,
}

/// Why a form could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FormError {
    /// The content type is not `multipart/form-data` with a boundary.
    #[error("expected a multipart/form-data body with a boundary")]
    NotMultipart(#[source] multer::Error),
    /// The body is not a well-formed form.
    #[error("malformed multipart body")]
    Malformed(#[source] multer::Error),
}

/// Reads every part of `body`; `content_type` is the request's `Content-Type`.
pub(crate) async fn read(content_type: &str, body: Bytes) -> Result<Form, FormError> {
    let boundary = multer::parse_boundary(content_type).map_err(FormError::NotMultipart)?;
    let stream = futures::stream::once(async move { Ok::<Bytes, Infallible>(body) });
    let mut multipart = multer::Multipart::new(stream, boundary);
    let mut form = Form::default();
    while let Some(field) = multipart.next_field().await.map_err(FormError::Malformed)? {
        let name = field.name().unwrap_or_default().to_owned();
        if name == "file" || field.file_name().is_some() {
            let bytes = field.bytes().await.map_err(FormError::Malformed)?;
            form.file_len = Some(bytes.len());
        } else {
            let text = field.text().await.map_err(FormError::Malformed)?;
            form.fields.insert(name, text);
        }
    }
    Ok(form)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn reads_fields_and_the_file() {
        let body = "--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n\
                    --b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
                    Content-Type: audio/wav\r\n\r\nRIFF1234\r\n--b--\r\n";
        let form = read("multipart/form-data; boundary=b", Bytes::from(body))
            .await
            .unwrap();
        assert_eq!(form.fields["model"], "whisper");
        assert_eq!(form.file_len, Some(8));
        assert!(read("application/json", Bytes::new()).await.is_err());
    }
}
