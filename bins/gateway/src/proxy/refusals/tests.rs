//! Unit tests for [`Refusals`]: which writes are hyper's refusals, and what goes out instead.

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::rt::Write;

use super::{Refusals, problem_answer, refusal_status};

const DATE: &str = "date: Tue, 01 Dec 2026 00:00:00 GMT\r\n";

fn hyper_head(status: &str) -> Vec<u8> {
    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n{DATE}\r\n").into_bytes()
}

#[test]
fn hyper_s_own_refusals_are_recognised() {
    for (status, code) in [
        ("400 Bad Request", 400),
        ("414 URI Too Long", 414),
        ("431 Request Header Fields Too Large", 431),
    ] {
        assert_eq!(refusal_status(&hyper_head(status)), Some(code), "{status}");
    }
}

#[test]
fn every_other_write_passes() {
    let ours =
        format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nx-request-id: abc\r\n{DATE}\r\n");
    let with_body = format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n{DATE}\r\n{{}}");
    let sized = format!("HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n{DATE}\r\n");
    let cut = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n".to_owned();
    for bytes in [
        ours.as_bytes(),
        with_body.as_bytes(),
        sized.as_bytes(),
        cut.as_bytes(),
        &hyper_head("404 Not Found"),
        &hyper_head("408 Request Timeout"),
        b"data: {\"HTTP/1.1 400 \"}\n\n",
        b"\x00\x00\x08\x06\x00\x00\x00\x00\x00",
        b"",
    ] {
        assert_eq!(
            refusal_status(bytes),
            None,
            "{:?}",
            String::from_utf8_lossy(bytes)
        );
    }
}

#[test]
fn the_answer_is_a_problem_document_with_the_same_status() {
    let answer = problem_answer(&hyper_head("431 Request Header Fields Too Large")).unwrap();
    let text = std::str::from_utf8(&answer).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"),
        "{head}"
    );
    assert!(
        head.contains("\r\ncontent-type: application/problem+json"),
        "{head}"
    );
    assert!(head.contains("\r\nconnection: close"), "{head}");
    assert!(
        head.contains(&format!("\r\ncontent-length: {}", body.len())),
        "{head}"
    );
    let doc: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(
        doc["type"],
        "https://slotgate.dev/problems/headers-too-large"
    );
    assert_eq!(doc["status"], 431);
    assert_eq!(doc["error"]["code"], "headers_too_large");
    let id = doc["request_id"].as_str().unwrap();
    assert!(head.contains(&format!("\r\nx-request-id: {id}")), "{head}");
    assert_eq!(doc["instance"], format!("urn:uuid:{id}"));
}

/// A writer that takes at most `chunk` bytes a call.
struct Trickle {
    out: Vec<u8>,
    chunk: usize,
}

impl Write for Trickle {
    fn poll_write(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.chunk);
        self.out.extend_from_slice(&buf[..n]);
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

#[test]
fn the_whole_answer_goes_out_however_the_socket_takes_it() {
    let mut io = Refusals::new(Trickle {
        out: Vec::new(),
        chunk: 7,
    });
    let mut cx = Context::from_waker(std::task::Waker::noop());
    let head = hyper_head("414 URI Too Long");
    let taken = Pin::new(&mut io).poll_write(&mut cx, &head);
    assert!(matches!(taken, Poll::Ready(Ok(n)) if n == head.len()));
    assert!(Pin::new(&mut io).poll_flush(&mut cx).is_ready());
    let text = String::from_utf8(io.inner.out.clone()).unwrap();
    assert!(text.starts_with("HTTP/1.1 414 URI Too Long\r\n"), "{text}");
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    let doc: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(doc["type"], "https://slotgate.dev/problems/uri-too-long");
    // Later writes (there are none from hyper after a refusal) would pass through untouched.
    let more = Pin::new(&mut io).poll_write(&mut cx, b"abc");
    assert!(matches!(more, Poll::Ready(Ok(3))));
    assert!(io.inner.out.ends_with(b"abc"));
}
