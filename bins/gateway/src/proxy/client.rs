//! What a client asks of admission: who it queues as (tenant, priority class, share) and how
//! long it is willing to wait.
//!
//! **Who.** With API keys configured, the matched key says it ([`auth`](crate::proxy::auth)):
//! its `name` is the tenant (keys without a name are a tenant each), its `priority` and `share`
//! come with it. Without keys, the operator's `tenant_header` names the tenant, at most
//! [`MAX_TENANT_LEN`] bytes of visible ASCII (a longer or binary value is a 400: truncating it
//! could merge tenants without anyone noticing); absent or empty, or with no `tenant_header`,
//! every request is one anonymous tenant. The tenant only matters under `queue_order = "fair"`.
//!
//! **How long.** A request waits in a queue for at most the smallest of the model's
//! `queue_timeout` (counted from when it joins the queue), the client's `x-slotgate-max-wait`
//! (a humantime duration such as `5s` or `1500ms`; anything else is a 400), and the SDK
//! timeout the Stainless-generated SDKs send: `x-stainless-timeout` (openai-node, anthropic
//! SDKs with a per-request timeout) or `x-stainless-read-timeout` (openai-python 3.x sends only
//! this one, its client's or request's read timeout), the smaller when both come (seconds,
//! possibly fractional; ignored when the model sets `honor_sdk_timeout = false`, or when it is
//! not a positive finite number, since the SDK sets it and the client cannot fix it). The client's two deadlines count from when its request
//! arrived: the time spent sending the body is part of its wait.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderName;
use slotgate_config::Priority;
use slotgate_limiter::Ticket;
use tokio::time::Instant;

use crate::proxy::problems::{BadRequest, Error};

/// The longest tenant name taken from a header, in bytes.
pub(crate) const MAX_TENANT_LEN: usize = slotgate_config::Server::MAX_TENANT_LEN;

/// The client's own cap on its queue wait.
const MAX_WAIT: HeaderName = HeaderName::from_static("x-slotgate-max-wait");
/// The Stainless SDKs' request timeout, in seconds.
const SDK_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-timeout");
/// The Stainless SDKs' read timeout, in seconds: all openai-python 3.x sends.
const SDK_READ_TIMEOUT: HeaderName = HeaderName::from_static("x-stainless-read-timeout");

/// Who a request queues as.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Client {
    /// Its tenant under fair order; `None`: the anonymous tenant.
    pub(crate) tenant: Option<Arc<str>>,
    /// Its priority class.
    pub(crate) priority: Priority,
    /// Its tenant's share under fair order.
    pub(crate) share: u32,
}

impl Client {
    /// The anonymous tenant at normal priority.
    pub(crate) fn anonymous() -> Self {
        Self {
            tenant: None,
            priority: Priority::Normal,
            share: 1,
        }
    }

    /// Without API keys: the tenant the `header` names, if the operator set one and the
    /// request carries it.
    pub(crate) fn from_header(header: Option<&str>, headers: &HeaderMap) -> Result<Self, Error> {
        let Some(value) = header.and_then(|name| headers.get(name)) else {
            return Ok(Self::anonymous());
        };
        let name = header.unwrap_or_default();
        let text = value.to_str().map_err(|_| BadRequest::TenantNotText {
            header: name.to_owned(),
        })?;
        let text = text.trim();
        if text.len() > MAX_TENANT_LEN {
            return Err(BadRequest::TenantTooLong {
                header: name.to_owned(),
                len: text.len(),
            }
            .into());
        }
        Ok(Self {
            tenant: (!text.is_empty()).then(|| Arc::from(text)),
            ..Self::anonymous()
        })
    }

    /// The limiter ticket for `weight` slots.
    pub(crate) fn ticket(&self, weight: usize) -> Ticket {
        let ticket = Ticket::new()
            .weight(weight)
            .priority(priority(self.priority))
            .share(self.share);
        match &self.tenant {
            Some(tenant) => ticket.tenant(Arc::clone(tenant)),
            None => ticket,
        }
    }
}

/// The limiter's class for the configuration's.
fn priority(priority: Priority) -> slotgate_limiter::Priority {
    match priority {
        Priority::High => slotgate_limiter::Priority::High,
        Priority::Normal => slotgate_limiter::Priority::Normal,
        Priority::Low => slotgate_limiter::Priority::Low,
    }
}

