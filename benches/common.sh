# Shared by the bench scripts (sourced, from the repository root): a scratch directory, the
# processes to stop on exit, and a wait for a port.
#
# After sourcing: `$work` is a new temporary directory; append every background process's pid
# to `pids` (or write it to `$work/NAME.pid`, for one that is restarted under a new pid); all of
# them are stopped and `$work` removed when the script exits, however it exits.

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pidfile in "$work"/*.pid; do
    if [[ -f $pidfile ]]; then kill "$(cat "$pidfile")" 2>/dev/null || true; fi
  done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

# Waits up to 10 s for something to listen on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}
