//! The `slotgate` binary: parses the command line, loads the configuration, sets up logging and
//! starts the gateway. Everything else lives in the `slotgate_gateway` library.
//!
//! ```text
//! slotgate serve --config slotgate.toml   # run until Ctrl-C / SIGTERM; SIGHUP reloads
//! slotgate check --config slotgate.toml   # validate; print the effective configuration
//! ```
//!
//! `check` also asks the engine of every `parallel = "auto"` model for its slot count (one
//! `GET /props` each, bounded by `server.health_check_timeout`) and says what it found on
//! stderr. An engine that does not answer is reported but does not fail the check: the
//! configuration is valid, and the gateway keeps that model unavailable until it answers.
//!
//! Exit codes: `0` success, `64` (`EX_USAGE`) invalid configuration, `1` any other failure.

use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use slotgate_config::Config;
use slotgate_gateway::{Gateway, StartError};
use tracing::{error, info};
use tracing_subscriber::EnvFilter;

/// `EX_USAGE` from sysexits(3), as linkerd2-proxy uses it: the configuration is wrong.
const EX_USAGE: u8 = 64;

/// An OpenAI-compatible gateway that caps and queues requests per (upstream, model).
#[derive(Debug, Parser)]
#[command(name = "slotgate", version)]
struct Cli {
    /// Log format (the level comes from `RUST_LOG`, default `info`).
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway until Ctrl-C or SIGTERM, then drain and stop. SIGHUP reloads the
    /// configuration file.
    Serve {
        /// The TOML configuration file (`SLOTGATE_*` environment variables override it).
        #[arg(long, short)]
        config: PathBuf,
    },
    /// Validate the configuration and print it with every default made visible.
    Check {
        /// The TOML configuration file (`SLOTGATE_*` environment variables override it).
        #[arg(long, short)]
        config: PathBuf,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => check(&config),
        Command::Serve { config } => {
            // Kept until the gateway has stopped: dropping it writes out what is still queued.
            let _log = init_logging(cli.log_format);
            serve(&config)
        }
    }
}

