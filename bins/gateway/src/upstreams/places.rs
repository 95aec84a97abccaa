//! The engine's memory as a shared resource: which models an upstream that loads models on
//! demand (llama-server router mode, Ollama, llama-swap) may hold at once, and who goes next
//! when it is full. A pure state machine: no clock of its own (every call takes `now`), no I/O,
//! no waiting; [`gate`] wraps it for the request path.
//!
//! # The rule
//!
//! An upstream has `capacity` places (router `max_instances`, or the upstream's
//! `max_loaded_models`). A model is *resident* when it holds one: loaded, loading or asleep, as
//! far as the gateway knows (its own admissions, corrected by the probes through
//! [`Places::observe`]). A request is *admitted* from when it may go on to its model's slot
//! queue until its answer ends; a model with admitted requests is never given up.
//!
//! 1. A request for a resident model goes at once, unless the loaded model is *closed* (rule 4)
//!    or earlier requests for it still wait.
//! 2. A request for a model that is not resident goes at once when a place is free, or when a
//!    resident model has no admitted request (the least recently used such model gives up its
//!    place: the engine unloads it when the new model loads).
//! 3. Otherwise it waits, first come first served across models: when a place frees, the model
//!    of the oldest waiter takes it and **all** its waiters go together (one load serves them
//!    all; their slot queue orders them after that).
//! 4. Collate, bounded: while a waiter for a model that is not resident has waited less than
//!    `collate_for`, requests for the resident models keep going (each swap costs a load,
//!    seconds to minutes on a GPU, so serving what is loaded first saves time for everyone).
//!    Once one has waited `collate_for`, the resident models are *closed*: new requests for
//!    them wait too, their admitted requests drain, and the place goes to the waiter. So no
//!    waiter waits for another model's work longer than `collate_for` plus the admitted
//!    requests' own run time.
//!
//! Without a capacity (an engine that does not say and no setting) every request goes at once:
//! the behaviour of an upstream that never swaps. Its admissions are counted all the same, so
//! a bound that appears later (read from the engine, or set by a reload) finds them.
//!
//! *Held*: while the bound is not known yet (an engine that may report one, not read so far),
//! nobody goes; requests wait, first come first served, and when the hold ends the rule above
//! applies to them as to any waiter (see [`gate`] for when it ends).

pub(crate) mod gate;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

/// One waiting request's number, to grant or cancel it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Ticket(u64);

/// What an arriving request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arrival {
    /// Admitted: it may go on.
    Go,
    /// It waits for this ticket to be granted (or cancels it).
    Wait(Ticket),
}

/// What the machine knows of one model on this upstream.
#[derive(Debug, Clone, Default)]
struct Entry {
    /// Holds a place.
    resident: bool,
    /// Requests admitted and not ended.
    admitted: usize,
    /// When it last admitted a request, for the least-recently-used choice.
    last_used: u64,
}

#[derive(Debug, Clone)]
struct Waiter {
    ticket: Ticket,
    model: Arc<str>,
    since: Instant,
}

/// One upstream's places (see the [module docs](self)).
#[derive(Debug, Clone)]
pub(crate) struct Places {
    capacity: Option<usize>,
    /// The bound is not known yet: nobody goes.
    held: bool,
    collate_for: Duration,
    models: BTreeMap<Arc<str>, Entry>,
    waiters: VecDeque<Waiter>,
    next_ticket: u64,
    /// A counter for `last_used`: the order of admissions, not their time.
    uses: u64,
}

/// A copy of one model's state, for the admin API and the metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ModelPlace {
    /// Holds a place, as far as the gateway knows.
    pub(crate) resident: bool,
    /// Requests admitted and not ended.
    pub(crate) admitted: usize,
    /// Requests waiting for the model to get a place.
    pub(crate) waiting: usize,
}

impl Places {
    /// `capacity` places (`None` or 0: no bound), collating for at most `collate_for`.
    pub(crate) fn new(capacity: Option<usize>, collate_for: Duration) -> Self {
        Self {
            capacity: capacity.filter(|&n| n > 0),
            held: false,
            collate_for,
            models: BTreeMap::new(),
            waiters: VecDeque::new(),
            next_ticket: 0,
            uses: 0,
        }
    }

