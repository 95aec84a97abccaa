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
//! - no byte changes on the way; an answer that is not SSE goes frame for frame, an SSE answer
//!   in whole events (an event split across frames is held until its end and joined,
//!   `proxy/body/events.rs`);
//! - a clean answer ends cleanly with every byte; a cut SSE answer gets its bytes up to its last
//!   event boundary (the half event after it is dropped), then exactly one more frame, a `data:`
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
    if sse {
        sse_answer(&chunks, cut, &out);
    } else {
        other_answer(&chunks, cut, &out);
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

/// An SSE answer goes out in whole events (`proxy/body/events.rs`): frames may be joined where
/// an event was split across them, but no byte changes; a clean end gets everything, a cut one
/// everything up to its last event boundary (the half event after it is dropped) and then
/// exactly one more frame, the error event.
fn sse_answer(chunks: &[&[u8]], cut: bool, out: &fuzzing::StreamOutcome) {
    let input = chunks.concat();
    assert!(!out.failed, "an SSE answer did not end cleanly");
    if !cut {
        assert_eq!(
            out.frames.concat(),
            input,
            "a clean SSE answer changed on the way"
        );
        return;
    }
    let Some((event, kept)) = out.frames.split_last() else {
        panic!("a cut SSE answer got no error event");
    };
    last_event(event);
    let kept = kept.concat();
    assert!(
        input.starts_with(&kept),
        "a cut SSE answer's events changed on the way"
    );
    assert!(
        kept.is_empty() || kept.ends_with(b"\n") || kept.ends_with(b"\r"),
        "the error event does not follow an event boundary"
    );
    let held = &input[kept.len()..];
    assert!(
        !held.windows(2).any(|pair| pair == b"\n\n"),
        "a whole event was dropped from a cut SSE answer"
    );
}

/// Any other answer is passed through frame for frame; a cut one ends with an error, as it
/// cannot carry a late event.
fn other_answer(chunks: &[&[u8]], cut: bool, out: &fuzzing::StreamOutcome) {
    assert_eq!(out.frames.len(), chunks.len(), "frames added or lost");
    for (i, (sent, got)) in chunks.iter().zip(&out.frames).enumerate() {
        assert_eq!(*sent, &got[..], "frame {i} changed on the way");
    }
    assert_eq!(
        out.failed, cut,
        "a cut answer must end with an error, a clean one must not"
    );
}

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
