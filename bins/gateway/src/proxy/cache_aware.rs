//! Cache-aware routing: a conversation's next request goes to the host whose engine holds its
//! prompt prefix in its KV cache, while that costs less than the prefill it saves; the engines'
//! own reports of what they reused correct what the gateway believes they hold.
//!
//! Three steps of a request call in here:
//!
//! 1. **Place** ([`CacheAware::place`], step 5 before the first queue is joined): the
//!    request's prompt ([`Prompt`](crate::proxy::request::Prompt)) becomes a chain of block hashes
//!    ([`slotgate_choose::PrefixBuilder`]), the index ([`slotgate_choose::Holdings`]) says which host
//!    holds the longest prefix of it, and the load-bounded rule ([`slotgate_choose::prefer`]) may
//!    move that host to the front of the chooser's order. A request with no useful match keeps
//!    the chooser's order exactly.
//! 2. **Sent** ([`CacheAware::sent`], when the engine accepted it): the chain is recorded for
//!    the host it went to, the choice counted, and a [`Feedback`] rides with the answer.
//! 3. **Reported** ([`Feedback::end`], when the answer ends): the engine's cached prompt tokens
//!    are compared with what the index predicted; a host that reports far fewer lost what it was
//!    sent (it restarted, evicted, or swapped the model), and the index forgets what it was sent
//!    until then. The engine's prefill time (llama-server's `timings`, else a stream's first
//!    token) also measures the host's prefill speed, which prices a detour.
//!
//! # The affinity key
//!
//! The chain's seed is the gateway's secret (random per process) and the model, so that the
//! same prompt on another model is another cache. Then, from the first thing that is present:
//!
//! - a **session header** (`session_headers`, by default `x-session-id`, `x-session-affinity`,
//!   `x-claude-code-session-id`, `session_id`): the chain begins with an element of its own, so
//!   every request of the session matches its host, whatever its prompt;
//! - the request's **user** (`user`, else `metadata.user_id`): mixed into the seed, never used
//!   alone. Two users' prompts never match each other (a popular prompt cannot draw every
//!   user to one host), and one user's conversations are still told apart by their prompts;
//! - the **prompt** itself, always: the chain covers it block by block.
//!
//! A Responses follow-up (`previous_response_id`) is not placed here: it must go to the host
//! that stored the conversation ([`affinity`](crate::proxy::affinity)), and its `input` holds
//! the new turn only.
//!
//! # Under `[cluster]`
//!
//! Each replica keeps its own index (`docs/scale-out.md`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::HeaderMap;
use parking_lot::Mutex;
use slotgate_choose::{Holdings, HostId, HostSet, Limits, Prefix, PrefixBuilder, Stamp, Standing};
use slotgate_config::CacheAffinity;

use crate::proxy::endpoint::{Carries, Endpoint};
use crate::proxy::request::ApiRequest;
use crate::proxy::request::prompt::{self, Placement, Shape};
use crate::proxy::route::Route;
use crate::upstreams::hold::HoldStats;
use crate::upstreams::target::Target;

/// The most blocks hashed per request: about 1 MiB of text at the default block size (more
/// where blocks grow inside long messages, less where many messages end in short blocks). A
/// longer prompt is routed by its beginning.
const MAX_BLOCKS: usize = 2048;

/// A prediction below this many tokens is not checked against the engine's report: too small
/// to tell an eviction from the engine's own rounding (llama-server reuses whole batches).
const MIN_CHECKED_TOKENS: u64 = 64;

/// The prefill speed is measured over at least this much uncached text, in bytes.
const MIN_MEASURED_BYTES: usize = 1024;

/// The cache-aware router of one gateway; see the [module docs](self).
#[derive(Debug)]
pub(crate) struct CacheAware {
    enabled: bool,
    block_bytes: usize,
    session_headers: Vec<http::HeaderName>,
    /// The chains' seed: hashes nobody outside can aim at.
    secret: u64,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    index: Holdings,
    /// The upstream authority each [`HostId`] stands for, by its number.
    hosts: Vec<String>,
}

