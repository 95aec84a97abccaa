//! What the body of an engine's answer tells as it streams through: the time to the first
//! token, the tokens the engine reports in `usage`, and how the request ended (for the access
//! log). [`Meter`] rides in the [`Watch`](crate::proxy::body::Watch) of the slot body, which
//! shows it every data frame and tells it how the body ended.
//!
//! - **First token**: the first body frame that carries data; for SSE (`text/event-stream`), the
//!   first frame in which a `data:` line starts (comments and `event:` lines alone do not count),
//!   so an engine that sends its head, or a comment, before prefill is done is not taken for
//!   one that answered. Observed into `slotgate_time_to_first_token_seconds`, counted from when
//!   the request was sent. For a non-streamed answer the first token comes with the whole
//!   answer.
//! - **Tokens**: a copy of the last [`TAIL`] bytes of the answer is kept (each frame goes on to
//!   the client at once; none is held back or kept alive, so hyper reuses its read buffers).
//!   When the answer ends cleanly, the last `"usage"` member in them is read: a non-streamed JSON answer
//!   ends with it, and a stream carries it in its final chunk when the client asked for
//!   `stream_options.include_usage` (OpenAI, vLLM, llama-server) or the Responses API's
//!   `response.completed` event. Ollama's own API ends with `prompt_eval_count` and
//!   `eval_count`, read the same way. `prompt_tokens`/`input_tokens` count as `prompt`,
//!   `completion_tokens`/`output_tokens` as `completion`. Without usage there is nothing to count.
//! - **Cached prompt tokens**: `usage.prompt_tokens_details.cached_tokens` (OpenAI, vLLM with
//!   `--enable-prompt-tokens-details`, llama-server), `usage.input_tokens_details.cached_tokens`
//!   (the Responses API), `usage.cache_read_input_tokens` (Anthropic's Messages API, where
//!   `input_tokens` counts only the rest, so the prompt is their sum), else llama-server's
//!   `timings.cache_n`. Counted as `cached_prompt`, written to the access log, and, for a request
//!   placed by its prompt, handed to its [`Feedback`], which checks what the index predicted.
//!   Ollama reports no cached count (its `prompt_eval_count` counts only what it computed).

use std::collections::VecDeque;
use std::sync::{Arc, LazyLock};
use std::time::Instant;

use bytes::Bytes;
use http::{HeaderMap, StatusCode, header};
use memchr::memmem::Finder;
use serde::Deserialize;

use super::Completion;
use crate::metrics::{TargetMetrics, observe};
use crate::proxy::access::{Access, Outcome};
use crate::proxy::cache_aware::{Feedback, Report};

/// How much of an answer's end is kept to find its usage, in bytes: the final usage chunk of a
/// stream (about 300 bytes), or what follows `usage` at the end of a JSON document (llama-server's
/// `timings`, the Responses API's `user` and `metadata`), fits many times over; 10,000 streams
/// keep 40 MiB.
pub(crate) const TAIL: usize = 4 * 1024;

/// Watches one answer's frames; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct Meter {
    /// The target's handles: TTFT and tokens are recorded only for requests that hold a slot.
    metrics: Option<Arc<TargetMetrics>>,
    access: Access,
    sent: Instant,
    status: StatusCode,
    first: FirstToken,
    /// When the first token came, after `sent`.
    first_after: Option<std::time::Duration>,
    tail: Tail,
    /// What cache-aware routing predicted for this answer.
    feedback: Option<Feedback>,
}

impl Meter {
    /// A meter for an answer with `headers` and `status` to a request sent at `sent`.
    pub(crate) fn new(
        metrics: Option<Arc<TargetMetrics>>,
        access: Access,
        sent: Instant,
        headers: &HeaderMap,
        status: StatusCode,
    ) -> Self {
        let sse = is_sse(headers);
        Self {
            metrics,
            access,
            sent,
            status,
            first: FirstToken::new(sse),
            first_after: None,
            tail: Tail::default(),
            feedback: None,
        }
    }

    /// Hands the engine's report of its cached prompt tokens to `feedback` at the end.
    pub(crate) fn with_feedback(mut self, feedback: Option<Feedback>) -> Self {
        self.feedback = feedback;
        self
    }

    /// Sees one data frame on its way to the client.
    pub(crate) fn frame(&mut self, data: &Bytes) {
        if self.first.see(data) {
            let after = self.sent.elapsed();
            if let Some(metrics) = &self.metrics {
                observe(&metrics.first_token, after);
            }
            self.access.first_token(after);
            self.first_after = Some(after);
        }
        if self.metrics.is_some() {
            self.tail.push(data);
        }
    }

