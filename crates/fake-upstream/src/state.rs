//! The state of one fake server, shared by the request handler (`app.rs`) and the kinds' own
//! endpoints (`kinds/*`): its configuration, observer, models, run-time defaults and switches.
//! It sits below both, so the kinds read it without importing the handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::{FakeConfig, Kind, Pacing};
use crate::failure::Failure;
use crate::models::{Model, Registry, Residency};
use crate::observer::Observer;
use crate::openai::unix_now;
use crate::reply::Refusal;
use crate::slots::QueueBound;
use crate::store::ResponseStore;

/// The defaults that can change while the server runs.
#[derive(Clone, Debug)]
pub(crate) struct Behaviour {
    pub(crate) tokens: u32,
    pub(crate) pacing: Pacing,
    pub(crate) failures: Vec<Failure>,
}

/// The state of one fake server.
#[derive(Debug)]
pub(crate) struct App {
    pub(crate) config: FakeConfig,
    pub(crate) observer: Observer,
    pub(crate) registry: Registry,
    pub(crate) queue_bound: QueueBound,
    pub(crate) behaviour: Mutex<Behaviour>,
    /// When the server is ready (llama-server stops answering "Loading model").
    pub(crate) ready_at: Instant,
    /// Process start, for `created` and `Process-Start-Time-Unix`.
    pub(crate) started_unix: u64,
    /// Process start in nanoseconds, to make ids unique across instances.
    pub(crate) started_unix_nanos: u128,
    /// Set by `FakeUpstream::set_healthy(false)`.
    pub(crate) unhealthy: AtomicBool,
    /// Set by `FakeUpstream::set_router_props(false)`.
    pub(crate) router_props_down: AtomicBool,
    /// The Responses API answers this instance created (when the store is on).
    pub(crate) responses: ResponseStore,
    answer_ids: AtomicU64,
}

impl App {
    pub(crate) fn new(config: FakeConfig, observer: Observer) -> Self {
        Self {
            registry: Registry::new(&config),
            queue_bound: QueueBound::new(config.max_queue),
            behaviour: Mutex::new(Behaviour {
                tokens: config.tokens,
                pacing: config.pacing,
                failures: config.failures.clone(),
            }),
            ready_at: Instant::now() + config.startup_delay,
            started_unix: unix_now(),
            started_unix_nanos: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
            unhealthy: AtomicBool::new(false),
            router_props_down: AtomicBool::new(false),
            responses: ResponseStore::default(),
            answer_ids: AtomicU64::new(0),
            observer,
            config,
        }
    }

    pub(crate) fn kind(&self) -> Kind {
        self.config.kind
    }

    /// A number unique to this server, for answer ids.
    pub(crate) fn next_answer_number(&self) -> u64 {
        self.answer_ids.fetch_add(1, Ordering::Relaxed)
    }

    /// A router model by name: unknown → 400, not running with autoload off → 400.
    pub(crate) fn router_model(&self, name: &str) -> Result<Arc<Model>, Refusal> {
        let model = self
            .registry
            .get(name)
            .ok_or_else(|| Refusal::new(400, format!("model '{name}' not found")))?;
        if !self.config.autoload && model.residency() == Residency::Unloaded {
            return Err(Refusal::new(400, "model is not loaded"));
        }
        Ok(Arc::clone(model))
    }
}
