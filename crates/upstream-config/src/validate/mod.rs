//! The validation pass: builds the strict types from the raw tree, checking every rule and
//! recording every violation with its key path.
//!
//! Each builder returns `Option<T>`: `None` exactly when it recorded at least one issue, so a
//! `Config` is only assembled when nothing was wrong. Builders keep going after a problem, and
//! cross-checks (duplicate authorities, alias targets) run on whatever could be read, so one
//! pass reports everything. Optional keys read as `Option<T>` too: absent gives the default,
//! present-but-wrong gives `None`.
//!
//! One module per table: `server` (its keys are declared in [`crate::server`]; the checks
//! between them are here), `upstream`, `model`, `aliases`, `cluster`.

use figment::value::Value;

use crate::key::{read_optional as optional, read_required as required};
use crate::raw::{KeyPath, Reader};
use crate::types::Config;

mod aliases;
mod cluster;
mod model;
mod server;
mod upstream;

/// The top-level tables (also what an environment override has to start with).
pub(crate) const ROOT_KEYS: &[&str] = &["server", "upstreams", "aliases", "cluster"];

/// Builds a [`Config`] from the merged tree; `None` when any issue was recorded.
pub(crate) fn build(r: &mut Reader<'_>, root: &Value) -> Option<Config> {
    let path = KeyPath::root();
    let table = r.table(&path, root, ROOT_KEYS)?;
    let server = server::server(r, &path.key("server"), table.get("server"));
    let upstreams = upstream::upstreams(r, &path.key("upstreams"), table.get("upstreams"));
    let aliases = aliases::aliases(
        r,
        &path.key("aliases"),
        table.get("aliases"),
        &upstreams.models,
    );
    // Every admission setting is kept by the shared store under `[cluster]`
    // (`docs/scale-out.md`): nothing of the upstreams is checked against it.
    let cluster = cluster::cluster(r, &path.key("cluster"), table.get("cluster"));
    Some(Config {
        server: server?,
        upstreams: upstreams.built?,
        aliases: aliases?,
        cluster: cluster?,
    })
}