    /// The answer is over, as `how` says.
    pub(crate) fn end(&mut self, how: Completion) {
        let outcome = match how {
            Completion::Ended if self.status.as_u16() >= 500 => Outcome::UpstreamStatusError,
            Completion::Ended => Outcome::Completed,
            Completion::Failed | Completion::Stalled { .. } => Outcome::UpstreamError,
            Completion::Dropped { .. } => Outcome::ClientGone,
        };
        self.access.outcome(outcome);
        let mut tail = std::mem::take(&mut self.tail);
        if how != Completion::Ended {
            return;
        }
        if let (Some(metrics), Some(tokens)) = (&self.metrics, usage(tail.bytes())) {
            if let Some(prompt) = tokens.prompt {
                metrics.prompt_tokens.inc_by(prompt);
            }
            if let Some(completion) = tokens.completion {
                metrics.completion_tokens.inc_by(completion);
            }
            if let Some(cached) = tokens.cached {
                metrics.cached_prompt_tokens.inc_by(cached);
            }
            let report = Report {
                prompt: tokens.prompt,
                cached: tokens.cached,
                prefill: tokens.prefill,
                processed: tokens.processed,
                // A whole answer's first byte comes after its decode: no prefill measurement.
                ttft: self.first.sse.then_some(self.first_after).flatten(),
            };
            let predicted = self
                .feedback
                .take()
                .and_then(|feedback| feedback.end(&report));
            self.access.cached_tokens(predicted, tokens.cached);
        }
    }
}

/// Whether an answer with `headers` is an SSE stream: its media type (before any `;`
/// parameters, blanks around it ignored, any case) is `text/event-stream`. Compared as bytes:
/// it runs for every answer.
pub(crate) fn is_sse(headers: &HeaderMap) -> bool {
    is_media_type(headers, b"text/event-stream")
}

/// Whether an answer with `headers` is newline-delimited JSON (`application/x-ndjson`, what
/// Ollama streams), compared as [`is_sse`] does.
pub(crate) fn is_ndjson(headers: &HeaderMap) -> bool {
    is_media_type(headers, b"application/x-ndjson")
}

/// Whether the media type of `headers` is `media`.
fn is_media_type(headers: &HeaderMap, media: &[u8]) -> bool {
    headers.get(header::CONTENT_TYPE).is_some_and(|value| {
        let value = value.as_bytes().trim_ascii_start();
        value.len() >= media.len()
            && value[..media.len()].eq_ignore_ascii_case(media)
            && matches!(
                value[media.len()..].trim_ascii_start().first(),
                None | Some(b';')
            )
    })
}

/// Finds the first frame that carries a token.
#[derive(Debug)]
struct FirstToken {
    /// Seen already: nothing more to look at.
    found: bool,
    sse: bool,
    /// SSE: the start of the current line seen so far (up to `data:`'s length); `None` past
    /// it, when the line is known not to be a `data:` line.
    line: Option<Vec<u8>>,
}

const DATA: &[u8] = b"data:";

impl FirstToken {
    fn new(sse: bool) -> Self {
        Self {
            found: false,
            sse,
            line: Some(Vec::new()),
        }
    }

    /// Whether `data` brings the first token.
    fn see(&mut self, data: &[u8]) -> bool {
        if self.found || data.is_empty() {
            return false;
        }
        self.found = !self.sse || self.sees_data_line(data);
        self.found
    }

    /// Whether a `data:` line starts in `data`, carrying the start of a line over from the
    /// frame before (a frame may end anywhere).
    fn sees_data_line(&mut self, data: &[u8]) -> bool {
        for &byte in data {
            if byte == b'\n' || byte == b'\r' {
                self.line = Some(Vec::new());
                continue;
            }
            if let Some(line) = &mut self.line {
                line.push(byte);
                if !DATA.starts_with(line) {
                    self.line = None;
                } else if line.len() == DATA.len() {
                    return true;
                }
            }
        }
        false
    }
}

/// A copy of the last [`TAIL`] bytes of an answer, in a ring that never grows past them.
#[derive(Debug, Default)]
struct Tail {
    ring: VecDeque<u8>,
}

