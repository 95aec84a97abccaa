//! The synchronisation primitives the limiter uses, in one place, so the loom suite can swap them.
//!
//! Under `--cfg loom` every lock and `Arc` comes from [loom], which explores the interleavings of
//! the code that uses them; otherwise they are `parking_lot`'s and `std`'s. Both sides expose
//! the same `lock()` / `read()` / `write()` that return guards directly (no poisoning), as tokio's
//! `loom/mocked.rs` does.
//!
//! [loom]: https://docs.rs/loom

#[cfg(not(loom))]
mod inner {
    pub(crate) use parking_lot::{Mutex, MutexGuard, RwLock};
    pub(crate) use std::sync::Arc;
}

#[cfg(loom)]
mod inner {
    pub(crate) use loom::sync::{Arc, MutexGuard};

    /// loom's mutex with a `parking_lot`-shaped `lock()`.
    #[derive(Debug)]
    pub(crate) struct Mutex<T>(loom::sync::Mutex<T>);

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::Mutex::new(value))
        }

        pub(crate) fn lock(&self) -> loom::sync::MutexGuard<'_, T> {
            // loom poisons only when a model thread panicked, which already fails the model.
            self.0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }

    /// loom's reader-writer lock with `parking_lot`-shaped `read()` / `write()`.
    #[derive(Debug)]
    pub(crate) struct RwLock<T>(loom::sync::RwLock<T>);

    impl<T> RwLock<T> {
        pub(crate) fn new(value: T) -> Self {
            Self(loom::sync::RwLock::new(value))
        }

        pub(crate) fn read(&self) -> loom::sync::RwLockReadGuard<'_, T> {
            self.0
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }

        pub(crate) fn write(&self) -> loom::sync::RwLockWriteGuard<'_, T> {
            self.0
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        }
    }
}

pub(crate) use inner::{Arc, Mutex, MutexGuard, RwLock};
