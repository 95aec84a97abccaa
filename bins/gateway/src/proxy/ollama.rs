//! The Ollama listings the gateway answers itself, from the routing table: `GET /api/tags` and
//! `GET /api/ps`.
//!
//! A client in Ollama mode (Open `WebUI`, the `ollama` Python client) lists models before using
//! them. With several Ollama upstreams behind the gateway, no single engine's list is the
//! gateway's, so the answer is built here: the names a client may send to `/api/chat` now, that
//! is every model or alias with a healthy, undrained `kind = "ollama"` upstream. Sizes, digests
//! and dates are the engine's business and are not known here; they are left out, which the
//! Ollama clients accept (every member of their list entry is optional).
//!
//! `GET /api/version` is the engine's version, so it is passed to an Ollama upstream instead
//! ([`version`]).
//!
//! `GET /` and `HEAD /` answer as Ollama's heartbeat (`200 Ollama is running`, what the `ollama`
//! CLI's `Heartbeat` asks before every command) when some upstream is `kind = "ollama"`: the
//! gateway then stands for an Ollama server. Like Ollama's, the heartbeat needs no key; it
//! tells nothing but that the gateway is up. Without an Ollama upstream, `/` is a 404.

use http::{HeaderValue, Request, Response};
use slotgate_config::Kind;

use crate::proxy::answer::{Streamed, passed_through};
use crate::proxy::forward::ForwardError;
use crate::proxy::live::Generation;
use crate::proxy::problems::Error;
use crate::proxy::route::{Route, Routes};
use crate::proxy::send::Sender;
use crate::support::error::BoxError;
use crate::upstreams::state::Upstreams;

/// The path of Ollama's version endpoint, passed through to an Ollama upstream.
pub(crate) const VERSION: &str = "/api/version";

/// The heartbeat's path.
pub(crate) const HEARTBEAT_PATH: &str = "/";

/// The heartbeat's answer: `200 Ollama is running`, Ollama's own words (server/routes.go).
pub(crate) fn heartbeat() -> Response<http_body_util::Full<bytes::Bytes>> {
    let mut response = Response::new(http_body_util::Full::new(bytes::Bytes::from_static(
        b"Ollama is running",
    )));
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// Whether `GET /` answers as Ollama's heartbeat: some configured upstream is an Ollama.
pub(crate) fn answers_heartbeat(upstreams: &Upstreams) -> bool {
    upstreams
        .iter()
        .any(|upstream| upstream.kind == Kind::Ollama)
}

/// Which listing a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listing {
    /// `GET /api/tags`: the models a client may use.
    Tags,
    /// `GET /api/ps`: the models loaded in memory now.
    Running,
}

impl Listing {
    /// The listing at `path`, if it is one.
    pub(crate) fn find(path: &str) -> Option<Self> {
        match path {
            "/api/tags" => Some(Self::Tags),
            "/api/ps" => Some(Self::Running),
            _ => None,
        }
    }
}

/// The JSON document for `listing`: `{"models": [{"name", "model"}, …]}`, in name order.
pub(crate) fn list(routes: &Routes, listing: Listing) -> String {
    let models: Vec<serde_json::Value> = routes
        .names()
        .iter()
        .filter(|name| {
            routes
                .resolve(name)
                .is_some_and(|route| is_listed(route, listing))
        })
        .map(|name| serde_json::json!({ "name": name, "model": name }))
        .collect();
    serde_json::json!({ "models": models }).to_string()
}

/// Whether some available Ollama upstream serves `route` (and, for [`Listing::Running`], has
/// the model loaded as last discovered).
fn is_listed(route: &Route, listing: Listing) -> bool {
    route.targets.iter().any(|target| {
        target.upstream.kind == Kind::Ollama
            && target.upstream.is_available()
            && (listing == Listing::Tags || target.is_loaded())
    })
}

/// `GET /api/version`: passed to the first available Ollama upstream (the version is the
/// engine's, not the gateway's), without a slot; on to the next one when it refuses the
/// connection.
pub(crate) async fn version<B>(
    req: Request<B>,
    generation: &Generation,
    request_id: &HeaderValue,
    sender: &Sender,
) -> Result<Response<Streamed>, Error> {
    let client_keys = generation.api_keys.is_enabled();
    let (parts, _) = req.into_parts();
    let mut connect_error: Option<BoxError> = None;
    let ollamas = generation
        .upstreams
        .iter()
        .filter(|u| u.kind == Kind::Ollama && u.is_available());
    for upstream in ollamas {
        let sent = sender.pass(
            upstream,
            client_keys,
            &parts,
            bytes::Bytes::new(),
            request_id,
        );
        match sent.await {
            Ok(response) => return Ok(passed_through(response)),
            Err(ForwardError::Connect(error)) => connect_error = Some(error),
            Err(failure) => return Err(Error::forwarding(failure, &upstream.name, "")),
        }
    }
    Err(Error::NoOllamaUpstream {
        retry_after: generation.config.server.health_check_interval,
        source: connect_error.unwrap_or_else(|| "no Ollama upstream is available".into()),
    })
}

#[cfg(test)]
mod tests {
    use super::Listing;

    #[test]
    fn only_tags_and_ps_are_listings() {
        assert_eq!(Listing::find("/api/tags"), Some(Listing::Tags));
        assert_eq!(Listing::find("/api/ps"), Some(Listing::Running));
        assert_eq!(Listing::find("/api/version"), None);
        assert_eq!(Listing::find("/api/chat"), None);
    }
}
