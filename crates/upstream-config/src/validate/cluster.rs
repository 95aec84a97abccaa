//! The `[cluster]` table: every key read as declared in [`crate::cluster`], then the checks
//! between keys. It rules out nothing elsewhere in the configuration: every admission setting
//! is kept by the shared store (`docs/scale-out.md`).

use figment::value::{Dict, Value};

use crate::cluster::{Cluster, ClusterKeys, StoreDown};
use crate::raw::{KeyPath, Reader};
use crate::show::human;

/// The `[cluster]` table: `Some(None)` when absent, `None` when wrong (reported).
#[expect(
    clippy::option_option,
    reason = "the contract of `optional`: outer None = wrong (reported), inner None = absent"
)]
pub(super) fn cluster(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: Option<&Value>,
) -> Option<Option<Cluster>> {
    let Some(value) = value else {
        return Some(None);
    };
    let t = r.table(path, value, &ClusterKeys::names())?;
    let keys = ClusterKeys::read(r, t, path);
    let timeout_fits = store_timeout_fits_the_lease(r, t, path, &keys);
    let replicas_known = local_share_knows_the_replicas(r, path, &keys);
    let cluster = keys.build()?;
    (timeout_fits && replicas_known).then_some(Some(cluster))
}

/// A renewal (every third of `lease_ttl`) must fit in its interval.
fn store_timeout_fits_the_lease(
    r: &mut Reader<'_>,
    t: &Dict,
    path: &KeyPath,
    keys: &ClusterKeys,
) -> bool {
    let (Some(ttl), Some(timeout)) = (keys.lease_ttl, keys.store_timeout) else {
        return true;
    };
    if timeout <= ttl / 3 {
        return true;
    }
    let message = format!(
        "must be at most a third of lease_ttl ({}), found {}: a renewal must fit in the \
         renewal interval",
        human(ttl / 3),
        human(timeout),
    );
    match t.get("store_timeout") {
        Some(value) => r.invalid(&path.key("store_timeout"), value, message),
        None => r.issue(&path.key("store_timeout"), message),
    }
    false
}

/// `on_store_down = "local-share"` divides each cap by the number of replicas.
fn local_share_knows_the_replicas(r: &mut Reader<'_>, path: &KeyPath, keys: &ClusterKeys) -> bool {
    if keys.on_store_down == Some(StoreDown::LocalShare) && keys.replicas == Some(None) {
        r.missing(
            &path.key("replicas"),
            "on_store_down = \"local-share\" admits floor(parallel / replicas) per replica \
             while Redis is down, so it needs the number of replicas, e.g. `replicas = 2`",
        );
        return false;
    }
    true
}
