//! Request handling shared by every kind. One request, in order:
//!
//! 1. [`App::handle`] records it with the observer and (llama-server only) answers 503 while the
//!    model is still loading.
//! 2. Inference paths go to [`App::inference`]: read the `x-fake-*` headers and the body, work
//!    out the [`Plan`], resolve the model the kind's way, check the context size.
//! 3. [`App::admit`]: take a slot at once, or wait for one (and for the model to load) in FIFO
//!    order; Ollama refuses past its queue bound.
//! 4. [`App::generate`]: apply the injected failures, then answer as JSON after the generation
//!    time or as an SSE stream paced token by token.
//!
//! Everything else (probes, listings, residency endpoints) goes to the kind's own `route`.
//!
//! This module is the top of the request path: it uses the kinds (`kinds/*`), and they use only
//! what sits below both (the server state in `state.rs`, the answer builders in `reply.rs`).

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http::header::{CONTENT_TYPE, HeaderValue};
use http::{Method, Request, Response, Version};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use serde_json::Value;
use tokio::time::Instant;

use crate::api::ollama::{self as ollama_api, Generation as OllamaGeneration};
use crate::api::{anthropic, llama as llama_api, media, rerank, responses};
use crate::body::{Emit, ResponseBody};
use crate::config::Kind;
use crate::control::{Overrides, Plan, headers};
use crate::failure::{Failure, FailurePlan};
use crate::form;
use crate::kinds::{self, llama, ollama, vllm};
use crate::models::{LoadFailed, Model, Wanted};
use crate::observer::{ConnectionState, Fate, Outcome, Tracker};
use crate::openai::{self, Answer, Endpoint, InferenceRequest};
use crate::reply::{MAX_BODY, Refusal, finish, json_response, response, stream_response};
use crate::slots::{CollapseSignal, Lease, SlotPool, Work};
use crate::sse::Step;
use crate::state::App;
use crate::store::Stored;

impl App {
    /// Serves one request. Never fails: every problem is an HTTP answer.
    pub(crate) async fn handle(
        self: Arc<Self>,
        req: Request<Incoming>,
        connection: Arc<ConnectionState>,
    ) -> Result<Response<ResponseBody>, Infallible> {
        let request_id = req
            .headers()
            .get(headers::REQUEST_ID)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        // cpp-httplib speaks only HTTP/1: an h2c connection is never closed this way.
        if self.config.close_after_stream && req.version() < Version::HTTP_2 {
            connection.close_after_streams();
        }
        let tracker = self.observer.track(
            request_id,
            req.method().as_str(),
            req.uri().path(),
            connection,
        );
        let echo = HeaderValue::from_str(tracker.id()).ok();
        let mut response = self.dispatch(req, tracker).await;
        if let Some(id) = echo {
            response.headers_mut().insert(headers::REQUEST_ID, id);
        }
        Ok(response)
    }

    async fn dispatch(
        self: &Arc<Self>,
        req: Request<Incoming>,
        tracker: Tracker,
    ) -> Response<ResponseBody> {
        let kind = self.kind();
        let loading = Instant::now() < self.ready_at || self.unhealthy.load(Ordering::Relaxed);
        if kind == Kind::LlamaServer && loading {
            // llama-server's pre-routing middleware answers every path while the model loads.
            return self.reject(Endpoint::Chat, tracker, &Refusal::new(503, "Loading model"));
        }
        if req.method() == Method::POST
            && let Some(endpoint) = Endpoint::from_path(kind, req.uri().path())
        {
            return self.inference(endpoint, req, tracker).await;
        }
        let (response, outcome) = kinds::route(self, req).await;
        finish(tracker, response, outcome)
    }

    // === inference ===

