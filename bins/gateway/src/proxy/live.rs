//! The configuration in force, and everything derived from it, swappable as one piece.
//!
//! A [`Generation`] is one configuration's worth of state: the config itself, the upstream
//! states, the routing table, the client API keys and the health policy. [`Live`] holds the
//! current one; a request takes a reference to it at arrival (an `Arc` loaded from an `ArcSwap`,
//! without a lock) and keeps using that generation to the end, so a reload never changes
//! the rules under a request that is already being routed. What must survive a reload —
//! limiter keys, upstream health and residency, hold-time statistics, discovered slot counts,
//! engine load readings, metric series — lives in objects the new generation shares with the
//! old one (see [`Generation::build`]).

use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwap;
use slotgate_config::Config;
use slotgate_limiter::Limiter;
use slotgate_limiter_redis::RedisLimiter;
use slotgate_limiter_redis::Settings;

use crate::metrics::{Metrics, observe};
use crate::proxy::auth::{ApiKeys, ApiKeysError};
use crate::proxy::route::Routes;
use crate::support::error::chain;
use crate::tls::listener::{ListenerCerts, ListenerTlsError};
use crate::upstreams::cluster::{self, ClusterError};
use crate::upstreams::health::HealthPolicy;
use crate::upstreams::monitor::Watched;
use crate::upstreams::state::{UpstreamError, Upstreams};

/// What the gateway itself refuses in a configuration that `slotgate-config` accepted: every
/// problem found, each naming its key (`upstreams.NAME.url: unsupported scheme ftp (http or
/// https)`, `server.tls_cert: cannot read cert.pem: …`).
///
/// ```no_run
/// # fn demo(config: &slotgate_config::Config) {
/// if let Err(slotgate_gateway::StartError::Config(refused)) = slotgate_gateway::check(config) {
///     for issue in refused.issues() {
///         eprintln!("{issue}");
///     }
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[error("{}", self.issues().join("; "))]
pub struct ConfigProblems(Vec<ConfigProblem>);

