//! Per-request control: the `x-fake-*` headers that let one fake serve many scenarios, and the
//! [`Plan`] they add up to together with the server's defaults and the request body.

use std::time::Duration;

use http::HeaderMap;

use crate::config::Pacing;
use crate::failure::{Failure, FailurePlan, parse_failures};

/// The request headers the fake understands. All are optional; each overrides the server's
/// configuration for this one request.
pub mod headers {
    /// Completion tokens to generate (an integer). Wins over the server's `tokens` and over the
    /// body's `max_tokens`.
    pub const TOKENS: &str = "x-fake-tokens";
    /// Total generation time in milliseconds, spread over the tokens.
    pub const HOLD_MS: &str = "x-fake-hold-ms";
    /// Tokens per second (a decimal number).
    pub const TPS: &str = "x-fake-tps";
    /// Gap between two streamed tokens in milliseconds.
    pub const CHUNK_INTERVAL_MS: &str = "x-fake-chunk-interval-ms";
    /// Failures to inject, comma-separated (`status-500`, `hang`, `die-after-chunks=N`,
    /// `error-after-chunks=N`, `slow-first-byte-ms=N`); `none` switches the server's default
    /// failures off for this request.
    pub const FAIL: &str = "x-fake-fail";
    /// Prompt size in tokens, instead of the word count of the prompt; used for usage and for
    /// the context-size check.
    pub const PROMPT_TOKENS: &str = "x-fake-prompt-tokens";
    /// `clear`: the engine forgets its prompt cache before this request, as a restart would
    /// (any other value is a 400).
    pub const PROMPT_CACHE: &str = "x-fake-prompt-cache";
    /// The request id the observer records (and the fake echoes back). Generated when absent.
    pub const REQUEST_ID: &str = "x-request-id";
}

/// What the headers of one request ask for.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Overrides {
    pub(crate) tokens: Option<u32>,
    pub(crate) pacing: Option<Pacing>,
    pub(crate) failures: Option<Vec<Failure>>,
    pub(crate) prompt_tokens: Option<u32>,
    pub(crate) clear_cache: bool,
}

impl Overrides {
    /// Reads the `x-fake-*` headers. A header that is present but malformed is an error, so a
    /// typo in a test fails loudly instead of silently running the default scenario.
    pub(crate) fn from_headers(headers: &HeaderMap) -> Result<Self, String> {
        let text = |name: &str| -> Result<Option<&str>, String> {
            headers
                .get(name)
                .map(|v| v.to_str().map_err(|_| format!("{name}: not ASCII")))
                .transpose()
        };
        let number = |name: &str| -> Result<Option<u64>, String> {
            text(name)?
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| format!("{name}: {v:?} is not a whole number"))
                })
                .transpose()
        };
        let clamp_u32 = |n: u64| u32::try_from(n).unwrap_or(u32::MAX);

        // When several pacing headers are sent, the most specific one wins.
        let interval = number(headers::CHUNK_INTERVAL_MS)?;
        let tps = text(headers::TPS)?
            .map(|v| {
                v.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("{}: {v:?} is not a number", headers::TPS))
            })
            .transpose()?;
        let hold = number(headers::HOLD_MS)?;
        let pacing = match (interval, tps, hold) {
            (Some(ms), _, _) => Some(Pacing::ChunkInterval(Duration::from_millis(ms))),
            (None, Some(tps), _) => Some(Pacing::TokensPerSecond(tps)),
            (None, None, Some(ms)) => Some(Pacing::Hold(Duration::from_millis(ms))),
            (None, None, None) => None,
        };
        let failures = text(headers::FAIL)?
            .map(|v| parse_failures(v).map_err(|e| format!("{}: {e}", headers::FAIL)))
            .transpose()?;
        let clear_cache = match text(headers::PROMPT_CACHE)?.map(str::trim) {
            None => false,
            Some("clear") => true,
            Some(other) => {
                return Err(format!(
                    "{}: {other:?} is not \"clear\"",
                    headers::PROMPT_CACHE
                ));
            }
        };
        Ok(Self {
            tokens: number(headers::TOKENS)?.map(clamp_u32),
            pacing,
            failures,
            prompt_tokens: number(headers::PROMPT_TOKENS)?.map(clamp_u32),
            clear_cache,
        })
    }
}

/// Everything the fake needs to know to answer one inference request.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Plan {
    /// Completion tokens to send.
    pub(crate) tokens: u32,
    /// `stop`, or `length` when `max_tokens` cut the answer short.
    pub(crate) finish_reason: &'static str,
    /// Gap between two tokens.
    pub(crate) interval: Duration,
    /// Prompt size, for `usage` and the context check.
    pub(crate) prompt_tokens: u32,
    /// Of those, the tokens the engine found in its prompt cache (known once a slot is taken).
    pub(crate) cached_tokens: u32,
    /// The time the engine takes on the uncached part before the first token.
    pub(crate) prefill: Duration,
    /// Forget the prompt cache before this request (`x-fake-prompt-cache: clear`).
    pub(crate) clear_cache: bool,
    /// The failures that apply, as given (recorded by the observer).
    pub(crate) failure_list: Vec<Failure>,
    /// The same failures, folded.
    pub(crate) failures: FailurePlan,
}

