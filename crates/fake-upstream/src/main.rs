//! `fake-upstream`: run one simulated inference server by hand, to try slotgate configs without
//! a GPU.
//!
//! ```text
//! fake-upstream --kind llama-server --parallel 4 --port 18081 --hold-ms 2000 --tokens 32
//! fake-upstream --kind vllm --parallel 8 --port 18082 --model reasoning --tps 20
//! fake-upstream --kind ollama --parallel 1 --max-queue 4 --port 11434 --model llama3 --unloaded-model qwen
//! ```
//!
//! Every request can still be steered with the `x-fake-*` headers (see the library docs).

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use fake_upstream::{FakeConfig, FakeUpstream, Kind, Pacing, parse_failures};

/// Exit status for a bad command line or configuration (sysexits `EX_USAGE`).
const EX_USAGE: u8 = 64;

/// Simulates llama-server, vLLM or Ollama on 127.0.0.1.
#[derive(Debug, Parser)]
#[command(name = "fake-upstream", version, about)]
// Each flag mirrors one of the real servers' own switches.
#[allow(clippy::struct_excessive_bools)]
struct Args {
    /// Which server to imitate: llama-server, vllm or ollama.
    #[arg(long, default_value = "llama-server")]
    kind: Kind,
    /// Slots per model (llama-server --parallel, vLLM --max-num-seqs, Ollama num-parallel).
    #[arg(long, default_value_t = 4)]
    parallel: usize,
    /// Port on 127.0.0.1 (0 picks a free one and prints it).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// A resident model (repeatable). Default: fake-model.
    #[arg(long = "model")]
    models: Vec<String>,
    /// A known but not resident model (repeatable; router mode and Ollama).
    #[arg(long = "unloaded-model")]
    unloaded_models: Vec<String>,
    /// llama-server router mode (several models, loaded on demand).
    #[arg(long)]
    router: bool,
    /// llama-server router: refuse requests for unloaded models instead of loading them.
    #[arg(long)]
    no_autoload: bool,
    /// Router --models-max, or Ollama's max loaded models: models running at once (0: no
    /// bound); past it the least recently used idle model is unloaded.
    #[arg(long, default_value_t = 0)]
    models_max: usize,
    /// llama-server: overcommitted unified KV cache; more than --parallel at once fail together.
    #[arg(long)]
    collapse: bool,
    /// Ollama's bound on pending requests (max-queue); past it, 503.
    #[arg(long, default_value_t = 512)]
    max_queue: usize,
    /// Context size per slot.
    #[arg(long, default_value_t = 4096)]
    n_ctx: u32,
    /// Milliseconds before the server is ready.
    #[arg(long, default_value_t = 0)]
    startup_ms: u64,
    /// Milliseconds to load a model on demand.
    #[arg(long, default_value_t = 0)]
    load_ms: u64,
    /// Completion tokens per answer.
    #[arg(long, default_value_t = 8)]
    tokens: u32,
    /// Total generation time per request in milliseconds.
    #[arg(long, conflicts_with_all = ["tps", "chunk_interval_ms"])]
    hold_ms: Option<u64>,
    /// Tokens per second.
    #[arg(long, conflicts_with = "chunk_interval_ms")]
    tps: Option<f64>,
    /// Milliseconds between streamed tokens.
    #[arg(long)]
    chunk_interval_ms: Option<u64>,
    /// Failures injected into every request, e.g. "slow-first-byte-ms=500,die-after-chunks=3".
    #[arg(long, default_value = "none")]
    fail: String,
    /// Answer /metrics with llama-server's 501, like a server started without --metrics.
    #[arg(long)]
    no_metrics: bool,
    /// Answer /slots with llama-server's 501 (--no-slots).
    #[arg(long)]
    no_slots: bool,
    /// Remember Responses API answers, so a later look-up or follow-up by id finds them
    /// (default: on for vllm, off for the others).
    #[arg(long)]
    responses_store: Option<bool>,
    /// Report 0 cached prompt tokens always, instead of modelling the engine's prompt cache.
    #[arg(long)]
    no_prompt_cache: bool,
    /// Prompt tokens kept besides the slots: llama-server's --cache-ram, vLLM's prefix cache
    /// (default: 0 for llama-server, 262144 for vllm).
    #[arg(long)]
    cache_tokens: Option<usize>,
    /// Prefill microseconds per uncached prompt token, before the first token.
    #[arg(long, default_value_t = 0)]
    prefill_us_per_token: u64,
    /// vLLM --enable-prompt-tokens-details: report the cached tokens in the usage.
    #[arg(long)]
    enable_prompt_tokens_details: bool,
}

impl Args {
    fn into_config(self) -> Result<FakeConfig, String> {
        let pacing = match (self.hold_ms, self.tps, self.chunk_interval_ms) {
            (Some(ms), _, _) => Pacing::Hold(Duration::from_millis(ms)),
            (_, Some(tps), _) => Pacing::TokensPerSecond(tps),
            (_, _, Some(ms)) => Pacing::ChunkInterval(Duration::from_millis(ms)),
            _ => Pacing::Instant,
        };
        let failures = parse_failures(&self.fail).map_err(|e| e.to_string())?;
        let mut config = FakeConfig::new(self.kind, self.parallel)
            .port(self.port)
            .router(self.router)
            .autoload(!self.no_autoload)
            .models_max(self.models_max)
            .collapse(self.collapse)
            .max_queue(self.max_queue)
            .n_ctx(self.n_ctx)
            .startup_delay(Duration::from_millis(self.startup_ms))
            .model_load_delay(Duration::from_millis(self.load_ms))
            .tokens(self.tokens)
            .pacing(pacing)
            .metrics(!self.no_metrics)
            .slots_endpoint(!self.no_slots)
            .prompt_cache(!self.no_prompt_cache)
            .prefill_per_token(Duration::from_micros(self.prefill_us_per_token))
            .prompt_tokens_details(self.enable_prompt_tokens_details);
        if let Some(tokens) = self.cache_tokens {
            config = config.cache_tokens(tokens);
        }
        config.failures = failures;
        if let Some(on) = self.responses_store {
            config = config.responses_store(on);
        }
        for model in self.models {
            config = config.model(model);
        }
        for model in self.unloaded_models {
            config = config.unloaded_model(model);
        }
        Ok(config)
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let config = match args.into_config() {
        Ok(config) => config,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::from(EX_USAGE);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(config))
}

async fn run(config: FakeConfig) -> ExitCode {
    let kind = config.kind;
    let fake = match FakeUpstream::start(config).await {
        Ok(fake) => fake,
        Err(e @ fake_upstream::StartError::Config(_)) => {
            tracing::error!("{e}");
            return ExitCode::from(EX_USAGE);
        }
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(%kind, url = %fake.url(), "fake upstream listening");
    if let Err(e) = tokio::signal::ctrl_c().await {
        tracing::error!(error = %e, "cannot wait for ctrl-c");
    }
    tracing::info!("shutting down");
    fake.shutdown().await;
    ExitCode::SUCCESS
}
