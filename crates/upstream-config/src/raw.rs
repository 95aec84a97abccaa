//! The permissive first pass: reading the merged figment tree without ever stopping early.
//!
//! Why not `#[derive(Deserialize)]` on the config types: serde stops at the first problem (a
//! wrong type, a missing field, an unknown key under `deny_unknown_fields`), so an operator would
//! fix one typo per restart. Instead the whole tree is extracted as a figment [`Value`], and the
//! accessors here turn each leaf into a Rust value or record an [`Issue`] at its key path and
//! return `None`. The caller keeps going, so one run reports every problem.

use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::time::Duration;

use figment::Figment;
use figment::value::{Dict, Num, Value};

use crate::error::Issue;

// ===== KeyPath =====

/// Where a value sits, displayed the way it would be written in TOML.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct KeyPath(Vec<Segment>);

#[derive(Clone, Debug, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

impl KeyPath {
    pub(crate) fn root() -> Self {
        KeyPath::default()
    }

    pub(crate) fn key(&self, key: &str) -> Self {
        let mut path = self.clone();
        path.0.push(Segment::Key(key.to_owned()));
        path
    }

    pub(crate) fn index(&self, index: usize) -> Self {
        let mut path = self.clone();
        path.0.push(Segment::Index(index));
        path
    }

    /// The `SLOTGATE_A__B__C` variable that sets this key; `None` inside an array, which the
    /// environment can only set whole.
    fn env_var(&self) -> Option<String> {
        let mut var = String::from(crate::ENV_PREFIX);
        for (i, segment) in self.0.iter().enumerate() {
            let Segment::Key(key) = segment else {
                return None;
            };
            if i > 0 {
                var.push_str("__");
            }
            var.push_str(&key.to_ascii_uppercase());
        }
        Some(var)
    }
}

impl fmt::Display for KeyPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, segment) in self.0.iter().enumerate() {
            match segment {
                Segment::Key(key) => {
                    if i > 0 {
                        f.write_char('.')?;
                    }
                    if is_bare_key(key) {
                        f.write_str(key)?;
                    } else {
                        // Quoted like TOML, so `models."llama3.1:8b"` stays one segment.
                        write!(f, "{key:?}")?;
                    }
                }
                Segment::Index(index) => write!(f, "[{index}]")?,
            }
        }
        Ok(())
    }
}

/// TOML's bare-key alphabet.
fn is_bare_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

// ===== Reader =====

/// Collects issues while the tree is read.
pub(crate) struct Reader<'f> {
    figment: &'f Figment,
    /// figment's metadata name for our environment provider, to recognise overridden values.
    env_name: String,
    issues: Vec<Issue>,
}

impl<'f> Reader<'f> {
    /// A reader of `figment`, whose environment overrides come from the provider named
    /// `env_name` (its metadata name; passed in so that this module stays below `load`).
    pub(crate) fn new(figment: &'f Figment, env_name: String) -> Self {
        Reader {
            figment,
            env_name,
            issues: Vec::new(),
        }
    }

    pub(crate) fn into_issues(self) -> Vec<Issue> {
        self.issues
    }

    pub(crate) fn has_issues(&self) -> bool {
        !self.issues.is_empty()
    }

    /// Records a problem at `path`.
    pub(crate) fn issue(&mut self, path: &KeyPath, message: impl Into<String>) {
        self.issues.push(Issue {
            path: path.to_string(),
            message: message.into(),
        });
    }

    /// Records a problem with a value that is present. When an environment variable set it, the
    /// message says which one: an override is invisible in the file the operator is reading.
    pub(crate) fn invalid(&mut self, path: &KeyPath, value: &Value, message: impl Into<String>) {
        let mut message = message.into();
        if let Some(var) = self.env_var(path, value) {
            let _ = write!(message, " (set by environment variable {var})");
        }
        self.issue(path, message);
    }

    /// Records a required key that is absent. The hint says what to write.
    pub(crate) fn missing(&mut self, path: &KeyPath, hint: &str) {
        self.issue(path, format!("missing ({hint})"));
    }

    fn env_var(&self, path: &KeyPath, value: &Value) -> Option<String> {
        let metadata = self.figment.get_metadata(value.tag())?;
        if metadata.name == self.env_name {
            path.env_var()
        } else {
            None
        }
    }

    // === accessors: each returns `None` after recording an issue ===

