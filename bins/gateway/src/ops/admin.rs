//! The admin listener (`server.admin_listen`): probes, metrics and the operator's API, apart
//! from the client API so that they can be firewalled separately and never queue behind client
//! traffic.
//!
//! | endpoint | answer |
//! |---|---|
//! | `GET /healthz` | liveness: `200 {"status":"ok"}` while the process serves at all |
//! | `GET /readyz` | readiness: `200` while the configuration is loaded, at least one upstream is healthy and not draining, and the gateway is not shutting down; `503` otherwise. The JSON body says which |
//! | `GET /metrics` | Prometheus metrics, `OpenMetrics` text format (see [`metrics`](crate::metrics) and `docs/metrics.md`) |
//! | `GET /admin/upstreams` | every upstream: health, draining, the engine-wide cap (`slots`: `parallel`, `in_flight`, `blocked_models`; `null` without one), resident models, and per model the limits, the slot count in force (`slots`; `discovery` for `parallel = "auto"`), in-flight and queued requests, and the engine's own counts (`engine`, see [`reconcile`](crate::upstreams::reconcile)) |
//! | `POST /admin/upstreams/{name}/drain` | stop sending new requests to the upstream; in-flight ones finish. Answers the upstream's status |
//! | `POST /admin/upstreams/{name}/undrain` | take new requests again |
//! | `GET /ui` | the live status page ([`status`](crate::ops::status)): static HTML, CSS and JavaScript embedded in the binary, served without the token (it carries no data) |
//! | `GET /admin/events` | the page's server-sent event stream: every upstream's status and the page's live figures, about once a second |
//! | `POST /admin/reload` | reload the configuration file (see [`reload`](crate::ops::reload)): `200` with what changed, or a problem document: `422 config-refused` listing every problem in `issues` (the running configuration stays), `409 reload-unavailable` when the gateway was not started from a file |
//!
//! When `server.admin_token` is set, every `/admin/*` request must carry it as
//! `Authorization: Bearer <token>` (compared in constant time; never logged); otherwise it gets
//! a `401` problem. The probes and `/metrics` stay open, so that orchestrators and scrapers need
//! no secret.

use std::sync::Arc;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use parking_lot::Mutex;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::ops::reload::{ReloadError, Reloader};
use crate::ops::status::events::{self, EventBody};
use crate::ops::status::history::History;
use crate::ops::status::page::{self, Asset, CONTENT_SECURITY_POLICY};
use crate::ops::upstream_doc::{StoreDoc, UpstreamDoc, rfc3339, upstream_status};
use crate::proxy::live::{Generation, Live};
use crate::proxy::problems::{Error, GET_ONLY, POST_ONLY, allow, not_found};
use crate::support::request_id::{REQUEST_ID, request_id};
use crate::support::shutdown::ShutdownSignal;

mod error;
pub(crate) use error::AdminError;

/// The admin endpoints' state.
#[derive(Debug)]
pub(crate) struct Admin {
    /// Every metric.
    pub(crate) registry: Registry,
    /// The configuration in force and the upstreams' state.
    pub(crate) live: Arc<Live>,
    /// Reloads the configuration file.
    pub(crate) reloader: Arc<Reloader>,
    /// Fired when the gateway starts shutting down.
    pub(crate) shutdown: ShutdownSignal,
    /// What the status page remembers, filled by its
    /// [`sampler`](crate::ops::status::sampler).
    pub(crate) history: Arc<Mutex<History>>,
}

/// An admin answer's body: a whole document, or the status page's event stream.
pub(crate) type AdminBody = Either<Full<Bytes>, EventBody>;

impl Admin {
    /// Answers one admin request.
    pub(crate) async fn handle<B>(&self, req: Request<B>) -> Response<AdminBody> {
        let request_id = request_id(req.headers());
        let mut response = match self.dispatch(&req).await {
            Ok(response) => response,
            Err(error) => error.respond::<Full<Bytes>>(&request_id).map(Either::Left),
        };
        response.headers_mut().insert(REQUEST_ID, request_id);
        response
    }

