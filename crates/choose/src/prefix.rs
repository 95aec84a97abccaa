//! A request's affinity key: a chain of hashes over fixed-size blocks of its prompt text, so
//! that two requests whose prompts begin alike share the first hashes of their chains.
//!
//! The text is given as *segments* in the order the engine reads them (the system prompt, then
//! each message). Each segment is cut into blocks; block `k`'s hash is its bytes' own hash mixed
//! with block `k - 1`'s chain hash ([`chain`]), so it stands for the whole text up to the end of
//! block `k`. Two chains agree on element `k` exactly when (barring a 64-bit collision) the
//! texts agree up to there.
//!
//! A segment's first [`GROW_EVERY`] blocks are `block` bytes, the next ones twice that, then
//! four times, and from then on eight times ([`block_size`]): a long segment (a long system
//! prompt, a pasted document) is cut into fewer, larger blocks past its start. Such a segment is
//! the older part of every later turn of its conversation, resent whole each time, so every
//! element it saves is a hash, a chain step and an index entry saved on every turn; a match
//! still ends exactly at each message's end, and only a match that ends inside a long segment
//! is coarser. Where the blocks fall depends only on the segment's own bytes, so a text resent
//! is cut the same way.
//!
//! How a segment ends matters for a conversation's next turn, which resends the same text and
//! adds to it:
//!
//! - a **message** ([`PrefixBuilder::message`]) is a unit the client resends byte for byte, so
//!   its last, partial block is hashed too: the next turn's chain contains this one whole;
//! - a **trailing text** ([`PrefixBuilder::text`], a completion's `prompt`) grows in place, so
//!   only its full blocks are hashed: a partial block would differ once more text is appended.
//!
//! The chain starts from a seed: the gateway's secret (so that clients cannot aim hashes at
//! each other's), the model (the same text on another model is another cache) and, when the
//! request names one, its user ([`PrefixBuilder::salt`]). A session id
//! ([`PrefixBuilder::pin`]) adds an element of its own, covering no text, ahead of the blocks:
//! every request of the session then shares at least that element.
//!
//! Hashing is xxHash's XXH3 (64 bits), a fast non-cryptographic hash, **unseeded** for the
//! blocks: XXH3 with a seed derives a 192-byte secret from the seed on every call over 240
//! bytes, which cost more than half as much as hashing a 512-byte block itself (issue #30's
//! callgrind profile). The block hash is then chained with a cheap 64-bit mix. The cost is one
//! pass over the prompt's bytes, at most `max_blocks` blocks of them, and no allocation once
//! [`PrefixBuilder::reserve`] made room.
//!
//! The implementation is `twox-hash`'s, which picks its inner loop when it runs: AVX2 where the
//! CPU has it (nearly every x86-64 server since 2013), else SSE2, NEON on ARM. A release build
//! targets the x86-64 baseline, so a hash compiled in (`xxhash-rust`, before) runs SSE2 only:
//! the AVX2 loop takes about 0.5 instructions per byte, SSE2's 0.8 (issue #30's profile). The
//! values are XXH3's whatever the loop, so chains are the same on every machine.

use twox_hash::XxHash3_64;

/// The block size the gateway uses unless configured otherwise: 512 bytes, about 128 tokens of
/// English text, fine enough that a turn's new text is a few blocks, coarse enough that a
/// 10,000-token conversation is at most some 80 entries of the index (fewer when its messages
/// are long: [`block_size`]).
pub const DEFAULT_BLOCK_BYTES: usize = 512;

/// A segment's blocks double in size after every `GROW_EVERY` of them ([`block_size`]).
pub const GROW_EVERY: usize = 4;

/// The most a segment's blocks grow: `block << MAX_GROWTH` bytes (8 × `block`).
const MAX_GROWTH: u32 = 3;

/// Set apart from a block hash of the same bytes: the seed of a session element.
const SESSION_TAG: u64 = 0x5e55_1011_5e55_1011;

