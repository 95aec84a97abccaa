//! One request through the gateway, step by step: this file calls the others in order.
//!
//! [`App::handle`] answers every request (it cannot fail): it dispatches on the path, runs the
//! steps of a model-routed request ([`App::proxy`]), and hands any error to [`problems`]. Every
//! response carries `x-request-id`.
//!
//! A model-routed request reads its body ([`request`]), chooses where it may go
//! ([`choose`](crate::proxy::choose)), and then, target by target, takes a slot
//! ([`admit`]), sends itself ([`send`](crate::proxy::send)) and is
//! answered ([`answer`](crate::proxy::answer)), or goes on to the next target
//! ([`retry`](crate::proxy::retry)). A request that queues under `queue_keepalive` takes the
//! last two steps inside its response body ([`keepalive`]).
//!
//! A request reads the configuration in force when it arrives ([`Live::current`]) and keeps it
//! to the end, so a reload never changes the rules under it.

use std::ops::ControlFlow::{self, Break, Continue};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::Body;
use http_body_util::{Either, Full};
use slotgate_config::Kind;
use slotgate_problem::Dialect;
use tracing::debug;

use crate::metrics::Metrics;
use crate::proxy::access::{Access, Counted, Logged};
use crate::proxy::admit::{self, Admitted, Fallback, Refused};
use crate::proxy::affinity::LocalAffinity;
use crate::proxy::answer::{Answerer, Streamed, mark_routed};
use crate::proxy::cache_aware::CacheAware;
use crate::proxy::choose::{Chooser, Routed};
use crate::proxy::client::{Client, Deadlines};
use crate::proxy::cors;
use crate::proxy::endpoint::{self, Endpoint, ModelIn};
use crate::proxy::keepalive::{self, Forward, KeepaliveBody, Refuse, Steps};
use crate::proxy::live::{Generation, Live};
use crate::proxy::problems::{self, Error, GET_ONLY, allow};
use crate::proxy::request::{self, ApiRequest};
use crate::proxy::responses::{self, FollowUp};
use crate::proxy::retry::{HeldAnswer, Tries, retrying};
use crate::proxy::send::{Answered, Sender, Sent};
use crate::proxy::{models, ollama};
use crate::support::error::BoxError;
use crate::support::request_id::{REQUEST_ID, request_id};
use crate::support::shutdown::ShutdownSignal;
use crate::upstreams::target::Target;

/// The body of every API response: a buffered document (a problem, the model list), an
/// upstream's answer streamed through with its slot ([`Streamed`]), or the stream of a request
/// that queues under `queue_keepalive` ([`KeepaliveBody`]).
pub(crate) type ResponseBody = Either<Full<Bytes>, Either<Streamed, KeepaliveBody>>;

/// What one candidate came to: on to the next one, or the request's end.
type Attempt = ControlFlow<Result<Response<ResponseBody>, Error>>;

