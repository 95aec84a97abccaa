//! Step 8 as the request path takes it: the engine's response head becomes the client's
//! response, its body streaming through with the slot ([`SlotBody`]) until the answer is over.
//!
//! [`Answerer::answer`] stacks what the body does on the way: the model's name rewritten to the
//! one the client asked for ([`Rename`]), a Responses answer's id recorded for its follow-ups
//! ([`Sniff`]), the first token and the usage read ([`Meter`]), and the bounds on the
//! upstream's silences and on the stream's length ([`Watch`]). An answer the engine accepted
//! records where the request went by its prompt ([`CacheAware::sent`]), and the meter hands the
//! engine's report of its cached prompt tokens back to it. [`mark_routed`] tells the client
//! where its answer came from.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Response};
use hyper::body::Incoming;
use prometheus_client::metrics::counter::Counter;
use slotgate_problem::Dialect;

use crate::metrics::{Bound, Metrics};
use crate::proxy::access::Access;
use crate::proxy::admit::Slot;
use crate::proxy::affinity::{Recorder, ResponseAffinity, Sniff};
use crate::proxy::body::meter::Meter;
use crate::proxy::body::{self, SlotBody, Watch};
use crate::proxy::cache_aware::CacheAware;
use crate::proxy::choose::Routed;
use crate::proxy::rename::{self, Rename};
use crate::proxy::send::Answered;
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;

/// An engine's answer streaming through with its slot (and, for the Responses API, searched
/// for its id): what both the ordinary path and a `queue_keepalive` stream pass on. An
/// endpoint that takes no slot streams through the same body, holding `None`.
pub(crate) type Streamed = SlotBody<Sniff<Rename<Incoming>>, Option<Slot>>;

/// The upstream that answered, by its configured name.
const UPSTREAM_HEADER: HeaderName = HeaderName::from_static("x-slotgate-upstream");
/// How long the request waited in the queue for its slot, in whole milliseconds.
const QUEUE_WAIT_HEADER: HeaderName = HeaderName::from_static("x-slotgate-queue-wait-ms");

/// Step 8: what every answer shares.
#[derive(Debug)]
pub(crate) struct Answerer {
    /// Which upstream holds each Responses id.
    affinity: Arc<dyn ResponseAffinity>,
    /// What each host's prompt cache holds, as far as the gateway knows.
    cache: Arc<CacheAware>,
    /// `slotgate_bounds_total{bound="stream_idle"}`.
    stalled: Counter,
    /// `slotgate_bounds_total{bound="upstream_cut"}`.
    cut: Counter,
    /// `slotgate_bounds_total{bound="stream_timeout"}`.
    too_long: Counter,
}

impl Answerer {
    /// Answers that record Responses ids into `affinity`, where requests went by their prompt
    /// into `cache`, and count their bounds in `metrics`.
    pub(crate) fn new(
        affinity: Arc<dyn ResponseAffinity>,
        cache: Arc<CacheAware>,
        metrics: &Metrics,
    ) -> Self {
        Self {
            affinity,
            cache,
            stalled: metrics.bound(Bound::StreamIdle),
            cut: metrics.bound(Bound::UpstreamCut),
            too_long: metrics.bound(Bound::StreamTimeout),
        }
    }

    /// `target`'s `answered` head to `routed`, streaming through with its slot; the body bounds
    /// the upstream's silences, a Responses answer's id is recorded on the way, and the model
    /// the client asked for is named in place of the engine's name for it, and where the
    /// request went by its prompt is recorded. The body notes its end in `access` (an answer
    /// held for a retry notes nothing).
    pub(crate) fn answer(
        &self,
        routed: &Routed,
        target: &Target,
        answered: Answered,
        access: &Access,
    ) -> Response<Streamed> {
        let Answered {
            mut response,
            mut slot,
            sent,
        } = answered;
        // Where the request went by its prompt, once the engine took it.
        let feedback = routed
            .api
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
        let recorder = (routed.endpoint.is_responses() && response.status().is_success())
            .then(|| Recorder::new(Arc::clone(&self.affinity), target.upstream.name.clone()));
        let mut watch = self.watch(target, &routed.request_id, response.headers(), sent);
        watch.meter = meter;
        watch.dialect = Dialect::of_path(routed.endpoint.path);
        let asked = routed.api.model.as_deref();
        let names = rename::prepare(&mut response, asked, &target.engine_model);
        response.map(|body| {
            SlotBody::new(Sniff::new(Rename::new(body, names), recorder), slot).watched(watch)
        })
    }

    /// The [`Watch`] over the answer of `target`, whose response head has `headers` and whose
    /// request was `sent` then.
    fn watch(
        &self,
        target: &Target,
        request_id: &HeaderValue,
        headers: &HeaderMap,
        sent: Instant,
    ) -> Watch {
        Watch {
            idle_timeout: target.stream_idle_timeout,
            cancel_grace: target.cancel_grace,
            framing: body::framing(headers),
            dialect: Dialect::OpenAi,
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

    /// The affinity record of Responses ids.
    pub(crate) fn affinity(&self) -> &Arc<dyn ResponseAffinity> {
        &self.affinity
    }
}

/// An upstream's answer to a request that holds no slot, passed through as it comes.
pub(crate) fn passed_through(response: Response<Incoming>) -> Response<Streamed> {
    response.map(|body| SlotBody::new(Sniff::new(Rename::new(body, None), None), None))
}

/// Tells the client where its answer came from and how long it queued: set on every response
/// an upstream gave (replacing any such header the upstream sent, so an engine cannot speak
/// for the gateway). The wait is 0 on endpoints that take no slot.
pub(crate) fn mark_routed(headers: &mut HeaderMap, target: &Target, waited: Duration) {
    mark_state(headers, &target.upstream, waited);
}

/// [`mark_routed`] for an answer of `upstream` outside any model's route (a request by
/// response id).
pub(crate) fn mark_state(headers: &mut HeaderMap, upstream: &UpstreamState, waited: Duration) {
    match &upstream.name_header {
        Some(name) => headers.insert(UPSTREAM_HEADER, name.clone()),
        None => headers.remove(UPSTREAM_HEADER),
    };
    let millis = u64::try_from(waited.as_millis()).unwrap_or(u64::MAX);
    // Most requests find a free slot: a static "0" spares them an allocation.
    let value = match millis {
        0 => HeaderValue::from_static("0"),
        millis => HeaderValue::from(millis),
    };
    headers.insert(QUEUE_WAIT_HEADER, value);
}

/// Sets `x-slotgate-upstream` to `target`'s upstream.
pub(crate) fn mark_upstream(headers: &mut HeaderMap, target: &Target) {
    // A name that cannot be a header value leaves the header out rather than refusing the
    // answer (`UpstreamState::name_header`).
    match &target.upstream.name_header {
        Some(name) => headers.insert(UPSTREAM_HEADER, name.clone()),
        None => headers.remove(UPSTREAM_HEADER),
    };
}