/// Which bound ended (or would end) a wait in the queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Limit {
    /// The model's `queue_timeout`.
    QueueTimeout,
    /// The client's `x-slotgate-max-wait`.
    MaxWait,
    /// The SDK's `x-stainless-timeout` or `x-stainless-read-timeout` (the header named).
    SdkTimeout(&'static str),
}

impl Limit {
    /// The setting or header, as the client and the operator know it.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Limit::QueueTimeout => "queue_timeout",
            Limit::MaxWait => "x-slotgate-max-wait",
            Limit::SdkTimeout(header) => header,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The client's deadlines, read from its request head.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadlines {
    /// When the request arrived.
    since: Instant,
    /// `x-slotgate-max-wait`.
    max_wait: Option<Duration>,
    /// The smaller usable one of `x-stainless-timeout` and `x-stainless-read-timeout`, and the
    /// header it came from.
    sdk_timeout: Option<(Duration, &'static str)>,
}

/// How long one wait in one queue may last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wait {
    /// When it ends.
    pub(crate) until: Instant,
    /// The bound that sets `until`.
    pub(crate) limit: Limit,
    /// That bound's own value (the `queue_timeout`, or the client's duration).
    pub(crate) bound: Duration,
}

impl Deadlines {
    /// The deadlines of a request whose head is `headers`, arrived `since`. A malformed
    /// `x-slotgate-max-wait` is a 400.
    pub(crate) fn read(headers: &HeaderMap, since: Instant) -> Result<Self, Error> {
        let max_wait = match headers.get(MAX_WAIT) {
            None => None,
            Some(value) => Some(
                value
                    .to_str()
                    .ok()
                    .and_then(|text| humantime::parse_duration(text.trim()).ok())
                    .ok_or(BadRequest::MaxWait { header: MAX_WAIT })?,
            ),
        };
        let sdk_timeout = [
            (SDK_TIMEOUT, "x-stainless-timeout"),
            (SDK_READ_TIMEOUT, "x-stainless-read-timeout"),
        ]
        .into_iter()
        .filter_map(|(name, text)| Some((seconds(headers.get(name)?)?, text)))
        .min_by_key(|(timeout, _)| *timeout);
        Ok(Self {
            since,
            max_wait,
            sdk_timeout,
        })
    }

    /// The wait allowed in a queue joined `now` whose `queue_timeout` is `queue_timeout`;
    /// `honor_sdk` says whether `x-stainless-timeout` counts. On a tie, the client's bound is
    /// named (it is the one the client chose).
    pub(crate) fn wait(&self, now: Instant, queue_timeout: Duration, honor_sdk: bool) -> Wait {
        let mut wait = Wait {
            until: now + queue_timeout,
            limit: Limit::QueueTimeout,
            bound: queue_timeout,
        };
        let sdk = self.sdk_timeout.filter(|_| honor_sdk);
        let sdk_limit = Limit::SdkTimeout(sdk.map_or("x-stainless-timeout", |(_, name)| name));
        let bounds = [
            (sdk_limit, sdk.map(|(timeout, _)| timeout)),
            (Limit::MaxWait, self.max_wait),
        ];
        for (limit, bound) in bounds {
            let Some(bound) = bound else { continue };
            // A bound too far to represent is no bound.
            let Some(until) = self.since.checked_add(bound) else {
                continue;
            };
            if until <= wait.until {
                wait = Wait {
                    until,
                    limit,
                    bound,
                };
            }
        }
        wait
    }
}

/// An SDK timeout header's value as a duration: a positive, finite number of seconds.
fn seconds(value: &http::HeaderValue) -> Option<Duration> {
    let secs = value.to_str().ok()?.trim().parse::<f64>().ok()?;
    Duration::try_from_secs_f64(secs)
        .ok()
        .filter(|timeout| !timeout.is_zero())
}

#[cfg(test)]
mod tests {
    use http::{HeaderMap, HeaderValue};

    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[tokio::test(start_paused = true)]
    async fn the_smallest_deadline_wins_and_is_named() {
        let now = Instant::now();
        let queue = Duration::from_secs(30);
        let d = Deadlines::read(&headers(&[]), now).unwrap();
        assert_eq!(d.wait(now, queue, true).limit, Limit::QueueTimeout);

        let d = Deadlines::read(&headers(&[("x-slotgate-max-wait", "1500ms")]), now).unwrap();
        let wait = d.wait(now, queue, true);
        assert_eq!(
            (wait.limit, wait.until),
            (Limit::MaxWait, now + Duration::from_millis(1500))
        );

        let both = [
            ("x-slotgate-max-wait", "20s"),
            ("x-stainless-timeout", "2.5"),
        ];
        let d = Deadlines::read(&headers(&both), now).unwrap();
        let wait = d.wait(now, queue, true);
        assert_eq!(wait.limit, Limit::SdkTimeout("x-stainless-timeout"));
        assert_eq!(wait.bound, Duration::from_millis(2500));
        // Switched off per model: the client's own header is next.
        assert_eq!(d.wait(now, queue, false).limit, Limit::MaxWait);
    }

