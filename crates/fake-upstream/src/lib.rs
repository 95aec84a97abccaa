//! A faithful simulator of `llama-server`, vLLM and Ollama for slotgate's end-to-end tests,
//! benchmarks and demo. It serves the OpenAI-compatible API with each server's own slot limit,
//! over-capacity behaviour, error envelopes, probes and residency endpoints, as described in
//! the team's `PROTOCOLS.md` (the shared design docs beside the repository); and it lets a
//! test steer it per request and watch what it did.
//!
//! # Use from a test
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use std::time::Duration;
//! use fake_upstream::{FakeConfig, FakeUpstream, Outcome};
//!
//! let fake = FakeUpstream::start(FakeConfig::llama_server(4).model("qwen")).await?;
//! println!("point the gateway at {}", fake.url());
//! // ... drive traffic through the gateway ...
//! let observer = fake.observer();
//! observer.wait_for_in_flight(4, Duration::from_secs(10)).await?;
//! assert_eq!(observer.queued(), 0, "the gateway held the extra requests back");
//! let record = observer.wait_for_outcome("req-1", Duration::from_secs(10)).await?;
//! assert_eq!(record.outcome, Some(Outcome::ClientGoneMidResponse));
//! fake.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! # Kinds and their behaviour past the slot count
//!
//! | kind | slots | past the slots |
//! |---|---|---|
//! | `llama-server` | `--parallel` | deferred FIFO without bound; a deferred stream sends no headers until a slot starts it. With [`FakeConfig::collapse`], everything runs at once and more than `parallel` running makes every running request fail with 500 "Context size has been exceeded." (mid-stream: an error event, no `[DONE]`) |
//! | `vllm` | `max_num_seqs` | waiting FIFO without bound, silently |
//! | `ollama` | `num_parallel` per model | up to `max_queue` pending, then 503 "server busy, please try again.  maximum pending requests exceeded" |
//!
//! Endpoints that only read: `GET /v1/models` everywhere; llama-server adds `/health`, `/slots`,
//! `/props`, `/metrics`, `POST /tokenize`, `/detokenize`, `/apply-template`,
//! `/v1/messages/count_tokens` and, in router mode, `/models`, `/models/load`, `/models/unload`;
//! vLLM adds `/health` (empty body), `/metrics`, `/version`, `POST /tokenize`, `/detokenize`,
//! `/v1/messages/count_tokens`, and the stored Responses (`GET`/`DELETE /v1/responses/{id}`,
//! `POST /v1/responses/{id}/cancel`, `GET /v1/responses/{id}/input_items`); Ollama adds `GET /`,
//! `/api/tags`, `/api/ps`, `/api/version`, `POST /api/show` and `GET /v1/models/{id}`. None of
//! them takes a slot.
//!
//! Endpoints that run inference, each taking its slots exactly as chat does (so the observer
//! counts them and cap tests hold), in the shapes of the engine that serves them:
//!
//! | route | llama-server | vLLM | Ollama |
//! |---|---|---|---|
//! | `/v1/chat/completions`, `/v1/completions`, `/v1/embeddings` | yes (also without `/v1`) | yes | yes |
//! | `/v1/responses` (SSE `response.*` events, no `[DONE]`) | yes (also `/responses`) | yes, remembered | yes |
//! | `/v1/messages` (Anthropic; SSE `message_start` … `message_stop`) | yes | yes | yes |
//! | `/completion`, `/infill`, `/embedding` | yes | | |
//! | `/rerank`, `/v1/rerank` | yes (also `/reranking`, `/v1/reranking`) | yes (also `/v2/rerank`) | |
//! | `/score`, `/v1/score` | | yes | |
//! | `/v1/audio/transcriptions` (multipart) | yes | yes | yes |
//! | `/v1/audio/translations` (multipart) | | yes | |
//! | `/v1/audio/speech`, `/v1/images/generations` | | simplified | |
//! | `/api/chat`, `/api/generate` (NDJSON, streamed unless `"stream": false`), `/api/embed`, `/api/embeddings` | | | yes |
//!
//! A route a kind does not serve gets that kind's own 404 (llama-server's JSON `File Not
//! Found`, vLLM's `{"detail":"Not Found"}`, Ollama's plain `404 page not found`). Errors use the
//! route's envelope: Anthropic's on `/v1/messages`, Ollama's `{"error"}` on `/api/*`, the kind's
//! OpenAI-compatible one elsewhere.
//!
//! The Responses memory ([`FakeConfig::responses_store`], on for vLLM by default) is per
//! instance: an id made on one fake is a 404 on another, for look-ups and for
//! `previous_response_id`, which is how a test proves a gateway's affinity.
//!
//! Generated text is `tok0 tok1 tok2 ...`; streams start with a role chunk (chat), send one chunk
//! per token, a closing chunk with `finish_reason`, a usage chunk with `choices: []` when
//! `stream_options.include_usage` is set, and `data: [DONE]`.
//!
//! # Connections
//!
//! HTTP/1.1 connections are kept alive between requests, except that a llama-server closes
//! its connection after each streamed (chunked) answer, as the real one does (cpp-httplib: the
//! streamed answer's content provider returns `false` after `sink.done()`, which ends the
//! keep-alive loop; `tools/server/server-http.cpp`, docs/real-engine-notes.md "Streamed"). The
//! answer is whole (terminating chunk and all) and says nothing of closing: no
//! `Connection: close`. The close comes [`FakeConfig::close_after_stream_delay`] (20 ms) after
//! the last byte; a request written into the connection meanwhile is never read, so a client
//! that reuses it loses that request ("connection closed before message completed"). JSON
//! answers (`Content-Length`) keep the connection. [`FakeConfig::close_after_stream`] turns
//! this off (it is off for vLLM and Ollama, whose servers keep the connection); h2c connections
//! are never closed this way.
//!
//! # Control headers
//!
//! Each header overrides the server's configuration for one request (constants in [`headers`]):
//!
//! | header | value | effect |
//! |---|---|---|
//! | `x-fake-tokens` | integer | completion tokens (default: the config's `tokens`, capped by the body's `max_tokens` with `finish_reason: "length"`) |
//! | `x-fake-hold-ms` | integer | total generation time, spread over the tokens |
//! | `x-fake-tps` | number | tokens per second |
//! | `x-fake-chunk-interval-ms` | integer | gap between streamed tokens |
//! | `x-fake-fail` | list | failures to inject, comma-separated; `none` disables the server's default failures |
//! | `x-fake-prompt-tokens` | integer | prompt size for `usage` and the context check |
//! | `x-fake-prompt-cache` | `clear` | the engine forgets its prompt cache before this request, as a restart would |
//! | `x-request-id` | string | the id the observer records; echoed back |
//!
//! When several pacing headers are sent, `x-fake-chunk-interval-ms` wins over `x-fake-tps`, which
//! wins over `x-fake-hold-ms`. A malformed control header gets a 400 in the kind's envelope.
//!
//! Failures ([`Failure`]), applied once the request holds a slot:
//! - `status-<code>`: answer at once with that status in the kind's error envelope;
//! - `hang`: hold the slot and never answer (no response head);
//! - `die-after-chunks=N`: send N SSE events (the chat role chunk and `[DONE]` count), then abort
//!   the connection without the terminating chunk; a non-streaming answer is cut half-way;
//! - `die-mid-event=N`: send N SSE events and half of the next, then abort as `die-after-chunks`
//!   does (an engine cut in the middle of an event); a non-streaming answer is cut half-way;
//! - `error-after-chunks=N`: send N events, then the kind's in-stream error event;
//! - `slow-first-byte-ms=N`: wait N ms before the response headers;
//! - `stall-after-chunks=N`: send the head and N events, then nothing, with the slot and the
//!   connection held until the client leaves (non-streaming: the head only);
//! - `reset-after-chunks=N`: send N events (non-streaming: the head and half the body), then
//!   close the connection with a TCP reset (`SO_LINGER` 0);
//! - `reset-before-head`: reset the connection before any byte of the response;
//! - `garbage`: write [`GARBAGE`] (not HTTP) instead of a response, then close;
//! - `first-token-delay-ms=N`: a stream sends its head at once and its first event N ms later
//!   (a prefill, for time-to-first-token); a non-streaming answer comes N ms later.
//!
//! `status-<code>` uses the kind's envelope; where the engine has its own words for the status
//! they are used (llama-server 503: `Loading model`, exactly the body it sends while loading;
//! Ollama 503: its queue-full `server busy`). Engines do not send 502 or 504 themselves (a proxy
//! in front of them does); the fake sends them in the kind's envelope anyway.
//!
//! A request runs one sequence per choice: `n` (chat), `max(n, best_of)` (completions), each in
//! its own slot, taken together and in FIFO order; llama-server refuses `n` above its slots with
//! 400 (as measured on a real one), vLLM caps it at `max_num_seqs`, Ollama ignores `n`.
//!
//! A non-streaming request holds its slot for the whole generation time (embeddings too) and then
//! answers; a streaming one holds it until its last event is sent.
//!
//! # What the observer sees
//!
//! Per request ([`RequestRecord`]): arrival, slot start, end, [`Outcome`] (a client that left
//! is [`Outcome::ClientGoneWhileQueued`] or [`Outcome::ClientGoneMidResponse`]), status,
//! events sent, the slots it held (`weight`), its connection and when that connection closed
//! ([`Observer::wait_for_connection_closed`]). Counters ([`Snapshot`]): requests in flight and
//! queued with their peak, sequences in flight (engine slots in use) with their peak, per model
//! and in total (the total over a fake's models is the engine-wide figure: vLLM's `LoRA`
//! adapters share one engine), and connections open and accepted
//! ([`Observer::wait_for_open_connections`]).
//!
//! # The prompt cache
//!
//! Each engine instance remembers what its slots ran (vLLM: what its prefix cache holds), and
//! a request reports how much of its prompt it found there, the way each engine does:
//!
//! | kind | reported |
//! |---|---|
//! | `llama-server` | `usage.prompt_tokens` the whole prompt, `usage.prompt_tokens_details.cached_tokens` (Responses: `input_tokens_details`), and `timings` (`cache_n`, `prompt_n`, `prompt_ms`, ...) on the answer or on the stream's last chunk before `[DONE]` (Responses: on `response.completed`); Messages: `cache_read_input_tokens` and the rest as `input_tokens`; `/slots` `n_prompt_tokens_cache`; `/metrics` `llamacpp:prompt_tokens_cached_total` |
//! | `vllm` | `usage.prompt_tokens_details.cached_tokens` only with [`FakeConfig::prompt_tokens_details`] (`--enable-prompt-tokens-details`) and only when some were cached, in whole 16-token blocks; `/metrics` `vllm:prefix_cache_hits_total` |
//! | `ollama` | `prompt_eval_count` (and the `/v1` `prompt_tokens` taken from it) counts only the uncached part |
//!
//! A conversation whose next turn resends the previous one (its answer as an assistant
//! message) finds all of it cached but the new message, on the slot that ran it. How the fake
//! approximates tokens, slot choice and the engines' stores, and what
//! [`FakeConfig::cache_tokens`] keeps besides the slots: see `src/cache.rs`.
//! [`FakeConfig::prefill_per_token`] makes the first token wait for the uncached prompt (off by
//! default), so a cache hit answers sooner. [`FakeUpstream::clear_prompt_cache`] (or the header
//! `x-fake-prompt-cache: clear`) forgets everything, as a restart would;
//! [`FakeConfig::prompt_cache`]`(false)` reports 0 cached always.
//!
//! # Server-level switches
//!
//! [`FakeUpstream::refuse_connections`] / [`FakeUpstream::accept_connections`] make the port
//! refuse connects and listen again; [`FakeUpstream::drop_connections`] cuts every open
//! connection; [`FakeUpstream::set_healthy`] fails the health probe the kind's way;
//! [`FakeUpstream::set_failures`], [`FakeUpstream::set_pacing`] and
//! [`FakeUpstream::set_tokens`] change the defaults; [`FakeUpstream::load_model`] and
//! [`FakeUpstream::unload_model`] change residency; [`FakeUpstream::clear_prompt_cache`]
//! empties the prompt caches.
//!
//! # Deliberate differences from the real servers
//!
//! - `/metrics` is on by default (llama-server needs `--metrics`); `FakeConfig::metrics(false)`
//!   gives the real default's 501.
//! - While llama-server loads, `/` answers the JSON 503 like every other path, not the HTML page.
//! - vLLM keeps Responses only with `VLLM_ENABLE_RESPONSES_API_STORE=1`, and serves neither
//!   `DELETE /v1/responses/{id}` nor `.../input_items` (OpenAI's API has both); the fake serves
//!   all four whenever its store is on. A streamed response is remembered in its final state
//!   as soon as it starts, and cancelling a finished response returns it unchanged.
//! - `/v1/audio/speech` and `/v1/images/generations` are served on `kind = vllm` only, as
//!   placeholders (a WAV of silence, a 1×1 PNG): vLLM's own server has neither (vLLM-Omni and
//!   hosted APIs do). Transcriptions answer the generated text, whatever the audio.
//! - Rerank needs `--reranking` on a real llama-server (else 501); the fake always serves it.
//!   llama-server's errors on `/v1/messages` use Anthropic's envelope here, which is not
//!   verified against its source.
//! - Token counts are word counts, and the prompt cache compares words (see above).
//! - llama-server's bare `/completions` and `/embeddings` are its native handlers (the same as
//!   `/completion` and `/embedding`); the fake answers them in the OpenAI shape, as it always
//!   has, and tests rely on it. Use `/completion` and `/embedding` for the native shapes.
//! - The real llama-server's gap between a streamed answer's last byte and its close is not
//!   measured; the fake's 20 ms default makes the race of a reused connection near certain
//!   where the real one loses it a few times in a hundred.
//! - Ollama's `max_queue` applies to every request that must wait, as older Ollama versions did;
//!   the version cited in PROTOCOLS.md lets requests for a loaded model skip that queue, so the
//!   503 may never trigger there.

// The modules form a straight stack, each using only those listed before it:
// cache, failure, config, route, control, slots, observer, body, sse, form, openai, api, store,
// models, reply, state, kinds, app, server.
mod api;
mod app;
mod body;
mod cache;
mod config;
mod control;
mod failure;
mod form;
mod kinds;
mod models;
mod observer;
mod openai;
mod reply;
mod route;
mod server;
mod slots;
pub mod sse;
mod state;
mod store;

pub use crate::config::{FakeConfig, Kind, ModelSpec, Pacing, UnknownKind};
pub use crate::control::headers;
pub use crate::failure::{BadFailureSpec, Failure, GARBAGE, parse_failures};
pub use crate::observer::{ModelCounts, Observer, Outcome, RequestRecord, Snapshot, WaitTimeout};
pub use crate::server::{FakeUpstream, StartError};
