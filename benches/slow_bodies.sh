#!/usr/bin/env bash
# A slow-body attack on `qsim proxy` (issue 26, item 4; not a test, run by
# hand):
#   benches/slow_bodies.sh [CONNECTIONS [WAVES]]   (default 2000, 2 waves)
# Starts a proxy with the default read timeouts (header_read_timeout_s 10,
# body_read_timeout_s 30), then opens CONNECTIONS connections, each with a
# valid key, that send a request head with `content-length: 1000` and 10
# bytes of body, and then nothing. Reports how many the proxy closed (and
# with which status), when (seconds after the connection's head was sent),
# the proxy's RSS (VmRSS of /proc/PID/status) idle, while the connections
# are held, and after they are closed, and its read-timeout counter; a
# second wave shows whether the memory is reused (the allocator keeps what
# the first wave freed) or grows.
# Uses the binary in $CARGO_TARGET_DIR/release/qsim (or $QSIM); the
# upstream is never reached (no body ever completes).
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-2000}"
WAVES="${2:-2}"
QSIM="${QSIM:-${CARGO_TARGET_DIR:-$HOME/.cache/qsim-target}/release/qsim}"
[ -x "$QSIM" ] || { echo "no qsim binary at $QSIM (build it, or set QSIM)" >&2; exit 1; }
ulimit -n $((N + 1024)) 2>/dev/null || true
TMP="$(mktemp -d)"
PROXY_PID=""
cleanup() { [ -n "$PROXY_PID" ] && kill "$PROXY_PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$TMP"; }
trap cleanup EXIT

cat >"$TMP/p.toml" <<'EOF'
kind = "proxy"
[proxy]
listen = "127.0.0.1:0"
upstream = "http://127.0.0.1:9"
[proxy.keys]
A = ["key-a"]
[deployment]
capacity = 100000
threshold = 1.0
semantics = "rate-limit-only"
[[consumer]]
name = "A"
EOF
"$QSIM" proxy --config "$TMP/p.toml" >"$TMP/out" 2>"$TMP/log" &
PROXY_PID=$!
for _ in $(seq 200); do grep -q listening "$TMP/out" 2>/dev/null && break; sleep 0.05; done
URL="$(sed -n 's/^qsim proxy: listening on //p' "$TMP/out")"
[ -n "$URL" ] || { echo "proxy did not start:"; cat "$TMP/log"; exit 1; }
rss() { awk '/^VmRSS/ {printf "%.1f MB", $2/1024}' "/proc/$PROXY_PID/status"; }
echo "proxy $URL (pid $PROXY_PID), default timeouts; $N slow-body connections"
# warm: one request answered (502: no upstream), so the runtime's threads exist
curl -s -o /dev/null -H 'authorization: Bearer key-a' -d '{"max_tokens":1}' "$URL/v1/chat/completions" || true
echo "RSS idle:               $(rss)"

cat >"$TMP/attack.py" <<'EOF'
import socket, sys, time, selectors
url, n, pid = sys.argv[1], int(sys.argv[2]), sys.argv[3]
host, port = url[len("http://"):].split(":")
def rss():
    for l in open(f"/proc/{pid}/status"):
        if l.startswith("VmRSS"):
            return "%.1f MB" % (int(l.split()[1]) / 1024)
sel = selectors.DefaultSelector()
head = (f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}:{port}\r\n"
        "authorization: Bearer key-a\r\ncontent-type: application/json\r\n"
        "content-length: 1000\r\n\r\n{\"model\":").encode()
t0 = time.monotonic()
sent, opened = {}, 0
for i in range(n):
    s = socket.create_connection((host, int(port)))
    s.sendall(head)
    s.setblocking(False)
    sent[s] = time.monotonic()
    sel.register(s, selectors.EVENT_READ, b"")
    opened += 1
print(f"opened {opened} in {time.monotonic() - t0:.1f} s", flush=True)
closed, statuses, held_rss = [], {}, None
data = {s: b"" for s in sent}
while len(closed) < opened and time.monotonic() - t0 < 120:
    if held_rss is None and time.monotonic() - t0 > 5:
        held_rss = rss()
        print(f"RSS held (t={time.monotonic() - t0:.0f} s): {held_rss}", flush=True)
    for key, _ in sel.select(timeout=0.5):
        s = key.fileobj
        try:
            b = s.recv(4096)
        except ConnectionResetError:
            b = b""
        if b:
            data[s] += b
            continue
        closed.append(time.monotonic() - sent[s])
        st = data[s][9:12].decode() or "none"
        statuses[st] = statuses.get(st, 0) + 1
        sel.unregister(s)
        s.close()
closed.sort()
if closed:
    q = lambda p: closed[min(len(closed) - 1, int(p * len(closed)))]
    print(f"closed by the proxy: {len(closed)} of {opened}; status {statuses}; "
          f"seconds after the head: min {closed[0]:.1f}, p50 {q(0.5):.1f}, max {closed[-1]:.1f}")
else:
    print(f"closed by the proxy: 0 of {opened} within 120 s")
EOF
for w in $(seq "$WAVES"); do
  echo "wave $w:"
  python3 "$TMP/attack.py" "$URL" "$N" "$PROXY_PID"
  sleep 2
  echo "RSS after (2 s later):  $(rss)"
done
curl -s "$URL/metrics" | grep -E '^qsim_proxy_read_timeouts_total' || echo "qsim_proxy_read_timeouts_total: none"
