//! Kinds of value that several tables share: credentials, file paths, HTTP header names,
//! `"on"`/`"off"` switches, and certificate pairs (two keys that go together).

use std::path::PathBuf;

use figment::value::{Dict, Value};

use crate::key::{Declared, read_optional};
use crate::raw::{KeyPath, Reader};
use crate::secret::Secret;
use crate::show::{Shown, display};

/// `"off"`, as the configuration writes it.
pub(crate) const OFF: &str = "off";

/// An `IP:port` socket address ([`Reader::socket_addr`] as a plain function: a method of
/// `Reader<'f>` reads for one `'f` only, and a declaration's reader must take any reader).
pub(crate) fn socket_addr(
    r: &mut Reader<'_>,
    path: &KeyPath,
    value: &Value,
) -> Option<std::net::SocketAddr> {
    r.socket_addr(path, value)
}

/// A credential: non-empty and header-safe. Its value never appears in a message.
pub(crate) fn secret(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Secret> {
    let text = r.secret_string(path, value)?;
    if text.is_empty() {
        r.invalid(path, value, "must not be empty");
        return None;
    }
    if text.chars().any(|c| c.is_whitespace() || c.is_control()) {
        let message = "must not contain whitespace or control characters (it travels in an HTTP \
                       header; check for a trailing newline)";
        r.invalid(path, value, message);
        return None;
    }
    Some(Secret::new(text))
}

/// A file path: a non-empty string.
pub(crate) fn file_path(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<PathBuf> {
    let file = r.string(path, value)?;
    if file.is_empty() {
        r.invalid(path, value, "must not be empty (leave the key out instead)");
        return None;
    }
    Some(PathBuf::from(file))
}

/// An HTTP header name (RFC 9110 token characters), stored in lower case.
pub(crate) fn header_name(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<String> {
    const TOKEN_PUNCTUATION: &str = "!#$%&'*+-.^_`|~";
    let text = r.string(path, value)?;
    let valid = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || TOKEN_PUNCTUATION.contains(c));
    if !valid {
        let message = format!("{text:?} is not an HTTP header name (e.g. \"x-tenant\")");
        r.invalid(path, value, message);
        return None;
    }
    Some(text.to_ascii_lowercase())
}

/// `on` or `off`.
pub(crate) fn on_off(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<bool> {
    match r.string(path, value)? {
        "on" => Some(true),
        OFF => Some(false),
        other => {
            r.invalid(
                path,
                value,
                format!(r#"expected "on" or "off", found {other:?}"#),
            );
            None
        }
    }
}

/// A PEM certificate chain and the PEM private key that goes with it (two keys that are set
/// together or not at all). Relative paths are relative to the gateway's working directory.
///
/// ```
/// let config = slotgate_config::Config::from_toml_str(r#"
///     [server]
///     listen = "127.0.0.1:8443"
///     tls_cert = "/etc/slotgate/tls/cert.pem"
///     tls_key = "/etc/slotgate/tls/key.pem"
///     [upstreams.a]
///     url = "http://127.0.0.1:8081"
///     kind = "llama-server"
///     [upstreams.a.models.m]
///     parallel = 1
///     queue = 0
///     queue_timeout = "1s"
/// "#).unwrap();
/// let tls = config.server.tls.unwrap();
/// assert_eq!(tls.cert, std::path::Path::new("/etc/slotgate/tls/cert.pem"));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertAndKey {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
}

/// The declaration of a certificate and its key: two keys, both or neither.
pub(crate) struct CertPair {
    cert: &'static str,
    key: &'static str,
    /// Whether the pair is there at all is taken only at start (a listener is plain or TLS
    /// from its start); the files themselves are read again by every reload.
    on_off_at_start: bool,
}

impl CertPair {
    /// The pair `cert` / `key`, e.g. `tls_cert` / `tls_key`.
    pub(crate) fn new(cert: &'static str, key: &'static str) -> Self {
        CertPair {
            cert,
            key,
            on_off_at_start: false,
        }
    }

    /// Setting or removing the pair takes effect only at start, and a reload that does it is
    /// reported under the certificate's key; a renewed certificate (other paths, or the same
    /// paths with new contents) is put in force by the reload.
    pub(crate) fn on_off_at_start(mut self) -> Self {
        self.on_off_at_start = true;
        self
    }
}

impl Declared<Option<CertAndKey>> for CertPair {
    fn names(&self, names: &mut Vec<&'static str>) {
        names.extend([self.cert, self.key]);
    }

    fn read(&self, r: &mut Reader<'_>, table: &Dict, path: &KeyPath) -> Option<Option<CertAndKey>> {
        cert_and_key(r, table, path, (self.cert, self.key))
    }

    fn show<'a>(&self, value: &'a Option<CertAndKey>, shown: &mut Vec<(&'static str, Shown<'a>)>) {
        if let Some(pair) = value {
            shown.push((self.cert, Shown::Text(display(&pair.cert))));
            shown.push((self.key, Shown::Text(display(&pair.key))));
        }
    }

    fn at_start(&self, names: &mut Vec<&'static str>) {
        if self.on_off_at_start {
            names.extend([self.cert, self.key]);
        }
    }

    fn restart_required(
        &self,
        old: &Option<CertAndKey>,
        new: &Option<CertAndKey>,
        changed: &mut Vec<&'static str>,
    ) {
        if self.on_off_at_start && old.is_some() != new.is_some() {
            changed.push(self.cert);
        }
    }
}

/// A certificate chain and its private key, named by two keys that go together: both or
/// neither. `None` when either is wrong.
#[expect(
    clippy::option_option,
    reason = "the contract of `read_optional`: outer None = wrong (reported), inner None = absent"
)]
fn cert_and_key(
    r: &mut Reader<'_>,
    t: &Dict,
    path: &KeyPath,
    (cert_key, key_key): (&str, &str),
) -> Option<Option<CertAndKey>> {
    let some_path = |r: &mut Reader<'_>, p: &KeyPath, v: &Value| file_path(r, p, v).map(Some);
    let cert = read_optional(r, t, path, cert_key, None, some_path);
    let key = read_optional(r, t, path, key_key, None, some_path);
    match (cert?, key?) {
        (Some(cert), Some(key)) => Some(Some(CertAndKey { cert, key })),
        (None, None) => Some(None),
        (Some(_), None) => {
            r.missing(
                &path.key(key_key),
                &format!("`{cert_key}` needs the certificate's private key (PEM) too"),
            );
            None
        }
        (None, Some(_)) => {
            r.missing(
                &path.key(cert_key),
                &format!("`{key_key}` needs its certificate chain (PEM) too"),
            );
            None
        }
    }
}
