#!/usr/bin/env bash
# Cache lines per contended acquisition: how many distinct 64-byte lines of memory each round of
# the `contended` scenario touches and writes, counted in a memory trace by valgrind's lackey.
# On a multi-core machine every line written by one core and touched by the next travels between
# them, which is what a contended acquisition costs beyond its instructions; the count is as
# deterministic as an instruction count (docs/benchmarks.md, "Cache lines per acquisition").
#
#   benches/limiter-lines.sh
#   N=12800 benches/limiter-lines.sh
#   DRIVER=/path/to/other/instructions-binary benches/limiter-lines.sh   # an A/B build
#
# The driver (crates/limiter/benches/instructions.rs, scenarios `contended-lines` and
# `tokio-contended-lines`) adds one to a marker before every acquire; the trace is cut at each
# store to it, one window per acquisition (of 64 tasks on one thread sharing 4 slots), and the
# first and last tenth of the windows are dropped (first touches, the tasks ending). Stack
# addresses are left out: each task's stack is its own. Prints a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-6400}
SCENARIOS=${SCENARIOS:-contended-lines tokio-contended-lines}

# shellcheck source=benches/common.sh
source benches/common.sh
for tool in valgrind python3; do
  command -v "$tool" >/dev/null 2>&1 || {
    echo "$tool is needed (apt-get install $tool)" >&2
    exit 1
  }
done
DRIVER=${DRIVER:-$(instructions_driver)}

echo "| scenario | lines touched per acquisition | lines written per acquisition |"
echo "|---|---:|---:|"
for scenario in $SCENARIOS; do
  valgrind --tool=lackey --trace-mem=yes --log-file="$work/trace" \
    "$DRIVER" "$scenario" "$N" 2>"$work/marker"
  marker=$(sed -n 's/^marker 0x\([0-9a-f]*\)$/\1/p' "$work/marker")
  python3 - "$work/trace" "$marker" "$scenario" <<'PY'
import sys

trace, marker, scenario = sys.argv[1], int(sys.argv[2], 16), sys.argv[3]
# Under valgrind, thread stacks sit above this address and the heap and statics below it.
STACK = 0x1000000000
windows, touched, written = [], set(), set()
with open(trace) as f:
    for line in f:
        # Data accesses only: " L addr,size", " S addr,size", " M addr,size".
        if len(line) < 4 or line[0] != " ":
            continue
        kind = line[1]
        addr = int(line[3:line.index(",")], 16)
        if addr == marker and kind in "SM":
            windows.append((len(touched), len(written)))
            touched, written = set(), set()
            continue
        if addr >= STACK or addr >> 6 == marker >> 6:
            continue
        touched.add(addr >> 6)
        if kind in "SM":
            written.add(addr >> 6)
windows = windows[1:]  # the first window is the set-up
cut = len(windows) // 10
kept = windows[cut:len(windows) - cut]
if not kept:
    sys.exit("no acquisitions traced: is N at least 64?")
t = sum(w[0] for w in kept) / len(kept)
w = sum(w[1] for w in kept) / len(kept)
print(f"| {scenario} | {t:.2f} | {w:.2f} |")
PY
done
