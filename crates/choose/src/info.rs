//! What the gateway knows about one candidate host, and the two derived facts the ranking uses.

/// What the gateway knows about one candidate host for the requested model.
///
/// Returned by the `info` closure passed to [`best`](crate::best) and [`ranked`](crate::ranked).
/// Returning [`None`] instead means the host is unknown (for example, removed by a reload) and
/// never chosen.
///
/// # Example
///
/// ```
/// use slotgate_choose::Info;
///
/// let info = Info {
///     healthy: true,
///     draining: false,
///     loaded: true,
///     can_serve: true,
///     free: 3,
///     queued: 0,
///     weight: 2.0,
/// };
/// assert!(info.is_eligible());
/// assert_eq!(info.score(), 6.0);
/// ```
#[derive(Debug, Clone, Copy, PartialEq)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "four independent facts the gateway reads off its host state; a plain record is \
              the clearest way to fill them in from a closure"
)]
pub struct Info {
    /// The host passes its health checks.
    pub healthy: bool,
    /// The host is being drained (admin API or shutdown): it keeps its in-flight requests but
    /// takes no new ones.
    pub draining: bool,
    /// The model is resident on the host now, so a request starts without a load.
    pub loaded: bool,
    /// The host is configured for the model and could load it on demand.
    pub can_serve: bool,
    /// Free slots for the model on the host (`parallel - in_flight`). Zero is still eligible:
    /// the request waits in the host's queue.
    pub free: usize,
    /// Requests already waiting in the host's queue for the model.
    pub queued: usize,
    /// The operator's preference for the host; it multiplies `free`. Any `f64` is accepted,
    /// see [`Info::score`] for what non-positive and non-finite weights do.
    pub weight: f64,
}

impl Info {
    /// Whether the host may be chosen at all: healthy, not draining, and the model is either
    /// loaded or can be served. `free` and `weight` play no part.
    #[must_use]
    pub fn is_eligible(&self) -> bool {
        self.healthy && !self.draining && (self.loaded || self.can_serve)
    }

    /// The score within a pass: `free × weight`, higher is better.
    ///
    /// A product that is not a number greater than zero counts as `0.0`:
    ///
    /// | weight | `free > 0` | `free == 0` |
    /// |---|---|---|
    /// | finite, > 0 | `free × weight` | `0.0` |
    /// | `+∞` | `+∞` | `0.0` (`0 × ∞` is `NaN`) |
    /// | `0.0`, `-0.0`, negative, `-∞` | `0.0` | `0.0` |
    /// | `NaN` | `0.0` | `0.0` |
    ///
    /// So the result is never `NaN` and never negative (not even `-0.0`), and plain `>`
    /// between two scores is a total order. A host whose score is `0.0` stays eligible; it
    /// simply ranks like a host with no free slot.
    #[must_use]
    pub fn score(&self) -> f64 {
        // Precision loss only starts above 2^53 free slots, far past any real engine, and
        // would only blur the order between two such absurd hosts.
        #[expect(clippy::cast_precision_loss, reason = "slot counts are far below 2^53")]
        let raw = self.free as f64 * self.weight;
        // `raw > 0.0` is false for NaN, ±0.0 and negatives: all of them become +0.0.
        if raw > 0.0 { raw } else { 0.0 }
    }
}
