//! One request through the gateway, step by step: this file calls the others in order.
//!
//! [`App::handle`] answers every request (it cannot fail): it dispatches on the path, runs the
//! steps of a model-routed request, and hands any error to [`problems`]. Every response carries
//! `x-request-id`.
//!
//! A request reads the configuration in force when it arrives ([`Live::current`]) and keeps it
//! to the end, so a reload never changes the rules under it.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use tracing::{debug, warn};

use crate::error::{BoxError, chain};
use crate::metrics::{Bound, Metrics};
use crate::proxy::admit::{self, Refused, Slot};
use crate::proxy::affinity::{LocalAffinity, Recorder, ResponseAffinity, Sniff};
use crate::proxy::body::{SlotBody, Watch};
use crate::proxy::endpoint::{Endpoint, ModelIn};
use crate::proxy::forward::{Authorization, Destination, ForwardError, Forwarder};
use crate::proxy::live::{Generation, Live};
use crate::proxy::ollama;
use crate::proxy::problems::{self, Error, GET_ONLY, POST_ONLY, allow};
use crate::proxy::request;
use crate::proxy::route::Route;
use crate::request_id::{REQUEST_ID, request_id};
use crate::shutdown::ShutdownSignal;
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;
use slotgate_config::Kind;

/// The body of every API response: a buffered document (a problem, the model list), or an
/// upstream's answer streamed through with its slot.
/// A route that takes no slot streams through the same body, holding `None`; a Responses answer
/// is searched for its id on the way ([`Sniff`]).
pub(crate) type ResponseBody = Either<Full<Bytes>, SlotBody<Sniff<Incoming>, Option<admit::Slot>>>;

/// The Responses API, whose follow-ups have affinity.
const RESPONSES: &str = "/v1/responses";

/// What the request path needs, shared by every connection.
#[derive(Debug)]
pub(crate) struct App {
    /// The configuration in force: routing table (and, through it, the limiter keys and the
    /// upstreams' state), API keys, body limit.
    pub(crate) live: Arc<Live>,
    /// The pooled upstream client.
    pub(crate) forwarder: Forwarder,
    /// `Retry-After` while shutting down.
    pub(crate) shutdown_retry_after: Duration,
    /// Fired when the gateway starts shutting down.
    pub(crate) shutdown: ShutdownSignal,
    /// For the `created` field of `/v1/models`.
    pub(crate) started: SystemTime,
    /// `slotgate_bounds_total{bound="stream_idle"}`.
    pub(crate) stalled: Counter,
    /// `slotgate_bounds_total{bound="upstream_cut"}`.
    pub(crate) cut: Counter,
    /// `slotgate_bounds_total{bound="stream_timeout"}`.
    pub(crate) too_long: Counter,
    /// The request-body bytes all requests together may buffer (`max_buffered_body_bytes`, read
    /// at start).
    pub(crate) body_budget: request::BodyBudget,
    /// Which upstream holds each Responses id.
    pub(crate) affinity: Arc<dyn ResponseAffinity>,
}

impl App {
    /// The request path for `server`'s settings; `shutdown` fires when the gateway stops.
    /// Needs a Tokio runtime (the upstream client's pool).
    pub(crate) fn new(
        live: Arc<Live>,
        server: &slotgate_config::Server,
        shutdown: ShutdownSignal,
        metrics: &Metrics,
    ) -> Self {
        Self {
            live,
            forwarder: Forwarder::new(server.first_byte_timeout),
            // Clients told "shutting down" should come back once a restart is likely done.
            shutdown_retry_after: server.drain_grace.max(Duration::from_secs(1)),
            shutdown,
            started: SystemTime::now(),
            body_budget: request::BodyBudget::new(server.max_buffered_body_bytes, metrics),
            affinity: Arc::new(LocalAffinity::new(
                server.response_affinity_entries,
                server.response_affinity_ttl,
            )),
            stalled: metrics.bound(Bound::StreamIdle),
            cut: metrics.bound(Bound::UpstreamCut),
            too_long: metrics.bound(Bound::StreamTimeout),
        }
    }

