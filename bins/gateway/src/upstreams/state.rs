//! What the gateway knows about each upstream right now: where it is, whether it is healthy,
//! whether an operator is draining it, and which models it has resident.
//!
//! An [`UpstreamState`] is shared by everything that reads or writes those facts: the request
//! path (routing reads them for every candidate), the background checks
//! ([`monitor`](crate::upstreams::monitor)), the admin API and the metrics. It outlives configuration
//! reloads: [`Upstreams::build`] hands the *same* state to the new configuration when an
//! upstream keeps its name and engine (URL, kind, API key), so a reload does not forget that a
//! host is down, draining, or has a model loaded.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::HeaderValue;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use slotgate_config::{Config, Kind, Secret, Server, Upstream};
use tracing::{info, warn};
use url::Url;

use crate::support::base::{Base, BaseError};
use crate::support::error::chain;
use crate::tls::{self, Connector, TlsError, UpstreamTls};
use crate::upstreams::health::{Health, HealthPolicy, Status};
use crate::upstreams::places::gate::Gate;
use crate::upstreams::pool::{Pool, PoolSettings};
use crate::upstreams::probe::{ProbeError, ProbeTarget};
use crate::upstreams::residency::Residency;

/// What the configuration crate accepts in an upstream but this gateway cannot use.
#[derive(Debug, thiserror::Error)]
pub(crate) enum UpstreamError {
    /// `url`: see [`BaseError`].
    #[error("upstreams.{upstream}.url")]
    Url {
        /// The upstream's name.
        upstream: String,
        /// Why.
        #[source]
        source: BaseError,
    },
    /// `api_key` cannot be sent in a header.
    #[error("upstreams.{upstream}.api_key: not a valid header value")]
    ApiKey {
        /// The upstream's name.
        upstream: String,
        /// Why.
        #[source]
        source: http::header::InvalidHeaderValue,
    },
    /// `ca_file`, `client_cert` or `client_key` cannot be used: see [`TlsError`] (it names the
    /// file).
    #[error("upstreams.{upstream}: TLS")]
    Tls {
        /// The upstream's name.
        upstream: String,
        /// Why (boxed: the file's path and rustls's reason make it large).
        #[source]
        source: Box<TlsError>,
    },
}

/// One upstream's identity and live state.
#[derive(Debug)]
pub(crate) struct UpstreamState {
    /// The name in the configuration (`[upstreams.NAME]`), used in logs, metrics and the admin
    /// API.
    pub(crate) name: String,
    /// The name as the `x-slotgate-upstream` value of every answer it gives, made once; `None`
    /// when the name cannot be a header value (a quoted TOML key may hold control characters).
    pub(crate) name_header: Option<HeaderValue>,
    /// What software answers there.
    pub(crate) kind: Kind,
    /// The configured URL.
    pub(crate) url: Url,
    /// The limiter's host key (`scheme://host:port`).
    pub(crate) authority: String,
    /// Where to send requests.
    pub(crate) base: Base,
    /// `Authorization` to send upstream instead of the client's, if the upstream has a key.
    pub(crate) authorization: Option<HeaderValue>,
    /// Kept to tell on reload whether the engine is still the same one.
    api_key: Option<Secret>,
    /// The TLS configuration of an `https` upstream, with the files it was read from (so a
    /// reload sees a renewed certificate).
    tls: Option<UpstreamTls>,
    /// The request path's connections ([`Pool`]): kept alive and reused, so a request pays no
    /// connect (nor TLS handshake) on the hot path.
    pub(crate) client: Pool,
    /// The probes' client: same TLS, no idle connections (see
    /// [`probe`](crate::upstreams::probe)).
    pub(crate) probe_client: Client<Connector, Empty<Bytes>>,
    /// Health checks and passive ejection.
    pub(crate) health: Health,
    /// Which models are resident.
    pub(crate) residency: Residency,
    /// How many models the engine may hold at once, and who waits for a place
    /// ([`places`](crate::upstreams::places)).
    pub(crate) places: Arc<Gate>,
    /// Set by the admin API: no new requests, in-flight ones finish.
    draining: AtomicBool,
}

