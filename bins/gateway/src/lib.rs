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
//! [`service`] calls the steps in order; each step has its own module:
//!
//! 1. [`server`]: accept (HTTP/1.1 and h2c), header-read timeout, connection limit, graceful
//!    shutdown.
//! 2. [`auth`]: the client's API key, when keys are configured.
//! 3. [`request`]: the body under a size limit; `model` and `stream` found without
//!    re-serialising.
//! 4. [`route`]: aliases, candidate upstreams, `slotgate-choose`'s ranking.
//! 5. [`admit`]: a slot from `slotgate-limiter`, falling through to the next host when a queue
//!    is full, waiting under `queue_timeout` otherwise.
//! 6. [`forward`]: the pooled upstream client, timeouts, hop-by-hop headers, request id.
//! 7. [`body`]: the response body that holds the slot until it ends, fails or is dropped.
//! 8. [`rescue`]: every error → its problem document, in one place.
//!
//! Around them: [`hold`] (slot hold times → `Retry-After`), [`metrics`] and [`admin`] (the
//! admin listener).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use slotgate_config::Config;
use slotgate_limiter::Limiter;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tracing::info;

pub mod admin;
pub mod admit;
pub mod auth;
pub mod body;
pub mod forward;
pub mod hold;
pub mod metrics;
pub mod request;
pub mod rescue;
pub mod route;
pub mod server;
pub mod service;

use crate::server::{ServerSettings, ShutdownTrigger, shutdown_pair};

/// Why the gateway could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration asks for something this gateway cannot do, or names a file it cannot
    /// read.
    #[error("{0}")]
    Config(String),
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

/// A running gateway: the API listener, the admin listener if configured, and their state.
///
/// Dropping it starts a shutdown too, without waiting for it; prefer [`Gateway::shutdown`].
#[derive(Debug)]
pub struct Gateway {
    api_addr: SocketAddr,
    admin_addr: Option<SocketAddr>,
    limiter: Limiter,
    api_trigger: ShutdownTrigger,
    admin_trigger: ShutdownTrigger,
    api_task: JoinHandle<()>,
    admin_task: Option<JoinHandle<()>>,
}

impl Gateway {
    /// Binds the listeners and starts serving. Needs a multi-threaded Tokio runtime (or any
    /// Tokio runtime, for tests).
    pub async fn bind(config: &Config) -> Result<Self, StartError> {
        let server = &config.server;
        let limiter = Limiter::new();
        let metrics = metrics::Metrics::new();
        let routes =
            Arc::new(route::Routes::build(config, &limiter, &metrics).map_err(StartError::Config)?);
        let api_keys = auth::ApiKeys::load(
            server.api_keys.iter().map(slotgate_config::Secret::expose),
            server.api_keys_file.as_deref(),
        )
        .map_err(StartError::Config)?;

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

        let (api_trigger, api_signal) = shutdown_pair();
        let (admin_trigger, admin_signal) = shutdown_pair();
        // Clients told "shutting down" should come back once a restart is likely done.
        let shutdown_retry_after = server.drain_grace.max(Duration::from_secs(1));
        let app = Arc::new(service::App {
            routes: Arc::clone(&routes),
            forwarder: forward::Forwarder::new(forward::ClientSettings {
                connect_timeout: server.connect_timeout,
                first_byte_timeout: server.first_byte_timeout,
                pool_idle_timeout: server.idle_timeout,
            }),
            api_keys,
            max_body_bytes: server.max_body_bytes,
            unavailable_retry_after: server.health_check_interval,
            shutdown_retry_after,
            shutdown: api_signal.clone(),
            started: SystemTime::now(),
        });
        let settings = ServerSettings {
            header_read_timeout: server.header_read_timeout,
            max_connections: server.max_connections,
            drain_timeout: server.drain_grace,
        };
        let api_task = tokio::spawn(server::serve(
            "api",
            api_listener,
            settings,
            move |req, _peer| Arc::clone(&app).handle(req),
            api_signal.clone(),
        ));
        info!(%api_addr, upstreams = config.upstreams.len(), models = routes.names().len(), "API listening");

        let admin_task = admin_listener.map(|listener| {
            let admin = Arc::new(admin::Admin {
                registry: metrics.registry(Arc::clone(&routes)),
                draining: api_signal,
                retry_after: shutdown_retry_after,
            });
            let settings = ServerSettings {
                // Probes and scrapes are small; a modest cap keeps them from crowding the API.
                max_connections: 64,
                drain_timeout: Duration::from_secs(1),
                ..settings
            };
            tokio::spawn(server::serve(
                "admin",
                listener,
                settings,
                move |req, _peer| {
                    let admin = Arc::clone(&admin);
                    async move { admin.handle(&req) }
                },
                admin_signal,
            ))
        });
        if let Some(addr) = admin_addr {
            info!(admin_addr = %addr, "admin listening");
        }

        Ok(Self {
            api_addr,
            admin_addr,
            limiter,
            api_trigger,
            admin_trigger,
            api_task,
            admin_task,
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

    /// Stops gracefully: stop accepting, answer new requests on open connections with
    /// `503 shutting-down`, let in-flight requests finish within `server.drain_grace`, then
    /// close what is left. `/readyz` turns `503` as soon as this starts; the admin listener
    /// stops last.
    pub async fn shutdown(self) {
        info!("shutting down");
        self.api_trigger.fire();
        // A panicked serve task has nothing left to drain; carry on stopping the rest.
        let _ = self.api_task.await;
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
    route::Routes::build(config, &Limiter::new(), &metrics::Metrics::new())
        .map_err(StartError::Config)?;
    auth::ApiKeys::load(
        config
            .server
            .api_keys
            .iter()
            .map(slotgate_config::Secret::expose),
        config.server.api_keys_file.as_deref(),
    )
    .map_err(StartError::Config)?;
    Ok(())
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