/// A request's chain of prefix hashes, with how much text each element covers.
///
/// Build one with [`PrefixBuilder`]. No hash is `0` (that value means "none" in the index).
///
/// # Example
///
/// ```
/// use slotgate_choose::PrefixBuilder;
///
/// let first = {
///     let mut b = PrefixBuilder::new(4, 64, 7);
///     b.message(b"system: be brief");
///     b.message(b"user: hi");
///     b.finish()
/// };
/// let next_turn = {
///     let mut b = PrefixBuilder::new(4, 64, 7);
///     b.message(b"system: be brief");
///     b.message(b"user: hi");
///     b.message(b"assistant: hello");
///     b.finish()
/// };
/// // The next turn's chain begins with the whole first chain.
/// assert!(next_turn.hashes().starts_with(first.hashes()));
/// assert_eq!(first.bytes_through(first.len()), 24);
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    hashes: Vec<u64>,
    /// `ends[k]`: the bytes of text covered by elements `0..=k`.
    ends: Vec<usize>,
    pinned: bool,
}

impl Prefix {
    /// The chain, first block first.
    #[must_use]
    pub fn hashes(&self) -> &[u64] {
        &self.hashes
    }

    /// The number of elements.
    #[must_use]
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    /// Whether the chain has no element (no text, no session).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// The bytes of text covered by the first `elements` elements (0 for 0; saturates at the
    /// whole chain).
    #[must_use]
    pub fn bytes_through(&self, elements: usize) -> usize {
        match elements.min(self.ends.len()) {
            0 => 0,
            n => self.ends[n - 1],
        }
    }

    /// The bytes of text the chain covers.
    #[must_use]
    pub fn total_bytes(&self) -> usize {
        self.bytes_through(self.len())
    }

    /// Whether the chain begins with a session element ([`PrefixBuilder::pin`]).
    #[must_use]
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }
}

/// Builds a [`Prefix`] from a request's segments, in the engine's reading order.
#[derive(Debug)]
pub struct PrefixBuilder {
    block: usize,
    max_blocks: usize,
    seed: u64,
    /// The bytes of text the chain covers so far.
    covered: usize,
    prefix: Prefix,
}

impl PrefixBuilder {
    /// A builder cutting blocks of `block` bytes (at least 1), stopping after `max_blocks`
    /// elements, with the chain seeded by `seed` (the gateway's secret).
    #[must_use]
    pub fn new(block: usize, max_blocks: usize, seed: u64) -> Self {
        Self {
            block: block.max(1),
            max_blocks,
            seed,
            covered: 0,
            prefix: Prefix::default(),
        }
    }

    /// Makes room at once for the chain of a request of `text_bytes` bytes in `segments`
    /// segments (at most `max_blocks` elements), so that it is built without growing.
    pub fn reserve(&mut self, text_bytes: usize, segments: usize) {
        let blocks = (text_bytes / self.block)
            .saturating_add(segments)
            .min(self.max_blocks)
            .saturating_sub(self.prefix.len());
        self.prefix.hashes.reserve_exact(blocks);
        self.prefix.ends.reserve_exact(blocks);
    }

    /// Mixes `bytes` (a model name, a user id) into the seed. Only before the first element:
    /// afterwards it does nothing, so the chain always covers its text from the start.
    pub fn salt(&mut self, bytes: &[u8]) {
        if self.prefix.is_empty() {
            self.seed = XxHash3_64::oneshot_with_seed(self.seed, bytes);
        }
    }

    /// Adds a session element (covering no text) for session `id`, once, before the blocks.
    pub fn pin(&mut self, id: &[u8]) {
        if self.prefix.is_empty() && self.max_blocks > 0 {
            let hash = XxHash3_64::oneshot_with_seed(self.seed ^ SESSION_TAG, id);
            self.push(hash, 0);
            self.prefix.pinned = true;
        }
    }

    /// Adds a message: every block of it, the last partial one too.
    pub fn message(&mut self, bytes: &[u8]) {
        self.segment(bytes, true);
    }

    /// Adds a text that a later request may extend in place: its full blocks only.
    pub fn text(&mut self, bytes: &[u8]) {
        self.segment(bytes, false);
    }

    /// The chain.
    #[must_use]
    pub fn finish(self) -> Prefix {
        self.prefix
    }

