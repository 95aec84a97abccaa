//! Step 2: client authentication, when API keys are configured.
//!
//! Keys come from `server.api_keys` and from `server.api_keys_file` (one key per line; blank
//! lines and lines starting with `#` are skipped). A request must carry one of them as
//! `Authorization: Bearer KEY` (OpenAI's convention) or `x-api-key: KEY` (Anthropic's, which
//! its SDKs, its curl examples and many tools send); with no keys configured, every request is
//! let through. A request carrying both passes when either is accepted.
//!
//! The offered token is compared with *every* accepted key, each comparison in constant time
//! (`constant_time_eq`), and without stopping at a match: response timing reveals neither how
//! much of a guessed key was right nor which key matched. Only a key's length can show through
//! timing, which is public knowledge for generated keys anyway. Keys are never logged: `Debug`
//! prints how many there are, and a refused request is logged without its header.
//!
//! A missing or wrong key is a `401 unauthorized` problem, returned before the body is read or
//! any upstream is chosen: an unauthenticated request never reaches an engine.
//!
//! The key that matched says who the request queues as ([`Client`]): the key's `name` is its
//! tenant, with its `priority` and `share`. A key without a name is a tenant of its own, known
//! by where it was configured (`api_keys[2]`, `api_keys_file:7`), never by the key itself. A
//! key configured twice counts with its first entry.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::HeaderMap;
use http::header::AUTHORIZATION;
use slotgate_config::ClientKey;

use crate::proxy::client::Client;
use crate::proxy::problems::Error;

/// `server.api_keys_file` could not be read.
#[derive(Debug, thiserror::Error)]
#[error("server.api_keys_file: cannot read {}", path.display())]
pub(crate) struct ApiKeysError {
    path: PathBuf,
    #[source]
    source: std::io::Error,
}

/// The accepted client API keys, each with who its requests queue as.
#[derive(Default)]
pub(crate) struct ApiKeys {
    keys: Vec<(String, Client)>,
}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the keys themselves.
        f.debug_struct("ApiKeys")
            .field("count", &self.keys.len())
            .finish()
    }
}

impl ApiKeys {
    /// The keys from the configuration and, if given, the keys file.
    pub(crate) fn load(inline: &[ClientKey], file: Option<&Path>) -> Result<Self, ApiKeysError> {
        let mut keys: Vec<(String, Client)> = inline
            .iter()
            .enumerate()
            .map(|(i, key)| {
                let tenant = key.name.clone().unwrap_or_else(|| format!("api_keys[{i}]"));
                let client = Client {
                    tenant: Some(Arc::from(tenant)),
                    priority: key.priority,
                    share: key.share,
                };
                (key.key.expose().to_owned(), client)
            })
            .collect();
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ApiKeysError {
                path: path.to_owned(),
                source,
            })?;
            keys.extend(
                text.lines()
                    .enumerate()
                    .map(|(i, line)| (i + 1, line.trim()))
                    .filter(|(_, line)| !line.is_empty() && !line.starts_with('#'))
                    .map(|(number, line)| {
                        let tenant = format!("api_keys_file:{number}");
                        let client = Client {
                            tenant: Some(Arc::from(tenant)),
                            ..Client::anonymous()
                        };
                        (line.to_owned(), client)
                    }),
            );
        }
        // Stable: of a key configured twice, the first entry stays.
        keys.sort_by(|a, b| a.0.cmp(&b.0));
        keys.dedup_by(|later, earlier| later.0 == earlier.0);
        Ok(Self { keys })
    }

    /// Whether authentication is on.
    pub(crate) fn is_enabled(&self) -> bool {
        !self.keys.is_empty()
    }

    /// Checks the request's bearer token; who the request queues as when it passes (the
    /// anonymous client when authentication is off).
    pub(crate) fn verify(&self, headers: &HeaderMap) -> Result<Client, Error> {
        if self.keys.is_empty() {
            return Ok(Client::anonymous());
        }
        let offered = [bearer_token(headers), api_key(headers)];
        // `fold`, not `find`: every key is compared with every offered token, whether or not
        // an earlier one matched.
        let matched = offered
            .iter()
            .flatten()
            .fold(None, |matched, token| self.position(token).or(matched));
        matched
            .and_then(|i| self.keys.get(i))
            .map(|(_, client)| client.clone())
            .ok_or(Error::Unauthorized)
    }
}

