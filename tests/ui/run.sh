#!/usr/bin/env bash
# The status page (GET /ui on the admin listener) in a real browser: Debian's headless Chromium
# driven by Playwright for Python (tests/ui/check.py), against the real `slotgate` binary in
# front of two `fake-upstream` llama-servers, all on free loopback ports.
#
#   tests/ui/run.sh [SCREENSHOT.png]      (default: target/ui/status-page.png)
#
# It installs what it lacks: the `chromium` package (apt-get), and a virtualenv with the pinned
# Playwright, cached outside the repository like the SDK tests' ones (see tests/support:
# $SLOTGATE_TEST_VENVS, else $XDG_CACHE_HOME or ~/.cache, /slotgate-test-venvs). Playwright's own
# browser download is never used (`executable_path` is the system Chromium). It builds the two
# binaries (debug; a no-op when fresh), or takes them from $SLOTGATE_BIN and $FAKE_UPSTREAM_BIN.
# Every process it starts is stopped on exit, whatever happens; the whole run is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

PLAYWRIGHT_VERSION=1.65.2
screenshot=${1:-target/ui/status-page.png}

if ! command -v chromium >/dev/null 2>&1; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
fi

cache=${SLOTGATE_TEST_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/slotgate-test-venvs}
venv="$cache/ui-playwright-$PLAYWRIGHT_VERSION"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$cache"
  # Built aside and renamed into place, so a concurrent run never sees half a venv.
  building="$cache/.ui-playwright-$PLAYWRIGHT_VERSION.$$"
  rm -rf "$building"
  python3 -m venv "$building"
  timeout 600 "$building/bin/python" -m pip install --quiet --disable-pip-version-check \
    --timeout 30 --retries 2 "playwright==$PLAYWRIGHT_VERSION"
  mv -T "$building" "$venv" 2>/dev/null || rm -rf "$building"
fi

if [ -z "${SLOTGATE_BIN:-}" ] || [ -z "${FAKE_UPSTREAM_BIN:-}" ]; then
  timeout 900 cargo build --locked --quiet -p slotgate-gateway --bin slotgate -p fake-upstream --bin fake-upstream
  target=${CARGO_TARGET_DIR:-target}
  SLOTGATE_BIN=${SLOTGATE_BIN:-$target/debug/slotgate}
  FAKE_UPSTREAM_BIN=${FAKE_UPSTREAM_BIN:-$target/debug/fake-upstream}
fi

work=$(mktemp -d)
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap stop_all EXIT
# Killed or interrupted: exit, which runs the EXIT trap.
trap 'exit 143' TERM
trap 'exit 130' INT

# Free loopback ports, picked by the kernel.
read -r port_a port_b api admin < <("$venv/bin/python" - <<'PY'
import socket
socks = [socket.socket() for _ in range(4)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
PY
)

token="ui-test-$$-$RANDOM"
cat > "$work/slotgate.toml" <<TOML
[server]
listen = "127.0.0.1:$api"
admin_listen = "127.0.0.1:$admin"
admin_token = "$token"
health_check_interval = "1s"

[upstreams.host-a]
url = "http://127.0.0.1:$port_a"
kind = "llama-server"

[upstreams.host-a.models.chat-model]
parallel = 2
queue = 2
queue_timeout = "20s"

[upstreams.host-b]
url = "http://127.0.0.1:$port_b"
kind = "llama-server"

[upstreams.host-b.models.chat-model]
parallel = 2
queue = 2
queue_timeout = "20s"
TOML

for port in "$port_a" "$port_b"; do
  "$FAKE_UPSTREAM_BIN" --kind llama-server --parallel 2 --port "$port" --model chat-model \
    >"$work/fake-$port.log" 2>&1 &
  pids+=($!)
done
"$SLOTGATE_BIN" serve --config "$work/slotgate.toml" >"$work/slotgate.log" 2>&1 &
pids+=($!)

mkdir -p "$(dirname "$screenshot")"
status=0
timeout 180 "$venv/bin/python" tests/ui/check.py \
  --api "http://127.0.0.1:$api" --admin "http://127.0.0.1:$admin" --token "$token" \
  --fake "host-a=http://127.0.0.1:$port_a" --fake "host-b=http://127.0.0.1:$port_b" \
  --chromium "$(command -v chromium)" --screenshot "$screenshot" || status=$?
if [ "$status" -ne 0 ]; then
  echo "--- slotgate log (last 40 lines)"
  tail -n 40 "$work/slotgate.log"
fi
exit "$status"