    async fn inference(
        self: &Arc<Self>,
        endpoint: Endpoint,
        req: Request<Incoming>,
        mut tracker: Tracker,
    ) -> Response<ResponseBody> {
        let overrides = match Overrides::from_headers(req.headers()) {
            Ok(overrides) => overrides,
            Err(message) => return self.reject(endpoint, tracker, &Refusal::new(400, message)),
        };
        let content_type = req
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        let Ok(body) = Limited::new(req.into_body(), MAX_BODY).collect().await else {
            let refusal = Refusal::new(400, "could not read the request body");
            return self.reject(endpoint, tracker, &refusal);
        };
        let request = match read_request(endpoint, &content_type, body.to_bytes()).await {
            Ok(request) => request,
            Err(refusal) => return self.reject(endpoint, tracker, &refusal),
        };
        let mut plan = {
            let behaviour = self.behaviour.lock();
            Plan::new(
                behaviour.tokens,
                behaviour.pacing,
                &behaviour.failures,
                overrides,
                request.max_tokens(),
                request.count_prompt_tokens(endpoint),
            )
        };
        let stream = endpoint.streams(request.stream);
        tracker.describe(request.model.as_deref(), stream, &plan.failure_list);

        if request.required(endpoint).is_none() {
            let field = endpoint.required_field();
            let refusal = Refusal {
                param: Some(field),
                ..Refusal::new(400, format!("'{field}' is required"))
            };
            return self.reject(endpoint, tracker, &refusal);
        }
        if let Some(refusal) = self.check_previous(endpoint, &request) {
            return self.reject(endpoint, tracker, &refusal);
        }
        let model = match self.resolve(endpoint, request.model.as_deref()) {
            Ok(model) => model,
            Err(refusal) => return self.reject(endpoint, tracker, &refusal),
        };
        tracker.set_model_key(&model.name);
        if let Some(response) = self.check_context(endpoint, plan.prompt_tokens) {
            return finish(tracker, response, Outcome::Rejected(400));
        }
        let sequences = match self.sequences(&request, endpoint) {
            Ok(sequences) => sequences,
            Err(refusal) => return self.reject(endpoint, tracker, &refusal),
        };
        if plan.clear_cache {
            model.pool.clear_cache();
        }
        let prompt = request.prompt_sequence(endpoint);
        let answer = openai::answer_sequence(endpoint, plan.tokens);
        let work = Work {
            prompt_tokens: plan.prompt_tokens,
            weight: sequences,
            prompt: &prompt,
            answer: &answer,
        };
        let lease = match self.admit(&model, &mut tracker, &work).await {
            Ok(lease) => lease,
            Err(refusal) => return self.reject(endpoint, tracker, &refusal),
        };
        plan.set_cached(lease.cached(), self.config.prefill_per_token);
        model.touch();
        let signal = lease.signal();
        let pool = Arc::clone(lease.pool());
        tracker.start(lease);

        let answer = Answer {
            kind: self.kind(),
            endpoint,
            id: self.answer_id(endpoint),
            created: openai::unix_now(),
            model: request.model.as_deref().unwrap_or(&model.name),
            plan: &plan,
            include_usage: request.include_usage(),
            choices: u32::try_from(sequences).unwrap_or(1),
            cache_details: self.config.prompt_tokens_details,
        };
        let generation = Generation {
            answer,
            request: &request,
            signal,
            pool,
        };
        self.generate(generation, stream, tracker).await
    }

    /// A `previous_response_id` this instance does not remember: vLLM's 404.
    fn check_previous(&self, endpoint: Endpoint, request: &InferenceRequest) -> Option<Refusal> {
        let previous = request.previous_response_id.as_deref()?;
        if endpoint != Endpoint::Responses
            || !self.config.responses_store
            || self.responses.get(previous).is_some()
        {
            return None;
        }
        Some(Refusal {
            param: Some("previous_response_id"),
            ..Refusal::new(404, format!("Response with id '{previous}' not found."))
        })
    }

