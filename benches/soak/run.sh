#!/usr/bin/env bash
# Soak: the release gateway in front of the release fake engine under a bounded mix of traffic
# and faults (benches/soak/drive.py: streams, client cancels, queue timeouts, SIGHUP reloads, one
# engine restart, slowloris batches, bursts of engine 500s, idle-connection floods), then checks
# that nothing was kept and nobody was locked out:
#
#   - every request sent right after three concurrent engine 500s was served (the only upstream
#     was never ejected for them);
#   - during every idle flood (more idle connections than max_connections on the API listener,
#     more than admin_max_connections on the admin one), a new chat request and /healthz were
#     each answered within 1 s;
#   - every slotgate_slots_in_use and slotgate_queue_depth series is back to 0;
#   - the gateway's resident memory at the end of the load is less than 5 % above what it was
#     after the warm-up (both sampled under the same load);
#   - its open file descriptors are back to what they were before the load.
#
#   benches/soak/run.sh                    # 10 minutes
#   SOAK_SECONDS=60 benches/soak/run.sh    # a short run
#
# Knobs for finding what memory grows with (docs/benchmarks.md, "Soak"):
#   SOAK_DRIVE_ARGS="--reload-every 0 --slowloris-every 0 --no-restart"   # switch parts off
#   SOAK_ENV="MALLOC_ARENA_MAX=2"          # environment of the gateway only
#   SOAK_WRAP="valgrind --tool=massif --massif-out-file=/tmp/soak.massif"  # runs the gateway
#                                          # under it (RSS is then the tool's: read its output)
#   SOAK_BIN=/some/dir                     # its slotgate and fake-upstream, without building
#   API_PORT, ADMIN_PORT, UPSTREAM_PORT    # two soaks side by side
#
# Not part of CI (scripts/test.sh): ten minutes is most of a CI run. Figures and the command of
# the last full run are in docs/benchmarks.md. Everything listens on 127.0.0.1 only, and every
# process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/../.."

SOAK_SECONDS=${SOAK_SECONDS:-600}
# Warm-up: the first fifth of the run, at most 60 s. RSS is compared against its end.
WARMUP=${WARMUP:-$(( SOAK_SECONDS / 5 < 60 ? SOAK_SECONDS / 5 : 60 ))}
UPSTREAM_PORT=${UPSTREAM_PORT:-18290}
API_PORT=${API_PORT:-18291}
ADMIN_PORT=${ADMIN_PORT:-18292}
# Longest wait for the gauges and descriptors to settle once the load stops.
SETTLE_SECONDS=30

step() { printf '\n==> %s\n' "$*" >&2; }

if [[ -n ${SOAK_BIN:-} ]]; then
  bin=$SOAK_BIN # slotgate and fake-upstream built already (an A/B of two builds)
else
  step "build (release)"
  cargo build --release --locked -p slotgate-gateway -p fake-upstream
  bin=${CARGO_TARGET_DIR:-target}/release
fi

# shellcheck source=benches/common.sh
source benches/common.sh

# The idle floods need a descriptor per connection, on both sides.
ulimit -n 8192 2>/dev/null || true

fake_cmd="$bin/fake-upstream --kind vllm --parallel 16 --port $UPSTREAM_PORT --model m --model tight"
step "fake engine on :$UPSTREAM_PORT"
$fake_cmd >"$work/fake.log" 2>&1 &
echo $! >"$work/fake.pid"
wait_port "$UPSTREAM_PORT"

cat >"$work/slotgate.toml" <<TOML
[server]
listen = "127.0.0.1:$API_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
header_read_timeout = "3s"
# Small enough that the idle floods (300 on the API listener, 80 on the admin one with its
# default cap of 64) go past it.
max_connections = 256
client_idle_timeout = "10s"
idle_timeout = "5s"
health_check_interval = "1s"
restore_after_successes = 1

[upstreams.engine]
url = "http://127.0.0.1:$UPSTREAM_PORT"
kind = "vllm"
cancel_grace = "200ms"

[upstreams.engine.models.m]
parallel = 8
queue = 64
queue_timeout = "10s"

# One slot and a short queue: the queue filler's.
[upstreams.engine.models.tight]
parallel = 1
queue = 3
queue_timeout = "500ms"
TOML

step "slotgate on :$API_PORT (admin :$ADMIN_PORT)"
# shellcheck disable=SC2086 # SOAK_ENV and SOAK_WRAP are word lists on purpose
env RUST_LOG="${RUST_LOG:-error}" ${SOAK_ENV:-} ${SOAK_WRAP:-} "$bin/slotgate" serve \
  --config "$work/slotgate.toml" >"$work/slotgate.log" 2>&1 &
gateway=$!
pids+=("$gateway")
if ! wait_port "$API_PORT" 120 || ! wait_port "$ADMIN_PORT" 120; then
  echo "slotgate did not start; its log:" >&2
  cat "$work/slotgate.log" >&2
  exit 1
fi

