//! # slotgate-gateway
//!
//! The `slotgate` binary's wiring, as a library so that tests and the demo start the real
//! gateway in-process:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let config = slotgate_config::Config::from_toml_str(r#"
//!     [server]
//!     listen = "127.0.0.1:8080"
//!     admin_listen = "127.0.0.1:9090"
//!
//!     [upstreams.local]
//!     url = "http://127.0.0.1:8081"
//!     kind = "llama-server"
//!
//!     [upstreams.local.models.llama]
//!     parallel = 4
//!     queue = 8
//!     queue_timeout = "30s"
//! "#)?;
//! let gateway = slotgate_gateway::Gateway::bind(&config).await?;
//! println!("API on {}", gateway.api_addr());
//! // ... later:
//! gateway.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! ## One request, file by file
//!
//! The source is grouped by role: [`proxy`] is the request path, [`upstreams`] what is known
//! about the engines, [`ops`] the operator's side, and three leaves hold what all of them share:
//! [`support`] ([`support::base`]: the upstream URL, [`support::request_id`],
//! [`support::error`]: the boxed error and its chain, [`support::shutdown`]), [`metrics`]: the
//! metric families and their handles, and [`tls`]: TLS to the upstreams and on the gateway's
//! own listeners. Each layer imports only the ones below it (`ops` → `proxy` → `upstreams` →
//! leaves), and `scripts/module-cycles.py` fails CI on a circle. Besides them, `fixtures`
//! (unit-test set-ups) and `fuzzing` (the fuzz targets' entry points) are compiled only for
//! tests and fuzzing.
//!
//! [`proxy::service`] calls the steps in order; each step has its own module, whose header
//! names it by the same number:
//!
//! 1. [`proxy::server`]: accept (HTTP/1.1 and h2c, or TLS with ALPN), header-read timeout,
//!    connection limit, graceful shutdown; [`proxy::refusals`] turns hyper's own refusals of a
//!    malformed head into problem documents.
//! 2. [`proxy::auth`]: the client's API key, when keys are configured.
//! 3. [`proxy::request`]: the body under a size limit; `model` and `stream` found without
//!    re-serialising.
//! 4. [`proxy::choose`]: where the request may go, best first — its model's route in the
//!    routing table ([`proxy::route`]: aliases, candidate upstreams, `slotgate-choose`'s
//!    ranking) and what the steering layers make of that order.
//! 5. and 6. [`proxy::admit`]: a slot from `slotgate-limiter` on one target, at once or after
//!    waiting in its queue under `queue_timeout`; a full queue falls through to the next host.
//! 7. [`proxy::send`]: the request sent through the pooled upstream client ([`proxy::forward`]:
//!    timeouts, hop-by-hop headers, request id).
//! 8. [`proxy::answer`]: the engine's response becomes the client's, its body
//!    ([`proxy::body`]) holding the slot until it ends, fails or is dropped;
//!    [`proxy::body::meter`] reads the first token and the usage on the way.
//! 9. [`proxy::retry`]: the candidate loop's state — on to the next target, or what the request
//!    ends with when none took it.
//!
//! Any failure on the way becomes an [`proxy::problems::Error`] and its problem document in
//! [`proxy::problems`], in one place.
//!
//! [`proxy::access`] follows each request through these steps and writes its access-log line
//! when it is over.
//!
//! Which path is which API is in [`proxy::endpoint`], the endpoint table: where the model is
//! named, whether the endpoint takes a slot, which kinds of upstream serve it. [`proxy::ollama`] answers Ollama's
//! model listings from the routing table.
//!
//! A request starts by taking the configuration in force, [`proxy::live`]; a route's targets
//! ([`upstreams::target`]) carry the per-(upstream, model) state: hold times
//! ([`upstreams::hold`] → `Retry-After`), metric handles, the `auto` slot count, the engine's load.
//!
//! ## Operating it
//!
//! - [`ops::reload`] (`SIGHUP`, `POST /admin/reload`) builds the next [`proxy::live`] generation
//!   and swaps it in as one piece.
//! - [`ops::admin`]: the admin listener; [`ops::scrape`]: `/metrics` with gauges read at scrape
//!   time; [`ops::status`]: the live status page (`/ui`) and its event stream.
//! - [`upstreams::state`]: what is known about each upstream now — [`upstreams::health`] (active
//!   checks and passive ejection), [`upstreams::residency`] (which models are loaded), draining —
//!   kept up to date by [`upstreams::monitor`] through [`upstreams::probe`], the typed client for
//!   the engines' own endpoints.
//! - [`upstreams::slot_discovery`]: `parallel = "auto"`, the slot count read from the engine.
//! - [`upstreams::reconcile`]: the engine's own busy count next to the gateway's, and a warning
//!   when something bypasses the gateway.
//!
//! The public API is [`Gateway`], [`check`] and [`probe_config`] with their types; everything
//! else is internal to the crate.

// The map above links the crate's internal modules: rustdoc still checks that every link
// resolves, which keeps the map true, while the public docs show the names as text.
#![allow(
    rustdoc::private_intra_doc_links,
    reason = "the file-by-file map names internal modules on purpose"
)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use slotgate_config::Config;
use slotgate_limiter::Limiter;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tracing::info;