/// `slotgate check`: every problem on stderr, or the effective configuration on stdout.
fn check(path: &Path) -> ExitCode {
    let config = match load(path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    if let Err(problem) = slotgate_gateway::check(&config) {
        eprintln!("{}: {problem}", path.display());
        return ExitCode::from(EX_USAGE);
    }
    if let Err(error) = report_auto_slots(&config) {
        eprintln!("cannot probe the parallel = \"auto\" models: {error}");
        return ExitCode::FAILURE;
    }
    print!("{}", config.to_effective_toml());
    ExitCode::SUCCESS
}

/// Asks the engine of each `parallel = "auto"` model for its slot count and prints the answers
/// on stderr (stdout stays the effective configuration).
fn report_auto_slots(config: &Config) -> std::io::Result<()> {
    let count = config
        .upstreams
        .values()
        .flat_map(|u| u.models.values())
        .filter(|limits| limits.is_auto())
        .count();
    if count == 0 {
        return Ok(());
    }
    eprintln!(
        "probing the engine of {count} parallel = \"auto\" model{} for its slot count \
         (GET /props, timeout {})",
        if count == 1 { "" } else { "s" },
        humantime::format_duration(config.server.health_check_timeout)
    );
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    for found in runtime.block_on(slotgate_gateway::probe_config(config)) {
        let key = format!("upstreams.{}.models.{}", found.upstream, found.model);
        match found.slots {
            Ok(slots) => eprintln!("  {key}: {slots} slots (total_slots at {})", found.url),
            Err(error) => eprintln!(
                "  {key}: slot count unknown ({}); the gateway keeps this model \
                 unavailable on this upstream until the engine answers",
                chain(&error)
            ),
        }
    }
    Ok(())
}

fn load(path: &Path) -> Result<Config, ExitCode> {
    Config::load(path).map_err(|error| {
        let issues = error.issues();
        if issues.is_empty() {
            eprintln!("{}: {error}", path.display());
        } else {
            eprintln!(
                "{}: {} problem{} in the configuration:",
                path.display(),
                issues.len(),
                if issues.len() == 1 { "" } else { "s" }
            );
            for issue in issues {
                eprintln!("  {issue}");
            }
        }
        ExitCode::from(EX_USAGE)
    })
}

/// `slotgate serve`: run until a stop signal, reloading on SIGHUP, then shut down gracefully.
fn serve(path: &Path) -> ExitCode {
    let config = match load(path) {
        Ok(config) => config,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            error!(%error, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async {
        let mut stop = std::pin::pin!(stop_signal());
        let mut hangup = Hangup::install();
        let gateway = match Gateway::bind_file(&config, path).await {
            Ok(gateway) => gateway,
            Err(StartError::Config(problem)) => {
                error!(config = %path.display(), %problem, "invalid configuration");
                return ExitCode::from(EX_USAGE);
            }
            Err(error) => {
                error!(%error, "cannot start");
                return ExitCode::FAILURE;
            }
        };
        let signal = loop {
            tokio::select! {
                signal = &mut stop => break signal,
                () = hangup.recv() => {
                    info!(config = %path.display(), "SIGHUP: reloading the configuration");
                    // The outcome is logged by the reload itself; a refused reload keeps the
                    // running configuration, so the gateway carries on either way.
                    let _ = gateway.reload().await;
                }
            }
        };
        info!(signal, "stop requested");
        gateway.shutdown().await;
        ExitCode::SUCCESS
    })
}

/// Listens for Ctrl-C (SIGINT) and, on Unix, SIGTERM from now on; the returned future resolves
/// with the signal's name. The handlers are installed before the future is first polled, so a
/// signal that arrives while the gateway is still starting is not lost (nor fatal).
fn stop_signal() -> impl Future<Output = &'static str> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let interrupt = signal(SignalKind::interrupt());
        let terminate = signal(SignalKind::terminate());
        async move {
            match (interrupt, terminate) {
                (Ok(mut interrupt), Ok(mut terminate)) => tokio::select! {
                    _ = interrupt.recv() => "SIGINT",
                    _ = terminate.recv() => "SIGTERM",
                },
                (Err(error), _) | (_, Err(error)) => {
                    error!(%error, "cannot listen for signals; falling back to Ctrl-C only");
                    let _ = tokio::signal::ctrl_c().await;
                    "SIGINT"
                }
            }
        }
    }
    #[cfg(not(unix))]
    {
        async {
            let _ = tokio::signal::ctrl_c().await;
            "Ctrl-C"
        }
    }
}

/// SIGHUP, where there is such a thing: each one asks for a configuration reload.
struct Hangup {
    #[cfg(unix)]
    signal: Option<tokio::signal::unix::Signal>,
}

impl Hangup {
    /// Listens for SIGHUP from now on (before the gateway starts, so an early one is not
    /// fatal: the default action of SIGHUP is to terminate).
    fn install() -> Self {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let signal = signal(SignalKind::hangup())
                .inspect_err(|error| error!(%error, "cannot listen for SIGHUP; reload with POST /admin/reload"))
                .ok();
            Self { signal }
        }
        #[cfg(not(unix))]
        {
            Self {}
        }
    }

    /// Resolves at the next SIGHUP; never, where there is none.
    async fn recv(&mut self) {
        #[cfg(unix)]
        if let Some(signal) = &mut self.signal {
            if signal.recv().await.is_some() {
                return;
            }
            // The signal stream ended (the driver is gone): stop asking.
            self.signal = None;
        }
        std::future::pending::<()>().await;
    }
}

/// Logs to stderr through a background thread: a request hands its line (an access-log line
/// at the end of every request) to a queue of [`LOG_QUEUE_LINES`] and goes on, never waiting
/// on stderr or its lock, even when whatever reads stderr is slow. Lines past a full queue are
/// dropped rather than stalling requests (`docs/operations.md`, "Logs").
fn init_logging(format: LogFormat) -> tracing_appender::non_blocking::WorkerGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .buffered_lines_limit(LOG_QUEUE_LINES)
        .lossy(true)
        .thread_name("slotgate-log")
        .finish(std::io::stderr());
    // Colours only for a person at a terminal: the journal and log files get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(writer);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    guard
}

/// The most log lines waiting for the writer thread.
const LOG_QUEUE_LINES: usize = 128_000;

/// An error and its causes, `: `-separated.
fn chain(error: &dyn std::error::Error) -> String {
    std::iter::successors(Some(error), |error| error.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
