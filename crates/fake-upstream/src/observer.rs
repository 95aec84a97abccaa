//! The observer: what the fake saw. It records every request (id, path, model, timeline,
//! outcome) and keeps the concurrency counters tests assert on: requests holding a slot now
//! (in flight), requests waiting for one (queued: llama-server's deferred, vLLM's waiting), and
//! the peak of in flight since the last [`Observer::reset_peak`]. Next to the request counts it
//! keeps the *sequences* in flight and their peak: a request with `n` choices runs `n`
//! sequences, each in its own engine slot, so the sequences are what an engine's slot count
//! (`--parallel`, `max_num_seqs`) caps. Both exist per model and in total; the total over the
//! models of one fake is the engine-wide figure (vLLM `LoRA` adapters share one engine).
//!
//! # Implementation Details
//!
//! Each request gets a [`Tracker`], created when its head arrives. The tracker moves from the
//! service future into the response body, so whichever of the two is dropped early tells how far
//! the request got: a tracker dropped while queued means the client left while deferred; one
//! dropped while holding a slot means it left mid-response. The tracker also owns the slot
//! [`Lease`], and on every path it updates the counters *before* it frees the slot, so the next
//! waiter can never be counted while this request still is (the peak never over-counts).
//!
//! Connections are counted too (open now, accepted so far), and every record names its
//! connection and when that connection closed, so a test can see that a client (the gateway)
//! let go of the engine's connection, not only of the request.
//!
//! Waiters use a `watch` channel bumped on every change: subscribe, check, await a change, check
//! again. No change can slip between the check and the wait.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::failure::Failure;
use crate::route::is_inference_path;
use crate::slots::Lease;

/// How a request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outcome {
    /// The whole response was handed to the connection.
    Completed,
    /// The client went away while the request waited for a slot (deferred / waiting) or for its
    /// model to load. The request never ran.
    ClientGoneWhileQueued,
    /// The client went away while the request held a slot: generating, streaming, or hanging.
    ClientGoneMidResponse,
    /// An injected failure ended it ([`Failure::Status`], [`Failure::DieAfterChunks`],
    /// [`Failure::ErrorAfterChunks`]).
    Injected(Failure),
    /// The server refused it before it got a slot with this status (unknown model, Ollama queue
    /// full, llama-server still loading, context too large, malformed request).
    Rejected(u16),
    /// It failed while holding a slot, the server's own way (llama-server's KV-cache collapse).
    Failed(u16),
    /// The fake cut the connection itself ([`FakeUpstream::drop_connections`] or shutdown).
    ///
    /// [`FakeUpstream::drop_connections`]: crate::FakeUpstream::drop_connections
    ServerDropped,
}

/// One request as the fake saw it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RequestRecord {
    /// `x-request-id`, or `fake-<n>` when the client sent none.
    pub id: String,
    /// The HTTP method.
    pub method: String,
    /// The path, without the query.
    pub path: String,
    /// `"model"` from the body (or `?model=` for router GETs), as the client wrote it.
    pub model: Option<String>,
    /// `"stream": true` in the body.
    pub stream: bool,
    /// The failures that applied to it.
    pub failures: Vec<Failure>,
    /// When its head arrived.
    pub received_at: Instant,
    /// When it got a slot; `None` if it never did (or never needed one: probes, listings).
    pub started_at: Option<Instant>,
    /// The slots (sequences) it held once started: `n` for `n` choices, else 1; 0 before.
    pub weight: usize,
    /// When it ended; `None` while it is still going.
    pub ended_at: Option<Instant>,
    /// How it ended; `None` while it is still going.
    pub outcome: Option<Outcome>,
    /// The response status, once headers went out.
    pub status: Option<u16>,
    /// SSE events (`data: ...`) sent so far, `[DONE]` included (NDJSON lines for Ollama's
    /// native API).
    pub events_sent: usize,
    /// The connection it came on: a number unique to this fake, counted from 1.
    pub connection: u64,
    /// When that connection closed (either side); `None` while it is open.
    pub connection_closed_at: Option<Instant>,
}