    /// Answers one request.
    pub(crate) async fn handle<B>(self: Arc<Self>, req: Request<B>) -> Response<ResponseBody>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let request_id = request_id(req.headers());
        let generation = self.live.current();
        let mut response = match self.dispatch(req, &generation, &request_id).await {
            Ok(response) => response,
            Err(error) => problems::respond::<Full<Bytes>>(&error, &request_id).map(Either::Left),
        };
        response.headers_mut().insert(REQUEST_ID, request_id);
        response
    }

    async fn dispatch<B>(
        &self,
        req: Request<B>,
        generation: &Generation,
        request_id: &HeaderValue,
    ) -> Result<Response<ResponseBody>, Error>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let path = req.uri().path();
        if let Some(endpoint) = Endpoint::find(path) {
            allow(&req, POST_ONLY)?;
            generation.api_keys.verify(req.headers())?;
            return self.proxy(req, generation, request_id, endpoint).await;
        }
        if path == "/v1/models" {
            allow(&req, GET_ONLY)?;
            generation.api_keys.verify(req.headers())?;
            return Ok(self.models(generation));
        }
        if let Some(rest) = path.strip_prefix("/v1/responses/") {
            let (id, methods) = match rest.split_once('/') {
                None => (rest, GET_OR_DELETE),
                Some((id, "cancel")) => (id, POST_ONLY),
                Some((id, "input_items")) => (id, GET_ONLY),
                Some(_) => return Err(problems::not_found(path)),
            };
            allow(&req, methods)?;
            generation.api_keys.verify(req.headers())?;
            let id = id.to_owned();
            return self.by_response_id(req, generation, request_id, id).await;
        }
        if let Some(id) = path.strip_prefix("/v1/models/") {
            allow(&req, GET_ONLY)?;
            generation.api_keys.verify(req.headers())?;
            return self.model(generation, id);
        }
        if let Some(listing) = ollama::Listing::find(path) {
            allow(&req, GET_ONLY)?;
            generation.api_keys.verify(req.headers())?;
            return Ok(json_response(
                StatusCode::OK,
                ollama::list(&generation.routes, listing),
            ));
        }
        if path == ollama::VERSION {
            allow(&req, GET_ONLY)?;
            generation.api_keys.verify(req.headers())?;
            return self.ollama_version(req, generation, request_id).await;
        }
        Err(problems::not_found(path))
    }

    /// Steps 3 to 8 for a model-routed request.
    #[expect(
        clippy::too_many_lines,
        reason = "the steps of one request in order, each refusal next to its step"
    )]
    async fn proxy<B>(
        &self,
        req: Request<B>,
        generation: &Generation,
        request_id: &HeaderValue,
        endpoint: &Endpoint,
    ) -> Result<Response<ResponseBody>, Error>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        if self.shutdown.is_fired() {
            return Err(Error::ShuttingDown {
                retry_after: self.shutdown_retry_after,
            });
        }
        // Step 3: the body, under the limit, the deadline and the gateway's budget; `model` and
        // `stream` without re-serialising.
        let server = &generation.config.server;
        // An upload (`multipart/form-data`) has its own, larger limit.
        let max_bytes = if endpoint.model == ModelIn::Form {
            server.max_upload_bytes
        } else {
            server.max_body_bytes
        };
        let limits = request::BodyLimits {
            max_bytes,
            timeout: server.body_read_timeout,
            budget: &self.body_budget,
        };
        let api = request::read(req, limits, endpoint).await?;
        // Step 4: the model's route (an alias shares its target's route), then the targets of
        // a kind that serves this endpoint.
        let route = match &api.model {
            Some(name) => generation
                .routes
                .resolve(name)
                .ok_or_else(|| Error::ModelNotFound {
                    model: name.clone(),
                })?,
            None => generation.routes.only_model(endpoint).ok_or_else(|| {
                Error::BadRequest(format!(
                    "the request body has no `model` member, and {} does not serve exactly \
                     one model; name one",
                    endpoint.path
                ))
            })?,
        };
        let model = route.model.as_str();
        let mut ranked = eligible(route, endpoint)?;
        // A Responses follow-up goes to the host that has the conversation, or nowhere.
        if endpoint.path == RESPONSES
            && let Some(id) = &api.previous_response_id
        {
            let holder = self.holder(id, generation)?.name.clone();
            ranked.retain(|target| target.upstream.name == holder);
            if ranked.is_empty() {
                return Err(Error::ResponseUpstreamUnavailable {
                    id: id.clone(),
                    upstream: holder,
                    retry_after: server.health_check_interval,
                });
            }
        }
        debug!(
            request_id = request_id.to_str().unwrap_or_default(),
            model = %model,
            route = endpoint.path,
            stream = api.stream,
            candidates = ranked.len(),
            "routing"
        );

        // With client keys on, the client's `Authorization` is its key to this gateway.
        let client_keys = generation.api_keys.is_enabled();
        let mut full_on: Option<(&str, Duration)> = None;
        // The first upstream with fewer slots than the request needs: (name, weight, parallel).
        let mut too_heavy: Option<(&str, usize, usize)> = None;
        let mut connect_error: Option<BoxError> = None;
        let mut stopping = self.shutdown.clone();
        for target in ranked {
            // Steps 5 and 6: a slot on this target, or on to the next when its queue is full.
            // A shutdown ends the wait: only requests already running get the grace period.
            // A metadata route takes none.
            let admitted = if endpoint.slot {
                let weight = weight(&api, target);
                admit::enter(target, weight, &mut stopping).await.map(Some)
            } else {
                Ok(None)
            };
            let slot = match admitted {
                Ok(slot) => slot,
                Err(Refused::ShuttingDown) => {
                    return Err(Error::ShuttingDown {
                        retry_after: self.shutdown_retry_after,
                    });
                }
                Err(Refused::Closed) => {
                    // A reload removed this model from this upstream while the request waited.
                    return Err(removed_by_reload(
                        target,
                        model,
                        server.health_check_interval,
                    ));
                }
                Err(Refused::Full) => {
                    let retry_after = target.retry_after();
                    full_on = Some(match full_on {
                        // Name the best-ranked upstream; retry when the soonest may have room.
                        Some((first, earlier)) => (first, earlier.min(retry_after)),
                        None => (target.upstream.name.as_str(), retry_after),
                    });
                    continue;
                }
                Err(Refused::StoreUnavailable { retry_after }) => {
                    route.rejections.store_unavailable.inc();
                    return Err(Error::StoreUnavailable {
                        model: model.to_owned(),
                        retry_after,
                    });
                }
                Err(Refused::Unshared { weight }) => {
                    return Err(Error::BadRequest(format!(
                        "the request runs {weight} sequences (`n`, or `best_of` when larger), \
                         and this gateway shares its slots with other replicas ([cluster]), \
                         which count one slot per request; ask for one sequence"
                    )));
                }
                Err(Refused::TooHeavy { weight, parallel }) => {
                    // Never servable here; another upstream may have more slots.
                    too_heavy.get_or_insert((target.upstream.name.as_str(), weight, parallel));
                    continue;
                }
                Err(Refused::Timeout(waited)) => {
                    route.rejections.queue_timeout.inc();
                    return Err(Error::QueueTimeout {
                        upstream: target.upstream.name.clone(),
                        model: model.to_owned(),
                        waited,
                        retry_after: target.retry_after(),
                    });
                }
            };

            // Step 7: forward the original bytes (the model renamed only where the client's name
            // is not the engine's: an alias, or an `engine_model`).
            let sent = Instant::now();
            let (outcome, slot) = self
                .forward(target, slot, &api, request_id, client_keys)
                .await;
            match outcome {
                Ok(mut response) => {
                    if let Some(slot) = &slot {
                        slot.metrics().first_byte.observe(sent.elapsed());
                    }
                    let waited = slot.as_ref().map_or(Duration::ZERO, Slot::waited);
                    mark_routed(response.headers_mut(), target, waited);
                    target.upstream.health.record_answer();
                    // A Responses answer: its id is recorded on the way to the client.
                    let recorder = (endpoint.path == RESPONSES && response.status().is_success())
                        .then(|| {
                            Recorder::new(Arc::clone(&self.affinity), target.upstream.name.clone())
                        });
                    // Step 8: the slot rides in the body until the answer is over, and the body
                    // bounds the upstream's silences.
                    let watch = self.watch(target, model, request_id, response.headers(), sent);
                    return Ok(response.map(|body| {
                        Either::Right(
                            SlotBody::new(Sniff::new(body, recorder), slot).watched(watch),
                        )
                    }));
                }
                Err(ForwardError::Connect(error)) => {
                    // Nothing was sent: safe to try the next host. Enough of these in a row
                    // eject the upstream (passive health checking).
                    let reason = chain(&*error);
                    warn!(upstream = %target.upstream.name, error = %reason, "connect failed; trying the next host");
                    target
                        .upstream
                        .record_connect_error(reason, &generation.policy);
                    if let Some(slot) = slot {
                        slot.abandon();
                    }
                    connect_error = Some(error);
                }
                Err(failure) => return Err(failed_after_connect(failure, target, model, slot)),
            }
        }

        // No target took it. A full queue says more (with an estimate) than a refused
        // connection, so it wins when both happened.
        if let Some((upstream, retry_after)) = full_on {
            route.rejections.queue_full.inc();
            return Err(Error::QueueFull {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                retry_after,
            });
        }
        // Too heavy for every upstream that was tried, and none failed otherwise: no retry can
        // help, the client must ask for fewer sequences.
        if let (Some((upstream, weight, parallel)), None) = (too_heavy, &connect_error) {
            return Err(Error::TooHeavy {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                weight,
                parallel,
            });
        }
        Err(Error::UpstreamUnavailable {
            model: model.to_owned(),
            retry_after: server.health_check_interval,
            // A refused connection, else what keeps healthy upstreams out (an unknown
            // `parallel = "auto"` slot count).
            source: connect_error.or_else(|| route.unavailable_reason().map(Into::into)),
        })
    }

    /// Sends the request to `target` and waits for the response head, the slot meanwhile in a
    /// [`Sending`](admit::Sending) guard: if the client goes away before the answer begins, the
    /// slot stays taken for the upstream's `cancel_grace`, while the engine notices.
    async fn forward(
        &self,
        target: &Target,
        slot: Option<Slot>,
        api: &request::ApiRequest,
        request_id: &HeaderValue,
        client_keys: bool,
    ) -> (Result<Response<Incoming>, ForwardError>, Option<Slot>) {
        let sending = slot.map(|slot| slot.sending(target.cancel_grace));
        let outcome = self
            .forwarder
            .send(
                Destination {
                    client: &target.upstream.client,
                    base: &target.upstream.base,
                },
                authorization(&target.upstream, client_keys),
                &api.parts,
                // The name this upstream's engine knows the model by (`engine_model`).
                api.body_for(&target.engine_model),
                request_id,
            )
            .await;
        (outcome, sending.map(admit::Sending::answered))
    }

    /// `GET /v1/models/{id}`: the model (or alias) in the shape of one `/v1/models` entry,
    /// while some healthy, undrained upstream serves it.
    fn model(&self, generation: &Generation, id: &str) -> Result<Response<ResponseBody>, Error> {
        let served = generation
            .routes
            .resolve(id)
            .is_some_and(|route| route.is_available());
        if !served {
            return Err(Error::ModelNotFound {
                model: id.chars().take(200).collect(),
            });
        }
        let body = self.model_entry(id).to_string();
        Ok(json_response(StatusCode::OK, body))
    }

    /// The upstream recorded for response `id`, if it exists in this configuration.
    fn holder<'g>(
        &self,
        id: &str,
        generation: &'g Generation,
    ) -> Result<&'g Arc<UpstreamState>, Error> {
        let not_found = || Error::ResponseNotFound {
            id: id.chars().take(200).collect(),
        };
        let name = self.affinity.lookup(id).ok_or_else(not_found)?;
        // Removed by a reload: as gone as a deleted response.
        generation.upstreams.get(&name).ok_or_else(not_found)
    }

    /// `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, `GET
    /// /v1/responses/{id}/input_items`: to the upstream that made the response, without a slot.
    async fn by_response_id<B>(
        &self,
        req: Request<B>,
        generation: &Generation,
        request_id: &HeaderValue,
        id: String,
    ) -> Result<Response<ResponseBody>, Error>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let server = &generation.config.server;
        let upstream = self.holder(&id, generation)?;
        let unavailable = || Error::ResponseUpstreamUnavailable {
            id: id.clone(),
            upstream: upstream.name.clone(),
            retry_after: server.health_check_interval,
        };
        if !upstream.is_available() {
            return Err(unavailable());
        }
        let deleting = req.method() == http::Method::DELETE;
        let (parts, body) = req.into_parts();
        let limits = request::BodyLimits {
            max_bytes: server.max_body_bytes,
            timeout: server.body_read_timeout,
            budget: &self.body_budget,
        };
        // The budget's share is held until the engine has the body.
        let (body, _held) = request::read_body(&parts.headers, body, limits).await?;
        let client_keys = generation.api_keys.is_enabled();
        let sent = self.forwarder.send(
            Destination {
                client: &upstream.client,
                base: &upstream.base,
            },
            authorization(upstream, client_keys),
            &parts,
            body,
            request_id,
        );
        let response = match sent.await {
            Ok(response) => response,
            Err(ForwardError::Connect(_)) => return Err(unavailable()),
            Err(ForwardError::Tls(source)) => {
                return Err(Error::UpstreamTls {
                    upstream: upstream.name.clone(),
                    model: String::new(),
                    source,
                });
            }
            Err(ForwardError::Timeout(after)) => {
                return Err(Error::UpstreamTimeout {
                    upstream: upstream.name.clone(),
                    model: String::new(),
                    after,
                });
            }
            Err(ForwardError::Failed(source)) => {
                return Err(Error::UpstreamFailed {
                    upstream: upstream.name.clone(),
                    model: String::new(),
                    source,
                });
            }
            Err(ForwardError::Build(error)) => {
                return Err(Error::Internal {
                    what: "the upstream request could not be built",
                    source: Box::new(error),
                });
            }
        };
        if deleting && response.status().is_success() {
            self.affinity.forget(&id);
        }
        Ok(passed_through(response))
    }

    /// One entry of `/v1/models`.
    fn model_entry(&self, name: &str) -> serde_json::Value {
        let created = self
            .started
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_secs());
        serde_json::json!({
            "id": name,
            "object": "model",
            "created": created,
            "owned_by": "slotgate",
        })
    }

    /// `GET /api/version`: passed to the first available Ollama upstream (the version is the
    /// engine's, not the gateway's), without a slot.
    async fn ollama_version<B>(
        &self,
        req: Request<B>,
        generation: &Generation,
        request_id: &HeaderValue,
    ) -> Result<Response<ResponseBody>, Error> {
        let client_keys = generation.api_keys.is_enabled();
        let (parts, _) = req.into_parts();
        let mut connect_error: Option<BoxError> = None;
        let ollamas = generation
            .upstreams
            .iter()
            .filter(|u| u.kind == Kind::Ollama && u.is_available());
        for upstream in ollamas {
            let sent = self.forwarder.send(
                Destination {
                    client: &upstream.client,
                    base: &upstream.base,
                },
                authorization(upstream, client_keys),
                &parts,
                Bytes::new(),
                request_id,
            );
            match sent.await {
                Ok(response) => return Ok(passed_through(response)),
                Err(ForwardError::Connect(error)) => connect_error = Some(error),
                Err(ForwardError::Tls(source)) => {
                    return Err(Error::UpstreamTls {
                        upstream: upstream.name.clone(),
                        model: String::new(),
                        source,
                    });
                }
                Err(error) => {
                    return Err(Error::UpstreamFailed {
                        upstream: upstream.name.clone(),
                        model: String::new(),
                        source: Box::new(error),
                    });
                }
            }
        }
        Err(Error::UpstreamUnavailable {
            model: "(any Ollama model)".to_owned(),
            retry_after: generation.config.server.health_check_interval,
            source: Some(connect_error.unwrap_or_else(|| "no Ollama upstream is available".into())),
        })
    }

    /// The [`Watch`] over the answer of `target`, whose response head has `headers` and whose
    /// request was `sent` then.
    fn watch(
        &self,
        target: &Target,
        model: &str,
        request_id: &HeaderValue,
        headers: &http::HeaderMap,
        sent: Instant,
    ) -> Watch {
        Watch {
            idle_timeout: target.stream_idle_timeout,
            cancel_grace: target.cancel_grace,
            sse: is_open_ended_sse(headers),
            upstream: target.upstream.name.clone(),
            model: model.to_owned(),
            request_id: request_id.to_str().unwrap_or_default().to_owned(),
            stalled: self.stalled.clone(),
            cut: self.cut.clone(),
            deadline: target
                .stream_timeout
                .map(|timeout| (tokio::time::Instant::from_std(sent) + timeout, timeout)),
            too_long: self.too_long.clone(),
        }
    }

    /// `GET /v1/models`: every model (and alias) that some healthy, undrained upstream
    /// serves, in the OpenAI list shape. A model whose every upstream is down or draining is
    /// left out: asking for it now would only get a 503.
    fn models(&self, generation: &Generation) -> Response<ResponseBody> {
        let data: Vec<serde_json::Value> = generation
            .routes
            .names()
            .iter()
            .filter(|name| {
                generation
                    .routes
                    .resolve(name)
                    .is_some_and(|route| route.is_available())
            })
            .map(|name| self.model_entry(name))
            .collect();
        let body = serde_json::json!({ "object": "list", "data": data }).to_string();
        json_response(StatusCode::OK, body)
    }
}

