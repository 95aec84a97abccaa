//! `slotgate check` with `parallel = "auto"` models: it asks each engine for its slot count and
//! says what it found, without failing the check when an engine does not answer.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;

use support::{slotgate, write};

fn config(url: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
health_check_timeout = "3s"

[upstreams.engine]
url = "{url}"
kind = "llama-server"

[upstreams.engine.models.tiny]
parallel = "auto"
queue = 4
queue_timeout = "30s"
"#
    )
}

/// Answers one HTTP request on `listener` with llama-server's `/props` (3 slots); returns the
/// request line it got.
fn answer_props_once(listener: &TcpListener) -> String {
    let (stream, _) = listener.accept().unwrap();
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut request_line = String::new();
    reader.read_line(&mut request_line).unwrap();
    let mut line = String::new();
    while reader.read_line(&mut line).unwrap() > 2 {
        line.clear();
    }
    let body =
        r#"{"default_generation_settings":{"n_ctx":2048},"total_slots":3,"model_alias":"tiny"}"#;
    write!(
        &stream,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    request_line
}

#[test]
fn check_reports_the_slot_count_an_auto_model_gets() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let engine = std::thread::spawn(move || answer_props_once(&listener));
    let path = write("auto.toml", &config(&url));
    let out = slotgate()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{out:?}");
    assert!(stderr.contains("probing"), "says it probes: {stderr}");
    assert!(
        stderr.contains("upstreams.engine.models.tiny: 3 slots"),
        "{stderr}"
    );
    assert!(stdout.contains("parallel = \"auto\""), "{stdout}");
    let request_line = engine.join().unwrap();
    assert!(
        request_line.starts_with("GET /props?model=tiny&autoload=false "),
        "{request_line}"
    );
}

#[test]
fn check_says_when_an_auto_model_gets_no_slot_count_but_passes() {
    // A port nobody listens on.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let path = write(
        "auto-down.toml",
        &config(&format!("http://127.0.0.1:{port}")),
    );
    let out = slotgate()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "a valid config: {out:?}");
    assert!(
        stderr.contains("upstreams.engine.models.tiny: slot count unknown")
            && stderr.contains("connect failed")
            && stderr.contains("unavailable"),
        "{stderr}"
    );
}