    fn segment(&mut self, bytes: &[u8], partial: bool) {
        let mut previous = self.prefix.hashes.last().copied().unwrap_or(self.seed);
        let mut rest = bytes;
        let mut k = 0;
        loop {
            let size = block_size(self.block, k);
            // A text's last, partial block is left out: it would differ once text is appended.
            if rest.is_empty()
                || self.prefix.len() >= self.max_blocks
                || (!partial && rest.len() < size)
            {
                return;
            }
            let (block, tail) = rest.split_at(size.min(rest.len()));
            previous = self.push(chain(previous, block_hash(block)), block.len());
            rest = tail;
            k += 1;
        }
    }

    /// Appends an element and returns its hash as stored.
    fn push(&mut self, hash: u64, bytes: usize) -> u64 {
        // 0 means "no successor" in the index.
        let hash = if hash == 0 { 1 } else { hash };
        self.covered += bytes;
        self.prefix.hashes.push(hash);
        self.prefix.ends.push(self.covered);
        hash
    }
}

/// The size of a segment's block `k` (from 0) when blocks start at `block` bytes: `block` for
/// the first [`GROW_EVERY`], doubling after each further `GROW_EVERY`, up to `8 × block`.
///
/// ```
/// use slotgate_choose::block_size;
///
/// let sizes: Vec<usize> = (0..14).map(|k| block_size(512, k)).collect();
/// assert_eq!(sizes[..4], [512; 4]);
/// assert_eq!(sizes[4..8], [1024; 4]);
/// assert_eq!(sizes[8..12], [2048; 4]);
/// assert_eq!(sizes[12..], [4096; 2]);
/// ```
#[must_use]
pub fn block_size(block: usize, k: usize) -> usize {
    let growth = u32::try_from(k / GROW_EVERY).map_or(MAX_GROWTH, |g| g.min(MAX_GROWTH));
    block.max(1).saturating_mul(1 << growth)
}

/// A block's own hash: XXH3 (64 bits, its default secret, no seed).
#[inline]
fn block_hash(block: &[u8]) -> u64 {
    XxHash3_64::oneshot(block)
}

