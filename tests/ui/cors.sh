#!/usr/bin/env bash
# CORS from a real browser (issue #31): a page on another origin calls the API with `fetch`.
# Debian's headless Chromium driven by Playwright for Python (tests/ui/cors.py), against the
# real `slotgate` binary (`[server] cors_origins` listing one of two page origins, client keys
# set) in front of one `fake-upstream` llama-server with one slot and no queue, all on free
# loopback ports; cors.py serves the two pages itself, on two more.
#
#   tests/ui/cors.sh
#
# What it needs is set up by tests/ui/lib.sh, as for tests/ui/run.sh. Every process it starts is
# stopped on exit, whatever happens; the whole run is bounded.
set -euo pipefail
cd "$(dirname "$0")/../.."

# shellcheck source=tests/ui/lib.sh
source tests/ui/lib.sh
ui_prepare

read -r fake api allowed other < <(ui_free_ports 4)

key="sk-cors-$$-$RANDOM"
cat > "$work/slotgate.toml" <<TOML
[server]
listen = "127.0.0.1:$api"
health_check_interval = "1s"
api_keys = ["$key"]
cors_origins = ["http://127.0.0.1:$allowed"]

[upstreams.gpu]
url = "http://127.0.0.1:$fake"
kind = "llama-server"

[upstreams.gpu.models.chat-model]
parallel = 1
queue = 0
queue_timeout = "20s"
TOML

ui_start "$work/fake.log" \
  "$FAKE_UPSTREAM_BIN" --kind llama-server --parallel 1 --port "$fake" --model chat-model
ui_start "$work/slotgate.log" "$SLOTGATE_BIN" serve --config "$work/slotgate.toml"

ui_check 120 tests/ui/cors.py \
  --api "http://127.0.0.1:$api" --fake "http://127.0.0.1:$fake" --key "$key" \
  --allowed-port "$allowed" --other-port "$other" --chromium "$chromium"
