//! `qsim proxy` against real third-party parts on 127.0.0.1 only: the
//! upstream is `llmock` (PyPI), the client the official `openai` Python SDK,
//! both from the venv that `scripts/live-deps.sh` installs (scripts/test.sh
//! runs it first). A missing venv fails the tests loudly; nothing is skipped.
//! Every process is started here, on free ports, and killed at the end; every
//! wait is bounded.

use crate::common::{http, llmock, metric, proxy, python, settled};
use serde_json::Value;
use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

const LIMITER_OPEN: &str = r#"
[proxy.keys]
A = ["key-a"]
B = ["key-b"]

[deployment]
capacity = 100000
threshold = 0.8

[[consumer]]
name = "A"
reserved_pct = 50

[[consumer]]
name = "B"
reserved_pct = 0
"#;

const SDK_BASIC: &str = r#"
import json, os, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0)
msgs = [{"role": "user", "content": "Say hello"}]
r = c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64)
text, chunks, usage = [], 0, None
for ch in c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64, stream=True):
    chunks += 1
    if ch.choices and ch.choices[0].delta.content:
        text.append(ch.choices[0].delta.content)
    if ch.usage is not None:
        usage = ch.usage.completion_tokens
print(json.dumps({
    "content": r.choices[0].message.content,
    "usage": r.usage.completion_tokens,
    "stream_text": "".join(text),
    "stream_chunks": chunks,
    "stream_usage": usage,
}))
"#;

#[test]
fn openai_sdk_through_the_proxy_non_streaming_and_streaming_with_usage() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&[]);
    let (_p, url) = proxy(&dir, "open", &up, LIMITER_OPEN);
    let r = python(SDK_BASIC, &url, Duration::from_secs(60));
    let content = r["content"].as_str().unwrap();
    assert!(!content.is_empty(), "{r}");
    // static responses: the streamed text is the same answer, intact
    assert_eq!(r["stream_text"].as_str().unwrap(), content, "{r}");
    assert!(r["stream_chunks"].as_u64().unwrap() >= 2, "{r}");
    let usage = r["usage"].as_u64().unwrap();
    assert!(usage > 0);
    // the client did not ask for usage on the stream; the proxy did
    assert_eq!(r["stream_usage"].as_u64(), Some(usage), "{r}");
    let m = settled(&url);
    assert_eq!(metric(&m, "qsim_proxy_admitted_total{consumer=\"A\"}"), 2.0);
    let settled_tokens = metric(&m, "qsim_proxy_settled_output_tokens_total{consumer=\"A\"}");
    assert_eq!(settled_tokens, (usage * 2) as f64, "{m:?}");
    assert_eq!(
        metric(&m, "qsim_proxy_upstream_status_total{status=\"200\"}"),
        2.0
    );
    // (llmock 0.2.2 serves no legacy /v1/completions: that route is forwarded
    // the same way but not exercised here)
}

const SDK_OPENAI_LIMIT: &str = r#"
import json, os, time, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a")
msgs = [{"role": "user", "content": "hi"}]
c.with_options(max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=8)
# over the limit, no retries: the SDK's error carries the proxy's answer
try:
    c.with_options(max_retries=0).chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=8)
    first = None
except openai.RateLimitError as e:
    h = e.response.headers
    first = {"status": e.status_code, "body": e.response.json(),
             "retry_after": h.get("retry-after"), "retry_after_ms": h.get("retry-after-ms"),
             "limit": h.get("x-ratelimit-limit-requests"), "reset": h.get("x-ratelimit-reset-requests")}
# with the SDK's own retries: it sleeps the hinted time and gets through
t0 = time.monotonic()
raw = c.with_options(max_retries=2).chat.completions.with_raw_response.create(model="gpt-4o-mini", messages=msgs, max_tokens=8)
elapsed = time.monotonic() - t0
print(json.dumps({"first": first, "retries_taken": raw.retries_taken, "elapsed": elapsed,
                  "ok": raw.parse().choices[0].message.content is not None}))
"#;

