//! Making room at the connection limit: a listener at `max_connections` closes the connection
//! that has been idle the longest to admit a new one.
//!
//! A connection holds its place under the limit for as long as it is open, whether it carries
//! requests or not. Idle ones are cheap to keep and cheap to give up: a client whose idle
//! keep-alive connection is closed opens another when it has a request (as nginx reuses idle
//! keep-alive connections under pressure). So when a new connection comes and every place is
//! taken, the accept loop asks the connection with nothing in flight for the longest time to
//! close (HTTP/2 with a `GOAWAY`, also when its preface came but its task had not seen it yet;
//! one that has not spoken yet, or is still in its TLS handshake, simply closes), and admits the new one as soon as that place is free. A shed
//! connection gives up its place the moment it is asked, and finishes its goodbye (at most
//! 100 ms) beyond the limit: an idle HTTP/2 peer never answers the goodbye PING, and a backlog
//! of new connections would otherwise wait out those 100 ms once per shed, in turn. Connections
//! with a request in flight are never shed: they wait out the limit as before. The youngest
//! connections are shed last, so a client that just connected gets to send its request.
//!
//! Each shed is counted as `slotgate_bounds_total{bound="idle_shed"}`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tracing::debug;

use super::ServerCounters;
use crate::proxy::server::activity::Activity;
use crate::support::shutdown::ShutdownSignal;

/// How often the accept loop, holding a new connection at the limit, looks again for an idle
/// connection to shed (one that was busy may have gone idle).
const SHED_RETRY: Duration = Duration::from_millis(250);

/// At the connection limit, with a new connection accepted: sheds the connection idle the
/// longest, and waits for a place (looking again every [`SHED_RETRY`] while every connection
/// is busy). `None` when the server stops meanwhile.
pub(super) async fn make_room(
    name: &'static str,
    limit: &Arc<Semaphore>,
    roster: &Roster,
    counters: &ServerCounters,
    shutdown: &mut ShutdownSignal,
) -> Option<OwnedSemaphorePermit> {
    loop {
        if roster.shed_oldest_idle() {
            counters.idle_shed.inc();
            debug!(
                listener = name,
                "at the connection limit: closing the connection idle the longest"
            );
        }
        tokio::select! {
            biased;
            () = shutdown.fired() => return None,
            permit = Arc::clone(limit).acquire_owned() => return permit.ok(),
            () = tokio::time::sleep(SHED_RETRY) => {}
        }
    }
}

/// Every open connection of one listener, for shedding the idle ones.
#[derive(Debug, Default)]
pub(super) struct Roster {
    members: Mutex<Members>,
}

#[derive(Debug, Default)]
struct Members {
    next: u64,
    by_id: HashMap<u64, Entry>,
}

/// One connection on the roster.
#[derive(Debug)]
struct Entry {
    activity: Activity,
    shed: Arc<Notify>,
    /// Already asked to close: not asked again.
    asked: bool,
}

impl Roster {
    /// Puts a new connection, doing `activity`, on the roster, until the returned [`Member`] is
    /// dropped.
    pub(super) fn join(self: &Arc<Self>, activity: &Activity) -> Member {
        let shed = Arc::new(Notify::new());
        let mut members = self.members.lock();
        let id = members.next;
        members.next += 1;
        members.by_id.insert(
            id,
            Entry {
                activity: activity.clone(),
                shed: Arc::clone(&shed),
                asked: false,
            },
        );
        Member {
            roster: Arc::clone(self),
            id,
            shed,
        }
    }

    /// Asks the connection idle the longest (nothing in flight, not asked yet) to close;
    /// returns whether there was one.
    pub(super) fn shed_oldest_idle(&self) -> bool {
        let mut members = self.members.lock();
        let oldest = members
            .by_id
            .values_mut()
            .filter(|entry| !entry.asked && entry.activity.in_flight() == 0)
            .min_by_key(|entry| entry.activity.quiet_since());
        let Some(entry) = oldest else {
            return false;
        };
        entry.asked = true;
        // Keeps the wake-up if the connection is not waiting for it at this moment.
        entry.shed.notify_one();
        true
    }

    /// How many connections are on the roster.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.members.lock().by_id.len()
    }
}

/// A connection's place on the [`Roster`]; leaves it when dropped.
#[derive(Debug)]
pub(super) struct Member {
    roster: Arc<Roster>,
    id: u64,
    shed: Arc<Notify>,
}

impl Member {
    /// Resolves once the listener asks this connection to close to make room.
    pub(super) async fn shed_asked(&self) {
        self.shed.notified().await;
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.roster.members.lock().by_id.remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::{Activity, Roster};

    #[tokio::test(start_paused = true)]
    async fn the_connection_idle_longest_is_shed_first_and_busy_ones_never() {
        let roster = Arc::new(Roster::default());
        let (old, busy) = (Activity::new(), Activity::new());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let young = Activity::new();
        let members = [&old, &busy, &young].map(|activity| roster.join(activity));
        let request = busy.begin();

        assert!(roster.shed_oldest_idle());
        let asked = |i: usize| {
            let shed = members[i].shed_asked();
            tokio_test::task::spawn(shed).poll().is_ready()
        };
        assert!(asked(0), "the oldest idle one");
        assert!(!asked(2));
        assert!(roster.shed_oldest_idle());
        assert!(asked(2), "then the younger one");
        assert!(!roster.shed_oldest_idle(), "the busy one is never shed");
        assert!(!asked(1));
        drop(request);

        drop(members);
        assert_eq!(roster.len(), 0, "members leave when dropped");
    }
}
