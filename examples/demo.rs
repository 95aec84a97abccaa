//! The README's demo: two simulated `llama-server` hosts and the real gateway, in one process.
//!
//! ```sh
//! cargo run --release --example demo
//! ```
//!
//! - two `fake-upstream` llama-servers on 127.0.0.1:18081 and 127.0.0.1:18082, each with 2
//!   slots, serving `tiny-llama` at 20 tokens per second;
//! - the gateway with `examples/demo.toml`: API on 127.0.0.1:8080, admin on 127.0.0.1:9090,
//!   2 slots and 4 queue places per host, alias `demo`.
//!
//! It prints the live status page's URL and `curl` lines to try (a plain answer, a stream, a
//! burst that queues and gets some 503s, which the page shows), and runs until Ctrl-C.
//! `RUST_LOG=debug` shows every routing decision.

#![deny(warnings)]

use std::error::Error;
use std::net::SocketAddr;
use std::path::Path;

use fake_upstream::{FakeConfig, FakeUpstream};
use slotgate_config::Config;
use slotgate_gateway::Gateway;

const CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/demo.toml");

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();

    let mut fakes = Vec::new();
    for port in [18081, 18082] {
        let config = FakeConfig::llama_server(2)
            .model("tiny-llama")
            .tokens(40)
            .tokens_per_second(20.0)
            .listen(SocketAddr::from(([127, 0, 0, 1], port)));
        fakes.push(FakeUpstream::start(config).await?);
    }
    let config = Config::load(Path::new(CONFIG))?;
    let gateway = Gateway::bind(&config).await?;
    let api = gateway.api_addr();
    let admin = gateway
        .admin_addr()
        .map_or_else(|| "(no admin listener)".to_owned(), |a| a.to_string());
    let page = gateway.admin_addr().map_or_else(
        || "(no admin listener)".to_owned(),
        |a| format!("http://{a}/ui"),
    );

    println!(
        r#"
slotgate demo: gateway on http://{api} (admin on {admin}), config {CONFIG}
live status page: {page}  (open it, then run the burst below)
upstreams: two simulated llama-servers on 127.0.0.1:18081 and :18082, model "tiny-llama"
           (alias "demo"), 2 slots and 4 queue places each.

Plain answer:
  curl -s http://{api}/v1/chat/completions -H 'content-type: application/json' \
    -d '{{"model":"demo","messages":[{{"role":"user","content":"hi"}}]}}'

Streamed, chunk by chunk:
  curl -N http://{api}/v1/chat/completions -H 'content-type: application/json' \
    -d '{{"model":"demo","stream":true,"messages":[{{"role":"user","content":"hi"}}]}}'

A burst of 20 requests holding 3 s each: 4 run, 8 queue, 8 get 503 + Retry-After at once:
  for i in $(seq 20); do curl -s -o /dev/null -w '%{{http_code}} ' \
    -H 'content-type: application/json' -H 'x-fake-hold-ms: 3000' \
    -d '{{"model":"demo","messages":[{{"role":"user","content":"hi"}}]}}' \
    http://{api}/v1/chat/completions & done; wait; echo

One refusal in full (run it during the burst):
  curl -si http://{api}/v1/chat/completions -H 'content-type: application/json' \
    -d '{{"model":"demo","messages":[{{"role":"user","content":"hi"}}]}}'

Models, and the metrics:
  curl -s http://{api}/v1/models
  curl -s http://{admin}/metrics | grep '^slotgate_'

Ctrl-C to stop.
"#
    );

    tokio::signal::ctrl_c().await?;
    gateway.shutdown().await;
    for fake in fakes {
        fake.shutdown().await;
    }
    Ok(())
}
