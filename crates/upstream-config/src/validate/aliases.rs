//! The `[aliases]` table: client-facing names for configured models.

use std::collections::{BTreeMap, BTreeSet};

use figment::value::Value;

use crate::raw::{KeyPath, Reader};

pub(super) fn aliases(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: Option<&Value>,
    models: &BTreeSet<String>,
) -> Option<BTreeMap<String, String>> {
    let Some(value) = value else {
        return Some(BTreeMap::new());
    };
    let dict = r.dict(path, value)?;
    let mut built = Some(BTreeMap::new());
    for (alias, value) in dict {
        let alias_path = path.key(alias);
        let Some(target) = r.string(&alias_path, value) else {
            built = None;
            continue;
        };
        let problem = if alias.is_empty() {
            Some("an alias name must not be empty".to_owned())
        } else if models.contains(alias) {
            Some(format!(
                "{alias:?} is also a configured model name; an alias must not shadow a model"
            ))
        } else if target == alias {
            Some(format!("{alias:?} points to itself"))
        } else if dict.contains_key(target) {
            Some(format!(
                "points to {target:?}, which is itself an alias; aliases do not chain: point it \
                 at a configured model"
            ))
        } else if !models.contains(target) {
            let known: Vec<_> = models.iter().map(String::as_str).collect();
            Some(format!(
                "points to {target:?}, which no upstream configures (configured models: {})",
                known.join(", ")
            ))
        } else {
            None
        };
        match (problem, built.as_mut()) {
            (Some(problem), _) => {
                r.invalid(&alias_path, value, problem);
                built = None;
            }
            (None, Some(map)) => {
                map.insert(alias.clone(), target.to_owned());
            }
            (None, None) => {}
        }
    }
    built
}