/// The targets of `route` to try for `endpoint`, best first: those of a kind that serves it
/// (and, for a disk-changing route, whose upstream allows it). A problem when no configured
/// upstream of the model could ever take it; an empty list when the ones that could are down.
/// The upstream that answered, by its configured name.
const UPSTREAM_HEADER: HeaderName = HeaderName::from_static("x-slotgate-upstream");
/// How long the request waited in the queue for its slot, in whole milliseconds.
const QUEUE_WAIT_HEADER: HeaderName = HeaderName::from_static("x-slotgate-queue-wait-ms");

/// Tells the client where its answer came from and how long it queued: set on every response
/// an upstream gave (replacing any such header the upstream sent, so an engine cannot speak
/// for the gateway). The wait is 0 on routes that take no slot.
fn mark_routed(headers: &mut http::HeaderMap, target: &Target, waited: Duration) {
    // A name with control characters (a quoted TOML key may hold any) cannot be a header
    // value: then the header is left out rather than the answer refused.
    match HeaderValue::from_str(&target.upstream.name) {
        Ok(name) => headers.insert(UPSTREAM_HEADER, name),
        Err(_) => headers.remove(UPSTREAM_HEADER),
    };
    let millis = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
    headers.insert(QUEUE_WAIT_HEADER, HeaderValue::from(millis));
}

