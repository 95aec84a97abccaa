#!/usr/bin/env bash
# Models that come and go: an interleaved burst (A B A B …) on a real llama-server in router
# mode holding one model at a time (`--models-max 1`), sent straight to the engine and then
# through slotgate, counting the model loads each time.
#
#   benches/swap/run.sh                    # ROUNDS=3 rounds of each arm, ~1 min
#   N=16 ROUNDS=5 benches/swap/run.sh
#   SLOTGATE_BIN=/path/to/slotgate benches/swap/run.sh
#   GAP=0.1 benches/swap/run.sh            # spread the arrivals: one every 100 ms
#
# Each round of each arm starts a fresh router (two copies of the tiny test model as "a" and
# "b", `-np 2`, nothing loaded), sends N requests at once, alternating a and b (16 tokens each),
# (GAP seconds apart, 0.01 by default: all at once, in order), and counts the loads from the router's log ("spawning server instance with name="). slotgate
# runs with both models `parallel = 2`, `queue = 16`, `queue_timeout = "60s"`, and no setting
# for the bound: it reads `max_instances` from the router's `/props`.
#
# Needs: tests/engine/setup.sh (llama-server, built once and cached), curl, python3. Uses the
# debug slotgate of this tree (built if missing) unless SLOTGATE_BIN names a binary. Listens on
# 127.0.0.1 only; every process started here is stopped on exit, however it exits.
set -euo pipefail
cd "$(dirname "$0")/../.."
source benches/common.sh

N=${N:-16}
GAP=${GAP:-0.01}
ROUNDS=${ROUNDS:-3}
PORT=${PORT:-18630}            # the router; slotgate on +1, its admin on +2
SLOTGATE_BIN=${SLOTGATE_BIN:-target/debug/slotgate}

eval "$(tests/engine/setup.sh)"
if [ ! -x "$SLOTGATE_BIN" ]; then
  cargo build -p slotgate-gateway --bin slotgate >&2
fi
mkdir -p "$work/models"
cp "$TINY_MODEL" "$work/models/a.gguf"
cp "$TINY_MODEL" "$work/models/b.gguf"

cat >"$work/slotgate.toml" <<TOML
[server]
listen = "127.0.0.1:$((PORT + 1))"
admin_listen = "127.0.0.1:$((PORT + 2))"
health_check_interval = "200ms"

[upstreams.router]
url = "http://127.0.0.1:$PORT"
kind = "llama-server"

[upstreams.router.models.a]
parallel = 2
queue = 16
queue_timeout = "60s"

[upstreams.router.models.b]
parallel = 2
queue = 16
queue_timeout = "60s"
TOML

start_router() {
  "$LLAMA_SERVER" --models-dir "$work/models" --models-max 1 -np 2 -c 512 -t 1 \
    --host 127.0.0.1 --port "$PORT" >"$work/router.log" 2>&1 &
  echo $! >"$work/router.pid"
  wait_port "$PORT" 30
}

stop() {
  local pidfile=$work/$1.pid
  kill "$(cat "$pidfile")" 2>/dev/null || true
  wait "$(cat "$pidfile")" 2>/dev/null || true
  rm -f "$pidfile"
}

# Sends the burst to port $1; prints "ok statuses seconds".
burst() {
  python3 - "$1" "$N" "$GAP" <<'PY'
import json, sys, threading, time, urllib.request, urllib.error
port, n, gap = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])
statuses = [None] * n
def one(i):
    body = json.dumps({"model": "ab"[i % 2], "max_tokens": 16,
                       "messages": [{"role": "user", "content": f"request {i}"}]}).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", body,
                                 {"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            r.read(); statuses[i] = r.status
    except urllib.error.HTTPError as e:
        statuses[i] = e.code
    except Exception as e:
        statuses[i] = type(e).__name__
threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
start = time.monotonic()
for t in threads:
    t.start()
    time.sleep(gap)  # keeps the A B A B order of arrival
for t in threads:
    t.join()
ok = sum(1 for s in statuses if s == 200)
print(ok, ",".join(str(s) for s in statuses if s != 200) or "-", f"{time.monotonic() - start:.2f}")
PY
}

loads() { grep -c "spawning server instance with name=" "$work/router.log" || true; }

printf '| arm | round | 200s of %s | other answers | loads | seconds |\n|---|---|---|---|---|---|\n' "$N"
for round in $(seq "$ROUNDS"); do
  start_router
  read -r ok other secs < <(burst "$PORT")
  printf '| engine direct | %s | %s | %s | %s | %s |\n' "$round" "$ok" "$other" "$(loads)" "$secs"
  stop router

  start_router
  "$SLOTGATE_BIN" serve --config "$work/slotgate.toml" >"$work/slotgate.log" 2>&1 &
  echo $! >"$work/slotgate.pid"
  wait_port "$((PORT + 1))" 30
  # The bound is read from the router's /props by the first health check.
  for _ in $(seq 50); do
    curl -sf "http://127.0.0.1:$((PORT + 2))/admin/upstreams" | grep -q '"max_loaded_models":1' && break
    sleep 0.1
  done
  read -r ok other secs < <(burst "$((PORT + 1))")
  printf '| through slotgate | %s | %s | %s | %s | %s |\n' "$round" "$ok" "$other" "$(loads)" "$secs"
  stop slotgate
  stop router
done
