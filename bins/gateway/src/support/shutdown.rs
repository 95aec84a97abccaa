//! The shutdown signal: one trigger, any number of waiters. The listeners, the queues and the
//! background checks all stop on it.

use tokio::sync::watch;

/// A shutdown signal that any number of tasks can wait for.
#[derive(Debug, Clone)]
pub(crate) struct ShutdownSignal(watch::Receiver<bool>);

/// The trigger of a [`ShutdownSignal`].
#[derive(Debug)]
pub(crate) struct ShutdownTrigger(watch::Sender<bool>);

/// A linked trigger and signal.
pub(crate) fn shutdown_pair() -> (ShutdownTrigger, ShutdownSignal) {
    let (tx, rx) = watch::channel(false);
    (ShutdownTrigger(tx), ShutdownSignal(rx))
}

impl ShutdownTrigger {
    /// Fires the signal (idempotent).
    pub(crate) fn fire(&self) {
        self.0.send_replace(true);
    }
}

impl ShutdownSignal {
    /// Resolves once the trigger has fired (or was dropped).
    pub(crate) async fn fired(&mut self) {
        // An error means the trigger is gone, which can only happen when everything is stopping.
        let _ = self.0.wait_for(|fired| *fired).await;
    }

    /// Whether the trigger has fired.
    pub(crate) fn is_fired(&self) -> bool {
        *self.0.borrow()
    }
}
