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
        // As the check before serving finds single-model engines: no bound of their own, so a
        // llama-server's requests are not held for one.
        for upstream in generation.upstreams.iter() {
            upstream
                .places
                .report(crate::upstreams::places::gate::BoundRead::Read(None), 1);
        }
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

/// An empty cache-aware router with `generation`'s `[server]` affinity settings.
pub(crate) fn cache(generation: &Generation) -> Arc<crate::proxy::cache_aware::CacheAware> {
    Arc::new(crate::proxy::cache_aware::CacheAware::new(
        &generation.config.server.cache_affinity,
        std::time::Instant::now(),
    ))
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

/// A request to `path` with the JSON `body`, read and routed in `generation` as the request
/// path does it (an anonymous client, no deadlines, no access log).
pub(crate) async fn routed(
    generation: Arc<Generation>,
    path: &str,
    body: &str,
) -> crate::proxy::choose::Routed {
    use crate::proxy::access::Access;
    use crate::proxy::choose::Routed;
    use crate::proxy::client::{Client, Deadlines};
    use crate::proxy::endpoint::Endpoint;
    use crate::proxy::request::{self, BodyBudget, BodyLimits};

    let endpoint = Endpoint::find(path).expect("a model-routed endpoint");
    let req = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(
            body.to_owned(),
        )))
        .expect("a valid request");
    let budget = BodyBudget::new(1 << 20, &Metrics::new());
    let limits = BodyLimits {
        max_bytes: 1 << 20,
        timeout: std::time::Duration::from_secs(5),
        budget: &budget,
    };
    let api = request::read(req, limits, endpoint)
        .await
        .expect("a valid body");
    let route = Routed::resolve(&generation, endpoint, &api).expect("a routed model");
    Routed {
        generation,
        route,
        endpoint,
        api,
        client: Client::anonymous(),
        deadlines: Deadlines::read(&http::HeaderMap::new(), tokio::time::Instant::now())
            .expect("no deadline headers"),
        request_id: http::HeaderValue::from_static("req-1"),
        access: Access::default(),
    }
}
