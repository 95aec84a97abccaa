//! Test fixtures: a configuration generation built from TOML, without binding or probing
//! anything, for the unit tests of the lifecycle steps (admit, route, reload).

use std::sync::Arc;

use slotgate_config::Config;
use slotgate_limiter::Limiter;

use crate::metrics::Metrics;
use crate::proxy::live::Generation;
use crate::upstreams::target::Target;

/// A generation with the limiter and metrics it configured.
pub(crate) struct Built {
    pub(crate) generation: Generation,
    pub(crate) limiter: Limiter,
    pub(crate) metrics: Metrics,
}

impl Built {
    /// The first generation of `toml` (which must be valid).
    pub(crate) fn new(toml: &str) -> Self {
        let limiter = Limiter::new();
        let metrics = Metrics::new();
        let generation = Generation::build(config(toml), None, &limiter, &metrics)
            .expect("the test configuration is accepted");
        Self {
            generation,
            limiter,
            metrics,
        }
    }

    /// The next generation, from `toml`, as a reload builds it (the limiter and metrics are
    /// shared; nothing is removed from the limiter).
    pub(crate) fn next(&self, toml: &str) -> Generation {
        Generation::build(
            config(toml),
            Some(&self.generation),
            &self.limiter,
            &self.metrics,
        )
        .expect("the test configuration is accepted")
    }

    /// The target of `model` on `upstream` in this generation.
    pub(crate) fn target(&self, model: &str, upstream: &str) -> Arc<Target> {
        target(&self.generation, model, upstream)
    }
}

/// A valid configuration.
pub(crate) fn config(toml: &str) -> Config {
    Config::from_toml_str(toml).expect("a valid test configuration")
}

/// The target of `model` on `upstream` in `generation`.
pub(crate) fn target(generation: &Generation, model: &str, upstream: &str) -> Arc<Target> {
    let route = generation
        .routes
        .resolve(model)
        .expect("the model is routed");
    let target = route
        .targets
        .iter()
        .find(|t| t.upstream.name == upstream)
        .expect("the model is configured on the upstream");
    Arc::clone(target)
}
