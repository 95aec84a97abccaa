# Shared by run.sh and instructions.sh: installing the tools, and starting the static nginx
# upstream, the fake upstream, slotgate and HAProxy on loopback ports free when the run starts
# (or UPSTREAM_PORT, SLOTGATE_PORT, HAPROXY_PORT, ADMIN_PORT when set). Sourced, not run.
# Every process started is recorded in `pids` and stopped by `stop_all` / the EXIT trap.
# The caller sets PROXY_THREADS; SLOTGATE_WRAP / HAPROXY_WRAP may name a command to run the
# proxy under (valgrind, for instructions.sh).

SLOTGATE_WRAP=${SLOTGATE_WRAP:-}
HAPROXY_WRAP=${HAPROXY_WRAP:-}
PROFILE=${PROFILE:-release}   # cargo profile the binaries are built with

step() { printf '\n==> %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

step "tools"
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing+=(nginx)
if [ ${#missing[@]} -gt 0 ]; then
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
HAPROXY=$(command -v haproxy || echo /usr/sbin/haproxy)
# Held streams need two descriptors each in the proxy (the hold scenario skips what does not fit).
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"
# Build first so the compile does not compete with the measurement.
cargo build --profile "$PROFILE" --locked -p slotgate-gateway -p fake-upstream
# SLOTGATE_BIN: another build of the gateway to measure (an A/B against an older commit).
SLOTGATE_BIN=${SLOTGATE_BIN:-target/$PROFILE/slotgate}
FAKE_BIN=target/$PROFILE/fake-upstream
CLK_TCK=$(getconf CLK_TCK)

# shellcheck source=benches/common.sh
source benches/common.sh
read -r port1 port2 port3 port4 < <(free_ports 4)
UPSTREAM_PORT=${UPSTREAM_PORT:-$port1}
SLOTGATE_PORT=${SLOTGATE_PORT:-$port2}
HAPROXY_PORT=${HAPROXY_PORT:-$port3}
ADMIN_PORT=${ADMIN_PORT:-$port4}

stop_all() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}
# CPU ticks (user + system) used so far by a process and its threads.
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
ticks_all() { local t=0 p; for p in "$@"; do t=$((t + $(ticks "$p"))); done; echo "$t"; }
rss_kib() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status"; }
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

start_nginx() {
  cat >"$work/nginx.conf" <<NGINX
worker_processes 1;
daemon off;
pid $work/nginx.master;
error_log stderr error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 120s;
  client_body_temp_path $work;
  proxy_temp_path $work;
  fastcgi_temp_path $work;
  uwsgi_temp_path $work;
  scgi_temp_path $work;
  default_type application/json;
  server {
    listen 127.0.0.1:$UPSTREAM_PORT;
    location = /health { return 200 '{"status":"ok"}'; }
    location = /v1/models { return 200 '{"object":"list","data":[{"id":"bench","object":"model","owned_by":"bench"}]}'; }
    location = /v1/chat/completions {
      client_body_buffer_size 16k;
      return 200 '{"id":"chatcmpl-bench","object":"chat.completion","created":1764547200,"model":"bench","choices":[{"index":0,"message":{"role":"assistant","content":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen"},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":16,"total_tokens":21}}';
    }
  }
}
NGINX
  "$NGINX" -c "$work/nginx.conf" -e stderr >"$work/nginx.log" 2>&1 &
  pids+=($!)
  wait_port "$UPSTREAM_PORT"
  # The master forks one worker: CPU is counted over both.
  sleep 0.3
  upstream_pids="$(cat "$work/nginx.master") $(pgrep -P "$(cat "$work/nginx.master")" | tr '\n' ' ')"
}

start_fake() {
  "$FAKE_BIN" --kind vllm --parallel 100000 --port "$UPSTREAM_PORT" \
    --model bench "$@" >"$work/fake.log" 2>&1 &
  pids+=($!)
  upstream_pids=$!
  wait_port "$UPSTREAM_PORT"
}

# $1: kind of the upstream as slotgate sees it; $2: cap; $3: queue; $4: max connections.
# EXTRA_SERVER: extra `key = value` lines for `[server]` (e.g. `affinity = "off"`); not named
# SLOTGATE_SERVER, which slotgate itself would read as its `server` table.
start_slotgate() {
  cat >"$work/slotgate.toml" <<TOML
[server]
listen = "127.0.0.1:$SLOTGATE_PORT"
admin_listen = "127.0.0.1:$ADMIN_PORT"
max_connections = $4
${EXTRA_SERVER:-}

[upstreams.bench]
url = "http://127.0.0.1:$UPSTREAM_PORT"
kind = "$1"

[upstreams.bench.models.bench]
parallel = $2
queue = $3
queue_timeout = "30s"
TOML
  TOKIO_WORKER_THREADS=$PROXY_THREADS RUST_LOG=warn \
    $SLOTGATE_WRAP "$SLOTGATE_BIN" serve --config "$work/slotgate.toml" >"$work/slotgate.log" 2>&1 &
  pids+=($!)
  slotgate_pid=$!
  wait_port "$SLOTGATE_PORT" 120
  # Ready once the first health check has passed.
  for _ in $(seq 600); do
    curl -fsS "http://127.0.0.1:$ADMIN_PORT/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "slotgate never became ready" >&2
  cat "$work/slotgate.log" >&2
  return 1
}

# $1: cap; $2: queue; $3: max connections.
start_haproxy() {
  cat >"$work/haproxy.cfg" <<CFG
global
  maxconn $3
  nbthread $PROXY_THREADS
defaults
  mode http
  timeout connect 5s
  timeout client 120s
  timeout server 120s
  timeout queue 30s
  option http-keep-alive
  http-reuse always
frontend bench
  bind 127.0.0.1:$HAPROXY_PORT
  maxconn $3
  default_backend upstream
backend upstream
  server up 127.0.0.1:$UPSTREAM_PORT maxconn $1 maxqueue $2
CFG
  $HAPROXY_WRAP "$HAPROXY" -f "$work/haproxy.cfg" -db >"$work/haproxy.log" 2>&1 &
  pids+=($!)
  haproxy_pid=$!
  wait_port "$HAPROXY_PORT" 120
}


# The request every throughput run sends (wrk -s): a one-line chat, or the JSON body in
# BODY_FILE (e.g. a long conversation, to price cache-aware routing's hashing and index work).
if [ -n "${BODY_FILE:-}" ]; then
  {
    echo 'wrk.method = "POST"'
    echo 'wrk.headers["Content-Type"] = "application/json"'
    printf 'wrk.body = [==[%s]==]\n' "$(cat "$BODY_FILE")"
  } >"$work/post.lua"
else
  cat >"$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"model":"bench","messages":[{"role":"user","content":"hello"}],"max_tokens":16}'
LUA
fi