    /// Finds the model a request names, the kind's way.
    fn resolve(&self, endpoint: Endpoint, requested: Option<&str>) -> Result<Arc<Model>, Refusal> {
        let requested = requested.filter(|name| !name.is_empty());
        match self.kind() {
            // A single-model llama-server ignores the model field.
            Kind::LlamaServer if !self.config.router => Ok(Arc::clone(self.registry.primary())),
            Kind::LlamaServer => {
                let name = requested
                    .ok_or_else(|| Refusal::new(400, "model name is missing from the request"))?;
                self.router_model(name)
            }
            Kind::Vllm => match requested {
                None => Ok(Arc::clone(self.registry.primary())),
                Some(name) => self.registry.get(name).cloned().ok_or_else(|| Refusal {
                    param: Some("model"),
                    ..Refusal::new(404, format!("The model `{name}` does not exist."))
                }),
            },
            Kind::Ollama => {
                let name = requested.ok_or_else(|| Refusal::new(400, "model is required"))?;
                self.registry.get(name).cloned().ok_or_else(|| {
                    let message = if endpoint.is_ollama_native() {
                        format!("model '{name}' not found")
                    } else {
                        format!("model \"{name}\" not found, try pulling it first")
                    };
                    Refusal::new(404, message)
                })
            }
        }
    }

    /// The kind's 400 for a prompt that does not fit the context.
    fn check_context(&self, endpoint: Endpoint, prompt: u32) -> Option<Response<ResponseBody>> {
        let n_ctx = self.config.n_ctx;
        if prompt < n_ctx {
            return None;
        }
        match self.kind() {
            Kind::LlamaServer => Some(json_response(
                400,
                &llama::context_exceeded(endpoint, prompt, n_ctx),
            )),
            Kind::Vllm => Some(json_response(
                400,
                &vllm::error_json(
                    400,
                    &format!(
                        "This model's maximum context length is {n_ctx} tokens. However, your \
                         request has {prompt} input tokens. Please reduce the length of the \
                         input messages."
                    ),
                    Some("input_tokens"),
                ),
            )),
            // Ollama truncates the prompt instead.
            Kind::Ollama => None,
        }
    }

    /// Takes a slot, waiting for the model and the slot if need be.
    async fn admit(
        &self,
        model: &Arc<Model>,
        tracker: &mut Tracker,
        work: &Work<'_>,
    ) -> Result<Lease, Refusal> {
        if model.is_loaded()
            && let Some(lease) = model.pool.try_acquire(work)
        {
            return Ok(lease);
        }
        // Ollama's scheduler bounds what may wait, for a load or a slot, across all models.
        let _pending = match self.kind() {
            Kind::Ollama => Some(
                self.queue_bound
                    .try_enter()
                    .ok_or_else(|| Refusal::new(503, ollama::SERVER_BUSY))?,
            ),
            _ => None,
        };
        tracker.queued();
        // Held until the slot is ours, so `--models-max` does not evict the model between its
        // load and the acquire.
        let _wanted = Wanted::new(model);
        self.registry
            .ensure_loaded(model)
            .await
            .map_err(|LoadFailed| {
                Refusal::new(500, format!("model name={} failed to load", model.name))
            })?;
        Ok(model.pool.acquire(work).await)
    }

    /// The sequences (engine slots) a request runs: `n` choices (chat), `max(n, best_of)`
    /// (completions), each in its own slot (real-engine-notes: llama-server showed
    /// `requests_processing 2` for one `"n":2` request). llama-server refuses more than its slots
    /// with 400; vLLM takes every slot; Ollama ignores `n` and runs one.
    fn sequences(&self, request: &InferenceRequest, endpoint: Endpoint) -> Result<usize, Refusal> {
        let n = request.sequences(endpoint);
        let parallel = self.config.parallel;
        match self.kind() {
            Kind::Ollama => Ok(1),
            Kind::LlamaServer if n as usize > parallel => Err(Refusal::new(
                400,
                format!("Field 'n': Value must be between 1 <= value <= {parallel}, but got {n}"),
            )),
            Kind::LlamaServer | Kind::Vllm => Ok((n as usize).min(parallel)),
        }
    }

    // === answering ===

