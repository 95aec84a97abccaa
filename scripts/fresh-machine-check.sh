#!/usr/bin/env bash
# Runs scripts/test.sh the way a new machine would: in a clean clone of this repository's HEAD,
# with an empty CARGO_HOME (no registry cache, no installed cargo tools) and an empty target
# directory. RUSTUP_HOME is kept, so the machine's one toolchain is still found; cargo-nextest
# stays found where a new machine has it (/usr/local/bin). See CONTRIBUTING.md.
#
#   scripts/fresh-machine-check.sh             the whole suite
#   scripts/fresh-machine-check.sh --to-deny   only the steps up to and including `cargo deny`
#                                              (tools, fetch, fmt, clippy, deny: the ones an
#                                              empty cache breaks)
#
# Everything goes under one new directory in /tmp, printed at the start and kept afterwards for
# inspection (several GB once built: remove it when done).
set -euo pipefail

mode=all
case "${1:-}" in
  "") ;;
  --to-deny) mode=to-deny ;;
  *)
    echo "usage: $0 [--to-deny]" >&2
    exit 64
    ;;
esac

repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/slotgate-fresh.XXXXXX)
echo "fresh-machine check of $(git -C "$repo" rev-parse --short HEAD) in $work"

git clone --quiet --no-local "$repo" "$work/src"

# Only the toolchain's own commands (rustup's proxies) stay reachable; every cargo tool the
# suite needs must be installed by the suite into the new CARGO_HOME.
mkdir -p "$work/toolchain" "$work/cargo-home"
for tool in cargo rustc rustdoc rustup rustfmt cargo-fmt cargo-clippy clippy-driver; do
  ln -s "$(command -v "$tool")" "$work/toolchain/$tool"
done
export RUSTUP_HOME=${RUSTUP_HOME:-$HOME/.rustup}
export CARGO_HOME=$work/cargo-home
export PATH=$CARGO_HOME/bin:$work/toolchain:/usr/local/bin:/usr/bin:/bin
unset CARGO_TARGET_DIR

cd "$work/src"
script=scripts/test.sh
if [[ $mode == to-deny ]]; then
  # The suite up to and including its `cargo deny --offline` line, beside the original: the
  # script finds the repository from its own location.
  script=scripts/test-to-deny.sh
  awk '{ print } /^cargo deny --offline/ { found = 1; exit } END { exit !found }' \
    scripts/test.sh >"$script" || {
    echo "scripts/test.sh has no 'cargo deny --offline' line any more; update $0" >&2
    exit 1
  }
fi
bash "$script"
echo "fresh-machine check passed ($mode) in ${SECONDS}s; $work can be removed"
