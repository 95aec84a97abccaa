//! The Lua script that keeps one host's holders, waiters and scheduler state in Redis, the
//! names of that data, and the typed calls into it.
//!
//! One script (`script.lua`) serves every operation (`acquire`, `release`, `configure`,
//! `renew`, `position`), so that they all share one prelude (configuration, expiry, the grant
//! step) and one reply shape. Each call is atomic in Redis and is one round trip (`EVALSHA`;
//! `EVAL` once after Redis lost its script cache). The layout and the reasoning are in
//! `docs/scale-out.md`.

use std::sync::LazyLock;

use redis::Script;
use slotgate_limiter::{Priority, QueueOrder, Ticket};

/// The Lua source; its header says what KEYS and ARGV hold.
const SOURCE: &str = include_str!("script.lua");

static SCRIPT: LazyLock<Script> = LazyLock::new(|| Script::new(SOURCE));

/// The largest `parallel` or `queue` written to Redis: Lua numbers are doubles, and anything
/// this large means "unlimited" anyway.
const LUA_MAX: usize = 1 << 53;

/// The Redis names of one (host, model) key: its host's four data keys, its host's wake-up
/// channel, and the model (an argument: every model of a host shares the host's data, so that
/// one script can keep the host's cap).
#[derive(Debug, Clone)]
pub(crate) struct KeyNames {
    keys: [String; 4],
    channel: String,
    model: String,
}

impl KeyNames {
    /// The names for `host` and `model` under `prefix`. The host's length makes the names
    /// unambiguous whatever the host contains; the braces are a Redis Cluster hash tag, so all
    /// of one host's data lives in one slot.
    pub(crate) fn new(prefix: &str, host: &str, model: &str) -> Self {
        let id = format!("{}:{host}", host.len());
        let base = format!("{prefix}:{{{id}}}");
        let keys = ["state", "holders", "held", "gone"].map(|suffix| format!("{base}:{suffix}"));
        Self {
            keys,
            channel: format!("{prefix}:wake:{id}"),
            model: model.to_owned(),
        }
    }

    /// Every data key, for tests that clean up after themselves.
    #[cfg(test)]
    pub(crate) fn keys(&self) -> &[String; 4] {
        &self.keys
    }

    /// The pattern that matches every host's wake-up channel under `prefix`.
    pub(crate) fn wake_pattern(prefix: &str) -> String {
        format!("{prefix}:wake:*")
    }
}

/// What a waiter asks for, as the script needs it to queue (or re-queue) it: the parts of a
/// [`Ticket`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Desc {
    pub(crate) weight: usize,
    /// 0 high, 1 normal, 2 low.
    pub(crate) class: u8,
    /// Empty for no tenant.
    pub(crate) tenant: String,
    pub(crate) share: usize,
}

impl Desc {
    pub(crate) fn of(ticket: &Ticket) -> Self {
        Self {
            weight: ticket.weight_units(),
            class: match ticket.class() {
                Priority::High => 0,
                Priority::Normal => 1,
                Priority::Low => 2,
            },
            tenant: ticket
                .tenant_name()
                .map_or_else(String::new, ToString::to_string),
            share: ticket.tenant_share(),
        }
    }
}

/// The caller's configuration of the key, sent with every call: written when the store has
/// none (a new key, or Redis lost its data), or always for the parts in `force`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Config {
    pub(crate) parallel: usize,
    pub(crate) queue: usize,
    pub(crate) order: QueueOrder,
    /// The host's engine-wide cap; `None`: none configured here.
    pub(crate) cap: Option<usize>,
    /// Write the key's limits and order now (a `configure` not yet seen by the store).
    pub(crate) force_key: bool,
    /// Write the host cap now.
    pub(crate) force_cap: bool,
}

/// One operation of the script.
#[derive(Debug)]
pub(crate) enum Op<'a> {
    Acquire(&'a str, &'a Desc),
    /// A release of a holder, or the cancel of a waiter.
    Release(&'a str),
    /// Only the configuration (with `force`).
    Configure,
    /// This replica's leases of the key: (id, is it held here, what it asks for).
    Renew(&'a [(String, bool, Desc)]),
    /// Where a waiter stands.
    Position(&'a str),
}

/// What an acquire found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    /// Refused: the queue is full (or, for a release, the id was not a holder).
    No,
    /// Granted at once (or, for a release, the id was a holder).
    Yes,
    /// Joined the queue.
    Queued,
    /// The id was released before its acquire arrived: nothing was written.
    Gone,
    /// The weight is above this `parallel` (the key's, or the host cap's): it could never be
    /// granted.
    TooHeavy(usize),
}

/// A host's engine-wide cap across every replica, as the last reply about one of its keys
/// left it (see [`RedisLimiter::host_global`](crate::RedisLimiter::host_global)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct HostOccupancy {
    /// Units allowed in flight over all the host's models; `usize::MAX` is unlimited.
    pub parallel: usize,
    /// Units held over all the host's models, by every replica.
    pub in_flight: usize,
    /// Models whose head waiter fits its own limit and waits only for the host cap.
    pub blocked_models: usize,
}