    async fn generate(
        &self,
        mut generation: Generation<'_>,
        stream: bool,
        tracker: Tracker,
    ) -> Response<ResponseBody> {
        let failures = generation.answer.plan.failures;
        if let Some(delay) = failures.slow_first_byte {
            tokio::time::sleep(delay).await;
        }
        if failures.reset_before_head {
            return doom(tracker, Fate::Reset, Failure::ResetBeforeHead).await;
        }
        if failures.garbage {
            return doom(tracker, Fate::Garbage, Failure::Garbage).await;
        }
        if let Some(status) = failures.status {
            let message = kinds::injected_status_message(self.kind(), status);
            let response = self.error(generation.answer.endpoint, status, &message, None);
            return finish(
                tracker,
                response,
                Outcome::Injected(Failure::Status(status)),
            );
        }
        if failures.hang {
            // Holds the slot until the client gives up (the tracker records that on drop).
            std::future::pending::<()>().await;
        }
        if generation.signal.is_collapsed() {
            // The first result is an error: a plain error response, not a stream.
            return finish(tracker, self.collapse_error(), Outcome::Failed(500));
        }
        if stream {
            return self.stream(generation, tracker);
        }

        let plan = generation.answer.plan;
        if failures.stall_after.is_some() {
            return stalled_json(tracker);
        }
        let prefill = failures.first_token_delay.unwrap_or_default() + plan.prefill;
        tokio::select! {
            () = tokio::time::sleep(prefill + plan.total()) => {}
            () = generation.signal.collapsed() => {
                return finish(tracker, self.collapse_error(), Outcome::Failed(500));
            }
        }
        generation.pool.add_predicted(plan.tokens);
        if let Some(n) = failures.error_after {
            let message = "injected failure: error after generation";
            let response = self.error(generation.answer.endpoint, 500, message, None);
            return finish(
                tracker,
                response,
                Outcome::Injected(Failure::ErrorAfterChunks(n)),
            );
        }
        let (content_type, body) = self.full_body(&generation);
        if let Some(n) = failures.die_after {
            let outcome = Outcome::Injected(Failure::DieAfterChunks(n));
            return truncated(content_type, &body, Emit::Abort(outcome), tracker);
        }
        if let Some(n) = failures.die_mid_event {
            let outcome = Outcome::Injected(Failure::DieMidEvent(n));
            return truncated(content_type, &body, Emit::Abort(outcome), tracker);
        }
        if let Some(n) = failures.reset_after {
            let outcome = Outcome::Injected(Failure::ResetAfterChunks(n));
            return truncated(content_type, &body, Emit::Reset(outcome), tracker);
        }
        finish(
            tracker,
            response(200, content_type, body),
            Outcome::Completed,
        )
    }

