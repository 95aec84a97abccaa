//! The `[upstreams.NAME]` tables: each upstream's keys, its URL, TLS and timing, and the check
//! that no two upstreams share an authority (the limiter keys on it).

use std::collections::{BTreeMap, BTreeSet, btree_map::Entry};
use std::path::PathBuf;
use std::time::Duration;

use figment::value::{Dict, Value};
use url::Url;

use super::model::models;
use super::{optional, required};
use crate::key::Declared as _;
use crate::raw::{KeyPath, Reader};
use crate::types::{Kind, Upstream, authority};
use crate::values::{CertAndKey, CertPair, file_path, secret};

const UPSTREAM_KEYS: &[&str] = &[
    "url",
    "kind",
    "weight",
    "api_key",
    "cancel_grace",
    "stream_idle_timeout",
    "stream_timeout",
    "allow_model_management",
    "ca_file",
    "client_cert",
    "client_key",
    "parallel",
    "max_loaded_models",
    "collate_for",
    "models",
];
const NONE: &str = "none";

/// What the upstream tables gave: the upstreams when all were valid, and every model name
/// mentioned (valid or not) so alias checks do not cascade from an unrelated mistake.
pub(super) struct Upstreams {
    pub(super) built: Option<BTreeMap<String, Upstream>>,
    pub(super) models: BTreeSet<String>,
}

pub(super) fn upstreams(r: &mut Reader<'_>, path: &KeyPath, value: Option<&Value>) -> Upstreams {
    let mut out = Upstreams {
        built: None,
        models: BTreeSet::new(),
    };
    let Some(value) = value else {
        r.missing(path, "at least one [upstreams.NAME] table");
        return out;
    };
    let Some(dict) = r.dict(path, value) else {
        return out;
    };
    if dict.is_empty() {
        r.invalid(path, value, "at least one upstream is required");
        return out;
    }

    let mut built = Some(BTreeMap::new());
    // authority → the first upstream that claimed it.
    let mut authorities: BTreeMap<String, &str> = BTreeMap::new();
    for (name, value) in dict {
        let upstream_path = path.key(name);
        let read = upstream(r, &upstream_path, name, value);
        out.models.extend(read.models);
        if let Some((url, url_value)) = &read.url {
            match authorities.entry(authority(url)) {
                Entry::Vacant(entry) => {
                    entry.insert(name);
                }
                Entry::Occupied(entry) => {
                    let first = path.key(entry.get());
                    let message = format!(
                        "same authority {} as {first}; the limiter keys on scheme, host and port, \
                         so one engine is one upstream: list all its models under {first}",
                        entry.key()
                    );
                    r.invalid(&upstream_path.key("url"), url_value, message);
                    built = None;
                }
            }
        }
        match (built.as_mut(), read.built) {
            (Some(map), Some(upstream)) => {
                map.insert(name.clone(), upstream);
            }
            _ => built = None,
        }
    }
    out.built = built;
    out
}

struct ReadUpstream<'v> {
    /// The parsed URL and the value it came from, for the duplicate-authority check.
    url: Option<(Url, &'v Value)>,
    models: Vec<String>,
    built: Option<Upstream>,
}