impl RequestRecord {
    /// True for the routes that run inference on some kind (OpenAI chat, completions,
    /// embeddings, responses; Anthropic messages; Ollama's and llama-server's native generation
    /// and embeddings; rerank, score, audio, images); false for probes, listings and the
    /// slot-free helpers (tokenize, count tokens, stored responses).
    pub fn is_inference(&self) -> bool {
        is_inference_path(&self.path)
    }

    /// True once the request has ended.
    pub fn is_done(&self) -> bool {
        self.outcome.is_some()
    }

    /// How long it waited for a slot, if it got one.
    pub fn queue_wait(&self) -> Option<Duration> {
        self.started_at.map(|s| s - self.received_at)
    }
}

/// Counters of one model (the served model name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ModelCounts {
    /// Requests holding a slot now.
    pub in_flight: usize,
    /// Requests waiting for a slot (or for the model to load) now.
    pub queued: usize,
    /// The most requests that held a slot at once since the last reset.
    pub peak_in_flight: usize,
    /// Sequences running now: the slots the requests in flight hold (`n` for `n` choices).
    pub sequences_in_flight: usize,
    /// The most sequences that ran at once since the last reset.
    pub peak_sequences_in_flight: usize,
}

/// The counters at one instant.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Snapshot {
    /// Requests holding a slot now, over all models. Deferred requests are not counted.
    pub in_flight: usize,
    /// Requests waiting for a slot (or for their model to load) now.
    pub queued: usize,
    /// The most requests that held a slot at once since start or the last reset.
    pub peak_in_flight: usize,
    /// Sequences running now over all models: the engine slots in use (a request with `n`
    /// choices holds `n`).
    pub sequences_in_flight: usize,
    /// The most sequences that ran at once, over all models, since start or the last reset:
    /// what a shared engine-wide cap must bound.
    pub peak_sequences_in_flight: usize,
    /// Inference requests received so far (probes and listings are recorded but not counted).
    pub received: usize,
    /// Inference requests that have ended so far.
    pub ended: usize,
    /// The same counters per served model.
    pub models: BTreeMap<String, ModelCounts>,
    /// Connections open now.
    pub connections_open: usize,
    /// Connections accepted since start.
    pub connections_accepted: usize,
}

impl Snapshot {
    /// The counters of one model (all zero for a model never seen).
    pub fn model(&self, name: &str) -> ModelCounts {
        self.models.get(name).copied().unwrap_or_default()
    }
}

/// A wait helper ran out of time. Its message says what was awaited and what the fake saw.
#[derive(Clone, Debug, thiserror::Error)]
#[error("timed out after {timeout:?} waiting for {what}; last seen: {snapshot:?}")]
#[non_exhaustive]
pub struct WaitTimeout {
    /// What was awaited.
    pub what: String,
    /// The timeout.
    pub timeout: Duration,
    /// The counters when the time ran out.
    pub snapshot: Snapshot,
}

/// Access to what a fake upstream saw. Cheap to clone; every clone sees the same data.
#[derive(Clone)]
pub struct Observer {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    changed: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    records: Vec<RequestRecord>,
    /// Records forgotten by `clear_requests`; a tracker's index minus this is its position.
    cleared: usize,
    counts: Snapshot,
    next_id: u64,
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("snapshot", &self.snapshot())
            .finish_non_exhaustive()
    }
}

impl Default for Observer {
    fn default() -> Self {
        Self::new()
    }
}

