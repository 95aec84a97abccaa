//! The engines' prompt caches, approximated: what one engine instance still holds of the
//! sequences it ran, and so how many tokens of a new prompt it can skip. The engines report that
//! figure with every answer (llama-server `timings.cache_n` and
//! `usage.prompt_tokens_details.cached_tokens`, from `slot.stats.n_prompt_cached`; vLLM
//! `usage.prompt_tokens_details.cached_tokens` when started with
//! `--enable-prompt-tokens-details`; Ollama by counting only the uncached part in
//! `prompt_eval_count`), which is what a cache-aware router learns from.
//!
//! # The approximation
//!
//! - **Tokens.** A token is a word (whitespace-separated), as everywhere in the fake. Each is
//!   hashed; the first word of each message is hashed together with the message's role, so the
//!   same words under another role do not match. What a slot holds after a request is the
//!   prompt followed by the answer (choice 0), the answer's first word hashed with the role
//!   `assistant` on the chat-shaped routes, so the next turn of a conversation, which resends
//!   that answer as an assistant message, matches it up to the new user message.
//! - **llama-server and Ollama** keep what each slot last ran. A new prompt goes to the idle
//!   slot whose held sequence shares the longest prefix with it, when that prefix is more than
//!   10 % of the prompt (llama-server's default `--slot-prompt-similarity` 0.1), else to the
//!   least recently used idle slot (the lowest index on ties, where llama-server takes the
//!   highest). The cached tokens are the common prefix with that slot.
//! - **llama-server's host-RAM prompt cache** (`--cache-ram`): with
//!   [`FakeConfig::cache_tokens`](crate::FakeConfig::cache_tokens) above 0, a slot's sequence
//!   that a different prompt replaces (keeping less than half of it) is saved there, up to that
//!   many tokens, least recently used dropped first; a new prompt is then cached up to its
//!   longest prefix with the slot or with any saved sequence. Off by default in the fake (the
//!   real default is 8 GiB), so a test sees the slots alone unless it asks.
//! - **vLLM** has no slots in its prefix cache: it keeps the sequences it ran, up to
//!   `cache_tokens` tokens in all (least recently used evicted), and counts hits in whole
//!   blocks of 16 tokens.
//! - Every engine computes at least the prompt's last token: at most `prompt − 1` are cached.
//! - Where a request's `x-fake-prompt-tokens` sets a prompt size other than its word count, the
//!   cached share of the words is reported as the same share of that size.
//!
//! Clearing (a restart, or `x-fake-prompt-cache: clear`) forgets everything.

use std::collections::VecDeque;
use std::sync::Arc;

/// A prompt share a slot must beat to be chosen for its content (`--slot-prompt-similarity`).
const SIMILARITY: f64 = 0.1;

/// vLLM's default KV block size: prefix hits count in whole blocks.
const VLLM_BLOCK: usize = 16;

/// How an engine keeps what it computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Per slot, plus an optional host-RAM store (llama-server, Ollama).
    Slots,
    /// One shared store counted in blocks (vLLM's prefix cache).
    Blocks,
}

/// What an engine's prompt cache looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CacheSpec {
    /// Off: every prompt is computed whole (cached 0), as the fake did before it had a cache.
    pub(crate) enabled: bool,
    pub(crate) layout: Layout,
    /// Tokens kept besides the slots (llama-server `--cache-ram`; vLLM's whole prefix cache).
    pub(crate) store_tokens: usize,
}

impl CacheSpec {
    /// No cache at all.
    #[cfg(test)]
    pub(crate) fn off() -> Self {
        Self {
            enabled: false,
            layout: Layout::Slots,
            store_tokens: 0,
        }
    }
}