/// The engine slots `api` takes on `target`: its sequences ([`Weighed`](crate::proxy::endpoint::Weighed)), except on
/// Ollama, which ignores `n` and runs one sequence per request.
fn weight(api: &request::ApiRequest, target: &Target) -> usize {
    match target.upstream.kind {
        Kind::Ollama => 1,
        _ => api.sequences,
    }
}

fn eligible<'r>(route: &'r Route, endpoint: &Endpoint) -> Result<Vec<&'r Target>, Error> {
    let serves = |t: &Target| endpoint.is_served_by(t.upstream.kind);
    let allowed = |t: &Target| serves(t) && (!endpoint.manages_models || t.model_management);
    if !route.targets.iter().any(|t| serves(t)) {
        return Err(Error::RouteNotServed {
            model: route.model.clone(),
            route: endpoint.path,
        });
    }
    if !route.targets.iter().any(|t| allowed(t)) {
        return Err(Error::RouteDisabled {
            model: route.model.clone(),
            route: endpoint.path,
        });
    }
    Ok(route.ranked().into_iter().filter(|t| allowed(t)).collect())
}

/// An upstream's answer to a route that holds no slot, passed through as it comes.
fn passed_through(response: Response<Incoming>) -> Response<ResponseBody> {
    response.map(|body| Either::Right(SlotBody::new(Sniff::new(body, None), None)))
}

