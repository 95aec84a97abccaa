//! Which models an upstream has resident (loaded in memory) now, so a request goes where its
//! model is warm instead of waiting seconds to minutes for a load.
//!
//! # Discovery, per kind
//!
//! | kind | probe | resident |
//! |---|---|---|
//! | `llama-server`, router mode | `GET /models` | the entries whose `status.value` is `loaded` (not `loading`, `sleeping`, `unloaded`, …) |
//! | `llama-server`, one model | `GET /models` (one entry, no `status`) | every model configured on the upstream: a single-model server answers whatever `model` a request names with the one it has |
//! | `vllm`, `openai` | `GET /v1/models` | every listed id (vLLM cannot load on demand: what it lists is what it runs) |
//! | `ollama` | `GET /api/ps` | every listed name; a configured name without a tag matches `:latest`, as Ollama resolves it |
//!
//! An entry's `aliases` count as names of the same model. Discovery runs after each successful
//! health check (`server.health_check_interval`).
//!
//! # What the chooser is told
//!
//! Every configured model of an upstream `can_serve` (the operator configured it there; an
//! engine that lacks it answers the request itself, with its own error). It is `loaded` when the
//! last discovery listed it as resident. Until the first discovery answers, or when an upstream
//! has never answered one, nothing counts as loaded: all candidates then compete in the same
//! (second) pass of `slotgate-choose` on free slots and weight, which is exactly the behaviour
//! without residency information. A failed discovery keeps the last known answer: models do not
//! change residency because one probe was lost.

use std::collections::BTreeSet;
use std::time::SystemTime;

use parking_lot::RwLock;
use slotgate_config::Kind;

use crate::error::chain;
use crate::upstreams::probe::{ModelCard, ModelList, ProbeError, ProbeTarget, Prober};

/// What a discovery found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Resident {
    /// A single-model llama-server: it serves its one model under any name, so every model
    /// configured on it counts as loaded. `names` is what it calls that model.
    Everything {
        /// The id and aliases it reports.
        names: Vec<String>,
    },
    /// Exactly these names (ids and aliases; Ollama names with their tag) are resident.
    Names(BTreeSet<String>),
}

impl Resident {
    /// The names the upstream reported.
    pub(crate) fn names(&self) -> Vec<String> {
        match self {
            Resident::Everything { names } => names.clone(),
            Resident::Names(names) => names.iter().cloned().collect(),
        }
    }
}

/// One upstream's resident models, as last discovered.
#[derive(Debug, Default)]
pub(crate) struct Residency {
    state: RwLock<ResidencyView>,
}

/// A copy of what is known, for the admin API.
#[derive(Debug, Default, Clone)]
pub(crate) struct ResidencyView {
    /// The last successful discovery's answer; `None` before the first.
    pub(crate) resident: Option<Resident>,
    /// When the last discovery ended.
    pub(crate) checked: Option<SystemTime>,
    /// Why the last discovery failed, until one succeeds.
    pub(crate) error: Option<String>,
}

impl Residency {
    /// Nothing known yet.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Whether `model` (a configured model name) is resident on an upstream of `kind`.
    /// `false` while nothing is known. Only the tests ask by kind: the gateway works the tagged
    /// name out once per target and asks [`Residency::is_loaded_as`].
    #[cfg(test)]
    pub(crate) fn is_loaded(&self, kind: Kind, model: &str) -> bool {
        self.is_loaded_as(model, tagged_name(kind, model).as_deref())
    }

    /// Whether `model` or its [`tagged_name`] (worked out beforehand: the routing table keeps
    /// it per target, so that routing a request allocates nothing) is resident.
    pub(crate) fn is_loaded_as(&self, model: &str, tagged: Option<&str>) -> bool {
        match &self.state.read().resident {
            None => false,
            Some(Resident::Everything { .. }) => true,
            Some(Resident::Names(names)) => {
                names.contains(model) || tagged.is_some_and(|tagged| names.contains(tagged))
            }
        }
    }

    /// A copy of what is known.
    pub(crate) fn view(&self) -> ResidencyView {
        self.state.read().clone()
    }

    /// Records a discovery's result; returns whether the resident set changed.
    pub(crate) fn record(&self, result: Result<Resident, &ProbeError>) -> bool {
        let mut state = self.state.write();
        state.checked = Some(SystemTime::now());
        match result {
            Ok(resident) => {
                state.error = None;
                let changed = state.resident.as_ref() != Some(&resident);
                state.resident = Some(resident);
                changed
            }
            Err(error) => {
                state.error = Some(chain(error));
                false
            }
        }
    }
}

/// Asks an upstream of `kind` which models it has resident (see the [module docs](self)).
pub(crate) async fn discover(
    prober: &Prober,
    kind: Kind,
    target: ProbeTarget<'_>,
) -> Result<Resident, ProbeError> {
    match kind {
        Kind::LlamaServer => prober
            .llama_models(target)
            .await
            .map(|list| from_llama(&list)),
        Kind::Vllm | Kind::OpenAi => prober
            .openai_models(target)
            .await
            .map(|list| Resident::Names(all_names(&list))),
        Kind::Ollama => prober.ollama_ps(target).await.map(|ps| {
            Resident::Names(
                ps.models
                    .iter()
                    .flat_map(|m| std::iter::once(&m.name).chain(m.model.as_ref()))
                    .map(|name| ollama_name(name))
                    .collect(),
            )
        }),
    }
}

