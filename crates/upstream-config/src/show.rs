//! How a validated value is written back in the effective configuration (`slotgate check`):
//! durations as humantime strings, addresses and paths as text, secrets as `"<redacted>"`.
//!
//! A key's declaration ([`crate::key`]) renders its value through [`Show`], the rendering of its
//! type, unless it says otherwise; what comes out is a [`Shown`], which serializes exactly as the
//! plain value would, so a table of them renders as if each field were typed.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde::ser::{SerializeStruct as _, Serializer};

use crate::secret::Secret;

/// What a secret prints as.
pub(crate) const REDACTED: &str = "<redacted>";

/// One key's value as the effective configuration writes it.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum Shown<'a> {
    /// An integer.
    Count(usize),
    /// `true` or `false`.
    Bool(bool),
    /// A string made for the occasion (a duration, an address, a path).
    Text(String),
    /// A string that is already there, or a fixed one (`"on"`, `"<redacted>"`).
    Str(&'a str),
    /// An array of strings.
    List(&'a [String]),
    /// `server.api_keys`: each a redacted bare key or a table (see [`ClientKeyShown`]).
    ClientKeys(Vec<ClientKeyShown<'a>>),
}

/// An `api_keys` entry: a bare key as it was written, a key with queueing attributes as a
/// table with all of them.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub(crate) enum ClientKeyShown<'a> {
    Bare(&'static str),
    Table {
        key: &'static str,
        #[serde(skip_serializing_if = "Option::is_none")]
        name: Option<&'a str>,
        priority: &'static str,
        share: u32,
    },
}

/// A table's keys in order, each with its shown value; keys shown as nothing are left out.
#[derive(Debug, Default)]
pub(crate) struct ShownTable<'a>(pub(crate) Vec<(&'static str, Shown<'a>)>);

impl Serialize for ShownTable<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        // A struct, as a derived `Serialize` would write it: same calls, so the same TOML.
        let mut table = serializer.serialize_struct("table", self.0.len())?;
        for (key, value) in &self.0 {
            table.serialize_field(key, value)?;
        }
        table.end()
    }
}

/// How a type is written in the effective configuration; `None`: the key is left out (an
/// optional key that is unset).
pub(crate) trait Show {
    fn show(&self) -> Option<Shown<'_>>;
}

impl Show for usize {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Count(*self))
    }
}

impl Show for bool {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Bool(*self))
    }
}

impl Show for Duration {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Text(human(*self)))
    }
}

impl Show for SocketAddr {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Text(self.to_string()))
    }
}

impl Show for PathBuf {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Text(display(self)))
    }
}

impl Show for String {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Str(self))
    }
}

impl Show for Vec<String> {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::List(self))
    }
}

impl Show for Secret {
    fn show(&self) -> Option<Shown<'_>> {
        Some(Shown::Str(REDACTED))
    }
}

impl<T: Show> Show for Option<T> {
    fn show(&self) -> Option<Shown<'_>> {
        self.as_ref().and_then(Show::show)
    }
}

/// `"5m"`, `"1m 30s"`, `"500ms"`: what humantime writes, and reads back.
pub(crate) fn human(duration: Duration) -> String {
    humantime::format_duration(duration).to_string()
}

/// A path as text.
pub(crate) fn display(path: &Path) -> String {
    path.display().to_string()
}

/// A switch as the configuration writes it.
pub(crate) fn on_off(on: bool) -> &'static str {
    if on { "on" } else { "off" }
}
