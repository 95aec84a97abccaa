//! TLS helpers for the end-to-end tests: a private CA made with `rcgen` whose certificates are
//! written as PEM files, and [`TlsFront`], a TLS-terminating TCP relay in front of a fake engine
//! (so that the fake itself stays plain HTTP), and TLS clients for the gateway's own listeners.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper_rustls::{HttpsConnector, HttpsConnectorBuilder};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair,
};
use rustls::RootCertStore;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{JoinHandle, JoinSet};
use tokio_rustls::client::TlsStream as ClientTls;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// A private certificate authority whose files live in a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
    ca: CertifiedIssuer<'static, KeyPair>,
}

/// A certificate and its key, as PEM files.
#[derive(Debug, Clone)]
pub struct Leaf {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Pki {
    /// A fresh CA; its certificate is at [`Pki::ca_file`].
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "slotgate test CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        Self { dir, ca }
    }

    /// The CA certificate (PEM).
    pub fn ca_file(&self) -> PathBuf {
        self.dir.path().join("ca.pem")
    }

    /// A directory for the test's other files, removed with the CA.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A server certificate for `names` (DNS names or IP addresses), written as `NAME.pem` and
    /// `NAME-key.pem`.
    pub fn server(&self, file: &str, names: &[&str]) -> Leaf {
        self.leaf(file, names, ExtendedKeyUsagePurpose::ServerAuth)
    }

    /// A client certificate for mutual TLS.
    pub fn client(&self, file: &str) -> Leaf {
        self.leaf(file, &[], ExtendedKeyUsagePurpose::ClientAuth)
    }

    fn leaf(&self, file: &str, names: &[&str], usage: ExtendedKeyUsagePurpose) -> Leaf {
        let mut params =
            CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
                .unwrap();
        params.distinguished_name.push(DnType::CommonName, file);
        params.extended_key_usages = vec![usage];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        let leaf = Leaf {
            cert: self.dir.path().join(format!("{file}.pem")),
            key: self.dir.path().join(format!("{file}-key.pem")),
        };
        std::fs::write(&leaf.cert, cert.pem()).unwrap();
        std::fs::write(&leaf.key, key.serialize_pem()).unwrap();
        leaf
    }

    /// A root store that trusts this CA only.
    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.der().clone()).unwrap();
        roots
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads a leaf's chain and key.
pub fn read_leaf(leaf: &Leaf) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let certs = CertificateDer::pem_file_iter(&leaf.cert)
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(&leaf.key).unwrap();
    (certs, key)
}

/// A TLS-terminating relay: TLS on its own port, plain TCP to `backend`.
pub struct TlsFront {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl TlsFront {
    /// Serves `server` on a loopback port; with `client_ca`, a client certificate signed by it
    /// is required (mutual TLS).
    pub async fn start(backend: SocketAddr, server: &Leaf, client_ca: Option<&Pki>) -> Self {
        Self::start_at("127.0.0.1:0".parse().unwrap(), backend, server, client_ca).await
    }

    /// Like [`TlsFront::start`], on `bind` (to take over the port of a front that stopped).
    pub async fn start_at(
        bind: SocketAddr,
        backend: SocketAddr,
        server: &Leaf,
        client_ca: Option<&Pki>,
    ) -> Self {
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = match client_ca {
            Some(pki) => builder.with_client_cert_verifier(
                WebPkiClientVerifier::builder_with_provider(Arc::new(pki.roots()), provider())
                    .build()
                    .unwrap(),
            ),
            None => builder.with_no_client_auth(),
        };
        let (certs, key) = read_leaf(server);
        let config = builder.with_single_cert(certs, key).unwrap();
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            // Dropped with the task: every relayed connection ends with the front.
            let mut relays = JoinSet::new();
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                relays.spawn(async move {
                    let Ok(mut tls) = acceptor.accept(stream).await else {
                        return; // a refused handshake: the client sees the alert
                    };
                    let Ok(mut plain) = TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
                while relays.try_join_next().is_some() {}
            }
        });
        Self { addr, task }
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops it, cutting every relayed connection.
    pub async fn shutdown(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// A TLS client configuration trusting `pki` only, offering `alpn`.
pub fn client_config(pki: &Pki, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(pki.roots())
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

/// A pooled HTTPS client trusting `pki` only, speaking h2 (preferred by ALPN) and HTTP/1.1, or
/// HTTP/1.1 only.
pub fn https_client(pki: &Pki, h2: bool) -> Client<HttpsConnector<HttpConnector>, Full<Bytes>> {
    let builder = HttpsConnectorBuilder::new()
        .with_tls_config(client_config(pki, &[]))
        .https_only();
    let connector = if h2 {
        builder.enable_all_versions().build()
    } else {
        builder.enable_http1().build()
    };
    Client::builder(TokioExecutor::new()).build(connector)
}

/// Opens a TLS connection to `addr` (as `127.0.0.1`) trusting `pki` only, offering `alpn`.
pub async fn tls_connect(pki: &Pki, addr: SocketAddr, alpn: &[&[u8]]) -> ClientTls<TcpStream> {
    let connector = TlsConnector::from(Arc::new(client_config(pki, alpn)));
    let tcp = TcpStream::connect(addr).await.expect("connect");
    connector
        .connect(ServerName::IpAddress(addr.ip().into()), tcp)
        .await
        .expect("TLS handshake")
}

/// The leaf certificate a TLS connection's server presented.
pub fn server_leaf(tls: &ClientTls<TcpStream>) -> CertificateDer<'static> {
    tls.get_ref()
        .1
        .peer_certificates()
        .expect("a server certificate")[0]
        .clone()
        .into_owned()
}
