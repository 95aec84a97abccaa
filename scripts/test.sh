#!/usr/bin/env bash
# The whole test suite, exactly as CI runs it (`.ci/run` calls this script).
# It installs what the tests need that a fresh machine lacks, then runs every gate in order and
# stops at the first failure. Run it from anywhere: `./scripts/test.sh`.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n==> [%4ds] %s\n' "$SECONDS" "$*"; }

step "tools"
if ! command -v cargo-deny >/dev/null 2>&1; then
  cargo install --locked cargo-deny
fi
if ! command -v cargo-nextest >/dev/null 2>&1; then
  cargo install --locked cargo-nextest
fi

step "cargo fetch (every platform's crates, so the --offline steps below work on a fresh machine)"
# cargo-deny resolves the graph for every target in deny.toml; on an empty cargo cache those
# crates are not there until fetched. `cargo fetch` without --target fetches them all.
cargo fetch --locked

step "module circles (scripts/module-cycles.py, with its own tests first; a few seconds)"
# Plain Python 3 from the standard library: nothing to install. See CONTRIBUTING.md.
timeout 120 python3 scripts/test_module_cycles.py
timeout 120 python3 scripts/module-cycles.py

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo deny (bans licenses sources, offline)"
cargo deny --offline check bans licenses sources

step "real llama-server for the engine suite (tests/engine/setup.sh; cached, ~8 min cold)"
# Assigned first: `eval "$(…)"` alone would carry on past a failed setup.
engine_env=$(tests/engine/setup.sh)
eval "$engine_env"
export LLAMA_SERVER TINY_MODEL

step "unit, integration and property tests (nextest)"
cargo nextest run --workspace --all-targets --locked --no-fail-fast

step "doc tests"
cargo test --workspace --doc --locked

step "rustdoc (broken intra-doc links are errors)"
RUSTDOCFLAGS="-D warnings -D rustdoc::broken_intra_doc_links" cargo doc --workspace --no-deps --locked

step "loom (slotgate-limiter, LOOM_MAX_PREEMPTIONS=2)"
RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 \
  CARGO_TARGET_DIR=target/loom \
  cargo test -p slotgate-limiter --release --lib --locked

step "benches compile"
cargo bench --workspace --no-run --locked

echo
echo "all checks passed in ${SECONDS}s"