impl Tail {
    fn push(&mut self, data: &[u8]) {
        let data = &data[data.len().saturating_sub(TAIL)..];
        let excess = (self.ring.len() + data.len()).saturating_sub(TAIL);
        self.ring.drain(..excess);
        self.ring.extend(data);
    }

    /// The bytes kept, in one piece.
    fn bytes(&mut self) -> &[u8] {
        self.ring.make_contiguous()
    }
}

/// The tokens an answer reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Tokens {
    prompt: Option<u64>,
    completion: Option<u64>,
    /// Of the prompt, taken from the engine's cache.
    cached: Option<u64>,
    /// llama-server's `timings.prompt_ms`.
    prefill: Option<std::time::Duration>,
    /// llama-server's `timings.prompt_n`.
    processed: Option<u64>,
}

/// OpenAI's `usage` (Chat Completions, Completions, Embeddings) or the Responses API's.
#[derive(Debug, Deserialize)]
struct Usage {
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// Anthropic's: the cached part, not counted in `input_tokens`.
    cache_read_input_tokens: Option<u64>,
    /// Read leniently (any shape): a member the gateway does not need must not lose the rest.
    prompt_tokens_details: Option<serde_json::Value>,
    input_tokens_details: Option<serde_json::Value>,
}

/// llama-server's `timings`.
#[derive(Debug, Default, Deserialize)]
struct Timings {
    cache_n: Option<u64>,
    prompt_n: Option<u64>,
    prompt_ms: Option<f64>,
}

/// `cached_tokens` of a usage details object.
fn cached_in(details: Option<&serde_json::Value>) -> Option<u64> {
    details?.get("cached_tokens")?.as_u64()
}

/// llama-server's `timings`, the last in `tail`.
fn timings(tail: &[u8]) -> Option<Timings> {
    let after = last_member(tail, &TIMINGS)?;
    let mut values = serde_json::Deserializer::from_slice(after).into_iter::<Timings>();
    values.next()?.ok()
}

/// The usage reported at the end of an answer (see the [module docs](self)).
fn usage(tail: &[u8]) -> Option<Tokens> {
    if let Some(after) = last_member(tail, &USAGE) {
        let mut values = serde_json::Deserializer::from_slice(after).into_iter::<Option<Usage>>();
        let usage = values.next()?.ok()??;
        let anthropic = usage.cache_read_input_tokens;
        let timings = timings(tail).unwrap_or_default();
        let cached = cached_in(usage.prompt_tokens_details.as_ref())
            .or_else(|| cached_in(usage.input_tokens_details.as_ref()))
            .or(anthropic)
            .or(timings.cache_n);
        let prompt = usage
            .prompt_tokens
            .or(match (usage.input_tokens, anthropic) {
                (Some(input), Some(read)) => Some(input.saturating_add(read)),
                (input, _) => input,
            });
        let tokens = Tokens {
            prompt,
            completion: usage.completion_tokens.or(usage.output_tokens),
            cached,
            prefill: timings
                .prompt_ms
                .filter(|ms| ms.is_finite() && *ms >= 0.0 && *ms < 3.6e6)
                .map(|ms| std::time::Duration::from_secs_f64(ms / 1000.0)),
            processed: timings.prompt_n,
        };
        return (tokens != Tokens::default()).then_some(tokens);
    }
    let number = |name: &Key| {
        let after = last_member(tail, name)?;
        let mut values = serde_json::Deserializer::from_slice(after).into_iter::<u64>();
        values.next()?.ok()
    };
    let tokens = Tokens {
        prompt: number(&PROMPT_EVAL_COUNT),
        completion: number(&EVAL_COUNT),
        cached: None,
        prefill: None,
        processed: None,
    };
    (tokens != Tokens::default()).then_some(tokens)
}

