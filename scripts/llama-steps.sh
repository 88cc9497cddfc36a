#!/usr/bin/env bash
# Timed single steps of llama.cpp as tests/it/engine.rs's llama-server runs
# them (issue 42): one llama_decode per step, 1 thread, one unified KV
# buffer of 8192 cells, n_batch 2048, n_ubatch 512, flash attention auto,
# on the engine tests' 4-layer model; each step's thread CPU time (what a
# quiet machine's wall time would be: the engine's one thread computes the
# whole step) and wall time. Measures decode-only steps (D = 1..8
# sequences at contexts 48 and 416), prompt-only steps (P tokens) and
# mixed steps (D decoding + one P-token prompt), and the sampler. Builds
# against the static libraries scripts/llama-deps.sh left in its cache.
# Usage: scripts/llama-steps.sh [all|decode|prompt|mixed|sampler] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE="${QSIM_LLAMA_CACHE:-$HOME/.cache/qsim-llama}"
scripts/llama-deps.sh >/dev/null
B="$CACHE/build" S="$(ls -d "$CACHE"/src-* | head -1)"
BIN="$CACHE/bin/llama-steps"
if [ ! -x "$BIN" ] || [ scripts/llama-steps.cpp -nt "$BIN" ]; then
  g++ -O2 -std=c++17 -I"$S/include" -I"$S/ggml/include" scripts/llama-steps.cpp -o "$BIN" \
    "$B/src/libllama.a" "$B/ggml/src/libggml.a" "$B/ggml/src/libggml-cpu.a" "$B/ggml/src/libggml-base.a" \
    -lpthread -ldl -lm
fi
exec "$BIN" "$CACHE/qsim-tiny-llama.gguf" "${1:-all}" "${2:-5}" 2>/dev/null
