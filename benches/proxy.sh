#!/usr/bin/env bash
# Benchmark of `qsim proxy` on loopback (not a test; run by hand):
#   benches/proxy.sh [SECONDS]        (PIN=1: the proxies on CPU 1, the load
#                                      generator and the upstream on CPU 0)
# A fast local upstream (a tiny hyper server answering a fixed chat
# completion: crates/qsim-live/examples/loadgen.rs) and a tokio load
# generator (the same example): the 429 path and the forwarded path at full
# speed (closed loop), the added latency at 1,000 req/s (open loop, latency
# from the scheduled send time: direct vs through the proxy), the proxy's
# RSS, its CPU time per request; then the decision log's cost (the 429
# and forwarded paths with the log on vs off); then `on_limit = "wait"` with clients'
# deadlines shorter than the wait (how fast the refusals come back: the 429
# latency from the actual send); then the same through 3 replicas sharing
# one redis-server.
# Everything on 127.0.0.1; every process started here is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}"
SECS="${1:-5}"
scripts/qsim-bin.sh >/dev/null
cargo build --release --quiet -p qsim-live --example loadgen
QSIM="$CARGO_TARGET_DIR/release/qsim"
LG="$CARGO_TARGET_DIR/release/examples/loadgen"
command -v redis-server >/dev/null || { echo "redis-server missing: run scripts/live-deps.sh" >&2; exit 1; }
TMP="$(mktemp -d)"
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { for _ in $(seq 200); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0; sleep 0.05; done; echo "port $1 not open" >&2; exit 1; }
rss_mb() { awk '/VmRSS/ {printf "%.1f", $2/1024}' "/proc/$1/status"; }

# PIN=1 keeps the system under test off the load generator's core: on a
# 2-core VM a proxy sharing both cores with the generator and the upstream
# waits for the scheduler, and that wait is in its tail latency
if [ "${PIN:-0}" = 1 ]; then ON_SUT=(taskset -c 1); ON_GEN=(taskset -c 0); else ON_SUT=(); ON_GEN=(); fi
UP_PORT=$(port); "${ON_GEN[@]}" "$LG" upstream "$UP_PORT" >/dev/null & PIDS+=($!); wait_port "$UP_PORT"
UP="http://127.0.0.1:$UP_PORT"

# $1 name, $2 capacity (rpm), $3 extra [proxy] lines; prints the pid, address in $TMP/$1.addr
start_proxy() {
  local p; p=$(port)
  cat > "$TMP/$1.toml" <<TOML
kind = "proxy"
[proxy]
listen = "127.0.0.1:$p"
upstream = "$UP"
$3
[proxy.keys]
bench = ["bench"]
[deployment]
capacity = $2
burst = 0
threshold = 1.0
semantics = "rate-limit-only"
[[consumer]]
name = "bench"
TOML
  "${ON_SUT[@]}" "$QSIM" proxy --config "$TMP/$1.toml" ${THREADS:+--threads $THREADS} >/dev/null 2>"$TMP/$1.log" &
  PIDS+=($!); echo $! > "$TMP/$1.pid"; echo "127.0.0.1:$p" > "$TMP/$1.addr"; wait_port "$p"
}

