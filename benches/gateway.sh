#!/usr/bin/env bash
# Benchmark of `qsim proxy`'s forwarded path with routes (issue 40; not a
# test, run by hand):
#   benches/gateway.sh [SECONDS] [BASELINE_QSIM]
#   CALLGRIND=N benches/gateway.sh 0 [BASELINE_QSIM]: instead, each proxy
#     under callgrind (one worker thread), N requests on 4 connections
#     after 200 of warm-up; the proxy's instructions per request (the
#     whole process, startup subtracted by a second run of N/2 requests)
# The proxy pinned to CPU 1 (one worker thread), the load generator and the
# fast upstreams (crates/qsim-live/examples/loadgen.rs) on CPU 0. Proxies:
#   base   BASELINE_QSIM (default: none) with one upstream (`[proxy] upstream`)
#   one    this build, one upstream (`[proxy] upstream`)
#   first  this build, two upstreams, route ["a", "b"] first (b never used)
#   weight this build, two upstreams, route weighted 1:1 (a draw per request)
# Throughput: closed loop, 64 connections, the proxies in turn, ALT rounds
# (default 5), each round's ratio to the first proxy's; the proxy's CPU time
# per request (from /proc). Added latency at 5,000 req/s: one generator
# sends 5,000 req/s to an upstream directly and 5,000 req/s through the
# proxy, interleaved, so both see the same machine at the same moments;
# the added p99 is the difference of the two lines' p99.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
SECS="${1:-5}"
BASE="${2:-}"
# QSIM / LOADGEN: prebuilt binaries (else built here)
if [ -z "${QSIM:-}" ]; then
  cargo build --release --quiet --bin qsim
  QSIM="$CARGO_TARGET_DIR/release/qsim"
fi
if [ -z "${LOADGEN:-}" ]; then
  cargo build --release --quiet -p qsim-live --example loadgen
  LOADGEN="$CARGO_TARGET_DIR/release/examples/loadgen"
fi
LG="$LOADGEN"
TMP="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; if [ -n "${KEEP:-}" ]; then echo "kept $TMP"; else rm -rf "$TMP"; fi; }
trap cleanup EXIT
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not open" >&2; exit 1; }
ON_SUT=(taskset -c 1); ON_GEN=(taskset -c 0)
A_PORT=$(port); "${ON_GEN[@]}" "$LG" upstream "$A_PORT" >/dev/null & PIDS+=($!); wait_port "$A_PORT"
B_PORT=$(port); "${ON_GEN[@]}" "$LG" upstream "$B_PORT" >/dev/null & PIDS+=($!); wait_port "$B_PORT"
A="http://127.0.0.1:$A_PORT"; B="http://127.0.0.1:$B_PORT"

LIMITER='[proxy.keys]
bench = ["bench"]
[deployment]
capacity = 1000000000
burst = 0
threshold = 1.0
semantics = "rate-limit-only"
[[consumer]]
name = "bench"'
TWO='[[upstream]]
name = "a"
url = "'"$A"'"
credential = "none"
[[upstream]]
name = "b"
url = "'"$B"'"
credential = "none"'

# $1 name, $2 binary, $3 [proxy] lines, $4 tables after the limiter
start_proxy() {
  local p; p=$(port)
  printf 'kind = "proxy"\n[proxy]\nlisten = "127.0.0.1:%s"\n%s\n%s\n%s\n' "$p" "$3" "$LIMITER" "$4" > "$TMP/$1.toml"
  "${ON_SUT[@]}" "$2" proxy --config "$TMP/$1.toml" --threads 1 >/dev/null 2>"$TMP/$1.log" &
  PIDS+=($!); echo $! > "$TMP/$1.pid"; echo "127.0.0.1:$p" > "$TMP/$1.addr"; wait_port "$p"
}
if [ -n "${CALLGRIND:-}" ]; then
  # N requests over one keep-alive connection (a separate process: only
  # the proxy is counted)
  send() {
    python3 - "$1" "$2" <<'PY'
import http.client, sys
host, port = sys.argv[1].split(":"); n = int(sys.argv[2])
body = b'{"model":"bench","messages":[{"role":"user","content":"Say ok"}],"max_tokens":8}'
c = http.client.HTTPConnection(host, int(port))
for _ in range(n):
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json", "authorization": "Bearer bench"})
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
PY
  }
  # $1 name, $2 binary, $3 [proxy] lines, $4 tables, $5 requests: total Ir
  cg() {
    local p; p=$(port)
    printf 'kind = "proxy"\n[proxy]\nlisten = "127.0.0.1:%s"\n%s\n%s\n%s\n' "$p" "$3" "$LIMITER" "$4" > "$TMP/$1.toml"
    valgrind --tool=callgrind --callgrind-out-file="$TMP/cg.$1.$5" "$2" proxy --config "$TMP/$1.toml" --threads 1 >/dev/null 2>"$TMP/cg.$1.$5.log" &
    local pid=$!
    for _ in $(seq 600); do (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null && break; sleep 0.1; done
    send "127.0.0.1:$p" 200; send "127.0.0.1:$p" "$5"
    kill -TERM "$pid"; wait "$pid" || true
    callgrind_annotate "$TMP/cg.$1.$5" 2>/dev/null | awk '/PROGRAM TOTALS/ && !d { gsub(",", "", $1); print $1; d = 1 }'
  }
  N="$CALLGRIND"
  ROUTE_FIRST="$TWO
[[route]]
model = \"*\"
upstreams = [\"a\", \"b\"]"
  ROUTE_WEIGHT="$ROUTE_FIRST
policy = \"weighted\"
weights = [1, 1]"
  echo "== callgrind: the proxy's instructions per forwarded request ((Ir at 200 + $N requests - Ir at 200 + $((N / 2))) / $((N - N / 2)))"
  runs=(one first weight)
  if [ -n "$BASE" ]; then runs=(base "${runs[@]}"); fi
  for n in "${runs[@]}"; do
    case $n in
      base) bin=$BASE; proxy="upstream = \"$A\""; tables= ;;
      one) bin=$QSIM; proxy="upstream = \"$A\""; tables= ;;
      first) bin=$QSIM; proxy=; tables=$ROUTE_FIRST ;;
      weight) bin=$QSIM; proxy=; tables=$ROUTE_WEIGHT ;;
    esac
    hi=$(cg "$n" "$bin" "$proxy" "$tables" "$N"); lo=$(cg "$n" "$bin" "$proxy" "$tables" $((N / 2)))
    echo "  $n: $(( (hi - lo) / (N - N / 2) )) instructions per request (Ir $lo at $((N / 2)), $hi at $N)"
  done
  exit 0
