//! Fault-matrix row (issue #11): `SIGHUP` with a bad configuration file, against the built
//! `slotgate` binary (a signal needs a process of its own) in front of the fake engine.
//!
//! The four assertions of every row (`tests/faults.rs`): what the clients got (the stream that
//! ran across the signal ends whole, new requests are served by the configuration in force); that
//! slots and queues are back to 0; that the refusal was counted
//! (`slotgate_config_reloads_total{result="refused"}`) and shown (`last_reload_refused` in
//! `GET /admin/upstreams`, and the log); and that the engine's connection was not cut (the
//! stream's request completed at the engine).

#![cfg(unix)]

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use fake_upstream::{FakeConfig, FakeUpstream, Outcome};
use serde_json::Value;
use support::{slotgate, write};

/// Every wait in this test.
const SOON: Duration = Duration::from_secs(20);

fn config(fake: SocketAddr, queue_timeout: &str) -> String {
    format!(
        r#"
[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"

[upstreams.a]
url = "http://{fake}"
kind = "vllm"

[upstreams.a.models.m]
parallel = 2
queue = 4
{queue_timeout}
"#
    )
}

/// The running binary, its log lines, and its two addresses.
struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    api: SocketAddr,
    admin: SocketAddr,
}

impl Running {
    fn start(path: &std::path::Path) -> Self {
        let mut child = slotgate()
            .args(["serve", "--log-format", "json", "--config"])
            .arg(path)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut running = Self {
            child,
            lines,
            api: ([0, 0, 0, 0], 0).into(),
            admin: ([0, 0, 0, 0], 0).into(),
        };
        running.api = address(&running.wait_for("API listening"), "api_addr");
        running.admin = address(&running.wait_for("admin listening"), "admin_addr");
        running
    }

    /// The next log line containing `needle`, within [`SOON`].
    fn wait_for(&self, needle: &str) -> String {
        let deadline = Instant::now() + SOON;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(_) => {}
                Err(error) => panic!("no {needle:?} log line within {SOON:?}: {error}"),
            }
        }
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `field` of a JSON log line, as a socket address.
fn address(line: &str, field: &str) -> SocketAddr {
    let json: Value = serde_json::from_str(line).unwrap();
    let value = json
        .get(field)
        .or_else(|| json["fields"].get(field))
        .and_then(Value::as_str)
        .unwrap_or_else(|| panic!("no {field} in {line}"));
    value.parse().unwrap()
}

/// One HTTP/1.1 exchange on a new connection: the status and the body (de-chunked well enough
/// for assertions: the raw text after the head).
fn exchange(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
    headers: &str,
) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(SOON)).unwrap();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: gw\r\nConnection: close\r\nContent-Type: application/json\r\n\
         {headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {answer:?}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    (status, body)
}

fn chat(addr: SocketAddr, stream: bool, headers: &str) -> (u16, String) {
    let body = format!(
        r#"{{"model":"m","stream":{stream},"messages":[{{"role":"user","content":"hi"}}]}}"#
    );
    exchange(addr, "POST", "/v1/chat/completions", &body, headers)
}

/// The admin listener's `/metrics`: the value of the sample `series`.
fn sample(admin: SocketAddr, series: &str) -> Option<f64> {
    let (_, text) = exchange(admin, "GET", "/metrics", "", "");
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn upstreams_doc(admin: SocketAddr) -> Value {
    let (status, body) = exchange(admin, "GET", "/admin/upstreams", "", "");
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_with_a_bad_config_keeps_the_old_one_serving_counts_and_shows_the_refusal() {
    let fake = FakeUpstream::start(FakeConfig::vllm(2).model("m"))
        .await
        .unwrap();
    let path = write(
        "sighup-fault.toml",
        &config(fake.addr(), "queue_timeout = \"30s\""),
    );
    let fake_addr = fake.addr();
    let observer = fake.observer().clone();

    // The process and the clients block: they run off the async workers.
    let checks = tokio::task::spawn_blocking(move || {
        let gw = Running::start(&path);

        // A stream that runs across the signal: 30 tokens, 50 ms apart.
        let api = gw.api;
        let stream = std::thread::spawn(move || {
            chat(
                api,
                true,
                "x-request-id: across-hup\r\nx-fake-tokens: 30\r\nx-fake-chunk-interval-ms: 50\r\n",
            )
        });
        let deadline = Instant::now() + SOON;
        while observer.in_flight() == 0 {
            assert!(
                Instant::now() < deadline,
                "the stream never reached the engine"
            );
            std::thread::sleep(Duration::from_millis(20));
        }

        // The file loses `queue_timeout`: the reload is refused.
        std::fs::write(&path, config(fake_addr, "")).unwrap();
        gw.signal("HUP");
        let logged = gw.wait_for("configuration reload refused");
        assert!(logged.contains("queue_timeout"), "{logged}");

        // What the clients got: the stream ends whole; a new request is served by generation 1.
        let (status, body) = stream.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(body.contains("[DONE]"), "the stream was cut: {body}");
        let (status, body) = chat(gw.api, false, "");
        assert_eq!(status, 200, "{body}");

        // Shown and counted.
        let doc = upstreams_doc(gw.admin);
        assert_eq!(doc["generation"], 1, "{doc}");
        let issues = doc["last_reload_refused"]["issues"].as_array().unwrap();
        assert!(
            issues
                .iter()
                .any(|i| i.as_str().unwrap().contains("queue_timeout")),
            "{doc}"
        );
        let reloads = |result: &str| {
            sample(
                gw.admin,
                &format!("slotgate_config_reloads_total{{result=\"{result}\"}}"),
            )
        };
        assert_eq!(reloads("refused"), Some(1.0));
        assert_eq!(reloads("applied"), Some(0.0));

        // Nothing held.
        let deadline = Instant::now() + SOON;
        loop {
            let held = sample(gw.admin, r#"slotgate_slots_in_use{upstream="a",model="m"}"#).zip(
                sample(gw.admin, r#"slotgate_queue_depth{upstream="a",model="m"}"#),
            );
            if held == Some((0.0, 0.0)) {
                break;
            }
            assert!(Instant::now() < deadline, "still held: {held:?}");
            std::thread::sleep(Duration::from_millis(50));
        }

        // A fixed file is applied, and the refusal is no longer shown.
        std::fs::write(&path, config(fake_addr, "queue_timeout = \"20s\"")).unwrap();
        gw.signal("HUP");
        gw.wait_for("configuration reloaded");
        let doc = upstreams_doc(gw.admin);
        assert_eq!(doc["generation"], 2, "{doc}");
        assert!(doc["last_reload_refused"].is_null(), "{doc}");

        gw.signal("TERM");
        let mut gw = gw;
        let exit = gw.child.wait().unwrap();
        assert!(exit.success(), "{exit:?}");
        std::fs::remove_file(&path).unwrap();
    });
    checks.await.unwrap();

    // The engine's connection was not cut: the stream's request completed there.
    let record = fake
        .observer()
        .wait_for_outcome("across-hup", SOON)
        .await
        .expect("the stream ended at the engine");
    assert_eq!(record.outcome, Some(Outcome::Completed));
    fake.shutdown().await;
}