/// The script's reply: the outcome and the key's state after the call.
#[derive(Debug, Clone)]
pub(crate) struct Reply {
    pub(crate) status: Status,
    /// Units held across every replica.
    pub(crate) holders: usize,
    /// Waiters across every replica.
    pub(crate) waiters: usize,
    /// Leases (holders and waiters) this call found expired and removed.
    pub(crate) expired: u64,
    /// Lease ids this call moved from the queue to the holders (of any model of the host).
    pub(crate) granted: Vec<String>,
    /// Waiters this call took out as too heavy after a shrink, with the `parallel` they are
    /// above.
    pub(crate) refused: Vec<(String, usize)>,
    /// `renew`: waiters of the caller found among the holders.
    pub(crate) reported: Vec<String>,
    /// `renew`: leases of the caller that Redis had lost and that were put back.
    pub(crate) restored: u64,
    /// `acquire` (queued) and `position`: waiters expected to be granted first.
    pub(crate) ahead: Option<usize>,
    /// The host cap, when the host has one.
    pub(crate) cap: Option<HostOccupancy>,
}

type RawReply = (
    i64,
    i64,
    i64,
    i64,
    Vec<String>,
    Vec<String>,
    Vec<String>,
    i64,
    i64,
    i64,
    Vec<i64>,
);

fn count(n: i64) -> usize {
    usize::try_from(n).unwrap_or(0)
}

/// A count back from Lua, where [`LUA_MAX`] stands for unlimited.
fn limit(n: i64) -> usize {
    let n = count(n);
    if n >= LUA_MAX { usize::MAX } else { n }
}

/// `id=parallel`, the script's form of a refusal.
pub(crate) fn parse_refusal(text: &str) -> Option<(String, usize)> {
    let (id, parallel) = text.rsplit_once('=')?;
    Some((id.to_owned(), limit(parallel.parse().ok()?)))
}

impl Reply {
    fn from_raw(raw: RawReply) -> Self {
        let (status, holders, waiters, expired, granted, refused, reported, restored) =
            (raw.0, raw.1, raw.2, raw.3, raw.4, raw.5, raw.6, raw.7);
        let host = |i: usize| raw.10.get(i).copied().unwrap_or(-1);
        let (ahead, extra, host_in_flight, cap, blocked) =
            (raw.8, raw.9, host(0), host(1), host(2));
        Self {
            status: match status {
                1 => Status::Yes,
                2 => Status::Queued,
                3 => Status::Gone,
                4 => Status::TooHeavy(limit(extra)),
                _ => Status::No,
            },
            holders: count(holders),
            waiters: count(waiters),
            expired: u64::try_from(expired).unwrap_or(0),
            granted,
            refused: refused.iter().filter_map(|r| parse_refusal(r)).collect(),
            reported,
            restored: u64::try_from(restored).unwrap_or(0),
            ahead: usize::try_from(ahead).ok(),
            cap: (cap >= 0).then(|| HostOccupancy {
                parallel: limit(cap),
                in_flight: count(host_in_flight),
                blocked_models: count(blocked),
            }),
        }
    }
}

fn order_name(order: QueueOrder) -> &'static str {
    match order {
        QueueOrder::Fair => "fair",
        // `QueueOrder` is non-exhaustive: anything new is served first come, first served.
        _ => "fifo",
    }
}

/// Runs `op` on the key named by `names`, with the caller's configuration `config`.
pub(crate) async fn call<C>(
    conn: &mut C,
    names: &KeyNames,
    config: &Config,
    op: &Op<'_>,
) -> redis::RedisResult<Reply>
where
    C: redis::aio::ConnectionLike,
{
    let mut invocation = SCRIPT.prepare_invoke();
    for key in &names.keys {
        invocation.key(key);
    }
    let force = match (config.force_key, config.force_cap) {
        (true, true) => "kh",
        (true, false) => "k",
        (false, true) => "h",
        (false, false) => "",
    };
    invocation
        .arg(&names.channel)
        .arg(&names.model)
        .arg(config.parallel.min(LUA_MAX))
        .arg(config.queue.min(LUA_MAX))
        .arg(order_name(config.order))
        .arg(
            config
                .cap
                .map_or_else(String::new, |cap| cap.min(LUA_MAX).to_string()),
        )
        .arg(force);
    match op {
        Op::Acquire(id, desc) => {
            invocation.arg("acquire").arg(*id);
            desc_args(&mut invocation, desc);
        }
        Op::Release(id) => {
            invocation.arg("release").arg(*id);
        }
        Op::Configure => {
            invocation.arg("configure");
        }
        Op::Renew(leases) => {
            invocation.arg("renew");
            for (id, held, desc) in *leases {
                invocation.arg(id).arg(if *held { "h" } else { "w" });
                desc_args(&mut invocation, desc);
            }
        }
        Op::Position(id) => {
            invocation.arg("position").arg(*id);
        }
    }
    let raw: RawReply = invocation.invoke_async(conn).await?;
    Ok(Reply::from_raw(raw))
}

fn desc_args(invocation: &mut redis::ScriptInvocation<'_>, desc: &Desc) {
    invocation
        .arg(desc.weight.min(LUA_MAX))
        .arg(desc.class)
        .arg(&desc.tenant)
        .arg(desc.share.min(LUA_MAX));
}
