//! Cache-aware routing end to end: the real gateway in front of two fake llama-servers whose
//! simulated prompt caches report cached tokens as the real engine does
//! (`usage.prompt_tokens_details.cached_tokens`, `timings.cache_n`).
//!
//! - A conversation's next turn goes where its prompt is cached, even where the chooser alone
//!   would put it elsewhere; the engine's report confirms the hit.
//! - A host that restarted (its cache cleared) reports far fewer cached tokens than predicted:
//!   the gateway forgets what it had sent there before, and those conversations are placed by
//!   free slots again (traffic re-spreads).
//! - A short prompt, and a new conversation that only shares a long system prompt with others,
//!   are placed by the chooser exactly as without affinity.
//! - `affinity = "off"` turns it off.

mod support;

use std::net::SocketAddr;

use serde_json::{Value, json};
use support::{admin_sample, fake, gateway, post, send, server, upstream};

const MODEL: &str = "m";

/// A system prompt of about 2,000 words, different per `seed`.
fn system(seed: &str) -> String {
    (0..400)
        .map(|i| format!("{seed}{i} rule"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A conversation: its system prompt, and the turns so far (user, assistant pairs).
struct Conversation {
    messages: Vec<Value>,
}

impl Conversation {
    fn new(system_prompt: &str) -> Self {
        Self {
            messages: vec![json!({"role": "system", "content": system_prompt})],
        }
    }

    /// Sends the next user turn and keeps the answer; returns (upstream, cached tokens).
    async fn turn(&mut self, gw: SocketAddr, text: &str) -> (String, u64) {
        self.messages.push(json!({"role": "user", "content": text}));
        let body = json!({"model": MODEL, "messages": self.messages, "max_tokens": 8});
        let reply = send(post(gw, "/v1/chat/completions", body.to_string(), &[])).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let answer = reply.json();
        let content = answer["choices"][0]["message"]["content"].clone();
        self.messages
            .push(json!({"role": "assistant", "content": content}));
        let upstream = reply.headers["x-slotgate-upstream"]
            .to_str()
            .unwrap()
            .to_owned();
        let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        (upstream, cached)
    }
}

/// Occupies one slot of the upstream the chooser picks now (the first, all being idle) for
/// `ms`, so that the next request goes to the other one.
async fn occupy(gw: SocketAddr, ms: u64) -> tokio::task::JoinHandle<()> {
    let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "wait"}]});
    let hold = ms.to_string();
    let task = tokio::spawn(async move {
        let reply = send(post(
            gw,
            "/v1/chat/completions",
            body.to_string(),
            &[("x-fake-hold-ms", &hold)],
        ))
        .await;
        assert_eq!(reply.status, 200);
    });
    // Until it holds its slot.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    task
}

async fn two_hosts(
    extra_model: &str,
) -> (
    fake_upstream::FakeUpstream,
    fake_upstream::FakeUpstream,
    slotgate_gateway::Gateway,
) {
    let a = fake(2, MODEL).await;
    let b = fake(2, MODEL).await;
    let mut toml = server("");
    for (name, fake) in [("a", &a), ("b", &b)] {
        toml += &upstream(name, &format!("http://{}", fake.addr()), MODEL, 2, 4, "30s");
        toml += extra_model;
    }
    let gw = gateway(&toml).await;
    (a, b, gw)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_follows_its_cache_and_a_restart_spreads_it_again() {
    let (_a, b, gw) = two_hosts("").await;
    let addr = gw.api_addr();
    let admin = gw.admin_addr().unwrap();
    let mut x = Conversation::new(&system("x"));
    let mut y = Conversation::new(&system("y"));
    let mut w = Conversation::new(&system("w"));
    // x starts on a (both idle: the first in order); y and w start on b while a is busy.
    assert_eq!(x.turn(addr, "hello").await.0, "a");
    let busy = occupy(addr, 1500).await;
    assert_eq!(y.turn(addr, "hello").await.0, "b");
    assert_eq!(w.turn(addr, "hello").await.0, "b");
    busy.await.unwrap();

    // Both idle again: the chooser alone would pick a; y's cache is on b.
    let (host, cached) = y.turn(addr, "and then?").await;
    assert_eq!(host, "b", "the turn follows its cache");
    assert!(cached > 700, "the engine reused the prefix: {cached}");
    let (host, cached) = x.turn(addr, "and then?").await;
    assert_eq!((host.as_str(), cached > 700), ("a", true));
    let hits = r#"slotgate_affinity_total{upstream="b",model="m",result="hit"}"#;
    assert_eq!(admin_sample(admin, hits).await, Some(1.0));
    let cached_series = r#"slotgate_tokens_total{upstream="b",model="m",kind="cached_prompt"}"#;
    assert!(admin_sample(admin, cached_series).await.unwrap() > 700.0);

    // b restarts: its cache is empty. y's next turn still goes there (predicted), and b's
    // answer says it held nothing.
    b.clear_prompt_cache();
    let (host, cached) = y.turn(addr, "still there?").await;
    assert_eq!((host.as_str(), cached), ("b", 0));
    // What b was sent before is forgotten: w is placed by the chooser (a), not pulled to b.
    let (host, _) = w.turn(addr, "and you?").await;
    assert_eq!(host, "a", "traffic re-spreads after the restart");
    // y, which b computed again just now, stays.
    assert_eq!(y.turn(addr, "ok").await.0, "b");
    let misses = r#"slotgate_affinity_total{upstream="a",model="m",result="miss"}"#;
    assert!(admin_sample(admin, misses).await.unwrap() >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_prompts_and_shared_system_prompts_are_placed_by_free_slots() {
    let (_a, _b, gw) = two_hosts("").await;
    let addr = gw.api_addr();
    let shared = system("s");
    let mut first = Conversation::new(&shared);
    assert_eq!(first.turn(addr, "one").await.0, "a");
    // A second conversation with the same system prompt, while a is busy: b has more free
    // slots, and the shared prompt alone does not pull it to a.
    let busy = occupy(addr, 1500).await;
    let mut second = Conversation::new(&shared);
    assert_eq!(second.turn(addr, "two").await.0, "b");
    // A third, idle: the chooser's first (a), not b where the last one went.
    busy.await.unwrap();
    let mut third = Conversation::new(&shared);
    assert_eq!(third.turn(addr, "three").await.0, "a");
    // Later turns follow their own conversation.
    assert_eq!(second.turn(addr, "two again").await.0, "b");
    // A short prompt goes by free slots: a, all idle.
    let mut short = Conversation {
        messages: Vec::new(),
    };
    let busy = occupy(addr, 1500).await;
    assert_eq!(short.turn(addr, "hi").await.0, "b");
    busy.await.unwrap();
    assert_eq!(short.turn(addr, "again").await.0, "a");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn affinity_off_for_a_model_places_by_free_slots_alone() {
    let (_a, _b, gw) = two_hosts("affinity = \"off\"\n").await;
    let addr = gw.api_addr();
    let busy = occupy(addr, 1500).await;
    let mut y = Conversation::new(&system("y"));
    assert_eq!(y.turn(addr, "hello").await.0, "b");
    busy.await.unwrap();
    assert_eq!(y.turn(addr, "and then?").await.0, "a", "no affinity");
}