/// llama-server's `/models`: a router marks each entry with a `status`; a single-model server
/// lists its one model without one.
fn from_llama(list: &ModelList) -> Resident {
    if list.data.iter().all(|card| card.status.is_none()) {
        // A real server repeats its `--alias` in `aliases` (`"id":"tiny","aliases":["tiny"]`):
        // each name once, in the order reported.
        let mut names: Vec<String> = Vec::new();
        for name in list.data.iter().flat_map(ModelCard::names) {
            if !names.iter().any(|known| known == name) {
                names.push(name.to_owned());
            }
        }
        return Resident::Everything { names };
    }
    Resident::Names(
        list.data
            .iter()
            .filter(|card| card.status.as_ref().is_some_and(|s| s.value == "loaded"))
            .flat_map(|card| card.names().map(str::to_owned))
            .collect(),
    )
}

fn all_names(list: &ModelList) -> BTreeSet<String> {
    list.data
        .iter()
        .flat_map(|card| card.names().map(str::to_owned))
        .collect()
}

/// The other name under which a configured `model` shows as resident on an upstream of `kind`:
/// on Ollama, `model:latest` when `model` has no tag; `None` otherwise.
pub(crate) fn tagged_name(kind: Kind, model: &str) -> Option<String> {
    (kind == Kind::Ollama && !model.contains(':')).then(|| ollama_name(model))
}

/// Ollama resolves a name without a tag to `:latest`.
fn ollama_name(name: &str) -> String {
    if name.contains(':') {
        name.to_owned()
    } else {
        format!("{name}:latest")
    }
}

#[cfg(test)]
mod tests {
    use slotgate_config::Kind;

    use std::time::Duration;

    use super::{Residency, Resident, from_llama};
    use crate::upstreams::probe::{ModelList, ProbeError};

    fn list(json: &str) -> ModelList {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_router_lists_only_loaded_entries_as_resident() {
        let resident = from_llama(&list(
            r#"{"data":[
              {"id":"a","status":{"value":"loaded"}},
              {"id":"b","aliases":["bee"],"status":{"value":"loaded"}},
              {"id":"c","status":{"value":"loading"}},
              {"id":"d","status":{"value":"sleeping"}},
              {"id":"e","status":{"value":"unloaded","failed":true}}]}"#,
        ));
        let residency = Residency::new();
        assert!(!residency.is_loaded(Kind::LlamaServer, "a"), "unknown yet");
        assert!(residency.record(Ok(resident)));
        for (model, loaded) in [
            ("a", true),
            ("b", true),
            ("bee", true),
            ("c", false),
            ("d", false),
            ("e", false),
            ("zz", false),
        ] {
            assert_eq!(
                residency.is_loaded(Kind::LlamaServer, model),
                loaded,
                "{model}"
            );
        }
    }

    #[test]
    fn a_single_model_server_has_every_configured_model_loaded() {
        let resident = from_llama(&list(r#"{"data":[{"id":"/models/x.gguf","aliases":[]}]}"#));
        assert_eq!(
            resident,
            Resident::Everything {
                names: vec!["/models/x.gguf".into()]
            }
        );
        let residency = Residency::new();
        residency.record(Ok(resident));
        assert!(residency.is_loaded(Kind::LlamaServer, "whatever-it-is-called-here"));
        // As llama-server answers with `--alias tiny`: the alias is listed once.
        let resident = from_llama(&list(r#"{"data":[{"id":"tiny","aliases":["tiny"]}]}"#));
        assert_eq!(resident.names(), ["tiny"]);
    }

    #[test]
    fn ollama_names_match_with_their_default_tag() {
        let residency = Residency::new();
        residency.record(Ok(Resident::Names(
            ["llama3:latest".to_owned(), "qwen:7b".to_owned()].into(),
        )));
        assert!(residency.is_loaded(Kind::Ollama, "llama3"));
        assert!(residency.is_loaded(Kind::Ollama, "llama3:latest"));
        assert!(residency.is_loaded(Kind::Ollama, "qwen:7b"));
        assert!(!residency.is_loaded(Kind::Ollama, "qwen"));
        // Only Ollama resolves tags.
        assert!(!residency.is_loaded(Kind::Vllm, "llama3"));
    }

    #[test]
    fn a_failed_discovery_keeps_the_last_answer() {
        let residency = Residency::new();
        residency.record(Ok(Resident::Names(["a".to_owned()].into())));
        let timeout = ProbeError::Timeout(Duration::from_secs(2));
        assert!(!residency.record(Err(&timeout)));
        assert!(residency.is_loaded(Kind::Vllm, "a"));
        assert_eq!(
            residency.view().error.as_deref(),
            Some("no answer within 2s")
        );
        assert!(!residency.record(Ok(Resident::Names(["a".to_owned()].into()))));
        assert_eq!(residency.view().error, None);
    }
}
