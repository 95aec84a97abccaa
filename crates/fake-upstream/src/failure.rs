//! Failure injection: the ways a real inference server lets its clients down, written the same way
//! in [`FakeConfig::failures`](crate::FakeConfig::failures), in the `x-fake-fail` header and on the
//! command line (`status-500`, `hang`, `die-after-chunks=3`, `reset-before-head`, ...).
//!
//! They cover the rows of a fault matrix: an engine that answers an error status, never answers
//! (`hang`), stalls mid-stream with the connection open (`stall-after-chunks`), dies mid-stream
//! without the last chunk (`die-after-chunks`) or with a TCP reset (`reset-after-chunks`,
//! `reset-before-head`; mid-event: `die-mid-event`), speaks something that is not HTTP
//! (`garbage`), reports an error inside
//! the stream (`error-after-chunks`), or is slow to its head (`slow-first-byte-ms`) or to its
//! first token after the head (`first-token-delay-ms`).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

/// One injected failure. Every failure except [`Failure::SlowFirstByte`] applies once the request
/// holds a slot, so it counts in the observer's in-flight numbers the way a real stuck or crashing
/// request would.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Failure {
    /// `status-<code>`: answer at once with this HTTP status and the kind's own error envelope.
    Status(u16),
    /// `hang`: take a slot and never answer; the request ends only when the client goes away.
    Hang,
    /// `die-after-chunks=N`: send N SSE events, then abort the connection with no terminating
    /// chunk (HTTP/1.1) or reset the stream (HTTP/2). A non-streaming request sends its headers
    /// and half of its JSON body before the abort.
    DieAfterChunks(u32),
    /// `error-after-chunks=N`: send N SSE events, then the kind's in-stream error event, ended the
    /// kind's way (llama-server: no `[DONE]`; vLLM: `[DONE]` follows). A non-streaming request
    /// gets the kind's 500 after its generation time.
    ErrorAfterChunks(u32),
    /// `slow-first-byte-ms=N`: wait this long after the slot is granted before the response
    /// headers (and, for a stream, the first event) go out.
    SlowFirstByte(Duration),
    /// `stall-after-chunks=N`: send the head and N SSE events (NDJSON lines for Ollama's native
    /// API), then nothing more, holding the slot and the connection open until the client goes
    /// away: a hung generation, or a host gone without a FIN. A non-streaming request sends its
    /// head and no body.
    StallAfterChunks(u32),
    /// `reset-after-chunks=N`: send N events, then close the connection with a TCP reset
    /// (`SO_LINGER` 0, then close). A non-streaming request sends its head and half its body
    /// first. On HTTP/2 this resets the whole connection, every stream on it.
    ResetAfterChunks(u32),
    /// `reset-before-head`: take the slot, then reset the connection before any byte of the
    /// response: a crash between accepting a request and answering it.
    ResetBeforeHead,
    /// `garbage`: take the slot, then write bytes that are not HTTP ([`GARBAGE`]) instead of a
    /// response and close the connection: a wrong service on the port.
    Garbage,
    /// `first-token-delay-ms=N`: for a stream, send the head at once and wait this long before
    /// the first event (prefill: the engine has answered but not yet produced a token). A
    /// non-streaming request answers this much later.
    FirstTokenDelay(Duration),
    /// `die-mid-event=N`: send N SSE events and the first half of the next one, then abort the
    /// connection as [`Failure::DieAfterChunks`] does: an engine cut in the middle of an event.
    /// A non-streaming request is cut half-way, as with `die-after-chunks`.
    DieMidEvent(u32),
}

/// What [`Failure::Garbage`] writes instead of a response: an SSH banner, as when a port
/// mapping points at the wrong service.
pub const GARBAGE: &[u8] = b"SSH-2.0-OpenSSH_9.6p1 fake-upstream\r\n\x00\x01\x02\xff not http\r\n";

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Status(code) => write!(f, "status-{code}"),
            Self::Hang => f.write_str("hang"),
            Self::DieAfterChunks(n) => write!(f, "die-after-chunks={n}"),
            Self::ErrorAfterChunks(n) => write!(f, "error-after-chunks={n}"),
            Self::SlowFirstByte(d) => write!(f, "slow-first-byte-ms={}", d.as_millis()),
            Self::StallAfterChunks(n) => write!(f, "stall-after-chunks={n}"),
            Self::ResetAfterChunks(n) => write!(f, "reset-after-chunks={n}"),
            Self::ResetBeforeHead => f.write_str("reset-before-head"),
            Self::Garbage => f.write_str("garbage"),
            Self::FirstTokenDelay(d) => write!(f, "first-token-delay-ms={}", d.as_millis()),
            Self::DieMidEvent(n) => write!(f, "die-mid-event={n}"),
        }
    }
}

/// The error for a failure spec that does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "bad failure spec {0:?} (expected status-<code>, hang, die-after-chunks=<n>, \
     error-after-chunks=<n>, slow-first-byte-ms=<n>, stall-after-chunks=<n>, \
     reset-after-chunks=<n>, reset-before-head, garbage, first-token-delay-ms=<n>, \
     die-mid-event=<n> or none)"
)]
pub struct BadFailureSpec(String);

