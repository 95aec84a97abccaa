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

step "cargo clippy --all-targets -- -D warnings (type-checks the benches too)"
# The benches are not built in release mode here: clippy's --all-targets checks that they
# compile, and the one release build CI pays for is the Debian package's, at the end.
cargo clippy --workspace --all-targets --locked -- -D warnings

step "cargo deny (bans licenses sources, offline, every workspace member)"
# --workspace: without it cargo-deny only walks the root package's graph, and crates that only
# a member uses (redis, through slotgate-limiter-redis) would go unchecked.
cargo deny --workspace --offline check bans licenses sources

step "real llama-server for the engine suite (tests/engine/setup.sh; cached, ~8 min cold)"
# Assigned first: `eval "$(…)"` alone would carry on past a failed setup.
engine_env=$(tests/engine/setup.sh)
eval "$engine_env"
export LLAMA_SERVER TINY_MODEL

step "redis (the shared limiter's tests use 127.0.0.1:6379 and start private servers)"
if ! command -v redis-server >/dev/null 2>&1; then
  apt-get update -qq && apt-get install -y -qq redis-server
fi
# The machines start one on 6379; start it here only where none answers.
if ! timeout 5 redis-cli -p 6379 ping >/dev/null 2>&1; then
  redis-server --port 6379 --bind 127.0.0.1 --save '' --appendonly no --daemonize yes
  for _ in $(seq 50); do timeout 1 redis-cli -p 6379 ping >/dev/null 2>&1 && break; sleep 0.1; done
fi

step "unit, integration and property tests (nextest)"
cargo nextest run --workspace --all-targets --locked --no-fail-fast

step "browser tests in headless Chromium: the status page, CORS (tests/ui/; installs chromium and Playwright if missing)"
# A block of its own: the status page (run.sh) and a page on another origin calling the API
# (cors.sh), each bounded inside its script (< 3 min together once set up).
ui_started=$SECONDS
tests/ui/run.sh target/ui/status-page.png
tests/ui/cors.sh
echo "browser tests: $((SECONDS - ui_started))s"

step "doc tests"
cargo test --workspace --doc --locked

step "rustdoc, public and private items (broken intra-doc links are errors)"
RUSTDOCFLAGS="-D warnings -D rustdoc::broken_intra_doc_links" cargo doc --workspace --no-deps --locked
# The contributors' docs too (every private module and item): their links must resolve as well.
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --document-private-items

step "loom (slotgate-limiter, LOOM_MAX_PREEMPTIONS=2)"
RUSTFLAGS="--cfg loom -C debug-assertions=on" LOOM_MAX_PREEMPTIONS=2 \
  CARGO_TARGET_DIR=target/loom \
  cargo test -p slotgate-limiter --release --lib --locked

step "fuzz targets (cargo-fuzz on stable with RUSTC_BOOTSTRAP=1, ASan, 20 s each; docs/fuzzing.md)"
# In-process parsers only, no network. Installs cargo-fuzz when missing; what the cold install,
# build and runs cost on 2 cores is measured in docs/fuzzing.md.
scripts/fuzz.sh 20

step "Debian package (scripts/deb-check.sh: cargo-deb, a release build, dpkg-deb -x, slotgate check)"
# Installs cargo-deb 3.8.0 when missing; most of the time is the release build of the gateway
# (docs/operations.md, "Install from the Debian package").
deb_started=$SECONDS
timeout 1800 scripts/deb-check.sh
echo "debian package check: $((SECONDS - deb_started))s"

echo
echo "all checks passed in ${SECONDS}s"
