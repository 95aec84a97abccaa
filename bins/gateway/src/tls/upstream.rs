//! TLS to the upstreams: the connector every upstream's clients (requests and probes) use.
//!
//! - An `http` upstream gets the same connector type, speaking plain TCP: one code path.
//! - An `https` upstream is verified against the **system's roots** (read once, through
//!   `rustls-native-certs`: on Debian `/etc/ssl/certs`, or what `SSL_CERT_FILE` /
//!   `SSL_CERT_DIR` name), plus the upstream's own `ca_file` when it has one (a private CA).
//!   `client_cert` / `client_key` make the gateway present a certificate (mutual TLS).
//! - The crypto is rustls with the ring provider, named explicitly so that no other crate's
//!   feature choice can change it. ALPN offers HTTP/1.1 only: the engines speak it, and the
//!   plain path does too.
//! - Every file is read when the configuration is loaded (start, `slotgate check`, reload): a
//!   missing, unreadable or malformed file is a [`TlsError`] naming the file and the reason, not
//!   a surprise at the first request. [`UpstreamTls`] keeps what it read, so a reload can tell
//!   whether a certificate file changed under the same path.
//!
//! A handshake that fails at runtime is recognised by [`is_tls_failure`], so that the request
//! path can say "TLS" in its 502 instead of calling it a refused connection.

use std::path::{Path, PathBuf};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::connect::HttpConnector;
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use slotgate_config::Upstream;
use tracing::warn;

/// The connector of every upstream client: plain TCP for `http`, rustls for `https`.
pub(crate) type Connector = HttpsConnector<HttpConnector>;

/// Why a TLS file could not be used. Always names the file.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    /// The file could not be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the PEM it should be.
    #[error("{}: {what}", path.display())]
    Pem {
        /// The file.
        path: PathBuf,
        /// What was expected.
        what: &'static str,
        /// Why, when the PEM parser said.
        #[source]
        source: Option<rustls_pki_types::pem::Error>,
    },
    /// rustls refused what the file holds (a CA that is not a valid certificate, a key of an
    /// unsupported type, a key that does not match its certificate).
    #[error("{}: {what}", path.display())]
    Refused {
        /// The file.
        path: PathBuf,
        /// What was being done with it.
        what: &'static str,
        /// rustls's reason.
        #[source]
        source: rustls::Error,
    },
}

/// The crypto provider of every TLS configuration here.
pub(crate) fn provider() -> Arc<CryptoProvider> {
    static PROVIDER: LazyLock<Arc<CryptoProvider>> =
        LazyLock::new(|| Arc::new(rustls::crypto::ring::default_provider()));
    Arc::clone(&PROVIDER)
}

/// The system's trust roots, read once per process.
fn system_roots() -> &'static [CertificateDer<'static>] {
    static ROOTS: LazyLock<Vec<CertificateDer<'static>>> = LazyLock::new(|| {
        let found = rustls_native_certs::load_native_certs();
        for error in &found.errors {
            warn!(%error, "some of the system's TLS roots could not be read");
        }
        found.certs
    });
    &ROOTS
}

/// An `https` upstream's TLS client configuration, and the bytes of the files it came from.
#[derive(Debug)]
pub(crate) struct UpstreamTls {
    config: Arc<ClientConfig>,
    /// `ca_file`, `client_cert`, `client_key` as read, in that order (absent ones empty).
    files: [Vec<u8>; 3],
}

impl UpstreamTls {
    /// Reads `upstream`'s TLS files and builds its client configuration; `None` for an `http`
    /// upstream.
    pub(crate) fn load(upstream: &Upstream) -> Result<Option<Self>, TlsError> {
        if upstream.url.scheme() != "https" {
            return Ok(None);
        }
        let files = read_files(upstream)?;
        let mut roots = RootCertStore::empty();
        roots.add_parsable_certificates(system_roots().iter().cloned());
        if let Some(path) = &upstream.ca_file {
            for cert in certificates(path, &files[0])? {
                roots.add(cert).map_err(|source| TlsError::Refused {
                    path: path.clone(),
                    what: "not a usable CA certificate",
                    source,
                })?;
            }
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|source| TlsError::Refused {
                path: upstream.ca_file.clone().unwrap_or_default(),
                what: "no TLS protocol version available",
                source,
            })?
            .with_root_certificates(roots);
        // ALPN is left to the connector builder (`enable_http1`), which insists on setting it.
        let config = match &upstream.client_identity {
            Some(identity) => {
                let chain = certificates(&identity.cert, &files[1])?;
                let key = private_key(&identity.key, &files[2])?;
                builder
                    .with_client_auth_cert(chain, key)
                    .map_err(|source| TlsError::Refused {
                        path: identity.key.clone(),
                        what: "not a usable client key for client_cert",
                        source,
                    })?
            }
            None => builder.with_no_client_auth(),
        };
        Ok(Some(Self {
            config: Arc::new(config),
            files,
        }))
    }

