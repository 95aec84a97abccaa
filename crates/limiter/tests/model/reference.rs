// The reference model of the limiter's state-machine test: what every implementation of its
// contract must do, step by step. Included (`include!`) by `crates/limiter/tests/model.rs`
// (the in-process limiter) and `crates/limiter-redis/tests/model.rs` (the shared one on Redis),
// which bring the imports: `BTreeMap`, `VecDeque`, proptest's prelude and `Index`,
// `ReferenceStateMachine`; and `KEYS`, the three (host, model) keys.

// ===== the reference model =====

/// Keys of host `h1`, which `ConfigureHost` caps.
const H1_KEYS: [usize; 2] = [0, 1];

#[derive(Debug, Clone, Default)]
struct KeyModel {
    parallel: usize,
    queue: usize,
    in_flight: usize,
    /// Waiters (id, weight) in grant order.
    waiters: VecDeque<(u64, usize)>,
    /// Counts against the host cap.
    attached: bool,
    /// In the host cap's queue of blocked keys.
    blocked: bool,
}

impl KeyModel {
    fn unconfigured(attached: bool) -> Self {
        Self {
            parallel: 1,
            queue: 0,
            attached,
            ..Self::default()
        }
    }

    fn too_heavy(&self, weight: usize) -> bool {
        self.parallel > 0 && weight > self.parallel
    }

    fn fits(&self, weight: usize) -> bool {
        self.in_flight + weight <= self.parallel
    }

    fn reserved(&self) -> usize {
        if self.waiters.is_empty() {
            0
        } else {
            self.parallel.saturating_sub(self.in_flight)
        }
    }
}

/// The host cap of `h1`.
#[derive(Debug, Clone, Default)]
struct CapModel {
    parallel: usize,
    in_flight: usize,
    /// Keys whose head waits for the cap, in line.
    blocked: VecDeque<usize>,
}

impl CapModel {
    fn too_heavy(&self, weight: usize) -> bool {
        self.parallel > 0 && weight > self.parallel
    }

    fn fits(&self, weight: usize) -> bool {
        self.in_flight + weight <= self.parallel
    }

    fn reserved(&self) -> usize {
        if self.blocked.is_empty() {
            0
        } else {
            self.parallel.saturating_sub(self.in_flight)
        }
    }
}

/// What a permit or waiter belongs to: a key's current incarnation (removal starts a new one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Owner {
    key: usize,
    epoch: u64,
}

/// A permit held.
#[derive(Debug, Clone, Copy)]
struct Held {
    owner: Owner,
    weight: usize,
    /// Counts against the host cap.
    counted: bool,
}

#[derive(Debug, Clone, Default)]
struct Model {
    keys: Vec<Option<KeyModel>>,
    epochs: Vec<u64>,
    cap: Option<CapModel>,
    next_id: u64,
    permits: BTreeMap<u64, Held>,
    /// Waiters queued: id → (owner, weight).
    waiting: BTreeMap<u64, (Owner, usize)>,
    /// Waiters granted by the last step, which the SUT must see ready.
    just_granted: Vec<u64>,
    /// Waiters closed by the last step.
    just_closed: Vec<u64>,
    /// Waiters refused as too heavy by the last step (a shrink).
    just_refused: Vec<u64>,
    /// Outcome of the last acquire / try-acquire.
    last: Option<Outcome>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Granted,
    Queued,
    QueueFull,
    NoSlot,
    TooHeavy,
}

#[derive(Debug, Clone)]
enum Transition {
    Configure {
        key: usize,
        parallel: usize,
        queue: usize,
    },
    ConfigureHost {
        parallel: usize,
    },
    Acquire {
        key: usize,
        weight: usize,
    },
    TryAcquire {
        key: usize,
        weight: usize,
    },
    Cancel(Index),
    Release(Index),
    Remove {
        key: usize,
    },
}

impl Model {
    fn key_mut(&mut self, key: usize) -> &mut KeyModel {
        let attached = self.cap.is_some() && H1_KEYS.contains(&key);
        self.keys[key].get_or_insert_with(|| KeyModel::unconfigured(attached))
    }

    fn owner(&self, key: usize) -> Owner {
        Owner {
            key,
            epoch: self.epochs[key],
        }
    }