#[cfg(test)]
mod fixtures;
// The entry points of the fuzz targets (`fuzz/`, docs/fuzzing.md): compiled only under
// cargo-fuzz's `--cfg fuzzing` (and for its own unit tests), so none of it is public API.
#[cfg(any(fuzzing, test))]
#[doc(hidden)]
pub mod fuzzing;
mod metrics;
mod ops;
mod proxy;
mod support;
mod tls;
mod upstreams;

pub use crate::ops::reload::{ReloadError, Reloaded};
pub use crate::proxy::live::ConfigProblems;
pub use crate::upstreams::auto_slots::SlotCountError;
pub use crate::upstreams::slot_discovery::{ProbedSlots, probe_config};

use crate::ops::admin;
use crate::ops::reload::Reloader;
use crate::ops::status::sampler;
use crate::proxy::live::{Generation, Live};
use crate::proxy::server::{self, ServerCounters, ServerSettings};
use crate::proxy::service;
use crate::support::shutdown::{ShutdownSignal, ShutdownTrigger, shutdown_pair};
use crate::tls::listener::ListenerSlots;
use crate::upstreams::probe::Prober;
use crate::upstreams::{monitor, slot_discovery};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration asks for something this gateway cannot do, or names a file it cannot
    /// read: every problem found.
    #[error(transparent)]
    Config(#[from] ConfigProblems),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// A running gateway: the API listener, the admin listener if configured, the background
/// health checks, and their state.
///
/// Dropping it starts a shutdown too, without waiting for it; prefer [`Gateway::shutdown`].
#[derive(Debug)]
pub struct Gateway {
    api_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    limiter: Limiter,
    reloader: Arc<Reloader>,
    api_trigger: ShutdownTrigger,
    admin_trigger: ShutdownTrigger,
    monitor_trigger: ShutdownTrigger,
    api_task: JoinHandle<()>,
    admin_task: Option<JoinHandle<()>>,
    monitor_task: JoinHandle<()>,
}

impl Gateway {
    /// Binds the listeners and starts serving `config`. [`Gateway::reload`] is refused: there
    /// is no file to read again (see [`Gateway::bind_file`]). Needs a Tokio runtime.
    pub async fn bind(config: &Config) -> Result<Self, StartError> {
        Self::start(config.clone(), None).await
    }

    /// Like [`Gateway::bind`], remembering that `config` came from `path`: a reload (`SIGHUP`
    /// in the binary, `POST /admin/reload`, [`Gateway::reload`]) reads that file again.
    pub async fn bind_file(config: &Config, path: impl Into<PathBuf>) -> Result<Self, StartError> {
        Self::start(config.clone(), Some(path.into())).await
    }

    async fn start(config: Config, source: Option<PathBuf>) -> Result<Self, StartError> {
        let limiter = Limiter::new();
        let metrics = metrics::Metrics::new();
        let generation = Generation::build(config, None, &limiter, &metrics)?;
        let server = generation.config.server.clone();

        let api_listener = bind(server.listen).await?;
        let api_addr = local_addr(&api_listener, server.listen)?;
        let admin_listener = match server.admin_listen {
            Some(addr) => Some(bind(addr).await?),
            None => None,
        };
        let admin_addr = match (&admin_listener, server.admin_listen) {
            (Some(listener), Some(addr)) => Some(local_addr(listener, addr)?),
            _ => None,
        };

        // One round of checks before the first request, so requests only go to upstreams
        // that answered (connections arriving meanwhile wait in the listen backlog).
        let prober = Prober::new(generation.policy.timeout);
        monitor::check_upstreams(
            generation.upstreams.iter().cloned().collect(),
            &prober,
            generation.policy,
        )
        .await;
        // `parallel = "auto"` models get their slot count before the first request too.
        slot_discovery::read_slot_counts(
            generation.routes.targets().cloned().collect(),
            &prober,
            generation.policy,
            true,
        )
        .await;
        let upstream_count = generation.upstreams.len();
        let names = generation.routes.names().len();
        // Each TLS listener presents the certificate in its slot; a reload renews the slots.
        let slots = ListenerSlots::new(&generation.listener_certs);
        let (api_tls, admin_tls) = slots.acceptors();
        let body_budget = server.max_buffered_body_bytes;
        let live = Arc::new(Live::new(generation));
        let reloader = Arc::new(Reloader::new(
            source,
            body_budget,
            Arc::clone(&live),
            limiter.clone(),
            metrics.clone(),
            prober.clone(),
            slots,
        ));

        let (api_trigger, api_signal) = shutdown_pair();
        let (admin_trigger, admin_signal) = shutdown_pair();
        let (monitor_trigger, monitor_signal) = shutdown_pair();
        let watched = Arc::clone(&live);
        let monitor_task = tokio::spawn(monitor::run(
            move || watched.current().watched(),
            prober,
            monitor_signal,
        ));

        let app = Arc::new(service::App::new(
            Arc::clone(&live),
            &server,
            api_signal.clone(),
            &metrics,
        ));
        let settings = api_settings(&server);
        let counters = ServerCounters::new(&metrics);
        let api_task = tokio::spawn(server::serve(
            "api",
            api_listener,
            settings,
            counters.clone(),
            api_tls,
            move |req, _peer| Arc::clone(&app).handle(req),
            api_signal.clone(),
        ));
        info!(%api_addr, tls = server.tls.is_some(), upstreams = upstream_count, models = names, "API listening");

        let admin_task = admin_listener.map(|listener| {
            let admin = admin::Admin {
                registry: ops::scrape::registry(&metrics, Arc::clone(&live)),
                live: Arc::clone(&live),
                reloader: Arc::clone(&reloader),
                shutdown: api_signal,
                history: Arc::default(),
            };
            let settings = admin_settings(settings, server.admin_max_connections);
            spawn_admin(admin, listener, settings, counters, admin_tls, admin_signal)
        });
        if let Some(addr) = admin_addr {
            info!(admin_addr = %addr, tls = server.admin_tls.is_some(), "admin listening");
        }

        Ok(Self {
            api_addr,
            admin_addr,
            limiter,
            reloader,
            api_trigger,
            admin_trigger,
            monitor_trigger,
            api_task,
            admin_task,
            monitor_task,
        })
    }

    /// Where the API listens (with the real port when the configuration said `0`).
    pub fn api_addr(&self) -> SocketAddr {
        self.api_addr
    }

    /// Where the admin listener listens, if one is configured.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin_addr
    }

    /// The limiter, for inspection (tests, embedding): every (upstream authority, model) key.
    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// Reads the configuration file again and puts it in force without dropping requests (see
    /// [`ops::reload`]). Refused, with the running configuration kept, when the new one is invalid
    /// or the gateway was not started from a file.
    pub async fn reload(&self) -> Result<Reloaded, ReloadError> {
        self.reloader.reload().await
    }

    /// Stops gracefully: stop accepting, close idle keep-alive connections at once (HTTP/2 with
    /// a `GOAWAY`), answer requests still waiting in a queue (and any read after this point)
    /// with `503 shutting-down`, let requests already running (streams included) finish within
    /// `server.drain_grace`, then close what is left.
    /// `/readyz` turns `503` as soon as this starts; the health checks and the admin listener
    /// stop last.
    pub async fn shutdown(self) {
        info!("shutting down");
        self.api_trigger.fire();
        // A panicked serve task has nothing left to drain; carry on stopping the rest.
        let _ = self.api_task.await;
        self.monitor_trigger.fire();
        let _ = self.monitor_task.await;
        self.admin_trigger.fire();
        if let Some(task) = self.admin_task {
            let _ = task.await;
        }
        info!("stopped");
    }
}