    /// The bound in force (`None`: none).
    pub(crate) fn capacity(&self) -> Option<usize> {
        self.capacity
    }

    /// A request for `model` arrives.
    pub(crate) fn arrive(&mut self, model: &Arc<str>, now: Instant) -> Arrival {
        let queued_before = self.waiters.iter().any(|w| w.model == *model);
        if !queued_before && self.may_go(model, now) {
            self.admit(model);
            return Arrival::Go;
        }
        let ticket = Ticket(self.next_ticket);
        self.next_ticket += 1;
        self.waiters.push_back(Waiter {
            ticket,
            model: Arc::clone(model),
            since: now,
        });
        Arrival::Wait(ticket)
    }

    /// Whether a request for `model` arriving now would go at once (rules 1 and 2, and no
    /// earlier waiter of its model), without changing anything.
    pub(crate) fn would_go(&self, model: &str, now: Instant) -> bool {
        !self.waiters.iter().any(|w| &*w.model == model) && self.may_go(model, now)
    }

    /// An admitted request for `model` ended. Returns the tickets granted by it.
    pub(crate) fn leave(&mut self, model: &str, now: Instant) -> Vec<Ticket> {
        if let Some(entry) = self.models.get_mut(model) {
            entry.admitted = entry.admitted.saturating_sub(1);
        }
        self.pump(now)
    }

    /// A waiter gave up. Returns whether it was still waiting (false: it had been granted, and
    /// its caller must [`leave`](Self::leave) instead) and the tickets granted by its leaving.
    pub(crate) fn cancel(&mut self, ticket: Ticket, now: Instant) -> (bool, Vec<Ticket>) {
        let Some(at) = self.waiters.iter().position(|w| w.ticket == ticket) else {
            return (false, Vec::new());
        };
        self.waiters.remove(at);
        (true, self.pump(now))
    }