impl Plan {
    /// Combines server defaults, request headers and the body's `max_tokens`.
    pub(crate) fn new(
        default_tokens: u32,
        default_pacing: Pacing,
        default_failures: &[Failure],
        overrides: Overrides,
        max_tokens: Option<u32>,
        counted_prompt_tokens: u32,
    ) -> Self {
        // An explicit x-fake-tokens is the test's word; otherwise the client's max_tokens caps the
        // server's default the way a real server stops at the limit with finish_reason "length".
        let (tokens, finish_reason) = match (overrides.tokens, max_tokens) {
            (Some(n), _) => (n, "stop"),
            (None, Some(max)) if max < default_tokens => (max, "length"),
            (None, _) => (default_tokens, "stop"),
        };
        let pacing = overrides.pacing.unwrap_or(default_pacing);
        let failure_list = overrides
            .failures
            .unwrap_or_else(|| default_failures.to_vec());
        Self {
            tokens,
            finish_reason,
            interval: pacing.interval(tokens),
            prompt_tokens: overrides.prompt_tokens.unwrap_or(counted_prompt_tokens),
            cached_tokens: 0,
            prefill: Duration::ZERO,
            clear_cache: overrides.clear_cache,
            failures: FailurePlan::from_list(&failure_list),
            failure_list,
        }
    }

    /// Records what the engine found in its cache, and so how long its prefill takes.
    pub(crate) fn set_cached(&mut self, cached_tokens: u32, per_token: Duration) {
        self.cached_tokens = cached_tokens.min(self.prompt_tokens);
        self.prefill = per_token * (self.prompt_tokens - self.cached_tokens);
    }

    /// Prompt tokens the engine computed (the uncached part).
    pub(crate) fn processed_tokens(&self) -> u32 {
        self.prompt_tokens - self.cached_tokens
    }

    /// How long the whole generation takes.
    pub(crate) fn total(&self) -> Duration {
        self.interval * self.tokens
    }
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (k, v) in pairs {
            map.insert(*k, HeaderValue::from_static(v));
        }
        map
    }

    #[test]
    fn no_headers_no_overrides() {
        assert_eq!(
            Overrides::from_headers(&HeaderMap::new()),
            Ok(Overrides::default())
        );
    }

    #[test]
    fn most_specific_pacing_wins() {
        let o = Overrides::from_headers(&headers(&[
            (headers::HOLD_MS, "1000"),
            (headers::TPS, "10"),
        ]))
        .unwrap();
        assert_eq!(o.pacing, Some(Pacing::TokensPerSecond(10.0)));
        let o = Overrides::from_headers(&headers(&[
            (headers::TPS, "10"),
            (headers::CHUNK_INTERVAL_MS, "7"),
        ]))
        .unwrap();
        assert_eq!(
            o.pacing,
            Some(Pacing::ChunkInterval(Duration::from_millis(7)))
        );
    }

    #[test]
    fn malformed_headers_are_errors() {
        assert!(Overrides::from_headers(&headers(&[(headers::TOKENS, "many")])).is_err());
        assert!(Overrides::from_headers(&headers(&[(headers::FAIL, "explode")])).is_err());
        assert!(Overrides::from_headers(&headers(&[(headers::TPS, "fast")])).is_err());
        assert!(Overrides::from_headers(&headers(&[(headers::PROMPT_CACHE, "flush")])).is_err());
        let clear = Overrides::from_headers(&headers(&[(headers::PROMPT_CACHE, "clear")]));
        assert!(clear.unwrap().clear_cache);
    }

    #[test]
    fn plan_respects_max_tokens_and_overrides() {
        let plan = Plan::new(8, Pacing::Instant, &[], Overrides::default(), Some(3), 5);
        assert_eq!((plan.tokens, plan.finish_reason), (3, "length"));
        let plan = Plan::new(8, Pacing::Instant, &[], Overrides::default(), Some(30), 5);
        assert_eq!((plan.tokens, plan.finish_reason), (8, "stop"));
        let o = Overrides {
            tokens: Some(20),
            ..Overrides::default()
        };
        let plan = Plan::new(8, Pacing::Instant, &[], o, Some(3), 5);
        assert_eq!((plan.tokens, plan.finish_reason), (20, "stop"));
    }

    #[test]
    fn cached_tokens_shorten_the_prefill() {
        let mut plan = Plan::new(8, Pacing::Instant, &[], Overrides::default(), None, 100);
        plan.set_cached(60, Duration::from_millis(2));
        assert_eq!(plan.processed_tokens(), 40);
        assert_eq!(plan.prefill, Duration::from_millis(80));
        plan.set_cached(500, Duration::from_millis(2));
        assert_eq!((plan.cached_tokens, plan.prefill), (100, Duration::ZERO));
    }

    #[test]
    fn request_failures_replace_server_failures() {
        let o = Overrides {
            failures: Some(vec![]),
            ..Overrides::default()
        };
        let plan = Plan::new(8, Pacing::Instant, &[Failure::Hang], o, None, 1);
        assert!(!plan.failures.hang);
        let plan = Plan::new(
            8,
            Pacing::Hold(Duration::from_millis(80)),
            &[Failure::Hang],
            Overrides::default(),
            None,
            1,
        );
        assert!(plan.failures.hang);
        assert_eq!(plan.total(), Duration::from_millis(80));
    }
}