impl Observer {
    /// An observer that has seen nothing.
    pub fn new() -> Self {
        Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                changed: watch::Sender::new(0),
            }),
        }
    }

    /// The counters now.
    pub fn snapshot(&self) -> Snapshot {
        self.inner.state.lock().counts.clone()
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> usize {
        self.inner.state.lock().counts.in_flight
    }

    /// Requests waiting for a slot now (llama-server deferred, vLLM waiting, Ollama pending).
    pub fn queued(&self) -> usize {
        self.inner.state.lock().counts.queued
    }

    /// The most requests that held a slot at once since start or the last [`reset_peak`].
    ///
    /// [`reset_peak`]: Observer::reset_peak
    pub fn peak_in_flight(&self) -> usize {
        self.inner.state.lock().counts.peak_in_flight
    }

    /// Sequences running now over all models (engine slots in use).
    pub fn sequences_in_flight(&self) -> usize {
        self.inner.state.lock().counts.sequences_in_flight
    }

    /// The most sequences that ran at once over all models since start or the last
    /// [`reset_peak`](Observer::reset_peak).
    pub fn peak_sequences_in_flight(&self) -> usize {
        self.inner.state.lock().counts.peak_sequences_in_flight
    }

    /// Restarts peak tracking from the current in-flight numbers (requests and sequences,
    /// overall and per model).
    pub fn reset_peak(&self) {
        let mut state = self.inner.state.lock();
        state.counts.peak_in_flight = state.counts.in_flight;
        state.counts.peak_sequences_in_flight = state.counts.sequences_in_flight;
        for counts in state.counts.models.values_mut() {
            counts.peak_in_flight = counts.in_flight;
            counts.peak_sequences_in_flight = counts.sequences_in_flight;
        }
        drop(state);
        self.notify();
    }

    /// Every request received so far, in arrival order, probes and listings included.
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.inner.state.lock().records.clone()
    }

    /// The inference requests received so far, in arrival order.
    pub fn inference_requests(&self) -> Vec<RequestRecord> {
        let state = self.inner.state.lock();
        state
            .records
            .iter()
            .filter(|r| r.is_inference())
            .cloned()
            .collect()
    }

    /// The request with this id (the latest, if the id was reused).
    pub fn request(&self, id: &str) -> Option<RequestRecord> {
        let state = self.inner.state.lock();
        state.records.iter().rev().find(|r| r.id == id).cloned()
    }

    /// Forgets the recorded requests (not the counters of requests still going). Requests still
    /// going when this is called are not recorded any further.
    pub fn clear_requests(&self) {
        let mut state = self.inner.state.lock();
        state.cleared += state.records.len();
        state.records.clear();
        state.counts.received = 0;
        state.counts.ended = 0;
        drop(state);
        self.notify();
    }

    /// Waits until `done` holds for the counters; returns the snapshot that satisfied it.
    pub async fn wait_until(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&Snapshot) -> bool,
    ) -> Result<Snapshot, WaitTimeout> {
        self.wait_for(what, timeout, |state| {
            done(&state.counts).then(|| state.counts.clone())
        })
        .await
    }

    /// Waits until `done` holds for the recorded requests.
    pub async fn wait_until_requests(
        &self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&[RequestRecord]) -> bool,
    ) -> Result<Vec<RequestRecord>, WaitTimeout> {
        self.wait_for(what, timeout, |state| {
            done(&state.records).then(|| state.records.clone())
        })
        .await
    }

    /// Waits until exactly `n` requests hold a slot.
    pub async fn wait_for_in_flight(&self, n: usize, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(&format!("in_flight == {n}"), timeout, |s| s.in_flight == n)
            .await
            .map(drop)
    }

    /// Waits until exactly `n` requests wait for a slot.
    pub async fn wait_for_queued(&self, n: usize, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(&format!("queued == {n}"), timeout, |s| s.queued == n)
            .await
            .map(drop)
    }

    /// Waits until at least `n` inference requests have arrived.
    pub async fn wait_for_received(&self, n: usize, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(&format!("received >= {n}"), timeout, |s| s.received >= n)
            .await
            .map(drop)
    }

    /// Waits until at least `n` inference requests have ended.
    pub async fn wait_for_ended(&self, n: usize, timeout: Duration) -> Result<(), WaitTimeout> {
        self.wait_until(&format!("ended >= {n}"), timeout, |s| s.ended >= n)
            .await
            .map(drop)
    }

    /// Waits until the request with this id has ended, and returns its record.
    pub async fn wait_for_outcome(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<RequestRecord, WaitTimeout> {
        self.wait_for(&format!("request {id:?} to end"), timeout, |state| {
            state
                .records
                .iter()
                .rev()
                .find(|r| r.id == id && r.is_done())
                .cloned()
        })
        .await
    }

    /// Waits until exactly `n` connections are open.
    pub async fn wait_for_open_connections(
        &self,
        n: usize,
        timeout: Duration,
    ) -> Result<(), WaitTimeout> {
        self.wait_until(&format!("connections_open == {n}"), timeout, |s| {
            s.connections_open == n
        })
        .await
        .map(drop)
    }

    /// Waits until the connection that carried the request with this id has closed, and returns
    /// the request's record: proof that the client (the gateway) let go of the engine's
    /// connection.
    pub async fn wait_for_connection_closed(
        &self,
        id: &str,
        timeout: Duration,
    ) -> Result<RequestRecord, WaitTimeout> {
        let what = format!("the connection of request {id:?} to close");
        self.wait_for(&what, timeout, |state| {
            state
                .records
                .iter()
                .rev()
                .find(|r| r.id == id && r.connection_closed_at.is_some())
                .cloned()
        })
        .await
    }

    async fn wait_for<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut check: impl FnMut(&State) -> Option<T>,
    ) -> Result<T, WaitTimeout> {
        let deadline = Instant::now() + timeout;
        let mut versions = self.inner.changed.subscribe();
        loop {
            if let Some(found) = check(&self.inner.state.lock()) {
                return Ok(found);
            }
            let waited = tokio::time::timeout_at(deadline, versions.changed()).await;
            // The sender lives as long as `self`, so only the timeout ends the wait.
            if waited.is_err() {
                return Err(WaitTimeout {
                    what: what.to_owned(),
                    timeout,
                    snapshot: self.snapshot(),
                });
            }
        }
    }

    fn notify(&self) {
        self.inner.changed.send_modify(|version| *version += 1);
    }

    // === the fake's side ===

    /// Counts a new connection and returns its state.
    pub(crate) fn connection_opened(&self) -> Arc<ConnectionState> {
        let mut state = self.inner.state.lock();
        state.counts.connections_accepted += 1;
        state.counts.connections_open += 1;
        let id = state.counts.connections_accepted as u64;
        drop(state);
        self.notify();
        Arc::new(ConnectionState {
            id,
            ..ConnectionState::default()
        })
    }

    /// Counts a connection as closed and stamps the records of its requests.
    pub(crate) fn connection_closed(&self, connection: &ConnectionState) {
        let mut state = self.inner.state.lock();
        state.counts.connections_open -= 1;
        let now = Instant::now();
        for record in state.records.iter_mut().rev() {
            if record.connection == connection.id && record.connection_closed_at.is_none() {
                record.connection_closed_at = Some(now);
            }
        }
        drop(state);
        self.notify();
    }

    /// Starts recording a request.
    pub(crate) fn track(
        &self,
        request_id: Option<String>,
        method: &str,
        path: &str,
        connection: Arc<ConnectionState>,
    ) -> Tracker {
        let mut state = self.inner.state.lock();
        state.next_id += 1;
        let id = request_id.unwrap_or_else(|| format!("fake-{}", state.next_id));
        let inference = is_inference_path(path);
        if inference {
            state.counts.received += 1;
        }
        let index = state.cleared + state.records.len();
        state.records.push(RequestRecord {
            id: id.clone(),
            method: method.to_owned(),
            path: path.to_owned(),
            model: None,
            stream: false,
            failures: Vec::new(),
            received_at: Instant::now(),
            started_at: None,
            weight: 0,
            ended_at: None,
            outcome: None,
            status: None,
            events_sent: 0,
            connection: connection.id,
            connection_closed_at: None,
        });
        drop(state);
        self.notify();
        Tracker {
            observer: self.clone(),
            index,
            id,
            inference,
            model_key: None,
            phase: Phase::Received,
            weight: 0,
            lease: None,
            connection,
        }
    }

    /// Updates the counters and, if it is still recorded (not cleared), the record of `tracker`.
    fn update(&self, tracker: &Tracker, f: impl FnOnce(Option<&mut RequestRecord>, &mut Snapshot)) {
        let mut state = self.inner.state.lock();
        let State {
            records,
            cleared,
            counts,
            ..
        } = &mut *state;
        let record = tracker
            .index
            .checked_sub(*cleared)
            .and_then(|i| records.get_mut(i));
        f(record, counts);
        drop(state);
        self.notify();
    }
}

