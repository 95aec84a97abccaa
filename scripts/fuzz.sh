#!/usr/bin/env bash
# Builds the fuzz targets in fuzz/ and runs each for a bounded time; fails on the first crash,
# leak, timeout or out-of-memory. CI (`scripts/test.sh`) runs it with the default 30 s; run it by
# hand for longer (`docs/fuzzing.md`).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]      default: 30, every target
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

seconds=${1:-30}
shift || true
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds == 0)); then
  echo "fuzz.sh: SECONDS_PER_TARGET must be a positive whole number, got '$seconds'" >&2
  exit 64
fi

export RUSTC_BOOTSTRAP=1

if ! command -v cargo-fuzz >/dev/null 2>&1; then
  # Pinned: the flags below and the stable-with-RUSTC_BOOTSTRAP path were checked with 0.13.
  cargo install --locked cargo-fuzz --version '^0.13'
fi

targets=("$@")
if ((${#targets[@]} == 0)); then
  mapfile -t targets < <(cargo fuzz list)
fi

cargo fmt --check
# Every target in one cargo invocation: they share their dependencies.
cargo fuzz build

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
