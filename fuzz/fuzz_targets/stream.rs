//! Fuzz target: an upstream's answer as it streams through the gateway, on arbitrary bytes
//! split into arbitrary frames.
//!
//! The gateway passes SSE and NDJSON answers through frame for frame and parses neither; what
//! it does look at is the start of each answer, for the response id its affinity records
//! (`proxy/affinity.rs`, any frame boundaries), and what it adds is one last SSE event when an
//! answer is cut (`proxy/body.rs`). Both run here, in the gateway's own wrappers in the
//! gateway's order.
//!
//! Input layout: one flag byte (bit 0: the upstream's body fails after the last frame; bit 1:
//! the answer is `text/event-stream`), then the frames, separated by `0xFF` (a byte that UTF-8
//! text, and so SSE and NDJSON, never holds).
//!
//! What must hold:
//!
//! - every frame reaches the client unchanged and in order, one for one;
//! - a clean answer ends cleanly; a cut SSE answer ends with exactly one more frame, a `data:`
//!   event holding a JSON problem document with an OpenAI `error` object, and then a clean end;
//!   a cut answer of any other type ends with an error (it cannot carry a late event);
//! - the id recorded does not depend on where the frames were split: the same bytes in one
//!   frame record the same id.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotgate_gateway::fuzzing;

/// Names that need escaping in JSON, so the last event's document is tested with escapes.
const UPSTREAM: &str = "gpu \"a\"\\\n";
const MODEL: &str = "m\u{2028}\t</script>";

fuzz_target!(|data: &[u8]| {
    let Some((&flags, rest)) = data.split_first() else {
        return;
    };
    let cut = flags & 1 == 1;
    let sse = flags & 2 == 2;
    let chunks: Vec<&[u8]> = rest.split(|&b| b == 0xFF).collect();
    let out = fuzzing::stream(&chunks, cut, sse, UPSTREAM, MODEL);

    let passed = chunks.len();
    assert!(
        out.frames.len() >= passed,
        "{} frames in, {} out",
        passed,
        out.frames.len()
    );
    for (i, (sent, got)) in chunks.iter().zip(&out.frames).enumerate() {
        assert_eq!(*sent, &got[..], "frame {i} changed on the way");
    }
    let extra = &out.frames[passed..];
    match (cut, sse) {
        (false, _) => {
            assert!(!out.failed, "a clean answer ended with an error");
            assert!(extra.is_empty(), "frames added to a clean answer");
        }
        (true, true) => {
            assert!(
                !out.failed,
                "a cut SSE answer did not end cleanly after its event"
            );
            let [event] = extra else {
                panic!("a cut SSE answer got {} more frames, not one", extra.len());
            };
            last_event(event);
        }
        (true, false) => {
            assert!(
                out.failed,
                "a cut answer that cannot carry an event was not cut"
            );
            assert!(extra.is_empty(), "frames added to a cut non-SSE answer");
        }
    }

    let whole = chunks.concat();
    let at_once = fuzzing::stream(&[&whole], false, sse, UPSTREAM, MODEL);
    assert_eq!(
        out.recorded, at_once.recorded,
        "the recorded id depends on where the frames were split"
    );
    if let Some(id) = &out.recorded {
        assert!(!id.is_empty(), "an empty id was recorded");
    }
});

/// `data: {problem}\n\n`, the problem with an OpenAI `error` object.
fn last_event(event: &[u8]) {
    let json = event
        .strip_prefix(b"data: ")
        .and_then(|rest| rest.strip_suffix(b"\n\n"))
        .unwrap_or_else(|| {
            panic!(
                "not one SSE data event: {:?}",
                String::from_utf8_lossy(event)
            )
        });
    assert!(
        !json.contains(&b'\n'),
        "the event's data spans lines, so SSE would split it"
    );
    let problem: serde_json::Value = serde_json::from_slice(json)
        .unwrap_or_else(|error| panic!("the last event is not JSON ({error})"));
    assert!(
        problem
            .get("error")
            .is_some_and(serde_json::Value::is_object),
        "the last event has no OpenAI error object: {problem}"
    );
}
