//! Step 7 as the request path takes it: a routed request sent to one target through the
//! [`forward`](crate::proxy::forward) client, and what that came to ([`Sent`]).
//!
//! Both ways a request reaches an engine go through [`Sender::send`]: the ordinary path, and a
//! request granted its slot inside a `queue_keepalive` stream
//! ([`keepalive`](crate::proxy::keepalive)). It keeps the slot in a
//! [`Sending`] guard until the response head (a client that
//! leaves meanwhile leaves the slot taken for `cancel_grace`), tells the upstream's health what
//! the attempt showed (passive ejection: refused connections and failing answers), and gives the
//! slot back as the failure says.
//!
//! [`Sender::pass`] is the same client for the requests that take no slot and go to one named
//! upstream (the dialects' own endpoints).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Response, StatusCode};
use hyper::body::Incoming;
use tracing::warn;

use crate::proxy::admit::{Sending, Slot};
use crate::proxy::choose::Routed;
use crate::proxy::forward::{Authorization, Destination, ForwardError, Forwarder};
use crate::proxy::problems::Error;
use crate::support::error::{BoxError, chain};
use crate::upstreams::health::{HealthPolicy, Verdict, judge};
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;

/// Sends requests upstream under the first-byte timeout.
#[derive(Debug, Clone)]
pub(crate) struct Sender {
    forwarder: Forwarder,
}

/// What sending a request to one target came to.
#[derive(Debug)]
#[expect(
    clippy::large_enum_variant,
    reason = "an answer is what almost every request comes to, on the hot path: boxing it would \
              cost an allocation per request for the sake of the two rare variants"
)]
pub(crate) enum Sent {
    /// The engine answered, with any status.
    Answered(Answered),
    /// Nothing reached the engine (the connection was refused or timed out): the slot is given
    /// back and the failure counted towards ejecting the upstream; another target may be tried.
    Unreachable(BoxError),
    /// The request failed after it may have reached the engine: the slot is given back as the
    /// failure says, and the request ends with this error.
    Failed(Error),
}

/// An engine's response head, with the slot the request holds and when it was sent.
#[derive(Debug)]
pub(crate) struct Answered {
    /// The response, its body not read yet.
    pub(crate) response: Response<Incoming>,
    /// The slot, for a request that takes one.
    pub(crate) slot: Option<Slot>,
    /// When the request went out.
    pub(crate) sent: Instant,
}

impl Answered {
    /// How long the request waited in the queue for its slot (zero without one).
    pub(crate) fn waited(&self) -> Duration {
        self.slot.as_ref().map_or(Duration::ZERO, Slot::waited)
    }
}

impl Sender {
    /// A sender that waits at most `first_byte_timeout` for a response head.
    pub(crate) fn new(first_byte_timeout: Duration) -> Self {
        Self {
            forwarder: Forwarder::new(first_byte_timeout),
        }
    }

    /// Sends `routed` to `target`, its `slot` (if the endpoint takes one) meanwhile in a
    /// [`Sending`] guard: if the client goes away before the answer begins, the slot stays taken
    /// for the upstream's `cancel_grace`, while the engine notices.
    pub(crate) async fn send(&self, routed: &Routed, target: &Target, slot: Option<Slot>) -> Sent {
        routed.access.upstream(&target.upstream);
        let sent = Instant::now();
        // The name this upstream's engine knows the model by (`engine_model`).
        let body = routed.api.body_for(&target.engine_model);
        // Last before the send, so that the handoff gap covers everything the gateway does.
        let sending = slot.map(|slot| slot.sending(target.cancel_grace));
        let outcome = self
            .forwarder
            .send(
                destination(&target.upstream),
                authorization(&target.upstream, routed.client_keys()),
                &routed.api.parts,
                body,
                &routed.request_id,
            )
            .await;
        let slot = sending.map(Sending::answered);
        let policy = &routed.generation.policy;
        match outcome {
            Ok(response) => {
                judged(target, response.status(), sent, policy);
                Sent::Answered(Answered {
                    response,
                    slot,
                    sent,
                })
            }
            Err(ForwardError::Connect(error)) => {
                connect_failed(target, &error, sent, policy);
                if let Some(slot) = slot {
                    slot.abandon();
                }
                Sent::Unreachable(error)
            }
            Err(failure) => {
                if let Some(slot) = slot {
                    give_back(slot, &failure, target.cancel_grace);
                }
                Sent::Failed(Error::forwarding(
                    failure,
                    &target.upstream.name,
                    &routed.route.model,
                ))
            }
        }
    }

    /// Sends a request that takes no slot to `upstream` as the client sent it (`parts`, and
    /// `body` read already): the dialects' own endpoints.
    pub(crate) async fn pass(
        &self,
        upstream: &UpstreamState,
        client_keys: bool,
        parts: &http::request::Parts,
        body: Bytes,
        request_id: &HeaderValue,
    ) -> Result<Response<Incoming>, ForwardError> {
        self.forwarder
            .send(
                destination(upstream),
                authorization(upstream, client_keys),
                parts,
                body,
                request_id,
            )
            .await
    }
}

fn destination(upstream: &UpstreamState) -> Destination<'_> {
    Destination {
        client: &upstream.client,
        base: &upstream.base,
    }
}

/// What the upstream request carries as `Authorization` (see [`Authorization`]): with client
/// keys on, the client's `Authorization` is its key to this gateway.
fn authorization(upstream: &UpstreamState, client_keys: bool) -> Authorization<'_> {
    match &upstream.authorization {
        Some(key) => Authorization::Upstream(key),
        None if client_keys => Authorization::Withheld,
        None => Authorization::Client,
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

/// Gives `slot` back after a forward that failed after connecting (the request may have run).
fn give_back(slot: Slot, failure: &ForwardError, cancel_grace: Duration) {
    match failure {
        // The engine may still be winding the request down.
        ForwardError::Timeout(_) => slot.timed_out(cancel_grace),
        // Counted as an upstream error. After a failed TLS handshake nothing reached the
        // engine: the slot is free at once.
        ForwardError::Failed(_) | ForwardError::Tls(_) => slot.fail(),
        // The gateway's own failure (or a connect error not handled as one): no hold recorded.
        ForwardError::Build(_) | ForwardError::Connect(_) => slot.abandon(),
    }
}