/// One problem of [`ConfigProblems`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigProblem {
    /// An upstream this gateway cannot use.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The API keys file.
    #[error(transparent)]
    ApiKeys(#[from] ApiKeysError),
    /// A listener certificate.
    #[error(transparent)]
    ListenerTls(#[from] ListenerTlsError),
    /// `[cluster]`.
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

impl ConfigProblems {
    /// Every problem, one line each, with its causes.
    pub fn issues(&self) -> Vec<String> {
        self.0.iter().map(|problem| chain(problem)).collect()
    }
}

/// What [`fallible_parts`] builds.
type Parts = (Upstreams, ApiKeys, ListenerCerts, Option<Settings>);

/// The parts of a generation that can fail, built together so that every problem is reported
/// at once. Nothing shared is touched: the shared slot store's settings are checked (against
/// the `[cluster]` in force, on a reload), not started.
fn fallible_parts(config: &Config, previous: Option<&Generation>) -> Result<Parts, ConfigProblems> {
    let upstreams = Upstreams::build(config, previous.map(|p| &p.upstreams));
    let cluster = cluster::check(config, previous.map(|p| &p.config));
    let api_keys = ApiKeys::load(
        &config.server.api_keys,
        config.server.api_keys_file.as_deref(),
    );
    let listener_certs = ListenerCerts::load(&config.server);
    match (upstreams, api_keys, listener_certs, cluster) {
        (Ok(upstreams), Ok(api_keys), Ok(certs), Ok(cluster)) => {
            Ok((upstreams, api_keys, certs, cluster))
        }
        (upstreams, api_keys, listener_certs, cluster) => {
            let mut problems: Vec<ConfigProblem> = upstreams
                .err()
                .unwrap_or_default()
                .into_iter()
                .map(ConfigProblem::from)
                .collect();
            problems.extend(api_keys.err().map(ConfigProblem::from));
            problems.extend(
                listener_certs
                    .err()
                    .unwrap_or_default()
                    .into_iter()
                    .map(ConfigProblem::from),
            );
            problems.extend(cluster.err().map(ConfigProblem::from));
            Err(ConfigProblems(problems))
        }
    }
}

/// One configuration and what the gateway derived from it.
#[derive(Debug)]
pub(crate) struct Generation {
    /// 1 for the configuration the gateway started with, then +1 per successful reload.
    pub(crate) number: u64,
    /// When it took effect.
    pub(crate) loaded_at: SystemTime,
    /// The validated configuration.
    pub(crate) config: Config,
    /// Every upstream's identity and live state.
    pub(crate) upstreams: Upstreams,
    /// The routing table.
    pub(crate) routes: Routes,
    /// Client API keys (`server.api_keys` and `server.api_keys_file`).
    pub(crate) api_keys: ApiKeys,
    /// The health-check settings.
    pub(crate) policy: HealthPolicy,
    /// The listeners' certificates, as read for this configuration.
    pub(crate) listener_certs: ListenerCerts,
    /// The shared slot store under `[cluster]`: started with the first generation, kept by
    /// every reload (one per process).
    pub(crate) cluster: Option<RedisLimiter>,
}

impl Generation {
    /// Builds the generation for `config`.
    ///
    /// Everything that can fail (an upstream URL or API key this gateway cannot use, an
    /// unreadable API keys file) is checked first and reported together; only then is the
    /// limiter configured for the new keys, so a refused configuration changes nothing. Upstream
    /// states are taken over from `previous` where the upstream is the same engine, and each
    /// key's hold times, engine load and discovered slot count where the key is the same.
    pub(crate) fn build(
        config: Config,
        previous: Option<&Generation>,
        limiter: &Limiter,
        metrics: &Metrics,
    ) -> Result<Self, ConfigProblems> {
        let (upstreams, api_keys, listener_certs, settings) = fallible_parts(&config, previous)?;
        let cluster = match (previous, settings) {
            (Some(previous), _) => previous.cluster.clone(),
            (None, Some(settings)) => {
                let started =
                    cluster::start(settings).map_err(|error| ConfigProblems(vec![error.into()]))?;
                let round_trip = metrics.store_round_trip();
                started.observe_round_trips(move |took| observe(&round_trip, took));
                Some(started)
            }
            (None, None) => None,
        };
        let routes = Routes::build(
            &config,
            &upstreams,
            limiter,
            cluster.as_ref(),
            metrics,
            previous.map(|p| &p.routes),
        );
        Ok(Self {
            number: previous.map_or(1, |p| p.number + 1),
            loaded_at: SystemTime::now(),
            policy: HealthPolicy::from_config(&config.server),
            config,
            upstreams,
            routes,
            api_keys,
            listener_certs,
            cluster,
        })
    }

    /// What the background checks look at in this generation.
    pub(crate) fn watched(&self) -> Watched {
        Watched {
            policy: self.policy,
            upstreams: self.upstreams.iter().cloned().collect(),
            targets: self.routes.targets().cloned().collect(),
        }
    }

    /// Checks what [`Generation::build`] would refuse, without touching any shared state.
    pub(crate) fn validate(config: &Config) -> Result<(), ConfigProblems> {
        fallible_parts(config, None).map(drop)
    }
}

/// The current generation, swapped whole by a reload. Reading it takes no lock (`arc-swap`):
/// every request loads it once, so a reader never waits for a reload and never slows another
/// reader down.
#[derive(Debug)]
pub(crate) struct Live {
    current: ArcSwap<Generation>,
}

impl Live {
    /// Starts with `generation`.
    pub(crate) fn new(generation: Generation) -> Self {
        Self {
            current: ArcSwap::from_pointee(generation),
        }
    }

    /// The generation in force now.
    pub(crate) fn current(&self) -> Arc<Generation> {
        self.current.load_full()
    }

    /// Puts `generation` in force; returns the one it replaces.
    pub(crate) fn replace(&self, generation: Generation) -> Arc<Generation> {
        self.current.swap(Arc::new(generation))
    }
}

#[cfg(test)]
mod tests;