rss_kib() { awk '/^VmRSS:/ { print $2 }' "/proc/$gateway/status"; }
# RSS split: anonymous (the allocator's heap and arenas, thread stacks) and file-backed (the
# binary's code pages, faulted in as new paths run: bounded by the binary's size).
rss_split() { awk '/^RssAnon:/ { a = $2 } /^RssFile:/ { f = $2 } END { print a " " f }' "/proc/$gateway/status"; }
fds() { find "/proc/$gateway/fd" -mindepth 1 -maxdepth 1 | wc -l; }
metrics() { curl -sf --max-time 5 "http://127.0.0.1:$ADMIN_PORT/metrics"; }
# The sum of every sample of the series named $1.
series_sum() { metrics | awk -v name="$1" '$1 ~ "^"name"[{ ]" || $1 == name { s += $NF } END { print s + 0 }'; }
held() { echo $(( $(series_sum slotgate_slots_in_use) + $(series_sum slotgate_queue_depth) )); }

fd_baseline=$(fds)
rss_start=$(rss_kib)
step "load for ${SOAK_SECONDS}s (warm-up ${WARMUP}s); baseline: $fd_baseline fds, RSS $rss_start KiB"
# shellcheck disable=SC2086 # SOAK_DRIVE_ARGS is a word list on purpose
python3 benches/soak/drive.py --port "$API_PORT" --seconds "$SOAK_SECONDS" --warmup "$WARMUP" \
  --config "$work/slotgate.toml" --gateway-pid "$gateway" \
  --fake-pidfile "$work/fake.pid" --fake-cmd "$fake_cmd" --admin-port "$ADMIN_PORT" \
  ${SOAK_DRIVE_ARGS:-} >"$work/drive.out" &
driver=$!
pids+=("$driver")

# RSS every 10 s while the load runs; the sample at the end of the warm-up is the reference.
samples=()
rss_warm=
split_warm=
split_end=$(rss_split)
elapsed=0
while kill -0 "$driver" 2>/dev/null; do
  sleep 10
  elapsed=$((elapsed + 10))
  kill -0 "$gateway" || { echo "the gateway died; its log:" >&2; cat "$work/slotgate.log" >&2; exit 1; }
  if kill -0 "$driver" 2>/dev/null; then
    samples+=("$(rss_kib)")
    if [[ -z $rss_warm && $elapsed -ge $WARMUP ]]; then
      rss_warm=${samples[-1]}
      split_warm=$(rss_split)
    fi
    split_end=$(rss_split)
  fi
done
wait "$driver"
rss_end=${samples[-1]}
rss_warm=${rss_warm:-${samples[0]}}
split_warm=${split_warm:-$split_end}

step "settling (at most ${SETTLE_SECONDS}s)"
for _ in $(seq "$SETTLE_SECONDS"); do
  if [[ $(held) == 0 && $(fds) -le $fd_baseline ]]; then break; fi
  sleep 1
done
held_end=$(held)
fd_end=$(fds)
rss_idle=$(rss_kib)
growth=$(awk -v a="$rss_warm" -v b="$rss_end" 'BEGIN { printf "%.2f", (b - a) * 100 / a }')

cat <<EOF

soak of ${SOAK_SECONDS}s, $(nproc) cores, load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)
traffic: $(cat "$work/drive.out")
RSS KiB: start $rss_start, after warm-up $rss_warm, end of load $rss_end (growth ${growth} %), idle after $rss_idle
RSS samples every 10 s (KiB): ${samples[*]}
RSS anon + file KiB: after warm-up ${split_warm/ / + }, end of load ${split_end/ / + }
open fds: before the load $fd_baseline, after $fd_end
slots in use + queued after the load: $held_end
reloads applied: $(series_sum 'slotgate_config_reloads_total')
bounds counted: $(metrics | grep '^slotgate_bounds_total' | awk '$NF > 0 { printf "%s ", $0 }')
EOF

failed=0
if [[ $held_end != 0 ]]; then echo "FAIL: $held_end slots or queue places still held" >&2; failed=1; fi
if awk -v g="$growth" 'BEGIN { exit !(g >= 5) }'; then
  echo "FAIL: RSS grew ${growth} % after the warm-up (limit 5 %)" >&2
  failed=1
fi
if ((fd_end > fd_baseline)); then
  echo "FAIL: $fd_end open fds, $fd_baseline before the load" >&2
  failed=1
fi
if grep -q '"slowloris_not_cut"' "$work/drive.out"; then
  echo "FAIL: a slowloris connection was not cut" >&2
  failed=1
fi
if grep -qE '"after500_([013-9][0-9]*|2[1-9][0-9]|20[1-9])"|"after500_error' "$work/drive.out"; then
  echo "FAIL: a request right after three engine 500s was not served (the upstream was ejected?)" >&2
  failed=1
fi
if grep -qE '"flood_(chat|healthz)_lockout"' "$work/drive.out"; then
  echo "FAIL: during an idle flood a new client waited 1 s or more" >&2
  failed=1
fi
if grep -qE '"flood_(chat|healthz)_([013-9][0-9]*|2[1-9][0-9]|20[1-9])"' "$work/drive.out"; then
  echo "FAIL: during an idle flood a new client was not served" >&2
  failed=1
fi
((failed == 0)) && echo "soak passed"
exit "$failed"
