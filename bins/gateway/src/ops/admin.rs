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
//! | `POST /admin/reload` | reload the configuration file (see [`reload`](crate::ops::reload)): `200` with what changed, or a problem document: `422 config-refused` listing every problem in `issues` (the running configuration stays), `409 reload-unavailable` when the gateway was not started from a file |
//!
//! When `server.admin_token` is set, every `/admin/*` request must carry it as
//! `Authorization: Bearer <token>` (compared in constant time; never logged); otherwise it gets
//! a `401` problem. The probes and `/metrics` stay open, so that orchestrators and scrapers need
//! no secret.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::Full;
use prometheus_client::registry::Registry;
use serde::Serialize;

use crate::ops::reload::{ReloadError, Reloader};
use crate::proxy::live::{Generation, Live};
use crate::proxy::problems::{self, Error, GET_ONLY, POST_ONLY, allow, not_found};
use crate::request_id::{REQUEST_ID, request_id};
use crate::shutdown::ShutdownSignal;
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::{Sizing, Target};

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
    /// `Retry-After` on `/readyz` while not ready.
    pub(crate) retry_after: Duration,
}

impl Admin {
    /// Answers one admin request.
    pub(crate) async fn handle<B>(&self, req: Request<B>) -> Response<Full<Bytes>> {
        let request_id = request_id(req.headers());
        let mut response = match self.dispatch(&req).await {
            Ok(response) => response,
            Err(error) => problems::respond(&error, &request_id),
        };
        response.headers_mut().insert(REQUEST_ID, request_id);
        response
    }

    async fn dispatch<B>(&self, req: &Request<B>) -> Result<Response<Full<Bytes>>, Error> {
        let path = req.uri().path();
        let generation = self.live.current();
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
            _ => Err(not_found(path)),
        }
    }

    /// `/admin/*`, once authorized.
    async fn operator<B>(
        &self,
        req: &Request<B>,
        path: &str,
        generation: &Generation,
    ) -> Result<Response<Full<Bytes>>, Error> {
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
                // Refusals are problem documents, built where every error becomes one.
                Err(ReloadError::NoSource) => Err(Error::ReloadUnavailable {
                    generation: generation.number,
                    source: Box::new(ReloadError::NoSource),
                }),
                Err(refused) => Err(Error::ConfigRefused {
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
                return Err(not_found(path));
            };
            allow(req, POST_ONLY)?;
            upstream.set_draining(action == "drain");
            return json_response(StatusCode::OK, &upstream_status(generation, upstream));
        }
        Err(not_found(path))
    }

    /// `/readyz`: ready while configured, not shutting down, and some upstream can take
    /// requests.
    fn readiness(&self, generation: &Generation) -> Result<Response<Full<Bytes>>, Error> {
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
                HeaderValue::from(self.retry_after.as_secs().max(1)),
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

/// One upstream's status document.
fn upstream_status<'g>(generation: &'g Generation, upstream: &'g UpstreamState) -> UpstreamDoc<'g> {
    let health = upstream.health.view();
    let residency = upstream.residency.view();
    let models: Vec<ModelDoc<'g>> = generation
        .routes
        .routes()
        .flat_map(|route| {
            route
                .targets
                .iter()
                .filter(|t| t.upstream.name == upstream.name)
                .map(|t| model_status(&route.model, t))
        })
        .collect();
    let loaded = models.iter().filter(|m| m.loaded).map(|m| m.name).collect();
    UpstreamDoc {
        name: &upstream.name,
        url: upstream.url.as_str(),
        kind: upstream.kind.as_str(),
        health: HealthDoc {
            status: health.status.as_str(),
            since: rfc3339(health.since),
            last_check: health.last_check.map(rfc3339),
            consecutive_successes: health.successes,
            consecutive_failures: health.failures,
            last_error: health.last_error,
        },
        draining: upstream.is_draining(),
        slots: generation.routes.upstream_cap(upstream).map(|cap| CapDoc {
            parallel: cap.parallel,
            in_flight: cap.in_flight,
            blocked_models: cap.blocked_models,
        }),
        loaded,
        residency: ResidencyDoc {
            resident: residency.resident.map(|r| r.names()),
            last_check: residency.checked.map(rfc3339),
            last_error: residency.error,
        },
        models,
    }
}

/// One model's entry in its upstream's status document.
fn model_status<'g>(model: &'g str, t: &Target) -> ModelDoc<'g> {
    // One reading: the limits and the counts shown together agree.
    let reading = t.reading();
    let (parallel, capacity) = match &t.sizing {
        Sizing::Fixed { capacity } => (Parallel::Count(reading.limits.parallel), *capacity),
        Sizing::Unlimited => (Parallel::Word("unlimited"), None),
        Sizing::Auto(_) => (Parallel::Word("auto"), None),
    };
    let engine = t.engine.view();
    let engine = engine.checked.is_some().then(|| EngineDoc {
        busy: engine.reading.map(|r| r.busy),
        waiting: engine.reading.and_then(|r| r.waiting),
        gateway_in_flight: engine.reading.map(|r| r.gateway_in_flight),
        unaccounted: engine.reading.map(|r| r.unaccounted()),
        whole_engine: engine.reading.map(|r| r.whole_engine),
        warning: engine.warned,
        last_check: engine.checked.map(rfc3339),
        last_error: engine.error,
    });
    let discovery = t.auto().map(|auto| {
        let view = auto.view();
        DiscoveryDoc {
            source: "/props total_slots",
            slots: view.found,
            last_check: view.checked.map(rfc3339),
            last_error: view.error,
        }
    });
    let cluster = t.shared.as_ref().map(|shared| {
        let global = shared.global();
        ClusterKeyDoc {
            in_flight: global.map(|g| g.in_flight),
            queued: global.map(|g| g.queued),
            replica_queued: shared.local().queued,
        }
    });
    ModelDoc {
        cluster,
        name: model,
        loaded: t.is_loaded(),
        parallel,
        slots: t.slots(&reading),
        queue: reading.limits.queue,
        queue_timeout: t.queue_timeout.map(duration),
        capacity,
        in_flight: reading.in_flight,
        queued: reading.queued + t.shared.as_ref().map_or(0, |s| s.local().queued),
        engine,
        discovery,
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
    upstreams: Vec<UpstreamDoc<'g>>,
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

/// One upstream: `GET /admin/upstreams` lists them, drain and undrain answer one.
#[derive(Debug, Serialize)]
struct UpstreamDoc<'g> {
    name: &'g str,
    url: &'g str,
    kind: &'static str,
    health: HealthDoc,
    draining: bool,
    /// The engine-wide cap (`parallel` of the upstream); `null` without one.
    slots: Option<CapDoc>,
    /// The models whose `loaded` is true.
    loaded: Vec<&'g str>,
    residency: ResidencyDoc,
    models: Vec<ModelDoc<'g>>,
}

