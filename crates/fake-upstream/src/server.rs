//! The listening side: the [`FakeUpstream`] handle, the accept loop, and the switches that make
//! the port refuse connections and cut the open ones.
//!
//! # Implementation Details
//!
//! The port is bound with `SO_REUSEADDR` but does not necessarily listen: a bound socket that is
//! not listening makes the kernel refuse connects, which is how vLLM looks while it loads and how
//! [`FakeUpstream::refuse_connections`] works. Refusing closes the listener (the kernel resets
//! whatever sat in its backlog) and at once binds a fresh, non-listening socket to the same
//! address, so the port stays ours; accepting again just calls `listen` on it.
//!
//! One task owns the socket and the connection tasks and takes commands from the handle over a
//! channel. Each connection watches a "kill" epoch; cutting connections marks each connection
//! as killed *before* dropping it, so the requests dropped with it are recorded as
//! [`Outcome::ServerDropped`](crate::Outcome::ServerDropped), not as clients going away.
//!
//! Each connection also keeps a second descriptor of its socket (`dup`), out of hyper's hands.
//! A request can doom its connection (an injected reset or garbage): the connection task then
//! stops serving, sets `SO_LINGER` 0 on that descriptor (so the close sends RST) or writes
//! the garbage through it, and closes both.
//!
//! A llama-server connection ends after each streamed answer
//! ([`FakeConfig::close_after_stream`]): the body's clean end wakes the connection task, which
//! waits [`FakeConfig::close_after_stream_delay`] without polling hyper (so a request sent on
//! the connection meanwhile is never read), then asks hyper for a graceful shutdown; the
//! connection is idle by then (the terminating chunk is written), so hyper closes it at once,
//! with no `Connection: close` on the answer, the way cpp-httplib does.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::Instant;

use crate::config::{FakeConfig, Kind, Pacing};
use crate::failure::{Failure, GARBAGE};
use crate::observer::{ConnectionState, Fate, Observer};
use crate::state::App;

/// Why a fake upstream could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The configuration is contradictory.
    #[error("invalid fake-upstream config: {0}")]
    Config(String),
    /// The address could not be bound.
    #[error("cannot bind {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: io::Error,
    },
}

/// A running fake upstream. Dropping it stops the server like [`FakeUpstream::shutdown`] does,
/// without waiting.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::time::Duration;
/// use fake_upstream::{FakeConfig, FakeUpstream};
///
/// let fake = FakeUpstream::start(FakeConfig::llama_server(2).hold(Duration::from_millis(100))).await?;
/// let base = fake.url(); // "http://127.0.0.1:<port>"
/// // ... point the gateway at `base`, send requests ...
/// fake.observer().wait_for_in_flight(0, Duration::from_secs(5)).await?;
/// assert!(fake.observer().peak_in_flight() <= 2);
/// fake.shutdown().await;
/// # Ok(()) }
/// ```
pub struct FakeUpstream {
    addr: SocketAddr,
    app: Arc<App>,
    commands: mpsc::UnboundedSender<Command>,
    task: Option<JoinHandle<()>>,
}

impl fmt::Debug for FakeUpstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FakeUpstream")
            .field("kind", &self.app.kind())
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

enum Command {
    Refuse(oneshot::Sender<io::Result<()>>),
    Accept(oneshot::Sender<io::Result<()>>),
    DropConnections(oneshot::Sender<()>),
    Shutdown(oneshot::Sender<()>),
}

