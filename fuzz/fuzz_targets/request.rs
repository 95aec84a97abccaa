//! Fuzz target: the gateway's request reader (`Content-Type` check, length limit, `model` and
//! `stream` found in the body without re-serialising it) on arbitrary bytes.
//!
//! Input layout: one flag byte, then the `Content-Type` value up to the first `\n`, then the body.
//! The flag byte says whether a `Content-Length` header is sent (as hyper would for a
//! length-delimited body), picks the body limit (small, so the 413 paths are reached, or the
//! default 1 MiB), can leave the `Content-Type` header out, and picks the route: one of each
//! way a route reads its body (`model` required, `model` optional, `stream` true by default,
//! weighed by `n`/`best_of`, a `multipart/form-data` upload).
//!
//! What must hold:
//!
//! - a refusal is a 4xx problem document (400, 413 or 415) whose body is valid JSON: never a
//!   panic, never a 5xx for what the client sent;
//! - an accepted request names a non-empty model (or none, only where the route allows that),
//!   takes at least one slot, and its body is exactly the bytes sent;
//! - `body_for` with the client's own name gives those bytes back unchanged;
//! - on a JSON route, `body_for` with another name (one that needs escaping) gives a body that
//!   reads back with that name, the same `stream` and the same weight, and only the `model` value
//!   changed: the bytes before and after it are the client's.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotgate_gateway::fuzzing::{self, ReadOutcome};

/// The default `server.max_body_bytes`.
const DEFAULT_LIMIT: usize = 1024 * 1024;
/// Small enough that mutated bodies cross it.
const SMALL_LIMIT: usize = 64;
/// The routes tried, one of each way of reading a body; the flag byte's bits 3–5 pick one.
const ROUTES: [&str; 6] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/api/chat",
    "/completion",
    "/v1/audio/transcriptions",
    "/v1/embeddings",
];
/// The upload route: its model is a form field, so the JSON rename check does not apply.
const UPLOAD: &str = "/v1/audio/transcriptions";
/// Routes where the body may leave `model` out.
const MODEL_OPTIONAL: &str = "/completion";
/// A replacement name with characters JSON must escape, so the splice is tested with escapes.
const RENAMED: &str = "fuzz/\"renamed\"\\model\u{2028}\n";

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let (content_type, body) = match rest.iter().position(|&b| b == b'\n') {
        Some(end) => (&rest[..end], &rest[end + 1..]),
        None => (rest, &[][..]),
    };
    let declare_length = flags & 1 == 1;
    let limit = if flags & 2 == 2 {
        SMALL_LIMIT
    } else {
        DEFAULT_LIMIT
    };
    let content_type = (flags & 4 == 0).then_some(content_type);
    let route = ROUTES[usize::from(flags >> 3) % ROUTES.len()];
    // `None`: the header value is one hyper would refuse before the gateway saw the request.
    let Some(outcome) = fuzzing::read_request(route, content_type, body, declare_length, limit)
    else {
        return;
    };
    match outcome {
        ReadOutcome::Refused { status, problem } => {
            assert!(
                matches!(status, 400 | 413 | 415),
                "a refusal of client input with status {status}"
            );
            if let Err(error) = serde_json::from_slice::<serde_json::Value>(&problem) {
                panic!("the {status} problem document is not JSON ({error}): {problem:?}");
            }
        }
        ReadOutcome::Read(request) => {
            match request.model() {
                Some(model) => assert!(!model.is_empty(), "an empty model was accepted"),
                None => assert_eq!(
                    route, MODEL_OPTIONAL,
                    "{route} accepted a body without model"
                ),
            }
            assert!(request.sequences() >= 1, "a request that takes no slot");
            assert_eq!(request.body(), body, "the body was changed while reading");
            assert_eq!(
                // Without a model there is nothing to rename: any name gives the body back.
                request.body_for(request.model().unwrap_or(RENAMED)),
                body,
                "body_for with the client's own name changed the body"
            );
            if route != UPLOAD && request.model().is_some() {
                renamed(route, &request, body);
            }
        }
    }
});

/// The body sent to an upstream that calls the model something else.
fn renamed(route: &str, request: &fuzzing::Request, original: &[u8]) {
    let rewritten = request.body_for(RENAMED);
    let again = match fuzzing::read_request(
        route,
        Some(b"application/json"),
        &rewritten,
        true,
        usize::MAX,
    ) {
        Some(ReadOutcome::Read(again)) => again,
        Some(ReadOutcome::Refused { status, problem }) => panic!(
            "the rewritten body is refused ({status} {problem:?}): {:?}",
            String::from_utf8_lossy(&rewritten)
        ),
        None => unreachable!("application/json is a valid header value"),
    };
    assert_eq!(
        again.model(),
        Some(RENAMED),
        "the rewritten body names another model"
    );
    assert_eq!(
        again.stream(),
        request.stream(),
        "the rewrite changed `stream`"
    );
    assert_eq!(
        again.sequences(),
        request.sequences(),
        "the rewrite changed the weight"
    );
    // Only the model's value moved: the shared prefix and suffix are the client's bytes.
    let span = request.model_span();
    assert_eq!(&rewritten[..span.start], &original[..span.start]);
    assert_eq!(
        &rewritten[rewritten.len() - (original.len() - span.end)..],
        &original[span.end..]
    );
}
