//! A real llama.cpp `llama-server` for the engine suite (`tests/engine_e2e.rs`): finding the
//! binary and the tiny model, starting the server on a free loopback port, reading its own view
//! of its slots, and always stopping it.
//!
//! The binary and the model come from the environment (`LLAMA_SERVER`, `TINY_MODEL`, as
//! `eval "$(tests/engine/setup.sh)"` sets them) or, when either is unset, from running
//! `tests/engine/setup.sh` here: a cold machine builds llama-server once (several minutes),
//! a warm one answers at once. There is no skip: a missing engine is a failed test.
//!
//! An [`Engine`] stops its process when dropped, panicking tests included: `SIGTERM`, then
//! `SIGKILL` after a short grace. The grace matters: with a stream in flight llama-server waits
//! for its 30 s SSE ping before exiting (`docs/real-engine-notes.md`).

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::task::JoinHandle;

use crate::support::{Reply, get, post, send};

/// How long llama-server may take to answer `/health` 200 (it takes ~0.2 s with the tiny model).
const READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a `SIGTERM`ed llama-server gets before `SIGKILL`.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// Where the engine binary and the model are.
#[derive(Debug, Clone)]
pub struct EnginePaths {
    /// The `llama-server` binary.
    pub server: PathBuf,
    /// The tiny GGUF model.
    pub model: PathBuf,
}

/// The binary and the model: from `LLAMA_SERVER`/`TINY_MODEL`, else from `tests/engine/setup.sh`
/// (run once per test process). Panics, saying why, when neither gives usable files.
pub fn paths() -> &'static EnginePaths {
    static PATHS: OnceLock<EnginePaths> = OnceLock::new();
    PATHS.get_or_init(|| {
        let from_env = (
            std::env::var_os("LLAMA_SERVER"),
            std::env::var_os("TINY_MODEL"),
        );
        let paths = if let (Some(server), Some(model)) = from_env {
            EnginePaths {
                server: server.into(),
                model: model.into(),
            }
        } else {
            run_setup()
        };
        for (what, path) in [
            ("LLAMA_SERVER", &paths.server),
            ("TINY_MODEL", &paths.model),
        ] {
            assert!(
                path.is_file(),
                "{what} = {} is not a file (run `eval \"$(tests/engine/setup.sh)\"`)",
                path.display()
            );
        }
        paths
    })
}

