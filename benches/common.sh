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

# Prints $1 distinct loopback TCP ports that nothing listens on now (the kernel picks them,
# all held open until all are picked), so two runs side by side do not meet on fixed ports.
# Between this and the bind that takes a port another process could take it: the bind then
# fails loudly, never a measurement of the wrong process.
free_ports() {
  python3 -c 'import socket, sys
held = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in held: s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in held))' "$1"
}

# Waits up to $2 seconds (default 10) for something to listen on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq $((${2:-10} * 10))); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

# Builds the limiter's instruction-count driver (crates/limiter/benches/instructions.rs) and
# prints its path.
instructions_driver() {
  cargo bench -p slotgate-limiter --bench instructions --no-run 2>"$work/build.log" || {
    cat "$work/build.log" >&2
    return 1
  }
  sed -n 's/.*Executable .*(\(.*instructions-[0-9a-f]*\))$/\1/p' "$work/build.log" | tail -1
}
