//! The `slotgate` binary's command line: `check` and `serve`, run as a user would.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{slotgate, write};

const GOOD: &str = r#"
[server]
listen = "127.0.0.1:0"

[aliases]
chat = "qwen"

[upstreams.gpu]
url = "http://127.0.0.1:9"
kind = "llama-server"

[upstreams.gpu.models.qwen]
parallel = 2
queue = 4
queue_timeout = "30s"
"#;

/// Two mistakes at once: a missing `queue_timeout` and an alias to nothing.
const BAD: &str = r#"
[server]
listen = "127.0.0.1:0"

[aliases]
chat = "nothing"

[upstreams.gpu]
url = "http://127.0.0.1:9"
kind = "llama-server"

[upstreams.gpu.models.qwen]
parallel = 2
queue = 4
"#;

#[test]
fn check_prints_the_effective_config() {
    let path = write("good.toml", GOOD);
    let out = slotgate()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    // Defaults made visible.
    assert!(stdout.contains("first_byte_timeout"), "{stdout}");
    assert!(stdout.contains("max_body_bytes"), "{stdout}");
    assert!(stdout.contains("qwen"), "{stdout}");
}

#[test]
fn check_lists_every_problem_and_exits_64() {
    let path = write("bad.toml", BAD);
    let out = slotgate()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    assert!(
        stderr.contains("upstreams.gpu.models.qwen.queue_timeout"),
        "{stderr}"
    );
    assert!(stderr.contains("aliases.chat"), "{stderr}");
    assert!(out.stdout.is_empty());

    let missing = slotgate()
        .args(["check", "--config", "/nonexistent/slotgate.toml"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(64), "{missing:?}");
}

#[test]
fn check_names_a_tls_file_it_cannot_read() {
    let path = write(
        "https.toml",
        &GOOD.replace(
            "url = \"http://127.0.0.1:9\"",
            "url = \"https://127.0.0.1:9\"\nca_file = \"/nonexistent/private-ca.pem\"",
        ),
    );
    let out = slotgate()
        .args(["check", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("upstreams.gpu: TLS: cannot read /nonexistent/private-ca.pem: "),
        "{stderr}"
    );
}

#[cfg(unix)]
#[test]
fn serve_stops_cleanly_on_sigterm() {
    let path = write("serve.toml", GOOD);
    let mut child = slotgate()
        .args(["serve", "--log-format", "json", "--config"])
        .arg(&path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "no 'API listening' log line");
        let line = lines.next().expect("the gateway logs").unwrap();
        if line.contains("API listening") {
            assert!(line.starts_with('{'), "JSON logs: {line}");
            break;
        }
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
    let rest: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(rest.iter().any(|l| l.contains("SIGTERM")), "{rest:?}");
}

#[cfg(unix)]
#[test]
fn serve_reloads_on_sighup_and_keeps_running_when_the_new_config_is_invalid() {
    let path = write("reload.toml", GOOD);
    let mut child = slotgate()
        .args(["serve", "--log-format", "json", "--config"])
        .arg(&path)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut wait_for = |needle: &str| -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            assert!(Instant::now() < deadline, "no {needle:?} log line");
            let line = lines.next().expect("the gateway logs").unwrap();
            if line.contains(needle) {
                return line;
            }
        }
    };
    let signal = |name: &str| {
        let status = Command::new("kill")
            .args([format!("-{name}"), child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    wait_for("API listening");

    std::fs::write(&path, GOOD.replace("chat = \"qwen\"", "talk = \"qwen\"")).unwrap();
    signal("HUP");
    let line = wait_for("configuration reloaded");
    assert!(line.contains("\"generation\":2"), "{line}");

    // Two problems: both are logged, and the gateway keeps serving the old configuration.
    std::fs::write(&path, BAD).unwrap();
    signal("HUP");
    let first = wait_for("configuration reload refused");
    let second = wait_for("configuration reload refused");
    let both = format!("{first}\n{second}");
    assert!(both.contains("queue_timeout"), "{both}");
    assert!(both.contains("aliases.chat"), "{both}");

    signal("TERM");
    let exit = child.wait().unwrap();
    assert!(exit.success(), "{exit:?}");
}
