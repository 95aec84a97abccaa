//! Cache affinity, bounded by load: when to send a request to the host that holds its prompt
//! prefix rather than where [`ranked`](crate::ranked) would put it.
//!
//! An engine that served a conversation's previous turn holds its prompt in its KV cache and
//! skips that prefill; another host computes it again. So the host with the longest match in
//! [`Holdings`](crate::Holdings) (the *holder*) is worth a detour, but only while the detour
//! costs less than the prefill it saves, judged from the numbers the gateway measures itself.
//!
//! # Rules
//!
//! [`prefer`] takes the chooser's order and the holder's place in it:
//!
//! 1. **No useful match** (no holder, see [`is_useful`]) or a holder that has the model only
//!    on disk while the chooser's first has it loaded (an unloaded model has no cache): the
//!    order stays exactly as [`ranked`](crate::ranked) made it ([`Verdict::Miss`]).
//! 2. **The holder is first already**, or **has room** for the request now: it goes first
//!    ([`Verdict::Hit`]).
//! 3. **The holder is full and has a queue while the chooser's first has room**: the order
//!    stays ([`Verdict::Overridden`]). The holder keeps its entries for later requests.
//! 4. **Otherwise** (the holder is full with nobody waiting, or nobody has room): the holder
//!    goes first if its expected wait is no longer than the chooser's first's plus the prefill
//!    the holder saves ([`Standing::wait`], `saved`), else the order stays.
//!
//! Only the holder moves; the others keep their order behind it, so falling through a full
//! queue works as before.
//!
//! # Why the shared system prompt does not pile up on one host
//!
//! Every prefix router shipped the same bug: with one long system prompt that all users share,
//! the first host to see it holds the longest match for everyone, and takes every new
//! conversation. Here a match on a prefix that several prompts went on from differently
//! ([`Longest::diverges`](crate::Longest::diverges)) is no useful match: a new conversation is
//! placed by the chooser (most free slots × weight, then shortest queue, then order), and only
//! its later turns, whose match runs into their own history, follow it.

use std::time::Duration;

use crate::{Longest, Prefix};

/// What the rule knows about one host, from the gateway's own numbers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Standing {
    /// Free slots for the model ([`Info::free`](crate::Info::free)).
    pub free: usize,
    /// Requests waiting for them ([`Info::queued`](crate::Info::queued)).
    pub queued: usize,
    /// Whether the model is resident ([`Info::loaded`](crate::Info::loaded)).
    pub loaded: bool,
    /// How long a request would wait for a slot there when it has none free: measured hold
    /// times × (queue + 1) / slots.
    pub wait: Duration,
}

/// What [`prefer`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// No useful match: the chooser's order stands.
    Miss,
    /// The holder goes first.
    Hit,
    /// The holder was too busy: the chooser's order stands.
    Overridden,
}

impl Verdict {
    /// The word used in metrics: `hit`, `miss` or `overridden`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Miss => "miss",
            Verdict::Hit => "hit",
            Verdict::Overridden => "overridden",
        }
    }
}

/// Whether `longest`, a match of `prefix`, is worth a detour: it covers at least `min_bytes`
/// of text and the request does not part there from prompts that went on differently
/// (a shared prefix). A pinned prefix (a session) is always useful: the client said which
/// requests belong together.
#[must_use]
pub fn is_useful(longest: &Longest, prefix: &Prefix, min_bytes: usize) -> bool {
    if prefix.is_pinned() {
        return longest.elements >= 1;
    }
    !longest.diverges && prefix.bytes_through(longest.elements) >= min_bytes.max(1)
}

/// Moves the holder at `holder` (a position in `ranked`) to the front when the affinity
/// rules (summed up in the [crate docs](crate#cache-affinity)) say so, for a request that
/// needs `need` slots and whose prefill on a host without its prefix would take about `saved`. `standing` is asked about the holder and the
/// first host only.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use slotgate_choose::{Standing, Verdict, prefer};
///
/// let idle = Standing { free: 2, queued: 0, loaded: true, wait: Duration::ZERO };
/// let busy = Standing { free: 0, queued: 3, loaded: true, wait: Duration::from_secs(4) };
///
/// // The holder ("b") has a free slot: it goes first.
/// let mut order = vec![("a", idle), ("b", Standing { free: 1, ..idle })];
/// assert_eq!(prefer(&mut order, Some(1), 1, Duration::ZERO, |h| h.1), Verdict::Hit);
/// assert_eq!(order[0].0, "b");
///
/// // The holder is full with a queue while "a" has room: the order stands.
/// let mut order = vec![("a", idle), ("b", busy)];
/// let verdict = prefer(&mut order, Some(1), 1, Duration::from_secs(1), |h| h.1);
/// assert_eq!(verdict, Verdict::Overridden);
/// assert_eq!(order[0].0, "a");
/// ```
pub fn prefer<C>(
    ranked: &mut [C],
    holder: Option<usize>,
    need: usize,
    saved: Duration,
    standing: impl Fn(&C) -> Standing,
) -> Verdict {
    let Some(at) = holder.filter(|&at| at < ranked.len()) else {
        return Verdict::Miss;
    };
    if at == 0 {
        return Verdict::Hit;
    }
    let (holder, first) = (standing(&ranked[at]), standing(&ranked[0]));
    if !holder.loaded && first.loaded {
        return Verdict::Miss;
    }
    let need = need.max(1);
    let takes = if holder.free >= need {
        true
    } else if first.free >= need && holder.queued > 0 {
        false
    } else {
        let elsewhere = if first.free >= need {
            Duration::ZERO
        } else {
            first.wait
        };
        holder.wait <= elsewhere.saturating_add(saved)
    };
    if takes {
        ranked[..=at].rotate_right(1);
        Verdict::Hit
    } else {
        Verdict::Overridden
    }
}

#[cfg(test)]
mod tests;
