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
//! # Each model's state
//!
//! Besides what is resident, a discovery keeps where each model is in its life, as the engine
//! says it ([`ModelState`]): a router's `status.value` (`loaded`, `loading`, `unloaded`,
//! `sleeping`; an `unloaded` entry with `"failed": true` is `failed`), and every model in
//! Ollama's `/api/ps` as `loaded` (with its `expires_at`, when the `keep_alive` ends). Engines
//! that cannot load on demand report none: what they serve is loaded. A router's own `/props`
//! (no `?model=`, which never loads anything) gives its `max_instances`: how many models it
//! holds at once ([`places`](crate::upstreams::places)).
//!
//! A model seen going from not running to `loading` or `loaded` counts a load
//! (`slotgate_model_loads_total`); when a discovery saw it `loading` first, the time from that
//! discovery to the one that saw it `loaded` is its load time, to within one health-check
//! interval (`slotgate_model_load_seconds_total` / `slotgate_model_loads_timed_total`, and the
//! last one per model on the admin API). A load shorter than the interval is counted, not
//! timed.
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

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

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

/// Where a model is in its life on an engine that loads models on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ModelState {
    /// In memory, serving.
    Loaded,
    /// Being loaded.
    Loading,
    /// Known, not in memory.
    Unloaded,
    /// Running but asleep (`--sleep-idle-seconds`): the next request wakes it without a load.
    Sleeping,
    /// Its last load failed (router: `unloaded` with `"failed": true`).
    Failed,
    /// A state this gateway does not know (`downloading`, …): not running.
    Other,
}

impl ModelState {
    /// The name on the admin API and the status page.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Loaded => "loaded",
            Self::Loading => "loading",
            Self::Unloaded => "unloaded",
            Self::Sleeping => "sleeping",
            Self::Failed => "failed",
            Self::Other => "other",
        }
    }

    /// Holds one of the engine's places (llama.cpp's `is_running`).
    pub(crate) fn is_running(self) -> bool {
        matches!(self, Self::Loaded | Self::Loading | Self::Sleeping)
    }

    fn from_router(value: &str, failed: bool) -> Self {
        match value {
            "loaded" => Self::Loaded,
            "loading" => Self::Loading,
            "sleeping" => Self::Sleeping,
            "unloaded" if failed => Self::Failed,
            "unloaded" => Self::Unloaded,
            _ => Self::Other,
        }
    }
}

/// What a discovery found: the resident names, each model's state where the engine reports
/// one, and how many models it holds at once where it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Discovery {
    /// What is resident (the chooser's view).
    pub(crate) resident: Resident,
    /// Each reported model's state, by the engine's id for it (empty for engines that do not
    /// load on demand).
    pub(crate) states: BTreeMap<String, ModelState>,
    /// Ollama's `expires_at` of each loaded model: when its `keep_alive` ends.
    pub(crate) expires: BTreeMap<String, String>,
    /// A llama-server router's `max_instances` (0: no bound).
    pub(crate) max_instances: Option<usize>,
    /// A llama-server router whose own `/props` did not answer: `max_instances` is not known
    /// (rather than not reported).
    pub(crate) props_unread: bool,
}

impl From<Resident> for Discovery {
    fn from(resident: Resident) -> Self {
        Self {
            resident,
            states: BTreeMap::new(),
            expires: BTreeMap::new(),
            max_instances: None,
            props_unread: false,
        }
    }
}

impl Discovery {
    /// The models holding one of the engine's places.
    pub(crate) fn running(&self) -> impl Iterator<Item = &str> {
        self.states
            .iter()
            .filter(|(_, state)| state.is_running())
            .map(|(name, _)| name.as_str())
    }
}

/// Loads seen by the discoveries of one model.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct Loads {
    /// Loads seen starting.
    pub(crate) count: u64,
    /// Loads timed (seen `loading`, then `loaded`).
    pub(crate) timed: u64,
    /// Their total time.
    pub(crate) seconds: f64,
    /// The last one's time.
    pub(crate) last: Option<Duration>,
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
    /// Each model's state, as last discovered (empty for engines that do not load on demand).
    pub(crate) states: BTreeMap<String, ModelState>,
    /// Ollama's `expires_at` per loaded model.
    pub(crate) expires: BTreeMap<String, String>,
    /// The router's `max_instances`, when it reports one.
    pub(crate) max_instances: Option<usize>,
    /// Loads seen per model.
    pub(crate) loads: BTreeMap<String, Loads>,
    /// When each model loading now was first seen loading.
    loading_since: BTreeMap<String, std::time::Instant>,
    /// When the last discovery ended.
    pub(crate) checked: Option<SystemTime>,
    /// Why the last discovery failed, until one succeeds.
    pub(crate) error: Option<String>,
}

impl ResidencyView {
    /// Counts the loads between the states known and `states`, and times those seen loading.
    fn count_loads(&mut self, states: &BTreeMap<String, ModelState>) {
        let now = std::time::Instant::now();
        for (name, &state) in states {
            let before = self.states.get(name).copied();
            let started = state.is_running()
                && !before.is_some_and(ModelState::is_running)
                // The first discovery finds models already loaded: not loads it saw.
                && self.resident.is_some();
            let loads = self.loads.entry(name.clone()).or_default();
            if started {
                loads.count += 1;
            }
            match state {
                ModelState::Loading => {
                    if started || before == Some(ModelState::Loading) {
                        self.loading_since.entry(name.clone()).or_insert(now);
                    }
                }
                ModelState::Loaded => {
                    if let Some(since) = self.loading_since.remove(name) {
                        let took = now.duration_since(since);
                        loads.timed += 1;
                        loads.seconds += took.as_secs_f64();
                        loads.last = Some(took);
                    }
                }
                _ => {
                    self.loading_since.remove(name);
                }
            }
        }
    }
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

