//! `qsim proxy` operations against real third-party parts on 127.0.0.1:
//! `on_limit = "wait"` with deadline-aware refusal (the official `openai`
//! SDK sends its own timeout as `x-stainless-read-timeout`), policy reload
//! on SIGHUP with requests in flight, graceful shutdown on SIGTERM with a
//! stream in flight, and a TLS upstream (llmock behind a TLS front made with
//! Python's `ssl` and a CA and certificate made by `openssl` at test time).
//! Every process is started here and killed at the end; every wait is
//! bounded. No assertion is a speed check: timings are compared with the
//! limiter's own waits (seconds), never with a latency budget.

use crate::common::{
    http, llmock, metric, metrics, proxy, proxy_config, python_env, settled, venv_bin, warm, Proc,
};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const SDK_WAIT: &str = r#"
import json, os, threading, time, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0)
msgs = [{"role": "user", "content": "hi"}]
def call(timeout):
    t0 = time.monotonic()
    try:
        r = c.with_options(timeout=timeout).chat.completions.with_raw_response.create(
            model="gpt-4o-mini", messages=msgs, max_tokens=8)
        r.parse()
        return {"status": 200, "start": t0, "end": time.monotonic()}
    except openai.RateLimitError as e:
        h = e.response.headers
        return {"status": 429, "start": t0, "end": time.monotonic(),
                "retry_after_ms": int(h["retry-after-ms"]), "code": e.response.json()["error"]["code"]}
    except openai.APITimeoutError:
        return {"status": "timeout", "start": t0, "end": time.monotonic()}
out = {}
# the consumer's one token per second: taken now
out["first"] = call(10.0)
# three waiters (a 6 s timeout each), joining 50 ms apart: held in order
waiters = [None] * 3
def waiter(i):
    waiters[i] = call(6.0)
ts = []
for i in range(3):
    t = threading.Thread(target=waiter, args=(i,)); t.start(); ts.append(t)
    time.sleep(0.05)
time.sleep(0.2)
# a short deadline (1.5 s) behind them: its wait (~3.5 s) is beyond it
out["short"] = call(1.5)
s = out["short"]
slot = s["end"] + s["retry_after_ms"] / 1000.0
# 0.4 s before the predicted slot, with a 0.2 s deadline: refused at once again
time.sleep(max(0.0, slot - 0.4 - time.monotonic()))
out["early"] = call(0.2)
for t in ts: t.join()
out["waiters"] = waiters
# at the predicted slot: admitted
time.sleep(max(0.0, slot + 0.02 - time.monotonic()))
out["on_time"] = call(1.0)
print(json.dumps(out))
"#;

#[test]
fn waiting_consumer_is_held_in_order_and_refused_at_once_past_its_deadline() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&[]);
    warm(&up);
    let cfg = format!(
        "on_limit = \"wait\"\nmax_wait_s = 20\ndeadline_margin_s = 0.05\n{}",
        crate::common::TIGHT
    );
    let (_p, url) = proxy(&dir, "wait", &up, &cfg);
    let r = python_env(SDK_WAIT, &url, &[], Duration::from_secs(60));
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
    assert_eq!(r["first"]["status"], 200, "{r}");
    let t_first = f(&r["first"], "end");
    // the waiters: admitted at the limiter's times (k s after the first),
    // in the order they came, each before its own timeout
    let w = r["waiters"].as_array().unwrap();
    for (k, x) in w.iter().enumerate() {
        assert_eq!(x["status"], 200, "waiter {k}: {r}");
        let admitted_after = f(x, "end") - t_first;
        assert!(
            admitted_after > k as f64 + 0.5,
            "waiter {k} was not held until its slot: {r}"
        );
        assert!(f(x, "end") - f(x, "start") < 6.0, "{r}");
        if k > 0 {
            assert!(f(x, "end") > f(&w[k - 1], "end"), "FIFO: {r}");
        }
    }
    // the short deadline: 429 at once, with the slot behind the waiters
    let s = &r["short"];
    assert_eq!(s["status"], 429, "{r}");
    assert_eq!(s["code"], "rate_limit_exceeded", "{r}");
    let hint = s["retry_after_ms"].as_f64().unwrap() / 1e3;
    assert!(hint > 2.5, "the predicted wait is behind 3 waiters: {r}");
    let took = f(s, "end") - f(s, "start");
    assert!(
        took < hint / 3.0,
        "the 429 must come back long before the wait would have ended: {r}"
    );
    // the hint is the limiter's slot: 0.4 s before it, the wait is still
    // too long (refused at once, pointing at the same slot) ...
    let slot = f(s, "end") + hint;
    let e = &r["early"];
    assert_eq!(e["status"], 429, "{r}");
    let slot2 = f(e, "end") + e["retry_after_ms"].as_f64().unwrap() / 1e3;
    assert!((slot2 - slot).abs() < 0.05, "{slot} vs {slot2}: {r}");
    // ... and at it, admitted
    assert_eq!(r["on_time"]["status"], 200, "{r}");

    let m = settled(&url);
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_waits_total{consumer=\"A\",outcome=\"admitted\"}"
        ),
        3.0,
        "{m:?}"
    );
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_waits_total{consumer=\"A\",outcome=\"refused_deadline\"}"
        ),
        2.0,
        "{m:?}"
    );
    assert_eq!(metric(&m, "qsim_proxy_waiting"), 0.0);
    assert_eq!(metric(&m, "qsim_proxy_admitted_total{consumer=\"A\"}"), 5.0);
    assert_eq!(metric(&m, "qsim_proxy_wait_seconds_count"), 3.0, "{m:?}");
}

