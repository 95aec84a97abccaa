//! Why a request got no slot on a target ([`Refused`]), and the [`Error`] each refusal becomes
//! ([`Refused::into_error`]): the one conversion from the admission step into the request
//! path's classification.

use std::time::Duration;

use slotgate_limiter::Ticket;

use crate::proxy::client::{Limit, Wait};
use crate::proxy::problems::{Deadline, Error, Unavailable};
use crate::upstreams::target::Target;

/// Why no slot was had on a target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refused {
    /// The queue was full: try elsewhere.
    Full,
    /// The request needs more slots than the target has at all: try elsewhere, and if no
    /// target can ever take it, the client must ask for less.
    TooHeavy {
        /// The slots asked for.
        weight: usize,
        /// The target's `parallel`.
        parallel: usize,
    },
    /// Waited until the end of `wait` without a slot.
    Timeout {
        /// How long it waited in the queue.
        waited: Duration,
        /// The wait that ended, and which bound set it.
        wait: Wait,
    },
    /// Not queued: the wait expected from recent hold times is longer than what is left of the
    /// client's deadline.
    Hopeless {
        /// The expected wait.
        expected: Duration,
        /// The client's deadline.
        wait: Wait,
    },
    /// The key was removed while waiting (a reload removed the model from the upstream).
    Closed,
    /// The gateway started shutting down while the request waited: only requests already
    /// running get the drain grace period.
    ShuttingDown,
    /// Under `[cluster]`: the shared slot store cannot be reached and the policy is
    /// `fail-closed`. Every target shares the store, so no other target can help.
    StoreUnavailable {
        /// The store's next probe.
        retry_after: Duration,
    },
}

/// The `Retry-After` of refusals that have no estimate of their own.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fallback {
    /// While shutting down: when a restart is likely done.
    pub(crate) shutting_down: Duration,
    /// When no upstream can take the model: the next health check.
    pub(crate) unavailable: Duration,
}

impl Refused {
    /// The error for a request refused on `target` (for `ticket`, a request for `model`):
    /// every refusal of the admission step becomes its [`Error`] here.
    pub(crate) fn into_error(
        self,
        target: &Target,
        ticket: &Ticket,
        model: &str,
        fallback: Fallback,
    ) -> Error {
        let upstream = target.upstream.name.clone();
        let model = model.to_owned();
        match self {
            Refused::ShuttingDown => Error::ShuttingDown {
                retry_after: fallback.shutting_down,
            },
            // A reload removed this model from this upstream while the request waited.
            Refused::Closed => {
                let why = format!(
                    "model {model:?} was removed from upstream {upstream} by a configuration \
                     reload while the request waited"
                );
                Error::UpstreamUnavailable {
                    model,
                    retry_after: fallback.unavailable,
                    why: Unavailable::Down,
                    source: Some(why.into()),
                }
            }
            Refused::Full => Error::QueueFull {
                upstream,
                model,
                retry_after: target.retry_after_for(ticket),
                also_full: 0,
            },
            Refused::TooHeavy { weight, parallel } => Error::TooHeavy {
                upstream,
                model,
                weight,
                parallel,
            },
            Refused::Timeout { waited, wait } => Error::QueueTimeout {
                upstream,
                model,
                waited,
                retry_after: target.retry_after_for(ticket),
                deadline: client_deadline(wait, None),
            },
            Refused::StoreUnavailable { retry_after } => {
                Error::StoreUnavailable { model, retry_after }
            }
            Refused::Hopeless { expected, wait } => Error::QueueTimeout {
                upstream,
                model,
                waited: Duration::ZERO,
                retry_after: target.retry_after_for(ticket),
                deadline: client_deadline(wait, Some(expected)),
            },
        }
    }
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
