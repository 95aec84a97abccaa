//! Fuzz target: the configuration loader and its validation pass on arbitrary TOML.
//!
//! Drives [`Config::from_toml_str`] (figment's TOML provider, then every rule of the validation
//! pass) and checks what the crate promises about the result, not only that it does not panic:
//!
//! - a rejected document gets at least one issue, and never the "rejected without a reason"
//!   fallback (that would mean a builder returned `None` without recording why);
//! - an accepted document's effective configuration ([`Config::to_effective_toml`], what
//!   `slotgate check` prints) is itself a valid configuration, and printing *that* gives the same
//!   text again: defaults made explicit must not change the meaning.
#![no_main]

use libfuzzer_sys::fuzz_target;
use slotgate_config::{Config, ConfigError};

fuzz_target!(|data: &[u8]| {
    // A config file is text; figment refuses anything else before the validation pass runs.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match Config::from_toml_str(text) {
        Ok(config) => round_trip(&config),
        Err(error) => rejected(&error),
    }
});

/// An accepted configuration must print as one that loads back to the same printout.
fn round_trip(config: &Config) {
    let effective = config.to_effective_toml();
    let reloaded = match Config::from_toml_str(&effective) {
        Ok(reloaded) => reloaded,
        Err(error) => panic!(
            "the effective configuration does not load back:\n{error}\n--- effective ---\n{effective}"
        ),
    };
    let again = reloaded.to_effective_toml();
    assert_eq!(
        effective, again,
        "the effective configuration changed on a second round"
    );
}

/// A refusal must say why, at least once, with a real reason.
fn rejected(error: &ConfigError) {
    // `Display` is what `slotgate check` prints; it must render for any input.
    let shown = error.to_string();
    assert!(!shown.is_empty(), "an error that prints as nothing");
    if let ConfigError::Invalid(issues) = error {
        assert!(!issues.is_empty(), "Invalid with no issues");
        for issue in issues {
            assert!(
                !issue.message.starts_with("internal error"),
                "a builder gave up without recording an issue: {issue}"
            );
        }
    }
}