#[test]
fn max_wait_and_a_configured_deadline_header_bound_the_wait() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&[]);
    warm(&up);
    // one admission per second shared by A (waits up to 0.5 s) and B (rejects)
    let cfg = "deadline_header = \"x-deadline-s\"\ndeadline_margin_s = 0\n\
         [proxy.keys]\nA = [\"key-a\"]\nB = [\"key-b\"]\n\
         [proxy.consumers.A]\non_limit = \"wait\"\nmax_wait_s = 0.5\n\
         [deployment]\ncapacity = 60\nthreshold = 1.0\nburst = 0\nsemantics = \"rate-limit-only\"\n\
         [[consumer]]\nname = \"A\"\n[[consumer]]\nname = \"B\"\n";
    let (_p, url) = proxy(&dir, "maxwait", &up, cfg);
    let body =
        br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let call = |key: &str, extra: &[(&str, &str)]| {
        let auth = format!("Bearer {key}");
        let mut h = vec![("authorization", auth.as_str())];
        h.extend_from_slice(extra);
        let t = Instant::now();
        let (st, head, _) = http(&url, "POST", "/v1/chat/completions", &h, body);
        (st, head, t.elapsed())
    };
    // A takes the token (llmock's first answer may take longer than the
    // refill: until A is limited)
    let mut admitted = 0;
    let (st, head, took) = loop {
        let r = call("key-a", &[]);
        if r.0 != 200 {
            break r;
        }
        admitted += 1;
        assert!(admitted < 5, "never limited");
    };
    // the next slot is < 1 s away but beyond max_wait 0.5 s → 429 at once
    assert_eq!(st, 429, "{head}");
    let ms: f64 = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after-ms: "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        ms > 500.0 && took.as_secs_f64() < ms / 1e3 / 2.0,
        "{ms} {took:?}"
    );
    // B does not wait
    assert_eq!(call("key-b", &[]).0, 429);
    let m = metrics(&url);
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_waits_total{consumer=\"A\",outcome=\"refused_max_wait\"}"
        ),
        1.0,
        "{m:?}"
    );
    // (a request of the loop above may have been held already)
    let held_before = metric(
        &m,
        "qsim_proxy_waits_total{consumer=\"A\",outcome=\"admitted\"}",
    );
    // 0.3 s before the slot: held (within 0.5 s) and admitted, unless the
    // configured header says 0.1 s
    std::thread::sleep(Duration::from_secs_f64((ms / 1e3 - 0.3).max(0.0)));
    let (st, _, _) = call("key-a", &[("x-deadline-s", "0.1")]);
    assert_eq!(st, 429);
    let (st, _, took) = call("key-a", &[("x-deadline-s", "5")]);
    assert_eq!(st, 200);
    assert!(took.as_secs_f64() < 0.5, "held within max_wait: {took:?}");
    let m = settled(&url);
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_waits_total{consumer=\"A\",outcome=\"refused_deadline\"}"
        ),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_waits_total{consumer=\"A\",outcome=\"admitted\"}"
        ),
        held_before + 1.0,
        "{m:?}"
    );
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_rejected_total{consumer=\"B\",limit=\"capacity\"}"
        ),
        1.0,
        "{m:?}"
    );
}