    #[tokio::test(start_paused = true)]
    async fn the_read_timeout_of_openai_python_counts_and_the_smaller_sdk_header_wins() {
        let now = Instant::now();
        let queue = Duration::from_secs(30);
        // openai-python 3.x sends only this one.
        let d = Deadlines::read(&headers(&[("x-stainless-read-timeout", "2.0")]), now).unwrap();
        let wait = d.wait(now, queue, true);
        assert_eq!(wait.limit, Limit::SdkTimeout("x-stainless-read-timeout"));
        assert_eq!(wait.bound, Duration::from_secs(2));
        assert_eq!(wait.limit.as_str(), "x-stainless-read-timeout");
        let both = [
            ("x-stainless-timeout", "600"),
            ("x-stainless-read-timeout", "3.5"),
        ];
        let wait = Deadlines::read(&headers(&both), now)
            .unwrap()
            .wait(now, queue, true);
        assert_eq!(
            (wait.limit, wait.bound),
            (
                Limit::SdkTimeout("x-stainless-read-timeout"),
                Duration::from_millis(3500)
            )
        );
        let reversed = [
            ("x-stainless-timeout", "1"),
            ("x-stainless-read-timeout", "3.5"),
        ];
        let wait = Deadlines::read(&headers(&reversed), now)
            .unwrap()
            .wait(now, queue, true);
        assert_eq!(wait.limit, Limit::SdkTimeout("x-stainless-timeout"));
        // A bad one is ignored, the good one counts.
        let one_bad = [
            ("x-stainless-timeout", "NOT_GIVEN"),
            ("x-stainless-read-timeout", "4"),
        ];
        let wait = Deadlines::read(&headers(&one_bad), now)
            .unwrap()
            .wait(now, queue, true);
        assert_eq!(wait.bound, Duration::from_secs(4));
    }

    #[tokio::test(start_paused = true)]
    async fn a_bad_max_wait_is_refused_and_a_bad_sdk_timeout_ignored() {
        let now = Instant::now();
        for bad in ["soon", "5", "-1s", ""] {
            let mut map = HeaderMap::new();
            map.insert("x-slotgate-max-wait", HeaderValue::from_str(bad).unwrap());
            assert!(
                matches!(
                    Deadlines::read(&map, now),
                    Err(Error::BadRequest(BadRequest::MaxWait { .. }))
                ),
                "{bad:?}"
            );
        }
        for ignored in ["abc", "-3", "0", "NaN", "inf"] {
            let mut map = HeaderMap::new();
            map.insert(
                "x-stainless-timeout",
                HeaderValue::from_str(ignored).unwrap(),
            );
            let d = Deadlines::read(&map, now).unwrap();
            let wait = d.wait(now, Duration::from_secs(5), true);
            assert_eq!(wait.limit, Limit::QueueTimeout, "{ignored:?}");
        }
    }

    #[test]
    fn a_tenant_header_is_bounded() {
        let client = Client::from_header(Some("x-tenant"), &headers(&[("x-tenant", " team-a ")]));
        assert_eq!(client.unwrap().tenant.as_deref(), Some("team-a"));
        let none = Client::from_header(Some("x-tenant"), &headers(&[])).unwrap();
        assert_eq!(none, Client::anonymous());
        let unset = Client::from_header(None, &headers(&[("x-tenant", "a")])).unwrap();
        assert_eq!(unset, Client::anonymous());
        let mut long = HeaderMap::new();
        long.insert("x-tenant", HeaderValue::from_str(&"t".repeat(200)).unwrap());
        assert!(Client::from_header(Some("x-tenant"), &long).is_err());
        let mut binary = HeaderMap::new();
        binary.insert("x-tenant", HeaderValue::from_bytes(b"caf\xe9").unwrap());
        assert!(Client::from_header(Some("x-tenant"), &binary).is_err());
    }
}
