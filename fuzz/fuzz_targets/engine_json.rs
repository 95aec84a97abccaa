//! Fuzz target: the readers of an engine's JSON answers, as the gateway's probes decode them,
//! on arbitrary bytes: llama-server's `/slots` and `/props`, the model listings (`/models`,
//! `/v1/models`), Ollama's `/api/ps`, and the error envelope every probe reads a failure's
//! message from.
//!
//! The first byte picks the answer; the rest is the body. What must hold, besides not panicking:
//!
//! - a body that is not JSON is refused (lenient about members, never about syntax). "JSON" is
//!   what serde_json accepts when it skips a whole document (`IgnoredAny`): in a member it skips
//!   it checks neither that strings are UTF-8 nor that numbers fit an `f64`, so an engine answer
//!   with such a member is read, and nothing of that member is kept. The targets found both
//!   (`corpus/engine_json/*-in-skipped-member`; unit tests in `upstreams::probe::tests`);
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
    if accepted.is_ok() {
        assert!(
            serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok(),
            "a body that is not JSON was accepted"
        );
    }
});