#[expect(
    clippy::too_many_lines,
    reason = "one read per key of the table, in the table's order, then one assembly"
)]
fn upstream<'v>(
    r: &mut Reader<'_>,
    path: &KeyPath,
    name: &str,
    value: &'v Value,
) -> ReadUpstream<'v> {
    let mut out = ReadUpstream {
        url: None,
        models: Vec::new(),
        built: None,
    };
    let name_ok = !name.is_empty();
    if !name_ok {
        r.issue(path, "an upstream name must not be empty");
    }
    let Some(t) = r.table(path, value, UPSTREAM_KEYS) else {
        return out;
    };

    let url = required(
        r,
        t,
        path,
        "url",
        r#"the engine's base URL, e.g. "http://127.0.0.1:8081""#,
        upstream_url,
    );
    out.url = url.clone().zip(t.get("url"));
    let kind = required(
        r,
        t,
        path,
        "kind",
        "one of: llama-server, vllm, ollama, openai",
        |r, p, v| {
            let text = r.string(p, v)?;
            let kind = Kind::from_name(text);
            if kind.is_none() {
                let message = format!("unknown kind {text:?} (expected one of: {})", kind_names());
                r.invalid(p, v, message);
            }
            kind
        },
    );
    let weight = optional(r, t, path, "weight", Upstream::DEFAULT_WEIGHT, weight);
    let api_key = optional(r, t, path, "api_key", None, |r, p, v| {
        secret(r, p, v).map(Some)
    });
    let Timing {
        cancel_grace,
        stream_idle_timeout,
        stream_timeout,
        collate_for,
    } = upstream_timing(r, t, path, kind);
    let allow_model_management =
        optional(r, t, path, "allow_model_management", false, Reader::boolean);
    let tls = upstream_tls(r, t, path, url.as_ref());
    let parallel = optional(r, t, path, "parallel", None, |r, p, v| {
        r.count(p, v, 1).map(Some)
    });
    let max_loaded_models = optional(r, t, path, "max_loaded_models", None, |r, p, v| {
        r.count(p, v, 1).map(Some)
    });
    let models = required(
        r,
        t,
        path,
        "models",
        "at least one [upstreams.NAME.models.MODEL] table",
        |r, p, v| {
            let dict = r.dict(p, v)?;
            out.models.extend(dict.keys().cloned());
            models(r, p, v, dict, kind)
        },
    );
    let (models, engine_models, queueing, affinity_off) = models
        .map_or((None, None, None, None), |(m, e, q, a)| {
            (Some(m), Some(e), Some(q), Some(a))
        });

    if let (
        true,
        Some(url),
        Some(kind),
        Some(weight),
        Some(api_key),
        Some(cancel_grace),
        Some(stream_idle_timeout),
        Some(stream_timeout),
        Some(allow_model_management),
        Some(tls),
        Some(parallel),
        Some(max_loaded_models),
        Some(collate_for),
        Some(models),
        Some(engine_models),
        Some(queueing),
        Some(affinity_off),
    ) = (
        name_ok,
        url,
        kind,
        weight,
        api_key,
        cancel_grace,
        stream_idle_timeout,
        stream_timeout,
        allow_model_management,
        tls,
        parallel,
        max_loaded_models,
        collate_for,
        models,
        engine_models,
        queueing,
        affinity_off,
    ) {
        out.built = Some(Upstream {
            name: name.to_owned(),
            url,
            kind,
            weight,
            api_key,
            cancel_grace,
            stream_idle_timeout,
            stream_timeout,
            allow_model_management,
            ca_file: tls.ca_file,
            client_identity: tls.client_identity,
            parallel,
            max_loaded_models,
            collate_for,
            models,
            engine_models,
            queueing,
            affinity_off,
        });
    }
    out
}