/// Runs `tests/engine/setup.sh` and reads the two paths it prints. The script's own shell does
/// the `eval`, so its quoting is read exactly as an operator's shell would read it; its progress
/// (stderr) goes to the test's stderr.
fn run_setup() -> EnginePaths {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/engine/setup.sh");
    eprintln!(
        "LLAMA_SERVER/TINY_MODEL not set: running {} (a cold machine builds llama-server, \
         several minutes)",
        script.display()
    );
    let output = Command::new("bash")
        .arg("-c")
        .arg(r#"set -e; out=$("$0"); eval "$out"; printf '%s\n%s\n' "$LLAMA_SERVER" "$TINY_MODEL""#)
        .arg(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("bash runs");
    assert!(
        output.status.success(),
        "{} failed ({}); see its output above",
        script.display(),
        output.status
    );
    let stdout = String::from_utf8(output.stdout).expect("setup.sh prints UTF-8 paths");
    let mut lines = stdout.lines();
    match (lines.next(), lines.next()) {
        (Some(server), Some(model)) if !server.is_empty() && !model.is_empty() => EnginePaths {
            server: server.into(),
            model: model.into(),
        },
        _ => panic!("setup.sh printed no LLAMA_SERVER/TINY_MODEL: {stdout:?}"),
    }
}

/// How to start llama-server.
#[derive(Debug, Clone)]
pub struct EngineOptions {
    /// `--parallel`: the engine's slots.
    pub parallel: usize,
    /// `-c`: the whole context, split evenly between the slots (capped per slot by the model's
    /// 2048-token training context).
    pub context: usize,
    /// `--alias`: the model id the server reports, so tests need not know the model's path.
    pub alias: String,
    /// The port; `None` picks a free one.
    pub port: Option<u16>,
    /// `-v`: log everything, including each task the engine defers (`defer task`) and each
    /// it cancels. Verbose (a line per token), so only for tests that read the log afterwards:
    /// polling `/metrics` or `/slots` instead would change what is measured (see
    /// [`Engine::log_lines_with`]).
    pub verbose: bool,
    /// Router mode instead of one model (`alias` is then unused).
    pub router: Option<RouterOptions>,
}

/// A llama-server in router mode (`--models-dir`): each model a copy of the tiny model under
/// its own name, none loaded at start, loaded on demand by the router.
#[derive(Debug, Clone)]
pub struct RouterOptions {
    /// The model names (`NAME.gguf` in the models folder).
    pub models: Vec<String>,
    /// `--models-max`: how many models it holds at once.
    pub models_max: usize,
}

impl EngineOptions {
    /// A router serving `models`, at most `models_max` of them loaded at once, each with the
    /// default 2 slots (`-np 2`) and a small context (`-c 1024`, 512 tokens a slot: the requests
    /// here are short, and a small cache is allocated faster at each load).
    pub fn router(models: &[&str], models_max: usize) -> Self {
        Self {
            context: 1024,
            router: Some(RouterOptions {
                models: models.iter().map(|&m| m.to_owned()).collect(),
                models_max,
            }),
            ..Self::default()
        }
    }
}

impl Default for EngineOptions {
    /// 2 slots of 2048 tokens each, so one request can run for seconds (`ignore_eos`, a large
    /// `max_tokens`), model id `tiny`.
    fn default() -> Self {
        Self {
            parallel: 2,
            context: 4096,
            alias: "tiny".to_owned(),
            port: None,
            verbose: false,
            router: None,
        }
    }
}

/// A running llama-server, stopped on drop.
#[derive(Debug)]
pub struct Engine {
    child: Option<Child>,
    /// Where it listens (127.0.0.1).
    pub addr: SocketAddr,
    log: PathBuf,
    options: EngineOptions,
}

impl Engine {
    /// Starts llama-server and waits until `/health` answers 200. A port taken between picking
    /// it and the server binding it (another test) is retried on a new port.
    pub async fn start(options: EngineOptions) -> Engine {
        let paths = paths();
        let mut last_failure = String::new();
        for _attempt in 0..3 {
            let port = options.port.unwrap_or_else(free_port);
            let addr = SocketAddr::from(([127, 0, 0, 1], port));
            let log = Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(format!("llama-server-{port}-{}.log", std::process::id()));
            let log_file = std::fs::File::create(&log).expect("create the engine log");
            let child = Command::new(&paths.server)
                .args(model_args(&options, paths, port))
                .args(["--host", "127.0.0.1", "--port", &port.to_string()])
                .args(["--parallel", &options.parallel.to_string()])
                .args(["-c", &options.context.to_string()])
                // One thread: the machine has two cores and other tests run beside this one.
                .args(["-t", "1", "--no-webui", "--metrics", "--slots", "--jinja"])
                .args(options.verbose.then_some("-v"))
                .stdin(Stdio::null())
                .stdout(log_file.try_clone().expect("clone the log handle"))
                .stderr(log_file)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", paths.server.display()));
            let mut engine = Engine {
                child: Some(child),
                addr,
                log,
                options: options.clone(),
            };
            match engine.wait_ready().await {
                Ok(()) => return engine,
                Err(failure) => {
                    last_failure = failure;
                    engine.stop();
                    if options.port.is_some() {
                        break;
                    }
                }
            }
        }
        panic!("llama-server did not start: {last_failure}");
    }

    /// Polls `/health` until 200; `Err` when the process exits first or the deadline passes.
    async fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                return Err(format!("exited with {status}\n{}", self.log_tail()));
            }
            if let Ok(Ok(reply)) =
                tokio::time::timeout(Duration::from_secs(2), raw_get(self.addr, "/health")).await
                && reply.status == 200
            {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "/health not 200 within {READY_TIMEOUT:?}\n{}",
                    self.log_tail()
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The options it was started with.
    pub fn options(&self) -> &EngineOptions {
        &self.options
    }

    /// The engine's own endpoints, for polling from other tasks.
    pub fn api(&self) -> EngineApi {
        EngineApi { addr: self.addr }
    }

    /// The last lines of the server's log.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let start = lines.len().saturating_sub(30);
        format!(
            "--- last lines of {}\n{}",
            self.log.display(),
            lines[start..].join("\n")
        )
    }

    /// Every line of the server's log containing `needle`.
    ///
    /// Where a test must not poll: every `/metrics` or `/slots` request is a task whose result
    /// wakes the engine's waiting non-streamed requests, which restarts their 1 s wait before
    /// they check their connection (`docs/real-engine-notes.md`), so a poller keeps a vanished
    /// client's request running.
    pub fn log_lines_with(&self, needle: &str) -> Vec<String> {
        // Lossy: a verbose log quotes the random model's tokens, not always valid UTF-8.
        let bytes = std::fs::read(&self.log).expect("read the engine log");
        String::from_utf8_lossy(&bytes)
            .lines()
            .filter(|line| line.contains(needle))
            .map(str::to_owned)
            .collect()
    }

    /// Stops the server now (`SIGTERM`, then `SIGKILL` after a short grace) and reaps it.
    /// Dropping the engine does the same.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if child.try_wait().ok().flatten().is_none() {
            // `kill(1)` rather than a signal crate: unsafe code is forbidden here, and the pid
            // is our unreaped child, so it cannot have been reused.
            let _ = Command::new("kill")
                .args(["-TERM", &child.id().to_string()])
                .stderr(Stdio::null())
                .status();
            let deadline = Instant::now() + STOP_GRACE;
            while Instant::now() < deadline && child.try_wait().ok().flatten().is_none() {
                std::thread::sleep(Duration::from_millis(50));
            }
            if child.try_wait().ok().flatten().is_none() {
                let _ = child.kill();
            }
        }
        let _ = child.wait();
        if std::thread::panicking() {
            eprintln!("{}", self.log_tail());
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A handle on a running engine's own endpoints (`Copy`, so pollers can take one).
#[derive(Debug, Clone, Copy)]
pub struct EngineApi {
    /// Where it listens.
    pub addr: SocketAddr,
}

impl EngineApi {
    /// `GET path` on the engine, whatever the status.
    pub async fn get(self, path: &str) -> Reply {
        get(self.addr, path).await
    }

    /// `GET /slots`: one object per slot.
    pub async fn slots(self) -> Vec<Value> {
        let reply = self.get("/slots").await;
        assert_eq!(reply.status, 200, "/slots: {}", reply.text());
        reply
            .json()
            .as_array()
            .cloned()
            .expect("/slots is an array")
    }

    /// How many slots are processing a task now, by the engine's own `/slots`.
    pub async fn busy_slots(self) -> usize {
        self.slots()
            .await
            .iter()
            .filter(|slot| slot["is_processing"] == true)
            .count()
    }

    /// One unlabelled `llamacpp:` sample of `/metrics`, by name without the prefix.
    pub async fn metric(self, name: &str) -> f64 {
        let reply = self.get("/metrics").await;
        assert_eq!(reply.status, 200, "/metrics: {}", reply.text());
        prometheus_value(&reply.text(), &format!("llamacpp:{name}"))
            .unwrap_or_else(|| panic!("/metrics has no llamacpp:{name}"))
    }
}

/// What the server serves: `-m MODEL --alias ALIAS`, or for a router `--models-dir DIR
/// --models-max N` with DIR a fresh folder (in the target's temporary folder, named after the
/// port) holding one hard link (a copy where links fail) of the tiny model per name.
fn model_args(options: &EngineOptions, paths: &EnginePaths, port: u16) -> Vec<std::ffi::OsString> {
    let Some(router) = &options.router else {
        return vec![
            "-m".into(),
            paths.model.clone().into(),
            "--alias".into(),
            options.alias.clone().into(),
        ];
    };
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("llama-router-{port}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the router's models folder");
    for name in &router.models {
        let file = dir.join(format!("{name}.gguf"));
        if std::fs::hard_link(&paths.model, &file).is_err() {
            std::fs::copy(&paths.model, &file).expect("copy the tiny model");
        }
    }
    vec![
        "--models-dir".into(),
        dir.into(),
        "--models-max".into(),
        router.models_max.to_string().into(),
    ]
}

/// A port nobody listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free loopback port")
        .port()
}

/// `GET` that reports a connection failure instead of panicking (the engine may not be up).
async fn raw_get(addr: SocketAddr, path: &str) -> Result<Reply, String> {
    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};

    let req = http::Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .map_err(|e| e.to_string())?;
    let response = crate::support::client()
        .request(req)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = response.into_parts();
    let body = body.collect().await.map_err(|e| e.to_string())?.to_bytes();
    Ok(Reply {
        status: head.status,
        headers: head.headers,
        body,
    })
}

