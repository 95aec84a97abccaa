//! Step 7: send the request to the chosen upstream through its connection pool.
//!
//! - Each upstream's [`Pool`] (in its [`state`](crate::upstreams::state), built with its TLS
//!   settings) keeps connections alive and reuses them, so a request pays no connect or TLS
//!   handshake on the hot path.
//! - TCP keepalive on upstream sockets (`tcp_keepalive`, set on each upstream's connector).
//! - A connect timeout (the pool's, over the TCP connect and the TLS handshake) and a
//!   first-byte timeout (around the wait for the response head). The answer itself may stream
//!   for as long as the engine generates: there is deliberately no total timeout here.
//! - Hop-by-hop headers (RFC 9110 §7.6.1: `Connection` and the fields it names, `Keep-Alive`,
//!   `TE`, `Transfer-Encoding`, `Upgrade`, `Proxy-*`) are stripped both ways; `Host` is set from
//!   the upstream's URL, and the upstream's `api_key`, when it has one, replaces the client's
//!   `Authorization`.
//! - The client's credentials go upstream only when the gateway passes its `Authorization`
//!   through ([`Authorization::Client`]). Otherwise every field a client may carry an API key
//!   in ([`CREDENTIALS`]: `Authorization`, Anthropic's `x-api-key`, Azure's `api-key`,
//!   `openai-api-key`) is left out, so a key to this gateway never reaches an engine, whichever
//!   field an SDK put it in.
//! - `x-request-id` is propagated: the caller passes the id it accepted or generated, and it goes
//!   upstream and back to the client.
//! - The upstream URL's path prefix is kept (`http://host/openai` + `/v1/chat/completions` →
//!   `http://host/openai/v1/chat/completions`, as the `huggingfaceserver` of `KServe` expects).
//!
//! Errors are classified here, for [`problems`](crate::proxy::problems) to map: a connect failure means no
//! byte reached the upstream, so the request may safely go to another host; a failed TLS
//! handshake is told apart from it (it is a configuration or certificate problem, which another
//! try does not fix); anything after that may not be retried.

use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;

use crate::support::base::Base;
use crate::support::error::BoxError;
use crate::support::request_id::REQUEST_ID;
use crate::tls;
use crate::upstreams::pool::{Pool, PoolError};

/// What the upstream request carries as `Authorization`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Authorization<'a> {
    /// The client's own credential fields, if any: the gateway does not check client keys, so
    /// what the client sent is meant for the engine.
    Client,
    /// None: the client's credential fields ([`CREDENTIALS`]) hold its key to this gateway,
    /// which is not the engine's business and must not leak to it.
    Withheld,
    /// The upstream's own key (`api_key`) as `Authorization`, in place of whatever credentials
    /// the client sent ([`CREDENTIALS`]).
    Upstream(&'a HeaderValue),
}

/// Sends requests upstream under the first-byte timeout.
#[derive(Debug, Clone)]
pub(crate) struct Forwarder {
    /// How long the upstream may take to send its response head once the request is sent.
    first_byte_timeout: Duration,
}

/// Where a request goes: the upstream's connection pool and its URL.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Destination<'a> {
    /// The upstream's connections (with its TLS settings).
    pub(crate) client: &'a Pool,
    /// Scheme, authority and path prefix.
    pub(crate) base: &'a Base,
}

impl Forwarder {
    /// A forwarder that waits at most `first_byte_timeout` for a response head.
    pub(crate) fn new(first_byte_timeout: Duration) -> Self {
        Self { first_byte_timeout }
    }

    /// Sends a request to `destination` and waits for the response head.
    ///
    /// `parts` are the client's method, URI and headers (hop-by-hop ones are not forwarded);
    /// `authorization` says what becomes of the client's `Authorization`; `request_id` goes out
    /// as `x-request-id` and comes back on the response.
    pub(crate) async fn send(
        &self,
        destination: Destination<'_>,
        authorization: Authorization<'_>,
        parts: &http::request::Parts,
        body: Bytes,
        request_id: &HeaderValue,
    ) -> Result<Response<Incoming>, ForwardError> {
        let uri = destination
            .base
            .origin_for(parts.uri.path_and_query())
            .map_err(ForwardError::Build)?;
        let mut req = Request::builder()
            .method(parts.method.clone())
            .uri(uri)
            .body(Full::new(body))
            .map_err(ForwardError::Build)?;
        let headers = req.headers_mut();
        let keep_credentials = matches!(authorization, Authorization::Client);
        // Left out while copying rather than removed after (a removal is a hash and a probe):
        // the pool sets `Host` for the upstream, and hyper `Content-Length` from the body
        // (which may have been rewritten for an alias); the whole body has been read already,
        // so there is nothing left to wait for a `100 Continue` about; the client's
        // credentials go only where the upstream has no key of its own and the gateway does
        // not withhold them; `x-request-id` is set below.
        copy_end_to_end(&parts.headers, headers, |name| {
            name == header::HOST
                || name == header::CONTENT_LENGTH
                || name == header::EXPECT
                || (!keep_credentials && CREDENTIALS.contains(name))
                || name == REQUEST_ID
        });
        if let Authorization::Upstream(key) = authorization {
            headers.insert(header::AUTHORIZATION, key.clone());
        }
        headers.insert(REQUEST_ID, request_id.clone());

        let sent = tokio::time::timeout(self.first_byte_timeout, destination.client.send(req));
        let response = match sent.await {
            Err(_elapsed) => return Err(ForwardError::Timeout(self.first_byte_timeout)),
            // Told apart from a refused connection even after connecting: with TLS 1.3 a
            // server refuses a client certificate only after the client's handshake ended.
            Ok(Err(error)) if tls::is_tls_failure(&error) => {
                return Err(ForwardError::Tls(Box::new(error)));
            }
            Ok(Err(error @ (PoolError::Connect(_) | PoolError::ConnectTimeout(_)))) => {
                return Err(ForwardError::Connect(Box::new(error)));
            }
            Ok(Err(error @ PoolError::Exchange(_))) => {
                return Err(ForwardError::Failed(Box::new(error)));
            }
            Ok(Ok(response)) => response,
        };
        let (mut head, body) = response.into_parts();
        // Room for `x-request-id` here and the two `x-slotgate-*` fields the request path adds
        // (`service::mark_routed`): hyper parsed the head into a map of its own size.
        head.headers = end_to_end(std::mem::take(&mut head.headers), 3);
        head.headers.insert(REQUEST_ID, request_id.clone());
        Ok(Response::from_parts(head, body))
    }
}

