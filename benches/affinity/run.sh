#!/usr/bin/env bash
# Cache affinity: multi-turn conversations over three real llama-server hosts, routed four
# ways in one run: pinned per conversation (the ideal), slotgate with `affinity = "off"` (free
# slots alone, the before-figure), slotgate, and SMG's cache_aware policy.
#
#   benches/affinity/run.sh                          # both workloads, all four arms, ~4 min
#   WORKLOADS=distinct ARMS="pinned slotgate" benches/affinity/run.sh
#   SLOTGATE_BIN=/path/to/other/slotgate ARMS=slotgate benches/affinity/run.sh
#
# Workloads: `distinct` (each conversation its own 2,600-token system prompt) and `shared` (one
# system prompt for all, where prefix routing piles onto one host). Each arm of each workload
# starts three fresh llama-server processes (`-np 2 -c 16384 -t 1`), so no cache carries over,
# and stops them after. The driver (drive.py) runs CONVERSATIONS conversations of TURNS
# streamed turns at once. Results: a Markdown table on stdout and in $OUT, the raw JSON beside.
#
# Needs: tests/engine/setup.sh (llama-server, built once and cached), curl, python3. Builds
# slotgate in release mode from this tree unless SLOTGATE_BIN names a binary. Installs SMG from
# PyPI into a venv in the engine cache. Listens on 127.0.0.1 only; every process started here
# is stopped on exit, however it exits.
set -euo pipefail
cd "$(dirname "$0")/../.."

WORKLOADS=${WORKLOADS:-"distinct shared"}
ARMS=${ARMS:-"pinned slotgate-off slotgate smg"}
CONVERSATIONS=${CONVERSATIONS:-9}
TURNS=${TURNS:-6}
THINK=${THINK:-0.3}             # seconds between a conversation's turns
SYSTEM_TOKENS=${SYSTEM_TOKENS:-2600}
MAX_TOKENS=${MAX_TOKENS:-16}    # tokens generated per turn
BASE_PORT=${BASE_PORT:-18470}   # hosts on BASE_PORT..+2, the gateway on +10 (admin/metrics +11)
SMG_VERSION=${SMG_VERSION:-1.13.0}
SLOTGATE_BIN=${SLOTGATE_BIN:-}
EXTRA_SERVER=${EXTRA_SERVER:-}      # extra `key = value` lines for slotgate's [server]
# (not SLOTGATE_SERVER: slotgate reads SLOTGATE_* from its environment as configuration)
OUT=${OUT:-target/affinity/results.md}
HOSTS=3

step() { printf '\n==> %s\n' "$*" >&2; }

eval "$(tests/engine/setup.sh)"
RAW=$(dirname "$OUT")/raw-$(date +%Y%m%d-%H%M%S)
mkdir -p "$RAW"

step "model"
MODEL="$SLOTGATE_ENGINE_CACHE/models/affinity-llama.gguf"
MODEL_ARGS=(--embd 256 --blocks 4 --heads 4 --ff 768 --ctx 8192 --name slotgate-affinity-llama)
stamp="$(sha256sum tests/engine/make_tiny_model.py | cut -d' ' -f1) ${MODEL_ARGS[*]}"
if [ ! -s "$MODEL" ] || [ "$(cat "$MODEL.stamp" 2>/dev/null)" != "$stamp" ]; then
  vocab=$(ls "$SLOTGATE_ENGINE_CACHE"/src/llama_cpp_python-*/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf | head -1)
  "$SLOTGATE_ENGINE_CACHE/venv/bin/python" tests/engine/make_tiny_model.py \
    --vocab "$vocab" --out "$MODEL" "${MODEL_ARGS[@]}"
  printf '%s\n' "$stamp" >"$MODEL.stamp"
fi

if [[ " $ARMS " == *" smg "* ]]; then
  step "SMG $SMG_VERSION"
  SMG_VENV="$SLOTGATE_ENGINE_CACHE/smg-$SMG_VERSION"
  if ! "$SMG_VENV/bin/smg" --help >/dev/null 2>&1; then
    rm -rf "$SMG_VENV"
    python3 -m venv "$SMG_VENV"
    "$SMG_VENV/bin/pip" install -q --disable-pip-version-check "smg==$SMG_VERSION"
  fi
fi

if [[ " $ARMS " == *" slotgate"* ]] && [ -z "$SLOTGATE_BIN" ]; then
  step "slotgate (release build of this tree)"
  cargo build --release --locked -p slotgate-gateway
  SLOTGATE_BIN=target/release/slotgate
fi

work=$(mktemp -d)
pids=()
stop_all() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  # llama-server may wait for an open stream's ping; do not wait that long.
  for _ in $(seq 30); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  pids=()
}
cleanup() { stop_all; rm -rf "$work"; }
trap cleanup EXIT

wait_http() {
  for _ in $(seq 600); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$1" || true)" = 200 ] && return 0
    sleep 0.1
  done
  echo "no 200 from $1 within 60 s" >&2
  return 1
}

