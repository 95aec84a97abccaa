//! Whole SSE events: what of an answer may go to the client now, so that an answer that breaks
//! off never leaves the client half an event.
//!
//! The last event a failed stream gets ([`SlotBody`](super::SlotBody)) must reach the client's
//! parser as an event of its own. Were the engine cut in the middle of one (`…"content":"hal`),
//! the error written after it would be glued to the half event, one event of invalid JSON, and
//! an SDK would raise a decode error instead of the problem. So an SSE answer goes out up to its
//! last *event boundary* (a blank line: `\n\n`, `\r\n\r\n`, `\r\r`) and the bytes after it are
//! held until the rest of their event comes; when the answer fails, the held part of an event
//! is dropped, and the error event follows a boundary.
//!
//! Engines write one whole event at a time, so in practice nothing is held: a frame that ends
//! at a boundary goes on as it came (no copy). Only an event split across frames (a large one,
//! or a read that fell mid-write) waits for its end, and is then joined into one frame. An
//! answer that ends cleanly gets whatever is held, as it came. An "event" longer than
//! [`MAX_HELD`] is let through unbroken rather than held: a stream labelled SSE that is not
//! made of events is still passed through.
//!
//! An NDJSON answer (Ollama's streams) is held the same way at line ends (`\n`), so that its
//! last `{"error": …}` line is a line of its own.

use bytes::{Bytes, BytesMut};
use slotgate_problem::Framing;

/// The most bytes of one unfinished event held back; past it they go on as they are. A
/// chat chunk is a few hundred bytes; a Responses event that repeats the whole answer
/// (`response.completed`) stays far below this for any answer an engine generates in one go.
pub(crate) const MAX_HELD: usize = 1024 * 1024;

/// The unfinished event of an SSE answer (or line of an NDJSON one), held until its end comes.
#[derive(Debug, Default)]
pub(crate) struct Events {
    held: BytesMut,
    /// NDJSON: a message ends at each `\n`, not at a blank line.
    lines: bool,
}

impl Events {
    /// Whole messages of an answer in `framing`.
    pub(crate) fn new(framing: Framing) -> Self {
        Self {
            held: BytesMut::new(),
            lines: framing == Framing::Ndjson,
        }
    }

    /// Where the last whole message of `data` ends (past `after`).
    fn boundary(&self, data: &[u8], after: usize) -> usize {
        if self.lines {
            data[after..]
                .iter()
                .rposition(|&b| b == b'\n')
                .map_or(0, |i| after + i + 1)
        } else {
            last_boundary(data, after)
        }
    }

    /// What of `data` (after what is held) may go on now: everything up to the last event
    /// boundary. The rest is held. May be empty.
    pub(crate) fn whole(&mut self, mut data: Bytes) -> Bytes {
        if self.held.is_empty() {
            let end = self.boundary(&data, 0);
            if data.len() - end > MAX_HELD {
                return data;
            }
            self.held.extend_from_slice(&data[end..]);
            data.truncate(end);
            return data;
        }
        // What is held has no boundary: only one that ends in `data` can be new.
        let before = self.held.len();
        self.held.extend_from_slice(&data);
        let end = self.boundary(&self.held, before);
        if self.held.len() - end > MAX_HELD {
            return self.held.split().freeze();
        }
        self.held.split_to(end).freeze()
    }

    /// Everything held, at a clean end of the answer.
    pub(crate) fn rest(&mut self) -> Bytes {
        self.held.split().freeze()
    }

    /// Drops the held part of an event when the answer fails; returns its length.
    pub(crate) fn drop_partial(&mut self) -> usize {
        let dropped = self.held.len();
        self.held.clear();
        dropped
    }
}

/// Where the last event of `data` ends: just after its last blank line (`\n\n`, `\r\n\r\n`,
/// or `\r\r`, and the mixed forms) that ends past `after`; 0 when there is none. A lone `\r`
/// at the very end may still be followed by a `\n`: the boundary after a `\r\r` there is taken
/// as is, which splits nothing a parser reads differently.
fn last_boundary(data: &[u8], after: usize) -> usize {
    // From the end: the common frame ends exactly at a boundary, found at once.
    let mut i = data.len();
    while i > after && i >= 2 {
        let (before, last) = (data[i - 2], data[i - 1]);
        let blank = match last {
            b'\n' => before == b'\n' || (before == b'\r' && i >= 3 && data[i - 3] == b'\n'),
            b'\r' => before == b'\r' || before == b'\n',
            _ => false,
        };
        if blank {
            return i;
        }
        i -= 1;
    }
    0
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::{Events, MAX_HELD, last_boundary};

    #[test]
    fn boundaries_of_every_line_ending() {
        assert_eq!(last_boundary(b"data: 1\n\n", 0), 9);
        assert_eq!(last_boundary(b"data: 1\r\n\r\n", 0), 11);
        assert_eq!(last_boundary(b"data: 1\r\r", 0), 9);
        assert_eq!(last_boundary(b"data: 1\n\ndata: 2\n", 0), 9);
        assert_eq!(last_boundary(b"data: 1\n\ndata: {\"content\":\"hal", 0), 9);
        assert_eq!(last_boundary(b"data: {\"content\":\"hal", 0), 0);
        assert_eq!(last_boundary(b"data: 1\n", 0), 0);
        assert_eq!(last_boundary(b"", 0), 0);
        assert_eq!(last_boundary(b"\n", 0), 0);
    }

    #[test]
    fn whole_events_pass_and_a_split_one_waits_for_its_end() {
        let mut events = Events::default();
        let frame = Bytes::from_static(b"data: 1\n\ndata: 2\n\n");
        let out = events.whole(frame.clone());
        assert_eq!(out, frame);
        assert_eq!(out.as_ptr(), frame.as_ptr(), "no copy");
        // A boundary split across frames is found too.
        assert_eq!(events.whole(Bytes::from_static(b"data: 4\n")), "");
        assert_eq!(events.whole(Bytes::from_static(b"\n")), "data: 4\n\n");

        assert_eq!(
            events.whole(Bytes::from_static(b"data: 3\n\ndata: {\"a\"")),
            "data: 3\n\n"
        );
        assert_eq!(events.whole(Bytes::from_static(b":1}\n")), "");
        assert_eq!(
            events.whole(Bytes::from_static(b"\n")),
            "data: {\"a\":1}\n\n"
        );
        assert_eq!(events.rest(), "");
    }

    #[test]
    fn a_failure_drops_the_half_event_and_a_clean_end_keeps_it() {
        let mut events = Events::default();
        assert_eq!(
            events.whole(Bytes::from_static(b"data: {\"content\":\"hal")),
            ""
        );
        assert_eq!(events.drop_partial(), 21);
        assert_eq!(events.rest(), "");

        assert_eq!(events.whole(Bytes::from_static(b"data: [DONE]")), "");
        assert_eq!(events.rest(), "data: [DONE]");
    }

    #[test]
    fn what_is_not_made_of_events_is_not_held_for_ever() {
        let mut events = Events::default();
        let big = Bytes::from(vec![b'x'; MAX_HELD + 1]);
        assert_eq!(events.whole(big).len(), MAX_HELD + 1);
        assert_eq!(events.rest(), "");
    }
}