/// Why [`Forwarder::send`] got no response head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ForwardError {
    /// The connection could not be made: nothing was sent, another host may be tried.
    #[error("connect failed")]
    Connect(#[source] BoxError),
    /// The TLS handshake failed (a certificate that does not verify, a client certificate the
    /// upstream refused, a peer that does not speak TLS): nothing was sent.
    #[error("TLS handshake failed")]
    Tls(#[source] BoxError),
    /// No response head within the first-byte timeout; the upstream may have run the request.
    #[error("no response within {0:?}")]
    Timeout(Duration),
    /// The exchange failed after the request was (maybe partly) sent.
    #[error("the exchange failed")]
    Failed(#[source] BoxError),
    /// The upstream request (its URI or head) could not even be built: a bug, since the parts
    /// were checked on the way in.
    #[error("building the upstream request")]
    Build(#[source] http::Error),
}

/// The request fields a client may carry an API key in: `Authorization` (`Bearer`, the
/// OpenAI SDKs), `x-api-key` (the Anthropic SDKs), `api-key` (Azure OpenAI) and
/// `openai-api-key`. Left out of a forwarded request whenever the client's `Authorization` is
/// (see [`Authorization`]). `Proxy-Authorization` is hop-by-hop and never forwarded.
pub(crate) static CREDENTIALS: [HeaderName; 4] = [
    header::AUTHORIZATION,
    HeaderName::from_static("x-api-key"),
    HeaderName::from_static("api-key"),
    HeaderName::from_static("openai-api-key"),
];

/// The fields RFC 9110 §7.6.1 (and the `Proxy-*` / `Keep-Alive` conventions it cites) makes
/// hop-by-hop: they describe one connection and must not be forwarded. A `static`, not a
/// `const`: a `const` array would be built and dropped at every use, for every field.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `name` is hop-by-hop in itself (fields named in `Connection` are hop-by-hop too, but
/// only for the message that names them). `Trailer` only announces trailers of this hop's
/// chunked coding, so it does not cross either.
fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name == header::TRAILER
}

/// The field names listed in `headers`' `Connection` fields, but `keep-alive`: that one is
/// hop-by-hop anyway, and the usual `Connection: keep-alive` then costs no name to be made.
fn connection_listed(headers: &HeaderMap) -> impl Iterator<Item = HeaderName> + '_ {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .flat_map(|value| value.as_bytes().split(|&byte| byte == b','))
        .map(<[u8]>::trim_ascii)
        .filter(|name| !name.eq_ignore_ascii_case(b"keep-alive"))
        .filter_map(|name| HeaderName::from_bytes(name).ok())
}

/// Copies the end-to-end fields of `from` into `to`, except those `skip` says (the fields the
/// forwarder sets itself).
///
/// Hop-by-hop fields are skipped while copying rather than removed afterwards: comparing a
/// name with the short list costs less than a removal (a hash and a probe) per listed name, on
/// every request.
fn copy_end_to_end(from: &HeaderMap, to: &mut HeaderMap, skip: impl Fn(&HeaderName) -> bool) {
    // Room for the two the forwarder may add (`Authorization`, `x-request-id`).
    to.reserve(from.len() + 2);
    for (name, value) in from {
        if !is_hop_by_hop(name) && !skip(name) {
            to.append(name.clone(), value.clone());
        }
    }
    for name in connection_listed(from) {
        to.remove(name);
    }
}

/// The end-to-end fields of `from` (without the hop-by-hop ones, and those named in
/// `Connection`), moved into a new map with room for `room` more, in their order, repeated
/// fields with every value.
///
/// One pass that moves each field, in place of removals (a hash and a probe each, and a
/// `Connection: keep-alive` on most answers) and of the growth of a map that the parser made
/// just large enough for the engine's fields, when the gateway adds its own.
pub(crate) fn end_to_end(from: HeaderMap, room: usize) -> HeaderMap {
    let listed: Vec<HeaderName> = if from.contains_key(header::CONNECTION) {
        connection_listed(&from).collect()
    } else {
        Vec::new()
    };
    let mut to = HeaderMap::with_capacity(from.len() + room);
    let mut current: Option<(HeaderName, bool)> = None;
    for (name, value) in from {
        // `None`: another value of the field before it.
        if let Some(name) = name {
            let keep = !is_hop_by_hop(&name) && !listed.contains(&name);
            current = Some((name, keep));
        }
        if let Some((name, true)) = &current {
            to.append(name, value);
        }
    }
    to
}

#[cfg(test)]
mod tests;
