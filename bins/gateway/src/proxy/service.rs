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
use tracing::{debug, info, warn};

use crate::error::{BoxError, chain};
use crate::metrics::{Bound, Metrics};
use crate::proxy::access::{Access, Counted, Logged};
use crate::proxy::admit::{self, Admission, Queued, Refused, Slot};
use crate::proxy::affinity::{LocalAffinity, Recorder, ResponseAffinity, Sniff};
use crate::proxy::body::meter::{self, Meter};
use crate::proxy::body::{SlotBody, Watch, sse_event};
use crate::proxy::cache_aware::CacheAware;
use crate::proxy::client::{Client, Deadlines, Limit, Wait};
use crate::proxy::endpoint::{Endpoint, ModelIn};
use crate::proxy::forward::{Authorization, Destination, ForwardError, Forwarder};
use crate::proxy::keepalive::{Forward, KeepaliveBody, Refuse, Streamed};
use crate::proxy::live::{Generation, Live};
use crate::proxy::ollama;
use crate::proxy::problems::{self, BadRequest, Deadline, Error, GET_ONLY, POST_ONLY, allow};
use crate::proxy::rename::{self, Rename};
use crate::proxy::request;
use crate::proxy::route::Route;
use crate::request_id::{REQUEST_ID, request_id};
use crate::shutdown::ShutdownSignal;
use crate::upstreams::health::{HealthPolicy, Verdict, judge};
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;
use slotgate_config::Kind;
use slotgate_limiter::Ticket;