/// What the request path needs, shared by every connection.
#[derive(Debug)]
pub(crate) struct App {
    /// The configuration in force: routing table (and, through it, the limiter keys and the
    /// upstreams' state), API keys, body limit.
    pub(crate) live: Arc<Live>,
    /// Step 4: the ranking, the steering layers and cache-aware placement.
    chooser: Chooser,
    /// Step 7: the pooled upstream client.
    sender: Sender,
    /// Step 8: the response bodies.
    answerer: Answerer,
    /// `Retry-After` while shutting down.
    shutdown_retry_after: Duration,
    /// Fired when the gateway starts shutting down.
    shutdown: ShutdownSignal,
    /// For the `created` field of `/v1/models`.
    started: SystemTime,
    /// The request-body bytes all requests together may buffer (`max_buffered_body_bytes`, read
    /// at start).
    body_budget: request::BodyBudget,
    /// For the refusals counted when they become a response.
    metrics: Metrics,
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
        let affinity = Arc::new(LocalAffinity::new(
            server.response_affinity_entries,
            server.response_affinity_ttl,
        ));
        // What each host's prompt cache holds: read when choosing, written when answered.
        let cache = Arc::new(CacheAware::new(&server.cache_affinity, Instant::now()));
        Self {
            live,
            chooser: Chooser::new(
                vec![Box::new(FollowUp::new(affinity.clone()))],
                Arc::clone(&cache),
            ),
            sender: Sender::new(server.first_byte_timeout),
            answerer: Answerer::new(affinity, cache, metrics),
            // Clients told "shutting down" should come back once a restart is likely done.
            shutdown_retry_after: server.drain_grace.max(Duration::from_secs(1)),
            shutdown,
            started: SystemTime::now(),
            body_budget: request::BodyBudget::new(server.max_buffered_body_bytes, metrics),
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
        let dialect = problems::dialect(&req);
        let origin = req.headers().get(http::header::ORIGIN).cloned();
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
                problems::record(&error, &generation.routes, &self.metrics, &access);
                problems::respond::<Full<Bytes>>(&error, &request_id, dialect).map(Either::Left)
            }
        };
        if dialect == Dialect::Anthropic {
            // Where the Anthropic SDKs read the request id from (`APIStatusError.request_id`).
            response
                .headers_mut()
                .insert(problems::ANTHROPIC_REQUEST_ID, request_id.clone());
        }
        response.headers_mut().insert(REQUEST_ID, request_id);
        let origins = &generation.config.server.cors_origins;
        cors::decorate(origins, origin.as_ref(), response.headers_mut());
        let status = response.status();
        response.map(|body| Logged::new(body, status, access))
    }

    /// Which API the path is: a model-routed endpoint ([`App::proxy`]), or one the gateway
    /// answers itself or passes to one upstream (the dialects' own endpoints).
    async fn dispatch<B>(
        self: &Arc<Self>,
        req: Request<B>,
        generation: &Arc<Generation>,
        request_id: &HeaderValue,
        access: &Access,
    ) -> Result<Response<ResponseBody>, Error>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        request::check_head(&req, generation.config.server.max_header_bytes)?;
        if let Some(answer) = cors::preflight(&generation.config.server.cors_origins, &req) {
            return Ok(answer.map(|body| Either::Left(Full::new(body))));
        }
        let path = req.uri().path();
        if let Some(endpoint) = Endpoint::find(path) {
            allow(&req, endpoint.methods)?;
            let client = generation.api_keys.verify(req.headers())?;
            access.key_name(client.tenant.as_ref());
            let asked = Asked {
                generation: Arc::clone(generation),
                endpoint,
                client,
                request_id: request_id.clone(),
                access: access.clone(),
            };
            return self.proxy(req, asked).await;
        }
        let methods = if path == models::LIST || path.starts_with(models::ONE) {
            GET_ONLY
        } else if let Some(rest) = path.strip_prefix(responses::BY_ID) {
            match responses::find(rest) {
                Some((_, methods)) => methods,
                None => return Err(problems::not_found(path)),
            }
        } else if ollama::Listing::find(path).is_some()
            || path == ollama::VERSION
            || (path == ollama::HEARTBEAT_PATH && ollama::answers_heartbeat(&generation.upstreams))
        {
            GET_ONLY
        } else {
            return Err(problems::not_found(path));
        };
        allow(&req, methods)?;
        // Like Ollama's, the heartbeat needs no key.
        if path == ollama::HEARTBEAT_PATH {
            return Ok(buffered(ollama::heartbeat()));
        }
        generation.api_keys.verify(req.headers())?;
        self.own(req, generation, request_id).await
    }

    /// The endpoints that take no slot and name no model: answered from the routing table, or
    /// passed to the one upstream that can answer them.
    async fn own<B>(
        &self,
        req: Request<B>,
        generation: &Generation,
        request_id: &HeaderValue,
    ) -> Result<Response<ResponseBody>, Error>
    where
        B: Body<Data = Bytes>,
        B::Error: Into<BoxError>,
    {
        let path = req.uri().path().to_owned();
        let routes = &generation.routes;
        if path == models::LIST {
            return Ok(buffered(models::list(routes, self.started)));
        }
        if let Some(id) = path.strip_prefix(models::ONE) {
            let id = endpoint::id_segment(id).unwrap_or(std::borrow::Cow::Borrowed(id));
            return models::one(routes, &id, self.started).map(buffered);
        }
        if let Some(listing) = ollama::Listing::find(&path) {
            return Ok(buffered(models::json_response(ollama::list(
                routes, listing,
            ))));
        }
        if path == ollama::VERSION {
            return ollama::version(req, generation, request_id, &self.sender)
                .await
                .map(streamed);
        }
        // Only the paths under `/v1/responses/` are left (`dispatch`).
        let rest = path.strip_prefix(responses::BY_ID).unwrap_or_default();
        let raw = responses::find(rest).map_or(rest, |(id, _)| id);
        let decoded = endpoint::id_segment(raw);
        let id = decoded.as_deref().unwrap_or(raw);
        let shared = (&**self.answerer.affinity(), &self.sender, &self.body_budget);
        responses::by_id(req, id, generation, request_id, shared)
            .await
            .map(streamed)
    }

    /// Steps 3 to 9 for a model-routed request: its body, where it may go, and then each
    /// candidate in turn until one answers or refuses it for good.
    ///
    /// Each step's future is awaited here, not inside a helper: a future is moved whole
    /// into its caller's, so every level of `async fn` around the send costs a copy of it.
    async fn proxy<B>(
        self: &Arc<Self>,
        req: Request<B>,
        mut asked: Asked,
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
        // Step 3: the body, under the limit, the deadline and the gateway's budget; `model`
        // and `stream` without re-serialising. Then the model's route.
        let (limits, deadlines, client) = self.reading(&req, &mut asked)?;
        let api = request::read(req, limits, asked.endpoint).await?;
        let mut routed = asked.routed(api, deadlines, client)?;
        // Step 4: the targets it may go to, best first.
        let route = Arc::clone(&routed.route);
        let candidates = self.chooser.choose(&mut routed, &route)?;
        debug!(
            request_id = routed.id(),
            model = %route.model,
            endpoint = routed.endpoint.path,
            stream = routed.api.stream,
            candidates = candidates.len(),
            "routing"
        );
        let retries = routed.generation.config.server.engine_error_retries;
        let mut tries = Tries::new(candidates, retries);
        while let Some(target) = tries.next_target() {
            // Steps 5 and 6: a slot on this target, or on to the next.
            let ticket = routed.client.ticket(weight(&routed.api, target));
            let keepalive = keepalive::interval(&routed, target);
            let admitted = admit::admit(
                target,
                routed.endpoint.slot,
                &ticket,
                &routed.deadlines,
                &self.shutdown,
                keepalive,
            )
            .await;
            let slot = match admitted {
                Ok(Admitted::Go(slot)) => slot,
                Ok(Admitted::KeepAlive(queued, every)) => {
                    return Ok(self.keep_alive(queued, every, routed, target, ticket));
                }
                Err(refused) => match self.refused(refused, &routed, target, &ticket, &mut tries) {
                    Continue(()) => continue,
                    Break(done) => return done,
                },
            };
            // Step 7: the request to the engine; step 8, its answer, or step 9: the next.
            let sent = self.sender.send(&routed, target, slot).await;
            if let Break(done) = self.sent(&routed, target, sent, &mut tries) {
                return done;
            }
        }
        tries.exhausted(&routed).map(streamed)
    }

    /// What step 3 reads the body under, and who the request queues as and until when: read
    /// from the head before the body, the deadlines counted from now (sending the body is part
    /// of the client's wait).
    fn reading<B>(
        &self,
        req: &Request<B>,
        asked: &mut Asked,
    ) -> Result<(request::BodyLimits<'_>, Deadlines, Client), Error> {
        let server = &asked.generation.config.server;
        let deadlines = Deadlines::read(req.headers(), tokio::time::Instant::now())?;
        let client = if asked.generation.api_keys.is_enabled() {
            std::mem::take(&mut asked.client)
        } else {
            Client::from_header(server.tenant_header.as_deref(), req.headers())?
        };
        // An upload (`multipart/form-data`) has its own, larger limit.
        let max_bytes = if asked.endpoint.model == ModelIn::Form {
            server.max_upload_bytes
        } else {
            server.max_body_bytes
        };
        let limits = request::BodyLimits {
            max_bytes,
            timeout: server.body_read_timeout,
            budget: &self.body_budget,
        };
        Ok((limits, deadlines, client))
    }

    /// A refusal on `target` other than by the target's queue being full or too small ends
    /// the request; those two go on to the next target.
    fn refused<'r>(
        &self,
        refused: Refused,
        routed: &Routed,
        target: &'r Arc<Target>,
        ticket: &slotgate_limiter::Ticket,
        tries: &mut Tries<'r>,
    ) -> Attempt {
        match refused {
            Refused::Full => tries.full(target, target.retry_after_for(ticket)),
            Refused::TooHeavy { weight, parallel } => tries.too_heavy(target, weight, parallel),
            refused => {
                let refusal = || self.wait_ended(refused, routed, target, ticket);
                return Break(tries.ended(refusal, &routed.access).map(streamed));
            }
        }
        Continue(())
    }

    /// What sending to `target` came to: its answer (step 8), or on to the next target.
    fn sent<'r>(
        &self,
        routed: &Routed,
        target: &'r Target,
        sent: Sent,
        tries: &mut Tries<'r>,
    ) -> Attempt {
        match sent {
            Sent::Answered(answered) => self.answered(routed, target, answered, tries),
            Sent::Unreachable(error) => {
                tries.unreachable(error);
                Continue(())
            }
            Sent::Failed(error) => Break(Err(error)),
        }
    }

    /// Step 8, or the retry step for an engine's 502/503/504 while another target may take
    /// the request.
    fn answered<'r>(
        &self,
        routed: &Routed,
        target: &'r Target,
        mut answered: Answered,
        tries: &mut Tries<'r>,
    ) -> Attempt {
        let waited = answered.waited();
        mark_routed(answered.response.headers_mut(), target, waited);
        routed.access.queue_wait(waited);
        let status = answered.response.status();
        if !tries.retry(status) {
            let answer = self
                .answerer
                .answer(routed, target, answered, &routed.access);
            return Break(Ok(streamed(answer)));
        }
        retrying(target, status, answered.slot.take(), &routed.request_id);
        // An answer held for a retry notes nothing in the access log: it is dropped unread
        // when another host answers, and that drop is not the client leaving. Sent after all,
        // its line's outcome comes from its status and its end.
        let answer = self
            .answerer
            .answer(routed, target, answered, &Access::default());
        tries.hold(HeldAnswer::new(answer, target, waited));
        Continue(())
    }

    /// The error for a request whose admission on `target` was `refused` other than by a full
    /// queue there (the caller tries the next target on those).
    fn wait_ended(
        &self,
        refused: Refused,
        routed: &Routed,
        target: &Target,
        ticket: &slotgate_limiter::Ticket,
    ) -> Error {
        let fallback = Fallback {
            shutting_down: self.shutdown_retry_after,
            unavailable: routed.generation.config.server.health_check_interval,
        };
        refused.into_error(target, ticket, &routed.route.model, fallback)
    }

    /// A streamed request that has to queue on a model with `queue_keepalive`: `200` and
    /// `text/event-stream` at once, the wait and the rest of the request in the body.
    fn keep_alive(
        self: &Arc<Self>,
        queued: admit::Queued,
        every: Duration,
        routed: Routed,
        target: &Arc<Target>,
        ticket: slotgate_limiter::Ticket,
    ) -> Response<ResponseBody> {
        let routed = Arc::new(routed);
        let forward: Forward = {
            let (app, routed, target) = (Arc::clone(self), Arc::clone(&routed), Arc::clone(target));
            Box::new(move |slot| {
                Box::pin(
                    async move { keepalive::forward(app.steps(), &routed, &target, slot).await },
                )
            })
        };
        let refuse: Refuse = {
            let (app, routed, target) = (Arc::clone(self), Arc::clone(&routed), Arc::clone(target));
            Box::new(move |refused| {
                let error = app.wait_ended(refused, &routed, &target, &ticket);
                keepalive::last_event(&routed, &error, &app.metrics)
            })
        };
        let body = KeepaliveBody::new(queued, Arc::clone(target), every, forward, refuse);
        body.respond()
            .map(|body| Either::Right(Either::Right(body)))
    }

    /// Steps 7 and 8, for a queued request's body.
    fn steps(&self) -> Steps<'_> {
        Steps {
            sender: &self.sender,
            answerer: &self.answerer,
            metrics: &self.metrics,
        }
    }
}

