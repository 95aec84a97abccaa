//! What makes a request unusable as it is: [`BadRequest`], the `detail` of a 400
//! `bad-request` problem, and whether a header or the body is at fault.

/// What makes a request unusable as it is: the `detail` of its 400 `bad-request` problem.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BadRequest {
    /// `Content-Length` is not a number.
    #[error("invalid Content-Length header")]
    ContentLength,
    /// A JSON route got something other than an object (an array, a string, …).
    #[error("the request body must be a JSON object")]
    NotAnObject,
    /// The body does not parse as JSON.
    #[error("the request body is not valid JSON")]
    Json(#[source] serde_json::Error),
    /// A route that needs `model` got a body without it.
    #[error("the request body has no `model` member")]
    NoModel,
    /// Ollama's `/api/copy` got a body without `source`.
    #[error("the request body has no `source` member (the model to copy)")]
    NoSource,
    /// `model` is there, but not a string.
    #[error("`model` must be a string")]
    ModelNotString,
    /// `model` is the empty string (in a JSON body or a form).
    #[error("`model` must not be empty")]
    EmptyModel,
    /// A count member (`n`, `best_of`) is not a positive integer.
    #[error("`{member}` must be a positive integer")]
    Count {
        /// The member's name.
        member: &'static str,
    },
    /// An upload route got a body that is not `multipart/form-data` with a boundary.
    #[error("this route takes a multipart/form-data body with a boundary, not {content_type:?}")]
    NotMultipart {
        /// The `Content-Type` the client sent (cut to 100 characters: it is echoed).
        content_type: String,
    },
    /// The multipart body is broken before its `model` field.
    #[error("the multipart body is malformed")]
    Multipart(#[source] multer::Error),
    /// The form has no `model` field.
    #[error("the form has no `model` field")]
    FormNoModel,
    /// The form's `model` field could not be read as text.
    #[error("the `model` field could not be read")]
    FormModel(#[source] multer::Error),
    /// The form's `model` value was read but not found again in the body (to rename it).
    #[error("the `model` field of the form could not be located")]
    FormModelNotLocated,
    /// The tenant header (`server.tenant_header`) is not visible ASCII.
    #[error("the `{header}` header must be visible ASCII text")]
    TenantNotText {
        /// The header's name.
        header: String,
    },
    /// The tenant header names a tenant longer than a tenant name may be.
    #[error(
        "the `{header}` header is {len} bytes long; a tenant name has at most {max}",
        max = slotgate_config::Server::MAX_TENANT_LEN
    )]
    TenantTooLong {
        /// The header's name.
        header: String,
        /// The value's length, in bytes.
        len: usize,
    },
    /// An HTTP/1.1 request without a `Host` field (RFC 9112 §3.2).
    #[error("an HTTP/1.1 request must carry a `Host` header field")]
    NoHost,
    /// An HTTP/1.1 request with more than one `Host` field line (RFC 9112 §3.2).
    #[error("the request carries {count} `Host` header fields; HTTP/1.1 allows exactly one")]
    ManyHosts {
        /// How many.
        count: usize,
    },
    /// A `Host` value that is not an authority (`host` or `host:port`) (RFC 9112 §3.2).
    #[error("the `Host` header field is not a valid host (and port)")]
    BadHost,
    /// `x-slotgate-max-wait` is not a duration.
    #[error("the `{header}` header must be a duration such as `5s` or `1500ms`")]
    MaxWait {
        /// The header's name.
        header: http::HeaderName,
    },
    /// The body names no model, and the route serves more (or fewer) than one.
    #[error(
        "the request body has no `model` member, and {route} does not serve exactly one model; \
         name one"
    )]
    ModelNeeded {
        /// The route asked for.
        route: &'static str,
    },
}

impl BadRequest {
    /// The header at fault, when it is a header and not the body.
    pub(super) fn header(&self) -> Option<&str> {
        match self {
            BadRequest::TenantNotText { header } | BadRequest::TenantTooLong { header, .. } => {
                Some(header)
            }
            BadRequest::MaxWait { header } => Some(header.as_str()),
            BadRequest::ContentLength => Some("content-length"),
            _ => None,
        }
    }

    /// The problem's `detail`: what is wrong and, for a parse error, the parser's own words
    /// (its first cause only, as the client needs no deeper chain).
    pub(crate) fn detail(&self) -> String {
        use std::error::Error as _;
        match self.source() {
            Some(source) => format!("{self}: {source}"),
            None => self.to_string(),
        }
    }
}
