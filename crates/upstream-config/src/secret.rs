//! Credentials: a string that never reaches a log, an error message or the effective config.

use std::fmt;

/// A credential. `Debug` prints `Secret(<redacted>)` and there is no `Display`, so it cannot end
/// up in a log by accident; [`Secret::expose`] is the one way to read it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a credential.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The credential itself: for building a header or comparing, never for logging.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}