/// An upstream's `weight`: finite and positive.
fn weight(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<f64> {
    let weight = r.number(path, value)?;
    if weight.is_finite() && weight > 0.0 {
        Some(weight)
    } else {
        r.invalid(
            path,
            value,
            format!("must be finite and greater than 0, found {weight}"),
        );
        None
    }
}

/// An upstream's TLS keys.
struct UpstreamTlsKeys {
    ca_file: Option<PathBuf>,
    client_identity: Option<CertAndKey>,
}

/// `ca_file` and `client_cert` / `client_key`, which only an `https` upstream uses; `None`
/// when any is wrong (reported).
fn upstream_tls(
    r: &mut Reader<'_>,
    t: &Dict,
    path: &KeyPath,
    url: Option<&Url>,
) -> Option<UpstreamTlsKeys> {
    let ca_file = optional(r, t, path, "ca_file", None, |r, p, v| {
        file_path(r, p, v).map(Some)
    });
    let client_identity = CertPair::new("client_cert", "client_key").read(r, t, path);
    let plain_http = url.is_some_and(|url| url.scheme() == "http");
    let mut misplaced = false;
    for key in ["ca_file", "client_cert", "client_key"] {
        if plain_http && t.contains_key(key) {
            r.issue(
                &path.key(key),
                "only used with an https url: this upstream's url is http",
            );
            misplaced = true;
        }
    }
    Some(UpstreamTlsKeys {
        ca_file: ca_file?,
        client_identity: client_identity?,
    })
    .filter(|_| !misplaced)
}

fn kind_names() -> String {
    Kind::ALL.map(Kind::as_str).join(", ")
}

/// An upstream base URL: http(s), a host, no credentials, query or fragment. A path prefix is
/// kept, except a trailing `/v1`, which the client's own path already carries.
fn upstream_url(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Url> {
    let text = r.string(path, value)?;
    let url = match Url::parse(text) {
        Ok(url) => url,
        Err(error) => {
            // A URL with `@` may carry a password: describe it without echoing it.
            let message = if text.contains('@') {
                format!("invalid URL: {error}")
            } else {
                format!("invalid URL {text:?}: {error}")
            };
            r.invalid(path, value, message);
            return None;
        }
    };
    // Checked first, and the URL is not echoed from here on: it may hold a password.
    if !url.username().is_empty() || url.password().is_some() {
        let message = "must not contain credentials; set `api_key` for a bearer token instead";
        r.invalid(path, value, message);
        return None;
    }
    let mut problems = Vec::new();
    if !matches!(url.scheme(), "http" | "https") {
        problems.push(format!(
            "scheme must be http or https, found {:?}",
            url.scheme()
        ));
    } else if url.host_str().is_none_or(str::is_empty) {
        problems.push("must have a host".to_owned());
    }
    if url.query().is_some() {
        problems.push("must not have a query (`?…`)".to_owned());
    }
    if url.fragment().is_some() {
        problems.push("must not have a fragment (`#…`)".to_owned());
    }
    let prefix = url.path().trim_end_matches('/');
    if prefix.ends_with("/v1") {
        problems.push(format!(
            "path {prefix:?} ends in /v1, but clients' paths already start with /v1 and the \
             gateway appends them to this URL: drop the trailing /v1"
        ));
    }
    if problems.is_empty() {
        Some(url)
    } else {
        r.invalid(path, value, problems.join("; "));
        None
    }
}

/// An upstream's timing keys, each `None` when present but wrong.
struct Timing {
    cancel_grace: Option<Duration>,
    stream_idle_timeout: Option<Duration>,
    /// `Some(None)`: `"none"`, no total bound.
    #[expect(
        clippy::option_option,
        reason = "the outer `None` is a wrong value (reported), the inner one the value \"none\""
    )]
    stream_timeout: Option<Option<Duration>>,
    collate_for: Option<Duration>,
}

fn upstream_timing(r: &mut Reader<'_>, t: &Dict, path: &KeyPath, kind: Option<Kind>) -> Timing {
    // The default depends on the kind; an unreadable kind was reported already, and then the
    // default does not matter (nothing is built).
    let default_grace = kind.map_or(Duration::ZERO, Kind::default_cancel_grace);
    let cancel_grace = optional(r, t, path, "cancel_grace", default_grace, |r, p, v| {
        r.duration(p, v, true)
    });
    let stream_idle_timeout = optional(
        r,
        t,
        path,
        "stream_idle_timeout",
        Upstream::DEFAULT_STREAM_IDLE_TIMEOUT,
        |r, p, v| r.duration(p, v, false),
    );
    let stream_timeout = optional(
        r,
        t,
        path,
        "stream_timeout",
        Upstream::DEFAULT_STREAM_TIMEOUT,
        |r, p, v| match v {
            Value::String(_, text) if text == NONE => Some(None),
            _ => r.duration(p, v, false).map(Some),
        },
    );
    let collate_for = optional(
        r,
        t,
        path,
        "collate_for",
        Upstream::DEFAULT_COLLATE_FOR,
        |r, p, v| r.duration(p, v, true),
    );
    Timing {
        cancel_grace,
        stream_idle_timeout,
        stream_timeout,
        collate_for,
    }
}
