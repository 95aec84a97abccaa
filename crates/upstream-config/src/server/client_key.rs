//! Client API keys (`server.api_keys`): a key, and how its requests queue (tenant, priority,
//! share). Read here, shown here.

use figment::value::Value;

use crate::key::{read_optional, read_required};
use crate::raw::{KeyPath, Reader};
use crate::secret::Secret;
use crate::show::{ClientKeyShown, REDACTED, Show, Shown};
use crate::values::secret;

/// The keys of an `api_keys` entry written as a table.
const CLIENT_KEY_KEYS: &[&str] = &["key", "name", "priority", "share"];

/// The longest tenant name, from a key's `name` or the `server.tenant_header`, in bytes.
pub(super) const MAX_TENANT_LEN: usize = 128;

/// One `server.api_keys` entry: a key, and how its requests queue.
///
/// Written either as a bare string (the key; priority `normal`, share 1, no name) or as a
/// table `{ key = "...", name = "team-a", priority = "high", share = 2 }`. Keys from
/// `api_keys_file` are bare keys.
///
/// ```
/// use slotgate_config::{Config, Priority};
///
/// let config = Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8080"
///     api_keys = ["sk-plain", { key = "sk-ops", name = "ops", priority = "high", share = 2 }]
///     [upstreams.a]
///     url = "http://127.0.0.1:8081"
///     kind = "vllm"
///     [upstreams.a.models.m]
///     parallel = 1
///     queue = 4
///     queue_timeout = "30s"
/// "#)?;
/// let ops = &config.server.api_keys[1];
/// assert_eq!((ops.name.as_deref(), ops.priority, ops.share), (Some("ops"), Priority::High, 2));
/// assert_eq!(config.server.api_keys[0].priority, Priority::Normal);
/// # Ok::<(), slotgate_config::ConfigError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ClientKey {
    /// The key itself.
    pub key: Secret,
    /// The tenant its requests belong to under `queue_order = "fair"`; keys with the same name
    /// are one tenant. `None`: the key is a tenant of its own.
    pub name: Option<String>,
    /// The priority class of its requests (default [`Priority::Normal`]).
    pub priority: Priority,
    /// Its tenant's share under `queue_order = "fair"`: slots per round relative to the other
    /// tenants' (default 1, at most [`ClientKey::MAX_SHARE`]).
    pub share: u32,
}

impl ClientKey {
    /// The largest `share`.
    pub const MAX_SHARE: u32 = 1000;

    /// A bare key: no name, priority `normal`, share 1.
    pub fn bare(key: Secret) -> Self {
        ClientKey {
            key,
            name: None,
            priority: Priority::Normal,
            share: 1,
        }
    }
}

/// A client key's priority class: higher classes are served first from a model's queue, and a
/// lower class waits at most a bounded number of grants (see `docs/configuration.md`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum Priority {
    /// `"high"`.
    High,
    /// `"normal"`, the default.
    #[default]
    Normal,
    /// `"low"`.
    Low,
}

impl Priority {
    /// Every class, highest first.
    pub const ALL: [Priority; 3] = [Priority::High, Priority::Normal, Priority::Low];

    /// The name used in the configuration file.
    pub const fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }

    /// The class named `name`, exactly as [`Priority::as_str`] spells it.
    pub fn from_name(name: &str) -> Option<Priority> {
        Priority::ALL.into_iter().find(|p| p.as_str() == name)
    }
}

/// `server.api_keys`: bare keys, or tables with a key and how its requests queue.
pub(super) fn client_keys(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: &Value,
) -> Option<Vec<ClientKey>> {
    let items = r.array(path, value)?;
    let keys: Vec<_> = items
        .iter()
        .enumerate()
        .map(|(i, item)| client_key(r, &path.index(i), item))
        .collect();
    keys.into_iter().collect()
}

fn client_key(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<ClientKey> {
    if !matches!(value, Value::Dict(..)) {
        return secret(r, path, value).map(ClientKey::bare);
    }
    let t = r.table(path, value, CLIENT_KEY_KEYS)?;
    let key = read_required(
        r,
        t,
        path,
        "key",
        "the key clients send as `Authorization: Bearer KEY`",
        secret,
    );
    let name = read_optional(r, t, path, "name", None, |r, p, v| {
        tenant_name(r, p, v).map(Some)
    });
    let priority = read_optional(r, t, path, "priority", Priority::Normal, |r, p, v| {
        let text = r.string(p, v)?;
        let priority = Priority::from_name(text);
        if priority.is_none() {
            let names = Priority::ALL.map(Priority::as_str).join(", ");
            let message = format!("unknown priority class {text:?} (expected one of: {names})");
            r.invalid(p, v, message);
        }
        priority
    });
    let share = read_optional(r, t, path, "share", 1, |r, p, v| {
        let share = r.count(p, v, 1)?;
        match u32::try_from(share) {
            Ok(share) if share <= ClientKey::MAX_SHARE => Some(share),
            _ => {
                let max = ClientKey::MAX_SHARE;
                r.invalid(p, v, format!("must be at most {max}, found {share}"));
                None
            }
        }
    });
    Some(ClientKey {
        key: key?,
        name: name?,
        priority: priority?,
        share: share?,
    })
}

/// A tenant's name: non-empty, at most [`MAX_TENANT_LEN`] bytes, no control characters.
fn tenant_name(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<String> {
    let text = r.string(path, value)?;
    let max = MAX_TENANT_LEN;
    let problem = if text.is_empty() {
        Some("must not be empty; leave it out for a tenant of the key's own".to_owned())
    } else if text.len() > max {
        Some(format!("must be at most {max} bytes, found {}", text.len()))
    } else if text.chars().any(char::is_control) {
        Some("must not contain control characters".to_owned())
    } else {
        None
    };
    match problem {
        Some(problem) => {
            r.invalid(path, value, problem);
            None
        }
        None => Some(text.to_owned()),
    }
}

/// `server.api_keys` in the effective configuration: every key redacted, a bare key as it was
/// written, a key with queueing attributes as a table with all of them.
impl Show for Vec<ClientKey> {
    fn show(&self) -> Option<Shown<'_>> {
        let keys = self.iter().map(|key| {
            if *key == ClientKey::bare(key.key.clone()) {
                return ClientKeyShown::Bare(REDACTED);
            }
            ClientKeyShown::Table {
                key: REDACTED,
                name: key.name.as_deref(),
                priority: key.priority.as_str(),
                share: key.share,
            }
        });
        Some(Shown::ClientKeys(keys.collect()))
    }
}