#[test]
fn over_limit_openai_shape_and_the_sdk_honours_retry_after() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&[]);
    // 20/min: one admission every 3 s (so the second request is limited
    // even when llmock's first answer is slow)
    let cfg = crate::common::TIGHT.replace("capacity = 60", "capacity = 20");
    let (_p, url) = proxy(&dir, "tight", &up, &cfg);
    let r = python(SDK_OPENAI_LIMIT, &url, Duration::from_secs(60));
    let first = &r["first"];
    assert_eq!(first["status"], 429, "{r}");
    assert_eq!(first["body"]["error"]["code"], "rate_limit_exceeded", "{r}");
    let ms: u64 = first["retry_after_ms"].as_str().unwrap().parse().unwrap();
    // the next admission is < 3 s away
    assert!((1..=3000).contains(&ms), "{r}");
    assert_eq!(first["retry_after"], ms.div_ceil(1000).to_string(), "{r}");
    assert_eq!(first["limit"], "20", "{r}");
    assert_eq!(first["reset"].as_str().unwrap(), format!("{ms}ms"));
    // the SDK retried after the hint and was admitted
    assert!(r["ok"].as_bool().unwrap(), "{r}");
    assert!(r["retries_taken"].as_u64().unwrap() >= 1, "{r}");
    // (how long it slept depends on how long the admitted request took
    // before: llmock's first answer can take most of the second)
    let elapsed = r["elapsed"].as_f64().unwrap();
    assert!(elapsed < 10.0, "{r}");
    let m = settled(&url);
    assert_eq!(metric(&m, "qsim_proxy_admitted_total{consumer=\"A\"}"), 2.0);
    let rejected = metric(
        &m,
        "qsim_proxy_rejected_total{consumer=\"A\",limit=\"capacity\"}",
    );
    assert_eq!(
        rejected,
        1.0 + r["retries_taken"].as_f64().unwrap(),
        "{m:?}"
    );
    // the proxy's own time: one observation per forwarded or limited
    // request, each under the largest bucket's bound
    let own = metric(&m, "qsim_proxy_overhead_seconds_count");
    assert_eq!(own, 2.0 + rejected, "{m:?}");
    let sum = metric(&m, "qsim_proxy_overhead_seconds_sum");
    assert!(sum > 0.0 && sum < own * 1.3, "{m:?}");
}

const SDK_FMAPI_LIMIT: &str = r#"
import json, os, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/serving-endpoints", api_key="key-a")
msgs = [{"role": "user", "content": "hi"}]
out = {}
try:
    c.with_options(max_retries=0).chat.completions.create(model="my-endpoint", messages=msgs, max_tokens=8)
    out["first"] = "forwarded"
except openai.APIStatusError as e:
    out["first"] = e.status_code
try:
    c.with_options(max_retries=1).chat.completions.create(model="my-endpoint", messages=msgs, max_tokens=8)
    out["second"] = None
except openai.RateLimitError as e:
    out["second"] = {"status": e.status_code, "body": e.response.json(),
                     "retry_after": e.response.headers.get("retry-after"),
                     "retry_after_ms": e.response.headers.get("retry-after-ms")}
print(json.dumps(out))
"#;

#[test]
fn over_limit_fmapi_shape_without_hint_and_the_sdk_backs_off_on_its_own() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&[]);
    // 20/min: 3 s between admissions, so the SDK's retry (~0.5 s) comes
    // back before the refill even if llmock's first answer is slow
    let cfg = format!(
        "limit_shape = \"fmapi\"\n{}",
        crate::common::TIGHT.replace("capacity = 60", "capacity = 20")
    );
    let (_p, url) = proxy(&dir, "fmapi", &up, &cfg);
    let r = python(SDK_FMAPI_LIMIT, &url, Duration::from_secs(60));
    // the first request was admitted and forwarded (whatever llmock makes of
    // the serving-endpoints path)
    assert_ne!(r["first"], 429, "{r}");
    let s = &r["second"];
    assert_eq!(s["status"], 429, "{r}");
    assert_eq!(s["body"]["error_code"], "REQUEST_LIMIT_EXCEEDED", "{r}");
    assert!(s["body"]["message"].as_str().unwrap().contains("capacity"));
    assert!(
        s["retry_after"].is_null() && s["retry_after_ms"].is_null(),
        "{r}"
    );
    // no hint: the SDK's own backoff (0.5 s × jitter) comes back before the
    // 3 s refill, so both attempts were limited
    let m = settled(&url);
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_rejected_total{consumer=\"A\",limit=\"capacity\"}"
        ),
        2.0,
        "{m:?}"
    );
}