/// The body of every API response: a buffered document (a problem, the model list), an
/// upstream's answer streamed through with its slot, or the stream of a request that queues
/// under `queue_keepalive` ([`KeepaliveBody`]).
/// A route that takes no slot streams through the same body, holding `None`; a Responses answer
/// is searched for its id on the way ([`Sniff`]).
pub(crate) type ResponseBody = Either<Full<Bytes>, Either<Streamed, KeepaliveBody>>;

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
    /// What each host's prompt cache holds, as far as the gateway knows.
    pub(crate) cache: Arc<CacheAware>,
    /// For the refusals counted when they become a response.
    pub(crate) metrics: Metrics,
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
            cache: Arc::new(CacheAware::new(&server.cache_affinity, Instant::now())),
            stalled: metrics.bound(Bound::StreamIdle),
            cut: metrics.bound(Bound::UpstreamCut),
            too_long: metrics.bound(Bound::StreamTimeout),
            metrics: metrics.clone(),
        }
    }

    /// Answers one request; its access-log line is written when the response is over
    /// ([`access`](crate::proxy::access)).
    pub(crate) async fn handle<B>(
        self: Arc<Self>,
        req: Request<B>,
    ) -> Response<Logged<ResponseBody>>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let request_id = request_id(req.headers());
        let generation = self.live.current();
        let access = Access::start(
            generation.config.server.access_log,
            &request_id,
            req.method(),
            req.uri().path(),
        );
        let req = req.map(|body| Counted::new(body, access.clone()));
        let mut response = match self.dispatch(req, &generation, &request_id, &access).await {
            Ok(response) => response,
            Err(error) => {
                if let Some((model, reason)) = error.rejection() {
                    self.metrics.refused(model, reason);
                }
                access.failed(&error);
                problems::respond::<Full<Bytes>>(&error, &request_id).map(Either::Left)
            }
        };
        response.headers_mut().insert(REQUEST_ID, request_id);
        let status = response.status();
        response.map(|body| Logged::new(body, status, access))
    }

    async fn dispatch<B>(
        self: &Arc<Self>,
        req: Request<B>,
        generation: &Generation,
        request_id: &HeaderValue,
        access: &Access,
    ) -> Result<Response<ResponseBody>, Error>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        request::check_head(&req)?;
        let path = req.uri().path();
        if let Some(endpoint) = Endpoint::find(path) {
            allow(&req, POST_ONLY)?;
            let client = generation.api_keys.verify(req.headers())?;
            access.key_name(client.tenant.as_ref());
            return self
                .proxy(req, generation, request_id, endpoint, client, access)
                .await;
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
        self: &Arc<Self>,
        req: Request<B>,
        generation: &Generation,
        request_id: &HeaderValue,
        endpoint: &'static Endpoint,
        mut client: Client,
        access: &Access,
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
        // Who the request queues as, and until when: read from the head before the body, and
        // counted from now (sending the body is part of the client's wait).
        let deadlines = Deadlines::read(req.headers(), tokio::time::Instant::now())?;
        if !generation.api_keys.is_enabled() {
            client = Client::from_header(server.tenant_header.as_deref(), req.headers())?;
        }
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
        let mut api = request::read(req, limits, endpoint).await?;
        // Step 4: the model's route (an alias shares its target's route), then the targets of
        // a kind that serves this endpoint.
        let route = match &api.model {
            Some(name) => generation
                .routes
                .resolve(name)
                .ok_or_else(|| Error::ModelNotFound {
                    model: name.clone(),
                })?,
            None => generation
                .routes
                .only_model(endpoint)
                .ok_or(BadRequest::ModelNeeded {
                    route: endpoint.path,
                })?,
        };
        access.route(route);
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
        // The host that holds the prompt's prefix may go first.
        api.placement = self.cache.place(&mut ranked, &api, route, endpoint);
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
        // An engine's 502/503/504 that was not passed through, to try the next host: kept
        // unread, and passed through after all if no later host gets the request (with its
        // engine named again in the access log).
        let mut engine_error: Option<HeldAnswer> = None;
        let mut retries_left = server.engine_error_retries;
        let candidates = ranked.len();
        for (rank, target) in ranked.into_iter().enumerate() {
            // Steps 5 and 6: a slot on this target, or on to the next when its queue is full.
            // A shutdown ends the wait: only requests already running get the grace period.
            // A metadata route takes none.
            let ticket = client.ticket(weight(&api, target));
            let admitted = if endpoint.slot {
                match admit::join(target, &ticket, &deadlines, &self.shutdown) {
                    Ok(Admission::Granted(slot)) => Ok(Some(slot)),
                    Ok(Admission::Queued(queued)) => {
                        if let Some(every) = keepalive(endpoint, &api, target) {
                            let request = Admitted {
                                target: Arc::clone(target),
                                route: Arc::clone(route),
                                endpoint,
                                api,
                                ticket,
                                request_id: request_id.clone(),
                                client_keys,
                                health_check_interval: server.health_check_interval,
                                policy: generation.policy,
                                access: access.clone(),
                            };
                            return Ok(self.keep_alive(queued, every, request));
                        }
                        queued.await.map(Some)
                    }
                    Err(refused) => Err(refused),
                }
            } else {
                Ok(None)
            };
            let slot = match admitted {
                Ok(slot) => slot,
                Err(Refused::Full) => {
                    let retry_after = target.retry_after_for(&ticket);
                    full_on = Some(match full_on {
                        // Name the best-ranked upstream; retry when the soonest may have room.
                        Some((first, earlier)) => (first, earlier.min(retry_after)),
                        None => (target.upstream.name.as_str(), retry_after),
                    });
                    continue;
                }
                Err(Refused::TooHeavy { weight, parallel }) => {
                    // Never servable here; another upstream may have more slots.
                    too_heavy.get_or_insert((target.upstream.name.as_str(), weight, parallel));
                    continue;
                }
                Err(refused) => {
                    // A retry that found no room: the client gets the engine's own answer.
                    if let Some(held) = engine_error {
                        return Ok(held.sent(access));
                    }
                    let interval = server.health_check_interval;
                    let ended = self.wait_ended(refused, target, route, &ticket, interval, access);
                    return Err(ended);
                }
            };

            // Step 7: forward the original bytes (the model renamed only where the client's name
            // is not the engine's: an alias, or an `engine_model`).
            let sent = Instant::now();
            access.upstream(&target.upstream);
            let (outcome, slot) = self
                .forward(target, slot, &api, request_id, client_keys)
                .await;
            match outcome {
                Ok(mut response) => {
                    let waited = slot.as_ref().map_or(Duration::ZERO, Slot::waited);
                    mark_routed(response.headers_mut(), target, waited);
                    access.queue_wait(waited);
                    let status = response.status();
                    judged(target, status, sent, &generation.policy);
                    let retry = retries_left > 0 && rank + 1 < candidates && is_retried(status);
                    let slot = if retry {
                        retries_left -= 1;
                        retrying(target, status, slot, request_id);
                        None
                    } else {
                        slot
                    };
                    // Step 8: the slot rides in the body until the answer is over, and the body
                    // bounds the upstream's silences.
                    // An answer held for a retry notes nothing in the access log: it is dropped
                    // unread when another host answers, and that drop is not the client leaving.
                    // Sent after all, its line's outcome comes from its status and its end.
                    let off = Access::default();
                    let noted = if retry { &off } else { access };
                    let answer = self.answer(
                        target,
                        endpoint,
                        request_id,
                        response,
                        (slot, sent),
                        noted,
                        &api,
                    );
                    let answer = answer.map(|body| Either::Right(Either::Left(body)));
                    if !retry {
                        return Ok(answer);
                    }
                    // Dropped unread once another host answers (its connection is closed).
                    engine_error = Some(HeldAnswer {
                        answer,
                        upstream: Arc::clone(&target.upstream),
                        waited,
                    });
                }
                Err(ForwardError::Connect(error)) => {
                    // Nothing was sent: safe to try the next host.
                    connect_failed(target, &error, sent, &generation.policy);
                    if let Some(slot) = slot {
                        slot.abandon();
                    }
                    connect_error = Some(error);
                }
                Err(failure) => return Err(failed_after_connect(failure, target, model, slot)),
            }
        }
        // No target took it. An engine's answer is passed through as it came: the request
        // reached an engine, which said why it did not run it.
        if let Some(held) = engine_error {
            return Ok(held.sent(access));
        }
        // A full queue says more (with an estimate) than a refused connection, so it wins when
        // both happened.
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
        if connect_error.is_some() {
            route.rejections.upstream_unavailable.inc();
        } else {
            route.rejections.model_unavailable.inc();
            access.reason("model_unavailable");
        }
        Err(Error::UpstreamUnavailable {
            model: model.to_owned(),
            retry_after: server.health_check_interval,
            // A refused connection, else what keeps healthy upstreams out (an unknown
            // `parallel = "auto"` slot count).
            source: connect_error.or_else(|| route.unavailable_reason().map(Into::into)),
        })
    }

    /// Step 8: the engine's `response` to a request sent at `sent`, streaming through with its
    /// slot; the body bounds the upstream's silences, a Responses answer's id is recorded on the
    /// way, the model the client asked for in `api` is named in place of the engine's name for
    /// it, and where the request went by its prompt is recorded.
    #[expect(
        clippy::too_many_arguments,
        reason = "one request's parts, each used once; a struct would only rename them"
    )]
    fn answer(
        &self,
        target: &Target,
        endpoint: &Endpoint,
        request_id: &HeaderValue,
        mut response: Response<Incoming>,
        (mut slot, sent): (Option<Slot>, Instant),
        access: &Access,
        api: &request::ApiRequest,
    ) -> Response<Streamed> {
        let asked = api.model.as_deref();
        // Where the request went by its prompt, once the engine took it.
        let feedback = api
            .placement
            .as_ref()
            .filter(|_| slot.is_some() && response.status().is_success())
            .map(|placement| self.cache.sent(target, placement));
        // What the body tells: the first token and the usage of a request that holds a slot,
        // and the outcome for the access log.
        let meter = (slot.is_some() || access.is_on()).then(|| {
            let metrics = slot.as_ref().map(|_| Arc::clone(&target.metrics));
            Meter::new(
                metrics,
                access.clone(),
                sent,
                response.headers(),
                response.status(),
            )
            .with_feedback(feedback)
        });
        match &mut slot {
            Some(slot) => {
                slot.metrics().response_head.observe(sent.elapsed());
                slot.engine_status(response.status());
            }
            None => target.metrics.response(response.status()),
        }
        let recorder = (endpoint.path == RESPONSES && response.status().is_success())
            .then(|| Recorder::new(Arc::clone(&self.affinity), target.upstream.name.clone()));
        let mut watch = self.watch(target, request_id, response.headers(), sent);
        watch.meter = meter;
        let names = rename::prepare(&mut response, asked, &target.engine_model);
        response.map(|body| {
            SlotBody::new(Sniff::new(Rename::new(body, names), recorder), slot).watched(watch)
        })
    }

    /// The error for a request whose admission on `target` was `refused` other than by a full
    /// queue there (the caller tries the next target on those).
    fn wait_ended(
        &self,
        refused: Refused,
        target: &Target,
        route: &Route,
        ticket: &Ticket,
        health_check_interval: Duration,
        access: &Access,
    ) -> Error {
        let upstream = target.upstream.name.clone();
        let model = route.model.clone();
        match refused {
            Refused::ShuttingDown => Error::ShuttingDown {
                retry_after: self.shutdown_retry_after,
            },
            // A reload removed this model from this upstream while the request waited.
            Refused::Closed => {
                route.rejections.model_unavailable.inc();
                access.reason("model_unavailable");
                removed_by_reload(target, &model, health_check_interval)
            }
            Refused::Full => Error::QueueFull {
                upstream,
                model,
                retry_after: target.retry_after_for(ticket),
            },
            Refused::TooHeavy { weight, parallel } => Error::TooHeavy {
                upstream,
                model,
                weight,
                parallel,
            },
            Refused::Timeout { waited, wait } => {
                route.rejections.queue_timeout.inc();
                Error::QueueTimeout {
                    upstream,
                    model,
                    waited,
                    retry_after: target.retry_after_for(ticket),
                    deadline: client_deadline(wait, None),
                }
            }
            Refused::StoreUnavailable { retry_after } => {
                route.rejections.store_unavailable.inc();
                Error::StoreUnavailable { model, retry_after }
            }
            Refused::Hopeless { expected, wait } => {
                route.rejections.queue_timeout.inc();
                Error::QueueTimeout {
                    upstream,
                    model,
                    waited: Duration::ZERO,
                    retry_after: target.retry_after_for(ticket),
                    deadline: client_deadline(wait, Some(expected)),
                }
            }
        }
    }

    /// Answers a streamed request that has to queue on a model with `queue_keepalive`: `200`
    /// and `text/event-stream` at once, the wait and the rest of the request in the body
    /// ([`KeepaliveBody`]).
    fn keep_alive(
        self: &Arc<Self>,
        queued: Queued,
        every: Duration,
        request: Admitted,
    ) -> Response<ResponseBody> {
        let request = Arc::new(request);
        let forward: Forward = {
            let app = Arc::clone(self);
            let request = Arc::clone(&request);
            Box::new(move |slot| Box::pin(async move { app.forward_queued(&request, slot).await }))
        };
        let refuse: Refuse = {
            let app = Arc::clone(self);
            let request = Arc::clone(&request);
            Box::new(move |refused| {
                let Admitted {
                    target,
                    route,
                    ticket,
                    health_check_interval,
                    access,
                    ..
                } = &*request;
                let interval = *health_check_interval;
                let error = app.wait_ended(refused, target, route, ticket, interval, access);
                // The refusals `wait_ended` does not count itself (a shutdown).
                if let Some((model, reason)) = error.rejection() {
                    app.metrics.refused(model, reason);
                }
                request.last_event(&error)
            })
        };
        let target = Arc::clone(&request.target);
        let body = KeepaliveBody::new(queued, Arc::clone(&target), every, forward, refuse);
        let mut response = Response::new(Either::Right(Either::Right(body)));
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        mark_upstream(headers, &target);
        response
    }

    /// Steps 7 and 8 for a request granted its slot under `queue_keepalive`: as on the ordinary
    /// path, except that the client already has its `200`, so anything but the engine's stream
    /// becomes the stream's last event (`Err`).
    async fn forward_queued(&self, request: &Admitted, slot: Slot) -> Result<Streamed, Bytes> {
        let Admitted {
            target,
            route,
            api,
            request_id,
            client_keys,
            health_check_interval,
            policy,
            ..
        } = request;
        request.access.upstream(&target.upstream);
        request.access.queue_wait(slot.waited());
        let sent = Instant::now();
        let (outcome, slot) = self
            .forward(target, Some(slot), api, request_id, *client_keys)
            .await;
        let error = match outcome {
            Ok(response) => {
                // The client already has its `200`: an error answer is not retried here, it
                // ends the stream (`engine_refused`).
                judged(target, response.status(), sent, policy);
                let endpoint = request.endpoint;
                let answer = self.answer(
                    target,
                    endpoint,
                    request_id,
                    response,
                    (slot, sent),
                    &request.access,
                    api,
                );
                if answer.status().is_success() {
                    return Ok(answer.into_body());
                }
                return Err(request.engine_refused(answer).await);
            }
            Err(ForwardError::Connect(error)) => {
                connect_failed(target, &error, sent, policy);
                if let Some(slot) = slot {
                    slot.abandon();
                }
                route.rejections.upstream_unavailable.inc();
                Error::UpstreamUnavailable {
                    model: route.model.clone(),
                    retry_after: *health_check_interval,
                    source: Some(error),
                }
            }
            Err(failure) => failed_after_connect(failure, target, &route.model, slot),
        };
        Err(request.last_event(&error))
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
        // The name this upstream's engine knows the model by (`engine_model`).
        let body = api.body_for(&target.engine_model);
        // Last before the send, so that the handoff gap covers everything the gateway does.
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
                body,
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
        // Not a model's refusal, so no route counts it: counted here, as every refusal is.
        self.metrics.refused("", "upstream_unavailable");
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
        request_id: &HeaderValue,
        headers: &http::HeaderMap,
        sent: Instant,
    ) -> Watch {
        Watch {
            idle_timeout: target.stream_idle_timeout,
            cancel_grace: target.cancel_grace,
            sse: is_open_ended_sse(headers),
            names: Arc::clone(&target.answer_names),
            request_id: request_id.clone(),
            stalled: self.stalled.clone(),
            cut: self.cut.clone(),
            deadline: target
                .stream_timeout
                .map(|timeout| (tokio::time::Instant::from_std(sent) + timeout, timeout)),
            too_long: self.too_long.clone(),
            meter: None,
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
/// What a request admitted under `queue_keepalive` carries into its response body.
pub(crate) struct Admitted {
    target: Arc<Target>,
    route: Arc<Route>,
    endpoint: &'static Endpoint,
    api: request::ApiRequest,
    ticket: Ticket,
    request_id: HeaderValue,
    client_keys: bool,
    health_check_interval: Duration,
    policy: HealthPolicy,
    /// The request's access-log record.
    access: Access,
}

/// The most of an engine's error answer read to explain it.
const ENGINE_ERROR_LIMIT: usize = 64 * 1024;

impl Admitted {
    /// The stream's last event for `error`.
    fn last_event(&self, error: &Error) -> Bytes {
        self.access.failed(error);
        sse_event(
            error.to_problem(),
            self.request_id.to_str().unwrap_or_default(),
        )
    }

    /// The last event for an engine that answered with an error status instead of a stream:
    /// an `upstream-bad-response` problem with the engine's status and, when it sent one, its
    /// own error document. The answer is read to its end (at most [`ENGINE_ERROR_LIMIT`]
    /// bytes, under the body's usual bounds), which gives its slot back.
    async fn engine_refused(&self, answer: Response<Streamed>) -> Bytes {
        use http_body_util::BodyExt as _;
        let status = answer.status().as_u16();
        let body = http_body_util::Limited::new(answer.into_body(), ENGINE_ERROR_LIMIT);
        let text = body
            .collect()
            .await
            .map(http_body_util::Collected::to_bytes)
            .unwrap_or_default();
        let engine: serde_json::Value =
            serde_json::from_slice(&text).unwrap_or(serde_json::Value::Null);
        let upstream = &self.target.upstream.name;
        let problem = slotgate_problem::Problem::upstream_bad_response(upstream, &self.route.model)
            .with_detail(format!(
                "Upstream `{upstream}` answered {status} instead of a stream after the request \
                 had queued (the client already had its 200)."
            ))
            .with_extension("upstream_status", status)
            .with_extension("upstream_error", engine);
        sse_event(problem, self.request_id.to_str().unwrap_or_default())
    }
}

/// A refused connection to `target`, for a request sent at `sent`: logged, and counted towards
/// ejecting the upstream (passive health checking).
fn connect_failed(target: &Target, error: &BoxError, sent: Instant, policy: &HealthPolicy) {
    let reason = chain(&**error);
    warn!(upstream = %target.upstream.name, error = %reason, "connect failed");
    target.record_failure(reason, sent, policy, "connect errors");
}

/// What the `status` of an engine's answer to a request sent at `sent` says about `target`'s
/// upstream, recorded: a 5xx counts towards ejecting it, as a refused connection does, unless
/// it only says the engine is busy ([`judge`]); any other answer breaks the failure streak.
fn judged(target: &Target, status: StatusCode, sent: Instant, policy: &HealthPolicy) {
    match judge(target.upstream.kind, status) {
        Verdict::Well => target.upstream.health.record_answer(),
        Verdict::Failing => target.record_failure(
            format!("answered {status} to a forwarded request"),
            sent,
            policy,
            "engine errors",
        ),
        Verdict::Busy => {}
    }
}

/// Gives up `target`'s answer of `status` (a 502, 503 or 504) to try the next host: the
/// retry is counted and logged, and the slot, if the route took one, is given back.
///
/// Whether the engine still runs the request decides when the slot goes back. A 503 is the
/// engine's own refusal (loading, or its queue full): it never ran it, so the slot is free
/// at once. A 502 or 504 comes from a proxy in front of the engine (`KServe`'s, an ingress)
/// that lost patience or its connection: the engine behind it may still be winding the
/// request down, so the slot is kept for `cancel_grace`, as after a first-byte timeout.
/// Both count as an upstream error of the target.
fn retrying(target: &Target, status: StatusCode, slot: Option<Slot>, request_id: &HeaderValue) {
    target.metrics.retried(status);
    info!(
        request_id = request_id.to_str().unwrap_or_default(),
        upstream = %target.upstream.name,
        model = %target.model,
        %status,
        "engine error answer: retrying on the next upstream"
    );
    match slot {
        Some(slot) if status == StatusCode::SERVICE_UNAVAILABLE => slot.fail(),
        Some(slot) => slot.timed_out(target.cancel_grace),
        None => {}
    }
}

/// An engine's answer held while the request is retried elsewhere.
struct HeldAnswer {
    answer: Response<ResponseBody>,
    /// The upstream that gave it, and how long the request waited for its slot there.
    upstream: Arc<UpstreamState>,
    waited: Duration,
}

impl HeldAnswer {
    /// The answer, sent to the client after all: the access log names its engine again (a later
    /// try replaced it).
    fn sent(self, access: &Access) -> Response<ResponseBody> {
        access.upstream(&self.upstream);
        access.queue_wait(self.waited);
        self.answer
    }
}

/// Whether an engine's answer of `status` goes on to the next host (within
/// `engine_error_retries`): a 502, 503 or 504, which says the request did not run there, or
/// did not finish. Any other status, 4xx and 500 included, is the answer.
fn is_retried(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// The keepalive interval for `api` on `target`: `queue_keepalive`, for a streamed request on
/// an SSE route; `None` otherwise (the request queues as usual).
fn keepalive(endpoint: &Endpoint, api: &request::ApiRequest, target: &Target) -> Option<Duration> {
    let every = target.queueing.keepalive?;
    (api.stream && endpoint.streams_sse()).then_some(every)
}

/// The client's deadline that set `wait`, if one did (rather than `queue_timeout`), with the
/// `expected` wait that it could not cover when the request was refused before queueing.
fn client_deadline(wait: Wait, expected: Option<Duration>) -> Option<Box<Deadline>> {
    (wait.limit != Limit::QueueTimeout).then(|| {
        Box::new(Deadline {
            header: wait.limit.as_str(),
            bound: wait.bound,
            expected,
        })
    })
}

/// The upstream that answered, by its configured name.
const UPSTREAM_HEADER: HeaderName = HeaderName::from_static("x-slotgate-upstream");
/// How long the request waited in the queue for its slot, in whole milliseconds.
const QUEUE_WAIT_HEADER: HeaderName = HeaderName::from_static("x-slotgate-queue-wait-ms");

/// Tells the client where its answer came from and how long it queued: set on every response
/// an upstream gave (replacing any such header the upstream sent, so an engine cannot speak
/// for the gateway). The wait is 0 on routes that take no slot.
fn mark_routed(headers: &mut http::HeaderMap, target: &Target, waited: Duration) {
    mark_upstream(headers, target);
    let millis = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
    // Most requests find a free slot: a static "0" spares them an allocation.
    let value = match millis {
        0 => HeaderValue::from_static("0"),
        millis => HeaderValue::from(millis),
    };
    headers.insert(QUEUE_WAIT_HEADER, value);
}

/// Sets `x-slotgate-upstream` to `target`'s upstream.
fn mark_upstream(headers: &mut http::HeaderMap, target: &Target) {
    // A name that cannot be a header value leaves the header out rather than refusing the
    // answer (`UpstreamState::name_header`).
    match &target.upstream.name_header {
        Some(name) => headers.insert(UPSTREAM_HEADER, name.clone()),
        None => headers.remove(UPSTREAM_HEADER),
    };
}

/// The engine slots `api` takes on `target`: its sequences ([`Weighed`](crate::proxy::endpoint::Weighed)), except on
/// Ollama, which ignores `n` and runs one sequence per request.
fn weight(api: &request::ApiRequest, target: &Target) -> usize {
    match target.upstream.kind {
        Kind::Ollama => 1,
        _ => api.sequences,
    }
}

fn eligible<'r>(route: &'r Route, endpoint: &Endpoint) -> Result<Vec<&'r Arc<Target>>, Error> {
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
    response.map(|body| {
        Either::Right(Either::Left(SlotBody::new(
            Sniff::new(Rename::new(body, None), None),
            None,
        )))
    })
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
            // Nothing reached the engine: the slot is free at once, and the request counts as an
            // upstream error.
            slot.fail();
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
    meter::is_sse(headers) && !headers.contains_key(header::CONTENT_LENGTH)
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
