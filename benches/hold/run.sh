#!/usr/bin/env bash
# What issue 28 asked the gateway to hold, measured on the release build (benches/hold/drive.py):
#
#   - idle floods: 1 100 idle connections on the API listener (default max_connections, 1 024)
#     and 100 on the admin listener (default admin_max_connections, 64), HTTP/2 prefaces and
#     then silent TCP: how long a new client's chat completion and /healthz take;
#   - three concurrent engine 500s on the only upstream: the statuses of the requests after them
#     (none may be 503 upstream-unavailable);
#   - buffered bodies: uploads of 30 MiB, chunked and with Content-Length, filling
#     max_buffered_body_bytes (256 MiB) behind a held slot: the gateway's RSS at the peak and
#     after.
#
#   benches/hold/run.sh                 # about a minute after the build
#   HOLD_BIN=/some/dir benches/hold/run.sh   # its slotgate and fake-upstream, without building
#
# Not part of CI; figures and the command of the last run are in docs/benchmarks.md ("Idle
# floods and engine 500s"). Everything listens on 127.0.0.1 only, and every process started
# here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

UPSTREAM_PORT=${UPSTREAM_PORT:-18390}
API_PORT=${API_PORT:-18391}
ADMIN_PORT=${ADMIN_PORT:-18392}

step() { printf '\n==> %s\n' "$*" >&2; }

if [[ -n ${HOLD_BIN:-} ]]; then
  bin=$HOLD_BIN
else
  step "build (release)"
  cargo build --release --locked -p slotgate-gateway -p fake-upstream
  bin=${CARGO_TARGET_DIR:-target}/release
fi

# shellcheck source=benches/common.sh
source benches/common.sh

# The floods need a descriptor per connection, on both sides.
ulimit -n 8192 2>/dev/null || true

step "fake engine on :$UPSTREAM_PORT"
"$bin/fake-upstream" --kind llama-server --parallel 4 --port "$UPSTREAM_PORT" --model m \
  >"$work/fake.log" 2>&1 &
pids+=($!)
wait_port "$UPSTREAM_PORT"

# Defaults for every bound under test: max_connections, admin_max_connections,
# header_read_timeout, eject_after_failures, max_ejection_percent, max_buffered_body_bytes.
cat >"$work/slotgate.toml" <<TOML
[server]
listen = "127.0.0.1:$API_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
health_check_interval = "1h"

[upstreams.engine]
url = "http://127.0.0.1:$UPSTREAM_PORT"
kind = "llama-server"
cancel_grace = "0s"

[upstreams.engine.models.m]
parallel = 1
queue = 64
queue_timeout = "60s"
TOML

start_gateway() {
  env RUST_LOG="${RUST_LOG:-error}" "$bin/slotgate" serve --config "$work/slotgate.toml" \
    >"$work/slotgate.log" 2>&1 &
  gateway=$!
  pids+=("$gateway")
  wait_port "$API_PORT" 60 && wait_port "$ADMIN_PORT" 60
}
stop_gateway() {
  kill "$gateway" 2>/dev/null || true
  wait "$gateway" 2>/dev/null || true
}
bounds() {
  curl -sf --max-time 5 "http://127.0.0.1:$ADMIN_PORT/metrics" |
    awk '/^slotgate_bounds_total/ && $NF > 0 { printf "%s ", $0 }'
}
drive() { python3 benches/hold/drive.py "$@"; }

for kind in h2 tcp; do
  step "idle flood ($kind): a fresh gateway"
  start_gateway
  drive flood --api "$API_PORT" --admin "$ADMIN_PORT" --kind "$kind"
  echo "bounds: $(bounds)"
  stop_gateway
done

step "three concurrent engine 500s"
start_gateway
drive errors --api "$API_PORT"
stop_gateway

for chunked in "" "--chunked"; do
  step "bodies ${chunked:-with Content-Length}: a fresh gateway"
  start_gateway
  drive bodies --api "$API_PORT" --gateway-pid "$gateway" $chunked
  echo "bounds: $(bounds)"
  stop_gateway
done

echo "$(nproc) cores, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)"
