//! Where configuration comes from: a TOML file, then `SLOTGATE_` environment overrides.

use std::path::Path;

use figment::providers::{Env, Format as _, Toml};
use figment::value::Value;
use figment::{Figment, Provider as _};

use crate::error::{ConfigError, Issue};
use crate::raw::Reader;
use crate::types::Config;
use crate::validate::{self, ROOT_KEYS};

/// Prefix of the environment variables that override the file.
pub const ENV_PREFIX: &str = "SLOTGATE_";

/// The environment provider: `SLOTGATE_SERVER__LISTEN=127.0.0.1:9000` sets `server.listen`,
/// `SLOTGATE_UPSTREAMS__A__WEIGHT=2` sets `upstreams.a.weight`.
///
/// Names after the prefix are lowercased and `__` nests. Values are parsed the way figment parses
/// them (`2` is an integer, `1.5` a float, `[a, b]` an array, `"123"` with quotes a string).
///
/// Every configuration key sits inside a table, so a variable without `__` is not configuration
/// and is ignored (the binary may read `SLOTGATE_LOG` or `SLOTGATE_CONFIG` itself) — unless it
/// starts with a table name, like `SLOTGATE_SERVER_LISTEN`: that is a mistyped override and is
/// kept, so validation reports it instead of dropping it silently.
pub fn env_provider() -> Env {
    Env::prefixed(ENV_PREFIX).split("__").filter(|key| {
        let key = key.as_str().to_ascii_lowercase();
        key.contains('.')
            || ROOT_KEYS.iter().any(|section| {
                key.strip_prefix(section)
                    .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
            })
    })
}

impl Config {
    /// Loads `path` (TOML; a relative path is relative to the working directory, never searched
    /// for elsewhere), applies `SLOTGATE_` environment overrides, and validates the result.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::from_figment(&Config::figment(path))
    }

    /// The figment [`Config::load`] reads: `path` as TOML merged with [`env_provider`]. Add
    /// providers to it and pass it to [`Config::from_figment`] to layer more sources.
    pub fn figment(path: &Path) -> Figment {
        // `file_exact`, not `file`: `file` silently searches parent directories for a relative
        // path and treats a missing file as empty, both wrong for a gateway's config.
        Figment::from(Toml::file_exact(path)).merge(env_provider())
    }

    /// Parses and validates a TOML document, without environment overrides (for tests and
    /// embedding).
    pub fn from_toml_str(toml: &str) -> Result<Config, ConfigError> {
        Config::from_figment(&Figment::from(Toml::string(toml)))
    }

    /// Validates whatever `figment` holds (default profile).
    ///
    /// Fails with [`ConfigError::Load`] when a source cannot be read or parsed, and with
    /// [`ConfigError::Invalid`] listing every rule violation otherwise.
    pub fn from_figment(figment: &Figment) -> Result<Config, ConfigError> {
        let root: Value = figment.extract()?;
        let mut reader = Reader::new(figment, env_provider().metadata().name.into_owned());
        let config = validate::build(&mut reader, &root);
        match config {
            Some(config) if !reader.has_issues() => Ok(config),
            _ => {
                let mut issues = reader.into_issues();
                if issues.is_empty() {
                    // Builders only return `None` after recording an issue; should one ever
                    // forget, refuse loudly rather than load a config with parts missing.
                    issues.push(Issue {
                        path: String::new(),
                        message: "internal error: the configuration was rejected without a \
                                  reason; please report this"
                            .to_owned(),
                    });
                }
                Err(ConfigError::Invalid(issues))
            }
        }
    }
}
