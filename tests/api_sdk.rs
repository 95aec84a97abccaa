//! The official clients of the APIs past chat through the gateway (#14): the OpenAI Python SDK
//! (`responses.create` plain, streamed and with `previous_response_id` across two upstreams; a
//! multipart transcription; a Responses stream the gateway cuts raising `APIError`), the `anthropic` SDK (`messages.create` plain and streamed) and the
//! `ollama` client (`chat` and `generate`, streamed).
//!
//! The test makes a virtualenv in the cache outside the repository (`support::venv_cache`) with
//! the pinned clients (once; later runs reuse it; pip and the script are each bounded in time)
//! and runs `tests/api_sdk/check.py` against a gateway and fakes started in-process. It needs `python3` with `venv` and the Python Package Index. Set
//! `SKIP_OPENAI_SDK_TEST=1` to skip it where neither is available, as for the chat SDK test.

mod support;

use std::path::Path;
use std::process::Command;

use fake_upstream::{FakeConfig, FakeUpstream};
use support::{OPENAI_SDK, SCRIPT_LIMIT, gateway, python_with, run_bounded, server};

/// The pinned clients.
const CLIENTS: [&str; 3] = [OPENAI_SDK, "anthropic==2.10.0", "ollama==0.6.3"];

async fn start(config: FakeConfig) -> FakeUpstream {
    FakeUpstream::start(config)
        .await
        .expect("fake upstream starts")
}

fn upstream_of(kind: &str, name: &str, url: &str, model: &str) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"{url}\"\nkind = \"{kind}\"\n\n\
         [upstreams.{name}.models.{model}]\nparallel = 4\nqueue = 16\nqueue_timeout = \"30s\"\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_clients_of_every_api_work_through_the_gateway() {
    if std::env::var_os("SKIP_OPENAI_SDK_TEST").is_some() {
        eprintln!("SKIP_OPENAI_SDK_TEST is set: skipping the API clients test");
        return;
    }
    let python = tokio::task::spawn_blocking(|| python_with("api-clients-venv", &CLIENTS))
        .await
        .unwrap();

    let a = start(
        FakeConfig::vllm(4)
            .model("m")
            .model("busy")
            .model("org/slow"),
    )
    .await;
    let b = start(FakeConfig::vllm(4).model("m")).await;
    let o = start(FakeConfig::ollama(4).model("o")).await;
    // Issue #31: an engine whose streams the gateway gives up on after 300 ms of silence.
    let s = start(FakeConfig::llama_server(4).model("stall")).await;
    let gw = gateway(&format!(
        "{}{}{}{}{}{}",
        server(""),
        upstream_of("vllm", "a", &a.url(), "m"),
        // Issue #31: one slot and no queue (a refusal at once), and one slot with a queue (a
        // client deadline it cannot keep); a model id with a slash.
        "[upstreams.a.models.busy]\nparallel = 1\nqueue = 0\nqueue_timeout = \"30s\"\n\
         [upstreams.a.models.\"org/slow\"]\nparallel = 1\nqueue = 4\nqueue_timeout = \"30s\"\n",
        upstream_of("vllm", "b", &b.url(), "m"),
        upstream_of("ollama", "o", &o.url(), "o"),
        upstream_of("llama-server", "s", &s.url(), "stall").replacen(
            "kind = \"llama-server\"\n",
            "kind = \"llama-server\"\nstream_idle_timeout = \"300ms\"\n",
            1
        ),
    ))
    .await;
    let base = format!("http://{}", gw.api_addr());
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/api_sdk/check.py");
    let output = tokio::task::spawn_blocking(move || {
        run_bounded(Command::new(python).arg(script).arg(base), SCRIPT_LIMIT)
    })
    .await
    .unwrap()
    .expect("the client script runs");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "the client script failed\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    assert!(stdout.contains("all API client checks passed"), "{stdout}");
    // The follow-ups were answered, so each reached the upstream that made its predecessor;
    // that proves affinity only if both upstreams made some.
    let follow_ups = |fake: &FakeUpstream| {
        fake.observer()
            .inference_requests()
            .iter()
            .filter(|r| r.path == "/v1/responses")
            .count()
    };
    assert!(
        follow_ups(&a) > 0 && follow_ups(&b) > 0,
        "both upstreams made responses"
    );
    gw.shutdown().await;
    for fake in [a, b, o, s] {
        fake.shutdown().await;
    }
}