/// An upstream's engine-wide cap, shared by its models.
#[derive(Debug, Serialize)]
struct CapDoc {
    parallel: usize,
    in_flight: usize,
    /// Models whose next request waits only for the engine-wide cap.
    blocked_models: usize,
}

#[derive(Debug, Serialize)]
struct HealthDoc {
    status: &'static str,
    since: String,
    last_check: Option<String>,
    consecutive_successes: usize,
    consecutive_failures: usize,
    last_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct ResidencyDoc {
    resident: Option<Vec<String>>,
    last_check: Option<String>,
    last_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct ModelDoc<'g> {
    name: &'g str,
    loaded: bool,
    parallel: Parallel,
    /// The count in force: `parallel`, or the one read for "auto" (null while unknown, and for
    /// unlimited models).
    slots: Option<usize>,
    queue: usize,
    /// As the configuration writes it (`30s`).
    queue_timeout: Option<String>,
    capacity: Option<usize>,
    in_flight: usize,
    queued: usize,
    /// The engine's own counts, once the reconciliation has looked (see
    /// [`reconcile`](crate::upstreams::reconcile)).
    #[serde(skip_serializing_if = "Option::is_none")]
    engine: Option<EngineDoc>,
    /// How the slot count of `parallel = "auto"` was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    discovery: Option<DiscoveryDoc>,
    /// Under `[cluster]`: the key across every replica (`in_flight`, `queued`: as last seen,
    /// `null` before the first call) next to this replica's own (`in_flight` and `queued`
    /// above; `replica_queued` of them waiting in the shared queue).
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<ClusterKeyDoc>,
}

#[derive(Debug, Serialize)]
struct ClusterKeyDoc {
    in_flight: Option<usize>,
    queued: Option<usize>,
    replica_queued: usize,
}

/// `[cluster]`: the shared slot store as this replica sees it.
#[derive(Debug, Serialize)]
struct StoreDoc {
    up: bool,
    rejoining: bool,
    on_store_down: &'static str,
    round_trips: u64,
    last_round_trip_ms: f64,
    errors: u64,
    went_down: u64,
    lease_renewals: u64,
    leases_lost: u64,
    leases_expired: u64,
}

impl StoreDoc {
    fn new(cluster: &slotgate_limiter_redis::RedisLimiter) -> Self {
        let status = cluster.status();
        Self {
            up: status.up,
            rejoining: status.rejoining,
            on_store_down: cluster.settings().on_store_down.as_str(),
            round_trips: status.round_trips,
            last_round_trip_ms: status.last_round_trip.as_secs_f64() * 1000.0,
            errors: status.errors,
            went_down: status.went_down,
            lease_renewals: status.lease_renewals,
            leases_lost: status.leases_lost,
            leases_expired: status.leases_expired,
        }
    }
}

/// `parallel` as configured: a count, or `"unlimited"` / `"auto"`.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Parallel {
    Count(usize),
    Word(&'static str),
}

#[derive(Debug, Serialize)]
struct EngineDoc {
    busy: Option<usize>,
    waiting: Option<usize>,
    gateway_in_flight: Option<usize>,
    unaccounted: Option<usize>,
    whole_engine: Option<bool>,
    warning: bool,
    last_check: Option<String>,
    last_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct DiscoveryDoc {
    source: &'static str,
    slots: Option<usize>,
    last_check: Option<String>,
    last_error: Option<String>,
}

/// A configured duration as the configuration writes it (`30s`).
fn duration(value: Duration) -> String {
    humantime::format_duration(value).to_string()
}

fn rfc3339(at: SystemTime) -> String {
    humantime::format_rfc3339_millis(at).to_string()
}

fn json_response(
    status: StatusCode,
    body: &impl Serialize,
) -> Result<Response<Full<Bytes>>, Error> {
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

fn text(content_type: &'static str, body: Bytes) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(body));
    *response.status_mut() = StatusCode::OK;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}