/// `GET` and `DELETE`, for a stored response.
const GET_OR_DELETE: &[http::Method] =
    &[http::Method::GET, http::Method::HEAD, http::Method::DELETE];

/// What the upstream request carries as `Authorization` (see [`Authorization`]).
fn authorization(upstream: &UpstreamState, client_keys: bool) -> Authorization<'_> {
    match &upstream.authorization {
        Some(key) => Authorization::Upstream(key),
        None if client_keys => Authorization::Withheld,
        None => Authorization::Client,
    }
}

/// The error for a request whose queue a reload removed while it waited.
fn removed_by_reload(target: &Target, model: &str, retry_after: Duration) -> Error {
    let why = format!(
        "model {model:?} was removed from upstream {} by a configuration reload while the \
         request waited",
        target.upstream.name
    );
    Error::UpstreamUnavailable {
        model: model.to_owned(),
        retry_after,
        source: Some(why.into()),
    }
}

/// The error for a forward that failed after connecting (the request may have run): the slot
/// is given back, counted as an upstream error unless the gateway itself failed.
fn failed_after_connect(
    failure: ForwardError,
    target: &Target,
    model: &str,
    slot: Option<Slot>,
) -> Error {
    let upstream = target.upstream.name.clone();
    let model = model.to_owned();
    // A metadata route holds no slot: nothing to give back.
    let Some(slot) = slot else {
        return match failure {
            ForwardError::Timeout(after) => Error::UpstreamTimeout {
                upstream,
                model,
                after,
            },
            ForwardError::Failed(source) => Error::UpstreamFailed {
                upstream,
                model,
                source,
            },
            ForwardError::Tls(source) => Error::UpstreamTls {
                upstream,
                model,
                source,
            },
            ForwardError::Build(error) => Error::Internal {
                what: "the upstream request could not be built",
                source: Box::new(error),
            },
            ForwardError::Connect(source) => Error::Internal {
                what: "a connect error was not handled",
                source,
            },
        };
    };
    match failure {
        ForwardError::Timeout(after) => {
            slot.timed_out(target.cancel_grace);
            Error::UpstreamTimeout {
                upstream,
                model,
                after,
            }
        }
        ForwardError::Failed(source) => {
            slot.fail();
            Error::UpstreamFailed {
                upstream,
                model,
                source,
            }
        }
        ForwardError::Tls(source) => {
            // Nothing reached the engine: the slot is free at once.
            slot.abandon();
            Error::UpstreamTls {
                upstream,
                model,
                source,
            }
        }
        ForwardError::Build(error) => {
            slot.abandon();
            Error::Internal {
                what: "the upstream request could not be built",
                source: Box::new(error),
            }
        }
        // `Connect` is handled by the caller (it may fail over); counted like a bug if not.
        ForwardError::Connect(source) => {
            slot.abandon();
            Error::Internal {
                what: "a connect error was not handled",
                source,
            }
        }
    }
}

/// Whether an answer is an SSE stream of no declared length, which can take one more event.
fn is_open_ended_sse(headers: &http::HeaderMap) -> bool {
    let sse = headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.split(';').next())
        .is_some_and(|essence| essence.trim().eq_ignore_ascii_case("text/event-stream"));
    sse && !headers.contains_key(header::CONTENT_LENGTH)
}

fn json_response(status: StatusCode, body: String) -> Response<ResponseBody> {
    let mut response = Response::new(Either::Left(Full::new(Bytes::from(body))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
