//! What each host was sent lately: an approximate index from prefix-block hashes to the hosts
//! whose engines were given that prefix, so probably still hold it in their prompt cache.
//!
//! [`Holdings`] maps each [`Prefix`](crate::Prefix) element to an entry: the set of hosts
//! ([`HostSet`], up to [`MAX_HOSTS`]) that were sent it, when it was last sent anywhere, and
//! which element followed it (to tell a prompt that many conversations share from one
//! conversation's own history, see [`Longest::diverges`]).
//!
//! # Bounds
//!
//! - **Entries**: at most `entries` (at least 2). The map is kept as two generations: new and
//!   refreshed entries go into the current one; when it holds `entries / 2`, it becomes the
//!   previous generation and the old previous one is dropped whole. An entry used again is moved
//!   from the previous generation into the current one, so what is dropped is what went unused
//!   longest, as in LRU, without a list to maintain.
//! - **Age**: an entry not sent anywhere for `ttl` is not reported, and once the current
//!   generation is older than `ttl` the previous one (all older still) is dropped, so memory
//!   also shrinks when traffic stops.
//!
//! Times are whole seconds since the index was made (`now` is passed in: the index reads no
//! clock). An entry takes about 40 bytes with the map's overhead, so the default 65,536 entries
//! are under 3 MiB.
//!
//! # Implementation Details
//!
//! The keys are already hashes seeded with the gateway's secret, so the maps use them as their
//! own hash instead of hashing them again.

use std::collections::HashMap;
use std::collections::hash_map::Entry::{Occupied, Vacant};
use std::hash::{BuildHasherDefault, Hasher};
use std::time::{Duration, Instant};

/// How many hosts the index can tell apart. A host beyond them gets no [`HostId`]: requests are
/// placed there by the chooser's rule alone.
pub const MAX_HOSTS: usize = 64;

/// One host, as the index knows it: a number below [`MAX_HOSTS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HostId(u8);

impl HostId {
    /// The id numbered `n`, if `n < MAX_HOSTS`.
    #[must_use]
    pub fn new(n: usize) -> Option<Self> {
        u8::try_from(n)
            .ok()
            .filter(|&n| usize::from(n) < MAX_HOSTS)
            .map(HostId)
    }

    /// Its number.
    #[must_use]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }

    fn bit(self) -> u64 {
        1 << self.0
    }
}

/// A set of [`HostId`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct HostSet(u64);

impl HostSet {
    /// No host.
    pub const EMPTY: HostSet = HostSet(0);

    /// Adds `host`.
    pub fn insert(&mut self, host: HostId) {
        self.0 |= host.bit();
    }

    /// Whether `host` is in the set.
    #[must_use]
    pub fn contains(self, host: HostId) -> bool {
        self.0 & host.bit() != 0
    }

    /// Whether the set is empty.
    #[must_use]
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The hosts in both sets.
    #[must_use]
    pub fn intersection(self, other: HostSet) -> HostSet {
        HostSet(self.0 & other.0)
    }
}

impl FromIterator<HostId> for HostSet {
    fn from_iter<I: IntoIterator<Item = HostId>>(iter: I) -> Self {
        let mut set = HostSet::EMPTY;
        iter.into_iter().for_each(|host| set.insert(host));
        set
    }
}

/// The index's two bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The most entries kept (at least 2 are).
    pub entries: usize,
    /// How long an entry counts after it was last sent anywhere (at least one second).
    pub ttl: Duration,
}

/// When an entry was last sent anywhere: whole seconds since the index was made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Stamp(u32);

/// The longest prefix of a chain that some of the asked-about hosts hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Longest {
    /// The hosts (among those asked about) that hold it.
    pub hosts: HostSet,
    /// Its length in chain elements (at least 1).
    pub elements: usize,
    /// Whether the request parts from what was recorded after this prefix: the recorded
    /// prompts went on differently (or did so once already), or went on where the request
    /// ends. Such a prefix is shared by several prompts (a system prompt common to many
    /// conversations) rather than one conversation's own history.
    pub diverges: bool,
}

/// What a host held of a chain just before [`Holdings::record`] refreshed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Prior {
    /// The longest prefix, in elements, that the host held (0: none).
    pub elements: usize,
    /// When the last of those elements had last been sent anywhere; `None` when none was held.
    pub stamp: Option<Stamp>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    /// The element that followed this one in the prompt recorded last (0: none yet).
    next: u64,
    hosts: u64,
    stamp: u32,
    /// Two different successors were recorded.
    forked: bool,
}

impl Entry {
    fn fresh(now: u32) -> Self {
        Self {
            next: 0,
            hosts: 0,
            stamp: now,
            forked: false,
        }
    }

    fn is_live(&self, now: u32, ttl: u32) -> bool {
        now.saturating_sub(self.stamp) < ttl
    }
}

/// A map keyed by hashes already seeded with a secret: they are their own hash.
type Map = HashMap<u64, Entry, BuildHasherDefault<KeyIsHash>>;

/// The [`Hasher`] of [`Map`]: the key, as it is.
#[derive(Debug, Default)]
struct KeyIsHash(u64);

impl Hasher for KeyIsHash {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `u64` keys are hashed; fold anything else in rather than panic.
        for &byte in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(byte);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The index of which hosts were sent which prefix blocks
/// (see the [crate docs](crate#cache-affinity)).
#[derive(Debug)]
pub struct Holdings {
    limits: Limits,
    epoch: Instant,
    current: Map,
    previous: Map,
    /// When the current generation began.
    since: u32,
}

impl Holdings {
    /// An empty index with `limits`, its clock starting at `now`.
    #[must_use]
    pub fn new(limits: Limits, now: Instant) -> Self {
        Self {
            limits,
            epoch: now,
            current: Map::default(),
            previous: Map::default(),
            since: 0,
        }
    }