/// Per-connection state: what the trackers consult when they are dropped, and how a request
/// asks the server to end its connection abnormally (an injected reset or garbage).
#[derive(Debug, Default)]
pub(crate) struct ConnectionState {
    /// The observer's number for it (0 outside a server, in unit tests).
    pub(crate) id: u64,
    /// Set by the server right before it cuts the connection, so requests dropped with it are
    /// recorded as [`Outcome::ServerDropped`] rather than as the client leaving.
    pub(crate) killed: AtomicBool,
    /// The [`Fate`] a request asked for, as its `u8`.
    fate: AtomicU8,
    doomed: Notify,
    /// Set by a request when the connection is to end after each streamed answer
    /// ([`FakeConfig::close_after_stream`](crate::FakeConfig), on HTTP/1 only).
    close_after_stream: AtomicBool,
    stream_ended: Notify,
}

/// How a request asks its connection to end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Close with a TCP reset (`SO_LINGER` 0).
    Reset = 1,
    /// Write bytes that are not HTTP, then close.
    Garbage = 2,
}

impl ConnectionState {
    /// Asks the server to end this connection this way; the first request to ask wins.
    pub(crate) fn doom(&self, fate: Fate) {
        let _ = self
            .fate
            .compare_exchange(0, fate as u8, Ordering::AcqRel, Ordering::Acquire);
        self.doomed.notify_one();
    }

