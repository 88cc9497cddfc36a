#!/usr/bin/env bash
# Regenerates the plots the README shows (docs/img/*.png) with qsim's own
# --plot, from the experiment files in the repo. Deterministic: the same
# inputs and seeds give the same files.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
QSIM="$(scripts/qsim-bin.sh)"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
OUT=docs/img
mkdir -p "$OUT"

# the FMAPI pacing article: row latency CDF of the three clients, 20 seeds
"$QSIM" run experiments/fmapi-pacing.toml --seeds 20 --plot "$TMP/run" > /dev/null
cp "$TMP/run/latency-cdf.png" "$OUT/fmapi-latency-cdf.png"

# the article's advice, tested: workers x max_tokens, 10 seeds
"$QSIM" sweep experiments/fmapi-pacing.toml --vary workers=4,8,12,16,24,32,48,64 \
  --vary max_tokens=128,192,256 --seeds 10 --plot "$TMP/sweep" > /dev/null
cp "$TMP/sweep/sweep-elapsed-s.png" "$OUT/sweep-elapsed.png"
cp "$TMP/sweep/heatmap-latency-p95-s-exp2-backoff.png" "$OUT/sweep-backoff-p95-heatmap.png"

# the shared deployment plan: admitted per minute, floors, capacity, 5 seeds
"$QSIM" plan --seeds 5 --plot "$TMP/plan" > /dev/null
cp "$TMP/plan/plan-admitted.png" "$OUT/plan-admitted.png"

# the NIM server without a limiter: queue and E2E over time
"$QSIM" run experiments/nim-load.toml --plot "$TMP/server" > /dev/null
cp "$TMP/server/server-over-time.png" "$OUT/nim-server-over-time.png"

# qsim recommend's search: elapsed vs p95, the Pareto front
"$QSIM" recommend experiments/fmapi-pacing.toml --plot "$TMP/recommend" > /dev/null
cp "$TMP/recommend/recommend-pareto.png" "$OUT/recommend-pareto.png"

# a day against autoscaled vs fixed replicas: arrivals, replicas, TTFT p95 per minute
"$QSIM" run experiments/daily-autoscale.toml --set duration_s=86400 \
  --set load_shape.period_s=86400 --max-requests 100000000 --plot "$TMP/daily" > /dev/null
cp "$TMP/daily/replicas-over-time.png" "$OUT/daily-replicas-over-time.png"

# qsim options: each option's cost vs completion time and E2E p95
"$QSIM" options experiments/options-fmapi.toml --e2e-p95 5s --plot "$TMP/options" > /dev/null
cp "$TMP/options/options-cost.png" "$OUT/options-cost.png"
# qsim sim2real: predicted vs measured, and the error by model and GPU
"$QSIM" sim2real --brief --plot "$TMP/sim2real" > /dev/null
cp "$TMP/sim2real/sim2real-predicted-vs-measured.png" "$OUT/sim2real-predicted-vs-measured.png"
cp "$TMP/sim2real/sim2real-error-by-model-gpu.png" "$OUT/sim2real-error-by-model-gpu.png"

ls -l "$OUT"