/// The rest of the loop, riding with one answer: what the index predicted the host held.
#[derive(Debug)]
pub(crate) struct Feedback {
    cache: Arc<CacheAware>,
    /// `None` for a host past the index's reach: nothing was recorded, nothing is corrected.
    host: Option<HostId>,
    /// When the prefix the host was believed to hold was last sent anywhere.
    stamp: Option<Stamp>,
    /// The request's chain, recorded again after a correction (which may clear what was
    /// recorded in the same second).
    chain: Vec<u64>,
    predicted_bytes: usize,
    total_bytes: usize,
    /// The target's prefill time per KiB of uncached prompt.
    prefill: Arc<HoldStats>,
}

impl CacheAware {
    /// The router for `settings`, its clock starting at `now`.
    pub(crate) fn new(settings: &CacheAffinity, now: Instant) -> Self {
        let limits = Limits {
            entries: settings.entries,
            ttl: settings.ttl,
        };
        Self {
            enabled: settings.enabled,
            block_bytes: settings.block_bytes,
            session_headers: settings
                .session_headers
                .iter()
                .filter_map(|name| http::HeaderName::try_from(name.as_str()).ok())
                .collect(),
            secret: random_seed(),
            state: Mutex::new(State {
                index: Holdings::new(limits, now),
                hosts: Vec::new(),
            }),
        }
    }

    /// Orders `ranked` (the chooser's order for `api`) by what the hosts hold of its prompt;
    /// `None` when the request has no affinity key (the route carries no prompt, affinity is off
    /// for it, a Responses follow-up) and the order is untouched.
    pub(crate) fn place(
        &self,
        ranked: &mut [&Arc<Target>],
        api: &ApiRequest,
        route: &Route,
        endpoint: &Endpoint,
    ) -> Option<Placement> {
        if !self.enabled
            || !route.affinity
            || endpoint.carries == Carries::Nothing
            || api.previous_response_id.is_some()
        {
            return None;
        }
        let prefix = self.prefix(api, &route.model);
        if prefix.is_empty() {
            return None;
        }
        // The longest useful match among the targets, and the first of them (in `ranked`'s
        // order) that holds it. The ids are looked up twice rather than kept: a list per request
        // cost more than a second pass over a few names.
        let (useful, holder) = {
            let mut state = self.state.lock();
            let among: HostSet = ranked
                .iter()
                .filter_map(|target| state.id(&target.upstream.authority))
                .collect();
            let useful = state
                .index
                .longest(prefix.hashes(), among, Instant::now())
                .filter(|longest| slotgate_choose::is_useful(longest, &prefix, self.block_bytes));
            let holder = useful.and_then(|longest| {
                ranked.iter().position(|target| {
                    state
                        .id(&target.upstream.authority)
                        .is_some_and(|id| longest.hosts.contains(id))
                })
            });
            (useful, holder)
        };
        // What a host without the prefix would spend on it: the chooser's first's prefill.
        let saved = useful.map_or(Duration::ZERO, |longest| {
            saved_prefill(ranked[0], prefix.bytes_through(longest.elements))
        });
        let verdict =
            slotgate_choose::prefer(ranked, holder, api.sequences, saved, |t| standing(t));
        Some(Placement { prefix, verdict })
    }

    /// Records that `placement`'s request was sent to `target` (whose engine accepted it) and
    /// counts how it was placed; the [`Feedback`] to give the answer's end.
    pub(crate) fn sent(self: &Arc<Self>, target: &Target, placement: &Placement) -> Feedback {
        target.metrics.affinity(placement.verdict);
        let mut state = self.state.lock();
        let host = state.id(&target.upstream.authority);
        let prior = host.map(|host| {
            state
                .index
                .record(placement.prefix.hashes(), host, Instant::now())
        });
        drop(state);
        let prior = prior.unwrap_or_default();
        Feedback {
            cache: Arc::clone(self),
            host,
            stamp: prior.stamp,
            chain: placement.prefix.hashes().to_vec(),
            predicted_bytes: placement.prefix.bytes_through(prior.elements),
            total_bytes: placement.prefix.total_bytes(),
            prefill: Arc::clone(&target.prefill),
        }
    }