/// Checks what [`Gateway::bind`] would refuse in a configuration that `slotgate-config`
/// accepted (an upstream URL this gateway cannot use, an unreadable API keys file), without
/// binding anything. `slotgate check` runs it.
pub fn check(config: &Config) -> Result<(), StartError> {
    Ok(Generation::validate(config)?)
}

/// The API listener's settings.
fn api_settings(server: &slotgate_config::Server) -> ServerSettings {
    ServerSettings {
        header_read_timeout: server.header_read_timeout,
        idle_timeout: server.client_idle_timeout,
        max_connections: server.max_connections,
        h2_max_concurrent_streams: u32::try_from(server.h2_max_concurrent_streams)
            .unwrap_or(u32::MAX),
        h2_keep_alive_interval: server.h2_keep_alive_interval,
        tcp_keepalive: server.tcp_keepalive,
        write_timeout: server.client_write_timeout,
        drain_timeout: server.drain_grace,
    }
}

/// The admin listener's settings: the API's, with its own connection limit and a short drain.
fn admin_settings(api: ServerSettings, max_connections: usize) -> ServerSettings {
    ServerSettings {
        max_connections,
        // Probes and scrapes are quick, and the status page's event streams end when shutdown
        // starts; a stuck one should not delay a restart.
        drain_timeout: Duration::from_secs(1),
        ..api
    }
}

/// Serves the admin endpoints on `listener` until `stop` fires, with the status page's sampler
/// running beside them.
fn spawn_admin(
    admin: admin::Admin,
    listener: TcpListener,
    settings: ServerSettings,
    counters: ServerCounters,
    tls: Option<TlsAcceptor>,
    stop: ShutdownSignal,
) -> JoinHandle<()> {
    let sampler = sampler::run(
        Arc::clone(&admin.live),
        Arc::clone(&admin.history),
        stop.clone(),
    );
    let admin = Arc::new(admin);
    let serve = server::serve(
        "admin",
        listener,
        settings,
        counters,
        tls,
        move |req, _peer| {
            let admin = Arc::clone(&admin);
            async move { admin.handle(req).await }
        },
        stop,
    );
    tokio::spawn(async move {
        // Both stop on `stop`.
        tokio::join!(sampler, serve);
    })
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, StartError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

fn local_addr(listener: &TcpListener, addr: SocketAddr) -> Result<SocketAddr, StartError> {
    listener
        .local_addr()
        .map_err(|source| StartError::Bind { addr, source })
}
