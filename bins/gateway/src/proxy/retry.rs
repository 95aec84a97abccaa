//! Step 9, retry: the candidate loop's state ([`Tries`]) — which target comes next, what each
//! target that did not end the request left behind, and what the request ends with when no
//! target took it.
//!
//! A target is passed over when its queue is full, when the request needs more slots than it
//! has, when its connection is refused (nothing was sent), and when its engine answers 502, 503
//! or 504 while `engine_error_retries` allows another try ([`Tries::retry`]): that answer is
//! kept unread ([`HeldAnswer`]) and passed through after all if no later target gets the
//! request. Every other outcome ends the request at that target.
//!
//! When every target was passed over, the most useful refusal wins ([`Tries::exhausted`]): an
//! engine's own answer, then a full queue (it carries an estimate), then "too heavy" (when that
//! was the only reason), then "unavailable".

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, Response, StatusCode};
use tracing::info;

use crate::proxy::access::Access;
use crate::proxy::admit::Slot;
use crate::proxy::answer::Streamed;
use crate::proxy::choose::Routed;
use crate::proxy::problems::{Error, Unavailable};
use crate::support::error::BoxError;
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;

/// The candidate loop of one request.
#[derive(Debug)]
pub(crate) struct Tries<'r> {
    /// The targets not tried yet, best first.
    candidates: std::vec::IntoIter<&'r Arc<Target>>,
    /// Engine error answers that may still go on to the next target.
    retries_left: usize,
    /// The best-ranked upstream whose queue was full, the soonest a retry may find room, and
    /// how many other upstreams were full too.
    full_on: Option<(&'r str, Duration, usize)>,
    /// The first upstream with fewer slots than the request needs: (name, weight, parallel).
    too_heavy: Option<(&'r str, usize, usize)>,
    /// The last refused connection.
    unreachable: Option<BoxError>,
    /// An engine's 502/503/504 that was not passed through, to try the next target.
    held: Option<HeldAnswer>,
}

impl<'r> Tries<'r> {
    /// The loop over `candidates`, best first, with `retries` engine error answers that may go
    /// on to the next target (`engine_error_retries`).
    pub(crate) fn new(candidates: Vec<&'r Arc<Target>>, retries: usize) -> Self {
        Self {
            candidates: candidates.into_iter(),
            retries_left: retries,
            full_on: None,
            too_heavy: None,
            unreachable: None,
            held: None,
        }
    }

    /// How many targets are left to try.
    pub(crate) fn left(&self) -> usize {
        self.candidates.len()
    }

    /// The next target to try.
    pub(crate) fn next_target(&mut self) -> Option<&'r Arc<Target>> {
        self.candidates.next()
    }

    /// `target`'s queue was full; a retry may find room after `retry_after`.
    pub(crate) fn full(&mut self, target: &'r Target, retry_after: Duration) {
        self.full_on = Some(match self.full_on {
            // Name the best-ranked upstream; retry when the soonest may have room.
            Some((first, earlier, others)) => (first, earlier.min(retry_after), others + 1),
            None => (target.upstream.name.as_str(), retry_after, 0),
        });
    }

    /// `target` has fewer slots (`parallel`) than the request needs (`weight`): never servable
    /// there; another upstream may have more.
    pub(crate) fn too_heavy(&mut self, target: &'r Target, weight: usize, parallel: usize) {
        self.too_heavy
            .get_or_insert((target.upstream.name.as_str(), weight, parallel));
    }

    /// A target refused the connection: nothing was sent, the next one may be tried.
    pub(crate) fn unreachable(&mut self, error: BoxError) {
        self.unreachable = Some(error);
    }

    /// Whether an engine's answer of `status` goes on to the next target: a 502, 503 or 504
    /// while `engine_error_retries` allows and a target is left. Counts the retry when so.
    pub(crate) fn retry(&mut self, status: StatusCode) -> bool {
        let retry = self.retries_left > 0 && self.left() > 0 && is_retried(status);
        if retry {
            self.retries_left -= 1;
        }
        retry
    }

    /// Keeps `answer`, not passed through, while the next target is tried; it replaces any
    /// answer held before (which is dropped unread, its connection closed).
    pub(crate) fn hold(&mut self, answer: HeldAnswer) {
        self.held = Some(answer);
    }

    /// The request ends at a target that refused it other than by a full queue or too few
    /// slots, with the error `refusal` makes; but an engine's answer held for a retry that
    /// found no room is passed through instead.
    pub(crate) fn ended(
        &mut self,
        refusal: impl FnOnce() -> Error,
        access: &Access,
    ) -> Result<Response<Streamed>, Error> {
        match self.held.take() {
            Some(held) => Ok(held.sent(access)),
            None => Err(refusal()),
        }
    }

    /// What the request ends with when no target took it.
    pub(crate) fn exhausted(self, routed: &Routed) -> Result<Response<Streamed>, Error> {
        let access = &routed.access;
        let route = &routed.route;
        let model = route.model.as_str();
        // An engine's answer is passed through as it came: the request reached an engine,
        // which said why it did not run it.
        if let Some(held) = self.held {
            return Ok(held.sent(access));
        }
        // A full queue says more (with an estimate) than a refused connection, so it wins when
        // both happened.
        if let Some((upstream, retry_after, also_full)) = self.full_on {
            return Err(Error::QueueFull {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                retry_after,
                also_full,
            });
        }
        // Too heavy for every upstream that was tried, and none failed otherwise: no retry can
        // help, the client must ask for fewer sequences.
        if let (Some((upstream, weight, parallel)), None) = (self.too_heavy, &self.unreachable) {
            return Err(Error::TooHeavy {
                upstream: upstream.to_owned(),
                model: model.to_owned(),
                weight,
                parallel,
            });
        }
        let why = match self.unreachable {
            Some(_) => Unavailable::Unreachable,
            None => Unavailable::Down,
        };
        Err(Error::UpstreamUnavailable {
            model: model.to_owned(),
            retry_after: routed.generation.config.server.health_check_interval,
            why,
            // A refused connection, else what keeps healthy upstreams out (an unknown
            // `parallel = "auto"` slot count).
            source: self
                .unreachable
                .or_else(|| route.unavailable_reason().map(Into::into)),
        })
    }
}