    /// A table with free-form keys (names of upstreams, models, aliases).
    pub(crate) fn dict<'v>(&mut self, path: &KeyPath, value: &'v Value) -> Option<&'v Dict> {
        match value {
            Value::Dict(_, dict) => Some(dict),
            other => {
                let found = describe(other);
                self.invalid(path, other, format!("expected a table, found {found}"));
                None
            }
        }
    }

    /// A table with a fixed set of keys: any other key is reported (a typo in a limits file must
    /// not be silently ignored). The known keys are still returned for reading.
    pub(crate) fn table<'v>(
        &mut self,
        path: &KeyPath,
        value: &'v Value,
        known: &[&str],
    ) -> Option<&'v Dict> {
        let dict = self.dict(path, value)?;
        for (key, value) in dict {
            if !known.contains(&key.as_str()) {
                let message = format!("unknown key (expected one of: {})", known.join(", "));
                self.invalid(&path.key(key), value, message);
            }
        }
        Some(dict)
    }

    pub(crate) fn array<'v>(&mut self, path: &KeyPath, value: &'v Value) -> Option<&'v [Value]> {
        match value {
            Value::Array(_, items) => Some(items),
            other => {
                let found = describe(other);
                self.invalid(path, other, format!("expected an array, found {found}"));
                None
            }
        }
    }

    pub(crate) fn string<'v>(&mut self, path: &KeyPath, value: &'v Value) -> Option<&'v str> {
        match value {
            Value::String(_, string) => Some(string),
            other => {
                let found = describe(other);
                self.invalid(path, other, format!("expected a string, found {found}"));
                None
            }
        }
    }

    /// A string that must not be echoed back: a wrong type is described without its value.
    pub(crate) fn secret_string<'v>(
        &mut self,
        path: &KeyPath,
        value: &'v Value,
    ) -> Option<&'v str> {
        match value {
            Value::String(_, string) => Some(string),
            other => {
                let found = kind_of(other);
                self.invalid(path, other, format!("expected a string, found {found}"));
                None
            }
        }
    }

    /// `true` or `false`.
    pub(crate) fn boolean(&mut self, path: &KeyPath, value: &Value) -> Option<bool> {
        match value {
            Value::Bool(_, b) => Some(*b),
            other => {
                let found = describe(other);
                self.invalid(
                    path,
                    other,
                    format!("expected true or false, found {found}"),
                );
                None
            }
        }
    }

    /// A whole number, at least `min`.
    pub(crate) fn count(&mut self, path: &KeyPath, value: &Value, min: usize) -> Option<usize> {
        let Some(n) = integer(value) else {
            let found = describe(value);
            self.invalid(path, value, format!("expected an integer, found {found}"));
            return None;
        };
        match usize::try_from(n) {
            Ok(n) if n >= min => Some(n),
            Err(_) if n > 0 => {
                self.invalid(path, value, format!("{n} is too large"));
                None
            }
            _ => {
                self.invalid(path, value, format!("must be at least {min}, found {n}"));
                None
            }
        }
    }

    /// Any number; integers are widened, so `weight = 2` works as well as `weight = 2.0`.
    pub(crate) fn number(&mut self, path: &KeyPath, value: &Value) -> Option<f64> {
        #[expect(
            clippy::cast_precision_loss,
            reason = "an integer beyond 2^53 loses precision as f64, which is what it means here"
        )]
        let number = match value {
            Value::Num(_, num) => num.to_f64().or_else(|| integer(value).map(|n| n as f64)),
            _ => None,
        };
        if number.is_none() {
            let found = describe(value);
            self.invalid(path, value, format!("expected a number, found {found}"));
        }
        number
    }

    /// A human duration string (`"30s"`, `"2m"`, `"500ms"`, `"1h 30m"`), parsed by humantime.
    /// Bare numbers are refused: `30` could mean seconds or milliseconds.
    pub(crate) fn duration(
        &mut self,
        path: &KeyPath,
        value: &Value,
        allow_zero: bool,
    ) -> Option<Duration> {
        const EXAMPLE: &str = r#"e.g. "30s", "2m" or "500ms""#;
        let Value::String(_, text) = value else {
            let found = describe(value);
            let message = format!("expected a duration string ({EXAMPLE}), found {found}");
            self.invalid(path, value, message);
            return None;
        };
        match humantime::parse_duration(text) {
            Ok(duration) if duration.is_zero() && !allow_zero => {
                self.invalid(
                    path,
                    value,
                    format!("must be greater than zero, found {text:?}"),
                );
                None
            }
            Ok(duration) => Some(duration),
            Err(error) => {
                let message = format!("invalid duration {text:?}: {error} ({EXAMPLE})");
                self.invalid(path, value, message);
                None
            }
        }
    }

    /// An `IP:port` socket address. Host names are refused: a listener binds an address.
    pub(crate) fn socket_addr(&mut self, path: &KeyPath, value: &Value) -> Option<SocketAddr> {
        let text = self.string(path, value)?;
        let addr = text.parse().ok();
        if addr.is_none() {
            let message = format!(
                "invalid socket address {text:?}: expected an IP address and a port, e.g. \
                 \"127.0.0.1:8080\" or \"[::]:8080\" (host names are not resolved)"
            );
            self.invalid(path, value, message);
        }
        addr
    }
}

