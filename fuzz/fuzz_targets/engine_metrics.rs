//! Fuzz target: the reader of an engine's Prometheus text exposition (`GET /metrics` on
//! llama-server and vLLM), as the gateway's probes decode it, on arbitrary bytes.
//!
//! What must hold, besides not panicking:
//!
//! - the gauges the gateway reads (`llamacpp:requests_processing`, `llamacpp:requests_deferred`,
//!   `vllm:num_requests_running`, `vllm:num_requests_waiting`) can be asked for whatever the
//!   text held, and a label filter only narrows a sum;
//! - lines stand alone: whatever garbage precedes it, a well-formed sample on its own line is
//!   read, and adds exactly its value to its series' sum. One bad line from an engine must not
//!   hide the next one.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotgate_gateway::fuzzing;

/// The series the gateway reads.
const GAUGES: &[&str] = &[
    "llamacpp:requests_processing",
    "llamacpp:requests_deferred",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
];

/// A series no engine sends, appended to check that lines are read independently.
const MARKER: &str = "slotgate_fuzz_marker";

fuzz_target!(|data: &[u8]| {
    let Ok(samples) = fuzzing::engine_metrics(data) else {
        // Not UTF-8: refused as a whole, which the probe reports as a parse error.
        assert!(std::str::from_utf8(data).is_err(), "UTF-8 text was refused");
        return;
    };
    for name in GAUGES {
        if samples.sum(name, &[("model_name", "m")]).is_some() {
            assert!(
                samples.sum(name, &[]).is_some(),
                "a filtered sum without an unfiltered one"
            );
        }
    }

    let mut text = data.to_vec();
    text.extend_from_slice(format!("\n{MARKER}{{probe=\"1\"}} 1\n").as_bytes());
    let Ok(with_marker) = fuzzing::engine_metrics(&text) else {
        panic!("appending an ASCII line made the text unreadable");
    };
    let before = samples.sum(MARKER, &[("probe", "1")]);
    let after = with_marker.sum(MARKER, &[("probe", "1")]);
    let expected = before.map_or(1.0, |sum| sum + 1.0);
    assert!(
        after
            .is_some_and(|after| after.to_bits() == expected.to_bits()
                || (after.is_nan() && expected.is_nan())),
        "a well-formed last line was not read on its own: {before:?} then {after:?}"
    );
});