    /// What the probes found holding a place (loaded, loading or asleep). A model with admitted
    /// requests stays resident whatever a probe says (its load may not show yet); the others
    /// follow the probe. Returns the tickets granted.
    pub(crate) fn observe<'a>(
        &mut self,
        running: impl IntoIterator<Item = &'a str>,
        now: Instant,
    ) -> Vec<Ticket> {
        let running: Vec<&str> = running.into_iter().collect();
        for (name, entry) in &mut self.models {
            if entry.admitted == 0 {
                entry.resident = running.contains(&&**name);
            }
        }
        for name in running {
            self.models.entry(Arc::from(name)).or_default().resident = true;
        }
        self.pump(now)
    }

    /// A new bound (the router's `max_instances` read again, or a reload). Returns the tickets
    /// granted.
    pub(crate) fn set_capacity(&mut self, capacity: Option<usize>, now: Instant) -> Vec<Ticket> {
        self.capacity = capacity.filter(|&n| n > 0);
        self.pump(now)
    }

    /// Holds every request (`true`: the bound is not known yet) or lets them go by the rule
    /// again. Returns the tickets granted.
    pub(crate) fn set_held(&mut self, held: bool, now: Instant) -> Vec<Ticket> {
        self.held = held;
        self.pump(now)
    }

    /// Whether every request is held ([`set_held`](Self::set_held)).
    pub(crate) fn is_held(&self) -> bool {
        self.held
    }

    /// A new collation bound (a reload).
    pub(crate) fn set_collate_for(&mut self, collate_for: Duration) {
        self.collate_for = collate_for;
    }

    /// Every model known here, with its state.
    pub(crate) fn view(&self) -> BTreeMap<Arc<str>, ModelPlace> {
        let mut out: BTreeMap<Arc<str>, ModelPlace> = self
            .models
            .iter()
            .map(|(name, e)| {
                let place = ModelPlace {
                    resident: e.resident,
                    admitted: e.admitted,
                    waiting: 0,
                };
                (Arc::clone(name), place)
            })
            .collect();
        for w in &self.waiters {
            out.entry(Arc::clone(&w.model))
                .or_insert(ModelPlace {
                    resident: false,
                    admitted: 0,
                    waiting: 0,
                })
                .waiting += 1;
        }
        out
    }

    /// The models a waiting `ticket` is behind: other models, not resident, with a waiter before
    /// its model's first (all of a model's waiters go with its first, and each of those models
    /// needs a load first); `None` once it is no longer waiting.
    pub(crate) fn models_ahead(&self, ticket: Ticket) -> Option<usize> {
        let own = &self.waiters.iter().find(|w| w.ticket == ticket)?.model;
        let first = self.waiters.iter().position(|w| w.model == *own)?;
        let mut ahead: Vec<&str> = Vec::new();
        for waiter in self.waiters.iter().take(first) {
            let model = &*waiter.model;
            if model != &**own && !self.is_resident(model) && !ahead.contains(&model) {
                ahead.push(model);
            }
        }
        Some(ahead.len())
    }

    /// Requests waiting for `model`.
    pub(crate) fn waiting(&self, model: &str) -> usize {
        self.waiters.iter().filter(|w| &*w.model == model).count()
    }

    /// Whether `model` holds a place.
    pub(crate) fn is_resident(&self, model: &str) -> bool {
        self.models.get(model).is_some_and(|e| e.resident)
    }

    // === the rule ===

    fn resident_count(&self) -> usize {
        self.models.values().filter(|e| e.resident).count()
    }

    /// Rule 4: a waiter for a model without a place has waited `collate_for`.
    fn closed(&self, now: Instant) -> bool {
        self.waiters.iter().any(|w| {
            !self.is_resident(&w.model)
                && now.saturating_duration_since(w.since) >= self.collate_for
        })
    }

    /// The resident model that would give up its place: no admitted request, least recently
    /// used.
    fn victim(&self, except: &str) -> Option<Arc<str>> {
        self.models
            .iter()
            .filter(|(name, e)| e.resident && e.admitted == 0 && &***name != except)
            .min_by_key(|(_, e)| e.last_used)
            .map(|(name, _)| Arc::clone(name))
    }

    /// Rules 1 and 2, for a request not behind earlier waiters of its model.
    fn may_go(&self, model: &str, now: Instant) -> bool {
        if self.held {
            return false;
        }
        let Some(capacity) = self.capacity else {
            return true;
        };
        if self.is_resident(model) {
            return !self.closed(now);
        }
        self.resident_count() < capacity || self.victim(model).is_some()
    }

    /// Takes a place for `model` if it has none, giving up a victim's when full.
    fn admit(&mut self, model: &Arc<str>) {
        let full = self
            .capacity
            .is_some_and(|capacity| self.resident_count() >= capacity);
        if full
            && !self.is_resident(model)
            && let Some(victim) = self.victim(model)
            && let Some(entry) = self.models.get_mut(&victim)
        {
            entry.resident = false;
        }
        self.uses += 1;
        let entry = self.models.entry(Arc::clone(model)).or_default();
        entry.resident = true;
        entry.admitted += 1;
        entry.last_used = self.uses;
    }

    /// Grants what may go now: the waiters of resident models while not closed, then the
    /// oldest waiter's model when it can take a place, with all its waiters.
    fn pump(&mut self, now: Instant) -> Vec<Ticket> {
        let mut granted = Vec::new();
        if self.held {
            return granted;
        }
        loop {
            let closed = self.closed(now);
            let next = self
                .waiters
                .iter()
                .find(|w| self.is_resident(&w.model) && !closed)
                // Rule 3: else only the oldest waiter for a model without a place may take one
                // (FIFO across models).
                .or_else(|| self.waiters.iter().find(|w| !self.is_resident(&w.model)))
                .map(|w| Arc::clone(&w.model));
            let Some(model) = next else {
                return granted;
            };
            if !self.is_resident(&model) && !self.may_go(&model, now) {
                return granted;
            }
            // All of the model's waiters go together, in their order.
            let mut kept = VecDeque::with_capacity(self.waiters.len());
            for waiter in std::mem::take(&mut self.waiters) {
                if waiter.model == model {
                    self.admit(&model);
                    granted.push(waiter.ticket);
                } else {
                    kept.push_back(waiter);
                }
            }
            self.waiters = kept;
        }
    }
}
