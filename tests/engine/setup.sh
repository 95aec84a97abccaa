#!/usr/bin/env bash
# Make a real llama.cpp `llama-server` and a tiny random-weight model available to tests.
#
#   eval "$(tests/engine/setup.sh)"   # sets LLAMA_SERVER, TINY_MODEL, SLOTGATE_ENGINE_CACHE
#
# Everything lands in a cache folder outside the repo, so only the first run pays (a few
# minutes of C++ on 2 cores); later runs check what is there and return in about a second.
#
#   SLOTGATE_ENGINE_CACHE   cache folder (default: $HOME/.cache/slotgate-engine)
#   SLOTGATE_ENGINE_JOBS    parallel compile jobs (default: 2)
#   SLOTGATE_LLAMA_CPP_PYTHON_VERSION
#                           llama-cpp-python sdist whose vendored llama.cpp is built
#                           (default: 0.3.36)
#
# Only what it installs is fetched: Debian's cmake (and g++ if absent) through apt-get, and
# from PyPI the packages gguf and numpy (into a venv in the cache) and the llama-cpp-python
# source distribution. No model hub is contacted: the model is written locally by
# make_tiny_model.py with the SPM vocabulary that ships inside that sdist.
#
# Progress goes to stderr; stdout carries only KEY=value lines. The build log is kept in
# $CACHE/logs/build.log and its tail is printed when the build fails.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=${SLOTGATE_ENGINE_CACHE:-${HOME:?HOME is not set}/.cache/slotgate-engine}
VERSION=${SLOTGATE_LLAMA_CPP_PYTHON_VERSION:-0.3.36}
JOBS=${SLOTGATE_ENGINE_JOBS:-2}
GGUF_REQ="gguf==0.19.0"
NUMPY_REQ="numpy>=1.26"

# Only the server, no tests/examples/UI (the UI options download web assets when on),
# no OpenSSL, static libs, and a portable CPU baseline rather than -march=native so a
# cached binary never dies of an illegal instruction if the cache meets another CPU.
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DLLAMA_BUILD_TESTS=OFF
  -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_UI=OFF
  -DLLAMA_OPENSSL=OFF
  -DBUILD_SHARED_LIBS=OFF
  -DGGML_NATIVE=OFF
)

