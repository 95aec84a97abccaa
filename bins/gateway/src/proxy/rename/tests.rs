//! Unit tests for [`Rename`]: exact matches only, across any frame split, nothing held longer
//! than a possible match.

use bytes::Bytes;
use futures::stream;
use http::{HeaderMap, HeaderValue, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, StreamBody};

use super::{Names, Rename, prepare};

type Frames = Vec<Result<Frame<Bytes>, std::io::Error>>;
type Inner = StreamBody<stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, std::io::Error>>>>;

fn body(frames: Frames) -> Rename<Inner> {
    Rename::new(
        StreamBody::new(stream::iter(frames)),
        Names::new("qwen", "qwen2.5:7b"),
    )
}

fn data(chunks: &[&[u8]]) -> Frames {
    chunks
        .iter()
        .map(|c| Ok(Frame::data(Bytes::copy_from_slice(c))))
        .collect()
}

/// Every data frame the body yields, in order.
async fn frames(mut body: impl Body<Data = Bytes, Error = std::io::Error> + Unpin) -> Vec<Bytes> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.unwrap();
        if let Ok(data) = frame.into_data() {
            out.push(data);
        }
    }
    out
}

async fn renamed(chunks: &[&[u8]]) -> String {
    let out = frames(body(data(chunks))).await;
    String::from_utf8(out.concat()).unwrap()
}

const SSE: &str = "data: {\"id\":\"c1\",\"model\":\"qwen2.5:7b\",\"choices\":[{\"delta\":{\"content\":\"the \\\"model\\\":\\\"qwen2.5:7b\\\" said\"}}]}\n\n\
data: {\"type\":\"message_start\",\"message\":{\"model\" : \"qwen2.5:7b\",\"role\":\"assistant\"}}\n\n\
data: {\"model\":\"other\",\"x\":{\"model\":\"qwen2.5:7b-long\"}}\n\ndata: [DONE]\n\n";

const EXPECTED: &str = "data: {\"id\":\"c1\",\"model\":\"qwen\",\"choices\":[{\"delta\":{\"content\":\"the \\\"model\\\":\\\"qwen2.5:7b\\\" said\"}}]}\n\n\
data: {\"type\":\"message_start\",\"message\":{\"model\" : \"qwen\",\"role\":\"assistant\"}}\n\n\
data: {\"model\":\"other\",\"x\":{\"model\":\"qwen2.5:7b-long\"}}\n\ndata: [DONE]\n\n";

#[tokio::test]
async fn renames_members_only_never_text_or_other_names() {
    // In one frame: the top-level and the nested member renamed; generated text (escaped), another
    // model and a longer name that starts with the engine's left alone.
    assert_eq!(renamed(&[SSE.as_bytes()]).await, EXPECTED);
    let json = br#"{ "model": "qwen2.5:7b", "usage": {"prompt_tokens": 3} }"#;
    assert_eq!(
        renamed(&[json]).await,
        r#"{ "model": "qwen", "usage": {"prompt_tokens": 3} }"#
    );
    // Not after `{` or `,`: not a member name.
    let odd = br#"["model":"qwen2.5:7b"]"#;
    assert_eq!(renamed(&[odd]).await, r#"["model":"qwen2.5:7b"]"#);
}

#[tokio::test]
async fn any_split_into_two_or_three_frames_gives_the_same_bytes() {
    let bytes = SSE.as_bytes();
    for a in 0..=bytes.len() {
        assert_eq!(
            renamed(&[&bytes[..a], &bytes[a..]]).await,
            EXPECTED,
            "split at {a}"
        );
    }
    for a in (0..bytes.len()).step_by(7) {
        for b in a..bytes.len() {
            assert_eq!(
                renamed(&[&bytes[..a], &bytes[a..b], &bytes[b..]]).await,
                EXPECTED,
                "split at {a}, {b}"
            );
        }
    }
}

#[tokio::test]
async fn a_frame_is_held_back_only_while_it_may_end_inside_a_match() {
    // Whole events: each frame comes out as it went in, one for one.
    let events = [
        "data: {\"model\":\"qwen2.5:7b\"}\n\n",
        "data: {\"a\":1}\n\n",
    ];
    let out = frames(body(data(&[events[0].as_bytes(), events[1].as_bytes()]))).await;
    assert_eq!(
        out,
        [
            Bytes::from("data: {\"model\":\"qwen\"}\n\n"),
            Bytes::from(events[1])
        ]
    );
    // A frame that ends in `{"mod`: that tail waits for the next frame, the rest goes at once.
    let out = frames(body(data(&[b"data: {\"mod", b"el\":\"qwen2.5:7b\"}\n\n"]))).await;
    assert_eq!(
        out,
        [
            Bytes::from("data: {"),
            Bytes::from("\"model\":\"qwen\"}\n\n")
        ]
    );
    // Held bytes at the very end are sent, unchanged.
    let out = frames(body(data(&[b"{\"model\":\"qwen2"]))).await;
    assert_eq!(out.concat(), b"{\"model\":\"qwen2");
}

#[tokio::test]
async fn trailers_come_after_the_held_bytes_and_the_end_is_reported() {
    let mut trailers = HeaderMap::new();
    trailers.insert("x-t", HeaderValue::from_static("1"));
    let frames_in: Frames = vec![
        Ok(Frame::data(Bytes::from_static(b"{\"model\":\"qwen2.5"))),
        Ok(Frame::trailers(trailers)),
    ];
    let mut body = body(frames_in);
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.data_ref().is_some_and(|d| d == &b"{"[..]));
    let held = body.frame().await.unwrap().unwrap();
    assert!(
        held.data_ref()
            .is_some_and(|d| d == &b"\"model\":\"qwen2.5"[..])
    );
    let last = body.frame().await.unwrap().unwrap();
    assert!(last.is_trailers());
    assert!(body.frame().await.is_none());
    assert!(body.is_end_stream());
}