/// The value of the unlabelled sample `name` in a Prometheus text exposition.
pub fn prometheus_value(text: &str, name: &str) -> Option<f64> {
    slotgate_exposition::Samples::parse(text).value(name)
}

/// A chat body for the engine or the gateway: `max_tokens` tokens, all of them generated
/// (`ignore_eos`: the random model would otherwise stop at any moment), so a request's length
/// is known. About 2 ms a token at these context sizes on one thread.
pub fn long_chat(model: &str, max_tokens: usize, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "Hello"}],
        "max_tokens": max_tokens,
        "ignore_eos": true,
        "stream": stream,
    })
    .to_string()
}

/// `n` non-streamed [`long_chat`]s of `max_tokens` tokens for `model`, sent at once to `addr`,
/// each from its own task.
pub fn spawn_long_chats(
    addr: SocketAddr,
    model: &str,
    n: usize,
    max_tokens: usize,
) -> Vec<JoinHandle<Reply>> {
    (0..n)
        .map(|_| {
            let body = long_chat(model, max_tokens, false);
            tokio::spawn(async move { send(post(addr, "/v1/chat/completions", body, &[])).await })
        })
        .collect()
}

/// The gateway's log lines (it runs in the test's process), for tests that check what it
/// warned about. Installed once per process as the global subscriber, at `info`.
#[derive(Debug, Clone)]
pub struct Logs(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

/// Starts capturing the process's logs (idempotent); also echoes them to stderr.
pub fn capture_logs() -> Logs {
    static LOGS: OnceLock<Logs> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Logs(std::sync::Arc::default());
        let sink = logs.clone();
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing_subscriber::filter::LevelFilter::INFO)
            .with_writer(move || sink.clone())
            .try_init();
        logs
    })
    .clone()
}

impl Logs {
    /// Every captured line containing all of `needles`.
    pub fn lines_with(&self, needles: &[&str]) -> Vec<String> {
        let text = String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned();
        text.lines()
            .filter(|line| needles.iter().all(|n| line.contains(n)))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        std::io::stderr().write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