/// The chain's next element: the previous element (or the seed) mixed with a block's own hash.
///
/// The previous element is rotated before it is combined, so that the mix is not symmetric
/// (block order matters), and the sum goes through a bijective 64-bit finalizer (the one of
/// `SplitMix64` / Murmur3's `fmix64` family): for a given previous element, two different block
/// hashes always give two different elements, and for a given block hash two different
/// previous elements do too. So two chains agree on element `k` only if they agreed on
/// element `k - 1` and the blocks' hashes agree (barring a 64-bit collision of the mix across
/// both), the property the index's longest match relies on. The seed (the gateway's secret)
/// enters through element 0's previous value, so clients cannot predict each other's chains.
fn chain(previous: u64, block: u64) -> u64 {
    let mut x = previous
        .rotate_left(23)
        .wrapping_add(block ^ 0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::{Prefix, PrefixBuilder};

    fn chain(block: usize, seed: u64, build: impl FnOnce(&mut PrefixBuilder)) -> Prefix {
        let mut builder = PrefixBuilder::new(block, 1000, seed);
        build(&mut builder);
        builder.finish()
    }

    #[test]
    fn a_message_is_hashed_whole_and_a_text_by_full_blocks() {
        let m = chain(4, 1, |b| b.message(b"abcdefghij"));
        assert_eq!(m.len(), 3);
        assert_eq!(m.bytes_through(3), 10);
        let t = chain(4, 1, |b| b.text(b"abcdefghij"));
        assert_eq!(t.len(), 2);
        assert_eq!(t.total_bytes(), 8);
        // The full blocks agree: same bytes, same seeds.
        assert_eq!(m.hashes()[..2], t.hashes()[..]);
    }

    #[test]
    fn a_long_segment_is_cut_into_growing_blocks() {
        let text: Vec<u8> = (0..200_u8).collect();
        let m = chain(4, 1, |b| b.message(&text));
        let ends: Vec<usize> = (1..=m.len()).map(|k| m.bytes_through(k)).collect();
        // 4 × 4 bytes, 4 × 8, 4 × 16, then 32 at a time, the last block partial.
        let expected = [4, 8, 12, 16, 24, 32, 40, 48, 64, 80, 96, 112, 144, 176, 200];
        assert_eq!(ends, expected);
        // A text keeps its full blocks only, cut the same way.
        let t = chain(4, 1, |b| b.text(&text));
        assert_eq!(t.total_bytes(), 176);
        assert_eq!(m.hashes()[..t.len()], t.hashes()[..]);
        // Each segment starts again from `block` bytes.
        let two = chain(4, 1, |b| {
            b.message(&text[..20]);
            b.message(&text[..20]);
        });
        let ends: Vec<usize> = (1..=two.len()).map(|k| two.bytes_through(k)).collect();
        assert_eq!(ends, [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]);
        // A text that grows keeps its chain past the growth too.
        let longer: Vec<u8> = (0..255_u8).collect();
        let grown = chain(4, 1, |b| b.text(&longer));
        assert!(grown.hashes().starts_with(t.hashes()));
    }

    #[test]
    fn each_element_stands_for_everything_before_it() {
        let a = chain(4, 1, |b| b.message(b"aaaabbbbcccc"));
        let b = chain(4, 1, |b| b.message(b"xaaabbbbcccc"));
        // Blocks 1 and 2 are the same bytes, but the chains differ from the first block on.
        assert!(a.hashes().iter().zip(b.hashes()).all(|(x, y)| x != y));
    }

    #[test]
    fn a_text_that_grows_keeps_its_chain_and_a_message_list_too() {
        let short = chain(4, 1, |b| b.text(b"0123456789"));
        let long = chain(4, 1, |b| b.text(b"0123456789abcdef"));
        assert!(long.hashes().starts_with(short.hashes()));
        let turn = chain(4, 1, |b| {
            b.message(b"sys");
            b.message(b"hi there");
        });
        let next = chain(4, 1, |b| {
            b.message(b"sys");
            b.message(b"hi there");
            b.message(b"hello");
        });
        assert!(next.hashes().starts_with(turn.hashes()));
    }

    #[test]
    fn seed_salt_and_session_set_chains_apart() {
        let text = |b: &mut PrefixBuilder| b.message(b"same words");
        let base = chain(4, 1, text);
        assert_ne!(base, chain(4, 2, text));
        let salted = chain(4, 1, |b| {
            b.salt(b"model-a");
            text(b);
        });
        assert_ne!(base.hashes(), salted.hashes());
        let pinned = chain(4, 1, |b| {
            b.pin(b"session-1");
            text(b);
        });
        assert!(pinned.is_pinned() && !base.is_pinned());
        assert_eq!(pinned.len(), base.len() + 1);
        assert_eq!(
            pinned.bytes_through(1),
            0,
            "the session element covers no text"
        );
        assert_eq!(pinned.total_bytes(), base.total_bytes());
        // A salt after the first element changes nothing.
        let late = chain(4, 1, |b| {
            text(b);
            b.salt(b"ignored");
            b.message(b"more");
        });
        let plain = chain(4, 1, |b| {
            text(b);
            b.message(b"more");
        });
        assert_eq!(late, plain);
    }

    #[test]
    fn the_chain_stops_at_max_blocks_and_odd_sizes_do_not_panic() {
        let mut b = PrefixBuilder::new(1, 5, 0);
        b.message(b"0123456789");
        let p = b.finish();
        assert_eq!(p.len(), 5);
        // Four blocks of 1 byte, then one of 2.
        assert_eq!(p.total_bytes(), 6);
        let mut b = PrefixBuilder::new(0, 0, 0);
        b.pin(b"s");
        b.message(b"abc");
        assert!(b.finish().is_empty());
        let mut b = PrefixBuilder::new(4, 10, 0);
        b.message(b"");
        b.text(b"abc");
        assert!(b.finish().is_empty());
        assert_eq!(Prefix::default().bytes_through(3), 0);
    }
}
