#!/usr/bin/env bash
# The real llama-server, directly and through slotgate, at the same concurrency.
#
#   benches/engine/run.sh                         # defaults below
#   DURATION=30s CONNS_LIST="2 8 16" benches/engine/run.sh
#   PREFETCH=1 benches/engine/run.sh              # also through a slotgate that sends 1 ahead
#
# For each concurrency in CONNS_LIST, wrk sends POST /v1/chat/completions (TOKENS tokens, all of
# them generated: ignore_eos) for DURATION, first straight to llama-server, then through slotgate
# (parallel = the engine's slots, a queue deep enough that nothing is refused). A poller reads
# the engine's own /metrics meanwhile and reports the peak of llamacpp:requests_deferred: the
# requests the engine queued itself. Through slotgate, it also reports the mean of
# slotgate_handoff_gap_seconds over the measured run: how long a slot freed by one answer sat
# idle before the next queued request left for the engine. With PREFETCH=k, a second slotgate
# with `prefetch = k` is measured too: it keeps up to k requests waiting inside the engine, which
# starts each the instant a slot frees (docs/configuration.md#prefetch). Results go to stdout as a Markdown table and to $OUT.
#
# Needs: tests/engine/setup.sh (builds llama-server once, cached), wrk (apt-get if missing),
# curl. Builds slotgate in release mode. Everything listens on 127.0.0.1 only, and every process
# started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

DURATION=${DURATION:-20s}       # per run
CONNS_LIST=${CONNS_LIST:-"2 8"} # concurrent client connections, one run pair each
SLOTS=${SLOTS:-2}               # llama-server --parallel (= slotgate parallel)
CONTEXT=${CONTEXT:-2048}        # llama-server -c (split between the slots)
TOKENS=${TOKENS:-32}            # tokens generated per request
ENGINE_THREADS=${ENGINE_THREADS:-1}
ENGINE_PORT=${ENGINE_PORT:-18390}
SLOTGATE_PORT=${SLOTGATE_PORT:-18391} # and its admin port, + 1
PREFETCH=${PREFETCH:-0}         # > 0: also a slotgate on SLOTGATE_PORT + 2 with this prefetch
OUT=${OUT:-target/engine-bench/results.md}

step() { printf '\n==> %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

step "tools"
if ! command -v wrk >/dev/null 2>&1; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk
fi
engine_env=$(tests/engine/setup.sh)
eval "$engine_env"
# Build first so the compile does not compete with the measurement.
cargo build --release --locked -p slotgate-gateway

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # llama-server waits for its SSE ping with a stream open; do not wait that long.
  for _ in $(seq 30); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

wait_http() {
  for _ in $(seq 300); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1" || true)" = 200 ] && return 0
    sleep 0.1
  done
  echo "no 200 from $1" >&2
  return 1
}

step "llama-server on :$ENGINE_PORT ($SLOTS slots, -c $CONTEXT, $ENGINE_THREADS thread)"
"$LLAMA_SERVER" -m "$TINY_MODEL" --alias tiny --host 127.0.0.1 --port "$ENGINE_PORT" \
  --parallel "$SLOTS" -c "$CONTEXT" -t "$ENGINE_THREADS" --no-webui --metrics --slots --jinja \
  >"$work/llama-server.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$ENGINE_PORT/health"

max_conns=0
for c in $CONNS_LIST; do [ "$c" -gt "$max_conns" ] && max_conns=$c; done
# $1: port (its admin port is $1 + 1); $2: prefetch.
start_slotgate() {
  local port=$1 prefetch=$2
  step "slotgate on :$port (parallel $SLOTS, prefetch $prefetch, queue $max_conns)"
  cat >"$work/slotgate-$port.toml" <<TOML
[server]
listen = "127.0.0.1:$port"
admin_listen = "127.0.0.1:$((port + 1))"

[upstreams.engine]
url = "http://127.0.0.1:$ENGINE_PORT"
kind = "llama-server"

[upstreams.engine.models.tiny]
parallel = $SLOTS
prefetch = $prefetch
queue = $max_conns
queue_timeout = "120s"
TOML
  RUST_LOG=warn target/release/slotgate serve --config "$work/slotgate-$port.toml" \
    >"$work/slotgate-$port.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$((port + 1))/readyz"
}
slotgate_ports=("$SLOTGATE_PORT")
start_slotgate "$SLOTGATE_PORT" 0
PREFETCH_PORT=$((SLOTGATE_PORT + 2))
if [ "$PREFETCH" -gt 0 ]; then
  slotgate_ports+=("$PREFETCH_PORT")
  start_slotgate "$PREFETCH_PORT" "$PREFETCH"
fi

cat >"$work/post.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":$TOKENS,"ignore_eos":true}'
LUA

