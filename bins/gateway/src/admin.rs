//! The admin listener (`server.admin_listen`): probes and metrics, apart from the API so that
//! they can be firewalled separately and never queue behind client traffic.
//!
//! - `GET /healthz` — liveness: `200` while the process serves at all.
//! - `GET /readyz` — readiness: `200` until shutdown begins, then `503 shutting-down`, so a
//!   load balancer stops sending new requests while in-flight ones drain.
//! - `GET /metrics` — Prometheus metrics in the `OpenMetrics` text format (see
//!   [`metrics`](crate::metrics) for the list).

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};
use http_body_util::Full;
use prometheus_client::registry::Registry;

use crate::forward::{self, REQUEST_ID};
use crate::rescue::{self, Error};
use crate::server::ShutdownSignal;

const GET_ONLY: &[Method] = &[Method::GET, Method::HEAD];

/// The admin endpoints' state.
#[derive(Debug)]
pub struct Admin {
    /// Every metric.
    pub registry: Registry,
    /// Fired when the API starts draining.
    pub draining: ShutdownSignal,
    /// `Retry-After` on `/readyz` while draining.
    pub retry_after: Duration,
}

impl Admin {
    /// Answers one admin request.
    pub fn handle<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        let request_id = forward::request_id(req.headers());
        let mut response = match self.dispatch(req) {
            Ok(response) => response,
            Err(error) => rescue::respond(&error, &request_id),
        };
        response.headers_mut().insert(REQUEST_ID, request_id);
        response
    }

    fn dispatch<B>(&self, req: &Request<B>) -> Result<Response<Full<Bytes>>, Error> {
        let path = req.uri().path();
        if !matches!(path, "/healthz" | "/readyz" | "/metrics") {
            return Err(Error::NotFound {
                path: path.chars().take(200).collect(),
            });
        }
        if !GET_ONLY.contains(req.method()) {
            return Err(Error::MethodNotAllowed {
                method: req.method().clone(),
                path: path.to_owned(),
                allow: GET_ONLY,
            });
        }
        match path {
            "/healthz" => Ok(text(
                "application/json",
                Bytes::from_static(br#"{"status":"ok"}"#),
            )),
            "/readyz" if self.draining.is_fired() => Err(Error::ShuttingDown {
                retry_after: self.retry_after,
            }),
            "/readyz" => Ok(text(
                "application/json",
                Bytes::from_static(br#"{"status":"ready"}"#),
            )),
            _ => {
                let mut buffer = String::new();
                prometheus_client::encoding::text::encode(&mut buffer, &self.registry)
                    .map_err(|_| Error::Internal("encoding metrics failed".into()))?;
                Ok(text(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    Bytes::from(buffer),
                ))
            }
        }
    }
}

fn text(content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
