#!/usr/bin/env bash
# Benchmark of request traces (not a test; run by hand):
#   benches/trace.sh [ROWS]           (default 10,000,000)
# Generates a ROWS-row trace in the Azure format (datetime strings, the
# slowest of the formats to parse; ~100 requests/s for ROWS/100 s, crossing
# midnight; inputs 50..2000 tokens, outputs 1..64) in a temporary directory
# (removed at the end; ~410 MB for 10 M rows), then measures with
# /usr/bin/time:
# 1. `qsim trace stats FILE`: one streaming pass (rows/s of wall and CPU time);
# 2. `qsim run` of a server experiment replaying it on 8 replicas of the
#    Llama-3.1-8B H100 profile: the load's scan of the file (every row
#    checked before the run) plus the replay through the server model
#    (requests per CPU-second over both passes).
# Peak RSS of each. The trace is generated here and never committed.
# Figures (old and new): docs/guide/traces.md, "Performance".
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
ROWS="${1:-10000000}"
QSIM="$(scripts/qsim-bin.sh)"
[ -x /usr/bin/time ] || { echo "/usr/bin/time missing (apt-get install time)" >&2; exit 1; }
DIR="$(mktemp -d)"
trap 'rm -rf "$DIR"' EXIT
python3 - "$ROWS" "$DIR/trace.csv" <<'PY'
import random, sys, datetime
n, path = int(sys.argv[1]), sys.argv[2]
rng = random.Random(7)
t0 = datetime.datetime(2023, 11, 16, 18, 0, 0)
t = 0.0
with open(path, "w") as f:
    f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    buf = []
    for k in range(n):
        t += rng.expovariate(100.0)
        us = int(t * 1e6)
        d = t0 + datetime.timedelta(microseconds=us)
        buf.append(f"{d:%Y-%m-%d %H:%M:%S}.{d.microsecond:06d}0,{rng.randint(50, 2000)},{rng.randint(1, 64)}\n")
        if len(buf) == 100000:
            f.write("".join(buf)); buf = []
    f.write("".join(buf))
PY
ls -l "$DIR/trace.csv" | awk '{ printf "trace: %s rows, %.0f MB\n", '"$ROWS"', $5 / 1e6 }'
cat >"$DIR/exp.toml" <<TOML
kind = "server"
server = "$PWD/models/llama-3.1-8b-h100-vllm.toml"
replicas = 8
drain = true
duration_s = 1
input_tokens = { dist = "const", value = 1 }
output_tokens = { dist = "const", value = 1 }
[[scenario]]
name = "replay"
trace = { file = "trace.csv" }
TOML

bench() {
    local what="$1"; shift
    local log; log="$(mktemp)"
    /usr/bin/time -f "%e %U %S %M" -o "$log" "$QSIM" "$@" >"$DIR/out.txt"
    read -r wall user sys rss <"$log"
    rm -f "$log"
    awk -v w="$wall" -v u="$user" -v s="$sys" -v r="$rss" -v n="$ROWS" -v what="$what" \
        'BEGIN { printf "%-34s wall %6.1f s  CPU %6.1f s  %5.2f M rows/s wall, %5.2f M per CPU-s  peak RSS %5.1f MB\n", what, w, u + s, n / w / 1e6, n / (u + s) / 1e6, r / 1024 }'
}
bench "qsim trace stats" trace stats "$DIR/trace.csv"
head -3 "$DIR/out.txt"
bench "qsim run (scan + server replay)" run "$DIR/exp.toml" --max-requests 1000000000 --max-memory-mb 100000
grep -i -m3 "replay\|submitted\|completed" "$DIR/out.txt" || true