impl UpstreamState {
    /// A fresh state (health unknown, nothing known resident, not draining).
    ///
    /// Fails, naming the key, on what the configuration crate accepts but this gateway cannot
    /// use (a URL that is not `http` or `https`, a TLS file that cannot be read or parsed, an
    /// API key that is not a header value). `server` gives the clients' connect and idle
    /// timeouts, and the most idle connections kept (`max_connections`).
    pub(crate) fn from_config(upstream: &Upstream, server: &Server) -> Result<Self, UpstreamError> {
        let base = Base::parse(upstream.url.as_str()).map_err(|source| UpstreamError::Url {
            upstream: upstream.name.clone(),
            source,
        })?;
        let authorization = match &upstream.api_key {
            Some(key) => {
                let mut value = HeaderValue::try_from(format!("Bearer {}", key.expose())).map_err(
                    |source| UpstreamError::ApiKey {
                        upstream: upstream.name.clone(),
                        source,
                    },
                )?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let tls = UpstreamTls::load(upstream).map_err(|source| UpstreamError::Tls {
            upstream: upstream.name.clone(),
            source: Box::new(source),
        })?;
        let connector = tls::connector(tls.as_ref(), server.connect_timeout, server.tcp_keepalive);
        let client = Pool::new(
            connector.clone(),
            &base,
            PoolSettings {
                connect_timeout: server.connect_timeout,
                idle_timeout: server.idle_timeout,
                // No more idle connections than there can be client connections.
                max_idle: server.max_connections,
                reuse_after_chunked: true,
            }
            .for_kind(upstream.kind),
        );
        // No connect timeout of its own: the probe's timeout covers the whole exchange. No
        // idle connections: a probe also proves that the engine still accepts connections.
        let probe_client = Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_max_idle_per_host(0)
            .build(connector);
        Ok(Self {
            name: upstream.name.clone(),
            name_header: HeaderValue::from_str(&upstream.name).ok(),
            kind: upstream.kind,
            url: upstream.url.clone(),
            authority: upstream.authority(),
            base,
            authorization,
            api_key: upstream.api_key.clone(),
            tls,
            client,
            probe_client,
            health: Health::new(),
            residency: Residency::new(),
            places: Arc::new(Gate::new(
                upstream.max_loaded_models,
                upstream.collate_for,
                // A llama-server may be a router that reports its bound.
                upstream.kind == Kind::LlamaServer,
            )),
            draining: AtomicBool::new(false),
        })
    }

    /// Whether `upstream` (from a new configuration) describes the same engine, reached the
    /// same way (TLS files included, by content): then its health, residency and pooled
    /// connections still hold.
    pub(crate) fn is_same_engine(&self, upstream: &Upstream) -> bool {
        self.url == upstream.url
            && self.kind == upstream.kind
            && self.api_key == upstream.api_key
            && UpstreamTls::unchanged(self.tls.as_ref(), upstream)
    }

    /// How probes reach it.
    pub(crate) fn probe_target(&self) -> ProbeTarget<'_> {
        ProbeTarget {
            client: &self.probe_client,
            base: &self.base,
            authorization: self.authorization.as_ref(),
        }
    }

    /// Whether it may be given new requests health-wise and drain-wise.
    pub(crate) fn is_available(&self) -> bool {
        self.health.is_routable() && !self.is_draining()
    }

    /// Whether an operator is draining it.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed)
    }

    /// Starts or stops draining; returns whether that changed anything.
    pub(crate) fn set_draining(&self, draining: bool) -> bool {
        let changed = self.draining.swap(draining, Ordering::Relaxed) != draining;
        if changed {
            if draining {
                info!(upstream = %self.name, "upstream draining: no new requests, in-flight ones finish");
            } else {
                info!(upstream = %self.name, "upstream undrained: takes new requests again");
            }
        }
        changed
    }

    /// Records an active health check's result, logging a change of status.
    pub(crate) fn record_check(&self, result: Result<(), &ProbeError>, policy: &HealthPolicy) {
        if let Some(status) = self.health.record_check(result, policy) {
            let reason = result.err().map(|error| chain(error));
            self.log_transition(status, reason.as_deref(), "health check");
        }
    }

    /// Notes that a due failure streak did not eject it, `because` its models cannot spare it
    /// ([`ejection`](crate::upstreams::ejection)), logging that once per streak and reason.
    pub(crate) fn keep_in_rotation(&self, because: &str, reason: &str, by: &'static str) {
        if self.health.keep(because) {
            warn!(
                upstream = %self.name,
                by,
                reason,
                kept = %because,
                "upstream failing but kept in rotation: not ejected"
            );
        }
    }

    /// Logs a change of its health `status`, with the failure's `reason` and what saw it
    /// (`by`: `health check`, `connect errors`, `engine errors`).
    pub(crate) fn log_transition(&self, status: Status, reason: Option<&str>, by: &'static str) {
        match status {
            Status::Healthy => {
                info!(upstream = %self.name, by, "upstream healthy: takes new requests");
            }
            Status::Unhealthy => warn!(
                upstream = %self.name,
                by,
                reason = reason.unwrap_or_default(),
                "upstream unhealthy: ejected, no new requests until it passes its checks"
            ),
            Status::Unknown => {}
        }
    }
}

// === Upstreams ===

/// Every configured upstream's state, by name.
#[derive(Debug, Default)]
pub(crate) struct Upstreams {
    by_name: BTreeMap<String, Arc<UpstreamState>>,
}

impl Upstreams {
    /// The states for `config`: an upstream that keeps its name and engine keeps its state from
    /// `previous`; a new or changed one starts fresh (a changed one keeps its draining flag,
    /// which is the operator's intent for that name).
    ///
    /// Fails with every problem found (see [`UpstreamState::from_config`]).
    pub(crate) fn build(
        config: &Config,
        previous: Option<&Upstreams>,
    ) -> Result<Self, Vec<UpstreamError>> {
        let mut by_name = BTreeMap::new();
        let mut problems = Vec::new();
        for upstream in config.upstreams.values() {
            let old = previous.and_then(|p| p.get(&upstream.name));
            if let Some(old) = old.filter(|old| old.is_same_engine(upstream)) {
                // The same engine keeps what is loaded and who waits; the settings may change.
                old.places
                    .configure(upstream.max_loaded_models, upstream.collate_for);
                by_name.insert(upstream.name.clone(), Arc::clone(old));
                continue;
            }
            match UpstreamState::from_config(upstream, &config.server) {
                Ok(state) => {
                    if let Some(old) = old {
                        state.draining.store(old.is_draining(), Ordering::Relaxed);
                    }
                    by_name.insert(upstream.name.clone(), Arc::new(state));
                }
                Err(problem) => problems.push(problem),
            }
        }
        if problems.is_empty() {
            Ok(Self { by_name })
        } else {
            Err(problems)
        }
    }

    /// The state of the upstream named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<UpstreamState>> {
        self.by_name.get(name)
    }

    /// Every upstream, by name.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Arc<UpstreamState>> {
        self.by_name.values()
    }

    /// How many upstreams there are.
    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Whether `state` is one of these (the very same object).
    pub(crate) fn contains(&self, state: &Arc<UpstreamState>) -> bool {
        self.by_name
            .get(&state.name)
            .is_some_and(|mine| Arc::ptr_eq(mine, state))
    }
}
