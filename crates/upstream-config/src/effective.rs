//! The effective configuration, rendered back as TOML (what `slotgate check` prints).
//!
//! Rendered through a private serializable view rather than by deriving `Serialize` on the
//! public types: the view is where defaults become explicit, durations become human strings and
//! secrets become `<redacted>`, and none of that belongs in the types the gateway uses. The
//! `[server]` table's lines come from its key declarations ([`crate::server`]); the other
//! tables' views are written out here.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::cluster::ClusterKeys;
use crate::queueing::QueueingKeys;
use crate::secret::Secret;
use crate::server::{API_KEYS_FILE_UNSET, Server, ServerKeys};
use crate::show::{REDACTED, ShownTable, display, human, on_off};
use crate::types::{Config, ModelLimits, Upstream};

impl Config {
    /// The validated configuration as TOML, with every default written out and every secret
    /// replaced by `"<redacted>"`. Optional keys that are unset are listed in a leading comment.
    ///
    /// The output is itself a valid configuration: loading it gives back this config (with the
    /// secrets' values replaced).
    pub fn to_effective_toml(&self) -> String {
        let mut out = String::from(
            "# Effective slotgate configuration: defaults made explicit, secrets redacted.\n",
        );
        let unset = unset_keys(&self.server);
        if !unset.is_empty() {
            out.push_str("# Not set:\n");
            for line in unset {
                let _ = writeln!(out, "#   {line}");
            }
        }
        out.push('\n');
        match toml::to_string(&View::from(self)) {
            Ok(body) => out.push_str(&body),
            // Unreachable with this view (string keys, no bare `None`), but never panic on a
            // diagnostic path: say what happened instead.
            Err(error) => {
                let _ = writeln!(out, "# cannot render the effective configuration: {error}");
            }
        }
        out
    }
}

/// The optional `[server]` keys left unset, with what that means, in declaration order.
fn unset_keys(server: &Server) -> Vec<&'static str> {
    let mut unset = Vec::new();
    ServerKeys::unset(server, &mut unset);
    // Across two keys: without a key in either place, no client is authenticated.
    if server.api_keys.is_empty()
        && let Some(note) = unset.iter_mut().find(|note| **note == API_KEYS_FILE_UNSET)
    {
        *note = "server.api_keys, server.api_keys_file (clients are not authenticated)";
    }
    unset
}

#[derive(Serialize)]
struct View<'a> {
    server: ShownTable<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<ShownTable<'a>>,
    upstreams: BTreeMap<&'a str, UpstreamView<'a>>,
    aliases: &'a BTreeMap<String, String>,
}

#[derive(Serialize)]
struct UpstreamView<'a> {
    url: String,
    kind: &'static str,
    weight: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    api_key: Option<&'static str>,
    cancel_grace: String,
    stream_idle_timeout: String,
    stream_timeout: String,
    allow_model_management: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    ca_file: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_cert: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    client_key: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_loaded_models: Option<usize>,
    collate_for: String,
    // Tables last: TOML cannot put a plain key after a sub-table.
    models: BTreeMap<&'a str, ModelEntryView<'a>>,
}

#[derive(Serialize)]
struct ModelEntryView<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    engine_model: Option<&'a str>,
    #[serde(flatten)]
    limits: ModelView,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    queueing: Option<ShownTable<'a>>,
    affinity: &'static str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ModelView {
    Limited {
        parallel: usize,
        queue: usize,
        queue_timeout: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        capacity: Option<usize>,
    },
    Unlimited {
        parallel: &'static str,
    },
    Auto {
        parallel: &'static str,
        queue: usize,
        queue_timeout: String,
    },
}

impl<'a> From<&'a Config> for View<'a> {
    fn from(config: &'a Config) -> Self {
        View {
            server: {
                let mut shown = ShownTable::default();
                ServerKeys::show(&config.server, &mut shown.0);
                shown
            },
            cluster: config.cluster.as_ref().map(|cluster| {
                let mut shown = ShownTable::default();
                ClusterKeys::show(cluster, &mut shown.0);
                shown
            }),
            upstreams: config
                .upstreams
                .iter()
                .map(|(name, upstream)| (name.as_str(), UpstreamView::from(upstream)))
                .collect(),
            aliases: &config.aliases,
        }
    }
}

impl<'a> From<&'a Upstream> for UpstreamView<'a> {
    fn from(upstream: &'a Upstream) -> Self {
        UpstreamView {
            // The default port written out, like every other default (the url crate drops it).
            // Nothing else can follow the path: validation refused queries and fragments.
            url: format!("{}{}", upstream.authority(), upstream.url.path()),
            kind: upstream.kind.as_str(),
            weight: upstream.weight,
            api_key: upstream.api_key.as_ref().map(redact),
            cancel_grace: human(upstream.cancel_grace),
            stream_idle_timeout: human(upstream.stream_idle_timeout),
            stream_timeout: upstream
                .stream_timeout
                .map_or_else(|| "none".to_owned(), human),
            allow_model_management: upstream.allow_model_management,
            ca_file: upstream.ca_file.as_deref().map(display),
            client_cert: upstream
                .client_identity
                .as_ref()
                .map(|id| display(&id.cert)),
            client_key: upstream.client_identity.as_ref().map(|id| display(&id.key)),
            parallel: upstream.parallel,
            max_loaded_models: upstream.max_loaded_models,
            collate_for: human(upstream.collate_for),
            models: upstream
                .models
                .iter()
                .map(|(name, limits)| {
                    let entry = ModelEntryView {
                        engine_model: upstream.engine_models.get(name).map(String::as_str),
                        limits: ModelView::from(*limits),
                        // Unlimited models never queue: the keys are not allowed there, and
                        // validation gives them no entry; every other model has one.
                        queueing: upstream.queueing.get(name).map(|queueing| {
                            let mut shown = ShownTable::default();
                            QueueingKeys::show(queueing, &mut shown.0);
                            shown
                        }),
                        affinity: on_off(upstream.affinity(name)),
                    };
                    (name.as_str(), entry)
                })
                .collect(),
        }
    }
}

impl From<ModelLimits> for ModelView {
    fn from(limits: ModelLimits) -> Self {
        match limits {
            ModelLimits::Limited {
                parallel,
                queue,
                queue_timeout,
                capacity,
            } => ModelView::Limited {
                parallel,
                queue,
                queue_timeout: human(queue_timeout),
                capacity,
            },
            ModelLimits::Unlimited => ModelView::Unlimited {
                parallel: "unlimited",
            },
            ModelLimits::Auto {
                queue,
                queue_timeout,
            } => ModelView::Auto {
                parallel: "auto",
                queue,
                queue_timeout: human(queue_timeout),
            },
        }
    }
}

fn redact(_: &Secret) -> &'static str {
    REDACTED
}