# Until the engine runs and queues nothing, and slotgate holds no slot (bounded: 30 s). The
# slots matter too: the warm-up's wrk leaves with requests in flight, and slotgate keeps each
# such slot for the engine's cancel_grace (2 s for llama-server) after the client left, so a
# run started before then would measure that grace as queue wait.
wait_idle() {
  for _ in $(seq 300); do
    local busy=0 port
    for port in "${slotgate_ports[@]}"; do
      busy=$((busy + $(curl -s --max-time 2 "http://127.0.0.1:$((port + 1))/metrics" |
        awk '$1 ~ /^slotgate_slots_in_use\{/ || $1 ~ /^slotgate_queue_depth\{/ {n += $2}
             END {print n + 0}')))
    done
    [ "$(curl -s --max-time 2 "http://127.0.0.1:$ENGINE_PORT/metrics" |
      awk '$1 == "llamacpp:requests_processing" || $1 == "llamacpp:requests_deferred" {n += $2}
           END {print n + 0}')" = 0 ] && [ "$busy" = 0 ] && return 0
    sleep 0.1
  done
  echo "the engine or slotgate is still busy" >&2
  return 1
}

# Peak of the engine's deferred queue while pid $1 runs (one /metrics read every ~50 ms).
poll_deferred() {
  local pid=$1 peak=0 v
  while kill -0 "$pid" 2>/dev/null; do
    v=$(curl -s --max-time 2 "http://127.0.0.1:$ENGINE_PORT/metrics" |
      awk '$1 == "llamacpp:requests_deferred" {print int($2)}')
    [ -n "$v" ] && [ "$v" -gt "$peak" ] && peak=$v
    sleep 0.05
  done
  echo "$peak"
}

# The handoff gaps so far of the slotgate on port $1: "sum_seconds count" of
# slotgate_handoff_gap_seconds.
handoff_gaps() {
  curl -s --max-time 5 "http://127.0.0.1:$(($1 + 1))/metrics" |
    awk '$1 ~ /^slotgate_handoff_gap_seconds_sum/ {s += $2}
         $1 ~ /^slotgate_handoff_gap_seconds_count/ {c += $2}
         END {printf "%.9f %d\n", s, c}'
}

# Runs wrk with $2 connections against port $1; prints "req/s p50 p99 non2xx deferred-peak gap"
# (gap: the mean handoff gap in µs and how many, through slotgate; "-" straight to the engine).
measure() {
  local port=$1 conns=$2 out rps p50 p99 non2xx deferred gap=- s0 c0 s1 c1
  local url="http://127.0.0.1:$port/v1/chat/completions"
  # A short warm-up fills connection pools and the engine's prompt cache on every path.
  timeout 60 wrk -t1 -c"$conns" -d2s -s "$work/post.lua" "$url" >/dev/null
  # wrk stops by closing connections with requests in flight, which the engine finishes anyway
  # (a non-streamed request runs on until it notices): start measuring once it is idle.
  wait_idle
  [ "$port" != "$ENGINE_PORT" ] && read -r s0 c0 < <(handoff_gaps "$port")
  timeout 600 wrk -t1 -c"$conns" -d"$DURATION" --timeout 60s --latency -s "$work/post.lua" \
    "$url" >"$work/wrk.out" &
  local wrk_pid=$!
  deferred=$(poll_deferred "$wrk_pid")
  wait "$wrk_pid"
  if [ "$port" != "$ENGINE_PORT" ]; then
    read -r s1 c1 < <(handoff_gaps "$port")
    gap=$(awk -v s="$s1" -v s0="$s0" -v c="$c1" -v c0="$c0" \
      'BEGIN {n = c - c0; if (n > 0) printf "%.0f_µs_(%d)", (s - s0) / n * 1e6, n; else print "none"}')
  fi
  out=$(cat "$work/wrk.out")
  echo "$out" >&2
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  p50=$(awk '$1 == "50%" {print $2}' <<<"$out")
  p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  echo "$rps $p50 $p99 ${non2xx:-0} $deferred $gap"
}

rows=()
for conns in $CONNS_LIST; do
  step "$conns connections: direct"
  read -r d_rps d_p50 d_p99 d_bad d_def _ < <(measure "$ENGINE_PORT" "$conns")
  step "$conns connections: through slotgate"
  read -r s_rps s_p50 s_p99 s_bad s_def s_gap < <(measure "$SLOTGATE_PORT" "$conns")
  rows+=("| $conns | direct | $d_rps | $d_p50 | $d_p99 | $d_bad | $d_def | — |")
  rows+=("| $conns | slotgate | $s_rps | $s_p50 | $s_p99 | $s_bad | $s_def | ${s_gap//_/ } |")
  if [ "$PREFETCH" -gt 0 ]; then
    step "$conns connections: through slotgate, $PREFETCH ahead"
    read -r p_rps p_p50 p_p99 p_bad p_def p_gap < <(measure "$PREFETCH_PORT" "$conns")
    rows+=("| $conns | slotgate, prefetch $PREFETCH | $p_rps | $p_p50 | $p_p99 | $p_bad | $p_def | ${p_gap//_/ } |")
  fi
done

mkdir -p "$(dirname "$OUT")"
{
  echo "Load: wrk, 1 thread, $DURATION per run; POST /v1/chat/completions, $TOKENS tokens"
  echo "(ignore_eos) from llama-server ($("$LLAMA_SERVER" --version 2>&1 | sed -n 's/^version: //p'))"
  echo "with the tiny test model, --parallel $SLOTS -c $CONTEXT -t $ENGINE_THREADS; slotgate parallel $SLOTS,"
  echo "queue $max_conns. $(nproc) CPUs, $(date -u +%Y-%m-%d). Command:"
  echo "\`DURATION=$DURATION CONNS_LIST=\"$CONNS_LIST\" TOKENS=$TOKENS PREFETCH=$PREFETCH benches/engine/run.sh\`"
  echo
  echo "| connections | path | requests/s | p50 | p99 | non-2xx | engine deferred (peak) | handoff gap, mean (count) |"
  echo "|---:|---|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${rows[@]}"
} | tee "$OUT"
