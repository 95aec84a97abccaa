#!/usr/bin/env bash
# The status page (GET /ui on the admin listener) in a real browser: Debian's headless Chromium
# driven by Playwright for Python (tests/ui/check.py), against the real `slotgate` binary in
# front of two `fake-upstream` llama-servers, all on free loopback ports.
#
#   tests/ui/run.sh [SCREENSHOT.png]      (default: target/ui/status-page.png)
#
# What it needs (Chromium, Playwright, the two binaries) is set up by tests/ui/lib.sh, shared
# with tests/ui/cors.sh. Every process it starts is stopped on exit, whatever happens; the whole
# run is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

screenshot=${1:-target/ui/status-page.png}

# shellcheck source=tests/ui/lib.sh
source tests/ui/lib.sh
ui_prepare

read -r port_a port_b api admin < <(ui_free_ports 4)

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
  ui_start "$work/fake-$port.log" \
    "$FAKE_UPSTREAM_BIN" --kind llama-server --parallel 2 --port "$port" --model chat-model
done
ui_start "$work/slotgate.log" "$SLOTGATE_BIN" serve --config "$work/slotgate.toml"

mkdir -p "$(dirname "$screenshot")"
ui_check 180 tests/ui/check.py \
  --api "http://127.0.0.1:$api" --admin "http://127.0.0.1:$admin" --token "$token" \
  --fake "host-a=http://127.0.0.1:$port_a" --fake "host-b=http://127.0.0.1:$port_b" \
  --chromium "$chromium" --screenshot "$screenshot"