    /// The entries held now (never above `max(limits.entries, 2)`).
    #[must_use]
    pub fn len(&self) -> usize {
        self.current.len() + self.previous.len()
    }

    /// Whether no entry is held.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The longest prefix of `chain` held by any host of `among`, with the hosts that hold it
    /// that far; `None` when none holds even its first element.
    ///
    /// Looks from the end of the chain backwards, so a conversation's next turn costs one
    /// lookup per element it added, plus one.
    #[must_use]
    pub fn longest(&self, chain: &[u64], among: HostSet, now: Instant) -> Option<Longest> {
        let now = self.seconds(now);
        (1..=chain.len()).rev().find_map(|elements| {
            let entry = self.live(chain[elements - 1], now)?;
            let hosts = HostSet(entry.hosts).intersection(among);
            if hosts.is_empty() {
                return None;
            }
            let diverges = entry.forked
                || match chain.get(elements) {
                    Some(&next) => entry.next != 0 && entry.next != next,
                    None => entry.next != 0,
                };
            Some(Longest {
                hosts,
                elements,
                diverges,
            })
        })
    }

    /// Records that `chain` was sent to `host` now, and says what the host held of it before.
    pub fn record(&mut self, chain: &[u64], host: HostId, now: Instant) -> Prior {
        let now = self.seconds(now);
        self.expire(now);
        let (ttl, half, bit) = (self.ttl_secs(), self.half(), host.bit());
        let mut prior = Prior::default();
        for (k, &hash) in chain.iter().enumerate() {
            let entry = self.entry(hash, now, ttl, half);
            if entry.hosts & bit != 0 {
                prior = Prior {
                    elements: k + 1,
                    stamp: Some(Stamp(entry.stamp)),
                };
            }
            entry.hosts |= bit;
            entry.stamp = now;
            if let Some(&next) = chain.get(k + 1) {
                entry.forked |= entry.next != 0 && entry.next != next;
                entry.next = next;
            }
        }
        prior
    }

    /// Forgets that `host` holds anything last sent anywhere at or before `stamp`: the host
    /// reported that it no longer held what it had been sent then, and an engine's cache
    /// evicts the longest-unused first (or it restarted, and lost everything).
    pub fn forget_until(&mut self, host: HostId, stamp: Stamp) {
        self.clear(host, |entry| entry.stamp <= stamp.0);
    }

    /// Forgets everything `host` was sent.
    pub fn forget(&mut self, host: HostId) {
        self.clear(host, |_| true);
    }

    /// Forgets that `host` holds the elements of `chain` from `keep` on.
    pub fn trim(&mut self, chain: &[u64], host: HostId, keep: usize) {
        for hash in chain.iter().skip(keep) {
            for map in [&mut self.current, &mut self.previous] {
                if let Some(entry) = map.get_mut(hash) {
                    entry.hosts &= !host.bit();
                    if entry.hosts == 0 {
                        map.remove(hash);
                    }
                }
            }
        }
    }

    fn clear(&mut self, host: HostId, matches: impl Fn(&Entry) -> bool) {
        for map in [&mut self.current, &mut self.previous] {
            map.retain(|_, entry| {
                if matches(entry) {
                    entry.hosts &= !host.bit();
                }
                entry.hosts != 0
            });
        }
    }

    /// The entry for `hash` in the current generation (turned over at `half` entries): moved
    /// there from the previous one, or made; one expired (older than `ttl`) starts afresh.
    ///
    /// One lookup in the current generation when the entry is there (a conversation's next
    /// turn), a second in the previous one when it is not: this runs once per chain element of
    /// every request sent.
    fn entry(&mut self, hash: u64, now: u32, ttl: u32, half: usize) -> &mut Entry {
        // Only a full generation needs to know before the insert whether the key is new (a new
        // key turns it over); the entry API below cannot turn it over while it holds a slot.
        if self.current.len() >= half && !self.current.contains_key(&hash) {
            let moved = self.previous.remove(&hash);
            self.previous = std::mem::take(&mut self.current);
            self.since = now;
            self.current
                .insert(hash, moved.unwrap_or_else(|| Entry::fresh(now)));
        }
        let entry = match self.current.entry(hash) {
            Occupied(entry) => entry.into_mut(),
            Vacant(slot) => slot.insert(
                self.previous
                    .remove(&hash)
                    .unwrap_or_else(|| Entry::fresh(now)),
            ),
        };
        if !entry.is_live(now, ttl) {
            *entry = Entry::fresh(now);
        }
        entry
    }

    /// Drops the previous generation once all of it is older than `ttl`.
    fn expire(&mut self, now: u32) {
        if now.saturating_sub(self.since) >= self.ttl_secs() {
            self.previous = std::mem::take(&mut self.current);
            self.since = now;
        }
    }

    fn live(&self, hash: u64, now: u32) -> Option<&Entry> {
        let ttl = self.ttl_secs();
        self.current
            .get(&hash)
            .or_else(|| self.previous.get(&hash))
            .filter(|entry| entry.is_live(now, ttl))
    }

    fn half(&self) -> usize {
        (self.limits.entries / 2).max(1)
    }

    fn ttl_secs(&self) -> u32 {
        u32::try_from(self.limits.ttl.as_secs())
            .unwrap_or(u32::MAX)
            .max(1)
    }

    fn seconds(&self, now: Instant) -> u32 {
        let since = now.saturating_duration_since(self.epoch).as_secs();
        u32::try_from(since).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests;
