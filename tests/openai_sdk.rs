//! The official OpenAI Python SDK against the gateway: plain and streamed chats, the model list,
//! and a 404 and a 503 surfacing as the SDK's own error types; over plain HTTP, then over TLS
//! with a private CA (certificates made here with `rcgen`) that the SDK is told to trust.
//!
//! The test makes a virtualenv in the cache outside the repository (`support::venv_cache`) and
//! `pip install`s a pinned `openai` into it (once; later runs reuse it; pip and the script are
//! each bounded in time), then runs `tests/openai_sdk/check.py` against a gateway
//! and a fake llama-server started in-process. It needs `python3` with `venv` and access to
//! the Python Package Index. Set `SKIP_OPENAI_SDK_TEST=1` to skip it where neither is available.

mod support;
mod tls_support;

use std::path::{Path, PathBuf};
use std::process::Command;

use support::{SCRIPT_LIMIT, fake, gateway, openai_python, run_bounded, server, upstream};
use tls_support::Pki;

/// Runs the SDK script against `base_url` (trusting `ca_file` only, when given).
async fn check(python: PathBuf, base_url: String, ca_file: Option<PathBuf>) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk/check.py");
    let output = tokio::task::spawn_blocking(move || {
        run_bounded(
            Command::new(python).arg(script).arg(base_url).args(ca_file),
            SCRIPT_LIMIT,
        )
    })
    .await
    .unwrap()
    .expect("the SDK script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the SDK script failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("all OpenAI SDK checks passed"), "{stdout}");
    eprintln!("{stdout}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_sdk_works_through_the_gateway_plain_and_over_tls() {
    if std::env::var_os("SKIP_OPENAI_SDK_TEST").is_some() {
        eprintln!("SKIP_OPENAI_SDK_TEST is set: skipping the OpenAI SDK test");
        return;
    }
    let python = tokio::task::spawn_blocking(|| openai_python("openai-sdk-venv"))
        .await
        .unwrap();

    let fake = fake(4, "qwen").await;
    let routes = format!(
        "[aliases]\nchat = \"qwen\"\n\n{}",
        upstream("gpu", &fake.url(), "qwen", 1, 0, "30s")
    );
    let gw = gateway(&format!("{}{routes}", server(""))).await;
    check(python.clone(), format!("http://{}/v1", gw.api_addr()), None).await;
    gw.shutdown().await;

    // The same checks through a TLS listener whose certificate a private CA signed.
    let pki = Pki::new();
    let leaf = pki.server("gateway", &["127.0.0.1"]);
    let tls_keys = format!(
        "tls_cert = \"{}\"\ntls_key = \"{}\"",
        leaf.cert.display(),
        leaf.key.display()
    );
    let gw = gateway(&format!("{}{routes}", server(&tls_keys))).await;
    let base_url = format!("https://{}/v1", gw.api_addr());
    check(python, base_url, Some(pki.ca_file())).await;
    gw.shutdown().await;
    fake.shutdown().await;
}