    /// The whole answer of a non-streaming request: its content type and bytes.
    fn full_body(&self, generation: &Generation<'_>) -> (&'static str, Bytes) {
        let answer = &generation.answer;
        let request = generation.request;
        let prompt_tokens = answer.plan.prompt_tokens;
        let json = |value: Value| {
            let bytes = serde_json::to_vec(&value).expect("a Value always serialises");
            ("application/json", Bytes::from(bytes))
        };
        match answer.endpoint {
            Endpoint::Chat | Endpoint::Completions => json(answer.full()),
            Endpoint::Embeddings => json(openai::embeddings(
                answer.model,
                request.embedding_inputs(),
                prompt_tokens,
            )),
            Endpoint::Responses => json(self.remember(answer, request)),
            Endpoint::Messages => json(anthropic::full(answer)),
            Endpoint::OllamaChat => json(ollama_api::full(answer, OllamaGeneration::Chat)),
            Endpoint::OllamaGenerate => json(ollama_api::full(answer, OllamaGeneration::Generate)),
            Endpoint::OllamaEmbed => json(ollama_api::embed(
                answer.model,
                request.embedding_inputs(),
                prompt_tokens,
            )),
            Endpoint::OllamaEmbeddings => json(ollama_api::embeddings()),
            Endpoint::Completion | Endpoint::Infill => {
                json(llama_api::full(answer, &native_prompt(request)))
            }
            Endpoint::Embedding => json(llama_api::embedding(request.embedding_inputs())),
            Endpoint::Rerank => {
                let documents = match &request.documents {
                    Some(Value::Array(items)) => items.as_slice(),
                    _ => &[],
                };
                json(rerank::rerank(
                    self.kind(),
                    &answer.id,
                    answer.model,
                    documents,
                    request.top_n,
                    prompt_tokens,
                ))
            }
            Endpoint::Score => {
                let pairs = openai::count_items(request.text_1.as_ref())
                    .max(openai::count_items(request.text_2.as_ref()));
                json(rerank::score_answer(
                    &answer.id,
                    answer.created,
                    answer.model,
                    pairs,
                    prompt_tokens,
                ))
            }
            Endpoint::Transcription | Endpoint::Translation => {
                let text = media::heard(answer.plan.tokens);
                if request.response_format.as_ref().and_then(Value::as_str) == Some("text") {
                    ("text/plain; charset=utf-8", Bytes::from(text))
                } else {
                    json(media::transcription(&text))
                }
            }
            Endpoint::Speech => ("audio/wav", Bytes::from(media::speech())),
            Endpoint::Images => json(media::images(
                answer.created,
                request.n.unwrap_or(1) as usize,
            )),
        }
    }

    /// The final response object of a Responses request, remembered when the store is on.
    fn remember(&self, answer: &Answer<'_>, request: &InferenceRequest) -> Value {
        let previous = request.previous_response_id.as_deref();
        let object = responses::object(answer, previous, true);
        if self.config.responses_store {
            let stored = Stored {
                object: object.clone(),
                input: request.input.clone(),
            };
            self.responses.put(&answer.id, stored);
        }
        object
    }

    /// The steps of a streamed answer and their content type.
    fn stream_steps(&self, generation: &Generation<'_>) -> (Vec<Step>, &'static str) {
        let answer = &generation.answer;
        let request = generation.request;
        let sse = "text/event-stream";
        match answer.endpoint {
            Endpoint::Responses => {
                // Remembered whole up front: the fake knows its answer before it streams it.
                self.remember(answer, request);
                let previous = request.previous_response_id.as_deref();
                (responses::stream(answer, previous), sse)
            }
            Endpoint::Messages => (anthropic::stream(answer), sse),
            Endpoint::OllamaChat => (
                ollama_api::stream(answer, OllamaGeneration::Chat),
                "application/x-ndjson",
            ),
            Endpoint::OllamaGenerate => (
                ollama_api::stream(answer, OllamaGeneration::Generate),
                "application/x-ndjson",
            ),
            Endpoint::Completion | Endpoint::Infill => {
                (llama_api::stream(answer, &native_prompt(request)), sse)
            }
            _ => (answer.steps(), sse),
        }
    }

    /// A streamed answer: its steps, each paced token `interval` apart (the first after the
    /// injected first-token delay), with the injected failures and the collapse applied on the
    /// way.
    fn stream(&self, generation: Generation<'_>, mut tracker: Tracker) -> Response<ResponseBody> {
        let answer = &generation.answer;
        let plan = answer.plan;
        // Counted up front: the stream owns no pool handle, and the figure is only a metric.
        generation.pool.add_predicted(answer.completion_tokens());
        let (steps, content_type) = self.stream_steps(&generation);
        let mut events: VecDeque<(Duration, Bytes)> = steps
            .into_iter()
            .map(|step| {
                let gap = if step.paced {
                    plan.interval
                } else {
                    Duration::ZERO
                };
                (gap, step.bytes)
            })
            .collect();
        let prefill = plan.failures.first_token_delay.unwrap_or_default() + plan.prefill;
        if let Some((gap, _)) = events.front_mut() {
            // The head goes out now; the first event waits for the prefill (the injected delay
            // and the uncached prompt's).
            *gap += prefill;
        }

        let script = Script {
            kind: self.kind(),
            endpoint: answer.endpoint,
            events,
            tail: VecDeque::new(),
            failures: plan.failures,
            signal: generation.signal,
            sent: 0,
            done: false,
        };
        tracker.status(200);
        let body = ResponseBody::stream(
            futures::stream::unfold(script, Script::next).boxed(),
            tracker,
        );
        stream_response(content_type, body)
    }

