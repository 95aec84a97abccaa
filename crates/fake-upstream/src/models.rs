//! The models a fake serves and whether each is resident. A single-model llama-server and vLLM
//! always have theirs loaded; llama-server's router and Ollama load models on demand, taking
//! [`FakeConfig::model_load_delay`](crate::FakeConfig::model_load_delay), and tests can load and
//! unload them through the handle to exercise residency discovery.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
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
    /// `--sleep-idle-seconds`: still running, woken by the next request without a load.
    Sleeping,
}

impl Residency {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Unloaded => "unloaded",
            Self::Loading => "loading",
            Self::Loaded => "loaded",
            Self::Sleeping => "sleeping",
        }
    }

    /// llama.cpp's `is_running`: holds one of the `--models-max` places.
    pub(crate) fn is_running(self) -> bool {
        self != Self::Unloaded
    }
}

/// A load that ended without the model (the real child exits non-zero).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct LoadFailed;

/// One served model.
pub(crate) struct Model {
    pub(crate) name: String,
    pub(crate) pool: Arc<SlotPool>,
    residency: watch::Sender<Residency>,
    /// When it last loaded or served a request; Ollama's `/api/ps` sorts by it, and the
    /// `--models-max` eviction picks the oldest.
    last_used: Mutex<Instant>,
    /// Requests between naming this model and holding a slot on it: such a model is never
    /// evicted (llama.cpp skips a model a queued request wants).
    wanted: AtomicUsize,
    /// Loads started, for tests and benchmarks counting swaps.
    loads: AtomicU64,
    /// Set by the handle: the next load fails (`status.failed`, `exit_code` 1).
    fail_next_load: AtomicBool,
    /// The last load failed; cleared by the next load.
    failed: AtomicBool,
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

    /// Whether the last load failed (the router shows `"failed": true, "exit_code": 1`).
    pub(crate) fn failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// Loads started since the server started (not counting wake-ups from sleep).
    pub(crate) fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// Makes the next load fail.
    pub(crate) fn fail_next_load(&self) {
        self.fail_next_load.store(true, Ordering::Relaxed);
    }

    /// Unloads the model at once; false if it was not running. Requests already running on it
    /// finish normally.
    pub(crate) fn unload(&self) -> bool {
        self.residency.send_if_modified(|r| {
            let running = r.is_running();
            *r = Residency::Unloaded;
            running
        })
    }

    /// Puts a loaded model to sleep (`--sleep-idle-seconds`); false if it was not loaded.
    pub(crate) fn sleep(&self) -> bool {
        self.residency.send_if_modified(|r| {
            let loaded = *r == Residency::Loaded;
            if loaded {
                *r = Residency::Sleeping;
            }
            loaded
        })
    }

    pub(crate) fn touch(&self) {
        *self.last_used.lock() = Instant::now();
    }

    pub(crate) fn last_used(&self) -> Instant {
        *self.last_used.lock()
    }

    /// Whether `--models-max` may evict it: running and ready, nothing running on it, nobody
    /// waiting for it.
    fn is_idle(&self) -> bool {
        matches!(self.residency(), Residency::Loaded | Residency::Sleeping)
            && self.pool.running() == 0
            && self.pool.waiting() == 0
            && self.wanted.load(Ordering::Acquire) == 0
    }
}

/// Marks a model wanted from when a request names it until it holds a slot there (then the
/// slot itself keeps the model from being evicted).
pub(crate) struct Wanted(Arc<Model>);

impl Wanted {
    pub(crate) fn new(model: &Arc<Model>) -> Self {
        model.wanted.fetch_add(1, Ordering::AcqRel);
        Self(Arc::clone(model))
    }
}