#[tokio::test]
async fn without_names_frames_and_size_pass_through() {
    let inner = http_body_util::Full::new(Bytes::from_static(b"{\"model\":\"qwen2.5:7b\"}"));
    let body = Rename::new(inner, Names::new("same", "same"));
    assert_eq!(body.size_hint().exact(), Some(22));
    let out = body.collect().await.unwrap().to_bytes();
    assert_eq!(out, &b"{\"model\":\"qwen2.5:7b\"}"[..]);
}

#[test]
fn only_uncompressed_json_sse_and_ndjson_are_renamed() {
    let answer = |content_type: &str, coding: Option<&str>| {
        let mut response = Response::new(());
        let headers = response.headers_mut();
        headers.insert("content-type", HeaderValue::from_str(content_type).unwrap());
        headers.insert("content-length", HeaderValue::from_static("22"));
        if let Some(coding) = coding {
            headers.insert("content-encoding", HeaderValue::from_str(coding).unwrap());
        }
        response
    };
    for renamed in [
        "application/json",
        "application/json; charset=utf-8",
        "text/event-stream",
        "application/x-ndjson",
        "application/problem+json",
    ] {
        let mut response = answer(renamed, None);
        assert!(
            prepare(&mut response, Some("qwen"), "qwen2.5:7b").is_some(),
            "{renamed}"
        );
        assert!(
            !response.headers().contains_key("content-length"),
            "{renamed}"
        );
    }
    for (content_type, coding) in [
        ("audio/mpeg", None),
        ("application/json", Some("gzip")),
        ("text/plain", None),
    ] {
        let mut response = answer(content_type, coding);
        assert!(prepare(&mut response, Some("qwen"), "qwen2.5:7b").is_none());
        assert!(
            response.headers().contains_key("content-length"),
            "untouched"
        );
    }
    // The same name, or no name from the client: nothing to do.
    let mut response = answer("application/json", None);
    assert!(prepare(&mut response, Some("qwen"), "qwen").is_none());
    assert!(prepare(&mut response, None, "qwen").is_none());
    assert!(response.headers().contains_key("content-length"));
}

/// Bytes made of pieces that look like answers: member names, the engine's name and others,
/// escapes, whitespace and SSE framing.
fn answerish() -> impl proptest::strategy::Strategy<Value = Vec<u8>> {
    use proptest::prelude::*;
    let piece = prop_oneof![
        Just(&b"{"[..]),
        Just(&b","[..]),
        Just(&b"}"[..]),
        Just(&b"\"model\""[..]),
        Just(&b":"[..]),
        Just(&b" "[..]),
        Just(&b"\"qwen2.5:7b\""[..]),
        Just(&b"\"qwen2.5"[..]),
        Just(&b"\\\""[..]),
        Just(&b"data: "[..]),
        Just(&b"\n\n"[..]),
        Just(&b"x"[..]),
    ];
    proptest::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

proptest::proptest! {
    /// Renaming does not depend on where the frames split, and a stream that never has the
    /// engine's name after `"model":` comes out byte for byte.
    #[test]
    fn frame_splits_never_change_the_result(bytes in answerish(), cuts in proptest::collection::vec(0_usize..64, 0..4)) {
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        let whole = runtime.block_on(frames(body(data(&[&bytes])))).concat();
        let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
        points.sort_unstable();
        let mut chunks = Vec::new();
        let mut from = 0;
        for point in points {
            chunks.push(&bytes[from..point]);
            from = point;
        }
        chunks.push(&bytes[from..]);
        let split = runtime.block_on(frames(body(data(&chunks)))).concat();
        proptest::prop_assert_eq!(&split, &whole);
        let text = String::from_utf8_lossy(&bytes);
        if !text.contains("qwen2.5:7b") {
            proptest::prop_assert_eq!(&whole, &bytes);
        }
    }
}