/// A request at a model-routed endpoint, before its body is read.
struct Asked {
    generation: Arc<Generation>,
    endpoint: &'static Endpoint,
    /// Who the request queues as, when API keys say it.
    client: Client,
    request_id: HeaderValue,
    access: Access,
}

impl Asked {
    /// The request once its body `api` is read: routed to its model.
    fn routed(
        self,
        api: ApiRequest,
        deadlines: Deadlines,
        client: Client,
    ) -> Result<Routed, Error> {
        let route = Routed::resolve(&self.generation, self.endpoint, &api)?;
        self.access.route(&route);
        Ok(Routed {
            generation: self.generation,
            route,
            endpoint: self.endpoint,
            api,
            client,
            deadlines,
            request_id: self.request_id,
            access: self.access,
        })
    }
}

/// The engine slots `api` takes on `target`: its sequences
/// ([`Weighed`](crate::proxy::endpoint::Weighed)), except on Ollama, which ignores `n` and runs
/// one sequence per request.
fn weight(api: &ApiRequest, target: &Target) -> usize {
    match target.upstream.kind {
        Kind::Ollama => 1,
        _ => api.sequences,
    }
}

/// A buffered document as the response body.
fn buffered(response: Response<Full<Bytes>>) -> Response<ResponseBody> {
    response.map(Either::Left)
}

/// An engine's answer as the response body.
fn streamed(response: Response<Streamed>) -> Response<ResponseBody> {
    response.map(|body| Either::Right(Either::Left(body)))
}
