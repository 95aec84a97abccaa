//! Every `examples/*.toml` at the repository root loads and validates, so they cannot rot.

use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::Figment;
use figment::providers::{Format as _, Toml};
use slotgate_config::{Config, Kind, ModelLimits};

fn examples_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples")
}

/// Loads a sample from its file, without the environment (which the test does not control).
fn load(path: &Path) -> Config {
    Config::from_figment(&Figment::from(Toml::file_exact(path)))
        .unwrap_or_else(|error| panic!("{} is invalid:\n{error}", path.display()))
}

#[test]
fn every_example_config_is_valid() {
    let mut loaded = Vec::new();
    for entry in std::fs::read_dir(examples_dir()).expect("examples/ exists") {
        let path = entry.expect("readable directory entry").path();
        if path.extension().is_some_and(|ext| ext == "toml") {
            let config = load(&path);
            // The effective rendering of every sample is itself a valid config.
            Config::from_toml_str(&config.to_effective_toml()).unwrap_or_else(|error| {
                panic!(
                    "effective config of {} is invalid:\n{error}",
                    path.display()
                )
            });
            loaded.push(path);
        }
    }
    assert!(
        loaded.len() >= 3,
        "expected at least the three samples, found {loaded:?}"
    );
}

#[test]
fn demo_serves_tiny_llama_from_two_llama_servers() {
    let config = load(&examples_dir().join("demo.toml"));
    assert_eq!(config.server.listen, "127.0.0.1:8080".parse().unwrap());
    assert_eq!(
        config.server.admin_listen,
        Some("127.0.0.1:9090".parse().unwrap())
    );
    assert_eq!(config.resolve_model("demo"), Some("tiny-llama"));
    let candidates = config.candidates("tiny-llama");
    let authorities: Vec<_> = candidates.iter().map(|u| u.authority()).collect();
    assert_eq!(
        authorities,
        ["http://127.0.0.1:18081", "http://127.0.0.1:18082"]
    );
    for upstream in candidates {
        assert_eq!(upstream.kind, Kind::LlamaServer);
        assert_eq!(
            upstream.models["tiny-llama"],
            ModelLimits::Limited {
                parallel: 2,
                queue: 4,
                queue_timeout: Duration::from_secs(10),
                capacity: None,
            }
        );
    }
}

#[test]
fn single_llama_has_one_llama_server_with_four_slots() {
    let config = load(&examples_dir().join("single-llama.toml"));
    assert_eq!(config.upstreams.len(), 1);
    let upstream = config.upstreams.values().next().unwrap();
    assert_eq!(upstream.kind, Kind::LlamaServer);
    assert!(!upstream.models.is_empty(), "a model to serve");
    assert!(
        upstream
            .models
            .values()
            .all(|limits| limits.parallel() == Some(4))
    );
}

#[test]
fn kserve_vllm_has_the_design_example_and_an_alias() {
    let config = load(&examples_dir().join("kserve-vllm.toml"));
    assert!(config.upstreams.len() >= 2);
    let reasoning = &config.upstreams["reasoning"];
    assert_eq!(reasoning.kind, Kind::Vllm);
    assert_eq!(
        reasoning.authority(),
        "http://reasoning-predictor.llm-serving:80"
    );
    assert_eq!(
        reasoning.models["reasoning"],
        ModelLimits::Limited {
            parallel: 6,
            queue: 8,
            queue_timeout: Duration::from_secs(30),
            capacity: Some(8),
        }
    );
    assert!(!config.aliases.is_empty());
}