#[test]
fn bad_input_gets_openai_style_errors() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_up, up) = llmock(&[]);
    let cfg = format!("max_body_bytes = 2048\n{LIMITER_OPEN}");
    let (_p, url) = proxy(&dir, "bad", &up, &cfg);
    let auth = [
        ("authorization", "Bearer key-a"),
        ("content-type", "application/json"),
    ];
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<u8>, u16, &'a str);
    let cases: Vec<Case> = vec![
        (auth.to_vec(), b"{not json".to_vec(), 400, "invalid_json"),
        (auth.to_vec(), b"[1,2]".to_vec(), 400, "invalid_json"),
        (
            auth.to_vec(),
            format!(
                "{{\"messages\":[{{\"role\":\"user\",\"content\":\"{}\"}}]}}",
                "x".repeat(4000)
            )
            .into_bytes(),
            413,
            "body_too_large",
        ),
        (
            auth.to_vec(),
            br#"{"model":"m","messages":[],"max_tokens":0}"#.to_vec(),
            400,
            "invalid_max_tokens",
        ),
        (
            auth.to_vec(),
            br#"{"model":"m","messages":[],"max_tokens":-5}"#.to_vec(),
            400,
            "invalid_max_tokens",
        ),
        // issue 41, case 8: a bad `n` was coded invalid_max_tokens
        (
            auth.to_vec(),
            br#"{"model":"m","messages":[],"n":0}"#.to_vec(),
            400,
            "invalid_n",
        ),
        (
            vec![("authorization", "Bearer nobody")],
            br#"{"model":"m","messages":[]}"#.to_vec(),
            401,
            "unknown_consumer",
        ),
        (
            vec![],
            br#"{"model":"m","messages":[]}"#.to_vec(),
            401,
            "unknown_consumer",
        ),
    ];
    for (h, body, status, code) in &cases {
        let (st, head, text) = http(&url, "POST", "/v1/chat/completions", h, body);
        assert_eq!(st, *status, "{code}: {head}\n{text}");
        assert!(head.contains("content-type: application/json"), "{head}");
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(v["error"]["code"], *code, "{v}");
        assert!(v["error"]["message"]
            .as_str()
            .is_some_and(|m| !m.is_empty()));
        assert!(v["error"]["type"].is_string());
    }
    let (st, _, _) = http(&url, "GET", "/healthz", &[], b"");
    assert_eq!(st, 200);
    let (st, _, _) = http(&url, "GET", "/v1/chat/completions", &[], b"");
    assert_eq!(st, 405);
    let m = settled(&url);
    assert_eq!(metric(&m, "qsim_proxy_admitted_total{consumer=\"A\"}"), 0.0);

    // unknown consumers under a default policy instead of 401
    let cfg = format!("unknown_consumer = \"B\"\n{LIMITER_OPEN}");
    let (_p2, url2) = proxy(&dir, "default", &up, &cfg);
    let (st, _, text) = http(
        &url2,
        "POST",
        "/v1/chat/completions",
        &[("authorization", "Bearer nobody")],
        br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#,
    );
    assert_eq!(st, 200, "{text}");
    let m = settled(&url2);
    assert_eq!(metric(&m, "qsim_proxy_admitted_total{consumer=\"B\"}"), 1.0);
}

const SDK_FAULTS: &str = r#"
import json, os, sys, openai
c = openai.OpenAI(base_url=os.environ["PROXY"] + "/v1", api_key="key-a", max_retries=0, timeout=20)
msgs = [{"role": "user", "content": "Tell me a long story"}]
mode = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("MODE")
out = {}
def stream_outcome():
    n = 0
    try:
        for ch in c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64, stream=True):
            n += 1
        return {"chunks": n, "error": None}
    except Exception as e:
        return {"chunks": n, "error": type(e).__name__}
if mode == "5xx":
    try:
        c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64,
                                  extra_headers={"x-llmock-force-status": "503"})
        out["status"] = 200
    except openai.APIStatusError as e:
        out["status"] = e.status_code
    out["stream"] = stream_outcome()
elif mode == "client_disconnect":
    s = c.chat.completions.create(model="gpt-4o-mini", messages=msgs, max_tokens=64, stream=True)
    it = iter(s)
    next(it)
    s.close()  # the client goes away mid-stream
    out["closed"] = True
else:
    out["stream"] = stream_outcome()
print(json.dumps(out))
"#;

fn faults_script(mode: &str) -> String {
    format!("import os\nos.environ['MODE'] = '{mode}'\n{SDK_FAULTS}")
}

