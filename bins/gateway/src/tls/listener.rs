//! TLS on the gateway's own listeners: `server.tls_cert` / `tls_key` for the API listener and
//! `admin_tls_cert` / `admin_tls_key` for the admin one.
//!
//! - The files are read with the rest of the configuration (at start, by `slotgate check`, at
//!   every reload): a missing file, a file that is not PEM, or a key that does not belong to its
//!   certificate is a [`ListenerTlsError`] naming the key and the file; it stops the start and
//!   refuses a reload.
//! - Each TLS listener presents the certificate in its [`CertSlot`], read at every handshake. A
//!   reload (`SIGHUP`, `POST /admin/reload`) puts the renewed certificate in the slot: new
//!   connections get it, connections already open keep theirs and are not dropped. Turning TLS
//!   on or off needs a restart (the reload reports it).
//! - ALPN offers `h2`, then `http/1.1`. The decrypted connection is served exactly like a plain
//!   one, so a client offering no ALPN still gets HTTP/1.1 (or h2 with prior knowledge).
//! - The crypto is rustls with the ring provider, as for the upstreams ([`tls::upstream`](super::upstream)).

use std::sync::Arc;

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use slotgate_config::{CertAndKey, Server};
use tokio_rustls::TlsAcceptor;

use crate::tls::{self, TlsError};

/// Why a listener's certificate cannot be used: the key that names it, and the file's problem.
#[derive(Debug, thiserror::Error)]
#[error("server.{key}")]
pub(crate) struct ListenerTlsError {
    /// `tls_cert` or `admin_tls_cert`.
    key: &'static str,
    /// What is wrong with which file.
    #[source]
    source: TlsError,
}

/// A listener certificate as read from its files: the chain and the key that signs for it.
#[derive(Debug, Clone)]
pub(crate) struct ListenerCert(Arc<CertifiedKey>);

impl ListenerCert {
    /// Reads `files` (a PEM chain, leaf first, and its PEM private key) and checks that the key
    /// belongs to the leaf.
    pub(crate) fn load(files: &CertAndKey) -> Result<Self, TlsError> {
        let chain = tls::certificates(&files.cert, &tls::read_file(&files.cert)?)?;
        let key = tls::private_key(&files.key, &tls::read_file(&files.key)?)?;
        let certified = CertifiedKey::from_der(chain, key, &tls::provider()).map_err(|source| {
            TlsError::Refused {
                path: files.key.clone(),
                what: "not a usable private key for the certificate",
                source,
            }
        })?;
        Ok(Self(Arc::new(certified)))
    }
}

/// The certificates of both listeners for one configuration (`None`: that listener is plain).
#[derive(Debug, Clone, Default)]
pub(crate) struct ListenerCerts {
    /// `tls_cert` / `tls_key`.
    pub(crate) api: Option<ListenerCert>,
    /// `admin_tls_cert` / `admin_tls_key`.
    pub(crate) admin: Option<ListenerCert>,
}

impl ListenerCerts {
    /// Reads the certificate files `server` names; every problem found.
    pub(crate) fn load(server: &Server) -> Result<Self, Vec<ListenerTlsError>> {
        let mut problems = Vec::new();
        let mut load = |key, files: Option<&CertAndKey>| {
            let files = files?;
            ListenerCert::load(files)
                .map_err(|source| problems.push(ListenerTlsError { key, source }))
                .ok()
        };
        let certs = Self {
            api: load("tls_cert", server.tls.as_ref()),
            admin: load("admin_tls_cert", server.admin_tls.as_ref()),
        };
        if problems.is_empty() {
            Ok(certs)
        } else {
            Err(problems)
        }
    }
}

/// The certificate a listener presents, replaceable while it serves.
#[derive(Debug)]
pub(crate) struct CertSlot {
    current: RwLock<Arc<CertifiedKey>>,
}

impl CertSlot {
    /// A slot presenting `cert`.
    pub(crate) fn new(cert: &ListenerCert) -> Arc<Self> {
        Arc::new(Self {
            current: RwLock::new(Arc::clone(&cert.0)),
        })
    }

    /// Presents `cert` from the next handshake on; open connections keep theirs.
    pub(crate) fn replace(&self, cert: &ListenerCert) {
        *self.current.write() = Arc::clone(&cert.0);
    }

    /// A TLS acceptor presenting this slot's certificate, offering `h2` and `http/1.1` by ALPN.
    pub(crate) fn acceptor(self: &Arc<Self>) -> TlsAcceptor {
        let mut config = ServerConfig::builder_with_provider(tls::provider())
            .with_safe_default_protocol_versions()
            .expect("ring supports the default protocol versions")
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(self) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        TlsAcceptor::from(Arc::new(config))
    }
}

impl ResolvesServerCert for CertSlot {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(Arc::clone(&self.current.read()))
    }
}

/// The certificate slots of the listeners that speak TLS, kept for reloads.
#[derive(Debug, Default)]
pub(crate) struct ListenerSlots {
    /// The API listener's, when it speaks TLS.
    pub(crate) api: Option<Arc<CertSlot>>,
    /// The admin listener's, when it speaks TLS.
    pub(crate) admin: Option<Arc<CertSlot>>,
}

impl ListenerSlots {
    /// Slots for the listeners that `certs` makes speak TLS.
    pub(crate) fn new(certs: &ListenerCerts) -> Self {
        Self {
            api: certs.api.as_ref().map(CertSlot::new),
            admin: certs.admin.as_ref().map(CertSlot::new),
        }
    }

    /// The acceptors of the API and the admin listener (`None`: that listener is plain).
    pub(crate) fn acceptors(&self) -> (Option<TlsAcceptor>, Option<TlsAcceptor>) {
        (
            self.api.as_ref().map(CertSlot::acceptor),
            self.admin.as_ref().map(CertSlot::acceptor),
        )
    }

    /// Puts the certificates of a reloaded configuration in force. A listener that was started
    /// plain stays plain, and one started with TLS keeps its certificate when the new
    /// configuration has none: switching needs a restart.
    pub(crate) fn renew(&self, certs: &ListenerCerts) {
        for (slot, cert) in [(&self.api, &certs.api), (&self.admin, &certs.admin)] {
            if let (Some(slot), Some(cert)) = (slot, cert) {
                slot.replace(cert);
            }
        }
    }
}

#[cfg(test)]
mod tests;