    fn grant(&mut self, id: u64, held: Held) {
        self.waiting.remove(&id).expect("granted waiter waits");
        self.permits.insert(id, held);
        self.just_granted.push(id);
    }

    fn refuse(&mut self, id: u64) {
        self.waiting.remove(&id);
        self.just_refused.push(id);
    }

    /// The key's grant step, as the limiter's: heads in order while each fits the key and (if
    /// attached) the cap with its turn there; else the key lines up for the cap. Returns
    /// whether the cap's front changed.
    fn fill(&mut self, key: usize) -> bool {
        let owner = self.owner(key);
        let mut moved = false;
        loop {
            let Some(k) = self.keys[key].as_mut() else {
                return moved;
            };
            let Some(&(id, weight)) = k.waiters.front() else {
                break;
            };
            if k.too_heavy(weight) {
                k.waiters.pop_front();
                self.refuse(id);
                continue;
            }
            if !k.fits(weight) {
                break;
            }
            let held = Held {
                owner,
                weight,
                counted: k.attached,
            };
            if !k.attached {
                k.in_flight += weight;
                k.waiters.pop_front();
                self.grant(id, held);
                continue;
            }
            let cap = self.cap.as_mut().expect("attached keys have a cap");
            if cap.too_heavy(weight) {
                k.waiters.pop_front();
                self.refuse(id);
                continue;
            }
            let turn = cap.blocked.front().is_none_or(|&f| f == key);
            if turn && cap.fits(weight) {
                cap.in_flight += weight;
                if k.blocked {
                    cap.blocked.pop_front();
                    k.blocked = false;
                    moved = true;
                }
                k.in_flight += weight;
                k.waiters.pop_front();
                self.grant(id, held);
                continue;
            }
            if !k.blocked {
                cap.blocked.push_back(key);
                k.blocked = true;
            }
            return moved;
        }
        if let Some(k) = self.keys[key].as_mut()
            && k.blocked
        {
            k.blocked = false;
            let cap = self.cap.as_mut().expect("blocked keys have a cap");
            let at = cap.blocked.iter().position(|&f| f == key).expect("in line");
            cap.blocked.remove(at);
            moved |= at == 0;
        }
        moved
    }

    /// The cap's kick: the front key takes free cap units while it makes progress.
    fn kick(&mut self) {
        loop {
            let Some(cap) = &self.cap else { return };
            let Some(&front) = cap.blocked.front() else {
                return;
            };
            if cap.in_flight >= cap.parallel || !self.fill(front) {
                return;
            }
        }
    }

    fn configure_host(&mut self, parallel: usize) {
        if self.cap.is_none() {
            self.cap = Some(CapModel {
                parallel,
                ..CapModel::default()
            });
            for key in H1_KEYS {
                let Some(k) = self.keys[key].as_mut() else {
                    continue;
                };
                k.attached = true;
                let units = k.in_flight;
                self.cap.as_mut().expect("just made").in_flight += units;
                let owner = self.owner(key);
                for held in self.permits.values_mut() {
                    if held.owner == owner {
                        held.counted = true;
                    }
                }
                self.fill(key);
                self.kick();
            }
        }
        self.cap.as_mut().expect("made above").parallel = parallel;
        self.kick();
    }

    fn acquire(&mut self, key: usize, weight: usize, is_try: bool) {
        let owner = self.owner(key);
        let id = self.next_id;
        self.next_id += 1;
        let k = self.key_mut(key);
        let free = k.waiters.is_empty() && k.fits(weight);
        let attached = k.attached;
        let outcome = if k.too_heavy(weight) {
            Outcome::TooHeavy
        } else if attached {
            let cap = self.cap.as_mut().expect("attached keys have a cap");
            if cap.too_heavy(weight) {
                Outcome::TooHeavy
            } else if free && cap.blocked.is_empty() && cap.fits(weight) {
                cap.in_flight += weight;
                Outcome::Granted
            } else {
                Outcome::NoSlot
            }
        } else if free {
            Outcome::Granted
        } else {
            Outcome::NoSlot
        };
        let k = self.keys[key].as_mut().expect("made above");
        let outcome = match outcome {
            Outcome::Granted => {
                k.in_flight += weight;
                self.permits.insert(
                    id,
                    Held {
                        owner,
                        weight,
                        counted: attached,
                    },
                );
                Outcome::Granted
            }
            Outcome::NoSlot if is_try => Outcome::NoSlot,
            Outcome::NoSlot if k.waiters.len() >= k.queue => Outcome::QueueFull,
            Outcome::NoSlot => {
                k.waiters.push_back((id, weight));
                self.waiting.insert(id, (owner, weight));
                if attached && self.fill(key) {
                    self.kick();
                }
                Outcome::Queued
            }
            other => other,
        };
        self.last = Some(outcome);
    }

