//! What can go wrong: the sources could not be loaded, or they broke rules (all of them listed).

use std::fmt;

/// Why [`Config`](crate::Config) could not be produced.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The sources could not be read or parsed: the file is missing or unreadable, or it is not
    /// valid TOML. Nothing was validated.
    #[error("cannot load the configuration: {source}")]
    Load {
        /// figment's error; it names the file (or other source) that failed.
        // Boxed: figment's error is large, and a large `Err` slows every `Result` that carries it.
        #[source]
        source: Box<figment::Error>,
    },
    /// The sources parsed, but the configuration breaks one or more rules. Every problem found is
    /// listed, grouped by table in a stable order (`[server]`, then each upstream by name, then
    /// `[aliases]`); `Display` prints one `path: message` per line.
    #[error("{}", DisplayIssues(.0))]
    Invalid(Vec<Issue>),
}

impl ConfigError {
    /// The rule violations, in the order described on [`ConfigError::Invalid`]; empty for
    /// [`ConfigError::Load`].
    pub fn issues(&self) -> &[Issue] {
        match self {
            ConfigError::Invalid(issues) => issues,
            ConfigError::Load { .. } => &[],
        }
    }
}

impl From<figment::Error> for ConfigError {
    fn from(source: figment::Error) -> Self {
        ConfigError::Load {
            source: Box::new(source),
        }
    }
}

/// One problem in the configuration, at one key.
///
/// `path` is the dotted key path as it would be written in TOML, with keys that are not bare
/// quoted (`upstreams.a.models."llama3.1:8b".parallel`) and array elements indexed
/// (`server.api_keys[1]`). Messages never contain a secret's value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Issue {
    /// Where: the key path, e.g. `upstreams.reasoning.models.reasoning.queue_timeout`.
    pub path: String,
    /// What is wrong, e.g. `must be finite and greater than 0, found -1`.
    pub message: String,
}

impl fmt::Display for Issue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// One issue per line, no trailing newline.
struct DisplayIssues<'a>(&'a [Issue]);

impl fmt::Display for DisplayIssues<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, issue) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            issue.fmt(f)?;
        }
        Ok(())
    }
}