    async fn dispatch<B>(&self, req: &Request<B>) -> Result<Response<AdminBody>, AdminError> {
        let path = req.uri().path();
        let generation = self.live.current();
        if let Some(asset) = page::asset(path) {
            allow(req, GET_ONLY)?;
            let token_required = generation.config.server.admin_token.is_some();
            return Ok(page_file(asset, token_required));
        }
        match path {
            "/healthz" => {
                allow(req, GET_ONLY)?;
                json_response(StatusCode::OK, &Liveness { status: "ok" })
            }
            "/readyz" => {
                allow(req, GET_ONLY)?;
                self.readiness(&generation)
            }
            "/metrics" => {
                allow(req, GET_ONLY)?;
                let mut buffer = String::new();
                prometheus_client::encoding::text::encode(&mut buffer, &self.registry).map_err(
                    |error| Error::Internal {
                        what: "encoding the metrics",
                        source: Box::new(error),
                    },
                )?;
                Ok(text(
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    Bytes::from(buffer),
                ))
            }
            _ if path == "/admin" || path.starts_with("/admin/") => {
                authorize(&generation, req.headers())?;
                self.operator(req, path, &generation).await
            }
            _ => Err(not_found(path).into()),
        }
    }

    /// `/admin/*`, once authorized.
    async fn operator<B>(
        &self,
        req: &Request<B>,
        path: &str,
        generation: &Generation,
    ) -> Result<Response<AdminBody>, AdminError> {
        if path == "/admin/events" {
            allow(req, GET_ONLY)?;
            let body = events::stream(
                Arc::clone(&self.live),
                Arc::clone(&self.history),
                self.shutdown.clone(),
            );
            let mut response = Response::new(Either::Right(body));
            let headers = response.headers_mut();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(events::CONTENT_TYPE),
            );
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            // Proxies in front of the listener must pass each event on at once.
            headers.insert("x-accel-buffering", HeaderValue::from_static("no"));
            return Ok(response);
        }
        if path == "/admin/upstreams" {
            allow(req, GET_ONLY)?;
            let upstreams = generation
                .upstreams
                .iter()
                .map(|u| upstream_status(generation, u))
                .collect();
            return json_response(
                StatusCode::OK,
                &UpstreamsDoc {
                    generation: generation.number,
                    loaded_at: rfc3339(generation.loaded_at),
                    store: generation.cluster.as_ref().map(StoreDoc::new),
                    last_reload_refused: self.reloader.last_refused().map(|refused| RefusedDoc {
                        at: rfc3339(refused.at),
                        issues: refused.issues,
                    }),
                    upstreams,
                },
            );
        }
        if path == "/admin/reload" {
            allow(req, POST_ONLY)?;
            return match self.reloader.reload().await {
                Ok(reloaded) => json_response(
                    StatusCode::OK,
                    &ReloadDoc {
                        reloaded: true,
                        generation: reloaded.generation,
                        added: reloaded.added,
                        removed: reloaded.removed,
                        changed: reloaded.changed,
                        restart_required: reloaded.restart_required,
                    },
                ),
                // Refusals are problem documents ([`AdminError`]).
                Err(ReloadError::NoSource) => Err(AdminError::ReloadUnavailable {
                    generation: generation.number,
                    source: Box::new(ReloadError::NoSource),
                }),
                Err(refused) => Err(AdminError::ConfigRefused {
                    issues: refused.issues(),
                    generation: generation.number,
                    source: Box::new(refused),
                }),
            };
        }
        if let Some(rest) = path.strip_prefix("/admin/upstreams/")
            && let Some((name, action)) = rest.rsplit_once('/')
            && matches!(action, "drain" | "undrain")
        {
            let Some(upstream) = generation.upstreams.get(name) else {
                return Err(not_found(path).into());
            };
            allow(req, POST_ONLY)?;
            upstream.set_draining(action == "drain");
            return json_response(StatusCode::OK, &upstream_status(generation, upstream));
        }
        Err(not_found(path).into())
    }

    /// `/readyz`: ready while configured, not shutting down, and some upstream can take
    /// requests.
    fn readiness(&self, generation: &Generation) -> Result<Response<AdminBody>, AdminError> {
        let shutting_down = self.shutdown.is_fired();
        let available = generation
            .upstreams
            .iter()
            .filter(|u| u.is_available())
            .count();
        let ready = !shutting_down && available > 0;
        let mut response = json_response(
            if ready {
                StatusCode::OK
            } else {
                StatusCode::SERVICE_UNAVAILABLE
            },
            &Readiness {
                status: if ready { "ready" } else { "not ready" },
                config_generation: generation.number,
                shutting_down,
                upstreams: generation.upstreams.len(),
                available_upstreams: available,
            },
        )?;
        if !ready {
            response.headers_mut().insert(
                header::RETRY_AFTER,
                // The interval in force: a reload that changes it changes this too.
                HeaderValue::from(
                    generation
                        .config
                        .server
                        .health_check_interval
                        .as_secs()
                        .max(1),
                ),
            );
        }
        Ok(response)
    }
}