/// An engine's answer held while the request is retried elsewhere.
#[derive(Debug)]
pub(crate) struct HeldAnswer {
    answer: Response<Streamed>,
    /// The upstream that gave it, and how long the request waited for its slot there.
    upstream: Arc<UpstreamState>,
    waited: Duration,
}

impl HeldAnswer {
    /// `answer`, from `target`'s upstream after a queue wait of `waited`.
    pub(crate) fn new(answer: Response<Streamed>, target: &Target, waited: Duration) -> Self {
        Self {
            answer,
            upstream: Arc::clone(&target.upstream),
            waited,
        }
    }

    /// The answer, sent to the client after all: the access log names its engine again (a later
    /// try replaced it).
    fn sent(self, access: &Access) -> Response<Streamed> {
        access.upstream(&self.upstream);
        access.queue_wait(self.waited);
        self.answer
    }
}

/// Whether an engine's answer of `status` may go on to the next host (within
/// `engine_error_retries`): a 502, 503 or 504, which says the request did not run there, or
/// did not finish. Any other status, 4xx and 500 included, is the answer.
fn is_retried(status: StatusCode) -> bool {
    matches!(
        status,
        StatusCode::BAD_GATEWAY | StatusCode::SERVICE_UNAVAILABLE | StatusCode::GATEWAY_TIMEOUT
    )
}

/// Gives up `target`'s answer of `status` (a 502, 503 or 504) to try the next host: the
/// retry is counted and logged, and the slot, if the endpoint took one, is given back.
///
/// Whether the engine still runs the request decides when the slot goes back. A 503 is the
/// engine's own refusal (loading, or its queue full): it never ran it, so the slot is free
/// at once. A 502 or 504 comes from a proxy in front of the engine (`KServe`'s, an ingress)
/// that lost patience or its connection: the engine behind it may still be winding the
/// request down, so the slot is kept for `cancel_grace`, as after a first-byte timeout.
/// Both count as an upstream error of the target.
pub(crate) fn retrying(
    target: &Target,
    status: StatusCode,
    slot: Option<Slot>,
    request_id: &HeaderValue,
) {
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

#[cfg(test)]
mod tests;