fi

NAMES=()
if [ -n "$BASE" ]; then start_proxy base "$BASE" "upstream = \"$A\"" ""; NAMES+=(base); fi
start_proxy one "$QSIM" "upstream = \"$A\"" ""
start_proxy first "$QSIM" "" "$TWO
[[route]]
model = \"*\"
upstreams = [\"a\", \"b\"]"
start_proxy weight "$QSIM" "" "$TWO
[[route]]
model = \"*\"
upstreams = [\"a\", \"b\"]
policy = \"weighted\"
weights = [1, 1]"
NAMES+=(one first weight)

TCK=$(getconf CLK_TCK)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
echo "== forwarded path, closed loop, 64 conns, ${SECS} s per run, proxies in turn (${ALT:-5} rounds); proxy pinned to CPU 1"
for r in $(seq "${ALT:-5}"); do
  line="  round $r:"
  for n in "${NAMES[@]}"; do
    pid=$(cat "$TMP/$n.pid"); t0=$(ticks "$pid")
    out=$("${ON_GEN[@]}" "$LG" load --target "$(cat "$TMP/$n.addr")" --conns 64 --secs "$SECS")
    t1=$(ticks "$pid")
    rps=$(sed -E 's/.*"rps":([0-9.]+).*/\1/' <<<"$out"); req=$(sed -E 's/.*"requests":([0-9]+).*/\1/' <<<"$out")
    us=$(awk -v d=$((t1 - t0)) -v n="$req" -v k="$TCK" 'BEGIN { printf "%.1f", d * 1e6 / k / n }')
    echo "$n $rps $us" >> "$TMP/rounds.txt"
    line="$line $n $rps req/s ($us us CPU/req);"
  done
  echo "$line"
done
python3 - "$TMP/rounds.txt" "${NAMES[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
names = sys.argv[2:]
by = {n: [(float(r[1]), float(r[2])) for r in rows if r[0] == n] for n in names}
ref = names[0]
for n in names:
    rps = [x[0] for x in by[n]]; us = [x[1] for x in by[n]]
    ratio = [a[0] / b[0] for a, b in zip(by[n], by[ref])]
    print(f"  {n}: median {statistics.median(rps):.0f} req/s [{min(rps):.0f}, {max(rps):.0f}], "
          f"CPU {statistics.median(us):.1f} us/req; ratio to {ref} per round: median {statistics.median(ratio):.3f} [{min(ratio):.3f}, {max(ratio):.3f}]")
PY

echo "== added latency at 5,000 req/s (paired: 5,000 req/s direct and 5,000 req/s through the proxy, interleaved)"
for n in "${NAMES[@]}"; do
  for r in $(seq "${ALT:-5}"); do
    out=$("${ON_GEN[@]}" "$LG" load --target "$A,http://$(cat "$TMP/$n.addr")" --conns 64 --rate 10000 --secs "$SECS" --per-target)
    python3 - "$n" "$out" <<'PY' >> "$TMP/added.txt"
import json, sys
d, p = [json.loads(l) for l in sys.argv[2].splitlines()]
print(sys.argv[1], p["p50_ms"] - d["p50_ms"], p["p99_ms"] - d["p99_ms"], d["p99_ms"], p["p99_ms"], p.get("rps", 0))
PY
  done
done
python3 - "$TMP/added.txt" "${NAMES[@]}" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for n in sys.argv[2:]:
    r = [list(map(float, x[1:])) for x in rows if x[0] == n]
    p50 = [x[0] for x in r]; p99 = [x[1] for x in r]
    print(f"  {n}: added p50 median {statistics.median(p50):+.3f} ms, added p99 median {statistics.median(p99):+.3f} ms "
          f"[{min(p99):+.3f}, {max(p99):+.3f}] over {len(r)} runs (direct p99 {statistics.median([x[2] for x in r]):.3f} ms, proxied {statistics.median([x[3] for x in r]):.3f} ms)")
PY
