#!/usr/bin/env bash
# Load benchmark: the cost of the proxy itself, slotgate against HAProxy with the same cap and
# queue, in front of an upstream faster than either (so the upstream is never what is measured).
#
#   benches/load/run.sh                          # every scenario, defaults below
#   SCENARIOS=static ROUNDS=5 benches/load/run.sh
#   SCENARIOS=hold HOLD_COUNTS="1000" benches/load/run.sh
#
# Scenarios:
#   static  nginx (one worker) answering /health, /v1/models and the chat path with fixed bodies;
#           wrk against it directly, through slotgate and through HAProxy, runs alternating
#           (direct, slotgate, HAProxy, direct, …), ROUNDS times; medians reported.
#   fake    the same three paths in front of fake-upstream --kind vllm (16 tokens, no pacing).
#           The fake is slower than both proxies, so this one mostly measures the fake; kept as a
#           second scenario because it answers like a real engine (SSE framing, usage).
#   hold    RSS per held stream: HOLD_COUNTS streamed requests kept open at once through each
#           proxy to a fake upstream that streams one token a second; (RSS with N open − RSS
#           idle) / N.
#
# Figures: requests/s, p50, p99 (wrk), and CPU µs per request of each process (utime + stime
# from /proc/PID/stat over the measured run, divided by the requests wrk completed). CPU per
# request is what a shared machine distorts least; requests/s and p99 need a quiet machine.
#
# It installs what it needs from Debian's packages (nginx, haproxy, wrk; as root or via sudo),
# builds slotgate and fake-upstream in release mode, raises `ulimit -n`, stops every process it
# started, and writes the tables to $OUT.
set -euo pipefail
cd "$(dirname "$0")/../.."

SCENARIOS=${SCENARIOS:-"static fake hold"}
ROUNDS=${ROUNDS:-3}          # alternating rounds per scenario (medians over these)
DURATION=${DURATION:-10s}    # per measured wrk run
CONNS=${CONNS:-32}           # wrk connections
THREADS=${THREADS:-1}        # wrk threads
CAP=${CAP:-64}               # slotgate parallel / HAProxy maxconn
QUEUE=${QUEUE:-64}           # slotgate queue / HAProxy maxqueue
PROXY_THREADS=${PROXY_THREADS:-1}  # HAProxy nbthread and slotgate TOKIO_WORKER_THREADS alike
TOKENS=${TOKENS:-16}         # tokens per answer from the fake upstream
HOLD_COUNTS=${HOLD_COUNTS:-"1000 5000 10000"}  # counts past what `ulimit -n` allows are skipped
OUT=${OUT:-target/load/results.md}

# shellcheck source=benches/load/common.sh
source benches/load/common.sh


# $1: port; $2: the proxy's pid (or "" for direct). Prints
# "req/s p50_ms p99_ms non2xx proxy_cpu_us_per_req upstream_cpu_us_per_req".
measure() {
  local port=$1 proxy=$2 out
  wrk -t"$THREADS" -c"$CONNS" -d2s -s "$work/post.lua" "http://127.0.0.1:$port/v1/chat/completions" >/dev/null
  local p0 u0 p1 u1
  p0=$([ -n "$proxy" ] && ticks "$proxy" || echo 0)
  # shellcheck disable=SC2086
  u0=$(ticks_all $upstream_pids)
  out=$(wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency -s "$work/post.lua" \
    "http://127.0.0.1:$port/v1/chat/completions")
  p1=$([ -n "$proxy" ] && ticks "$proxy" || echo 0)
  # shellcheck disable=SC2086
  u1=$(ticks_all $upstream_pids)
  echo "$out" >&2
  awk -v p="$((p1 - p0))" -v u="$((u1 - u0))" -v hz="$CLK_TCK" '
    function ms(v) { if (v ~ /us$/) return v / 1000; if (v ~ /ms$/) return v + 0; if (v ~ /s$/) return v * 1000; return v }
    / requests in / { n = $1 }
    /^Requests\/sec:/ { rps = $2 }
    $1 == "50%" { p50 = ms($2) }
    $1 == "99%" { p99 = ms($2) }
    /Non-2xx or 3xx responses:/ { bad = $5 }
    END {
      printf "%.0f %.3f %.3f %d %.1f %.1f\n", rps, p50, p99, bad + 0,
        (n > 0 ? p * 1e6 / hz / n : 0), (n > 0 ? u * 1e6 / hz / n : 0)
    }' <<<"$out"
}