const SDK_STREAMS_ACROSS_RELOAD: &str = r#"
import json, os, signal, threading, time, urllib.request, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0, timeout=30)
msgs = [{"role": "user", "content": "Tell me a story"}]
ref = c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64).choices[0].message.content
started = threading.Barrier(4)
results = [None] * 3
def stream(i):
    text, first = [], True
    try:
        for ch in c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64, stream=True):
            if first:
                first = False
                started.wait()
            if ch.choices and ch.choices[0].delta.content:
                text.append(ch.choices[0].delta.content)
        results[i] = "".join(text)
    except Exception as e:
        results[i] = "error: " + type(e).__name__
ts = [threading.Thread(target=stream, args=(i,)) for i in range(3)]
for t in ts: t.start()
started.wait()
os.kill(int(os.environ["PROXY_PID"]), signal.SIGHUP)
def reloads():
    m = urllib.request.urlopen(os.environ["PROXY"] + "/metrics").read().decode()
    return [l for l in m.splitlines() if l.startswith("qsim_proxy_reloads_total")]
deadline = time.monotonic() + 10
while not any('result="ok"' in l for l in reloads()) and time.monotonic() < deadline:
    time.sleep(0.02)
in_flight_at_reload = sum(1 for r in results if r is None)
after = []
for _ in range(4):
    try:
        c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=8)
        after.append(200)
    except openai.RateLimitError:
        after.append(429)
for t in ts: t.join()
print(json.dumps({"ref": ref, "streams": results, "after": after,
                  "in_flight_at_reload": in_flight_at_reload, "reloads": reloads()}))
"#;

fn signal(p: &Proc, sig: &str) {
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &p.0.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn sighup_reloads_the_policy_without_dropping_requests() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&["--stream-chunk-delay-ms", "60"]);
    let open = "[proxy.keys]\nA = [\"key-a\"]\n[deployment]\ncapacity = 100000\n[[consumer]]\nname = \"A\"\n";
    let (p, url) = proxy(&dir, "reload", &up, open);
    // the file now says 60/min without burst; read on SIGHUP
    let path = dir.path().join("reload.toml");
    std::fs::write(&path, proxy_config(&up, crate::common::TIGHT)).unwrap();
    let pid = p.0.id().to_string();
    let r = python_env(
        SDK_STREAMS_ACROSS_RELOAD,
        &url,
        &[("PROXY_PID", &pid)],
        Duration::from_secs(90),
    );
    let reference = r["ref"].as_str().unwrap();
    assert!(!reference.is_empty());
    assert!(r["in_flight_at_reload"].as_u64().unwrap() >= 1, "{r}");
    for s in r["streams"].as_array().unwrap() {
        assert_eq!(
            s.as_str().unwrap(),
            reference,
            "a stream across the reload: {r}"
        );
    }
    // the new limit: one admission, then 429s
    assert_eq!(r["after"], serde_json::json!([200, 429, 429, 429]), "{r}");
    let m = settled(&url);
    assert_eq!(metric(&m, "qsim_proxy_reloads_total{result=\"ok\"}"), 1.0);
    assert_eq!(metric(&m, "qsim_proxy_policy_generation"), 2.0);

    // an invalid file: logged, the policy in force stays
    std::fs::write(
        &path,
        proxy_config(&up, "[proxy.keys]\nA = [\"key-a\"]\n[deployment]\ncapacity = 0\n[[consumer]]\nname = \"A\"\n"),
    )
    .unwrap();
    signal(&p, "HUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric(&metrics(&url), "qsim_proxy_reloads_total{result=\"error\"}") < 1.0 {
        assert!(Instant::now() < deadline, "no reload error counted");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = std::fs::read_to_string(dir.path().join("reload.log")).unwrap();
    assert!(
        log.contains("policy reload failed") && log.contains("deployment.capacity"),
        "{log}"
    );
    std::thread::sleep(Duration::from_millis(1100));
    let body =
        br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let h = [("authorization", "Bearer key-a")];
    assert_eq!(http(&url, "POST", "/v1/chat/completions", &h, body).0, 200);
    assert_eq!(http(&url, "POST", "/v1/chat/completions", &h, body).0, 429);
    assert_eq!(metric(&metrics(&url), "qsim_proxy_policy_generation"), 2.0);
}

const SDK_STREAM_AT_SIGTERM: &str = r#"
import json, os, signal, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0, timeout=30)
msgs = [{"role": "user", "content": "Tell me a story"}]
ref = c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64).choices[0].message.content
text, chunks, usage = [], 0, None
for ch in c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64, stream=True):
    chunks += 1
    if chunks == 1:
        os.kill(int(os.environ["PROXY_PID"]), signal.SIGTERM)
    if ch.choices and ch.choices[0].delta.content:
        text.append(ch.choices[0].delta.content)
    if ch.usage is not None:
        usage = ch.usage.completion_tokens
