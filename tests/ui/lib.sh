# What the browser tests share (sourced by tests/ui/run.sh and tests/ui/cors.sh, never run):
# Debian's headless Chromium, a virtualenv with the pinned Playwright for Python, the two
# binaries, a private work directory, free loopback ports, and the clean-up of every process a
# test starts.
#
# `ui_prepare` installs what is missing: the `chromium` package (apt-get), and the virtualenv,
# cached outside the repository like the SDK tests' ones (see tests/support:
# $SLOTGATE_TEST_VENVS, else $XDG_CACHE_HOME or ~/.cache, /slotgate-test-venvs). Playwright's own
# browser download is never used (the scripts pass the system Chromium as `executable_path`).
# It builds the two binaries (debug; a no-op when fresh), or takes them from $SLOTGATE_BIN and
# $FAKE_UPSTREAM_BIN. After it: $venv, $chromium, $SLOTGATE_BIN, $FAKE_UPSTREAM_BIN and $work are
# set, and every process started with `ui_start` is stopped on exit, whatever happens.

PLAYWRIGHT_VERSION=1.65.2

ui_prepare() {
  if ! command -v chromium >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
  fi
  chromium=$(command -v chromium)

  local cache=${SLOTGATE_TEST_VENVS:-${XDG_CACHE_HOME:-$HOME/.cache}/slotgate-test-venvs}
  venv="$cache/ui-playwright-$PLAYWRIGHT_VERSION"
  if [ ! -x "$venv/bin/python" ]; then
    mkdir -p "$cache"
    # Built aside and renamed into place, so a concurrent run never sees half a venv.
    local building="$cache/.ui-playwright-$PLAYWRIGHT_VERSION.$$"
    rm -rf "$building"
    python3 -m venv "$building"
    timeout 600 "$building/bin/python" -m pip install --quiet --disable-pip-version-check \
      --timeout 30 --retries 2 "playwright==$PLAYWRIGHT_VERSION"
    mv -T "$building" "$venv" 2>/dev/null || rm -rf "$building"
  fi

  if [ -z "${SLOTGATE_BIN:-}" ] || [ -z "${FAKE_UPSTREAM_BIN:-}" ]; then
    timeout 900 cargo build --locked --quiet -p slotgate-gateway --bin slotgate \
      -p fake-upstream --bin fake-upstream
    local target=${CARGO_TARGET_DIR:-target}
    SLOTGATE_BIN=${SLOTGATE_BIN:-$target/debug/slotgate}
    FAKE_UPSTREAM_BIN=${FAKE_UPSTREAM_BIN:-$target/debug/fake-upstream}
  fi

  work=$(mktemp -d)
  pids=()
  trap ui_stop_all EXIT
  # Killed or interrupted: exit, which runs the EXIT trap.
  trap 'exit 143' TERM
  trap 'exit 130' INT
}

# Stops every process `ui_start` started and removes the work directory.
ui_stop_all() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}

# `ui_start LOG COMMAND…`: runs COMMAND in the background, its output in LOG, stopped on exit.
ui_start() {
  local log=$1
  shift
  "$@" >"$log" 2>&1 &
  pids+=($!)
}

# `ui_free_ports N`: N free loopback ports on one line, picked by the kernel.
ui_free_ports() {
  "$venv/bin/python" - "$1" <<'PY'
import socket
import sys

socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))
for s in socks:
    s.close()
PY
}

# `ui_check LIMIT SCRIPT ARGS…`: runs the Python SCRIPT in the venv, killed after LIMIT seconds;
# on failure shows the end of the gateway's log ($work/slotgate.log). Returns SCRIPT's status.
ui_check() {
  local limit=$1 status=0
  shift
  timeout "$limit" "$venv/bin/python" "$@" || status=$?
  if [ "$status" -ne 0 ]; then
    echo "--- slotgate log (last 40 lines)"
    tail -n 40 "$work/slotgate.log"
  fi
  return "$status"
}
