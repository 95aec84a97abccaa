//! The Responses API's own rules: a follow-up goes to the upstream that holds its conversation
//! ([`FollowUp`], a [`Steer`] of step 4), and the endpoints addressed by a response's id go
//! there too ([`by_id`]), without a slot.
//!
//! Which upstream holds which id is recorded as answers pass through
//! ([`affinity`](crate::proxy::affinity)).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response};
use http_body::Body;

use crate::proxy::affinity::ResponseAffinity;
use crate::proxy::answer::{Streamed, mark_state, passed_through};
use crate::proxy::choose::{Routed, Steer};
use crate::proxy::forward::ForwardError;
use crate::proxy::live::Generation;
use crate::proxy::problems::{Error, GET_ONLY, POST_ONLY};
use crate::proxy::request::{self, BodyBudget};
use crate::proxy::send::Sender;
use crate::support::error::BoxError;
use crate::upstreams::state::UpstreamState;
use crate::upstreams::target::Target;

/// The prefix of the endpoints addressed by a response's id.
pub(crate) const BY_ID: &str = "/v1/responses/";

/// `GET` and `DELETE`, for a stored response.
const GET_OR_DELETE: &[Method] = &[Method::GET, Method::HEAD, Method::DELETE];

/// The id and the methods of an endpoint under [`BY_ID`] (`rest` is the path after it):
/// `{id}`, `{id}/cancel`, `{id}/input_items`; `None` for anything else.
pub(crate) fn find(rest: &str) -> Option<(&str, &'static [Method])> {
    match rest.split_once('/') {
        None => Some((rest, GET_OR_DELETE)),
        Some((id, "cancel")) => Some((id, POST_ONLY)),
        Some((id, "input_items")) => Some((id, GET_ONLY)),
        Some(_) => None,
    }
}

/// Step 4's steer for a Responses follow-up (`previous_response_id`): only the upstream that
/// holds the conversation may take it, and if it cannot now, nobody can.
#[derive(Debug)]
pub(crate) struct FollowUp {
    affinity: Arc<dyn ResponseAffinity>,
}

impl FollowUp {
    /// Follow-ups steered by what `affinity` recorded.
    pub(crate) fn new(affinity: Arc<dyn ResponseAffinity>) -> Self {
        Self { affinity }
    }
}

impl Steer for FollowUp {
    fn steer(&self, routed: &Routed, ranked: &mut Vec<&Arc<Target>>) -> Result<(), Error> {
        if !routed.endpoint.is_responses() {
            return Ok(());
        }
        let Some(id) = &routed.api.previous_response_id else {
            return Ok(());
        };
        let holder = holder(&*self.affinity, id, &routed.generation, false)?;
        ranked.retain(|target| target.upstream.name == holder.name);
        if ranked.is_empty() {
            return Err(Error::ResponseUpstreamUnavailable {
                id: id.clone(),
                upstream: holder.name.clone(),
                retry_after: routed.generation.config.server.health_check_interval,
            });
        }
        Ok(())
    }
}

/// The upstream recorded for response `id`, if it exists in this configuration; `in_path` when
/// the id came in the path rather than as `previous_response_id`.
fn holder<'g>(
    affinity: &dyn ResponseAffinity,
    id: &str,
    generation: &'g Generation,
    in_path: bool,
) -> Result<&'g Arc<UpstreamState>, Error> {
    let not_found = || Error::ResponseNotFound {
        id: id.chars().take(200).collect(),
        in_path,
    };
    let name = affinity.lookup(id).ok_or_else(not_found)?;
    // Removed by a reload: as gone as a deleted response.
    generation.upstreams.get(&name).ok_or_else(not_found)
}

/// `GET`/`DELETE /v1/responses/{id}`, `POST /v1/responses/{id}/cancel`, `GET
/// /v1/responses/{id}/input_items`: to the upstream that made the response, without a slot.
/// A deleted response is forgotten.
pub(crate) async fn by_id<B>(
    req: Request<B>,
    id: &str,
    generation: &Generation,
    request_id: &HeaderValue,
    (affinity, sender, budget): (&dyn ResponseAffinity, &Sender, &BodyBudget),
) -> Result<Response<Streamed>, Error>
where
    B: Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    let server = &generation.config.server;
    let upstream = holder(affinity, id, generation, true)?;
    let unavailable = || Error::ResponseUpstreamUnavailable {
        id: id.to_owned(),
        upstream: upstream.name.clone(),
        retry_after: server.health_check_interval,
    };
    if !upstream.is_available() {
        return Err(unavailable());
    }
    let deleting = req.method() == Method::DELETE;
    let (parts, body) = req.into_parts();
    let limits = request::BodyLimits {
        max_bytes: server.max_body_bytes,
        timeout: server.body_read_timeout,
        budget,
    };
    // The budget's share is held until the engine has the body.
    let (body, _held) = request::read_body(&parts.headers, body, limits).await?;
    let client_keys = generation.api_keys.is_enabled();
    let response = match sender
        .pass(upstream, client_keys, &parts, body, request_id)
        .await
    {
        Ok(response) => response,
        Err(ForwardError::Connect(_)) => return Err(unavailable()),
        Err(failure) => return Err(Error::forwarding(failure, &upstream.name, "")),
    };
    if deleting && response.status().is_success() {
        affinity.forget(id);
    }
    let mut response = passed_through(response);
    // The routing headers, as on every answer an upstream gave (no slot: no wait).
    mark_state(response.headers_mut(), upstream, Duration::ZERO);
    Ok(response)
}

#[cfg(test)]
mod tests;
