#!/usr/bin/env bash
# Instructions per operation of the limiter's hot paths, against tokio's Semaphore, counted by
# valgrind's callgrind (load-independent: the A/B instrument on a busy machine).
#
#   benches/limiter-instructions.sh
#   SCENARIOS="uncontended tokio-uncontended" N=200000 benches/limiter-instructions.sh
#   DRIVER=/path/to/other/instructions-binary benches/limiter-instructions.sh   # an A/B build
#
# Each scenario of crates/limiter/benches/instructions.rs runs twice under callgrind, N times
# and 0 times, and the difference is divided by N: start-up, setup and exit cancel out. Prints
# a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."

N=${N:-100000}
SCENARIOS=${SCENARIOS:-uncontended uncontended-map tokio-uncontended weighted tokio-weighted \
  cancel-10 tokio-cancel-10 cancel-1000 tokio-cancel-1000 cancel-100000 tokio-cancel-100000 \
  cancel-fair-1000 contended tokio-contended}

# shellcheck source=benches/common.sh
source benches/common.sh
command -v valgrind >/dev/null 2>&1 || {
  echo "valgrind is needed (apt-get install valgrind)" >&2
  exit 1
}

DRIVER=${DRIVER:-$(instructions_driver)}

# Total instructions of one run: $1 scenario, $2 count.
instructions() {
  local out="$work/cg.out"
  valgrind --tool=callgrind --dump-instr=no --collect-jumps=no --callgrind-out-file="$out" \
    "$DRIVER" "$1" "$2" 2>/dev/null
  awk '/^summary:/ {print $2}' "$out"
}

echo "| scenario | instructions per operation (N = $N) |"
echo "|---|---:|"
for scenario in $SCENARIOS; do
  with=$(instructions "$scenario" "$N")
  without=$(instructions "$scenario" 0)
  awk -v s="$scenario" -v a="$with" -v b="$without" -v n="$N" \
    'BEGIN { printf "| %s | %.1f |\n", s, (a - b) / n }'
done
