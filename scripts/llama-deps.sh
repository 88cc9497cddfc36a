#!/usr/bin/env bash
# Builds llama.cpp's `llama-server` (a real continuous-batching engine, CPU)
# once into a cache outside the clone, from the llama.cpp source that the
# `llama-cpp-python` sdist on PyPI vendors, and writes the small
# random-weight GGUF model the engine tests serve (scripts/llama-model.py,
# with the `gguf` PyPI package). Idempotent: a second run only checks.
# Fails loudly if anything cannot be built. Prints the server's path.
#
# Pinned: llama-cpp-python 0.3.36 (sdist sha256 below), cmake and gguf from
# PyPI into the qsim venv. Only the server target is built (no tests, no
# examples, no curl, static libraries).
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${QSIM_LLAMA_CACHE:-$HOME/.cache/qsim-llama}"
VENV="${QSIM_VENV:-$HOME/.cache/qsim-venv}"
VERSION=0.3.36
SDIST=llama_cpp_python-$VERSION.tar.gz
URL=https://files.pythonhosted.org/packages/ec/e9/e7de2b0463ea3ffbf0ede6cb21b58c1258a8f6521aae45ca773a59fe7cf3/$SDIST
SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
# the build is for this machine's CPU (GGML_NATIVE): a cache moved to a CPU
# with another model name or instruction set is rebuilt
CPU="$(grep -m2 -E '^(model name|flags)' /proc/cpuinfo | sha256sum | cut -c1-12)"
STAMP="$CACHE/bin/llama-server.$VERSION.$CPU"
mkdir -p "$CACHE"
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
if ! "$VENV/bin/python" -c 'import gguf, numpy' 2>/dev/null || [ ! -x "$VENV/bin/cmake" ]; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check 'gguf==0.19.0' 'cmake>=3.28,<5' numpy
fi
if [ ! -e "$STAMP" ] || [ ! -x "$CACHE/bin/llama-server" ]; then
  if ! echo "$SHA256  $CACHE/$SDIST" | sha256sum -c --status 2>/dev/null; then
    curl -sSfL --retry 3 -o "$CACHE/$SDIST.part" "$URL"
    echo "$SHA256  $CACHE/$SDIST.part" | sha256sum -c --status || { echo "llama deps: $SDIST checksum mismatch" >&2; exit 1; }
    mv "$CACHE/$SDIST.part" "$CACHE/$SDIST"
  fi
  SRC="$CACHE/src-$VERSION"
  if [ ! -f "$SRC/CMakeLists.txt" ]; then
    rm -rf "$SRC" "$CACHE/unpack"
    mkdir -p "$CACHE/unpack"
    tar xzf "$CACHE/$SDIST" -C "$CACHE/unpack" "llama_cpp_python-$VERSION/vendor/llama.cpp"
    mv "$CACHE/unpack/llama_cpp_python-$VERSION/vendor/llama.cpp" "$SRC"
    rm -rf "$CACHE/unpack"
  fi
  start=$(date +%s)
  "$VENV/bin/cmake" -S "$SRC" -B "$CACHE/build" -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DGGML_NATIVE=ON \
    -DGGML_OPENMP=OFF >"$CACHE/cmake.log" 2>&1 || { tail -20 "$CACHE/cmake.log" >&2; exit 1; }
  "$VENV/bin/cmake" --build "$CACHE/build" --target llama-server -j "$(nproc)" >"$CACHE/build.log" 2>&1 || { tail -40 "$CACHE/build.log" >&2; exit 1; }
  mkdir -p "$CACHE/bin"
  rm -f "$CACHE"/bin/llama-server.*
  cp "$CACHE/build/bin/llama-server" "$CACHE/bin/llama-server"
  touch "$STAMP"
  echo "llama deps: built llama-server $VERSION in $(( $(date +%s) - start )) s" >&2
fi
# the model (4 layers) and its 16-layer variant (the drift test's changed engine)
for spec in "4:qsim-tiny-llama.gguf" "16:qsim-tiny-llama-16l.gguf"; do
  MODEL="$CACHE/${spec#*:}"
  if ! "$VENV/bin/python" scripts/llama-model.py --check --layers "${spec%%:*}" "$MODEL" 2>/dev/null; then
    "$VENV/bin/python" scripts/llama-model.py --layers "${spec%%:*}" "$MODEL"
  fi
done
echo "llama deps: $("$CACHE/bin/llama-server" --version 2>&1 | grep -m1 -i version || true)" >&2
echo "$CACHE/bin/llama-server"
