//! The client's model name put back into the engine's answer.
//!
//! A request whose model the engine knows by another name (an alias, or the upstream's
//! `engine_model`) reaches the engine with only its `model` value renamed
//! ([`request`](crate::proxy::request)). The engine's answer names the model its own way: in a JSON
//! document's `model` member, in each SSE event's, in each line of Ollama's NDJSON. [`Rename`]
//! gives the client back the name it sent, frame by frame, without parsing the answer or holding
//! an event back.
//!
//! It looks for the bytes of a member `"model"` whose value is the engine name's JSON string
//! (whitespace allowed around the `:`) and replaces only that string. In valid JSON this cannot
//! match anything else: a `"` inside a string is escaped, and the match must follow a `{` or a
//! `,` (a member's start), so text the model generated, which travels inside strings, is never
//! touched. Other members keep their bytes, and nested objects (the Responses API's `response`,
//! Anthropic's `message`) are renamed too.
//!
//! A frame that ends inside a possible match keeps those few bytes (at most the member name, a
//! little whitespace and the engine name) until the next frame: they are the middle of a JSON
//! document, so no complete event waits on them. They are sent at the end of the answer at the
//! latest. Answers that are not JSON, SSE or NDJSON, and compressed ones, pass untouched.

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use http::header::{CONTENT_ENCODING, CONTENT_LENGTH, CONTENT_TYPE};
use http::{HeaderMap, Response};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// Whitespace allowed on each side of a member's `:`; engines write none or one space.
const MAX_SPACE: usize = 8;

/// The two names of one model, as JSON string literals (quotes and escapes included).
#[derive(Debug)]
pub(crate) struct Names {
    /// What the engine calls the model: searched for.
    engine: Vec<u8>,
    /// What the client called it: written in its place.
    client: Bytes,
}

impl Names {
    /// The rename of `engine` back to `client`, or `None` when the two are the same name.
    pub(crate) fn new(client: &str, engine: &str) -> Option<Self> {
        (client != engine).then(|| Self {
            engine: json_string(engine).into_bytes(),
            client: Bytes::from(json_string(client)),
        })
    }
}

/// `name` as a JSON string literal. Serialising a `&str` cannot fail; it only escapes.
fn json_string(name: &str) -> String {
    serde_json::to_string(name).unwrap_or_default()
}

/// Where a scan of the bytes from one `"` stands.
enum Scan {
    /// A `"model"` member with the engine's name as its value; the value spans these bytes.
    Found { value: usize, end: usize },
    /// Something else.
    No,
    /// The bytes end before it can tell.
    Short,
}

/// Scans `bytes`, which start at a `"` that follows a `{` or a `,`, for
/// `"model"` ws* `:` ws* `engine`.
fn scan(bytes: &[u8], engine: &[u8]) -> Scan {
    const KEY: &[u8] = b"\"model\"";
    let prefix = |have: &[u8], want: &[u8]| {
        let n = have.len().min(want.len());
        have[..n] == want[..n]
    };
    if !prefix(bytes, KEY) {
        return Scan::No;
    }
    if bytes.len() < KEY.len() {
        return Scan::Short;
    }
    let mut at = KEY.len();
    let skip_space = |at: &mut usize| -> Option<Scan> {
        let start = *at;
        while bytes.get(*at).is_some_and(u8::is_ascii_whitespace) {
            *at += 1;
            if *at - start > MAX_SPACE {
                return Some(Scan::No);
            }
        }
        (*at == bytes.len()).then_some(Scan::Short)
    };
    if let Some(early) = skip_space(&mut at) {
        return early;
    }
    if bytes[at] != b':' {
        return Scan::No;
    }
    at += 1;
    if let Some(early) = skip_space(&mut at) {
        return early;
    }
    let rest = &bytes[at..];
    if !prefix(rest, engine) {
        return Scan::No;
    }
    if rest.len() < engine.len() {
        return Scan::Short;
    }
    Scan::Found {
        value: at,
        end: at + engine.len(),
    }
}

/// The renaming state of one answer.
#[derive(Debug)]
struct Renamer {
    names: Names,
    /// The end of the last frame, held because a match may continue in the next one.
    carry: BytesMut,
    /// The last byte sent that is not whitespace: a match must follow a `{` or a `,`.
    last: u8,
}

