//! Helpers shared by the command-line tests: run the built `slotgate` binary as a user would,
//! with config files written to a per-process temp dir.

#![allow(dead_code, unreachable_pub)] // each test binary uses a different subset

use std::path::PathBuf;
use std::process::Command;

/// Writes `text` to `name` in this test process's own temp dir; returns the path.
pub fn write(name: &str, text: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("slotgate-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// The built `slotgate` binary, without the tests' `SLOTGATE_*` environment (which overrides
/// the config file).
pub fn slotgate() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_slotgate"));
    for (key, _) in std::env::vars() {
        if key.starts_with("SLOTGATE_") {
            command.env_remove(key);
        }
    }
    command
}
