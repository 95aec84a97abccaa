//! The official OpenAI Python SDK against the gateway: plain and streamed chats, the model list,
//! and a 404 and a 503 surfacing as the SDK's own error types.
//!
//! The test makes a virtualenv in the cache outside the repository (`support::venv_cache`) and
//! `pip install`s a pinned `openai` into it (once; later runs reuse it; pip and the script are
//! each bounded in time), then runs `tests/openai_sdk/check.py` against a gateway
//! and a fake llama-server started in-process. It needs `python3` with `venv` and access to
//! the Python Package Index. Set `SKIP_OPENAI_SDK_TEST=1` to skip it where neither is available.

mod support;

use std::path::Path;
use std::process::Command;

use support::{SCRIPT_LIMIT, fake, gateway, openai_python, run_bounded, server, upstream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_openai_python_sdk_works_through_the_gateway() {
    if std::env::var_os("SKIP_OPENAI_SDK_TEST").is_some() {
        eprintln!("SKIP_OPENAI_SDK_TEST is set: skipping the OpenAI SDK test");
        return;
    }
    let python = tokio::task::spawn_blocking(|| openai_python("openai-sdk-venv"))
        .await
        .unwrap();

    let fake = fake(4, "qwen").await;
    let gw = gateway(&format!(
        "{}[aliases]\nchat = \"qwen\"\n\n{}",
        server(""),
        upstream("gpu", &fake.url(), "qwen", 1, 0, "30s")
    ))
    .await;
    let base_url = format!("http://{}/v1", gw.api_addr());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/openai_sdk/check.py");
    let output = tokio::task::spawn_blocking(move || {
        run_bounded(Command::new(python).arg(script).arg(base_url), SCRIPT_LIMIT)
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
    gw.shutdown().await;
    fake.shutdown().await;
}