/// An integer of any of figment's integer representations (TOML gives `i64`, the environment
/// parser may give unsigned widths).
fn integer(value: &Value) -> Option<i128> {
    let Value::Num(_, num) = value else {
        return None;
    };
    num.to_i128()
        .or_else(|| num.to_u128().and_then(|n| i128::try_from(n).ok()))
}

/// The type of a value, without its content.
pub(crate) fn kind_of(value: &Value) -> &'static str {
    match value {
        Value::String(..) => "a string",
        Value::Char(..) => "a character",
        Value::Bool(..) => "a boolean",
        Value::Num(_, num) if is_float(*num) => "a float",
        Value::Num(..) => "an integer",
        Value::Empty(..) => "an empty value",
        Value::Dict(..) => "a table",
        Value::Array(..) => "an array",
    }
}

fn is_float(num: Num) -> bool {
    matches!(num, Num::F32(_) | Num::F64(_))
}

/// The type of a value and, for scalars, the value itself (for error messages).
pub(crate) fn describe(value: &Value) -> String {
    const MAX: usize = 60;
    match value {
        Value::String(_, s) if s.chars().count() > MAX => {
            let head: String = s.chars().take(MAX).collect();
            format!("a string {head:?}…")
        }
        Value::String(_, s) => format!("a string {s:?}"),
        Value::Char(_, c) => format!("a character {c:?}"),
        Value::Bool(_, b) => format!("a boolean ({b})"),
        Value::Num(_, num) => match num.to_f64() {
            Some(float) => format!("a float ({float})"),
            None => match integer(value) {
                Some(int) => format!("an integer ({int})"),
                None => "a number".to_owned(),
            },
        },
        other => kind_of(other).to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_display_like_toml_keys() {
        let path = KeyPath::root()
            .key("upstreams")
            .key("a")
            .key("models")
            .key("llama3.1:8b")
            .key("parallel");
        assert_eq!(
            path.to_string(),
            r#"upstreams.a.models."llama3.1:8b".parallel"#
        );
        assert_eq!(
            KeyPath::root()
                .key("server")
                .key("api_keys")
                .index(2)
                .to_string(),
            "server.api_keys[2]"
        );
        assert_eq!(
            KeyPath::root().key("aliases").key("").to_string(),
            r#"aliases."""#
        );
    }

    #[test]
    fn env_var_names_join_keys_with_double_underscores() {
        let path = KeyPath::root().key("upstreams").key("a").key("weight");
        assert_eq!(
            path.env_var().as_deref(),
            Some("SLOTGATE_UPSTREAMS__A__WEIGHT")
        );
        assert_eq!(
            KeyPath::root()
                .key("server")
                .key("api_keys")
                .index(0)
                .env_var(),
            None
        );
    }

    #[test]
    fn describe_shows_type_and_scalar_value() {
        assert_eq!(describe(&Value::from(30_i64)), "an integer (30)");
        assert_eq!(describe(&Value::from(1.5_f64)), "a float (1.5)");
        assert_eq!(describe(&Value::from("x")), r#"a string "x""#);
        assert_eq!(describe(&Value::from(true)), "a boolean (true)");
        assert_eq!(describe(&Value::from(vec![1_i64])), "an array");
        let long = "y".repeat(100);
        assert!(describe(&Value::from(long.as_str())).ends_with("…"));
    }
}
