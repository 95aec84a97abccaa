//! The `[upstreams.NAME.models.MODEL]` tables: each model's limits (`parallel`, `queue`,
//! `queue_timeout`, `capacity`), the name its engine knows it by, how its queue serves waiters,
//! and whether cache-aware routing may place it.

use std::collections::{BTreeMap, BTreeSet};

use figment::value::{Dict, Value};

use super::{optional, required};
use crate::queueing::{Queueing, QueueingKeys};
use crate::raw::{KeyPath, Reader};
use crate::types::{Kind, ModelLimits};
use crate::values::on_off;

/// A model table's keys: its limits and engine name, the queueing keys, then `affinity`.
fn model_keys() -> Vec<&'static str> {
    let mut keys = vec![
        "parallel",
        "queue",
        "queue_timeout",
        "capacity",
        "engine_model",
    ];
    keys.extend(QueueingKeys::names());
    keys.push("affinity");
    keys
}

/// The model keys that only mean something for a model that queues.
fn queueing_keys() -> Vec<&'static str> {
    let mut keys = vec!["queue", "queue_timeout", "capacity"];
    keys.extend(QueueingKeys::names());
    keys
}

const UNLIMITED: &str = "unlimited";
const AUTO: &str = "auto";

/// The models of one upstream, the names their engine knows them by, and how they queue.
pub(super) type Models = (
    BTreeMap<String, ModelLimits>,
    BTreeMap<String, String>,
    BTreeMap<String, Queueing>,
    BTreeSet<String>,
);

/// `kind` is the upstream's, when it could be read (`parallel = "auto"` depends on it).
pub(super) fn models(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: &Value,
    dict: &Dict,
    kind: Option<Kind>,
) -> Option<Models> {
    if dict.is_empty() {
        r.invalid(path, value, "at least one model is required");
        return None;
    }
    let mut built = Some((
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeSet::new(),
    ));
    // Engine name → the configured model that uses it: two models that send the same name to
    // one engine would be one model there, counted against two limits.
    let mut engine_names: BTreeMap<String, &str> = BTreeMap::new();
    for (name, value) in dict {
        let model_path = path.key(name);
        if name.is_empty() {
            r.issue(&model_path, "a model name must not be empty");
            built = None;
        }
        let engine_model = engine_model(r, &model_path, value);
        let engine_name = match &engine_model {
            EngineModel::Named(engine) => engine.as_str(),
            EngineModel::Absent | EngineModel::Invalid => name.as_str(),
        };
        if let Some(first) = engine_names.insert(engine_name.to_owned(), name) {
            let message = format!(
                "models {first:?} and {name:?} both reach this engine as {engine_name:?}; \
                 configure the engine's model once (use [aliases] for a second client name)"
            );
            r.issue(&model_path, message);
            built = None;
        }
        match (
            built.as_mut(),
            model_limits(r, &model_path, value, kind),
            engine_model,
            queueing(r, &model_path, value),
            model_affinity(r, &model_path, value),
        ) {
            (_, _, EngineModel::Invalid, _, _)
            | (None, _, _, _, _)
            | (_, None, _, _, _)
            | (_, _, _, None, _)
            | (_, _, _, _, None) => {
                built = None;
            }
            (
                Some((limits_map, engines, queues, affinity_off)),
                Some(limits),
                engine,
                Some(queueing),
                Some(affinity),
            ) => {
                if !affinity {
                    affinity_off.insert(name.clone());
                }
                limits_map.insert(name.clone(), limits);
                if let EngineModel::Named(engine) = engine {
                    engines.insert(name.clone(), engine);
                }
                if !limits.is_unlimited() {
                    queues.insert(name.clone(), queueing);
                }
            }
        }
    }
    built
}

