//! Unit tests: a listener certificate that cannot be used is an error naming the key and the
//! file; a slot hands out the certificate it was last given.

use rcgen::{CertificateParams, KeyPair};
use slotgate_config::{CertAndKey, Config};
use tempfile::TempDir;

use super::{CertSlot, ListenerCert, ListenerCerts};
use crate::support::error::chain;

/// A self-signed certificate for `name` and its key, written to `dir`.
fn leaf(dir: &TempDir, name: &str) -> CertAndKey {
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec![name.to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let files = CertAndKey {
        cert: dir.path().join(format!("{name}.pem")),
        key: dir.path().join(format!("{name}-key.pem")),
    };
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    files
}

fn server_with(tls_keys: &str) -> slotgate_config::Server {
    let toml = format!(
        r#"
        [server]
        listen = "127.0.0.1:0"
        admin_listen = "127.0.0.1:0"
        {tls_keys}
        [upstreams.a]
        url = "http://127.0.0.1:8080"
        kind = "vllm"
        [upstreams.a.models.m]
        parallel = 1
        queue = 0
        queue_timeout = "1s"
        "#
    );
    Config::from_toml_str(&toml).unwrap().server
}

#[test]
fn a_missing_certificate_names_the_key_and_the_file() {
    let dir = TempDir::new().unwrap();
    let good = leaf(&dir, "localhost");
    let server = server_with(&format!(
        "tls_cert = \"/nonexistent/slotgate-cert.pem\"\ntls_key = \"{}\"\n\
         admin_tls_cert = \"{}\"\nadmin_tls_key = \"/nonexistent/slotgate-key.pem\"",
        good.key.display(),
        good.cert.display(),
    ));
    let problems: Vec<String> = ListenerCerts::load(&server)
        .expect_err("both listeners name a missing file")
        .iter()
        .map(|problem| chain(problem))
        .collect();
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("server.tls_cert: cannot read /nonexistent/slotgate-cert.pem: "),
        "{problems:?}"
    );
    assert!(
        problems[1]
            .starts_with("server.admin_tls_cert: cannot read /nonexistent/slotgate-key.pem: "),
        "{problems:?}"
    );
}

#[test]
fn a_key_that_is_not_the_certificates_is_refused() {
    let dir = TempDir::new().unwrap();
    let one = leaf(&dir, "one.test");
    let other = leaf(&dir, "other.test");
    let mixed = CertAndKey {
        cert: one.cert,
        key: other.key.clone(),
    };
    let error = chain(&ListenerCert::load(&mixed).expect_err("the key is another's"));
    assert!(
        error.starts_with(&format!(
            "{}: not a usable private key for the certificate",
            other.key.display()
        )),
        "{error}"
    );
}

#[test]
fn a_certificate_file_without_certificates_says_so() {
    let dir = TempDir::new().unwrap();
    let good = leaf(&dir, "localhost");
    let swapped = CertAndKey {
        cert: good.key.clone(),
        key: good.key,
    };
    let error = chain(&ListenerCert::load(&swapped).expect_err("a key is no certificate"));
    assert!(error.contains("no certificate found"), "{error}");
}

#[test]
fn plain_listeners_need_no_files_and_a_slot_presents_its_latest_certificate() {
    let none = ListenerCerts::load(&server_with("")).unwrap();
    assert!(none.api.is_none() && none.admin.is_none());

    let dir = TempDir::new().unwrap();
    let first = ListenerCert::load(&leaf(&dir, "first.test")).unwrap();
    let second = ListenerCert::load(&leaf(&dir, "second.test")).unwrap();
    let slot = CertSlot::new(&first);
    assert_eq!(slot.current.read().cert, first.0.cert);
    slot.replace(&second);
    assert_eq!(slot.current.read().cert, second.0.cert);
    assert_ne!(first.0.cert, second.0.cert);
}