/// Checks the admin token, when one is configured.
fn authorize(generation: &Generation, headers: &HeaderMap) -> Result<(), Error> {
    let Some(expected) = &generation.config.server.admin_token else {
        return Ok(());
    };
    let offered = crate::proxy::auth::bearer_token(headers).unwrap_or_default();
    if constant_time_eq::constant_time_eq(offered.as_bytes(), expected.expose().as_bytes()) {
        Ok(())
    } else {
        Err(Error::Unauthorized)
    }
}

// === the documents ===
//
// Field names are the JSON members. `Option` fields are written as `null` when empty, except
// `engine` and `discovery`, which are left out when they do not apply.

/// `GET /healthz`.
#[derive(Debug, Serialize)]
struct Liveness {
    status: &'static str,
}

/// `GET /readyz`.
#[derive(Debug, Serialize)]
struct Readiness {
    status: &'static str,
    config_generation: u64,
    shutting_down: bool,
    upstreams: usize,
    available_upstreams: usize,
}

/// `GET /admin/upstreams`.
#[derive(Debug, Serialize)]
struct UpstreamsDoc<'g> {
    generation: u64,
    loaded_at: String,
    /// Under `[cluster]`: the shared slot store.
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<StoreDoc>,
    /// The last reload, when it was refused (`null` once one is applied, or before any).
    last_reload_refused: Option<RefusedDoc>,
    upstreams: Vec<UpstreamDoc<'g>>,
}

/// A refused reload in `GET /admin/upstreams`.
#[derive(Debug, Serialize)]
struct RefusedDoc {
    at: String,
    issues: Vec<String>,
}

/// `POST /admin/reload`, when the new configuration is in force.
#[derive(Debug, Serialize)]
struct ReloadDoc {
    reloaded: bool,
    generation: u64,
    added: Vec<String>,
    removed: Vec<String>,
    changed: Vec<String>,
    restart_required: Vec<&'static str>,
}

fn json_response(
    status: StatusCode,
    body: &impl Serialize,
) -> Result<Response<AdminBody>, AdminError> {
    // The documents are structs of strings, numbers and lists, which always serialize; a failure
    // would be a bug, answered as one.
    let body = serde_json::to_vec(body).map_err(|error| Error::Internal {
        what: "serializing an admin document",
        source: Box::new(error),
    })?;
    let mut response = text("application/json", Bytes::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(response)
}

/// One of the status page's files, with the headers that keep the page to itself.
fn page_file(asset: Asset, token_required: bool) -> Response<AdminBody> {
    let mut response = text(asset.content_type, asset.bytes(token_required));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    // Always the current build's page: an upgraded gateway must not meet an old script.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

fn text(content_type: &'static str, body: Bytes) -> Response<AdminBody> {
    let mut response = Response::new(Either::Left(Full::new(body)));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
