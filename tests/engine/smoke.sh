#!/usr/bin/env bash
# Smoke test of the real llama-server: no Rust involved.
#
#   tests/engine/smoke.sh
#
# Runs setup.sh (cached after the first run), starts llama-server on 127.0.0.1 on a free
# port with 2 slots, waits for /health (bounded), checks /props total_slots, /slots,
# /metrics, /v1/models and a chat completion (plain and streamed), and always stops the
# server. Exits non-zero on the first failure.
#
#   SLOTGATE_SMOKE_SETUP_TIMEOUT  seconds allowed for setup.sh (default 1800: a cold build)
#   SLOTGATE_SMOKE_READY_TIMEOUT  seconds allowed for /health to answer 200 (default 30)
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SETUP_TIMEOUT=${SLOTGATE_SMOKE_SETUP_TIMEOUT:-1800}
READY_TIMEOUT=${SLOTGATE_SMOKE_READY_TIMEOUT:-30}
PARALLEL=2

log() { printf 'engine-smoke: %s\n' "$*" >&2; }

passed=0
failed=0
pass() { passed=$((passed + 1)); log "ok: $*"; }
fail() {
  failed=$((failed + 1)); log "FAIL: $*"
  exit 1
}

WORK=$(mktemp -d "${TMPDIR:-/tmp}/slotgate-engine-smoke.XXXXXX")
SERVER_PID=""
SERVER_LOG="$WORK/llama-server.log"

cleanup() {
  local rc=$?
  if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" 2>/dev/null || true
  fi
  if [ "$rc" != 0 ] && [ -s "$SERVER_LOG" ]; then
    log "last lines of the llama-server log:"
    tail -n 30 "$SERVER_LOG" >&2
  fi
  rm -rf "$WORK"
  printf 'engine-smoke: %d passed, %d failed\n' "$passed" "$(( failed + (rc != 0 && failed == 0 ? 1 : 0) ))"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# ---- setup (cached) -------------------------------------------------------------------------
setup_out=$(timeout "$SETUP_TIMEOUT" "$HERE/setup.sh") || fail "setup.sh failed or took over ${SETUP_TIMEOUT}s"
eval "$setup_out"
: "${LLAMA_SERVER:?setup.sh printed no LLAMA_SERVER}" "${TINY_MODEL:?setup.sh printed no TINY_MODEL}"
PY="$SLOTGATE_ENGINE_CACHE/venv/bin/python"
pass "setup: $LLAMA_SERVER, $TINY_MODEL"

# json FILE EXPR: evaluate a Python expression on the parsed JSON document `j`.
json() { "$PY" -c 'import json,sys; j=json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"; }
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'; }
http() { curl -sS --max-time 20 "$@"; }

# ---- start llama-server on a free loopback port (retry if the port is taken meanwhile) ------
for attempt in 1 2 3; do
  PORT=$(free_port)
  BASE="http://127.0.0.1:$PORT"
  "$LLAMA_SERVER" -m "$TINY_MODEL" --host 127.0.0.1 --port "$PORT" --parallel "$PARALLEL" \
    -c 1024 -t 1 --no-webui --metrics --slots --jinja >"$SERVER_LOG" 2>&1 &
  SERVER_PID=$!
  deadline=$((SECONDS + READY_TIMEOUT))
  status=""
  while [ "$SECONDS" -lt "$deadline" ] && kill -0 "$SERVER_PID" 2>/dev/null; do
    status=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$BASE/health" || true)
    [ "$status" = 200 ] && break
    sleep 0.2
  done
  [ "$status" = 200 ] && break
  if kill -0 "$SERVER_PID" 2>/dev/null; then
    fail "/health did not answer 200 within ${READY_TIMEOUT}s (last status: ${status:-none})"
  fi
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=""
  log "llama-server exited during start (attempt $attempt, port $PORT); retrying"
done
[ "${status:-}" = 200 ] || fail "llama-server did not start"
pass "/health 200 on $BASE"

# ---- /props ---------------------------------------------------------------------------------
http -o "$WORK/props.json" "$BASE/props" || fail "GET /props"
slots=$(json "$WORK/props.json" 'j["total_slots"]') || fail "/props has no total_slots"
[ "$slots" = "$PARALLEL" ] || fail "/props total_slots = $slots, expected $PARALLEL"
pass "/props total_slots = $slots"

# ---- /slots ---------------------------------------------------------------------------------
http -o "$WORK/slots.json" "$BASE/slots" || fail "GET /slots"
n=$(json "$WORK/slots.json" 'sum(1 for s in j if s["is_processing"] is False)') || fail "/slots shape"
[ "$n" = "$PARALLEL" ] || fail "/slots: $n idle slots, expected $PARALLEL"
pass "/slots: $n idle slots"

# ---- /metrics -------------------------------------------------------------------------------
http -o "$WORK/metrics.txt" "$BASE/metrics" || fail "GET /metrics"
for name in llamacpp:requests_processing llamacpp:requests_deferred; do
  grep -q "^$name " "$WORK/metrics.txt" || fail "/metrics lacks $name"
done
pass "/metrics has requests_processing and requests_deferred"

# ---- /v1/models -----------------------------------------------------------------------------
http -o "$WORK/models.json" "$BASE/v1/models" || fail "GET /v1/models"
mid=$(json "$WORK/models.json" 'j["data"][0]["id"]') || fail "/v1/models shape"
pass "/v1/models: id $mid"

# ---- chat completion, not streamed ----------------------------------------------------------
body='{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":8}'
code=$(http -o "$WORK/chat.json" -w '%{http_code}' -H 'Content-Type: application/json' \
  -d "$body" "$BASE/v1/chat/completions") || fail "POST /v1/chat/completions"
[ "$code" = 200 ] || fail "chat completion: HTTP $code: $(cat "$WORK/chat.json")"
obj=$(json "$WORK/chat.json" 'j["object"] + " " + j["choices"][0]["message"]["role"] + " " + str(j["usage"]["completion_tokens"])') \
  || fail "chat completion shape: $(cat "$WORK/chat.json")"
pass "chat completion: $obj"

# ---- chat completion, streamed --------------------------------------------------------------
body='{"model":"tiny","messages":[{"role":"user","content":"Hello"}],"max_tokens":8,"stream":true}'
http -N -o "$WORK/stream.txt" -H 'Content-Type: application/json' -d "$body" \
  "$BASE/v1/chat/completions" || fail "POST /v1/chat/completions (stream)"
grep -q '^data: {.*"object":"chat.completion.chunk"' "$WORK/stream.txt" || fail "stream has no chat.completion.chunk"
grep -q '"finish_reason":"\(length\|stop\)"' "$WORK/stream.txt" || fail "stream has no finish_reason"
tail -n 2 "$WORK/stream.txt" | grep -qx 'data: \[DONE\]' || fail "stream does not end with data: [DONE]"
pass "streamed chat completion: $(grep -c '^data: ' "$WORK/stream.txt") events ending in [DONE]"