    fn answer_id(&self, endpoint: Endpoint) -> String {
        let n = self.next_answer_number();
        // Responses ids are unique across instances too, so an id sent to the wrong instance
        // is never found there by accident.
        if endpoint == Endpoint::Responses {
            return format!("{}{}_{n}", endpoint.id_prefix(), self.started_unix_nanos);
        }
        format!("{}{n}", endpoint.id_prefix())
    }

    // === errors ===

    /// An error response in the route's envelope (the kind's, Anthropic's, Ollama's native).
    pub(crate) fn error(
        &self,
        endpoint: Endpoint,
        status: u16,
        message: &str,
        param: Option<&str>,
    ) -> Response<ResponseBody> {
        json_response(
            status,
            &kinds::error_for(self.kind(), endpoint, status, message, param),
        )
    }

    /// Ends `tracker` with a refusal in the route's envelope.
    pub(crate) fn reject(
        &self,
        endpoint: Endpoint,
        tracker: Tracker,
        refusal: &Refusal,
    ) -> Response<ResponseBody> {
        let response = self.error(endpoint, refusal.status, &refusal.message, refusal.param);
        finish(tracker, response, Outcome::Rejected(refusal.status))
    }

    fn collapse_error(&self) -> Response<ResponseBody> {
        self.error(Endpoint::Chat, 500, llama::CONTEXT_EXCEEDED, None)
    }
}

/// What `generate` needs besides the app.
struct Generation<'a> {
    answer: Answer<'a>,
    request: &'a InferenceRequest,
    signal: CollapseSignal,
    /// For the token counters of `/metrics`.
    pool: Arc<SlotPool>,
}

/// The state of a streamed answer, advanced one [`Emit`] at a time.
struct Script {
    kind: Kind,
    /// The route, whose shape an in-stream error takes.
    endpoint: Endpoint,
    /// The events still to send, each with the pause before it.
    events: VecDeque<(Duration, Bytes)>,
    /// What is left to send once the stream has been cut short by an error.
    tail: VecDeque<Emit>,
    failures: FailurePlan,
    signal: CollapseSignal,
    sent: u32,
    done: bool,
}

impl Script {
    async fn next(mut self) -> Option<(Emit, Self)> {
        if let Some(emit) = self.tail.pop_front() {
            if matches!(emit, Emit::Abort(_)) {
                before_abort().await;
            }
            return Some((emit, self));
        }
        if self.done {
            return None;
        }
        if self.failures.stall_after == Some(self.sent) {
            // Silence with the slot and the connection held, until the client gives up.
            std::future::pending::<()>().await;
        }
        if self.failures.reset_after == Some(self.sent) {
            self.done = true;
            before_abort().await;
            let failure = Failure::ResetAfterChunks(self.sent);
            return Some((Emit::Reset(Outcome::Injected(failure)), self));
        }
        if self.failures.die_after == Some(self.sent) {
            self.done = true;
            before_abort().await;
            let failure = Failure::DieAfterChunks(self.sent);
            return Some((Emit::Abort(Outcome::Injected(failure)), self));
        }
        if let Some(n) = self.failures.die_mid_event.filter(|n| *n == self.sent) {
            // Half of the next event, then the abort (after the pause that lets it out).
            self.done = true;
            let (_, event) = self.events.pop_front()?;
            let outcome = Outcome::Injected(Failure::DieMidEvent(n));
            self.tail.push_back(Emit::Abort(outcome));
            return Some((Emit::Raw(event.slice(..event.len() / 2)), self));
        }
        if let Some(n) = self.failures.error_after.filter(|n| *n == self.sent) {
            let outcome = Outcome::Injected(Failure::ErrorAfterChunks(n));
            return self.fail(500, "injected failure: error mid-stream", outcome);
        }
        let (gap, event) = self.events.pop_front()?;
        if gap.is_zero() {
            if self.signal.is_collapsed() {
                return self.fail(500, llama::CONTEXT_EXCEEDED, Outcome::Failed(500));
            }
        } else {
            tokio::select! {
                () = tokio::time::sleep(gap) => {}
                () = self.signal.collapsed() => {
                    return self.fail(500, llama::CONTEXT_EXCEEDED, Outcome::Failed(500));
                }
            }
        }
        self.sent += 1;
        Some((Emit::Event(event), self))
    }

