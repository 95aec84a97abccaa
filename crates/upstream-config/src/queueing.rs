//! How a model's queue serves its waiters: the queueing keys of a model table
//! (`[upstreams.NAME.models.MODEL]`), one declaration per key (see [`crate::key`]). The model
//! table reads them only for a model that queues (not `parallel = "unlimited"`).

use std::time::Duration;

use figment::value::Value;

use crate::key::{self, table};
use crate::raw::{KeyPath, Reader};
use crate::show::{Show, Shown, human};
use crate::values::OFF;

table! {
    /// How one model's queue on one upstream serves its waiters, what a waiting client sees, and how
    /// many requests may wait inside the engine instead (`prefetch`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use slotgate_config::{Config, QueueOrder, Queueing};
    ///
    /// let config = Config::from_toml_str(r#"
    ///     [server]
    ///     listen = "127.0.0.1:8080"
    ///     [upstreams.a]
    ///     url = "http://127.0.0.1:8081"
    ///     kind = "vllm"
    ///     [upstreams.a.models.m]
    ///     parallel = 1
    ///     queue = 4
    ///     queue_timeout = "30s"
    ///     queue_order = "fair"
    ///     queue_keepalive = "5s"
    ///     honor_sdk_timeout = false
    ///     prefetch = 1
    /// "#)?;
    /// let q = config.upstreams["a"].queueing("m");
    /// assert_eq!(q.order, QueueOrder::Fair);
    /// assert_eq!(q.keepalive, Some(Duration::from_secs(5)));
    /// assert!(!q.honor_sdk_timeout);
    /// assert_eq!(q.prefetch, 1);
    /// assert_eq!(config.upstreams["a"].queueing("other"), Queueing::default());
    /// # Ok::<(), slotgate_config::ConfigError>(())
    /// ```
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    #[non_exhaustive]
    pub struct Queueing, read as QueueingKeys {
        /// `queue_order`: first come first served, or fair between tenants (default FIFO).
        order: QueueOrder = key::defaulted("queue_order", queue_order),
            default DEFAULT_ORDER = QueueOrder::Fifo;
        /// `queue_keepalive`: a streamed request that has to queue is answered `200` at once
        /// and sent an SSE comment this often while it waits. `None` (the default): off.
        keepalive: Option<Duration> = key::defaulted("queue_keepalive", keepalive)
            .show(|every| Some(every.map_or(Shown::Str(OFF), |every| Shown::Text(human(every))))),
            default DEFAULT_KEEPALIVE = None;
        /// `honor_sdk_timeout`: whether the OpenAI SDKs' `x-stainless-timeout` header caps the
        /// queue wait (default `true`).
        honor_sdk_timeout: bool = key::boolean("honor_sdk_timeout"),
            default DEFAULT_HONOR_SDK_TIMEOUT = true;
        /// `prefetch`: how many requests beyond `parallel` the gateway sends ahead, to wait in
        /// the engine's own queue and start the instant one of its slots frees (default 0:
        /// never more than `parallel` at the engine). The model's cap in the limiter is
        /// `parallel + prefetch`.
        prefetch: usize = key::defaulted("prefetch", prefetch),
            default DEFAULT_PREFETCH = 0;
    }
}

impl Queueing {
    /// The shortest `queue_keepalive`.
    pub const MIN_KEEPALIVE: Duration = Duration::from_secs(1);
    /// The longest `queue_keepalive`: proxies commonly cut a connection idle for 60 s.
    pub const MAX_KEEPALIVE: Duration = Duration::from_secs(60);
    /// The largest `prefetch`.
    pub const MAX_PREFETCH: usize = 64;
}

impl Default for Queueing {
    fn default() -> Self {
        Queueing {
            order: Self::DEFAULT_ORDER,
            keepalive: Self::DEFAULT_KEEPALIVE,
            honor_sdk_timeout: Self::DEFAULT_HONOR_SDK_TIMEOUT,
            prefetch: Self::DEFAULT_PREFETCH,
        }
    }
}

/// `queue_order`: the order in which a model's queue serves its waiters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum QueueOrder {
    /// `"fifo"`: first come, first served (within a priority class). The default.
    #[default]
    Fifo,
    /// `"fair"`: round-robin between tenants, weighted by their shares (deficit round-robin),
    /// first come first served within a tenant.
    Fair,
}

impl QueueOrder {
    /// The name used in the configuration file.
    pub const fn as_str(self) -> &'static str {
        match self {
            QueueOrder::Fifo => "fifo",
            QueueOrder::Fair => "fair",
        }
    }

    /// The order named `name`, exactly as [`QueueOrder::as_str`] spells it.
    pub fn from_name(name: &str) -> Option<QueueOrder> {
        [QueueOrder::Fifo, QueueOrder::Fair]
            .into_iter()
            .find(|o| o.as_str() == name)
    }
}

impl Show for QueueOrder {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Str(self.as_str()))
    }
}

fn queue_order(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<QueueOrder> {
    let text = r.string(path, value)?;
    let order = QueueOrder::from_name(text);
    if order.is_none() {
        r.invalid(
            path,
            value,
            format!(r#"unknown queue order {text:?} (expected "fifo" or "fair")"#),
        );
    }
    order
}

/// `"off"`, or a duration between [`Queueing::MIN_KEEPALIVE`] and [`Queueing::MAX_KEEPALIVE`].
#[expect(
    clippy::option_option,
    reason = "the outer None is a wrong value (reported), the inner one the value \"off\""
)]
fn keepalive(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<Option<Duration>> {
    if matches!(value, Value::String(_, text) if text == OFF) {
        return Some(None);
    }
    let every = r.duration(path, value, false)?;
    let (min, max) = (Queueing::MIN_KEEPALIVE, Queueing::MAX_KEEPALIVE);
    if every < min || every > max {
        let message = format!(
            "must be between {} and {} (or \"off\"), found {}",
            human(min),
            human(max),
            human(every)
        );
        r.invalid(path, value, message);
        return None;
    }
    Some(Some(every))
}

fn prefetch(r: &mut Reader<'_>, path: &KeyPath, value: &Value) -> Option<usize> {
    let ahead = r.count(path, value, 0)?;
    if ahead > Queueing::MAX_PREFETCH {
        let message = format!(
            "must be at most {}: it is how many requests wait inside the engine beyond its \
             slots, a handful at most",
            Queueing::MAX_PREFETCH
        );
        r.invalid(path, value, message);
        return None;
    }
    Some(ahead)
}
