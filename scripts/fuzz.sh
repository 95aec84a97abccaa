#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ and runs each for a bounded time; fails on the first crash,
# leak, timeout or out-of-memory. CI (`scripts/test.sh`) runs it with 20 s per target; run it by
# hand for longer (`docs/fuzzing.md`).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      default: 20, every target
#
# Toolchain: cargo-fuzz needs nightly-only flags (-Zsanitizer, -Cllvm-args, --cfg fuzzing). The
# machines reach no rustup server, so it runs on the installed stable toolchain with
# RUSTC_BOOTSTRAP=1, which unlocks those flags; stable ships the AddressSanitizer runtime for
# x86_64-unknown-linux-gnu, so targets keep ASan (the default `--sanitizer address`).
#
# New inputs found while running go to a scratch directory, never into the committed seed
# corpus (fuzz/corpus/<target>/), which libFuzzer only reads. A crash is written to
# fuzz/artifacts/<target>/ and printed (base64 included) before the script exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

seconds=${1:-20}
shift || true
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds == 0)); then
  echo "fuzz.sh: SECONDS_PER_TARGET must be a positive whole number, got '$seconds'" >&2
  exit 64
fi

export RUSTC_BOOTSTRAP=1
# The instrumented build is a second build of every dependency (sanitizer and coverage flags):
# kept outside the clone, so that a later run on the same machine (CI runs in a fresh clone each
# time) rebuilds only the workspace crates. Override with SLOTGATE_FUZZ_TARGET_DIR.
export CARGO_TARGET_DIR=${SLOTGATE_FUZZ_TARGET_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/slotgate/fuzz-target}

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  # Pinned: the flags below and the stable-with-RUSTC_BOOTSTRAP path were checked with 0.13.
  # Timed: its cold cost is part of what the CI step costs (docs/fuzzing.md).
  install_start=$SECONDS
  cargo install --locked cargo-fuzz --version '^0.13'
  echo "fuzz.sh: cargo-fuzz installed in $((SECONDS - install_start)) s"
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cargo fuzz list)
fi

cargo fmt --check
# Every target in one cargo invocation: they share their dependencies.
build_start=$SECONDS
cargo fuzz build
echo "fuzz.sh: targets built in $((SECONDS - build_start)) s"

scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for target in "${targets[@]}"; do
  echo "--- fuzz target '$target' for ${seconds}s"
  mkdir -p "$scratch/$target"
  options=(
    -max_total_time="$seconds"
    # One input taking 10 s is a hang (quadratic parsing, a loop), not a slow machine.
    -timeout=10
    -rss_limit_mb=2048
    -print_final_stats=1
  )
  if [[ -f dicts/$target.dict ]]; then
    options+=(-dict="dicts/$target.dict")
  fi
  cargo fuzz run "$target" "$scratch/$target" "corpus/$target" -- "${options[@]}"
done
