#!/usr/bin/env bash
# Benchmark of sweeps at scale (not a test; run by hand):
#   benches/runs.sh [THREADS]        (default 2)
# 1. 100,000 runs of the article's 200-row experiment (exp2-backoff: 64
#    workers, own backoff, SDK retries) through `qsim sweep --seeds 100000`;
# 2. 100,000 runs of the whole fmapi-pacing file (its three 200-row
#    experiments one after another with the 70 s cool-down);
# 3. the issue's 3,000-run grid (workers x max_tokens x 5 policies x 20 seeds);
# 4. `qsim recommend experiments/fmapi-pacing.toml`.
# For each: wall time, CPU time (user + sys) and peak RSS, from /usr/bin/time.
# Wall time depends on what else runs on the machine: CPU / THREADS is the
# wall time on THREADS idle cores (the runs are independent; chunks of 64
# seeds per job keep the threads busy to the end).
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
T="${1:-2}"
QSIM="$(scripts/qsim-bin.sh)"
[ -x /usr/bin/time ] || { echo "/usr/bin/time missing (apt-get install time)" >&2; exit 1; }
BIG=(--max-requests 1000000000 --max-memory-mb 100000)

bench() {
    local what="$1"; shift
    local log; log="$(mktemp)"
    /usr/bin/time -f "%e %U %S %M" -o "$log" "$QSIM" "$@" >/dev/null
    read -r wall user sys rss <"$log"
    rm -f "$log"
    awk -v w="$wall" -v u="$user" -v s="$sys" -v r="$rss" -v t="$T" -v what="$what" \
        'BEGIN { printf "%-58s wall %6.1f s  CPU %6.1f s  (CPU/%d %5.1f s)  peak RSS %6.1f MB\n", what, w, u + s, t, (u + s) / t, r / 1024 }'
}

echo "threads $T, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg)"
bench "100,000 runs of exp2-backoff (200 rows)" \
    sweep experiments/fmapi-pacing.toml --only exp2-backoff --vary workers=64 \
    --seeds 100000 --threads "$T" "${BIG[@]}"
bench "100,000 runs of fmapi-pacing.toml (3 x 200 rows)" \
    sweep experiments/fmapi-pacing.toml --vary workers=64 \
    --seeds 100000 --threads "$T" "${BIG[@]}"
bench "3,000-run grid (10 workers x 3 max_tokens x 5 policies x 20)" \
    sweep experiments/fmapi-pacing.toml --vary workers=4,8,12,16,24,32,48,64,96,128 \
    --vary max_tokens=128,192,256 --vary policy=article,full-jitter,decorrelated,sre-throttle,aimd \
    --seeds 20 --threads "$T" "${BIG[@]}"
bench "qsim recommend experiments/fmapi-pacing.toml" \
    recommend experiments/fmapi-pacing.toml --threads "$T"