impl ApiKeys {
    /// The index of the key equal to `token`, comparing it with every key in constant time.
    fn position(&self, token: &str) -> Option<usize> {
        self.keys
            .iter()
            .enumerate()
            .fold(None, |matched, (i, (key, _))| {
                let equal = constant_time_eq::constant_time_eq(key.as_bytes(), token.as_bytes());
                if equal { Some(i) } else { matched }
            })
    }
}

/// The value of Anthropic's `x-api-key` header, spaces around it ignored.
fn api_key(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(X_API_KEY)?.to_str().ok()?.trim();
    (!value.is_empty()).then_some(value)
}

/// Anthropic's API key header.
const X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive, spaces
/// around the token ignored).
pub(crate) fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};
    use slotgate_config::{ClientKey, Secret};

    use super::ApiKeys;

    fn bare(keys: &[&str]) -> Vec<ClientKey> {
        keys.iter()
            .map(|key| ClientKey::bare(Secret::new(*key)))
            .collect()
    }

    fn with_auth(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static(value));
        headers
    }

    #[test]
    fn no_keys_lets_everyone_through() {
        let keys = ApiKeys::load(&[], None).unwrap();
        assert!(!keys.is_enabled());
        assert!(keys.verify(&HeaderMap::new()).is_ok());
    }

    #[test]
    fn checks_bearer_tokens() {
        let keys = ApiKeys::load(&bare(&["sk-one", "sk-two"]), None).unwrap();
        let one = keys.verify(&with_auth("Bearer sk-one")).unwrap();
        assert_eq!(
            one.tenant.as_deref(),
            Some("api_keys[0]"),
            "named by place, not by key"
        );
        assert!(keys.verify(&with_auth("bearer  sk-two ")).is_ok());
        assert!(keys.verify(&HeaderMap::new()).is_err());
        assert!(keys.verify(&with_auth("Bearer sk-three")).is_err());
        assert!(keys.verify(&with_auth("Basic sk-one")).is_err());
        assert!(keys.verify(&with_auth("sk-one")).is_err());
        assert!(format!("{keys:?}").contains("count: 2"));
        assert!(!format!("{keys:?}").contains("sk-one"));
    }

    #[test]
    fn accepts_anthropics_x_api_key() {
        let keys = ApiKeys::load(&bare(&["sk-one", "sk-two"]), None).unwrap();
        let mut headers = HeaderMap::new();
        headers.insert("x-api-key", HeaderValue::from_static(" sk-two "));
        let two = keys.verify(&headers).unwrap();
        assert_eq!(two.tenant.as_deref(), Some("api_keys[1]"));
        headers.insert("x-api-key", HeaderValue::from_static("sk-three"));
        assert!(keys.verify(&headers).is_err());
        // Both sent: either accepted one lets the request through.
        headers.insert("authorization", HeaderValue::from_static("Bearer sk-one"));
        assert_eq!(
            keys.verify(&headers).unwrap().tenant.as_deref(),
            Some("api_keys[0]")
        );
        headers.insert("x-api-key", HeaderValue::from_static(""));
        assert!(keys.verify(&headers).is_ok());
    }

    #[test]
    fn reads_a_keys_file() {
        let dir = std::env::temp_dir().join(format!("slotgate-keys-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("keys");
        std::fs::write(&path, "# team keys\nsk-file\n\n  sk-spaced  \n").unwrap();
        let keys = ApiKeys::load(&[], Some(&path)).unwrap();
        let file = keys.verify(&with_auth("Bearer sk-file")).unwrap();
        assert_eq!(file.tenant.as_deref(), Some("api_keys_file:2"));
        assert!(keys.verify(&with_auth("Bearer sk-spaced")).is_ok());
        assert!(keys.verify(&with_auth("Bearer # team keys")).is_err());
        assert!(ApiKeys::load(&[], Some(&dir.join("missing"))).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