/// A member name the meter looks for, quotes included, with its searcher built once.
struct Key(LazyLock<Finder<'static>>);

/// The [`Key`] of member `name`: `key!("usage")` searches for `"usage"`.
macro_rules! key {
    ($name:literal) => {
        Key(LazyLock::new(|| {
            Finder::new(concat!("\"", $name, "\"").as_bytes())
        }))
    };
}

static USAGE: Key = key!("usage");
static TIMINGS: Key = key!("timings");
static PROMPT_EVAL_COUNT: Key = key!("prompt_eval_count");
static EVAL_COUNT: Key = key!("eval_count");

/// What follows the last member named `key` in `text`, after its `:`; a match inside a JSON
/// string (its quote escaped) does not count.
///
/// Searched forwards, every match kept until a later one replaces it: `memchr`'s forward search
/// skips ahead with a SIMD prefilter, where its reverse search (and a byte-by-byte scan from the
/// end, as before) looks at every byte; a tail without the member (a stream without usage, any
/// answer but llama-server's for `timings`) is searched whole. Measured with callgrind on a 4 KiB
/// tail lacking both `"timings"` and `"usage"`: 66,352 instructions byte by byte from the end,
/// 17,059 with `memmem::rfind`, 4,118 this way.
fn last_member<'t>(text: &'t [u8], key: &Key) -> Option<&'t [u8]> {
    let finder = &*key.0;
    let width = finder.needle().len();
    let (mut from, mut last) = (0, None);
    while let Some(found) = finder.find(&text[from..]) {
        let at = from + found;
        let escaped = at > 0 && text[at - 1] == b'\\';
        if !escaped && let Some(value) = text[at + width..].trim_ascii_start().strip_prefix(b":") {
            last = Some(value);
        }
        // One byte on, not past the match: names that begin and end with `"` may overlap.
        from = at + 1;
    }
    last
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue, header};

    use super::{FirstToken, TAIL, TIMINGS, Tail, Tokens, USAGE, is_sse, last_member, usage};

    #[test]
    fn an_sse_answer_is_told_by_its_media_type_alone() {
        let sse = |value: &[u8]| {
            let mut headers = HeaderMap::new();
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_bytes(value).unwrap(),
            );
            is_sse(&headers)
        };
        for yes in [
            &b"text/event-stream"[..],
            b"Text/Event-Stream; charset=utf-8",
            b"  text/event-stream  ;x=y",
            b"text/event-stream;",
        ] {
            assert!(sse(yes), "{}", String::from_utf8_lossy(yes));
        }
        for no in [
            &b"text/event-streams"[..],
            b"text/event",
            b"application/json",
            b"text/event-stream , text/plain",
            b"",
        ] {
            assert!(!sse(no), "{}", String::from_utf8_lossy(no));
        }
        assert!(!is_sse(&HeaderMap::new()), "no content type");
    }

    #[test]
    fn the_first_token_of_a_stream_is_its_first_data_line() {
        let mut first = FirstToken::new(true);
        assert!(!first.see(b": keepalive\n\n"));
        assert!(!first.see(b"event: response.created\n"));
        // `data:` split over two frames.
        assert!(!first.see(b"da"));
        assert!(first.see(b"ta: {}\n\n"));
        assert!(!first.see(b"data: {}\n\n"), "only the first counts");

        let mut first = FirstToken::new(true);
        assert!(!first.see(b": the data: is not here\n"));
        assert!(first.see(b"\r\ndata:{}"));

        let mut first = FirstToken::new(false);
        assert!(!first.see(b""));
        assert!(first.see(b"{"));
    }

    #[test]
    fn usage_is_read_from_the_last_event_or_the_end_of_a_document() {
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\": {\\\"prompt_tokens\\\": 99}\"}}]}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":34,\"total_tokens\":46}}\n\n\
            data: [DONE]\n\n";
        assert_eq!(
            usage(stream),
            Some(Tokens {
                prompt: Some(12),
                completion: Some(34),
                cached: None,
                prefill: None,
                processed: None
            })
        );
        // The text mentions usage, escaped, and the stream has none of its own.
        let quoted = b"data: {\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\": {\\\"prompt_tokens\\\": 99}\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(usage(quoted), None);
        assert_eq!(usage(b"{\"usage\": null}"), None);
        let embeddings = b"{\"data\":[],\"usage\":{\"prompt_tokens\":8,\"total_tokens\":8}}";
        assert_eq!(
            usage(embeddings),
            Some(Tokens {
                prompt: Some(8),
                completion: None,
                cached: None,
                prefill: None,
                processed: None
            })
        );
        let responses = b"event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":5,\"output_tokens\":7}}}\n\n";
        assert_eq!(
            usage(responses),
            Some(Tokens {
                prompt: Some(5),
                completion: Some(7),
                cached: None,
                prefill: None,
                processed: None
            })
        );
        let ollama = b"{\"done\":true,\"prompt_eval_count\":26,\"eval_count\":298}\n";
        assert_eq!(
            usage(ollama),
            Some(Tokens {
                prompt: Some(26),
                completion: Some(298),
                cached: None,
                prefill: None,
                processed: None
            })
        );
        assert_eq!(usage(b"{\"choices\":[]}"), None);
        assert_eq!(usage(b"\"usage\":{\"prompt_tok"), None);
    }

    #[test]
    fn cached_prompt_tokens_are_read_from_every_engine_shape() {
        let cached = |text: &[u8]| usage(text).and_then(|tokens| tokens.cached);
        // OpenAI, vLLM, llama-server.
        let chat = br#"{"usage":{"prompt_tokens":100,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":80}}}"#;
        assert_eq!(cached(chat), Some(80));
        // The Responses API.
        let responses = br#"data: {"response":{"usage":{"input_tokens":9,"input_tokens_details":{"cached_tokens":4}}}}"#;
        assert_eq!(cached(responses), Some(4));
        // Anthropic's Messages API: the prompt is the sum.
        let messages =
            br#"{"usage":{"input_tokens":20,"cache_read_input_tokens":70,"output_tokens":3}}"#;
        assert_eq!(usage(messages).unwrap().prompt, Some(90));
        assert_eq!(cached(messages), Some(70));
        // llama-server's timings, after the usage.
        let llama = br#"{"usage":{"prompt_tokens":50,"completion_tokens":2},"timings":{"cache_n":42,"prompt_n":8,"prompt_ms":12.5}}"#;
        assert_eq!(cached(llama), Some(42));
        let tokens = usage(llama).unwrap();
        assert_eq!(tokens.processed, Some(8));
        assert_eq!(
            tokens.prefill,
            Some(std::time::Duration::from_micros(12_500))
        );
        // Absent, or a details member of an odd shape: no figure, and the rest still read.
        let odd = br#"{"usage":{"prompt_tokens":7,"prompt_tokens_details":"n/a"}}"#;
        assert_eq!(usage(odd).unwrap().prompt, Some(7));
        assert_eq!(cached(odd), None);
        assert_eq!(cached(br#"{"done":true,"prompt_eval_count":26}"#), None);
    }

    #[test]
    fn the_tail_keeps_the_last_bytes_only() {
        let mut tail = Tail::default();
        tail.push(b"start");
        assert_eq!(tail.bytes(), b"start");
        for i in 0..100_u8 {
            tail.push(&[b'a' + i % 26; 1000]);
        }
        tail.push(b"end");
        let bytes = tail.bytes().to_vec();
        assert_eq!(bytes.len(), TAIL);
        assert!(bytes.ends_with(b"vvvend"), "{:?}", &bytes[TAIL - 8..]);
        // A frame larger than the tail leaves only its own end.
        let mut big = vec![b'x'; 3 * TAIL];
        big.extend_from_slice(b"usage");
        tail.push(&big);
        assert_eq!(tail.bytes().len(), TAIL);
        assert!(tail.bytes().ends_with(b"xusage"));
        assert!(tail.ring.capacity() < 2 * TAIL, "{}", tail.ring.capacity());
    }

    /// The search as it was (byte by byte from the end), kept as the reference: the forward
    /// search with `memchr` must find the same member in any text.
    fn last_member_from_the_end<'t>(text: &'t [u8], key: &[u8]) -> Option<&'t [u8]> {
        let mut end = text.len();
        loop {
            let at = text[..end].windows(key.len()).rposition(|w| w == key)?;
            let escaped = at > 0 && text[at - 1] == b'\\';
            match text[at + key.len()..].trim_ascii_start().strip_prefix(b":") {
                Some(value) if !escaped => return Some(value),
                _ => end = at + key.len() - 1,
            }
        }
    }

    proptest::proptest! {
        /// Texts made of the pieces that can fool a search: the name, its quote escaped, names
        /// that overlap (`"usage"usage"`), a name without its `:`, blanks before the `:`.
        #[test]
        fn the_forward_search_finds_what_the_search_from_the_end_found(
            pieces in proptest::collection::vec(
                proptest::sample::select(vec![
                    "\"usage\"", "usage\"", "\\\"usage\"", ":", " ", "\\", "\"", "{", "}", "1",
                    "\"timings\"", "x",
                ]),
                0..24,
            )
        ) {
            let text = pieces.concat();
            for (key, name) in [(&USAGE, &b"\"usage\""[..]), (&TIMINGS, b"\"timings\"")] {
                proptest::prop_assert_eq!(
                    last_member(text.as_bytes(), key),
                    last_member_from_the_end(text.as_bytes(), name),
                    "{}", text
                );
            }
        }
    }
}