impl Drop for Wanted {
    fn drop(&mut self) {
        self.0.wanted.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How often a load that found every place taken looks again for a model that became idle (a
/// request ending does not signal the registry; this is the fake, a short poll is enough).
const CAPACITY_POLL: Duration = Duration::from_millis(5);

/// Every model of one fake server.
#[derive(Debug)]
pub(crate) struct Registry {
    kind: Kind,
    models: Vec<Arc<Model>>,
    load_delay: Duration,
    /// `--models-max`; 0: no bound.
    models_max: usize,
    /// Serialises the count-evict-start of loads, as the router's mutex does.
    places: Mutex<()>,
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
                    wanted: AtomicUsize::new(0),
                    loads: AtomicU64::new(0),
                    fail_next_load: AtomicBool::new(false),
                    failed: AtomicBool::new(false),
                })
            })
            .collect();
        Self {
            kind: config.kind,
            models,
            load_delay: config.model_load_delay,
            models_max: if on_demand { config.models_max } else { 0 },
            places: Mutex::new(()),
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

    /// The `--models-max` bound (0: none).
    pub(crate) fn models_max(&self) -> usize {
        self.models_max
    }

    /// The model of this name, normalised the kind's way.
    pub(crate) fn get(&self, name: &str) -> Option<&Arc<Model>> {
        let name = normalise_model_name(self.kind, name);
        self.models.iter().find(|m| m.name == name)
    }

    /// Starts loading `model` if it is unloaded and a place is free, evicting the least
    /// recently used idle model when all `models_max` places are taken; true if this call
    /// started it. False also when every place is held by a busy model: the caller waits. The
    /// load runs in its own task, so it completes even if the request that caused it goes away
    /// (as the real servers' loads do).
    pub(crate) fn start_load(&self, model: &Arc<Model>) -> bool {
        let _places = self.places.lock();
        if model.residency().is_running() {
            return false;
        }
        if self.models_max > 0 {
            let running = self
                .models
                .iter()
                .filter(|m| m.residency().is_running())
                .count();
            if running >= self.models_max {
                let victim = self
                    .models
                    .iter()
                    .filter(|m| !Arc::ptr_eq(m, model) && m.is_idle())
                    .min_by_key(|m| m.last_used());
                match victim {
                    Some(victim) => {
                        victim.unload();
                    }
                    None => return false,
                }
            }
        }
        model.residency.send_replace(Residency::Loading);
        model.loads.fetch_add(1, Ordering::Relaxed);
        model.failed.store(false, Ordering::Relaxed);
        let model = Arc::clone(model);
        let delay = self.load_delay;
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let fail = model.fail_next_load.swap(false, Ordering::Relaxed);
            model.residency.send_if_modified(|r| {
                // An unload during the load wins.
                let loading = *r == Residency::Loading;
                if loading {
                    *r = if fail {
                        Residency::Unloaded
                    } else {
                        Residency::Loaded
                    };
                }
                loading
            });
            model.failed.store(fail, Ordering::Relaxed);
            model.touch();
        });
        true
    }

    /// Loads `model` if needed (waking it if asleep) and waits until it is resident; waits for
    /// a free place first when `models_max` are taken by busy models.
    pub(crate) async fn ensure_loaded(&self, model: &Arc<Model>) -> Result<(), LoadFailed> {
        let _wanted = Wanted::new(model);
        let mut residency = model.residency.subscribe();
        let mut loading = false;
        loop {
            // Copied out first: holding the borrow while `start_load` writes would deadlock.
            let now = *residency.borrow_and_update();
            match now {
                Residency::Loaded => return Ok(()),
                Residency::Sleeping => {
                    model.residency.send_if_modified(|r| {
                        let asleep = *r == Residency::Sleeping;
                        if asleep {
                            *r = Residency::Loaded;
                        }
                        asleep
                    });
                    continue;
                }
                Residency::Unloaded if loading && model.failed() => return Err(LoadFailed),
                Residency::Unloaded => {
                    if !self.start_load(model) {
                        // Every place is busy: look again shortly (or when this model changes).
                        tokio::select! {
                            _ = residency.changed() => {}
                            () = tokio::time::sleep(CAPACITY_POLL) => {}
                        }
                        continue;
                    }
                }
                Residency::Loading => {}
            }
            loading = true;
            // The sender lives in the model, which we hold.
            if residency.changed().await.is_err() {
                return Ok(());
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
        assert_eq!((first, second), (Ok(()), Ok(())));
        assert!(model.is_loaded());
        assert!(!registry.start_load(&model), "already loaded");
        assert_eq!(model.loads(), 1, "two waiters share one load");
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