    /// Ends the stream with the kind's in-stream error event.
    fn fail(mut self, status: u16, message: &str, outcome: Outcome) -> Option<(Emit, Self)> {
        self.done = true;
        // The events sent so far are numbered from 0, so the error's is their count.
        let sequence = u64::from(self.sent);
        let events =
            kinds::stream_error_events(self.kind, self.endpoint, status, message, sequence);
        self.tail.extend(events.into_iter().map(Emit::Event));
        self.tail.push_back(Emit::End(outcome));
        let first = self.tail.pop_front()?;
        Some((first, self))
    }
}

/// A non-streaming answer cut in half: headers and half the body, then `end` (an abort or a
/// reset).
fn truncated(
    content_type: &'static str,
    body: &Bytes,
    end: Emit,
    mut tracker: Tracker,
) -> Response<ResponseBody> {
    let half = body.slice(..body.len() / 2);
    tracker.status(200);
    let end = async move {
        before_abort().await;
        end
    };
    let emits = futures::stream::iter([Emit::Raw(half)]).chain(futures::stream::once(end));
    stream_response(content_type, ResponseBody::stream(emits.boxed(), tracker))
}

/// A non-streaming answer that sends its head and then nothing, holding the slot.
fn stalled_json(mut tracker: Tracker) -> Response<ResponseBody> {
    tracker.status(200);
    let body = ResponseBody::stream(futures::stream::pending().boxed(), tracker);
    stream_response("application/json", body)
}

/// Reads an inference request's body: JSON, or a multipart form for audio.
async fn read_request(
    endpoint: Endpoint,
    content_type: &str,
    body: Bytes,
) -> Result<InferenceRequest, Refusal> {
    if endpoint.is_multipart() {
        let form = form::read(content_type, body)
            .await
            .map_err(|e| Refusal::new(400, error_chain(&e)))?;
        return Ok(InferenceRequest::from_form(&form.fields, form.file_len));
    }
    serde_json::from_slice(&body).map_err(|e| Refusal::new(400, format!("invalid JSON: {e}")))
}

/// An error and its causes, for a refusal's message.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

/// What llama-server echoes as `prompt` on `/completion` and `/infill`.
fn native_prompt(request: &InferenceRequest) -> Value {
    request
        .prompt
        .clone()
        .or_else(|| request.input_prefix.clone())
        .unwrap_or(Value::Null)
}

/// Ends the request with `failure` and dooms its connection to `fate`. Never returns: the
/// connection task drops this future with the connection.
async fn doom(mut tracker: Tracker, fate: Fate, failure: Failure) -> Response<ResponseBody> {
    let connection = Arc::clone(tracker.connection());
    tracker.finish(Outcome::Injected(failure));
    connection.doom(fate);
    std::future::pending().await
}

/// A pause before an injected abort. hyper drops whatever it still buffers when a body fails, so
/// without it the chunks "sent" before the crash (even the response head) might never leave; a
/// real server that dies after N chunks has written them out first.
async fn before_abort() {
    tokio::time::sleep(Duration::from_millis(20)).await;
}