impl FromStr for Failure {
    type Err = BadFailureSpec;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadFailureSpec(s.to_owned());
        let spec = s.trim();
        match spec {
            "hang" => return Ok(Self::Hang),
            "reset-before-head" => return Ok(Self::ResetBeforeHead),
            "garbage" => return Ok(Self::Garbage),
            _ => {}
        }
        if let Some(code) = spec.strip_prefix("status-") {
            let code: u16 = code.parse().map_err(|_| bad())?;
            // Only statuses hyper can put on the wire.
            return if (100..=999).contains(&code) {
                Ok(Self::Status(code))
            } else {
                Err(bad())
            };
        }
        let (name, value) = spec.split_once('=').ok_or_else(bad)?;
        let n: u32 = value.trim().parse().map_err(|_| bad())?;
        match name.trim() {
            "die-after-chunks" => Ok(Self::DieAfterChunks(n)),
            "error-after-chunks" => Ok(Self::ErrorAfterChunks(n)),
            "slow-first-byte-ms" => Ok(Self::SlowFirstByte(Duration::from_millis(n.into()))),
            "stall-after-chunks" => Ok(Self::StallAfterChunks(n)),
            "reset-after-chunks" => Ok(Self::ResetAfterChunks(n)),
            "first-token-delay-ms" => Ok(Self::FirstTokenDelay(Duration::from_millis(n.into()))),
            "die-mid-event" => Ok(Self::DieMidEvent(n)),
            _ => Err(bad()),
        }
    }
}

/// Parses a comma-separated list of failures; `none` (or an empty string) is the empty list, so a
/// request can switch a server-wide failure off for itself.
pub fn parse_failures(list: &str) -> Result<Vec<Failure>, BadFailureSpec> {
    list.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty() && *s != "none")
        .map(str::parse)
        .collect()
}

/// What the failures of one request amount to, in the order the request meets them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct FailurePlan {
    pub(crate) slow_first_byte: Option<Duration>,
    pub(crate) status: Option<u16>,
    pub(crate) hang: bool,
    pub(crate) die_after: Option<u32>,
    pub(crate) error_after: Option<u32>,
    pub(crate) stall_after: Option<u32>,
    pub(crate) reset_after: Option<u32>,
    pub(crate) reset_before_head: bool,
    pub(crate) garbage: bool,
    pub(crate) first_token_delay: Option<Duration>,
    pub(crate) die_mid_event: Option<u32>,
}

impl FailurePlan {
    /// Folds a list into a plan. When a list names one kind of failure twice, the last wins.
    pub(crate) fn from_list(failures: &[Failure]) -> Self {
        let mut plan = Self::default();
        for failure in failures {
            match *failure {
                Failure::Status(code) => plan.status = Some(code),
                Failure::Hang => plan.hang = true,
                Failure::DieAfterChunks(n) => plan.die_after = Some(n),
                Failure::ErrorAfterChunks(n) => plan.error_after = Some(n),
                Failure::SlowFirstByte(d) => plan.slow_first_byte = Some(d),
                Failure::StallAfterChunks(n) => plan.stall_after = Some(n),
                Failure::ResetAfterChunks(n) => plan.reset_after = Some(n),
                Failure::ResetBeforeHead => plan.reset_before_head = true,
                Failure::Garbage => plan.garbage = true,
                Failure::FirstTokenDelay(d) => plan.first_token_delay = Some(d),
                Failure::DieMidEvent(n) => plan.die_mid_event = Some(n),
            }
        }
        plan
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_spec_round_trips() {
        let all = [
            Failure::Status(500),
            Failure::Status(503),
            Failure::Hang,
            Failure::DieAfterChunks(3),
            Failure::ErrorAfterChunks(0),
            Failure::SlowFirstByte(Duration::from_millis(250)),
            Failure::StallAfterChunks(2),
            Failure::ResetAfterChunks(1),
            Failure::ResetBeforeHead,
            Failure::Garbage,
            Failure::FirstTokenDelay(Duration::from_millis(500)),
            Failure::DieMidEvent(2),
        ];
        for failure in all {
            assert_eq!(failure.to_string().parse::<Failure>(), Ok(failure));
        }
    }

    #[test]
    fn lists_parse() {
        assert_eq!(
            parse_failures(" slow-first-byte-ms=10 , die-after-chunks=2"),
            Ok(vec![
                Failure::SlowFirstByte(Duration::from_millis(10)),
                Failure::DieAfterChunks(2)
            ])
        );
        assert_eq!(parse_failures("none"), Ok(vec![]));
        assert_eq!(parse_failures(""), Ok(vec![]));
    }

    #[test]
    fn garbage_is_rejected() {
        for bad in [
            "status-",
            "status-abc",
            "status-42",
            "die-after-chunks",
            "die-after-chunks=x",
            "explode",
            "hang=1",
            "garbage=1",
            "stall-after-chunks=-1",
        ] {
            assert!(bad.parse::<Failure>().is_err(), "{bad} parsed");
        }
    }

    #[test]
    fn plan_folds_the_list() {
        let plan = FailurePlan::from_list(&[Failure::Status(500), Failure::Status(502)]);
        assert_eq!(plan.status, Some(502));
        assert!(!plan.hang);
    }
}