    /// The chain of `api`'s prompt for `model` (see the [module docs](self#the-affinity-key)).
    fn prefix(&self, api: &ApiRequest, model: &str) -> Prefix {
        let body = &api.body[..];
        let mut builder = PrefixBuilder::new(self.block_bytes, MAX_BLOCKS, self.secret);
        // Room for the whole chain at once (a Responses `input` array's elements beyond it
        // grow the chain as usual); the session element is one more segment.
        let pieces = &api.prompt.pieces;
        let text = pieces.iter().map(|(range, _)| range.len()).sum();
        builder.reserve(text, pieces.len() + 1);
        builder.salt(model.as_bytes());
        if let Some(user) = &api.prompt.user {
            builder.salt(b"user");
            builder.salt(&body[user.clone()]);
        }
        if let Some(session) = session(&api.parts.headers, &self.session_headers) {
            builder.pin(session);
        }
        for (range, shape) in &api.prompt.pieces {
            let piece = &body[range.clone()];
            match shape {
                Shape::Message => builder.message(piece),
                Shape::Text => builder.text(piece),
                Shape::Elements => {
                    for element in prompt::elements(body, piece) {
                        builder.message(&body[element]);
                    }
                }
            }
        }
        builder.finish()
    }

    /// Forgets what `host` was sent until `stamp` (it reported holding less), except `chain`,
    /// which it has just computed.
    fn correct(&self, host: HostId, stamp: Stamp, chain: &[u64]) {
        let mut state = self.state.lock();
        state.index.forget_until(host, stamp);
        state.index.record(chain, host, Instant::now());
    }
}

impl State {
    /// The id of the host at `authority`, given one at first sight; `None` once
    /// [`slotgate_choose::MAX_HOSTS`] authorities have ids (ids are never reused: a reload that
    /// moves upstreams to new addresses uses up new ones).
    fn id(&mut self, authority: &str) -> Option<HostId> {
        if let Some(at) = self.hosts.iter().position(|known| known == authority) {
            return HostId::new(at);
        }
        let id = HostId::new(self.hosts.len())?;
        self.hosts.push(authority.to_owned());
        Some(id)
    }
}

impl Feedback {
    /// The answer ended with the engine's `report`. Returns the cached tokens the index
    /// predicted, for the access log.
    pub(crate) fn end(&self, report: &Report) -> Option<u64> {
        let prompt = report.prompt?;
        let predicted = self.share(prompt, self.predicted_bytes);
        if let Some(cached) = report.cached
            && predicted >= MIN_CHECKED_TOKENS
            && cached < predicted / 2
            && let (Some(host), Some(stamp)) = (self.host, self.stamp)
        {
            self.cache.correct(host, stamp, &self.chain);
        }
        self.measure_prefill(prompt, report);
        Some(predicted)
    }

    /// Records the host's prefill time per KiB of uncached prompt text: llama-server's own
    /// `timings` (`prompt_ms` over `prompt_n` processed tokens) when it sent them, else a
    /// stream's time to first token over the tokens not cached.
    fn measure_prefill(&self, prompt: u64, report: &Report) {
        let (time, processed) = match (report.prefill, report.processed, report.ttft) {
            (Some(time), Some(processed), _) => (time, processed),
            (_, _, Some(ttft)) => (ttft, prompt - report.cached.unwrap_or(0).min(prompt)),
            _ => return,
        };
        let uncached = usize::try_from(self.share_bytes(prompt, processed)).unwrap_or(usize::MAX);
        if uncached >= MIN_MEASURED_BYTES {
            #[expect(
                clippy::cast_precision_loss,
                reason = "prompt sizes are far below 2^52"
            )]
            let per_kib = time.as_secs_f64() * 1024.0 / uncached as f64;
            self.prefill.record(Duration::from_secs_f64(per_kib));
        }
    }

    /// `prompt` tokens × `bytes` / the prompt's bytes: the tokens in `bytes` of its text.
    fn share(&self, prompt: u64, bytes: usize) -> u64 {
        if self.total_bytes == 0 {
            return 0;
        }
        let tokens = u128::from(prompt) * bytes as u128 / self.total_bytes as u128;
        u64::try_from(tokens).unwrap_or(u64::MAX)
    }

    /// The bytes of text in `tokens` of `prompt` tokens.
    fn share_bytes(&self, prompt: u64, tokens: u64) -> u64 {
        if prompt == 0 {
            return 0;
        }
        let bytes = u128::from(tokens.min(prompt)) * self.total_bytes as u128 / u128::from(prompt);
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }
}

