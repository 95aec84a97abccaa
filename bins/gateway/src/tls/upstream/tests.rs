//! Unit tests: every bad TLS file is an error naming the file and the reason; a changed file is
//! seen by a reload; a handshake failure is told apart from a refused connection.

use std::io::Write as _;

use slotgate_config::{Config, Upstream};
use tempfile::NamedTempFile;

use super::{UpstreamTls, is_tls_failure};
use crate::support::error::chain;

fn upstream_with(tls_keys: &str) -> Upstream {
    let toml = format!(
        r#"
        [server]
        listen = "127.0.0.1:0"
        [upstreams.a]
        url = "https://127.0.0.1:8443"
        kind = "vllm"
        {tls_keys}
        [upstreams.a.models.m]
        parallel = 1
        queue = 0
        queue_timeout = "1s"
        "#
    );
    let mut config = Config::from_toml_str(&toml).unwrap();
    config.upstreams.remove("a").unwrap()
}

fn file(contents: &[u8]) -> NamedTempFile {
    let mut file = NamedTempFile::new().unwrap();
    file.write_all(contents).unwrap();
    file
}

fn load_error(upstream: &Upstream) -> String {
    chain(&UpstreamTls::load(upstream).expect_err("the TLS files are bad"))
}

/// The load error for an upstream with this client certificate and key, checked to name the
/// key's file (the one at fault in every caller).
fn client_identity_error(cert: &[u8], key: &[u8]) -> String {
    let cert_file = file(cert);
    let key_file = file(key);
    let upstream = upstream_with(&format!(
        "client_cert = \"{}\"\nclient_key = \"{}\"",
        cert_file.path().display(),
        key_file.path().display()
    ));
    let error = load_error(&upstream);
    assert!(
        error.contains(&key_file.path().display().to_string()),
        "{error}"
    );
    error
}

#[test]
fn an_http_upstream_needs_no_tls() {
    let mut upstream = upstream_with("");
    upstream.url = "http://127.0.0.1:8080".parse().unwrap();
    assert!(UpstreamTls::load(&upstream).unwrap().is_none());
    assert!(UpstreamTls::unchanged(None, &upstream));
}

#[test]
fn an_https_upstream_without_files_uses_the_system_roots() {
    let upstream = upstream_with("");
    assert!(UpstreamTls::load(&upstream).unwrap().is_some());
}

#[test]
fn a_missing_ca_file_names_the_file() {
    let upstream = upstream_with(r#"ca_file = "/nonexistent/slotgate-ca.pem""#);
    let error = load_error(&upstream);
    assert!(
        error.starts_with("cannot read /nonexistent/slotgate-ca.pem: "),
        "{error}"
    );
}

#[test]
fn a_ca_file_without_certificates_says_so() {
    let ca = file(b"this is not PEM\n");
    let upstream = upstream_with(&format!("ca_file = \"{}\"", ca.path().display()));
    let error = load_error(&upstream);
    assert!(error.contains(&ca.path().display().to_string()), "{error}");
    assert!(error.contains("no certificate found"), "{error}");
}

#[test]
fn a_client_key_file_without_a_key_says_so() {
    let cert = rcgen::generate_simple_self_signed(vec!["client".to_owned()]).unwrap();
    // A certificate where the key should be.
    let error = client_identity_error(cert.cert.pem().as_bytes(), cert.cert.pem().as_bytes());
    assert!(error.contains("no private key found"), "{error}");
}

#[test]
fn a_client_key_that_does_not_match_its_certificate_is_refused() {
    let one = rcgen::generate_simple_self_signed(vec!["one".to_owned()]).unwrap();
    let other = rcgen::generate_simple_self_signed(vec!["other".to_owned()]).unwrap();
    let error = client_identity_error(
        one.cert.pem().as_bytes(),
        other.signing_key.serialize_pem().as_bytes(),
    );
    assert!(error.contains("not a usable client key"), "{error}");
}

#[test]
fn a_renewed_ca_file_is_a_change() {
    let first = rcgen::generate_simple_self_signed(vec!["ca".to_owned()]).unwrap();
    let ca = file(first.cert.pem().as_bytes());
    let upstream = upstream_with(&format!("ca_file = \"{}\"", ca.path().display()));
    let tls = UpstreamTls::load(&upstream).unwrap().unwrap();
    assert!(UpstreamTls::unchanged(Some(&tls), &upstream));

    let renewed = rcgen::generate_simple_self_signed(vec!["ca".to_owned()]).unwrap();
    std::fs::write(ca.path(), renewed.cert.pem()).unwrap();
    assert!(!UpstreamTls::unchanged(Some(&tls), &upstream));
}

#[test]
fn a_handshake_failure_is_told_apart_from_a_refused_connection() {
    let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
    assert!(!is_tls_failure(&refused));
    let handshake = std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
    );
    assert!(is_tls_failure(&handshake));
    // hyper-rustls wraps tokio-rustls's `io::Error` in another.
    let wrapped = std::io::Error::other(handshake);
    assert!(is_tls_failure(&wrapped));
}