impl FakeUpstream {
    /// Binds the port and starts serving (or, with a startup delay, starts loading). The port is
    /// bound when this returns, so [`addr`](Self::addr) is final; it listens at once unless the
    /// kind refuses connections while it loads (vLLM, Ollama).
    // Async although nothing is awaited yet: it must run inside a tokio runtime (the listener
    // registers with its reactor), and callers should not have to change if it ever awaits.
    #[allow(clippy::unused_async)]
    pub async fn start(config: FakeConfig) -> Result<Self, StartError> {
        config.validate().map_err(StartError::Config)?;
        let requested = config.listen;
        let bind_error = |source| StartError::Bind {
            addr: requested,
            source,
        };
        let socket = bind(requested).map_err(bind_error)?;
        let addr = socket.local_addr().map_err(bind_error)?;

        let app = Arc::new(App::new(config, Observer::new()));
        // llama-server listens at once and answers 503 while it loads; the others are not
        // listening yet, so connects are refused.
        let listen_at = match app.kind() {
            Kind::LlamaServer => Instant::now(),
            Kind::Vllm | Kind::Ollama => app.ready_at,
        };
        let (socket, listen_at) = if listen_at <= Instant::now() {
            (
                Socket::Listening(socket.listen(1024).map_err(bind_error)?),
                None,
            )
        } else {
            (Socket::Bound(socket), Some(listen_at))
        };
        let (commands, rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(
            AcceptLoop {
                app: Arc::clone(&app),
                addr,
                socket,
                listen_at,
                kill: watch::Sender::new(0),
                connections: JoinSet::new(),
            }
            .run(rx),
        );
        tracing::debug!(kind = %app.kind(), %addr, "fake upstream started");
        Ok(Self {
            addr,
            app,
            commands,
            task: Some(task),
        })
    }

    /// The bound address (always on 127.0.0.1 unless configured otherwise).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`, without a trailing slash.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What the fake saw.
    pub fn observer(&self) -> &Observer {
        &self.app.observer
    }

    /// The kind imitated.
    pub fn kind(&self) -> Kind {
        self.app.kind()
    }

    /// The configuration it was started with (run-time changes not included).
    pub fn config(&self) -> &FakeConfig {
        &self.app.config
    }

    /// Replaces the failures injected into requests that send no `x-fake-fail` header.
    pub fn set_failures(&self, failures: Vec<Failure>) {
        self.app.behaviour.lock().failures = failures;
    }

    /// Replaces the default pacing.
    pub fn set_pacing(&self, pacing: Pacing) {
        self.app.behaviour.lock().pacing = pacing;
    }

    /// Replaces the default completion token count.
    pub fn set_tokens(&self, tokens: u32) {
        self.app.behaviour.lock().tokens = tokens;
    }

    /// Empties every model's prompt cache, as a restart would: the next prompts are computed
    /// whole and report 0 cached tokens. The same as sending `x-fake-prompt-cache: clear`.
    pub fn clear_prompt_cache(&self) {
        for model in self.app.registry.all() {
            model.pool.clear_cache();
        }
    }

    /// Makes the health probe fail (`false`) or pass again (`true`), the way each kind can:
    /// llama-server goes back to answering every path with 503 "Loading model"; vLLM's `/health`
    /// answers 503 with an empty body (a dead engine) while requests are still served; Ollama has
    /// no unhealthy answer, so this changes nothing there (use
    /// [`refuse_connections`](Self::refuse_connections)).
    pub fn set_healthy(&self, healthy: bool) {
        self.app
            .unhealthy
            .store(!healthy, std::sync::atomic::Ordering::Relaxed);
    }

    /// Makes a router's own `/props` (no `?model=`) fail with a 500 (`false`) or answer again
    /// (`true`), as a router too busy to answer its probes in time would look: its `/models`
    /// still answers. No effect outside router mode.
    pub fn set_router_props(&self, answers: bool) {
        self.app
            .router_props_down
            .store(!answers, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether a model is resident: `None` for an unknown model, `Some(false)` while loading.
    pub fn is_loaded(&self, model: &str) -> Option<bool> {
        self.app.registry.get(model).map(|m| m.is_loaded())
    }

    /// Loads a model (taking the configured load delay) and waits until it is resident. False for
    /// an unknown model or a failed load.
    pub async fn load_model(&self, model: &str) -> bool {
        let Some(model) = self.app.registry.get(model).cloned() else {
            return false;
        };
        self.app.registry.ensure_loaded(&model).await.is_ok()
    }

    /// How many loads of a model started since the server started (a wake-up from sleep is not
    /// a load); `None` for an unknown model. What a benchmark of model swaps counts.
    pub fn model_loads(&self, model: &str) -> Option<u64> {
        self.app.registry.get(model).map(|m| m.loads())
    }

    /// Makes the next load of a model fail: it goes back to `unloaded` with `"failed": true`
    /// and the requests that waited for it get llama-server's 500. False for an unknown model.
    pub fn fail_next_load(&self, model: &str) -> bool {
        self.app
            .registry
            .get(model)
            .map(|m| m.fail_next_load())
            .is_some()
    }

    /// Puts a loaded model to sleep, as `--sleep-idle-seconds` does: it keeps its place and the
    /// next request wakes it without a load. False for an unknown or not loaded model.
    pub fn sleep_model(&self, model: &str) -> bool {
        self.app.registry.get(model).is_some_and(|m| m.sleep())
    }

    /// Unloads a model at once; requests running on it finish normally. False for an unknown
    /// model or one that was not loaded.
    pub fn unload_model(&self, model: &str) -> bool {
        self.app.registry.get(model).is_some_and(|m| m.unload())
    }

    /// Stops listening: from when this returns until [`accept_connections`], connects to the port
    /// are refused. Open connections stay up (see [`drop_connections`]).
    ///
    /// [`accept_connections`]: Self::accept_connections
    /// [`drop_connections`]: Self::drop_connections
    pub async fn refuse_connections(&self) -> io::Result<()> {
        self.ask(Command::Refuse)
            .await
            .unwrap_or_else(|| Err(stopped()))
    }

    /// Listens again after [`refuse_connections`](Self::refuse_connections) (or ends a vLLM or
    /// Ollama startup delay early).
    pub async fn accept_connections(&self) -> io::Result<()> {
        self.ask(Command::Accept)
            .await
            .unwrap_or_else(|| Err(stopped()))
    }

    /// Cuts every open connection, as a crashing server would; requests on them end as
    /// [`Outcome::ServerDropped`](crate::Outcome::ServerDropped). Returns once they are closed.
    pub async fn drop_connections(&self) {
        self.ask(Command::DropConnections).await;
    }

    /// Stops the server: closes the port, cuts every connection, and waits for both.
    pub async fn shutdown(mut self) {
        self.ask(Command::Shutdown).await;
        if let Some(task) = self.task.take() {
            // The loop ends right after acknowledging; a panic in it is already logged.
            let _ = task.await;
        }
    }

    async fn ask<T>(&self, command: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        self.commands.send(command(tx)).ok()?;
        rx.await.ok()
    }
}

fn stopped() -> io::Error {
    io::Error::other("the fake upstream has stopped")
}

/// A socket bound to the address, with `SO_REUSEADDR` so it can be bound again right after the
/// listener closes.
fn bind(addr: SocketAddr) -> io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    Ok(socket)
}

enum Socket {
    Listening(TcpListener),
    /// Bound, not listening: connects are refused.
    Bound(TcpSocket),
    /// Nothing: the server has stopped (or the port is being re-bound).
    Closed,
}

impl Socket {
    async fn accept(&self) -> io::Result<(TcpStream, SocketAddr)> {
        match self {
            Self::Listening(listener) => listener.accept().await,
            Self::Bound(_) | Self::Closed => std::future::pending().await,
        }
    }
}

struct AcceptLoop {
    app: Arc<App>,
    addr: SocketAddr,
    socket: Socket,
    /// When a delayed start begins listening.
    listen_at: Option<Instant>,
    kill: watch::Sender<u64>,
    connections: JoinSet<()>,
}

impl AcceptLoop {
    async fn run(mut self, mut commands: mpsc::UnboundedReceiver<Command>) {
        loop {
            let listen_at = self.listen_at;
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Refuse(ack)) => {
                        let _ = ack.send(self.refuse().await);
                    }
                    Some(Command::Accept(ack)) => {
                        let _ = ack.send(self.listen());
                    }
                    Some(Command::DropConnections(ack)) => {
                        self.kill_connections().await;
                        let _ = ack.send(());
                    }
                    Some(Command::Shutdown(ack)) => {
                        self.stop().await;
                        let _ = ack.send(());
                        return;
                    }
                    // The handle was dropped.
                    None => {
                        self.stop().await;
                        return;
                    }
                },
                accepted = self.socket.accept() => match accepted {
                    Ok((stream, _peer)) => {
                        let app = Arc::clone(&self.app);
                        let kill = self.kill.subscribe();
                        self.connections.spawn(serve_connection(app, stream, kill));
                    }
                    Err(e) => {
                        // Out of file descriptors and the like: back off instead of spinning.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                },
                () = sleep_until(listen_at), if listen_at.is_some() => {
                    if let Err(e) = self.listen() {
                        tracing::error!(error = %e, addr = %self.addr, "cannot listen");
                    }
                }
                Some(_) = self.connections.join_next(), if !self.connections.is_empty() => {}
            }
        }
    }

    fn listen(&mut self) -> io::Result<()> {
        self.listen_at = None;
        if let Socket::Bound(socket) = std::mem::replace(&mut self.socket, Socket::Closed) {
            match socket.listen(1024) {
                Ok(listener) => self.socket = Socket::Listening(listener),
                Err(e) => {
                    // Keep the port reserved if we can, so a retry has something to listen on.
                    if let Ok(socket) = bind(self.addr) {
                        self.socket = Socket::Bound(socket);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    async fn refuse(&mut self) -> io::Result<()> {
        self.listen_at = None;
        if let Socket::Listening(_) = self.socket {
            // Close the listener first: its address is only free to bind again once it is gone.
            self.socket = Socket::Closed;
            let mut attempts = 0;
            self.socket = loop {
                match bind(self.addr) {
                    Ok(socket) => break Socket::Bound(socket),
                    Err(e) if attempts < 50 => {
                        attempts += 1;
                        tracing::debug!(error = %e, "rebinding the refused port");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    Err(e) => return Err(e),
                }
            };
        }
        Ok(())
    }

    async fn kill_connections(&mut self) {
        self.kill.send_modify(|epoch| *epoch += 1);
        while self.connections.join_next().await.is_some() {}
    }

    async fn stop(&mut self) {
        self.listen_at = None;
        self.socket = Socket::Closed;
        self.kill_connections().await;
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Serves one connection (HTTP/1.1 or h2c) until it closes, is killed, or a request dooms it.
async fn serve_connection(app: Arc<App>, stream: TcpStream, mut kill: watch::Receiver<u64>) {
    let state = app.observer.connection_opened();
    // Declared first so it is dropped last: the connection counts as closed once both of its
    // file descriptors are.
    let _open = OpenConnection {
        app: Arc::clone(&app),
        state: Arc::clone(&state),
    };
    // Loopback only: small writes should not wait for Nagle.
    let _ = stream.set_nodelay(true);
    // A second descriptor for the same socket, kept out of hyper's hands: through it a doomed
    // connection is reset or sent garbage, and the socket outlives hyper's half until then.
    let (stream, spare) = match split_descriptor(stream) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::warn!(error = %e, "cannot duplicate the connection's descriptor");
            return;
        }
    };
    let service = {
        let app = Arc::clone(&app);
        let state = Arc::clone(&state);
        service_fn(move |req| Arc::clone(&app).handle(req, Arc::clone(&state)))
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    // Pinned here rather than moved into `select!`, which would drop it before the kill branch
    // could mark the connection.
    let mut connection = std::pin::pin!(connection);
    loop {
        tokio::select! {
            // Biased, closing first: a streamed answer's end wakes this task from inside the
            // connection's poll, and the close must come before hyper polls the connection
            // again, or it could read a request sent right after the answer and serve it.
            biased;
            () = state.closing() => {
                // The answer's terminating chunk is written and hyper is idle. It is not polled
                // during the delay, so a request sent meanwhile is never read (a client that
                // reused the connection loses it, as against the real engine); then hyper
                // closes the idle connection at once (no `Connection: close` was sent).
                tokio::time::sleep(app.config.close_after_stream_delay).await;
                connection.as_mut().graceful_shutdown();
            }
            result = &mut connection => {
                if let Err(e) = result {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                break;
            }
            _ = kill.changed() => {
                // Mark first, then drop: the trackers read the mark when they are dropped.
                state.killed.store(true, std::sync::atomic::Ordering::Release);
                break;
            }
            () = state.doomed() => break,
        }
    }
    match state.fate() {
        // SO_LINGER 0 on the socket: closing its last descriptor then sends RST, not FIN.
        Some(Fate::Reset) => {
            if let Err(e) = spare.set_zero_linger() {
                tracing::warn!(error = %e, "cannot set SO_LINGER 0 for an injected reset");
            }
        }
        Some(Fate::Garbage) => {
            if let Err(e) = write_all(&spare, GARBAGE).await {
                tracing::debug!(error = %e, "cannot write the injected garbage");
            }
        }
        None => {}
    }
}

/// Counts the connection as closed when dropped, whichever way `serve_connection` ends.
struct OpenConnection {
    app: Arc<App>,
    state: Arc<ConnectionState>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.app.observer.connection_closed(&self.state);
    }
}

/// The stream, and a second tokio handle on a duplicate of its descriptor.
fn split_descriptor(stream: TcpStream) -> io::Result<(TcpStream, TcpStream)> {
    let std = stream.into_std()?;
    let spare = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, TcpStream::from_std(spare)?))
}

/// Writes all of `bytes` (the garbage is small: one write, in practice).
async fn write_all(stream: &TcpStream, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.writable().await?;
        match stream.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
