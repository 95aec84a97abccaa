#!/usr/bin/env bash
# Load benchmark: a bounded load against a fast upstream, three ways —
#   1. directly,
#   2. through slotgate (parallel = CAP, queue = QUEUE),
#   3. through HAProxy with the same cap and queue (server maxconn = CAP, maxqueue = QUEUE,
#      timeout queue = the same queue_timeout),
# and prints throughput and latency percentiles as a Markdown table (also written to $OUT).
#
#   benches/load/run.sh                       # defaults below
#   DURATION=30s CONNS=128 benches/load/run.sh
#
# It installs what it needs: wrk and HAProxy from Debian's packages (apt-get; run as root or with
# sudo available), and builds slotgate and fake-upstream in release mode.
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-15s}   # per run
CONNS=${CONNS:-64}          # concurrent client connections
THREADS=${THREADS:-2}       # wrk threads
CAP=${CAP:-32}              # slots (slotgate parallel / HAProxy maxconn)
QUEUE=${QUEUE:-256}         # queue places (slotgate queue / HAProxy maxqueue)
TOKENS=${TOKENS:-16}        # tokens per answer from the fake upstream (instant pacing)
OUT=${OUT:-target/load/results.md}
UPSTREAM_PORT=18190
SLOTGATE_PORT=18191
HAPROXY_PORT=18192

step() { printf '\n==> %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

step "tools"
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
if [ ${#missing[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
# Build first so the compile does not compete with the measurement.
cargo build --release --locked -p slotgate-gateway -p fake-upstream

# shellcheck source=benches/common.sh
source benches/common.sh

step "fake upstream on :$UPSTREAM_PORT (vLLM-like, effectively unlimited, instant answers)"
target/release/fake-upstream --kind vllm --parallel 100000 --port "$UPSTREAM_PORT" \
  --model bench --tokens "$TOKENS" >"$work/fake.log" 2>&1 &
pids+=($!)
wait_port "$UPSTREAM_PORT"

step "slotgate on :$SLOTGATE_PORT (parallel $CAP, queue $QUEUE)"
cat >"$work/slotgate.toml" <<TOML
[server]
listen = "127.0.0.1:$SLOTGATE_PORT"
max_connections = 4096

[upstreams.bench]
url = "http://127.0.0.1:$UPSTREAM_PORT"
kind = "vllm"

[upstreams.bench.models.bench]
parallel = $CAP
queue = $QUEUE
queue_timeout = "30s"
TOML
RUST_LOG=warn target/release/slotgate serve --config "$work/slotgate.toml" >"$work/slotgate.log" 2>&1 &
pids+=($!)
wait_port "$SLOTGATE_PORT"

step "HAProxy on :$HAPROXY_PORT (maxconn $CAP, maxqueue $QUEUE)"
cat >"$work/haproxy.cfg" <<CFG
global
  maxconn 4096
defaults
  mode http
  timeout connect 5s
  timeout client 60s
  timeout server 60s
  timeout queue 30s
  option http-keep-alive
  http-reuse always
frontend bench
  bind 127.0.0.1:$HAPROXY_PORT
  default_backend upstream
backend upstream
  server fake 127.0.0.1:$UPSTREAM_PORT maxconn $CAP maxqueue $QUEUE
CFG
haproxy -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
pids+=($!)
wait_port "$HAPROXY_PORT"

cat >"$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hello"}],"max_tokens":16}'
LUA

# Runs wrk against a port; prints "req/s p50 p99 non2xx".
measure() {
  local port=$1 out
  # A short warm-up fills connection pools on every path.
  wrk -t"$THREADS" -c"$CONNS" -d2s -s "$work/post.lua" "http://127.0.0.1:$port/v1/chat/completions" >/dev/null
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$work/post.lua" \
    "http://127.0.0.1:$port/v1/chat/completions")
  echo "$out" >&2
  local rps p50 p99 non2xx
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  echo "$rps $p50 $p99 ${non2xx:-0}"
}

step "direct"
read -r d_rps d_p50 d_p99 d_bad < <(measure "$UPSTREAM_PORT")
step "through slotgate"
read -r s_rps s_p50 s_p99 s_bad < <(measure "$SLOTGATE_PORT")
step "through HAProxy"
read -r h_rps h_p50 h_p99 h_bad < <(measure "$HAPROXY_PORT")

mkdir -p "$(dirname "$OUT")"
{
  echo "Load: wrk, $THREADS threads, $CONNS connections, $DURATION per run; POST /v1/chat/completions"
  echo "to a fake vLLM answering $TOKENS tokens at once; cap $CAP, queue $QUEUE. $(nproc) CPUs,"
  echo "$(date -u +%Y-%m-%d). Command: \`DURATION=$DURATION CONNS=$CONNS CAP=$CAP QUEUE=$QUEUE benches/load/run.sh\`"
  echo
  echo "| path | requests/s | p50 | p99 | non-2xx |"
  echo "|---|---:|---:|---:|---:|"
  echo "| direct | $d_rps | $d_p50 | $d_p99 | $d_bad |"
  echo "| slotgate | $s_rps | $s_p50 | $s_p99 | $s_bad |"
  echo "| HAProxy $(haproxy -v | awk 'NR==1 {print $3}') | $h_rps | $h_p50 | $h_p99 | $h_bad |"
} | tee "$OUT"
