//! Helpers for the end-to-end tests: start the real gateway in-process in front of fake
//! upstreams, and talk to it over loopback like a client would.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use fake_upstream::{FakeConfig, FakeUpstream};
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use slotgate_config::Config;
use slotgate_gateway::Gateway;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;

/// Generous bound for anything that should happen "soon" on a loaded 2-core machine.
pub const SOON: Duration = Duration::from_secs(10);

/// Longer: for waits on health checks and engines; only reached when a test fails.
pub const PATIENT: Duration = Duration::from_secs(30);

/// A llama-server fake with `parallel` slots serving `model`.
pub async fn fake(parallel: usize, model: &str) -> FakeUpstream {
    FakeUpstream::start(FakeConfig::llama_server(parallel).model(model))
        .await
        .expect("fake upstream starts")
}

/// A gateway built from `toml` (listen addresses should use port 0).
pub async fn gateway(toml: &str) -> Gateway {
    let config =
        Config::from_toml_str(toml).unwrap_or_else(|e| panic!("bad test config: {e}\n{toml}"));
    Gateway::bind(&config).await.expect("gateway starts")
}

/// The `[server]` table every test starts from, plus `extra` lines.
pub fn server(extra: &str) -> String {
    format!("[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\n{extra}\n")
}

/// A gateway with the `[server]` table plus `extra` lines (see [`server`]) and `upstreams`, the
/// `[upstreams.…]` tables in order: the set-up nearly every test starts with, spelled once.
pub async fn gateway_with(extra: &str, upstreams: &[String]) -> Gateway {
    gateway(&(server(extra) + &upstreams.concat())).await
}

/// An `[upstreams.NAME]` table with one model.
pub fn upstream(
    name: &str,
    url: &str,
    model: &str,
    parallel: usize,
    queue: usize,
    queue_timeout: &str,
) -> String {
    format!(
        "[upstreams.{name}]\nurl = \"{url}\"\nkind = \"llama-server\"\n\n\
         [upstreams.{name}.models.{model}]\nparallel = {parallel}\nqueue = {queue}\nqueue_timeout = \"{queue_timeout}\"\n"
    )
}

/// The limiter key of a fake upstream: its authority as the config crate spells it.
pub fn authority(addr: SocketAddr) -> String {
    format!("http://{addr}")
}

/// A chat completion body.
pub fn chat_body(model: &str, stream: bool) -> String {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": "hello there"}],
        "stream": stream,
    })
    .to_string()
}

/// A POST of `body` to `path` with JSON content type and extra headers.
pub fn post(
    addr: SocketAddr,
    path: &str,
    body: String,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut builder =
        Request::post(format!("http://{addr}{path}")).header("content-type", "application/json");
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(Bytes::from(body))).unwrap()
}

/// A complete answer.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts this is a problem document of type `slug` with `status`; returns the document.
    pub fn assert_problem(&self, status: u16, slug: &str) -> Value {
        assert_eq!(self.status.as_u16(), status, "status of {self:?}");
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json"),
            "content type of {self:?}"
        );
        let doc = self.json();
        let kind = doc["type"].as_str().unwrap_or_default();
        assert!(
            kind.ends_with(&format!("/{slug}")),
            "type {kind:?} is not {slug}: {doc}"
        );
        assert_eq!(doc["status"], status, "{doc}");
        assert!(
            doc["error"]["message"].is_string(),
            "OpenAI error member: {doc}"
        );
        assert!(
            self.headers.contains_key("x-request-id"),
            "request id echoed"
        );
        doc
    }

    /// Asserts this is an Ollama route's refusal: `status`, `application/json`, a string
    /// `error` (what Ollama's clients read), and the problem's `type` ending in `slug` beside
    /// it. Returns the document.
    pub fn assert_ollama_error(&self, status: u16, slug: &str) -> Value {
        assert_eq!(self.status.as_u16(), status, "status of {self:?}");
        assert_eq!(
            self.headers
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/json"),
            "content type of {self:?}"
        );
        let doc = self.json();
        assert!(doc["error"].is_string(), "Ollama's string error: {doc}");
        let kind = doc["type"].as_str().unwrap_or_default();
        assert!(
            kind.ends_with(&format!("/{slug}")),
            "type {kind:?} is not {slug}: {doc}"
        );
        doc
    }

    /// The `Retry-After` in seconds; asserts it is there and within the documented clamp.
    pub fn retry_after(&self) -> u64 {
        let value = self
            .headers
            .get("retry-after")
            .unwrap_or_else(|| panic!("no Retry-After on {self:?}"))
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap();
        assert!(
            (1..=60).contains(&value),
            "Retry-After {value} outside 1..=60"
        );
        value
    }
}

