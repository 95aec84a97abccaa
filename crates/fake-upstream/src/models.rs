//! The models a fake serves and whether each is resident. A single-model llama-server and vLLM
//! always have theirs loaded; llama-server's router and Ollama load models on demand, taking
//! [`FakeConfig::model_load_delay`](crate::FakeConfig::model_load_delay), and tests can load and
//! unload them through the handle to exercise residency discovery.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::config::{FakeConfig, Kind, ModelSpec, normalise_model_name};
use crate::slots::SlotPool;

/// Where a model is in its life (llama-server router `status.value`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Residency {
    Unloaded,
    Loading,
    Loaded,
}

impl Residency {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Unloaded => "unloaded",
            Self::Loading => "loading",
            Self::Loaded => "loaded",
        }
    }
}

/// One served model.
pub(crate) struct Model {
    pub(crate) name: String,
    pub(crate) pool: Arc<SlotPool>,
    residency: watch::Sender<Residency>,
    /// When it last loaded or served a request; Ollama's `/api/ps` sorts by it.
    last_used: Mutex<Instant>,
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("name", &self.name)
            .field("residency", &self.residency())
            .finish_non_exhaustive()
    }
}

impl Model {
    pub(crate) fn residency(&self) -> Residency {
        *self.residency.borrow()
    }

    pub(crate) fn is_loaded(&self) -> bool {
        self.residency() == Residency::Loaded
    }

    /// Unloads the model at once; false if it was not loaded or loading. Requests already
    /// running on it finish normally.
    pub(crate) fn unload(&self) -> bool {
        self.residency.send_if_modified(|r| {
            let running = *r != Residency::Unloaded;
            *r = Residency::Unloaded;
            running
        })
    }

    pub(crate) fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    pub(crate) fn last_used(&self) -> Instant {
        *self.last_used.lock()
    }
}

/// Every model of one fake server.
#[derive(Debug)]
pub(crate) struct Registry {
    kind: Kind,
    models: Vec<Arc<Model>>,
    load_delay: Duration,
}

impl Registry {
    pub(crate) fn new(config: &FakeConfig) -> Self {
        let specs = config.effective_models();
        // vLLM runs one engine: adapters share the base model's `max_num_seqs`.
        let shared = (config.kind == Kind::Vllm)
            .then(|| SlotPool::new(config.parallel, false, config.cache_spec()));
        let on_demand = config.router || config.kind == Kind::Ollama;
        let models = specs
            .into_iter()
            .map(|ModelSpec { name, loaded }| {
                let pool = shared.clone().unwrap_or_else(|| {
                    SlotPool::new(config.parallel, config.collapse, config.cache_spec())
                });
                let residency = if loaded || !on_demand {
                    Residency::Loaded
                } else {
                    Residency::Unloaded
                };
                Arc::new(Model {
                    name,
                    pool,
                    residency: watch::Sender::new(residency),
                    last_used: Mutex::new(Instant::now()),
                })
            })
            .collect();
        Self {
            kind: config.kind,
            models,
            load_delay: config.model_load_delay,
        }
    }

    /// All models, in configuration order.
    pub(crate) fn all(&self) -> &[Arc<Model>] {
        &self.models
    }

    /// The first model: the one a single-model server serves.
    pub(crate) fn primary(&self) -> &Arc<Model> {
        &self.models[0]
    }

    /// The model of this name, normalised the kind's way.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Model>> {
        let name = normalise_model_name(self.kind, name);
        self.models.iter().find(|m| m.name == name)
    }

    /// Starts loading `model` unless it is loaded or loading; true if this call started it. The
    /// load runs in its own task, so it completes even if the request that caused it goes away
    /// (as the real servers' loads do).
    pub(crate) fn start_load(&self, model: &Arc<Model>) -> bool {
        let started = model.residency.send_if_modified(|r| {
            let idle = *r == Residency::Unloaded;
            if idle {
                *r = Residency::Loading;
            }
            idle
        });
        if started {
            let model = Arc::clone(model);
            let delay = self.load_delay;
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                model.residency.send_if_modified(|r| {
                    // An unload during the load wins.
                    let loading = *r == Residency::Loading;
                    if loading {
                        *r = Residency::Loaded;
                    }
                    loading
                });
                model.touch();
            });
        }
        started
    }

    /// Loads `model` if needed and waits until it is resident.
    pub(crate) async fn ensure_loaded(&self, model: &Arc<Model>) {
        let mut residency = model.residency.subscribe();
        loop {
            // Copied out first: holding the borrow while `start_load` writes would deadlock.
            let now = *residency.borrow_and_update();
            match now {
                Residency::Loaded => return,
                Residency::Unloaded => {
                    self.start_load(model);
                }
                Residency::Loading => {}
            }
            // The sender lives in the model, which we hold.
            if residency.changed().await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn loads_on_demand_once() {
        let config = FakeConfig::ollama(1)
            .unloaded_model("a")
            .model_load_delay(Duration::from_secs(5));
        let registry = Registry::new(&config);
        let model = Arc::clone(registry.get("a").expect("normalised to a:latest"));
        assert_eq!(model.residency(), Residency::Unloaded);
        let (first, second) = tokio::join!(
            registry.ensure_loaded(&model),
            registry.ensure_loaded(&model)
        );
        let ((), ()) = (first, second);
        assert!(model.is_loaded());
        assert!(!registry.start_load(&model), "already loaded");
        assert!(model.unload());
        assert!(!model.unload());
    }

    #[test]
    fn vllm_adapters_share_the_engine() {
        let registry = Registry::new(&FakeConfig::vllm(2).model("base").model("lora"));
        let [base, lora] = registry.all() else {
            panic!("two models")
        };
        assert!(Arc::ptr_eq(&base.pool, &lora.pool));
        assert!(lora.is_loaded());
    }
}