/// The fake's token for a word, optionally hashed with the role of the message it opens
/// (FNV-1a: deterministic, and the same in every process).
pub(crate) fn word_token(role: Option<&str>, word: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0100_0000_01b3;
    let mut hash = OFFSET;
    let role_bytes = role.map(str::as_bytes).unwrap_or_default();
    // The separator keeps ("ab", "c") and ("a", "bc") apart.
    for &byte in role_bytes.iter().chain(&[0xff]).chain(word.as_bytes()) {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    hash
}

/// Appends the tokens of `text`, the first one hashed with `role`.
pub(crate) fn push_words(out: &mut Vec<u64>, role: Option<&str>, text: &str) {
    let mut role = role;
    for word in text.split_whitespace() {
        out.push(word_token(role.take(), word));
    }
}

/// The length of the common prefix of two token sequences.
pub(crate) fn common_prefix(a: &[u64], b: &[u64]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// The cached tokens an engine reports for a prompt of `prompt_tokens` (the plan's size) of
/// which `cached` of `words` words were found: the same share, below the whole prompt.
pub(crate) fn reported(cached: usize, words: usize, prompt_tokens: u32) -> u32 {
    if cached == 0 || words == 0 {
        return 0;
    }
    let prompt = u64::from(prompt_tokens);
    let scaled = if words as u64 == prompt {
        cached as u64
    } else {
        cached as u64 * prompt / words as u64
    };
    u32::try_from(scaled.min(prompt.saturating_sub(1))).unwrap_or(u32::MAX)
}

/// A sequence one slot holds, and when it last ran.
#[derive(Clone, Debug, Default)]
struct Held {
    tokens: Arc<[u64]>,
    last_used: u64,
}

/// What one engine instance holds.
#[derive(Debug)]
pub(crate) struct PromptMemory {
    spec: CacheSpec,
    /// Per slot (`Layout::Slots`); grows with a collapsing pool's extra slots.
    slots: Vec<Held>,
    /// The shared store, most recently used first.
    store: VecDeque<Arc<[u64]>>,
    store_len: usize,
    clock: u64,
}

impl PromptMemory {
    pub(crate) fn new(spec: CacheSpec, parallel: usize) -> Self {
        Self {
            spec,
            slots: vec![Held::default(); parallel],
            store: VecDeque::new(),
            store_len: 0,
            clock: 0,
        }
    }

    /// The idle slot a prompt goes to: the one holding the longest prefix of it, when that is
    /// more than [`SIMILARITY`] of the prompt; else the least recently used, lowest index first.
    /// `None` only when no slot is idle.
    pub(crate) fn pick(&self, idle: &[usize], prompt: &[u64]) -> Option<usize> {
        let held = |slot: usize| self.slots.get(slot).cloned().unwrap_or_default();
        if self.spec.enabled && self.spec.layout == Layout::Slots && !prompt.is_empty() {
            #[allow(clippy::cast_precision_loss)] // token counts are far below 2^52
            let best = idle
                .iter()
                .map(|&slot| (slot, common_prefix(&held(slot).tokens, prompt)))
                .filter(|&(_, n)| n as f64 / prompt.len() as f64 > SIMILARITY)
                .max_by_key(|&(slot, n)| (n, std::cmp::Reverse(slot)));
            if let Some((slot, _)) = best {
                return Some(slot);
            }
        }
        idle.iter()
            .copied()
            .min_by_key(|&slot| (held(slot).last_used, slot))
    }

    /// Runs `prompt` on `slot`: returns how many of its tokens were cached, then remembers the
    /// prompt followed by `answer` as what the slot (or the shared store) now holds.
    pub(crate) fn run(&mut self, slot: usize, prompt: &[u64], answer: &[u64]) -> usize {
        if !self.spec.enabled || prompt.is_empty() {
            return 0;
        }
        self.clock += 1;
        if self.slots.len() <= slot {
            self.slots.resize(slot + 1, Held::default());
        }
        let in_slot = match self.spec.layout {
            Layout::Slots => common_prefix(&self.slots[slot].tokens, prompt),
            Layout::Blocks => 0,
        };
        let in_store = self.touch_best(prompt);
        let mut cached = in_slot.max(in_store).min(prompt.len() - 1);
        if self.spec.layout == Layout::Blocks {
            cached -= cached % VLLM_BLOCK;
        }
        let sequence: Arc<[u64]> = prompt.iter().chain(answer).copied().collect();
        match self.spec.layout {
            Layout::Slots => {
                let replaced = std::mem::replace(
                    &mut self.slots[slot],
                    Held {
                        tokens: sequence,
                        last_used: self.clock,
                    },
                );
                // llama-server saves a slot's prompt when the new one keeps less than half of it.
                if common_prefix(&replaced.tokens, prompt) * 2 < replaced.tokens.len() {
                    self.save(replaced.tokens);
                }
            }
            Layout::Blocks => self.save(sequence),
        }
        cached
    }

    /// The longest prefix of `prompt` in the shared store; the entry that has it becomes the
    /// most recently used.
    fn touch_best(&mut self, prompt: &[u64]) -> usize {
        let best = self
            .store
            .iter()
            .enumerate()
            .map(|(i, held)| (i, common_prefix(held, prompt)))
            .max_by_key(|&(i, n)| (n, std::cmp::Reverse(i)));
        match best {
            Some((i, n)) if n > 0 => {
                if let Some(entry) = self.store.remove(i) {
                    self.store.push_front(entry);
                }
                n
            }
            _ => 0,
        }
    }

    /// Keeps `tokens` in the shared store, most recent first, dropping what it makes redundant
    /// (its own prefixes) and then the least recently used past the budget.
    fn save(&mut self, tokens: Arc<[u64]>) {
        if tokens.is_empty() || tokens.len() > self.spec.store_tokens {
            return;
        }
        let before = self.store.len();
        self.store
            .retain(|held| common_prefix(held, &tokens) < held.len());
        if self.store.len() != before {
            self.store_len = self.store.iter().map(|held| held.len()).sum();
        }
        self.store_len += tokens.len();
        self.store.push_front(tokens);
        while self.store_len > self.spec.store_tokens {
            let Some(dropped) = self.store.pop_back() else {
                break;
            };
            self.store_len -= dropped.len();
        }
    }

    /// Forgets everything, as a restarted engine would.
    pub(crate) fn clear(&mut self) {
        let parallel = self.slots.len();
        *self = Self::new(self.spec, parallel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(text: &str) -> Vec<u64> {
        let mut out = Vec::new();
        push_words(&mut out, None, text);
        out
    }

    fn slots(store_tokens: usize) -> PromptMemory {
        let spec = CacheSpec {
            enabled: true,
            layout: Layout::Slots,
            store_tokens,
        };
        PromptMemory::new(spec, 2)
    }

    #[test]
    fn roles_and_words_make_distinct_tokens() {
        assert_eq!(word_token(None, "a"), word_token(None, "a"));
        assert_ne!(word_token(Some("user"), "a"), word_token(None, "a"));
        assert_ne!(word_token(Some("ab"), "c"), word_token(Some("a"), "bc"));
        let mut out = Vec::new();
        push_words(&mut out, Some("system"), "  one two\nthree ");
        assert_eq!(out.len(), 3);
        assert_eq!(out[1..], words("two three")[..]);
    }

    #[test]
    fn a_slot_caches_its_longest_prefix_but_never_the_last_token() {
        let mut memory = slots(0);
        let first = words("a b c d");
        assert_eq!(memory.run(0, &first, &words("x y")), 0);
        // The next turn resends prompt and answer, plus more.
        assert_eq!(memory.run(0, &words("a b c d x y e f"), &[]), 6);
        // The same prompt again: all but the last token.
        assert_eq!(memory.run(0, &words("a b c d x y e f"), &[]), 7);
        // A slot that never ran this prompt has nothing.
        assert_eq!(memory.run(1, &words("a b c d x y e f"), &[]), 0);
    }

    #[test]
    fn the_best_matching_idle_slot_wins_else_the_least_recently_used() {
        let mut memory = slots(0);
        memory.run(0, &words("a b c d e f g h i j"), &[]);
        memory.run(1, &words("k l m n o p q r s t"), &[]);
        assert_eq!(
            memory.pick(&[0, 1], &words("k l m n o p q r s t u")),
            Some(1)
        );
        assert_eq!(memory.pick(&[0], &words("k l m n o p q r s t u")), Some(0));
        // One word of ten is not more than 10 %: the least recently used slot (0) is taken.
        assert_eq!(memory.pick(&[0, 1], &words("k x x x x x x x x x")), Some(0));
        assert_eq!(memory.pick(&[], &words("a")), None);
        let fresh = slots(0);
        assert_eq!(
            fresh.pick(&[0, 1], &words("a")),
            Some(0),
            "lowest index on ties"
        );
    }

    #[test]
    fn the_ram_store_keeps_replaced_prompts_within_its_budget() {
        let mut without = slots(0);
        let mut with = slots(8);
        for memory in [&mut without, &mut with] {
            memory.run(0, &words("a b c d e"), &[]);
            memory.run(0, &words("v w x y z"), &[]);
        }
        assert_eq!(without.run(1, &words("a b c d e f"), &[]), 0);
        assert_eq!(with.run(1, &words("a b c d e f"), &[]), 5);
        // A prompt longer than the whole budget is never stored.
        let mut small = slots(3);
        small.run(0, &words("a b c d e"), &[]);
        small.run(0, &words("v w x y z"), &[]);
        assert_eq!(small.run(1, &words("a b c d e f"), &[]), 0);
    }

    #[test]
    fn vllm_counts_whole_blocks_from_its_shared_store() {
        let spec = CacheSpec {
            enabled: true,
            layout: Layout::Blocks,
            store_tokens: 1000,
        };
        let mut memory = PromptMemory::new(spec, 1);
        let long: Vec<u64> = (0..40).collect();
        assert_eq!(memory.run(0, &long, &[]), 0);
        let mut longer = long.clone();
        longer.extend(100..110);
        assert_eq!(
            memory.run(0, &longer, &[]),
            32,
            "40 cached, two whole blocks"
        );
        assert_eq!(
            memory.store.len(),
            1,
            "the prefix made redundant is dropped"
        );
    }

    #[test]
    fn a_store_evicts_the_least_recently_used_past_its_budget() {
        let spec = CacheSpec {
            enabled: true,
            layout: Layout::Blocks,
            store_tokens: 40,
        };
        let mut memory = PromptMemory::new(spec, 1);
        let a: Vec<u64> = (0..20).collect();
        let b: Vec<u64> = (100..120).collect();
        let c: Vec<u64> = (200..220).collect();
        memory.run(0, &a, &[]);
        memory.run(0, &b, &[]);
        memory.run(0, &c, &[]);
        assert_eq!(memory.store_len, 40);
        assert_eq!(memory.run(0, &a, &[]), 0, "a was evicted");
        assert_eq!(memory.run(0, &c, &[]), 16);
    }

    #[test]
    fn clearing_forgets_and_disabled_caches_nothing() {
        let mut memory = slots(100);
        memory.run(0, &words("a b c"), &[]);
        memory.clear();
        assert_eq!(memory.run(0, &words("a b c d"), &[]), 0);
        let spec = CacheSpec {
            enabled: false,
            layout: Layout::Slots,
            store_tokens: 100,
        };
        let mut off = PromptMemory::new(spec, 1);
        off.run(0, &words("a b c"), &[]);
        assert_eq!(off.run(0, &words("a b c d"), &[]), 0);
    }

    #[test]
    fn reported_scales_to_the_plans_prompt_size() {
        assert_eq!(reported(6, 8, 8), 6);
        assert_eq!(reported(8, 8, 8), 7, "never the whole prompt");
        assert_eq!(reported(5, 10, 100), 50);
        assert_eq!(reported(0, 10, 100), 0);
        assert_eq!(reported(3, 0, 100), 0);
        assert_eq!(reported(1, 1, 1), 0);
    }
}