/// A pooled client, like an application would use.
pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// Sends `req` and reads the whole answer.
pub async fn send(req: Request<Full<Bytes>>) -> Reply {
    let response = client().request(req).await.expect("the gateway answers");
    let (head, body) = response.into_parts();
    let body = body
        .collect()
        .await
        .expect("the whole body arrives")
        .to_bytes();
    Reply {
        status: head.status,
        headers: head.headers,
        body,
    }
}

/// `POST /v1/chat/completions` for `model`.
pub async fn chat(addr: SocketAddr, model: &str, stream: bool, headers: &[(&str, &str)]) -> Reply {
    send(post(
        addr,
        "/v1/chat/completions",
        chat_body(model, stream),
        headers,
    ))
    .await
}

/// `POST /v1/chat/completions` for `model` on a connection of its own (see [`open`]): for a
/// test whose client leaves at a chosen moment, or reads the answer frame by frame.
pub async fn open_chat(
    addr: SocketAddr,
    model: &str,
    stream: bool,
    headers: &[(&str, &str)],
) -> Open {
    open(
        addr,
        post(
            addr,
            "/v1/chat/completions",
            chat_body(model, stream),
            headers,
        ),
    )
    .await
}

/// A streamed [`open_chat`] once its response head has arrived: the test reads the answer frame
/// by frame, or its client leaves mid-stream.
pub async fn streaming_chat(addr: SocketAddr, model: &str, headers: &[(&str, &str)]) -> Streaming {
    open_chat(addr, model, true, headers).await.head().await
}

/// Spawns `n` requests at once, the `i`-th made by `request(i)`: a burst of concurrent clients.
/// Returns their tasks in order, so that a test can look at the gateway while they run; see
/// [`replies`] for their answers.
pub fn spawn_burst<F, R>(n: usize, request: F) -> Vec<JoinHandle<Reply>>
where
    F: FnMut(usize) -> R,
    R: Future<Output = Reply> + Send + 'static,
{
    (0..n).map(request).map(tokio::spawn).collect()
}

/// The answers of the tasks of a [`spawn_burst`], in order; a task that panicked fails the test.
pub async fn replies(tasks: Vec<JoinHandle<Reply>>) -> Vec<Reply> {
    let mut all = Vec::with_capacity(tasks.len());
    for task in tasks {
        all.push(task.await.expect("the request task ends"));
    }
    all
}

