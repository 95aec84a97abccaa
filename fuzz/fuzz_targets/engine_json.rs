//! Fuzz target: the readers of an engine's JSON answers, as the gateway's probes decode them,
//! on arbitrary bytes: llama-server's `/slots` and `/props`, the model listings (`/models`,
//! `/v1/models`), Ollama's `/api/ps`, and the error envelope every probe reads a failure's
//! message from.
//!
//! The first byte picks the answer; the rest is the body. What must hold, besides not panicking:
//!
//! - a body that is not JSON is refused (lenient about members, never about syntax), with one
//!   exception, serde_json's own: bytes that are not UTF-8 inside a string the reader skips (an
//!   unknown member) are not checked. Such a body is read; the members the gateway keeps are
//!   always valid UTF-8 (`corpus/engine_json/ollama-ps-bad-utf8-in-skipped-member`, and the
//!   unit test `upstreams::probe::tests::skipped_members_are_not_checked_for_utf8`);
//! - an error message taken from a body is non-empty and at most 200 characters, whatever the
//!   body's size (it goes into logs and the admin view).
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotgate_gateway::fuzzing;

/// Longest message the probes keep from an engine's error body.
const MAX_MESSAGE: usize = 200;

fuzz_target!(|data: &[u8]| {
    let Some((&which, body)) = data.split_first() else {
        return;
    };
    let accepted = match which % 5 {
        0 => fuzzing::engine_slots(body).map(drop),
        1 => fuzzing::engine_props(body).map(drop),
        2 => fuzzing::engine_models(body).map(|models| {
            for names in models {
                assert!(!names.is_empty(), "a model card without its id");
            }
        }),
        3 => fuzzing::ollama_ps(body).map(drop),
        _ => {
            if let Some(message) = fuzzing::engine_error_message(body) {
                assert!(!message.is_empty(), "an empty error message");
                assert!(
                    message.chars().count() <= MAX_MESSAGE,
                    "an error message of {} characters",
                    message.chars().count()
                );
            }
            return;
        }
    };
    // A body that is UTF-8 but not JSON must never be accepted (see above for the rest).
    if accepted.is_ok() && std::str::from_utf8(body).is_ok() {
        assert!(
            serde_json::from_slice::<serde_json::Value>(body).is_ok(),
            "a body that is not JSON was accepted"
        );
    }
});