host_url() { echo "http://127.0.0.1:$((BASE_PORT + $1))"; }
GATEWAY_PORT=$((BASE_PORT + 10))

start_hosts() { # $1: log prefix
  for h in $(seq 0 $((HOSTS - 1))); do
    "$LLAMA_SERVER" -m "$MODEL" --alias bench --host 127.0.0.1 --port $((BASE_PORT + h)) \
      -np 2 -c 16384 -t 1 --metrics --slots --no-webui --jinja >"$1-host$h.log" 2>&1 &
    pids+=($!)
  done
  for h in $(seq 0 $((HOSTS - 1))); do wait_http "$(host_url "$h")/health"; done
}

start_slotgate() { # $1: log prefix, $2: extra [server] lines
  {
    printf '[server]\nlisten = "127.0.0.1:%s"\nadmin_listen = "127.0.0.1:%s"\n%s\n%s\n' \
      "$GATEWAY_PORT" $((GATEWAY_PORT + 1)) "$EXTRA_SERVER" "${2:-}"
    for h in $(seq 0 $((HOSTS - 1))); do
      printf '\n[upstreams.host%s]\nurl = "%s"\nkind = "llama-server"\n' "$h" "$(host_url "$h")"
      printf '[upstreams.host%s.models.bench]\nparallel = 2\nqueue = 64\nqueue_timeout = "120s"\n' "$h"
    done
  } >"$1-slotgate.toml"
  "$SLOTGATE_BIN" serve --config "$1-slotgate.toml" >"$1-slotgate.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$GATEWAY_PORT/v1/models"
}

start_smg() { # $1: log prefix
  local urls=()
  for h in $(seq 0 $((HOSTS - 1))); do urls+=("$(host_url "$h")"); done
  "$SMG_VENV/bin/smg" launch --worker-urls "${urls[@]}" --policy cache_aware \
    --host 127.0.0.1 --port "$GATEWAY_PORT" --prometheus-port $((GATEWAY_PORT + 1)) \
    >"$1-smg.log" 2>&1 &
  pids+=($!)
  wait_http "http://127.0.0.1:$GATEWAY_PORT/v1/models"
}

# What each engine saw: tasks started (its log), prompt tokens computed and reused (/metrics).
engine_counts() { # $1: log prefix, $2: output JSON, $3: the load average before the arm
  {
    printf '{"hosts": ['
    for h in $(seq 0 $((HOSTS - 1))); do
      [ "$h" = 0 ] || printf ', '
      local m tasks processed cached
      m=$(curl -s --max-time 5 "$(host_url "$h")/metrics")
      tasks=$(grep -c 'processing task' "$1-host$h.log" || true)
      processed=$(awk '$1 == "llamacpp:prompt_tokens_total" {print $2}' <<<"$m")
      cached=$(awk '$1 == "llamacpp:prompt_tokens_cached_total" {print $2}' <<<"$m")
      printf '{"requests": %s, "prompt_tokens": %s, "cached_tokens": %s}' \
        "${tasks:-0}" "${processed:-0}" "${cached:-0}"
    done
    printf '], "load_before": %s, "load_after": %s}\n' "$3" "$(cut -d' ' -f1 /proc/loadavg)"
  } >"$2"
}

for workload in $WORKLOADS; do
  shared=()
  [ "$workload" = shared ] && shared=(--shared)
  for arm in $ARMS; do
    step "$workload / $arm"
    prefix="$RAW/$workload-$arm"
    load_before=$(cut -d' ' -f1 /proc/loadavg)
    start_hosts "$prefix"
    case $arm in
      pinned)
        target=(--pinned)
        for h in $(seq 0 $((HOSTS - 1))); do target+=("$(host_url "$h")"); done ;;
      slotgate) start_slotgate "$prefix"; target=(--url "http://127.0.0.1:$GATEWAY_PORT") ;;
      slotgate-off)
        start_slotgate "$prefix" 'affinity = "off"'
        target=(--url "http://127.0.0.1:$GATEWAY_PORT") ;;
      smg) start_smg "$prefix"; target=(--url "http://127.0.0.1:$GATEWAY_PORT") ;;
      *) echo "unknown arm $arm" >&2; exit 2 ;;
    esac
    python3 benches/affinity/drive.py "${target[@]}" --tokenize-url "$(host_url 0)" \
      --conversations "$CONVERSATIONS" --turns "$TURNS" --think "$THINK" \
      --system-tokens "$SYSTEM_TOKENS" --max-tokens "$MAX_TOKENS" "${shared[@]}" \
      --out "$prefix.json" || echo "driver reported failures (see $prefix.json)" >&2
    engine_counts "$prefix" "$prefix-engines.json" "$load_before"
    stop_all
  done
done

step "report"
python3 benches/affinity/report.py "$RAW" | tee "$OUT"
echo "raw results and logs: $RAW" >&2
