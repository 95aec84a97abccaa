//! What an [`Error`] means for the books, derived from the error alone: its word in
//! `slotgate_rejections_total{reason}` and the access log, whether it was a refusal at all, how
//! the access log says the request ended, and whether it is a fault worth a warning. [`record`]
//! counts it and notes it in the access log, once per failed request.

use crate::metrics::Metrics;
use crate::proxy::access::{Access, Outcome};
use crate::proxy::problems::error::{Error, Unavailable};
use crate::proxy::route::Routes;

impl Error {
    /// The word for this error in `slotgate_rejections_total{reason}` and the access log's
    /// `reason`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Error::NotFound { .. } => "not_found",
            Error::MethodNotAllowed { .. } => "method_not_allowed",
            Error::ModelNotFound { .. } => "model_not_found",
            Error::RouteNotServed { .. } => "route_not_served",
            Error::RouteDisabled { .. } => "route_disabled",
            Error::ResponseNotFound { .. } => "response_not_found",
            Error::ResponseUpstreamUnavailable { .. } => "response_upstream_unavailable",
            Error::BadRequest(_) | Error::BodyRead(_) => "bad_request",
            Error::BodyIncomplete(_) => "client_gone",
            Error::BodyTooLarge { .. } => "body_too_large",
            Error::HeadersTooLarge { .. } => "headers_too_large",
            Error::BodyTimeout { .. } => "body_timeout",
            Error::UnsupportedMediaType { .. } => "unsupported_media_type",
            Error::TooHeavy { .. } => "too_heavy",
            Error::Unauthorized => "unauthorized",
            Error::QueueFull { .. } => "queue_full",
            Error::QueueTimeout { .. } => "queue_timeout",
            Error::StoreUnavailable { .. } => "store_unavailable",
            Error::Overloaded { .. } => "overloaded",
            Error::UpstreamUnavailable {
                why: Unavailable::Down,
                ..
            } => "model_unavailable",
            Error::UpstreamUnavailable {
                why: Unavailable::Unreachable,
                ..
            }
            | Error::NoOllamaUpstream { .. } => "upstream_unavailable",
            Error::UpstreamFailed { .. } => "upstream_failed",
            Error::UpstreamTls { .. } => "upstream_tls",
            Error::UpstreamTimeout { .. } => "upstream_timeout",
            Error::ShuttingDown { .. } => "shutting_down",
            Error::Internal { .. } => "internal",
        }
    }

    /// Whether the client left before the request was whole (the access log's `client_gone`,
    /// not a refusal): its body ended early.
    pub(crate) fn client_left(&self) -> bool {
        matches!(self, Error::BodyIncomplete(_))
    }

    /// Whether the engine gave no usable answer (counted as an `upstream_error` outcome, not as
    /// a refusal).
    pub(crate) fn is_upstream_failure(&self) -> bool {
        matches!(
            self,
            Error::UpstreamFailed { .. }
                | Error::UpstreamTls { .. }
                | Error::UpstreamTimeout { .. }
        )
    }

    /// The refusal to count in `slotgate_rejections_total` when the request ends with this
    /// error: (the configured model, or `""`, and the reason). `None` when nobody refused it:
    /// the client left, or the engine gave no usable answer (counted by the slot as an
    /// `upstream_error` outcome).
    pub(crate) fn rejection(&self) -> Option<(&str, &'static str)> {
        let model = match self {
            Error::BodyIncomplete(_) => return None,
            _ if self.is_upstream_failure() => return None,
            // Configured names (a client's unknown name never becomes a label).
            Error::RouteNotServed { model, .. }
            | Error::RouteDisabled { model, .. }
            | Error::TooHeavy { model, .. }
            | Error::QueueFull { model, .. }
            | Error::QueueTimeout { model, .. }
            | Error::StoreUnavailable { model, .. }
            | Error::UpstreamUnavailable { model, .. } => model.as_str(),
            _ => "",
        };
        Some((model, self.reason()))
    }

    /// How the access log says a request that ends with this error ended.
    pub(crate) fn outcome(&self) -> Outcome {
        if self.is_upstream_failure() {
            Outcome::UpstreamError
        } else if self.client_left() {
            Outcome::ClientGone
        } else {
            Outcome::Refused
        }
    }

    /// Whether the gateway or an upstream is at fault (worth a warning in the log), rather than
    /// the client or plain load.
    pub(super) fn is_fault(&self) -> bool {
        matches!(
            self,
            Error::UpstreamUnavailable { .. }
                | Error::NoOllamaUpstream { .. }
                | Error::UpstreamFailed { .. }
                | Error::UpstreamTls { .. }
                | Error::UpstreamTimeout { .. }
                | Error::Internal { .. }
        )
    }
}

/// Everything a request that ends with `error` leaves behind but its document, derived from the
/// error here and nowhere else: the refusal counted in `slotgate_rejections_total` (through
/// the model's pre-resolved counter in `routes` when it has one, so no label is hashed), and
/// the access log's outcome and reason. The document is [`respond`](super::respond)'s, or the
/// last event of a stream that already began.
pub(crate) fn record(error: &Error, routes: &Routes, metrics: &Metrics, access: &Access) {
    if let Some((model, reason)) = error.rejection() {
        let counted = routes
            .resolve(model)
            .is_some_and(|route| route.model == model && route.rejections.count(reason));
        if !counted {
            metrics.refused(model, reason);
        }
    }
    let outcome = error.outcome();
    // A client that left was not refused: no reason.
    let reason = (outcome != Outcome::ClientGone).then(|| error.reason());
    access.failed(outcome, reason);
}
