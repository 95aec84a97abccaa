//! Step 4: where a request may go — its model's route, the targets of that route that serve its
//! endpoint, best first, and what the steering layers make of that order for this one request.
//!
//! [`Routed`] is the request from here on: everything the later steps (admit, send, answer,
//! retry) need that does not depend on the target being tried.
//!
//! The order starts as `slotgate-choose`'s ranking ([`Route::ranked`]), narrowed to the targets
//! of a kind that serves the endpoint ([`eligible`]). Then each [`Steer`] of the [`Chooser`], in
//! turn, may narrow or reorder that list, or refuse the request. The one built in pins a
//! Responses follow-up to the upstream that holds its conversation
//! ([`FollowUp`](crate::proxy::responses::FollowUp)). A layer that prefers a host for a request
//! is one more [`Steer`], handed to [`Chooser::new`]: it sees the request (its body and headers
//! in [`Routed::api`]) and the ranked targets, and moves the host it prefers first; nothing else
//! in the request path changes.
//!
//! Last, cache-aware placement ([`CacheAware::place`]) may move the host that holds the prompt's
//! prefix to the front. It is not a [`Steer`] because it leaves something with the request: the
//! [`Placement`](crate::proxy::request::prompt::Placement) in [`ApiRequest::placement`], which
//! the answer step records once the engine took the request
//! ([`Answerer`](crate::proxy::answer::Answerer)).

use std::fmt;
use std::sync::Arc;

use http::HeaderValue;

use crate::proxy::access::Access;
use crate::proxy::cache_aware::CacheAware;
use crate::proxy::client::{Client, Deadlines};
use crate::proxy::endpoint::Endpoint;
use crate::proxy::live::Generation;
use crate::proxy::problems::{BadRequest, Error};
use crate::proxy::request::ApiRequest;
use crate::proxy::route::Route;
use crate::upstreams::target::Target;

/// A request whose route is known: what every later step reads.
#[derive(Debug)]
pub(crate) struct Routed {
    /// The configuration in force when it arrived, kept to the end.
    pub(crate) generation: Arc<Generation>,
    /// Its model's route (an alias shares its target's).
    pub(crate) route: Arc<Route>,
    /// The API it calls.
    pub(crate) endpoint: &'static Endpoint,
    /// Its head and body, with `model` and `stream` found.
    pub(crate) api: ApiRequest,
    /// Who it queues as.
    pub(crate) client: Client,
    /// Until when it may wait.
    pub(crate) deadlines: Deadlines,
    /// Its `x-request-id`.
    pub(crate) request_id: HeaderValue,
    /// Its access-log record.
    pub(crate) access: Access,
}

impl Routed {
    /// The route of `api`'s model: the model it names, or the only one that serves `endpoint`
    /// when it names none.
    pub(crate) fn resolve(
        generation: &Generation,
        endpoint: &Endpoint,
        api: &ApiRequest,
    ) -> Result<Arc<Route>, Error> {
        let route = match &api.model {
            Some(name) => generation
                .routes
                .resolve(name)
                .ok_or_else(|| Error::ModelNotFound {
                    model: name.clone(),
                })?,
            None => generation
                .routes
                .only_model(endpoint)
                .ok_or(BadRequest::ModelNeeded {
                    route: endpoint.path,
                })?,
        };
        Ok(Arc::clone(route))
    }

    /// The request id as text, for the log.
    pub(crate) fn id(&self) -> &str {
        self.request_id.to_str().unwrap_or_default()
    }

    /// Whether the gateway checks client keys (then the client's `Authorization` is its key to
    /// the gateway, not the engine's).
    pub(crate) fn client_keys(&self) -> bool {
        self.generation.api_keys.is_enabled()
    }
}

/// A steering layer: sees one request and the targets it may go to, best first, and may narrow
/// or reorder them, or refuse the request.
pub(crate) trait Steer: Send + Sync + fmt::Debug {
    /// Steers `ranked`, the targets `routed` may go to, best first. An empty list is allowed
    /// (the request then ends as `upstream-unavailable`); an error ends the request with it.
    fn steer(&self, routed: &Routed, ranked: &mut Vec<&Arc<Target>>) -> Result<(), Error>;
}

/// Step 4: the targets to try for a request, in order.
#[derive(Debug)]
pub(crate) struct Chooser {
    steers: Vec<Box<dyn Steer>>,
    /// What each host's prompt cache holds, as far as the gateway knows.
    cache: Arc<CacheAware>,
}

impl Chooser {
    /// A chooser that runs `steers` in order over the ranking, then places the request by what
    /// `cache` says the hosts hold of its prompt.
    pub(crate) fn new(steers: Vec<Box<dyn Steer>>, cache: Arc<CacheAware>) -> Self {
        Self { steers, cache }
    }

    /// The targets of `route` to try for `routed`, best first: the ranking of those that serve
    /// its endpoint, as the steering layers leave it, with the host that holds the prompt's
    /// prefix first where the load allows; the placement is left in `routed.api`.
    pub(crate) fn choose<'r>(
        &self,
        routed: &mut Routed,
        route: &'r Route,
    ) -> Result<Vec<&'r Arc<Target>>, Error> {
        let mut ranked = eligible(route, routed.endpoint)?;
        for steer in &self.steers {
            steer.steer(routed, &mut ranked)?;
        }
        routed.api.placement = self
            .cache
            .place(&mut ranked, &routed.api, route, routed.endpoint);
        Ok(ranked)
    }
}

/// The targets of `route` to try for `endpoint`, best first: those of a kind that serves it
/// (and, for a disk-changing endpoint, whose upstream allows it). A problem when no configured
/// upstream of the model could ever take it; an empty list when the ones that could are down.
pub(crate) fn eligible<'r>(
    route: &'r Route,
    endpoint: &Endpoint,
) -> Result<Vec<&'r Arc<Target>>, Error> {
    let serves = |t: &Target| endpoint.is_served_by(t.upstream.kind);
    let allowed = |t: &Target| serves(t) && (!endpoint.manages_models || t.model_management);
    if !route.targets.iter().any(|t| serves(t)) {
        return Err(Error::RouteNotServed {
            model: route.model.clone(),
            route: endpoint.path,
        });
    }
    if !route.targets.iter().any(|t| allowed(t)) {
        return Err(Error::RouteDisabled {
            model: route.model.clone(),
            route: endpoint.path,
        });
    }
    Ok(route.ranked().into_iter().filter(|t| allowed(t)).collect())
}

#[cfg(test)]
mod tests;
