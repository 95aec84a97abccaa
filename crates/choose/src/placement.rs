//! Placement across hosts for a model that is not loaded everywhere: after the ranking (which
//! already tries every host where the model is loaded before any that must load it), the hosts
//! that must load it are put in the order of what the load costs there. A host where the load
//! can start now (a free place for the model, or a loaded model with no work to give up) comes
//! before one whose engine is full of models with requests running, where the request would
//! first wait for that work to drain. Within one cost the ranking's order is kept (free slots ×
//! weight, shortest queue, list order): the step only reorders hosts the ranking put in the
//! same pass, and never moves a host where the model is loaded.

/// What serving the model costs on one host, cheapest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoadCost {
    /// The model is loaded (or loading) there: no load.
    Loaded,
    /// A load can start at once: a free place, or a loaded model with no work in flight.
    PlaceFree,
    /// Every place is held by a model with work in flight: the load waits for it to drain.
    Busy,
}

/// Reorders `ranked` (best first, as [`ranked`](crate::ranked) gave it) by `cost`, stably:
/// hosts of one cost keep their order. `cost` is called once per host.
///
/// # Example
///
/// ```
/// use slotgate_choose::{LoadCost, by_load_cost};
///
/// let mut hosts = [("a", LoadCost::Loaded), ("b", LoadCost::Busy), ("c", LoadCost::PlaceFree)];
/// by_load_cost(&mut hosts, |h| h.1);
/// assert_eq!(hosts.map(|h| h.0), ["a", "c", "b"]);
/// ```
pub fn by_load_cost<C>(ranked: &mut [C], mut cost: impl FnMut(&C) -> LoadCost) {
    ranked.sort_by_cached_key(|host| cost(host));
}

#[cfg(test)]
mod tests {
    use super::{LoadCost, by_load_cost};

    #[test]
    fn the_ranking_is_kept_within_a_cost_and_loaded_hosts_never_move() {
        use LoadCost::{Busy, Loaded, PlaceFree};
        let mut hosts = [
            (0, Loaded),
            (1, Busy),
            (2, Loaded),
            (3, PlaceFree),
            (4, Busy),
            (5, PlaceFree),
        ];
        let mut calls = 0;
        by_load_cost(&mut hosts, |h| {
            calls += 1;
            h.1
        });
        assert_eq!(hosts.map(|h| h.0), [0, 2, 3, 5, 1, 4]);
        assert_eq!(calls, 6, "once per host");
    }

    #[test]
    fn a_ranking_already_in_cost_order_is_unchanged() {
        let mut hosts = [LoadCost::Loaded, LoadCost::PlaceFree, LoadCost::Busy];
        by_load_cost(&mut hosts, |h| *h);
        assert_eq!(
            hosts,
            [LoadCost::Loaded, LoadCost::PlaceFree, LoadCost::Busy]
        );
    }
}