# a new connection after SIGTERM is refused
fresh = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0, timeout=5)
try:
    fresh.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=8)
    after = "answered"
except openai.APIConnectionError:
    after = "refused"
print(json.dumps({"ref": ref, "text": "".join(text), "chunks": chunks, "usage": usage, "after": after}))
"#;

#[test]
fn sigterm_finishes_the_stream_in_flight_and_exits_0() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&["--stream-chunk-delay-ms", "100"]);
    let cfg = "drain_timeout_s = 20\n[proxy.keys]\nA = [\"key-a\"]\n[deployment]\ncapacity = 100000\n[[consumer]]\nname = \"A\"\n";
    let (mut p, url) = proxy(&dir, "term", &up, cfg);
    let pid = p.0.id().to_string();
    let r = python_env(
        SDK_STREAM_AT_SIGTERM,
        &url,
        &[("PROXY_PID", &pid)],
        Duration::from_secs(60),
    );
    assert!(r["chunks"].as_u64().unwrap() >= 3, "{r}");
    assert_eq!(r["text"], r["ref"], "the stream arrives complete: {r}");
    assert!(r["usage"].as_u64().unwrap() > 0, "{r}");
    assert_eq!(r["after"], "refused", "{r}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(st) = p.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the proxy did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(0));
    let log = std::fs::read_to_string(dir.path().join("term.log")).unwrap();
    assert!(log.contains("drained"), "{log}");
}

const SDK_STREAM_CUT_AT_SIGTERM: &str = r#"
import json, os, signal, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0, timeout=60)
msgs = [{"role": "user", "content": "Tell me a long story"}]
chunks, cut = 0, False
try:
    for ch in c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64, stream=True):
        chunks += 1
        if chunks == 1:
            os.kill(int(os.environ["PROXY_PID"]), signal.SIGTERM)
except Exception:
    cut = True
print(json.dumps({"chunks": chunks, "cut": cut}))
"#;

/// Issue 41, case 10: a stream the proxy's drain timeout cut was logged as
/// `client_disconnect`; it is the proxy's own cut: `drain_timeout`.
#[test]
fn a_stream_cut_by_the_drain_timeout_is_logged_as_such() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    // 64 chunks 0.5 s apart: the stream outlasts a 1 s drain
    let (_up, up) = llmock(&["--stream-chunk-delay-ms", "500"]);
    let cfg = "drain_timeout_s = 1\n[proxy.keys]\nA = [\"key-a\"]\n[deployment]\ncapacity = 100000\n[[consumer]]\nname = \"A\"\n";
    let (mut p, url) = proxy(&dir, "cut", &up, cfg);
    let pid = p.0.id().to_string();
    let r = python_env(
        SDK_STREAM_CUT_AT_SIGTERM,
        &url,
        &[("PROXY_PID", &pid)],
        Duration::from_secs(60),
    );
    assert_eq!(r["cut"], true, "{r}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while p.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the proxy did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = std::fs::read_to_string(dir.path().join("cut.log")).unwrap();
    assert!(log.contains("drain timeout"), "{log}");
    assert!(
        log.contains("reason=\"drain_timeout\"") || log.contains("reason=drain_timeout"),
        "{log}"
    );
    assert!(!log.contains("client_disconnect"), "{log}");
}

