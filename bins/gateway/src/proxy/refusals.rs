//! hyper's own refusals of a malformed HTTP/1 head, turned into problem documents.
//!
//! hyper 1 answers a head it cannot parse by itself, before any service sees a request: `400`
//! (the head does not parse), `414` (a request target over 65,534 bytes) or `431` (more than 100
//! header fields, or a head larger than its read buffer), each a bare status line with
//! `content-length: 0`, and then it closes the connection. It offers no hook for that answer.
//!
//! [`Refusals`] wraps a connection's IO and recognises that one write: a whole response head,
//! with no body, one of those three statuses, `content-length: 0` and no `x-request-id` (every
//! answer of the gateway's own carries one). It puts an `application/problem+json` answer with
//! the same status on the wire instead (`malformed-request`, `uri-too-long`,
//! `headers-too-large`), with a fresh request id and `connection: close`, and tells hyper its own
//! bytes were written. Everything else passes through untouched; HTTP/2 frames can never look
//! like an HTTP/1 status line (a frame that long is beyond any frame size limit).
//!
//! hyper writes nothing when a head is not complete within the header timeout (no `408`), so
//! neither does this.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use hyper::rt::{Read, ReadBufCursor, Write};
use pin_project_lite::pin_project;
use slotgate_problem::{CONTENT_TYPE, Problem};
use tracing::debug;

use crate::support::request_id::request_id;

pin_project! {
    /// A connection's IO that answers hyper's own refusals with problem documents.
    ///
    /// See the [module documentation](self).
    #[derive(Debug)]
    pub(crate) struct Refusals<T> {
        #[pin]
        inner: T,
        // The problem answer still to write, and how much of it is out.
        pending: Option<(Bytes, usize)>,
    }
}

impl<T> Refusals<T> {
    /// Wraps `inner`.
    pub(crate) fn new(inner: T) -> Self {
        Self {
            inner,
            pending: None,
        }
    }
}

impl<T: Write> Refusals<T> {
    /// Writes what is left of a problem answer; ready once it is all out.
    fn poll_pending(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut this = self.project();
        while let Some((answer, written)) = this.pending.as_mut() {
            if *written == answer.len() {
                *this.pending = None;
                break;
            }
            let n = ready!(this.inner.as_mut().poll_write(cx, &answer[*written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            *written += n;
        }
        Poll::Ready(Ok(()))
    }

    /// Takes `head` (hyper's refusal, all of it) and starts writing `answer` instead.
    fn substitute(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        head: usize,
        answer: Bytes,
    ) -> Poll<io::Result<usize>> {
        *self.as_mut().project().pending = Some((answer, 0));
        // What does not go out now goes out on the flush hyper does next.
        if let Poll::Ready(Err(error)) = self.poll_pending(cx) {
            return Poll::Ready(Err(error));
        }
        Poll::Ready(Ok(head))
    }
}

impl<T: Read> Read for Refusals<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        self.project().inner.poll_read(cx, buf)
    }
}

impl<T: Write> Write for Refusals<T> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        ready!(self.as_mut().poll_pending(cx))?;
        match problem_answer(buf) {
            Some(answer) => self.substitute(cx, buf.len(), answer),
            None => self.project().inner.poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        ready!(self.as_mut().poll_pending(cx))?;
        // hyper queues a response head as a buffer of its own, so a refusal is the only one.
        if let [head] = bufs
            && let Some(answer) = problem_answer(head)
        {
            return self.substitute(cx, head.len(), answer);
        }
        self.project().inner.poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_pending(cx))?;
        self.project().inner.poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.as_mut().poll_pending(cx))?;
        self.project().inner.poll_shutdown(cx)
    }
}

/// The problem answer that replaces `bytes`, when they are one of hyper's own refusals.
fn problem_answer(bytes: &[u8]) -> Option<Bytes> {
    let problem = match refusal_status(bytes)? {
        400 => Problem::malformed_request(),
        414 => Problem::uri_too_long(),
        431 => Problem::headers_too_large(),
        _ => return None,
    };
    let id = request_id(&http::HeaderMap::new());
    let id = id.to_str().unwrap_or("-");
    // A generated id is a UUID, so it makes a valid `instance`, as on every other problem.
    let problem = problem
        .with_extension("request_id", id)
        .with_instance(format!("urn:uuid:{id}"));
    debug!(request_id = id, status = %problem.status(), "answered a malformed request head");
    let body = problem.to_json_bytes();
    let status = problem.status();
    let mut answer = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: {CONTENT_TYPE}\r\ncache-control: no-store\r\n\
         x-request-id: {id}\r\nconnection: close\r\ncontent-length: {}\r\n\r\n",
        status.as_str(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    )
    .into_bytes();
    answer.extend_from_slice(&body);
    Some(Bytes::from(answer))
}

/// The status of `bytes` when they are exactly a response head of hyper's own refusal kind: a
/// whole head and nothing after it, `content-length: 0`, no `x-request-id`.
fn refusal_status(bytes: &[u8]) -> Option<u16> {
    let rest = bytes
        .strip_prefix(b"HTTP/1.1 ")
        .or_else(|| bytes.strip_prefix(b"HTTP/1.0 "))?;
    let status = match rest.get(..4)? {
        b"400 " => 400,
        b"414 " => 414,
        b"431 " => 431,
        _ => return None,
    };
    if !bytes.ends_with(b"\r\n\r\n") {
        return None;
    }
    // The head is all there is: its first blank line is the last four bytes.
    let first_blank = bytes.windows(4).position(|w| w == b"\r\n\r\n")?;
    if first_blank + 4 != bytes.len() {
        return None;
    }
    let head = bytes.to_ascii_lowercase();
    let has = |needle: &[u8]| head.windows(needle.len()).any(|w| w == needle);
    (has(b"\r\ncontent-length: 0\r\n") && !has(b"\r\nx-request-id:")).then_some(status)
}

#[cfg(test)]
mod tests;
