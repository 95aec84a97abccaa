//! The prompt cache: what each kind reports as cached when a conversation comes back to the
//! host (and slot) that ran its previous turn, and what clears it.

use std::net::SocketAddr;
use std::time::Duration;

use fake_upstream::{FakeConfig, FakeUpstream, headers};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::support::{get, get_json, post, stream, within};

/// A system prompt of `words` words, distinct per `seed`.
fn system(seed: &str, words: usize) -> String {
    (0..words)
        .map(|i| format!("{seed}{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A conversation: its messages so far, growing turn by turn as a chat client resends them.
struct Conversation {
    messages: Vec<Value>,
}

impl Conversation {
    fn new(system: &str) -> Self {
        Self {
            messages: vec![json!({"role": "system", "content": system})],
        }
    }

    /// The body of the next turn, asking `question` (five words).
    fn ask(&mut self, question: &str, extra: &Value) -> Value {
        self.messages
            .push(json!({"role": "user", "content": format!("{question} b c d e")}));
        let mut body = json!({"model": "m", "messages": self.messages});
        if let (Some(body), Some(extra)) = (body.as_object_mut(), extra.as_object()) {
            body.extend(extra.clone());
        }
        body
    }

    /// Records the answer, which the next turn resends.
    fn answered(&mut self, text: &str) {
        self.messages
            .push(json!({"role": "assistant", "content": text}));
    }

    /// One non-streamed turn: the answer body.
    async fn turn(&mut self, addr: SocketAddr, question: &str) -> Value {
        self.turn_with(addr, question, &[]).await
    }

    async fn turn_with(
        &mut self,
        addr: SocketAddr,
        question: &str,
        headers: &[(&str, &str)],
    ) -> Value {
        let body = self.ask(question, &json!({}));
        let (status, _, answer) =
            within("a turn", post(addr, "/v1/chat/completions", &body, headers)).await;
        assert_eq!(status, 200, "{answer}");
        let text = answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        self.answered(&text);
        answer
    }
}

fn cached(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .expect("usage.prompt_tokens_details.cached_tokens")
}

fn prompt(answer: &Value) -> u64 {
    answer["usage"]["prompt_tokens"]
        .as_u64()
        .expect("usage.prompt_tokens")
}

#[tokio::test]
async fn llama_server_reports_the_resent_conversation_as_cached() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let mut talk = Conversation::new(&system("s", 20));
    // 20 system words, 5 user words; the answer is the default 8 tokens.
    let first = talk.turn(fake.addr(), "first").await;
    assert_eq!((prompt(&first), cached(&first)), (25, 0));
    assert_eq!(first["timings"]["cache_n"], 0);
    assert_eq!(first["timings"]["prompt_n"], 25);
    // The second turn resends all 25 and the 8-token answer: all of it is in the slot.
    let second = talk.turn(fake.addr(), "second").await;
    assert_eq!((prompt(&second), cached(&second)), (38, 33));
    assert_eq!(second["timings"]["cache_n"], 33);
    assert_eq!(second["timings"]["prompt_n"], 5);
    // The same prompt once more: every token but the last.
    let body = json!({"model": "m", "messages": talk.messages[..4]});
    let (_, _, again) = post(fake.addr(), "/v1/chat/completions", &body, &[]).await;
    assert_eq!((prompt(&again), cached(&again)), (38, 37));

    // The engine's own views agree: /slots for the last task, /metrics in total.
    let (_, slots) = get_json(fake.addr(), "/slots").await;
    assert_eq!(slots[0]["n_prompt_tokens_cache"], 37);
    assert_eq!(slots[0]["n_prompt_tokens_processed"], 1);
    let (_, _, metrics) = get(fake.addr(), "/metrics").await;
    assert!(
        metrics.contains("llamacpp:prompt_tokens_cached_total 70\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("llamacpp:prompt_tokens_total 31\n"),
        "{metrics}"
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn llama_server_streams_the_cached_count_on_its_last_chunk() {
    for include_usage in [true, false] {
        let fake = FakeUpstream::start(FakeConfig::llama_server(1))
            .await
            .unwrap();
        let mut talk = Conversation::new(&system("s", 20));
        talk.turn(fake.addr(), "first").await;
        let extra = json!({"stream": true, "stream_options": {"include_usage": include_usage}});
        let body = talk.ask("next", &extra);
        let streamed = within(
            "a stream",
            stream(fake.addr(), "/v1/chat/completions", &body, &[]),
        )
        .await;
        assert!(streamed.ends_with_done());
        let chunks: Vec<&Value> = streamed.events.iter().filter_map(|e| e.json()).collect();
        let last = chunks.last().expect("chunks");
        // Only the last chunk before [DONE] carries the timings.
        assert_eq!(
            chunks.iter().filter(|c| c.get("timings").is_some()).count(),
            1
        );
        assert_eq!(last["timings"]["cache_n"], 33, "{last}");
        assert_eq!(last["timings"]["prompt_n"], 5);
        if include_usage {
            assert_eq!((prompt(last), cached(last)), (38, 33));
        } else {
            assert_eq!(last["choices"][0]["finish_reason"], "stop");
        }
        fake.shutdown().await;
    }
}

#[tokio::test]
async fn responses_and_messages_report_cached_input_the_llama_server_way() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let addr = fake.addr();
    let input = json!([{"role": "user", "content": system("r", 30)}]);
    let body = json!({"model": "m", "input": input});
    let (_, _, first) = post(addr, "/v1/responses", &body, &[]).await;
    assert_eq!(first["usage"]["input_tokens_details"]["cached_tokens"], 0);
    let mut input = input.as_array().cloned().unwrap();
    input.push(
        json!({"role": "assistant", "content": [{"type": "output_text",
        "text": first["output"][0]["content"][0]["text"]}]}),
    );
    input.push(json!({"role": "user", "content": "and then"}));
    let body = json!({"model": "m", "input": input, "stream": true});
    let streamed = stream(addr, "/v1/responses", &body, &[]).await;
    let completed = streamed
        .events
        .iter()
        .filter_map(|e| e.json())
        .find(|e| e["type"] == "response.completed")
        .expect("response.completed");
    let usage = &completed["response"]["usage"];
    assert_eq!(
        (
            usage["input_tokens"].as_u64(),
            usage["input_tokens_details"]["cached_tokens"].as_u64()
        ),
        (Some(40), Some(38))
    );
    assert_eq!(completed["timings"]["cache_n"], 38);

    // Anthropic's shape splits the input: cache_read_input_tokens and the rest.
    let messages = json!([{"role": "user", "content": system("a", 12)}]);
    let body = json!({"model": "m", "max_tokens": 8, "messages": messages});
    post(addr, "/v1/messages", &body, &[]).await;
    let (_, _, again) = post(addr, "/v1/messages", &body, &[]).await;
    assert_eq!(again["usage"]["cache_read_input_tokens"], 11);
    assert_eq!(again["usage"]["input_tokens"], 1);
    fake.shutdown().await;
}

#[tokio::test]
async fn each_slot_keeps_its_conversation_and_one_slot_keeps_only_the_last() {
    // Two slots: two conversations taking turns each find their own slot.
    let fake = FakeUpstream::start(FakeConfig::llama_server(2))
        .await
        .unwrap();
    let (mut a, mut b) = (
        Conversation::new(&system("a", 20)),
        Conversation::new(&system("b", 20)),
    );
    for (talk, question) in [(&mut a, "one"), (&mut b, "one")] {
        assert_eq!(cached(&talk.turn(fake.addr(), question).await), 0);
    }
    assert!(cached(&a.turn(fake.addr(), "two").await) >= 33);
    assert!(cached(&b.turn(fake.addr(), "two").await) >= 33);
    assert!(cached(&a.turn(fake.addr(), "three").await) >= 33);
    fake.shutdown().await;

    // One slot: each turn evicts the other conversation, unless the RAM cache keeps it.
    for (cache_tokens, expected) in [(0, 0), (10_000, 33)] {
        let config = FakeConfig::llama_server(1).cache_tokens(cache_tokens);
        let fake = FakeUpstream::start(config).await.unwrap();
        let (mut a, mut b) = (
            Conversation::new(&system("a", 20)),
            Conversation::new(&system("b", 20)),
        );
        a.turn(fake.addr(), "one").await;
        b.turn(fake.addr(), "one").await;
        let back = a.turn(fake.addr(), "two").await;
        assert_eq!(cached(&back), expected, "cache_tokens {cache_tokens}");
        fake.shutdown().await;
    }
}

#[tokio::test]
async fn a_shared_system_prompt_is_cached_across_conversations() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let shared = system("s", 40);
    Conversation::new(&shared).turn(fake.addr(), "alpha").await;
    let other = Conversation::new(&shared).turn(fake.addr(), "omega").await;
    assert_eq!(
        cached(&other),
        40,
        "the system prompt, not the other question"
    );
    fake.shutdown().await;
}

#[tokio::test]
async fn clearing_the_cache_is_a_restart() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let mut talk = Conversation::new(&system("s", 20));
    talk.turn(fake.addr(), "one").await;
    fake.clear_prompt_cache();
    assert_eq!(cached(&talk.turn(fake.addr(), "two").await), 0);
    assert!(cached(&talk.turn(fake.addr(), "three").await) > 0);
    // The header does the same for one request, before it runs.
    let clear = [(headers::PROMPT_CACHE, "clear")];
    assert_eq!(
        cached(&talk.turn_with(fake.addr(), "four", &clear).await),
        0
    );
    let body = talk.ask("five", &json!({}));
    let (status, _, refused) = post(
        fake.addr(),
        "/v1/chat/completions",
        &body,
        &[(headers::PROMPT_CACHE, "flush")],
    )
    .await;
    assert_eq!(status, 400, "{refused}");
    fake.shutdown().await;
}

#[tokio::test]
async fn vllm_reports_whole_blocks_only_with_prompt_tokens_details() {
    for details in [false, true] {
        let config = FakeConfig::vllm(2)
            .model("m")
            .prompt_tokens_details(details);
        let fake = FakeUpstream::start(config).await.unwrap();
        let mut talk = Conversation::new(&system("v", 30));
        let first = talk.turn(fake.addr(), "one").await;
        assert!(
            first["usage"].get("prompt_tokens_details").is_none(),
            "none cached yet"
        );
        let second = talk.turn(fake.addr(), "two").await;
        assert_eq!(prompt(&second), 48);
        if details {
            // 43 resent tokens are held; vLLM counts two whole 16-token blocks.
            assert_eq!(cached(&second), 32);
        } else {
            assert!(second["usage"].get("prompt_tokens_details").is_none());
        }
        let (_, _, metrics) = get(fake.addr(), "/metrics").await;
        assert!(
            metrics.contains("vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 32.0"),
            "{metrics}"
        );
        fake.shutdown().await;
    }
}

#[tokio::test]
async fn ollama_counts_only_what_it_evaluated() {
    let fake = FakeUpstream::start(FakeConfig::ollama(1).model("m"))
        .await
        .unwrap();
    let addr = fake.addr();
    let messages = json!([{"role": "user", "content": system("o", 20)}]);
    let body = json!({"model": "m", "messages": messages, "stream": false});
    let (_, _, first) = post(addr, "/api/chat", &body, &[]).await;
    assert_eq!(first["prompt_eval_count"], 20);
    let (_, _, again) = post(addr, "/api/chat", &body, &[]).await;
    assert_eq!(again["prompt_eval_count"], 1, "19 of 20 were cached");
    // Its OpenAI-compatible usage is taken from the same count.
    let body = json!({"model": "m", "messages": messages});
    let (_, _, openai) = post(addr, "/v1/chat/completions", &body, &[]).await;
    assert_eq!(prompt(&openai), 1);
    assert!(openai["usage"].get("prompt_tokens_details").is_none());
    fake.shutdown().await;
}

#[tokio::test]
async fn the_prefill_takes_time_per_uncached_token() {
    let config = FakeConfig::llama_server(1).prefill_per_token(Duration::from_millis(2));
    let fake = FakeUpstream::start(config).await.unwrap();
    let mut talk = Conversation::new(&system("p", 150));
    let started = Instant::now();
    let first = talk.turn(fake.addr(), "one").await;
    // 155 uncached tokens at 2 ms: at least 310 ms (a sleep never ends early).
    assert!(started.elapsed() >= Duration::from_millis(310));
    assert_eq!(first["timings"]["prompt_ms"], 310.0);
    let second = talk.turn(fake.addr(), "two").await;
    assert_eq!(second["timings"]["prompt_ms"], 10.0, "5 uncached tokens");
    fake.shutdown().await;
}

#[tokio::test]
async fn a_test_sized_prompt_scales_the_cached_share_and_off_means_zero() {
    let fake = FakeUpstream::start(FakeConfig::llama_server(1))
        .await
        .unwrap();
    let mut talk = Conversation::new(&system("s", 20));
    let size = [(headers::PROMPT_TOKENS, "3800")];
    talk.turn_with(fake.addr(), "one", &size).await;
    // 33 of 38 words cached: the same share of 3800.
    let second = talk.turn_with(fake.addr(), "two", &size).await;
    assert_eq!((prompt(&second), cached(&second)), (3800, 3300));
    fake.shutdown().await;

    let fake = FakeUpstream::start(FakeConfig::llama_server(1).prompt_cache(false))
        .await
        .unwrap();
    let mut talk = Conversation::new(&system("s", 20));
    talk.turn(fake.addr(), "one").await;
    assert_eq!(cached(&talk.turn(fake.addr(), "two").await), 0);
    fake.shutdown().await;
}