log() { printf 'engine-setup: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }
now() { date +%s; }

as_root() {
  if [ "$(id -u)" = 0 ]; then "$@"
  elif command -v sudo >/dev/null 2>&1; then sudo "$@"
  else die "need root (or sudo) to run: $*"
  fi
}

apt_updated=0
apt_install() {
  command -v apt-get >/dev/null 2>&1 || die "missing $*, and no apt-get to install it with"
  if [ "$apt_updated" = 0 ]; then
    log "apt-get update"
    if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get update -q >>"$APT_LOG" 2>&1; then
      log "apt-get update failed; last lines of $APT_LOG:"
      tail -n 30 "$APT_LOG" >&2
      exit 1
    fi
    apt_updated=1
  fi
  log "apt-get install -y $* (log: $APT_LOG)"
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@" >>"$APT_LOG" 2>&1; then
    log "apt-get install failed; last lines of $APT_LOG:"
    tail -n 30 "$APT_LOG" >&2
    exit 1
  fi
}

T0=$(now)
mkdir -p "$CACHE"/{bin,models,src,build,logs}
CACHE=$(cd "$CACHE" && pwd)

# One setup at a time per cache (CI and a developer may start it together).
if command -v flock >/dev/null 2>&1; then
  exec 9>"$CACHE/.lock"
  if ! flock -n 9; then
    log "waiting for another setup.sh holding $CACHE/.lock"
    flock 9
  fi
fi

SERVER="$CACHE/bin/llama-server"
SERVER_STAMP="$CACHE/bin/llama-server.stamp"
MODEL="$CACHE/models/tiny-llama.gguf"
MODEL_STAMP="$CACHE/models/tiny-llama.gguf.stamp"
VENV="$CACHE/venv"
SRC="$CACHE/src/llama_cpp_python-$VERSION"
BUILD="$CACHE/build/llama_cpp_python-$VERSION"
BUILD_LOG="$CACHE/logs/build.log"
APT_LOG="$CACHE/logs/apt.log"

want_server_stamp="llama-cpp-python==$VERSION ${CMAKE_FLAGS[*]}"
want_model_stamp="$(sha256sum "$HERE/make_tiny_model.py" | cut -d' ' -f1) $GGUF_REQ llama-cpp-python==$VERSION"

server_ok() {
  [ -x "$SERVER" ] && [ -f "$SERVER_STAMP" ] && [ "$(cat "$SERVER_STAMP")" = "$want_server_stamp" ] \
    && "$SERVER" --version >/dev/null 2>&1
}
model_ok() {
  [ -s "$MODEL" ] && [ -f "$MODEL_STAMP" ] && [ "$(cat "$MODEL_STAMP")" = "$want_model_stamp" ]
}

# ---- the Python venv (gguf + numpy; also used to fetch the sdist) -------------------------
venv_ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import gguf, numpy' >/dev/null 2>&1; }
ensure_venv() {
  venv_ok && return 0
  local py=${PYTHON:-python3}
  command -v "$py" >/dev/null 2>&1 || apt_install python3 python3-venv
  log "creating venv $VENV"
  rm -rf "$VENV"
  if ! "$py" -m venv "$VENV" >&2; then
    apt_install python3-venv
    rm -rf "$VENV"
    "$py" -m venv "$VENV" >&2
  fi
  log "pip install $GGUF_REQ $NUMPY_REQ"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$GGUF_REQ" "$NUMPY_REQ" >&2
  venv_ok || die "venv at $VENV cannot import gguf and numpy"
}

# ---- the llama-cpp-python sdist (vendors llama.cpp, including the vocab GGUFs) ------------
ensure_src() {
  [ -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ] && return 0
  local tarball="$CACHE/src/llama_cpp_python-$VERSION.tar.gz"
  if [ ! -s "$tarball" ]; then
    ensure_venv
    log "pip download llama-cpp-python==$VERSION (sdist)"
    # --no-binary for this one package only: with `:all:` pip would also build the sdist's
    # build requirements (cmake, ninja) from source just to read its metadata.
    local dl; dl=$(mktemp -d "$CACHE/src/dl.XXXXXX")
    "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps \
      --no-binary llama-cpp-python -d "$dl" "llama-cpp-python==$VERSION" >&2
    mv "$dl/llama_cpp_python-$VERSION.tar.gz" "$tarball"
    rm -rf "$dl"
  fi
  log "unpacking $(basename "$tarball")"
  local tmp; tmp=$(mktemp -d "$CACHE/src/unpack.XXXXXX")
  tar -xzf "$tarball" -C "$tmp"
  rm -rf "$SRC"
  mv "$tmp/llama_cpp_python-$VERSION" "$SRC"
  rm -rf "$tmp" "$tarball"   # the unpacked tree is all that is used from here on
  [ -f "$SRC/vendor/llama.cpp/CMakeLists.txt" ] || die "$SRC has no vendor/llama.cpp"
}

# ---- llama-server -------------------------------------------------------------------------
build_server() {
  command -v cmake >/dev/null 2>&1 || apt_install cmake
  if ! command -v c++ >/dev/null 2>&1 || ! command -v make >/dev/null 2>&1; then
    apt_install g++ make
  fi
  ensure_src
  local tree="$SRC/vendor/llama.cpp"
  local flags=("${CMAKE_FLAGS[@]}")
  # Older trees have a libcurl option (default ON); newer ones dropped it.
  if grep -q 'LLAMA_CURL' "$tree/CMakeLists.txt"; then flags+=(-DLLAMA_CURL=OFF); fi

  log "building llama-server from llama-cpp-python $VERSION (-j$JOBS; log: $BUILD_LOG)"
  local t=$(now)
  : >"$BUILD_LOG"
  if ! { cmake -S "$tree" -B "$BUILD" "${flags[@]}" \
         && cmake --build "$BUILD" --target llama-server -j"$JOBS"; } >>"$BUILD_LOG" 2>&1; then
    log "build failed; last lines of $BUILD_LOG:"
    tail -n 60 "$BUILD_LOG" >&2
    exit 1
  fi
  local built="$BUILD/bin/llama-server"
  [ -x "$built" ] || die "build finished but $built is missing (see $BUILD_LOG)"
  install -m 0755 "$built" "$SERVER.tmp"
  mv -f "$SERVER.tmp" "$SERVER"
  "$SERVER" --version >/dev/null 2>&1 || die "$SERVER does not run (--version failed)"
  printf '%s\n' "$want_server_stamp" >"$SERVER_STAMP"
  log "built llama-server in $(( $(now) - t ))s"
}

# ---- the tiny model -----------------------------------------------------------------------
make_model() {
  ensure_venv
  ensure_src
  local vocab="$SRC/vendor/llama.cpp/models/ggml-vocab-llama-spm.gguf"
  [ -f "$vocab" ] || die "vocabulary $vocab not found in the sdist"
  log "writing $MODEL"
  rm -f "$MODEL_STAMP"
  "$VENV/bin/python" "$HERE/make_tiny_model.py" --vocab "$vocab" --out "$MODEL" >&2
  printf '%s\n' "$want_model_stamp" >"$MODEL_STAMP"
}

if server_ok; then log "llama-server cached: $SERVER"; else build_server; fi
if model_ok; then log "tiny model cached: $MODEL"; else make_model; fi

log "ready in $(( $(now) - T0 ))s ($("$SERVER" --version 2>&1 | grep -m1 -i version || true))"
printf 'LLAMA_SERVER=%q\n' "$SERVER"
printf 'TINY_MODEL=%q\n' "$MODEL"
printf 'SLOTGATE_ENGINE_CACHE=%q\n' "$CACHE"