#[test]
fn faults_return_every_reservation_and_in_flight_slot() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let cfg = format!("stream_idle_timeout_s = 1.0\n{LIMITER_OPEN}");
    // 5xx (forced per request) and a client that disconnects mid-stream
    // (slow chunks so the stream is still open when it leaves)
    let (_u1, up1) = llmock(&["--stream-chunk-delay-ms", "200"]);
    let (_p1, url1) = proxy(&dir, "f1", &up1, &cfg);
    let r = python(&faults_script("5xx"), &url1, Duration::from_secs(60));
    assert_eq!(r["status"], 503, "{r}");
    let r = python(
        &faults_script("client_disconnect"),
        &url1,
        Duration::from_secs(60),
    );
    assert_eq!(r["closed"], true);
    let m = settled(&url1);
    assert_eq!(
        metric(&m, "qsim_proxy_upstream_status_total{status=\"503\"}"),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_upstream_errors_total{reason=\"client_disconnect\"}"
        ),
        1.0,
        "{m:?}"
    );

    // the upstream breaks every stream: disconnect, stall, malformed
    for (fault, reason) in [
        ("disconnect", Some("upstream_body")),
        ("stall", Some("upstream_stalled")),
        ("malformed", None),
    ] {
        let (_u, up) = llmock(&[
            "--stream-fault",
            &format!("{fault}=1.0"),
            "--stream-stall-seconds",
            "30",
        ]);
        let (_p, url) = proxy(&dir, fault, &up, &cfg);
        let r = python(&faults_script("stream"), &url, Duration::from_secs(60));
        if fault != "malformed" {
            assert!(
                !r["stream"]["error"].is_null(),
                "{fault}: the client must see an error: {r}"
            );
        }
        let m = settled(&url);
        assert_eq!(
            metric(&m, "qsim_proxy_admitted_total{consumer=\"A\"}"),
            1.0,
            "{fault}"
        );
        if let Some(reason) = reason {
            let key = format!("qsim_proxy_upstream_errors_total{{reason=\"{reason}\"}}");
            assert_eq!(metric(&m, &key), 1.0, "{fault}: {m:?}");
        }
    }
}

#[test]
fn a_bad_config_exits_2_naming_the_field_before_binding() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    // the port is taken: a config error must be reported, not a bind error
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let cases = [
        ("capacity = 0", "deployment.capacity"),
        (
            "capacity = 100\nsemantics = \"nope\"",
            "deployment.semantics",
        ),
        ("capacity = 100\nthreshold = 2.0", "deployment.threshold"),
    ];
    for (dep, field) in cases {
        let p = dir.path().join("bad.toml");
        std::fs::write(
            &p,
            format!(
                "kind = \"proxy\"\n[proxy]\nlisten = \"{addr}\"\nupstream = \"http://127.0.0.1:9\"\n\
                 [proxy.keys]\nA = [\"k\"]\n[deployment]\n{dep}\n[[consumer]]\nname = \"A\"\n"
            ),
        )
        .unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
            .args(["proxy", "--config"])
            .arg(&p)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(err.contains(field), "{field}: {err}");
    }
    let p = dir.path().join("bad2.toml");
    let base = format!(
        "kind = \"proxy\"\n[deployment]\ncapacity = 100\n[[consumer]]\nname = \"A\"\n[proxy]\nlisten = \"{addr}\"\nupstream = \"http://127.0.0.1:9\"\n"
    );
    for (extra, field) in [
        ("[proxy.keys]\nZ = [\"k\"]\n", "proxy.keys.Z"),
        (
            "limit_shape = \"x\"\n[proxy.keys]\nA = [\"k\"]\n",
            "proxy.limit_shape",
        ),
        (
            "credential_env = \"QSIM_TEST_UNSET_VAR\"\n[proxy.keys]\nA = [\"k\"]\n",
            "proxy.credential_env",
        ),
        ("bogus = 1\n", "proxy.bogus"),
        (
            "state = \"redis://nohost\"\n[proxy.keys]\nA = [\"k\"]\n",
            "proxy.state",
        ),
        (
            "state = \"redis://127.0.0.1:6379\"\nstate_fail = \"maybe\"\n[proxy.keys]\nA = [\"k\"]\n",
            "proxy.state_fail",
        ),
        ("", "proxy.keys"),
    ] {
        std::fs::write(&p, format!("{base}{extra}")).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
            .args(["proxy", "--config"])
            .arg(&p)
            .env_remove("QSIM_TEST_UNSET_VAR")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{field}: {err}");
        assert!(err.contains(field), "{field}: {err}");
    }
    drop(taken);
}