# Runs one throughput scenario: ROUNDS alternating rounds of direct, slotgate, HAProxy.
# $1: scenario name; $2: slotgate's kind for the upstream.
throughput() {
  local name=$1 kind=$2 round
  start_slotgate "$kind" "$CAP" "$QUEUE" 4096
  start_haproxy "$CAP" "$QUEUE" 4096
  declare -A col
  for round in $(seq "$ROUNDS"); do
    for path in direct slotgate haproxy; do
      step "$name round $round/$ROUNDS: $path"
      case $path in
        direct) read -r rps p50 p99 bad pcpu ucpu < <(measure "$UPSTREAM_PORT" "") ;;
        slotgate) read -r rps p50 p99 bad pcpu ucpu < <(measure "$SLOTGATE_PORT" "$slotgate_pid") ;;
        haproxy) read -r rps p50 p99 bad pcpu ucpu < <(measure "$HAPROXY_PORT" "$haproxy_pid") ;;
      esac
      col[$path.rps]+=" $rps"; col[$path.p50]+=" $p50"; col[$path.p99]+=" $p99"
      col[$path.bad]+=" $bad"; col[$path.pcpu]+=" $pcpu"; col[$path.ucpu]+=" $ucpu"
    done
  done
  stop_all
  {
    echo
    echo "### $name: medians of $ROUNDS alternating rounds"
    echo
    echo "| path | requests/s | p50 ms | p99 ms | non-2xx | proxy CPU µs/req | upstream CPU µs/req | all rounds (req/s) |"
    echo "|---|---:|---:|---:|---:|---:|---:|---|"
    for path in direct slotgate haproxy; do
      local label=$path
      [ "$path" = haproxy ] && label="HAProxy $("$HAPROXY" -v | awk 'NR==1 {print $3}')"
      local pc
      pc=$(median <<<"${col[$path.pcpu]}")
      [ "$path" = direct ] && pc="—"
      printf '| %s | %s | %s | %s | %s | %s | %s | %s |\n' "$label" \
        "$(median <<<"${col[$path.rps]}")" "$(median <<<"${col[$path.p50]}")" \
        "$(median <<<"${col[$path.p99]}")" "$(median <<<"${col[$path.bad]}")" "$pc" \
        "$(median <<<"${col[$path.ucpu]}")" "${col[$path.rps]# }"
    done
  } >>"$OUT"
}

# RSS per held stream through one proxy. $1: label; $2: port; $3: pid; $4: count.
hold_one() {
  local label=$1 port=$2 pid=$3 count=$4 before after
  sleep 1
  before=$(rss_kib "$pid")
  coproc HOLD { python3 benches/load/hold.py --port "$port" --count "$count"; }
  local line
  if ! read -r -t 300 line <&"${HOLD[0]}" || [ "${line%% *}" != ready ]; then
    echo "holding $count streams through $label failed: ${line:-timeout}" >&2
    kill "$HOLD_PID" 2>/dev/null || true
    return 1
  fi
  sleep 2
  after=$(rss_kib "$pid")
  local fd=${HOLD[1]}
  exec {fd}>&-
  wait "$HOLD_PID" || true
  awk -v l="$label" -v n="$count" -v b="$before" -v a="$after" \
    'BEGIN { printf "| %s | %d | %.1f | %.1f | %.2f |\n", l, n, b / 1024, a / 1024, (a - b) / n }' >>"$OUT"
  sleep 2
}

hold() {
  {
    echo
    echo "### hold: RSS per held stream (fake vLLM streaming one token a second)"
    echo
    echo "| proxy | streams held | RSS idle MiB | RSS held MiB | KiB per stream |"
    echo "|---|---:|---:|---:|---:|"
  } >>"$OUT"
  local count
  for count in $HOLD_COUNTS; do
    # Each proxy needs a descriptor per client and per upstream connection.
    if ((count * 2 + 200 > $(ulimit -n))); then
      echo "| (skipped) | $count | | | needs $((count * 2 + 200)) descriptors; \`ulimit -n\` is $(ulimit -n) |" >>"$OUT"
      continue
    fi
    start_fake --tokens 300 --chunk-interval-ms 1000
    start_slotgate vllm $((count + 100)) 0 $((count + 100))
    start_haproxy $((count + 100)) 0 $((count + 100))
    step "hold $count streams through slotgate"
    hold_one slotgate "$SLOTGATE_PORT" "$slotgate_pid" "$count"
    step "hold $count streams through HAProxy"
    hold_one "HAProxy" "$HAPROXY_PORT" "$haproxy_pid" "$count"
    stop_all
  done
}

mkdir -p "$(dirname "$OUT")"
{
  echo "Load benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) CPUs, load average before: $(cut -d' ' -f1-3 /proc/loadavg)."
  echo "wrk $THREADS thread(s), $CONNS connections, $DURATION per run, POST /v1/chat/completions;"
  echo "cap $CAP, queue $QUEUE; HAProxy nbthread and slotgate worker threads: $PROXY_THREADS."
  echo "Command: \`SCENARIOS=\"$SCENARIOS\" ROUNDS=$ROUNDS DURATION=$DURATION CONNS=$CONNS THREADS=$THREADS CAP=$CAP QUEUE=$QUEUE PROXY_THREADS=$PROXY_THREADS HOLD_COUNTS=\"$HOLD_COUNTS\" benches/load/run.sh\`"
} >"$OUT"
for scenario in $SCENARIOS; do
  case $scenario in
    static) start_nginx; throughput static openai ;;
    fake) start_fake --tokens "$TOKENS"; throughput fake vllm ;;
    hold) hold ;;
    *) echo "unknown scenario $scenario (static, fake, hold)" >&2; exit 2 ;;
  esac
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)" >>"$OUT"
cat "$OUT"
