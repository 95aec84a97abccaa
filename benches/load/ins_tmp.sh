#!/usr/bin/env bash
# Instructions per request, slotgate against HAProxy, counted by valgrind's callgrind, and
# slotgate's profile (the functions that cost the most instructions, self and inclusive).
#
#   benches/load/instructions.sh
#   DURATION=20s CONNS=16 benches/load/instructions.sh
#   SLOTGATE_BIN=/path/to/older/slotgate benches/load/instructions.sh   # an A/B build
#   BODY_FILE=benches/load/conversation.json benches/load/instructions.sh  # a 10 KiB conversation
#   EXTRA_SERVER='affinity = "off"' benches/load/instructions.sh       # without cache affinity
#
# Unlike requests/s or CPU seconds, an instruction count does not depend on what else the
# machine is doing: the same binary and load give the same count on a busy machine, so this is
# the A/B instrument for cutting the proxy's CPU cost. Each proxy runs under callgrind (one
# thread at a time, ~50× slower) in front of the static nginx upstream; after a warm-up the
# counters are zeroed, wrk runs for DURATION, and the counts are dumped and divided by the
# requests wrk completed. Instructions are not time (a cache miss costs more than an add), so
# read this next to run.sh's CPU µs per request.
set -euo pipefail
cd "$(dirname "$0")/../.."

PROFILE=${PROFILE:-release}       # PROFILE=profiling adds file:line to the profile
PROXY_THREADS=${PROXY_THREADS:-1}
DURATION=${DURATION:-10s}
CONNS=${CONNS:-8}
CAP=${CAP:-64}
QUEUE=${QUEUE:-64}
TOP=${TOP:-30}
OUT=${OUT:-target/load/instructions.md}

# shellcheck source=benches/load/common.sh
source benches/load/common.sh
command -v valgrind >/dev/null 2>&1 || {
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq valgrind
}

# $1: label; $2: port; $3: pid running under callgrind; $4: its output file prefix.
# Prints "requests instructions".
count() {
  local port=$2 pid=$3 prefix=$4 out dump
  wrk -t1 -c"$CONNS" -d3s -s "$work/post.lua" "http://127.0.0.1:$port/v1/chat/completions" >/dev/null
  callgrind_control -z "$pid" >/dev/null
  out=$(wrk -t1 -c"$CONNS" -d"$DURATION" -s "$work/post.lua" "http://127.0.0.1:$port/v1/chat/completions")
  callgrind_control -d "$pid" >/dev/null
  echo "$out" >&2
  dump=$(ls -t "$prefix".* | head -1)
  local n ir
  n=$(awk '/ requests in / {print $1}' <<<"$out")
  ir=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  echo "$n $ir $dump"
}

start_nginx
CG="valgrind --tool=callgrind --dump-instr=no --collect-jumps=no"

step "slotgate under callgrind"
SLOTGATE_WRAP="$CG --callgrind-out-file=$work/slotgate.cg" start_slotgate openai "$CAP" "$QUEUE" 4096
read -r s_n s_ir s_dump < <(count slotgate "$SLOTGATE_PORT" "$slotgate_pid" "$work/slotgate.cg")
cp "$s_dump" /tmp/on.cg; echo "$s_n" > /tmp/on.n; exit 0

step "HAProxy under callgrind"
HAPROXY_WRAP="$CG --callgrind-out-file=$work/haproxy.cg" start_haproxy "$CAP" "$QUEUE" 4096
read -r h_n h_ir _ < <(count haproxy "$HAPROXY_PORT" "$haproxy_pid" "$work/haproxy.cg")

# The $TOP costliest functions of slotgate's dump, per request, as a code block; $1 may be
# --inclusive=yes. Counters zeroed mid-run leave the whole run on the thread's outermost frames
# (100 % each, even as self cost), so those lines are skipped. (`--inclusive=no` spelled out
# shows only them: callgrind_annotate's threshold is met by the first one.)
top_functions() {
  echo
  echo '```'
  callgrind_annotate "$@" --threshold=100 "$s_dump" 2>/dev/null | grep -v '(100.0%)' |
    awk -v n="$s_n" -v top="$TOP" '
      /^-+$/ { dashes++; next }
      dashes >= 3 && NF >= 2 && shown < top {
        ir = $1; gsub(",", "", ir)
        if (ir ~ /^[0-9]+$/) { $1 = ""; printf "%8.0f %s\n", ir / n, $0; shown++ }
      }'
  echo '```'
}

mkdir -p "$(dirname "$OUT")"
# Kept for `callgrind_annotate --tree=caller target/load/slotgate.callgrind` and friends.
cp "$s_dump" "$(dirname "$OUT")/slotgate.callgrind"
{
  echo "Instructions per request (callgrind), $(date -u +%Y-%m-%dT%H:%MZ); static nginx upstream;"
  echo "wrk 1 thread, $CONNS connections, $DURATION; cap $CAP, queue $QUEUE; $PROXY_THREADS proxy thread(s)."
  echo "Command: \`DURATION=$DURATION CONNS=$CONNS PROXY_THREADS=$PROXY_THREADS${BODY_FILE:+ BODY_FILE=$BODY_FILE}${EXTRA_SERVER:+ EXTRA_SERVER='$EXTRA_SERVER'} benches/load/instructions.sh\`"
  echo
  echo "| proxy | requests | instructions | instructions per request |"
  echo "|---|---:|---:|---:|"
  awk -v n="$s_n" -v ir="$s_ir" 'BEGIN { printf "| slotgate | %d | %d | %.0f |\n", n, ir, ir / n }'
  awk -v n="$h_n" -v ir="$h_ir" -v v="$("$HAPROXY" -v | awk 'NR==1 {print $3}')" \
    'BEGIN { printf "| HAProxy %s | %d | %d | %.0f |\n", v, n, ir, ir / n }'
  echo
  echo "slotgate, top $TOP functions by instructions (self), per request:"
  top_functions
  echo
  echo "slotgate, top $TOP functions by instructions (inclusive), per request:"
  top_functions --inclusive=yes
} >"$OUT"
cat "$OUT"