/// What an engine reported at the end of its answer, as far as cache-aware routing cares.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Report {
    /// Prompt tokens.
    pub(crate) prompt: Option<u64>,
    /// Of them, taken from its cache.
    pub(crate) cached: Option<u64>,
    /// llama-server's `timings.prompt_ms`: the time its prefill took.
    pub(crate) prefill: Option<Duration>,
    /// llama-server's `timings.prompt_n`: the prompt tokens it computed.
    pub(crate) processed: Option<u64>,
    /// A stream's time to its first token (a whole answer's first byte comes after its
    /// decode, so it is not one).
    pub(crate) ttft: Option<Duration>,
}

/// The first of `names` present in `headers` with a value, as its bytes (a name's first value
/// counts, as `HeaderMap::get` gives it).
///
/// One pass over the request's headers, comparing names, rather than a hashed lookup per
/// configured name: a request has a few headers, and this runs for every request placed (the
/// four default names cost some 600 instructions a request as lookups, issue #30's profile).
fn session<'h>(headers: &'h HeaderMap, names: &[http::HeaderName]) -> Option<&'h [u8]> {
    if names.len() > 64 {
        // Past what the bit set below tells apart; never so many in practice.
        return names
            .iter()
            .filter_map(|name| headers.get(name))
            .map(http::HeaderValue::as_bytes)
            .find(|value| !value.is_empty());
    }
    let mut seen = 0_u64;
    let mut best: Option<(usize, &'h [u8])> = None;
    for (name, value) in headers {
        let Some(at) = names.iter().position(|wanted| wanted == name) else {
            continue;
        };
        // A name's values come one after another, its first one first.
        let first = seen & (1 << at) == 0;
        seen |= 1 << at;
        if first && !value.is_empty() && best.is_none_or(|(taken, _)| at < taken) {
            best = Some((at, value.as_bytes()));
        }
    }
    best.map(|(_, value)| value)
}

/// What the rule knows about `target` now.
fn standing(target: &Target) -> Standing {
    let info = target.info();
    let reading = target.reading();
    let slots = target.slots(&reading).unwrap_or(usize::MAX);
    Standing {
        free: info.free,
        queued: info.queued,
        loaded: info.loaded,
        wait: target.hold.eta(info.queued, slots, target.load_cost()),
    }
}

/// The prefill of `bytes` of text on `target`, at its measured speed; zero before a
/// measurement (a detour is then taken only when it costs no wait).
fn saved_prefill(target: &Target, bytes: usize) -> Duration {
    target.prefill.typical().map_or(Duration::ZERO, |per_kib| {
        #[expect(
            clippy::cast_precision_loss,
            reason = "prompt sizes are far below 2^52"
        )]
        let kib = bytes as f64 / 1024.0;
        Duration::from_secs_f64((per_kib.as_secs_f64() * kib).min(3600.0))
    })
}