    /// Whether `upstream`'s TLS files still hold what was read into `tls` (both `None` for an
    /// `http` upstream). A file that cannot be read now counts as changed: the reload then
    /// reports it.
    pub(crate) fn unchanged(tls: Option<&Self>, upstream: &Upstream) -> bool {
        match tls {
            None => upstream.url.scheme() != "https",
            Some(tls) => read_files(upstream).is_ok_and(|files| files == tls.files),
        }
    }
}

/// A connector for an upstream: `tls` for `https` (see [`UpstreamTls::load`]), plain otherwise.
/// `tcp_keepalive` is the keepalive idle time of its sockets: a dead engine host that sent no
/// FIN is noticed by the kernel.
pub(crate) fn connector(
    tls: Option<&UpstreamTls>,
    connect_timeout: Duration,
    tcp_keepalive: Duration,
) -> Connector {
    let mut http = HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.set_nodelay(true);
    http.set_keepalive(Some(tcp_keepalive));
    // The TLS layer above hands `https` URIs down to this connector.
    http.enforce_http(false);
    match tls {
        Some(tls) => HttpsConnectorBuilder::new()
            .with_tls_config((*tls.config).clone())
            .https_only()
            .enable_http1()
            .wrap_connector(http),
        None => HttpsConnector::from((http, plain_only_config())),
    }
}

/// A client configuration that is never used: an `http` upstream's connector has no TLS to
/// speak, but the connector type carries one. Trusts nothing, so it could not connect anyway.
fn plain_only_config() -> Arc<ClientConfig> {
    static CONFIG: LazyLock<Arc<ClientConfig>> = LazyLock::new(|| {
        Arc::new(
            ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .expect("ring supports the default protocol versions")
                .with_root_certificates(RootCertStore::empty())
                .with_no_client_auth(),
        )
    });
    Arc::clone(&CONFIG)
}

/// Whether `error` (a connect error) is a TLS failure: a handshake refused by either side, a
/// certificate that does not verify, a peer that does not speak TLS.
pub(crate) fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(error) = next {
        if error.is::<rustls::Error>() {
            return true;
        }
        // tokio-rustls wraps rustls's error in an `io::Error` (and hyper-rustls wraps that in
        // another), whose `source` skips the wrapped error itself: look inside instead.
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(std::io::Error::get_ref)
        {
            next = Some(inner);
            continue;
        }
        next = error.source();
    }
    false
}

/// `ca_file`, `client_cert`, `client_key` of `upstream`, read (absent ones empty).
fn read_files(upstream: &Upstream) -> Result<[Vec<u8>; 3], TlsError> {
    let read = |path: Option<&Path>| path.map_or(Ok(Vec::new()), read_file);
    let identity = upstream.client_identity.as_ref();
    Ok([
        read(upstream.ca_file.as_deref())?,
        read(identity.map(|id| id.cert.as_path()))?,
        read(identity.map(|id| id.key.as_path()))?,
    ])
}

/// The bytes of a TLS file, or an error naming it.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        path: path.to_owned(),
        source,
    })
}

/// Every certificate of a PEM file (at least one).
pub(crate) fn certificates(
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::Pem {
            path: path.to_owned(),
            what: "not a valid PEM certificate file",
            source: Some(source),
        })?;
    if certs.is_empty() {
        return Err(TlsError::Pem {
            path: path.to_owned(),
            what: "no certificate found (expected PEM `-----BEGIN CERTIFICATE-----` blocks)",
            source: None,
        });
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1).
pub(crate) fn private_key(path: &Path, pem: &[u8]) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_slice(pem).map_err(|source| TlsError::Pem {
        path: path.to_owned(),
        what: "no private key found (expected a PEM `PRIVATE KEY` block)",
        source: Some(source),
    })
}

#[cfg(test)]
mod tests;
