//! Building answers: the [`Refusal`] a request gets before it holds a slot, JSON and plain
//! responses, and the small readers for query strings and JSON bodies. A leaf below both the
//! kinds and the request handler, so neither has to import the other for these.

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::{Value, json};

use crate::body::ResponseBody;
use crate::observer::{Outcome, Tracker};

/// Request bodies larger than this are refused; no test needs more (the biggest is a multipart
/// audio upload).
pub(crate) const MAX_BODY: usize = 32 * 1024 * 1024;

/// A refusal before any slot is taken: status, message, and the `param` vLLM names.
#[derive(Debug)]
pub(crate) struct Refusal {
    pub(crate) status: u16,
    pub(crate) message: String,
    pub(crate) param: Option<&'static str>,
}

impl Refusal {
    pub(crate) fn new(status: u16, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            param: None,
        }
    }
}

/// Records the status and outcome, then hands the response on.
pub(crate) fn finish(
    mut tracker: Tracker,
    response: Response<ResponseBody>,
    outcome: Outcome,
) -> Response<ResponseBody> {
    tracker.status(response.status().as_u16());
    tracker.finish(outcome);
    response
}

/// A JSON response.
pub(crate) fn json_response(status: u16, body: &Value) -> Response<ResponseBody> {
    let bytes = serde_json::to_vec(body).expect("a Value always serialises");
    response(status, "application/json", bytes)
}

/// A response with a body of the given type.
pub(crate) fn response(
    status: u16,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<ResponseBody> {
    let mut response = Response::new(ResponseBody::full(body));
    *response.status_mut() =
        StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

/// A streamed response of the given type (`text/event-stream` gets `cache-control: no-cache`
/// as the servers send it).
pub(crate) fn stream_response(
    content_type: &'static str,
    body: ResponseBody,
) -> Response<ResponseBody> {
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    if content_type == "text/event-stream" {
        headers.insert(
            http::header::CACHE_CONTROL,
            HeaderValue::from_static("no-cache"),
        );
    }
    response
}

/// The `?name=value` pairs of a request, decoded.
pub(crate) fn query_param(req: &Request<Incoming>, name: &str) -> Option<String> {
    let query = req.uri().query()?;
    form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.into_owned())
}

/// A JSON body of a small POST (router `/models/load`), or `Value::Null` if unreadable.
pub(crate) async fn read_json(req: Request<Incoming>) -> Value {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => serde_json::from_slice(&body.to_bytes()).unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

/// `{"success":true}`, the router's answer to a load or unload.
pub(crate) fn success() -> Value {
    json!({"success": true})
}