/// A random seed from the standard library's per-process random keys.
fn random_seed() -> u64 {
    use std::hash::BuildHasher as _;
    std::collections::hash_map::RandomState::new().hash_one(0x5107_6a7e_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A [`Feedback`] for a prompt of `total_bytes` of text of which the index predicted
    /// `predicted_bytes`, on a host never corrected (no stamp).
    fn feedback(total_bytes: usize, predicted_bytes: usize) -> Feedback {
        Feedback {
            cache: Arc::new(CacheAware::new(&CacheAffinity::default(), Instant::now())),
            host: None,
            stamp: None,
            chain: Vec::new(),
            predicted_bytes,
            total_bytes,
            prefill: Arc::default(),
        }
    }

    fn ms(ms: f64) -> Duration {
        Duration::from_secs_f64(ms / 1000.0)
    }

    fn close(measured: Option<Duration>, expected: Duration) -> bool {
        measured.is_some_and(|m| m.abs_diff(expected) < Duration::from_micros(1))
    }

    #[test]
    fn the_first_configured_session_header_with_a_value_wins() {
        let names: Vec<http::HeaderName> = ["x-session-id", "x-session-affinity", "session_id"]
            .iter()
            .map(|name| http::HeaderName::from_static(name))
            .collect();
        let headers = |pairs: &[(&'static str, &'static str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.append(*name, http::HeaderValue::from_static(value));
            }
            map
        };
        assert_eq!(session(&headers(&[("host", "a")]), &names), None);
        // The list's order wins over the request's.
        let both = headers(&[("session_id", "s"), ("x-session-affinity", "a")]);
        assert_eq!(session(&both, &names), Some(&b"a"[..]));
        // An empty value is skipped, and so is a name whose first value is empty.
        let empty = headers(&[
            ("x-session-id", ""),
            ("x-session-id", "late"),
            ("session_id", "s"),
        ]);
        assert_eq!(session(&empty, &names), Some(&b"s"[..]));
        assert_eq!(
            session(
                &headers(&[("x-session-id", "1"), ("x-session-id", "2")]),
                &names
            ),
            Some(&b"1"[..])
        );
        assert_eq!(session(&both, &[]), None);
    }

    #[test]
    fn engine_timings_price_the_prefill_over_what_it_computed() {
        // 1,000 tokens in 4,000 bytes; the engine computed 500 of them (2,000 bytes) in 100 ms,
        // and the stream's first token came later still (queueing, network): the engine's own
        // figure wins.
        let fb = feedback(4000, 0);
        let report = Report {
            prompt: Some(1000),
            cached: Some(500),
            prefill: Some(ms(100.0)),
            processed: Some(500),
            ttft: Some(ms(900.0)),
        };
        assert_eq!(fb.end(&report), Some(0));
        assert!(close(fb.prefill.typical(), ms(100.0 * 1024.0 / 2000.0)));
    }

    #[test]
    fn a_streams_first_token_prices_it_without_timings() {
        // No timings (vLLM, a proxy): the time to first token over the 2,000 uncached bytes.
        let fb = feedback(4000, 2000);
        let report = Report {
            prompt: Some(1000),
            cached: Some(500),
            ttft: Some(ms(200.0)),
            ..Report::default()
        };
        assert_eq!(fb.end(&report), Some(500));
        assert!(close(fb.prefill.typical(), ms(200.0 * 1024.0 / 2000.0)));
        // No cached count: the whole prompt counts as computed.
        let fb = feedback(4000, 0);
        let report = Report {
            prompt: Some(1000),
            ttft: Some(ms(400.0)),
            ..Report::default()
        };
        fb.end(&report);
        assert!(close(fb.prefill.typical(), ms(400.0 * 1024.0 / 4000.0)));
    }

    #[test]
    fn nothing_measured_without_a_time_or_over_too_little_text() {
        // A whole answer without timings: its first byte came after the decode.
        let fb = feedback(4000, 0);
        fb.end(&Report {
            prompt: Some(1000),
            cached: Some(0),
            ..Report::default()
        });
        assert_eq!(fb.prefill.typical(), None);
        // The engine computed 200 tokens (800 bytes), under MIN_MEASURED_BYTES: rounding
        // and fixed costs would swamp it.
        fb.end(&Report {
            prompt: Some(1000),
            cached: Some(800),
            prefill: Some(ms(10.0)),
            processed: Some(200),
            ttft: None,
        });
        assert_eq!(fb.prefill.typical(), None);
        // Timings without the processed count fall back to the stream's first token.
        fb.end(&Report {
            prompt: Some(1000),
            cached: Some(0),
            prefill: Some(ms(10.0)),
            processed: None,
            ttft: Some(ms(300.0)),
        });
        assert!(close(fb.prefill.typical(), ms(300.0 * 1024.0 / 4000.0)));
        // No prompt count: nothing at all.
        let fb = feedback(4000, 0);
        assert_eq!(fb.end(&Report::default()), None);
        assert_eq!(fb.prefill.typical(), None);
    }
}