impl Renamer {
    /// `data` with every match renamed, less a tail that may be the start of a match.
    fn rename(&mut self, data: &Bytes) -> Bytes {
        let input: &[u8] = if self.carry.is_empty() {
            data
        } else {
            self.carry.extend_from_slice(data);
            &self.carry
        };
        let mut out: Option<BytesMut> = None;
        let mut copied = 0;
        let mut kept = input.len();
        let mut i = 0;
        while i < input.len() {
            let byte = input[i];
            if byte == b'"' && matches!(self.last, b'{' | b',') {
                match scan(&input[i..], &self.names.engine) {
                    Scan::Found { value, end } => {
                        let out = out.get_or_insert_with(|| BytesMut::with_capacity(input.len()));
                        out.extend_from_slice(&input[copied..i + value]);
                        out.extend_from_slice(&self.names.client);
                        copied = i + end;
                        i += end;
                        self.last = b'"';
                        continue;
                    }
                    Scan::Short => {
                        kept = i;
                        break;
                    }
                    Scan::No => {}
                }
            }
            if !byte.is_ascii_whitespace() {
                self.last = byte;
            }
            i += 1;
        }
        let renamed = match out {
            // Nothing renamed and nothing held: the frame as it came, without a copy.
            None if kept == input.len() && self.carry.is_empty() => return data.clone(),
            None => Bytes::copy_from_slice(&input[..kept]),
            Some(mut out) => {
                out.extend_from_slice(&input[copied..kept]);
                out.freeze()
            }
        };
        let tail = BytesMut::from(&input[kept..]);
        self.carry = tail;
        renamed
    }

    /// What is still held, once the answer has ended.
    fn flush(&mut self) -> Option<Bytes> {
        (!self.carry.is_empty()).then(|| self.carry.split().freeze())
    }
}

pin_project! {
    /// A response body that gives the client back its own model name (see the
    /// [module docs](self)); with no [`Names`] it passes every frame through as it is.
    #[derive(Debug)]
    pub(crate) struct Rename<B> {
        #[pin]
        inner: B,
        renamer: Option<Box<Renamer>>,
        // A trailers frame that came while bytes were held: sent after them.
        pending: Option<Frame<Bytes>>,
        // The inner body has ended.
        done: bool,
    }
}

impl<B> Rename<B> {
    /// Wraps `inner`, renaming with `names` if given.
    pub(crate) fn new(inner: B, names: Option<Names>) -> Self {
        Self {
            inner,
            renamer: names.map(|names| {
                Box::new(Renamer {
                    names,
                    carry: BytesMut::new(),
                    last: 0,
                })
            }),
            pending: None,
            done: false,
        }
    }
}

/// The [`Names`] to rename `response` with, and its headers made ready for a body whose length
/// changes: `None` (and the headers untouched) when the names are the same or the answer is not
/// uncompressed JSON, SSE or NDJSON.
pub(crate) fn prepare<B>(
    response: &mut Response<B>,
    client: Option<&str>,
    engine: &str,
) -> Option<Names> {
    let names = Names::new(client?, engine)?;
    let headers = response.headers_mut();
    if !renamable(headers) {
        return None;
    }
    // The renamed body's length is known only at its end.
    headers.remove(CONTENT_LENGTH);
    Some(names)
}

/// Whether an answer with `headers` is text the rename can read: JSON (`application/json`,
/// `…+json`), SSE or NDJSON, with no content coding.
fn renamable(headers: &HeaderMap) -> bool {
    let coded = headers
        .get(CONTENT_ENCODING)
        .is_some_and(|coding| !coding.as_bytes().eq_ignore_ascii_case(b"identity"));
    let essence = headers
        .get(CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .and_then(|text| text.split(';').next())
        .map(|essence| essence.trim().to_ascii_lowercase());
    !coded
        && essence.is_some_and(|essence| {
            essence == "text/event-stream"
                || essence.ends_with("/json")
                || essence.ends_with("+json")
                || essence.ends_with("ndjson")
        })
}

impl<B> Body for Rename<B>
where
    B: Body<Data = Bytes>,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        let Some(renamer) = this.renamer.as_mut() else {
            return this.inner.poll_frame(cx);
        };
        if let Some(frame) = this.pending.take() {
            return Poll::Ready(Some(Ok(frame)));
        }
        loop {
            if *this.done {
                return Poll::Ready(renamer.flush().map(|rest| Ok(Frame::data(rest))));
            }
            let Some(polled) = ready!(this.inner.as_mut().poll_frame(cx)) else {
                *this.done = true;
                continue;
            };
            let frame = match polled {
                Ok(frame) => frame,
                // A broken answer: what was held is part of it and goes with it.
                Err(error) => return Poll::Ready(Some(Err(error))),
            };
            match frame.into_data() {
                Ok(data) => {
                    let out = renamer.rename(&data);
                    // All of it held: a match may go on in the next frame.
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Err(trailers) => match renamer.flush() {
                    Some(rest) => {
                        *this.pending = Some(trailers);
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                    None => return Poll::Ready(Some(Ok(trailers))),
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.renamer {
            None => self.inner.is_end_stream(),
            Some(renamer) => {
                self.pending.is_none()
                    && renamer.carry.is_empty()
                    && (self.done || self.inner.is_end_stream())
            }
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.renamer {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