/// A CA and a server certificate for 127.0.0.1, made by `openssl`.
fn make_certs(dir: &std::path::Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("openssl (scripts/live-deps.sh installs it)");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=qsim test CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
    ]);
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-keyout",
        "srv.key",
        "-out",
        "srv.csr",
        "-subj",
        "/CN=127.0.0.1",
    ]);
    std::fs::write(
        dir.join("ext.cnf"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    run(&[
        "x509",
        "-req",
        "-in",
        "srv.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "srv.pem",
        "-days",
        "2",
        "-extfile",
        "ext.cnf",
    ]);
}

/// A TLS front (Python's `ssl`) relaying bytes to a plain upstream.
const TLS_FRONT: &str = r#"
import asyncio, ssl, sys
cert, key, up = sys.argv[1], sys.argv[2], int(sys.argv[3])
ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
ctx.load_cert_chain(cert, key)
async def pipe(r, w):
    try:
        while True:
            d = await r.read(65536)
            if not d:
                break
            w.write(d)
            await w.drain()
    except Exception:
        pass
    finally:
        try:
            w.close()
        except Exception:
            pass
async def handle(cr, cw):
    ur, uw = await asyncio.open_connection("127.0.0.1", up)
    await asyncio.gather(pipe(cr, uw), pipe(ur, cw))
async def main():
    s = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    print(s.sockets[0].getsockname()[1], flush=True)
    async with s:
        await s.serve_forever()
asyncio.run(main())
"#;

const SDK_TLS: &str = r#"
import json, os, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0, timeout=30)
msgs = [{"role": "user", "content": "Say hello"}]
r = c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=32)
text, usage = [], None
for ch in c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=32, stream=True):
    if ch.choices and ch.choices[0].delta.content:
        text.append(ch.choices[0].delta.content)
    if ch.usage is not None:
        usage = ch.usage.completion_tokens
print(json.dumps({"content": r.choices[0].message.content, "usage": r.usage.completion_tokens,
                  "stream_text": "".join(text), "stream_usage": usage}))
"#;

#[test]
fn tls_upstream_with_a_private_ca() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    make_certs(dir.path());
    let (_up, up) = llmock(&[]);
    let up_port = up.rsplit(':').next().unwrap();
    let script = dir.path().join("tls_front.py");
    std::fs::write(&script, TLS_FRONT).unwrap();
    let mut child = Command::new(venv_bin("python"))
        .arg(&script)
        .arg(dir.path().join("srv.pem"))
        .arg(dir.path().join("srv.key"))
        .arg(up_port)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("TLS front");
    let out = child.stdout.take().unwrap();
    let _front = Proc(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    let tls_up = format!("https://127.0.0.1:{}", line.trim());

    let keys = "[proxy.keys]\nA = [\"key-a\"]\n[deployment]\ncapacity = 100000\n[[consumer]]\nname = \"A\"\n";
    let ca = dir.path().join("ca.pem");
    let cfg = format!("upstream_ca_file = \"{}\"\n{keys}", ca.display());
    let (_p, url) = proxy(&dir, "tls", &tls_up, &cfg);
    let r = python_env(SDK_TLS, &url, &[], Duration::from_secs(60));
    let content = r["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{r}");
    assert_eq!(r["stream_text"].as_str().unwrap(), content, "{r}");
    assert_eq!(r["stream_usage"], r["usage"], "{r}");
    let m = settled(&url);
    assert_eq!(
        metric(&m, "qsim_proxy_upstream_status_total{status=\"200\"}"),
        2.0
    );

    // without the private CA the certificate is not trusted: 502, no answer
    let (_p2, url2) = proxy(&dir, "untrusted", &tls_up, keys);
    let body =
        br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let (st, _, text) = http(
        &url2,
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer key-a")],
        body,
    );
    assert_eq!(st, 502, "{text}");
    assert!(
        text.contains("upstream_unreachable") && text.to_lowercase().contains("certificate"),
        "{text}"
    );
    let m = settled(&url2);
    assert_eq!(metric(&m, "qsim_proxy_admitted_total{consumer=\"A\"}"), 1.0);

    // a CA file that is not PEM: exit 2 naming the field, before binding
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        proxy_config(
            &tls_up,
            &format!(
                "upstream_ca_file = \"{}\"\n{keys}",
                dir.path().join("ext.cnf").display()
            ),
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["proxy", "--config"])
        .arg(&bad)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("proxy.upstream_ca_file"), "{err}");
}