/// `GET path`.
pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    let req = Request::get(format!("http://{addr}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    send(req).await
}

/// `GET /admin/upstreams` of the admin listener at `admin`, parsed.
pub async fn status(admin: SocketAddr) -> Value {
    let reply = get(admin, "/admin/upstreams").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

/// The `GET /admin/upstreams` document of the upstream called `name`.
pub async fn upstream_status(admin: SocketAddr, name: &str) -> Value {
    let all = status(admin).await;
    all["upstreams"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["name"] == name)
        .unwrap_or_else(|| panic!("no upstream {name} in {all}"))
        .clone()
}

/// A request on its own connection, whose answer has not necessarily arrived: the client can
/// go away at any moment by dropping the connection.
pub struct Open {
    conn: JoinHandle<()>,
    response: JoinHandle<Result<Response<Incoming>, hyper::Error>>,
}

/// Sends `req` on a fresh HTTP/1.1 connection and returns at once.
pub async fn open(addr: SocketAddr, mut req: Request<Full<Bytes>>) -> Open {
    // hyper's connection-level client sends no `Host` of its own; HTTP/1.1 requires one.
    if let Ok(host) = http::HeaderValue::from_str(&addr.to_string()) {
        req.headers_mut().entry(http::header::HOST).or_insert(host);
    }
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the gateway");
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    let response = tokio::spawn(sender.send_request(req));
    Open { conn, response }
}

impl Open {
    /// Waits for the response head.
    pub async fn head(self) -> Streaming {
        let response = self.response.await.expect("task").expect("response head");
        let (head, body) = response.into_parts();
        Streaming {
            status: head.status,
            headers: head.headers,
            body,
            conn: self.conn,
        }
    }

    /// The client goes away: the connection is closed.
    pub fn disconnect(self) {
        self.response.abort();
        self.conn.abort();
    }
}

/// A response whose body is read frame by frame.
pub struct Streaming {
    pub status: StatusCode,
    pub headers: HeaderMap,
    body: Incoming,
    conn: JoinHandle<()>,
}

impl Streaming {
    /// The next data frame; `Ok(None)` at the end, `Err` if the stream broke.
    pub async fn next_data(&mut self) -> Result<Option<Bytes>, hyper::Error> {
        loop {
            match self.body.frame().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(e),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// Reads to the end: everything, or the error that cut it.
    pub async fn rest(&mut self) -> Result<Bytes, hyper::Error> {
        let mut all = Vec::new();
        while let Some(data) = self.next_data().await? {
            all.extend_from_slice(&data);
        }
        Ok(Bytes::from(all))
    }

    /// The client goes away mid-answer.
    pub fn disconnect(self) {
        self.conn.abort();
        drop(self.body);
    }
}

/// Polls `check` every 10 ms until it holds, panicking after `timeout` with `what`.
pub async fn eventually(what: &str, timeout: Duration, mut check: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + timeout;
    while !check() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Waits (at most [`SOON`]) until no slot of `model` at `fake` is taken; `what` names the wait
/// in the failure.
pub async fn slots_free(gw: &Gateway, fake: &FakeUpstream, model: &str, what: &str) {
    let key = authority(fake.addr());
    eventually(what, SOON, || gw.limiter().in_flight(&key, model) == 0).await;
}

/// [`slots_free`], and nobody left waiting in the model's queue either: nothing held.
pub async fn nothing_held(gw: &Gateway, fake: &FakeUpstream, model: &str, what: &str) {
    let key = authority(fake.addr());
    eventually(what, SOON, || {
        gw.limiter().in_flight(&key, model) == 0 && gw.limiter().queued(&key, model) == 0
    })
    .await;
}

/// An HTTP/2 (prior knowledge, h2c) connection to the gateway.
pub struct H2 {
    sender: hyper::client::conn::http2::SendRequest<Full<Bytes>>,
    conn: JoinHandle<()>,
}

/// Opens an h2c connection.
pub async fn h2(addr: SocketAddr) -> H2 {
    let stream = TcpStream::connect(addr)
        .await
        .expect("connect to the gateway");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("h2c handshake");
    let conn = tokio::spawn(async move {
        let _ = conn.await;
    });
    H2 { sender, conn }
}

impl H2 {
    /// Sends `req` as a stream of this connection and waits for the head.
    pub async fn send(&mut self, req: Request<Full<Bytes>>) -> (http::response::Parts, Incoming) {
        self.sender.ready().await.expect("connection ready");
        let mut req = req;
        // HTTP/2 carries the authority in `:authority`; the URI must be absolute, which it is.
        *req.version_mut() = http::Version::HTTP_2;
        self.sender
            .send_request(req)
            .await
            .expect("response head")
            .into_parts()
    }

    /// Closes the connection.
    pub fn close(self) {
        self.conn.abort();
    }
}

/// The OpenAI Python SDK version the SDK tests pin.
pub const OPENAI_SDK: &str = "openai==3.57.0";

/// How long making one virtualenv with its pinned packages may take before the test fails; pip's
/// own socket timeout is 30 s per request, so a stalled index fails well inside it.
pub const VENV_INSTALL_LIMIT: Duration = Duration::from_secs(600);

/// How long one client script (`tests/*/check.py`) may run before it is killed and the test fails.
pub const SCRIPT_LIMIT: Duration = Duration::from_secs(180);

/// A virtualenv with the pinned OpenAI SDK, made once and cached outside the repository (see
/// [`python_with`]); returns its `python`.
pub fn openai_python(name: &str) -> PathBuf {
    python_with(name, &[OPENAI_SDK])
}

/// The directory that holds the cached virtualenvs: `$SLOTGATE_TEST_VENVS`, else
/// `$XDG_CACHE_HOME/slotgate-test-venvs`, else `~/.cache/slotgate-test-venvs`. It lives outside
/// every worktree so that `cargo clean` and fresh checkouts do not pay for pip again.
pub fn venv_cache() -> PathBuf {
    if let Some(dir) = std::env::var_os("SLOTGATE_TEST_VENVS") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("slotgate-test-venvs")
}

/// A virtualenv with the pinned `packages`, cached in [`venv_cache`] under `name` plus the pins
/// (so a new pin makes a new venv); returns its `python`. Needs `python3` with `venv` and the
/// Python Package Index the first time. The venv is built in a private directory and renamed
/// into place only once pip succeeded, so test binaries and worktrees that run at the same time
/// never see (or clear) a half-made one. pip is bounded by [`VENV_INSTALL_LIMIT`].
pub fn python_with(name: &str, packages: &[&str]) -> PathBuf {
    let pins: String = packages
        .join("+")
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '+' {
                c
            } else {
                '-'
            }
        })
        .collect();
    let cache = venv_cache();
    let dir = cache.join(format!("{name}-{pins}"));
    let python = dir.join("bin/python");
    if python.exists() {
        return python;
    }
    std::fs::create_dir_all(&cache).expect("create the venv cache directory");
    let building = cache.join(format!(".{name}-{pins}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&building);
    let status = run_bounded(
        Command::new("python3").args(["-m", "venv"]).arg(&building),
        VENV_INSTALL_LIMIT,
    )
    .expect("python3 runs (install python3 and python3-venv)");
    assert!(
        status.status.success(),
        "python3 -m venv failed: {status:?}"
    );
    // `python -m pip`, not `bin/pip`: the scripts' shebangs name the private directory, which
    // is renamed below; the interpreter itself finds its packages from wherever it is.
    let status = run_bounded(
        Command::new(building.join("bin/python"))
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .args(["--timeout", "30", "--retries", "2"])
            .args(packages),
        VENV_INSTALL_LIMIT,
    )
    .expect("pip runs");
    assert!(
        status.status.success(),
        "pip install {packages:?} failed (needs the Python Package Index)\n{}",
        String::from_utf8_lossy(&status.stderr)
    );
    if std::fs::rename(&building, &dir).is_err() {
        // Another process finished the same venv first; use that one.
        let _ = std::fs::remove_dir_all(&building);
        assert!(
            python.exists(),
            "the venv {} could not be put in place",
            dir.display()
        );
    }
    python
}

/// Runs `command` to completion with its output captured, killing it once `limit` has passed.
/// `Err` if it cannot start; a run past `limit` panics with what it printed so far.
pub fn run_bounded(
    command: &mut Command,
    limit: Duration,
) -> std::io::Result<std::process::Output> {
    use std::io::Read;
    use std::process::Stdio;
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    // Drain both pipes on threads so a chatty child never blocks on a full pipe.
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            let out = stdout.join().unwrap_or_default();
            let err = stderr.join().unwrap_or_default();
            panic!(
                "{command:?} ran past {limit:?} and was killed\n--- stdout\n{}\n--- stderr\n{}",
                String::from_utf8_lossy(&out),
                String::from_utf8_lossy(&err)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    Ok(std::process::Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    })
}

/// The value of one series of a `/metrics` text (`name{label="value",…}` with exactly these
/// labels, in any order), if present.
pub fn sample(metrics: &str, series: &str) -> Option<f64> {
    slotgate_exposition::Samples::parse(metrics).value(series)
}

/// [`sample`] of the `/metrics` that the admin listener at `admin` serves now.
pub async fn admin_sample(admin: SocketAddr, series: &str) -> Option<f64> {
    sample(&get(admin, "/metrics").await.text(), series)
}
