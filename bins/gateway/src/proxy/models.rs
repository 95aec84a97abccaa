//! The OpenAI model listings the gateway answers itself, from the routing table:
//! `GET /v1/models` and `GET /v1/models/{id}`.
//!
//! A model (or alias) is listed while some healthy, undrained upstream serves it: asking for
//! one whose every upstream is down or draining would only get a 503. Ollama's own listings
//! are in [`ollama`](crate::proxy::ollama).

use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::Full;

use crate::proxy::problems::Error;
use crate::proxy::route::Routes;

/// The path of the list.
pub(crate) const LIST: &str = "/v1/models";
/// The prefix of one model's entry.
pub(crate) const ONE: &str = "/v1/models/";

/// `GET /v1/models`: every model (and alias) some healthy, undrained upstream serves, in the
/// OpenAI list shape; `started` is every entry's `created`.
pub(crate) fn list(routes: &Routes, started: SystemTime) -> Response<Full<Bytes>> {
    let data: Vec<serde_json::Value> = routes
        .names()
        .iter()
        .filter(|name| {
            routes
                .resolve(name)
                .is_some_and(|route| route.is_available())
        })
        .map(|name| entry(name, started))
        .collect();
    let body = serde_json::json!({ "object": "list", "data": data }).to_string();
    json_response(body)
}

/// `GET /v1/models/{id}`: the model (or alias) in the shape of one `/v1/models` entry, while
/// some healthy, undrained upstream serves it.
pub(crate) fn one(
    routes: &Routes,
    id: &str,
    started: SystemTime,
) -> Result<Response<Full<Bytes>>, Error> {
    let served = routes.resolve(id).is_some_and(|route| route.is_available());
    if !served {
        return Err(Error::ModelNotFound {
            model: id.chars().take(200).collect(),
        });
    }
    Ok(json_response(entry(id, started).to_string()))
}

/// One entry of `/v1/models`.
fn entry(name: &str, started: SystemTime) -> serde_json::Value {
    let created = started
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    serde_json::json!({
        "id": name,
        "object": "model",
        "created": created,
        "owned_by": "slotgate",
    })
}

/// A `200` JSON document.
pub(crate) fn json_response(body: String) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