    /// The measured time to load `model` (or its [`tagged_name`]): the average of its timed
    /// loads; `None` before one was timed.
    pub(crate) fn load_time_as(&self, model: &str, tagged: Option<&str>) -> Option<Duration> {
        let state = self.state.read();
        let loads = state
            .loads
            .get(model)
            .filter(|loads| loads.timed > 0)
            .or_else(|| tagged.and_then(|tagged| state.loads.get(tagged)))
            .filter(|loads| loads.timed > 0)?;
        #[expect(
            clippy::cast_precision_loss,
            reason = "a count of loads is far below 2^53"
        )]
        let average = loads.seconds / loads.timed as f64;
        Duration::try_from_secs_f64(average).ok()
    }

    /// A copy of what is known.
    pub(crate) fn view(&self) -> ResidencyView {
        self.state.read().clone()
    }

    /// Records a discovery's result; returns whether the resident set changed.
    pub(crate) fn record<D: Into<Discovery>>(&self, result: Result<D, &ProbeError>) -> bool {
        let mut state = self.state.write();
        state.checked = Some(SystemTime::now());
        match result.map(Into::into) {
            Ok(discovery) => {
                state.error = None;
                state.count_loads(&discovery.states);
                let changed = state.resident.as_ref() != Some(&discovery.resident);
                state.resident = Some(discovery.resident);
                state.states = discovery.states;
                state.expires = discovery.expires;
                state.max_instances = discovery.max_instances;
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
) -> Result<Discovery, ProbeError> {
    match kind {
        Kind::LlamaServer => {
            let list = prober.llama_models(target).await?;
            let mut discovery = Discovery::from(from_llama(&list));
            discovery.states = router_states(&list);
            if !discovery.states.is_empty() {
                // A router: its own `/props` says how many models it holds. Not having it only
                // leaves the bound unknown; the residency stands.
                match prober.llama_router_props(target).await {
                    Ok(props) => discovery.max_instances = props.max_instances,
                    Err(_) => discovery.props_unread = true,
                }
            }
            Ok(discovery)
        }
        Kind::Vllm | Kind::OpenAi => prober
            .openai_models(target)
            .await
            .map(|list| Resident::Names(all_names(&list)).into()),
        Kind::Ollama => prober.ollama_ps(target).await.map(|ps| {
            let mut discovery = Discovery::from(Resident::Names(
                ps.models
                    .iter()
                    .flat_map(|m| std::iter::once(&m.name).chain(m.model.as_ref()))
                    .map(|name| ollama_name(name))
                    .collect(),
            ));
            for model in &ps.models {
                let name = ollama_name(&model.name);
                if let Some(expires) = &model.expires_at {
                    discovery.expires.insert(name.clone(), expires.clone());
                }
                discovery.states.insert(name, ModelState::Loaded);
            }
            discovery
        }),
    }
}

/// A router's states by model id; empty for a single-model server (no `status`).
fn router_states(list: &ModelList) -> BTreeMap<String, ModelState> {
    list.data
        .iter()
        .filter_map(|card| {
            let status = card.status.as_ref()?;
            let state = ModelState::from_router(&status.value, status.failed);
            Some((card.id.clone(), state))
        })
        .collect()
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

    use super::{Discovery, ModelState, Residency, Resident, from_llama, router_states};
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
        assert!(!residency.record::<Resident>(Err(&timeout)));
        assert!(residency.is_loaded(Kind::Vllm, "a"));
        assert_eq!(
            residency.view().error.as_deref(),
            Some("no answer within 2s")
        );
        assert!(!residency.record(Ok(Resident::Names(["a".to_owned()].into()))));
        assert_eq!(residency.view().error, None);
    }

    #[test]
    fn router_states_and_the_loads_seen() {
        let listing = |a: &str, b: &str| {
            let list = list(&format!(
                r#"{{"data":[{{"id":"a","status":{{"value":"{a}"}}}},
                   {{"id":"b","status":{{"value":"{b}","failed":{}}}}}]}}"#,
                b == "unloaded"
            ));
            let mut discovery = Discovery::from(from_llama(&list));
            discovery.states = router_states(&list);
            discovery
        };
        let residency = Residency::new();
        residency.record(Ok(listing("loaded", "unloaded")));
        let view = residency.view();
        assert_eq!(view.states["a"], ModelState::Loaded);
        assert_eq!(view.states["b"], ModelState::Failed);
        assert_eq!(
            view.loads["a"].count, 0,
            "loaded before the first discovery"
        );
        residency.record(Ok(listing("unloaded", "loading")));
        residency.record(Ok(listing("unloaded", "loaded")));
        residency.record(Ok(listing("loaded", "unloaded")));
        let view = residency.view();
        assert_eq!(view.loads["b"].count, 1);
        assert_eq!(view.loads["b"].timed, 1, "seen loading, then loaded");
        assert!(view.loads["b"].last.is_some());
        assert_eq!(
            residency.load_time_as("b", None),
            view.loads["b"].last,
            "one timed load: its time"
        );
        assert_eq!(
            residency.load_time_as("b:latest", Some("b")),
            view.loads["b"].last,
            "by the tagged name"
        );
        assert_eq!(residency.load_time_as("a", None), None, "never timed");
        assert_eq!(
            view.loads["a"].count, 1,
            "seen loaded without loading: counted"
        );
        assert_eq!(view.loads["a"].timed, 0, "not timed");
        assert_eq!(view.states["b"], ModelState::Failed);
    }
}