/// The model table's `affinity` (`"on"` when absent).
fn model_affinity(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<bool> {
    // Not a table: `model_limits` reports it.
    let Value::Dict(_, t) = value else {
        return Some(true);
    };
    optional(r, t, path, "affinity", true, on_off)
}

/// What a model table's `engine_model` said.
enum EngineModel {
    /// Absent: the engine knows the model by its own name.
    Absent,
    /// The engine's name for the model.
    Named(String),
    /// Not a non-empty string (already reported).
    Invalid,
}

/// The model table's `engine_model`.
fn engine_model(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> EngineModel {
    // Not a table: `model_limits` reports it.
    let Value::Dict(_, table) = value else {
        return EngineModel::Absent;
    };
    let Some(v) = table.get("engine_model") else {
        return EngineModel::Absent;
    };
    let key = path.key("engine_model");
    let Some(text) = r.string(&key, v) else {
        return EngineModel::Invalid;
    };
    if text.is_empty() {
        r.invalid(
            &key,
            v,
            "must not be empty; leave it out to send the model's own name",
        );
        return EngineModel::Invalid;
    }
    EngineModel::Named(text.to_owned())
}

/// The model table's queueing keys (declared in [`crate::queueing`]), defaults for those
/// absent; `None` when any is wrong (reported). Whether they are allowed at all (not with
/// `parallel = "unlimited"`) is `model_limits`' business.
fn queueing(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Queueing> {
    // Not a table: `model_limits` reports it.
    let Value::Dict(_, t) = value else {
        return Some(Queueing::default());
    };
    QueueingKeys::read(r, t, path).build()
}

/// What `parallel` said.
enum Parallel {
    Slots(usize),
    Unlimited,
    Auto,
    /// Missing or wrong (already reported); the other keys are still checked as if limited.
    Invalid,
}

fn model_limits(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: &Value,
    kind: Option<Kind>,
) -> Option<ModelLimits> {
    let t = r.table(path, value, &model_keys())?;
    let parallel_path = path.key("parallel");
    let parallel = match t.get("parallel") {
        None => {
            r.missing(
                &parallel_path,
                r#"the number of concurrent slots, an integer of at least 1, "auto" (llama-server), or "unlimited""#,
            );
            Parallel::Invalid
        }
        Some(v @ Value::String(_, text)) => match text.as_str() {
            UNLIMITED => Parallel::Unlimited,
            // An unreadable kind was reported already; "auto" is then checked no further.
            AUTO => match kind {
                Some(Kind::LlamaServer) | None => Parallel::Auto,
                Some(kind) => {
                    let message = format!(
                        r#"parallel = "auto" reads the slot count from llama-server's /props, but this upstream is kind = "{kind}"; state the number of slots"#
                    );
                    r.invalid(&parallel_path, v, message);
                    Parallel::Invalid
                }
            },
            other => {
                let message = format!(
                    r#"expected an integer of at least 1, "auto" or "unlimited", found {other:?}"#
                );
                r.invalid(&parallel_path, v, message);
                Parallel::Invalid
            }
        },
        Some(v) => r
            .count(&parallel_path, v, 1)
            .map_or(Parallel::Invalid, Parallel::Slots),
    };

    if let Parallel::Unlimited = parallel {
        // An unlimited model holds no slot, so it has nothing to queue for or cap.
        let mut ok = true;
        for key in queueing_keys() {
            if let Some(v) = t.get(key) {
                let message =
                    r#"not allowed with parallel = "unlimited" (nothing waits for a slot)"#;
                r.invalid(&path.key(key), v, message);
                ok = false;
            }
        }
        return ok.then_some(ModelLimits::Unlimited);
    }

    let auto = matches!(parallel, Parallel::Auto);
    if auto && let Some(v) = t.get("capacity") {
        let message =
            r#"not allowed with parallel = "auto" (the engine reports its own slot count)"#;
        r.invalid(&path.key("capacity"), v, message);
    }

    let queue = required(
        r,
        t,
        path,
        "queue",
        "how many requests may wait for a slot, an integer of at least 0; limits never default",
        |r, p, v| r.count(p, v, 0),
    );
    let queue_timeout = required(
        r,
        t,
        path,
        "queue_timeout",
        r#"the longest wait for a slot, e.g. "30s"; limits never default"#,
        |r, p, v| r.duration(p, v, false),
    );
    let capacity = optional(r, t, path, "capacity", None, |r, p, v| {
        r.count(p, v, 1).map(Some)
    });

    if auto {
        return match (queue, queue_timeout, t.contains_key("capacity")) {
            (Some(queue), Some(queue_timeout), false) => Some(ModelLimits::Auto {
                queue,
                queue_timeout,
            }),
            _ => None,
        };
    }
    let Parallel::Slots(parallel) = parallel else {
        return None;
    };
    if let Some(Some(capacity)) = capacity
        && parallel > capacity
    {
        let message = format!(
            "{parallel} is above capacity = {capacity}, the engine's real slot count; lower \
             parallel or give the engine more slots"
        );
        r.invalid(&parallel_path, &t["parallel"], message);
        return None;
    }
    Some(ModelLimits::Limited {
        parallel,
        queue: queue?,
        queue_timeout: queue_timeout?,
        capacity: capacity?,
    })
}