    /// The fate asked for, if any.
    pub(crate) fn fate(&self) -> Option<Fate> {
        match self.fate.load(Ordering::Acquire) {
            1 => Some(Fate::Reset),
            2 => Some(Fate::Garbage),
            _ => None,
        }
    }

    /// Makes the connection end after each streamed answer from now on.
    pub(crate) fn close_after_streams(&self) {
        self.close_after_stream.store(true, Ordering::Release);
    }

    /// A streamed answer has ended cleanly (its body is handed to hyper whole): the server ends
    /// the connection if [`close_after_streams`](Self::close_after_streams) was asked for.
    pub(crate) fn stream_ended(&self) {
        if self.close_after_stream.load(Ordering::Acquire) {
            self.stream_ended.notify_one();
        }
    }

    /// Resolves once a streamed answer ended on a connection to be closed after it.
    pub(crate) async fn closing(&self) {
        self.stream_ended.notified().await;
    }

    /// Resolves once a request has asked for a fate.
    pub(crate) async fn doomed(&self) {
        self.doomed.notified().await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Received,
    Queued,
    Running,
    Done,
}

/// The fake's handle on one request's record; see the module docs.
pub(crate) struct Tracker {
    observer: Observer,
    index: usize,
    id: String,
    inference: bool,
    model_key: Option<String>,
    phase: Phase,
    /// The slots it holds once running.
    weight: usize,
    lease: Option<Lease>,
    connection: Arc<ConnectionState>,
}

impl fmt::Debug for Tracker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracker")
            .field("id", &self.id)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl Tracker {
    /// The request id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The connection the request came on.
    pub(crate) fn connection(&self) -> &Arc<ConnectionState> {
        &self.connection
    }

    /// Records what the body asked for.
    pub(crate) fn describe(&mut self, model: Option<&str>, stream: bool, failures: &[Failure]) {
        self.observer.update(self, |record, _| {
            if let Some(record) = record {
                record.model = model.map(str::to_owned);
                record.stream = stream;
                record.failures = failures.to_vec();
            }
        });
    }

    /// Sets the served model the per-model counters use. Call before [`Tracker::queued`].
    pub(crate) fn set_model_key(&mut self, key: &str) {
        self.model_key = Some(key.to_owned());
    }

    /// The request starts waiting (for a slot or for its model).
    pub(crate) fn queued(&mut self) {
        if self.phase != Phase::Received {
            return;
        }
        self.phase = Phase::Queued;
        let key = self.model_key.clone();
        self.observer.update(self, |_, counts| {
            counts.queued += 1;
            if let Some(key) = key {
                counts.models.entry(key).or_default().queued += 1;
            }
        });
    }

    /// The request got its slots.
    pub(crate) fn start(&mut self, lease: Lease) {
        let was_queued = self.phase == Phase::Queued;
        self.phase = Phase::Running;
        let weight = lease.weight();
        self.weight = weight;
        self.lease = Some(lease);
        let key = self.model_key.clone();
        self.observer.update(self, |record, counts| {
            if let Some(record) = record {
                record.started_at = Some(Instant::now());
                record.weight = weight;
            }
            if was_queued {
                counts.queued -= 1;
            }
            counts.in_flight += 1;
            counts.peak_in_flight = counts.peak_in_flight.max(counts.in_flight);
            counts.sequences_in_flight += weight;
            counts.peak_sequences_in_flight = counts
                .peak_sequences_in_flight
                .max(counts.sequences_in_flight);
            if let Some(key) = key {
                let model = counts.models.entry(key).or_default();
                if was_queued {
                    model.queued -= 1;
                }
                model.in_flight += 1;
                model.peak_in_flight = model.peak_in_flight.max(model.in_flight);
                model.sequences_in_flight += weight;
                model.peak_sequences_in_flight = model
                    .peak_sequences_in_flight
                    .max(model.sequences_in_flight);
            }
        });
    }

    /// Response headers went out with this status.
    pub(crate) fn status(&mut self, status: u16) {
        self.observer.update(self, |record, _| {
            if let Some(record) = record {
                record.status = Some(status);
            }
        });
    }

    /// One SSE event went out.
    pub(crate) fn event_sent(&mut self) {
        self.observer.update(self, |record, _| {
            if let Some(record) = record {
                record.events_sent += 1;
            }
        });
    }

    /// Ends the request. Idempotent: only the first outcome counts.
    pub(crate) fn finish(&mut self, outcome: Outcome) {
        let phase = std::mem::replace(&mut self.phase, Phase::Done);
        if phase == Phase::Done {
            return;
        }
        let key = self.model_key.clone();
        let inference = self.inference;
        let weight = self.weight;
        self.observer.update(self, |record, counts| {
            if let Some(record) = record {
                record.ended_at = Some(Instant::now());
                record.outcome = Some(outcome);
                if inference {
                    counts.ended += 1;
                }
            }
            let model = key.map(|k| counts.models.entry(k).or_default());
            match phase {
                Phase::Queued => {
                    counts.queued -= 1;
                    if let Some(m) = model {
                        m.queued -= 1;
                    }
                }
                Phase::Running => {
                    counts.in_flight -= 1;
                    counts.sequences_in_flight -= weight;
                    if let Some(m) = model {
                        m.in_flight -= 1;
                        m.sequences_in_flight -= weight;
                    }
                }
                Phase::Received | Phase::Done => {}
            }
        });
        // Only now free the slot: the counters already say this request is gone.
        self.lease = None;
    }
}

impl Drop for Tracker {
    fn drop(&mut self) {
        let outcome = if self.connection.killed.load(Ordering::Acquire) {
            Outcome::ServerDropped
        } else if self.phase == Phase::Running {
            Outcome::ClientGoneMidResponse
        } else {
            Outcome::ClientGoneWhileQueued
        };
        self.finish(outcome);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::slots::SlotPool;

    fn conn() -> Arc<ConnectionState> {
        Arc::new(ConnectionState::default())
    }

    #[tokio::test]
    async fn counts_follow_the_phases() {
        let observer = Observer::new();
        let pool = SlotPool::new(1, false, crate::cache::CacheSpec::off());
        let mut a = observer.track(Some("a".into()), "POST", "/v1/chat/completions", conn());
        a.set_model_key("m");
        a.queued();
        assert_eq!(observer.queued(), 1);
        a.start(pool.try_acquire(&crate::slots::Work::plain(1, 1)).unwrap());
        let s = observer.snapshot();
        assert_eq!((s.in_flight, s.queued, s.peak_in_flight), (1, 0, 1));
        assert_eq!(s.model("m").in_flight, 1);
        a.finish(Outcome::Completed);
        a.finish(Outcome::ClientGoneMidResponse);
        assert_eq!(
            observer.request("a").unwrap().outcome,
            Some(Outcome::Completed)
        );
        assert_eq!(observer.in_flight(), 0);
        assert_eq!(pool.running(), 0, "finishing frees the slot");
        assert_eq!(observer.peak_in_flight(), 1);
        observer.reset_peak();
        assert_eq!(observer.peak_in_flight(), 0);
    }

    #[tokio::test]
    async fn dropping_tells_the_phase() {
        let observer = Observer::new();
        let pool = SlotPool::new(1, false, crate::cache::CacheSpec::off());
        let mut queued = observer.track(Some("q".into()), "POST", "/v1/completions", conn());
        queued.queued();
        drop(queued);
        let mut running = observer.track(Some("r".into()), "POST", "/v1/completions", conn());
        running.start(pool.try_acquire(&crate::slots::Work::plain(1, 1)).unwrap());
        drop(running);
        let killed = conn();
        let mut cut = observer.track(Some("k".into()), "POST", "/v1/completions", killed.clone());
        cut.start(pool.try_acquire(&crate::slots::Work::plain(1, 1)).unwrap());
        killed.killed.store(true, Ordering::Release);
        drop(cut);
        let outcome = |id| observer.request(id).unwrap().outcome.unwrap();
        assert_eq!(outcome("q"), Outcome::ClientGoneWhileQueued);
        assert_eq!(outcome("r"), Outcome::ClientGoneMidResponse);
        assert_eq!(outcome("k"), Outcome::ServerDropped);
        let s = observer.snapshot();
        assert_eq!((s.in_flight, s.queued, s.received, s.ended), (0, 0, 3, 3));
    }

    #[tokio::test]
    async fn waits_see_changes_and_time_out() {
        let observer = Observer::new();
        let err = observer
            .wait_for_received(1, Duration::from_millis(20))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("received >= 1"));
        let o = observer.clone();
        let waiter =
            tokio::spawn(async move { o.wait_for_outcome("x", Duration::from_secs(30)).await });
        let mut t = observer.track(Some("x".into()), "POST", "/v1/embeddings", conn());
        t.finish(Outcome::Rejected(404));
        let record = waiter.await.unwrap().unwrap();
        assert_eq!(record.outcome, Some(Outcome::Rejected(404)));
    }

    #[test]
    fn probes_are_recorded_but_not_counted() {
        let observer = Observer::new();
        drop(observer.track(None, "GET", "/health", conn()));
        assert_eq!(observer.requests().len(), 1);
        assert_eq!(observer.requests()[0].id, "fake-1");
        assert!(observer.inference_requests().is_empty());
        assert_eq!(observer.snapshot().received, 0);
    }
}