# proxy CPU time (user + system) per request, from /proc: a figure that the
# other jobs on a shared machine disturb much less than req/s
TCK=$(getconf CLK_TCK)
ticks() { local t=0; for p in ${CPU_PIDS:-}; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
run() {
  local t0 out t1; t0=$(ticks); out=$("${ON_GEN[@]}" "$LG" load "${@:2}"); t1=$(ticks)
  local n; n=$(sed -E 's/.*"requests":([0-9]+).*/\1/' <<<"$out")
  echo "  $1: $out"
  [ -n "${CPU_PIDS:-}" ] && [ "$n" -gt 0 ] && awk -v d=$((t1 - t0)) -v n="$n" -v k="$TCK" \
    'BEGIN { printf "    proxy CPU: %.1f us/request (%d ticks over %d requests)\n", d * 1e6 / k / n, d, n }'
  return 0
}

echo "== one replica (proxy: 2 worker threads; load generator: 1 thread; upstream: 1 thread)"
THREADS=2 start_proxy deny 1 ""
THREADS=2 start_proxy fwd 1000000000 ""
THREADS=1 start_proxy fwd1 1000000000 ""
D=$(cat "$TMP/deny.addr"); F=$(cat "$TMP/fwd.addr"); F1=$(cat "$TMP/fwd1.addr")
CPU_PIDS=$(cat "$TMP/deny.pid") run "429 path, closed loop, 64 conns" --target "$D" --conns 64 --secs "$SECS"
CPU_PIDS=$(cat "$TMP/fwd.pid") run "forwarded path, closed loop, 64 conns" --target "$F" --conns 64 --secs "$SECS"
# added latency, paired: one generator sends 1,000 req/s to the upstream
# directly and 1,000 req/s through the proxy, interleaved (connection i to
# target i mod 2), so both see the same machine at the same moments; the
# added latency is the difference of the two lines' percentiles
paired() {
  local out; out=$("${ON_GEN[@]}" "$LG" load --target "$UP,$2" --conns 64 --rate 2000 --secs "$SECS" --per-target)
  echo "$out" | sed 's/^/    /'
  python3 - "$1" "$out" <<'PY'
import json, sys
d, p = [json.loads(l) for l in sys.argv[2].splitlines()]
print(f"  {sys.argv[1]}: added latency p50 {p['p50_ms'] - d['p50_ms']:+.3f} ms, p90 {p['p90_ms'] - d['p90_ms']:+.3f} ms, p99 {p['p99_ms'] - d['p99_ms']:+.3f} ms (1,000 req/s each way)")
PY
}
paired "through the proxy (2 worker threads)" "$F"
# one worker thread leaves the second core to the generator and the upstream
paired "through the proxy (1 worker thread)" "$F1"
# added latency, separate runs alternated: direct, then through the proxy,
# ALT times (default 5), 1,000 req/s each; per pair the added p50 and p99
# from the scheduled send time and from the actual send (the generator's
# timer wakes a scheduled send up to 1 ms late, in both paths alike), then
# the medians over the pairs; and the proxy's own time per request from its
# qsim_proxy_overhead_seconds histogram (bucket bounds)
alternated() {
  local rows=()
  for _ in $(seq "${ALT:-5}"); do
    local d p
    d=$("${ON_GEN[@]}" "$LG" load --target "$UP" --conns 32 --rate 1000 --secs "$SECS")
    p=$("${ON_GEN[@]}" "$LG" load --target "$2" --conns 32 --rate 1000 --secs "$SECS")
    rows+=("$d" "$p")
  done
  python3 - "$1" "${rows[@]}" <<'PY'
import json, statistics, sys
name, rows = sys.argv[1], [json.loads(r) for r in sys.argv[2:]]
keys = ["p50_ms", "p99_ms", "p50_sent_ms", "p99_sent_ms"]
added = {k: [] for k in keys}
for d, p in zip(rows[0::2], rows[1::2]):
    for k in keys:
        added[k].append(p[k] - d[k])
    print("    direct p50/p99 %.3f/%.3f ms (from the send %.3f/%.3f), proxied %.3f/%.3f (%.3f/%.3f)" % (
        d["p50_ms"], d["p99_ms"], d["p50_sent_ms"], d["p99_sent_ms"],
        p["p50_ms"], p["p99_ms"], p["p50_sent_ms"], p["p99_sent_ms"]))
med = {k: statistics.median(v) for k, v in added.items()}
print(f"  {name}: added latency over {len(added['p99_ms'])} alternated pairs, median [min, max]:")
for k in keys:
    print(f"    {k[:-3]}: {med[k]:+.3f} ms [{min(added[k]):+.3f}, {max(added[k]):+.3f}]")
PY
  curl -s "http://$2/metrics" > "$TMP/overhead.txt"
  python3 - "$TMP/overhead.txt" <<'PY'
import re, sys
b = [(float(m.group(1)), float(m.group(2))) for m in
     re.finditer(r'^qsim_proxy_overhead_seconds_bucket\{le="([0-9.e-]+)"\} (\S+)$', open(sys.argv[1]).read(), re.M)]
n = b[-1][1]
q = lambda p: next(le for le, c in b if c >= p * n)
print("  the proxy's own time per request (qsim_proxy_overhead_seconds, %d requests): p50 <= %.0f us, p99 <= %.0f us" % (n, q(0.5) * 1e6, q(0.99) * 1e6))
PY
}
# a fresh proxy each, so that its overhead histogram holds these runs only;
# with PIN=1 the proxy has one core, where one worker thread is its
# configuration (two threads on one core hand requests to each other)
for n in 1 2; do
  THREADS=$n start_proxy "alt$n" 1000000000 ""
  alternated "separate runs, $n worker thread(s)" "$(cat "$TMP/alt$n.addr")"
  kill "$(cat "$TMP/alt$n.pid")"
done
echo "  RSS after the runs: 429 proxy $(rss_mb "$(cat "$TMP/deny.pid")") MB, forwarding proxy $(rss_mb "$(cat "$TMP/fwd.pid")") MB"
kill "$(cat "$TMP/deny.pid")" "$(cat "$TMP/fwd.pid")" "$(cat "$TMP/fwd1.pid")"

echo "== the decision log's cost ([proxy.log]: one Parquet record per request, written off the request path)"
THREADS=2 start_proxy denylog 1 "[proxy.log]
dir = \"$TMP/log-deny\""
THREADS=2 start_proxy fwdlog 1000000000 "[proxy.log]
dir = \"$TMP/log-fwd\""
THREADS=2 start_proxy deny 1 ""
THREADS=2 start_proxy fwd 1000000000 ""
for kind in deny fwd; do
  for log in "" log; do
    name=$kind$log; A=$(cat "$TMP/$name.addr")
    label=$([ "$kind" = deny ] && echo "429 path" || echo "forwarded path")
    CPU_PIDS=$(cat "$TMP/$name.pid") run "$label, log $([ -n "$log" ] && echo on || echo off), closed loop, 64 conns" --target "$A" --conns 64 --secs "$SECS"
  done
done
for name in denylog fwdlog; do
  A=$(cat "$TMP/$name.addr")
  echo "  $name: $(curl -s "http://$A/metrics" | grep -E '^qsim_proxy_log_records_(written|dropped)_total' | tr '\n' ' ')"
  kill "$(cat "$TMP/$name.pid")"
done
kill "$(cat "$TMP/deny.pid")" "$(cat "$TMP/fwd.pid")"
sleep 1
echo "  log files: $(ls "$TMP/log-deny" "$TMP/log-fwd" | grep -c parquet) Parquet files, $(du -sk "$TMP/log-deny" "$TMP/log-fwd" | awk '{s+=$1} END {print s}') kB"
echo "== drift (--profile: the haiku profile's model fed every forwarded request, 4 replicas; proxy: 1 worker thread)"
THREADS=1 start_proxy fwdp 1000000000 'profile = "'"$PWD"'/models/databricks-claude-haiku-4-5.toml"'
FP=$(cat "$TMP/fwdp.addr")
CPU_PIDS=$(cat "$TMP/fwdp.pid") run "forwarded path with --profile, closed loop, 64 conns" --target "$FP" --conns 64 --secs "$SECS"
CPU_PIDS=$(cat "$TMP/fwdp.pid") run "through the proxy with --profile (1 worker thread), 1000 req/s" --target "$FP" --conns 32 --rate 1000 --secs "$SECS"
echo "  RSS after the runs: $(rss_mb "$(cat "$TMP/fwdp.pid")") MB"
kill "$(cat "$TMP/fwdp.pid")"

echo "== on_limit = \"wait\", consumer saturated (60/min), clients' deadline 2 s (x-stainless-timeout)"
echo "   (a request is held when its predicted admission is within its deadline, else 429 at once)"
THREADS=2 start_proxy wait 60 'on_limit = "wait"
max_wait_s = 30'
W=$(cat "$TMP/wait.addr")
CPU_PIDS=$(cat "$TMP/wait.pid") run "deadline-aware waiting, 1000 req/s, 64 conns" --target "$W" --conns 64 --rate 1000 --secs "$SECS" --header "x-stainless-timeout:2"
curl -s "http://$W/metrics" | grep -E '^qsim_proxy_waits_total' | sed 's/^/  /'
kill "$(cat "$TMP/wait.pid")"

RP=$(port)
redis-server --port "$RP" --bind 127.0.0.1 --save '' --appendonly no >/dev/null & PIDS+=($!); wait_port "$RP"
echo "== three replicas sharing one redis-server (each proxy: 1 worker thread)"
for i in 0 1 2; do THREADS=1 start_proxy "rd$i" 1 "state = \"redis://127.0.0.1:$RP\""; done
for i in 0 1 2; do THREADS=1 start_proxy "rf$i" 1000000000 "state = \"redis://127.0.0.1:$RP\""; done
RD="$(cat "$TMP/rd0.addr"),$(cat "$TMP/rd1.addr"),$(cat "$TMP/rd2.addr")"
RF="$(cat "$TMP/rf0.addr"),$(cat "$TMP/rf1.addr"),$(cat "$TMP/rf2.addr")"
RDP="$(cat "$TMP/rd0.pid") $(cat "$TMP/rd1.pid") $(cat "$TMP/rd2.pid")"
RFP="$(cat "$TMP/rf0.pid") $(cat "$TMP/rf1.pid") $(cat "$TMP/rf2.pid")"
CPU_PIDS=$RDP run "429 path, closed loop, 64 conns over 3 replicas" --target "$RD" --conns 64 --secs "$SECS"
CPU_PIDS=$RFP run "forwarded path, closed loop, 64 conns over 3 replicas" --target "$RF" --conns 64 --secs "$SECS"
CPU_PIDS=$RFP run "through 3 replicas, 1000 req/s" --target "$RF" --conns 32 --rate 1000 --secs "$SECS"
echo "  RSS: forwarding replicas $(for i in 0 1 2; do echo -n "$(rss_mb "$(cat "$TMP/rf$i.pid")") "; done)MB"