    fn release(&mut self, held: Held) {
        if held.counted {
            let cap = self.cap.as_mut().expect("counted permits have a cap");
            cap.in_flight -= held.weight;
        }
        let owner = held.owner;
        // A removed key's permit releases into its old state, gone from the limiter's view.
        if owner.epoch == self.epochs[owner.key]
            && let Some(k) = self.keys[owner.key].as_mut()
        {
            k.in_flight -= held.weight;
            self.fill(owner.key);
        }
        self.kick();
    }
}

struct LimiterModel;

impl ReferenceStateMachine for LimiterModel {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Self::State> {
        Just(Model {
            keys: vec![None; KEYS.len()],
            epochs: vec![0; KEYS.len()],
            ..Model::default()
        })
        .boxed()
    }

    fn transitions(_state: &Self::State) -> BoxedStrategy<Self::Transition> {
        let key = 0..KEYS.len();
        // Mostly weight 1 (today's traffic), some heavier, now and then above `parallel`.
        let weight = prop_oneof![3 => Just(1usize), 2 => 2..4usize];
        prop_oneof![
            2 => (key.clone(), 0..5usize, 0..4usize)
                .prop_map(|(key, parallel, queue)| Transition::Configure { key, parallel, queue }),
            1 => (0..5usize).prop_map(|parallel| Transition::ConfigureHost { parallel }),
            6 => (key.clone(), weight.clone())
                .prop_map(|(key, weight)| Transition::Acquire { key, weight }),
            2 => (key.clone(), weight)
                .prop_map(|(key, weight)| Transition::TryAcquire { key, weight }),
            3 => any::<Index>().prop_map(Transition::Cancel),
            5 => any::<Index>().prop_map(Transition::Release),
            1 => key.prop_map(|key| Transition::Remove { key }),
        ]
        .boxed()
    }

    fn preconditions(state: &Self::State, t: &Self::Transition) -> bool {
        match t {
            Transition::Cancel(_) => !state.waiting.is_empty(),
            Transition::Release(_) => !state.permits.is_empty(),
            _ => true,
        }
    }

    fn apply(mut state: Self::State, t: &Self::Transition) -> Self::State {
        state.just_granted.clear();
        state.just_closed.clear();
        state.just_refused.clear();
        state.last = None;
        match *t {
            Transition::Configure {
                key,
                parallel,
                queue,
            } => {
                let k = state.key_mut(key);
                k.parallel = parallel;
                k.queue = queue;
                state.fill(key);
                state.kick();
            }
            Transition::ConfigureHost { parallel } => state.configure_host(parallel),
            Transition::Acquire { key, weight } => state.acquire(key, weight, false),
            Transition::TryAcquire { key, weight } => state.acquire(key, weight, true),
            Transition::Cancel(index) => {
                let id = *index.get(&state.waiting.keys().copied().collect::<Vec<_>>());
                let (owner, _) = state.waiting.remove(&id).expect("precondition");
                if let Some(k) = state.keys[owner.key].as_mut() {
                    k.waiters.retain(|(w, _)| *w != id);
                }
                // A head that leaves lets the next one take the units set aside for it.
                state.fill(owner.key);
                state.kick();
            }
            Transition::Release(index) => {
                let id = *index.get(&state.permits.keys().copied().collect::<Vec<_>>());
                let held = state.permits.remove(&id).expect("precondition");
                state.release(held);
            }
            Transition::Remove { key } => {
                if let Some(k) = state.keys[key].as_mut() {
                    for (w, _) in std::mem::take(&mut k.waiters) {
                        state.waiting.remove(&w);
                        state.just_closed.push(w);
                    }
                    // No waiter left: off the cap's line, and the next key in line goes on.
                    state.fill(key);
                    state.kick();
                }
                state.keys[key] = None;
                state.epochs[key] += 1;
            }
        }
        state
    }
}
