//! Server-sent events as the OpenAI-compatible servers frame them: `data: <json>\n\n` per event,
//! `data: [DONE]\n\n` at the end. The parser is public so tests of the fake (and of the gateway in
//! front of it) can read a stream back.

use bytes::Bytes;
use serde_json::Value;

/// The terminating event.
pub(crate) const DONE: &[u8] = b"data: [DONE]\n\n";

/// Frames one JSON event.
pub(crate) fn event(value: &Value) -> Bytes {
    let mut out = b"data: ".to_vec();
    // Serialising a `Value` cannot fail: its keys are strings.
    serde_json::to_writer(&mut out, value).expect("a Value always serialises");
    out.extend_from_slice(b"\n\n");
    Bytes::from(out)
}

/// One step of a streamed answer: its bytes, and whether it carries a token (and so waits the
/// generation interval before it) or goes out with the step before it.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    pub(crate) paced: bool,
    pub(crate) bytes: Bytes,
}

impl Step {
    /// A step that carries a token.
    pub(crate) fn token(bytes: Bytes) -> Self {
        Self { paced: true, bytes }
    }

    /// A step that goes out with the one before it.
    pub(crate) fn at_once(bytes: Bytes) -> Self {
        Self {
            paced: false,
            bytes,
        }
    }
}

/// One event read back from a stream.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum SseEvent {
    /// A `data:` event holding JSON (a chunk, a usage chunk, or an `{"error":...}`).
    Json(Value),
    /// `data: [DONE]`.
    Done,
    /// A `data:` event that is not JSON.
    Other(String),
}

impl SseEvent {
    /// The JSON of this event, if it is one.
    pub fn json(&self) -> Option<&Value> {
        match self {
            Self::Json(v) => Some(v),
            _ => None,
        }
    }

    /// True for an `{"error":...}` event.
    pub fn is_error(&self) -> bool {
        self.json().is_some_and(|v| v.get("error").is_some())
    }
}

/// Splits a (possibly partial) stream into its complete events. Comment lines (`:` pings) and
/// events without data are skipped; an unterminated last event is ignored.
pub fn parse_events(text: &str) -> Vec<SseEvent> {
    let text = text.replace("\r\n", "\n");
    let mut blocks: Vec<&str> = text.split("\n\n").collect();
    // Whatever follows the last blank line is not a complete event yet.
    blocks.pop();
    blocks
        .into_iter()
        .filter_map(|block| {
            let data: Vec<&str> = block
                .lines()
                .filter_map(|line| line.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                return None;
            }
            let data = data.join("\n");
            Some(if data == "[DONE]" {
                SseEvent::Done
            } else {
                serde_json::from_str(&data).map_or(SseEvent::Other(data), SseEvent::Json)
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn frames_and_parses_back() {
        let mut stream = String::new();
        stream.push_str(std::str::from_utf8(&event(&json!({"a": 1}))).unwrap());
        stream.push_str(":\n\n");
        stream.push_str(std::str::from_utf8(&event(&json!({"error": {"code": 500}}))).unwrap());
        stream.push_str(std::str::from_utf8(DONE).unwrap());
        stream.push_str("data: {\"partial");
        let events = parse_events(&stream);
        assert_eq!(events.len(), 3);
        assert_eq!(events[0], SseEvent::Json(json!({"a": 1})));
        assert!(events[1].is_error());
        assert_eq!(events[2], SseEvent::Done);
    }
}
