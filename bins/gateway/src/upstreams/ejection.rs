//! Passive ejection's limits: what forwarding sees takes an upstream out of rotation only while
//! its models keep enough of their other upstreams.
//!
//! An upstream whose failure streak is [due](crate::upstreams::health::Streak::Due) leaves
//! only if, for *every* model it serves:
//!
//! - another upstream of the model stays in rotation (healthy and not draining): requests
//!   never eject the last one. With no other host to send them to, ejecting it would turn the
//!   engine's errors for some requests into `503 upstream-unavailable` for all of them, and an
//!   engine that is really down still fails its active checks, which are not limited;
//! - the model's upstreams out of rotation, this one included, stay within
//!   `server.max_ejection_percent` of them, rounded down but at least one (Envoy's
//!   `max_ejection_percent`, whose "at least one" keeps small pools useful).
//!
//! Decisions are taken one at a time under a lock the whole routing table shares, so two
//! upstreams whose streaks come due at the same moment cannot both leave, each on the strength
//! of the other. An upstream kept that way stays due; its next counted failure asks again, and
//! the reason it stays is logged once and shown in its admin status (`ejection_held`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use slotgate_config::Config;

use crate::upstreams::health::{HealthPolicy, Streak};
use crate::upstreams::state::{UpstreamState, Upstreams};

/// One upstream's neighbours for passive ejection: for each model it serves, every upstream
/// serving that model. Shared by the upstream's targets in one routing table.
#[derive(Debug)]
pub(crate) struct Ejection {
    /// The routing table's one decision lock.
    decisions: Arc<Mutex<()>>,
    /// Per model the upstream serves: every upstream serving it, itself included.
    models: Vec<(String, Vec<Arc<UpstreamState>>)>,
}

impl Ejection {
    /// Every upstream's scope for `config`, by upstream name, sharing one decision lock;
    /// `upstreams` must have been built from the same `config`.
    pub(crate) fn for_config(config: &Config, upstreams: &Upstreams) -> HashMap<String, Arc<Self>> {
        let decisions = Arc::new(Mutex::new(()));
        let serving = |model: &str| -> Vec<Arc<UpstreamState>> {
            config
                .candidates(model)
                .into_iter()
                .filter_map(|upstream| upstreams.get(&upstream.name).cloned())
                .collect()
        };
        config
            .upstreams
            .values()
            .map(|upstream| {
                let models = upstream
                    .models
                    .keys()
                    .map(|model| (model.clone(), serving(model)))
                    .collect();
                let scope = Self::new(Arc::clone(&decisions), models);
                (upstream.name.clone(), Arc::new(scope))
            })
            .collect()
    }

    /// The scope for an upstream serving `models`, each with every upstream that serves it;
    /// `decisions` is shared by every scope of one routing table.
    pub(crate) fn new(
        decisions: Arc<Mutex<()>>,
        models: Vec<(String, Vec<Arc<UpstreamState>>)>,
    ) -> Self {
        Self { decisions, models }
    }

    /// Records a failure of `upstream` seen while forwarding a request sent at `sent` (a
    /// refused connection, an engine's error answer; `by` says which, for the log), and ejects
    /// it if its streak is due and its models can spare it.
    pub(crate) fn record_failure(
        &self,
        upstream: &UpstreamState,
        reason: String,
        sent: Instant,
        policy: &HealthPolicy,
        by: &'static str,
    ) {
        let logged = reason.clone();
        if upstream.health.record_forward_failure(reason, sent, policy) != Streak::Due {
            return;
        }
        let decisions = self.decisions.lock();
        match self.kept_because(upstream, policy.max_ejection_percent) {
            None => {
                if let Some(status) = upstream.health.eject_if_due(policy) {
                    upstream.log_transition(status, Some(&logged), by);
                }
            }
            Some(because) => {
                drop(decisions);
                upstream.keep_in_rotation(&because, &logged, by);
            }
        }
    }

    /// Why `upstream` must stay in rotation, or `None` when every model it serves can spare
    /// it.
    fn kept_because(&self, upstream: &UpstreamState, max_percent: usize) -> Option<String> {
        self.models.iter().find_map(|(model, serving)| {
            let others = serving.iter().filter(|u| u.name != upstream.name);
            let available = others.clone().filter(|u| u.is_available()).count();
            if available == 0 {
                return Some(format!("the last upstream of `{model}` in rotation"));
            }
            let out = others.filter(|u| !u.health.is_routable()).count() + 1;
            let allowed = (serving.len() * max_percent / 100).max(1);
            (out > allowed).then(|| {
                format!(
                    "{out} of the {} upstreams of `{model}` would be out, more than \
                     max_ejection_percent = {max_percent} allows",
                    serving.len()
                )
            })
        })
    }
}

#[cfg(test)]
mod tests;
