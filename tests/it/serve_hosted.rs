//! `qsim serve` of hosted-API profiles, on 127.0.0.1 only, with the official
//! openai Python SDK (the venv of scripts/live-deps.sh; missing → the tests
//! fail loudly) as the client. Every wait is bounded; every server is killed
//! at the end.

use crate::common::serve as serve_helpers;

use serde_json::Value;
use serve_helpers::{model, python, serve};
use std::process::Command;
use std::time::Duration;

const BASIC: &str = r#"
import json, os, time, openai
url = os.environ["URL"]
c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
msgs = [{"role": "user", "content": "Summarise in three sentences: a review of a kettle."}]
r = c.chat.completions.create(model="databricks-claude-haiku-4-5", messages=msgs, max_tokens=256)
again = c.chat.completions.create(model="databricks-claude-haiku-4-5", messages=msgs, max_tokens=256)
short = c.chat.completions.create(model="databricks-claude-haiku-4-5", messages=msgs, max_tokens=20)
out = {"plain": {"usage": r.usage.model_dump(), "finish": r.choices[0].finish_reason,
                 "words": len(r.choices[0].message.content.split()), "object": r.object},
       "again": again.usage.completion_tokens,
       "short": {"n": short.usage.completion_tokens, "finish": short.choices[0].finish_reason}}
# streaming with a separate usage chunk (stream_options), timed
t0 = time.monotonic(); first = None; n = 0; usage = None; finish = None
for ch in c.chat.completions.create(model="databricks-claude-haiku-4-5", messages=msgs, max_tokens=256,
                                    stream=True, stream_options={"include_usage": True}):
    if ch.choices and ch.choices[0].delta.content:
        n += 1
        if first is None: first = time.monotonic() - t0
    if ch.choices and ch.choices[0].finish_reason: finish = ch.choices[0].finish_reason
    if ch.usage: usage = ch.usage.model_dump()
out["stream"] = {"chunks": n, "usage": usage, "finish": finish, "ttft": first, "e2e": time.monotonic() - t0}
# streaming without stream_options: usage on the final chunk
last = None; n2 = 0
for ch in c.chat.completions.create(model="databricks-claude-haiku-4-5", messages=msgs, max_tokens=256, stream=True):
    if ch.choices and ch.choices[0].delta.content: n2 += 1
    last = ch
out["stream_plain"] = {"chunks": n2, "usage": last.usage.model_dump() if last.usage else None}
# the Databricks serving-endpoints routes
d = openai.OpenAI(base_url=url + "/serving-endpoints", api_key="k", max_retries=0)
r = d.chat.completions.create(model="databricks-claude-haiku-4-5", messages=msgs, max_tokens=256)
out["serving"] = r.usage.model_dump()
import urllib.request
req = urllib.request.Request(url + "/serving-endpoints/databricks-claude-haiku-4-5/invocations",
    data=json.dumps({"messages": msgs, "max_tokens": 256}).encode(), headers={"content-type": "application/json"})
out["invocations"] = json.loads(urllib.request.urlopen(req, timeout=30).read())["usage"]
cp = c.completions.create(model="x", prompt="Once upon a time", max_tokens=30)
out["completions"] = {"usage": cp.usage.model_dump(), "object": cp.object}
print(json.dumps(out))
"#;

/// Non-streaming and streaming answers with usage: lengths from the
/// profile's `[serve] output_tokens` capped at max_tokens, the same prompt the
/// same length, input tokens = ceil(chars / 4) + 4 per message.
#[test]
fn haiku_answers_with_usage_streaming_or_not() {
    crate::live!();
    let (_p, url) = serve(&model("databricks-claude-haiku-4-5.toml"), 20.0, 1);
    let r = python(BASIC, &url, Duration::from_secs(120));
    // "Summarise in three sentences: a review of a kettle." = 52 chars
    let prompt = 52u64.div_ceil(4) + 4;
    let plain = &r["plain"];
    let n = plain["usage"]["completion_tokens"].as_u64().unwrap();
    assert_eq!(plain["usage"]["prompt_tokens"], prompt, "{r}");
    assert_eq!(plain["usage"]["total_tokens"], prompt + n);
    assert!((40..=256).contains(&n), "{r}");
    assert_eq!(plain["words"], n, "one word per token");
    assert_eq!(plain["object"], "chat.completion");
    assert_eq!(
        plain["finish"],
        if n == 256 { "length" } else { "stop" },
        "{r}"
    );
    assert_eq!(r["again"], n, "the same prompt, the same answer length");
    assert_eq!(r["short"]["n"], 20, "capped at max_tokens: {r}");
    assert_eq!(r["short"]["finish"], "length");
    let s = &r["stream"];
    assert_eq!(s["usage"]["completion_tokens"], n, "{r}");
    assert_eq!(s["chunks"], n, "one chunk per token");
    assert_eq!(s["finish"], plain["finish"]);
    // at time scale 20 the profile's TTFT (p50 0.5 s, p95 1 s) and E2E
    // (TTFT + n × 8 ms median) are 20 times shorter; the upper bounds leave
    // 100 ms of real time to the client (the SDK parses every chunk)
    let (ttft, e2e) = (
        s["ttft"].as_f64().unwrap() * 20.0,
        s["e2e"].as_f64().unwrap() * 20.0,
    );
    assert!((0.1..3.0).contains(&ttft), "model TTFT {ttft} s");
    assert!(
        e2e > ttft + n as f64 * 0.003 && e2e < ttft + n as f64 * 0.04 + 2.0,
        "model E2E {e2e} s for {n} tokens after TTFT {ttft} s"
    );
    assert_eq!(r["stream_plain"]["chunks"], n);
    assert_eq!(r["stream_plain"]["usage"]["completion_tokens"], n, "{r}");
    assert_eq!(r["serving"]["completion_tokens"], n);
    assert_eq!(r["invocations"]["completion_tokens"], n);
    assert_eq!(r["completions"]["object"], "text_completion");
    // "Once upon a time": 16 chars, no messages
    assert_eq!(r["completions"]["usage"]["prompt_tokens"], 4);
}

const BURSTS: &str = r#"
import json, os, time, threading, openai
url = os.environ["URL"]
c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=60)
def burst(tag, n=100):
    res = [None] * n
    go = threading.Barrier(n)
    def one(i):
        go.wait()
        t = time.monotonic()
        try:
            r = c.chat.completions.with_raw_response.create(model="databricks-claude-haiku-4-5",
                messages=[{"role": "user", "content": f"review {tag}-{i:03d}"}], max_tokens=256)
            res[i] = {"status": 200, "out": r.parse().usage.completion_tokens, "sent": t, "end": time.monotonic()}
        except openai.APIStatusError as e:
            h = e.response.headers
            res[i] = {"status": e.status_code, "body": e.response.text, "sent": t, "end": time.monotonic(),
                      "kind": type(e).__name__,
                      "hints": [k for k in ("retry-after", "retry-after-ms") if k in h]}
    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for x in ts: x.start()
    for x in ts: x.join()
    return res
a = burst("a")
b = burst("b")
print(json.dumps({"a": a, "b": b}))
"#;

/// A burst over OTPM: 429s in the FMAPI shape (the profile's body verbatim,
/// no retry hint anywhere), decided on the reserved max_tokens; after the
/// answers complete, their unused reservations are back (reserve/refund).
#[test]
fn haiku_burst_gets_fmapi_429s_and_refunds_on_completion() {
    crate::live!();
    let prof = model("databricks-claude-haiku-4-5.toml");
    let (_p, url) = serve(&prof, 1.0, 3);
    let r = python(BURSTS, &url, Duration::from_secs(120));
    let text = std::fs::read_to_string(&prof).unwrap();
    let body: Value = serde_json::from_str(
        text.lines()
            .find_map(|l| l.strip_prefix("body = '"))
            .and_then(|l| l.strip_suffix('\''))
            .unwrap(),
    )
    .unwrap();
    let (a, b) = (r["a"].as_array().unwrap(), r["b"].as_array().unwrap());
    let ok = |v: &[Value]| v.iter().filter(|x| x["status"] == 200).count() as u64;
    let (ok_a, ok_b) = (ok(a), ok(b));
    for x in a.iter().chain(b) {
        if x["status"] != 200 {
            assert_eq!(x["status"], 429, "{x}");
            assert_eq!(x["kind"], "RateLimitError");
            let got: Value = serde_json::from_str(x["body"].as_str().unwrap()).unwrap();
            assert_eq!(got, body, "the profile's 429 body verbatim");
            assert_eq!(
                x["hints"],
                serde_json::json!([]),
                "FMAPI as measured: no hint"
            );
        }
    }
    let t = |v: &[Value], k: &str, f: fn(f64, f64) -> f64| {
        v.iter().map(|x| x[k].as_f64().unwrap()).fold(f64::NAN, f)
    };
    // OTPM: 20,000 tokens, 333.3/s; each request reserves 256
    let rate = 20_000.0 / 60.0;
    // burst 1 on a full bucket: 78 fit, plus what refilled while it arrived
    let spread = t(a, "sent", f64::max) - t(a, "sent", f64::min);
    let extra = ((rate * (spread + 0.01)) / 256.0).ceil() as u64;
    assert!(
        (78..=78 + extra).contains(&ok_a),
        "burst 1: {ok_a} admitted, expected 78 (+{extra} refilled during its {spread:.3} s)"
    );
    // burst 2 starts after every answer of burst 1 ended: their refunds
    // (256 − output each) alone admit floor(R / 256) more
    assert!(t(b, "sent", f64::min) > t(a, "end", f64::max));
    let refunds: u64 = a
        .iter()
        .filter(|x| x["status"] == 200)
        .map(|x| 256 - x["out"].as_u64().unwrap())
        .sum();
    assert!(
        refunds > 78 * 40,
        "answers shorter than max_tokens: {refunds}"
    );
    assert!(
        ok_b >= refunds / 256,
        "burst 2: {ok_b} admitted; the refunds of burst 1 ({refunds} tokens) alone admit {}",
        refunds / 256
    );
    // and nothing more than capacity + refunds + refill up to the last decision
    let elapsed = t(b, "end", f64::max) - t(a, "sent", f64::min);
    let bound = (20_000.0 + refunds as f64 + rate * elapsed) / 256.0;
    assert!(
        ((ok_a + ok_b) as f64) <= bound.floor(),
        "{ok_a} + {ok_b} admitted > (capacity + refunds + refill over {elapsed:.2} s) / 256 = {bound:.1}"
    );
}

const HINT: &str = r#"
import json, os, time, threading, openai
url = os.environ["URL"]
c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0, timeout=60)
msgs = [{"role": "user", "content": "12345678"}]
t0 = time.monotonic()
# warm the client up (the SDK's first call is slow): 1 + 6 tokens of TPM
c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=1)
ready = [threading.Event(), threading.Event()]
def admitted(i):
    s = c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=14000, stream=True)
    ready[i].set()  # headers came: admitted
    for _ in s: pass
for i in range(2):
    threading.Thread(target=admitted, args=(i,), daemon=True).start()
for e in ready: assert e.wait(30)
t1 = time.monotonic()
try:
    c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=14000)
    out = {"status": 200}
except openai.RateLimitError as e:
    out = {"status": 429, "headers": dict(e.response.headers), "body": e.response.json()}
out["elapsed"] = t1 - t0
print(json.dumps(out))
"#;

/// Azure's shape: TPM reserves prompt + max_tokens with no refund; the 429
/// carries `retry-after-ms`, the exact time the bucket admits the same
/// request, in real milliseconds (model time / time scale), rounded up.
#[test]
fn azure_429_carries_the_exact_retry_after_ms() {
    crate::live!();
    let x = 10.0;
    let (_p, url) = serve(&model("azure-openai-gpt-4o-30k-tpm.toml"), x, 1);
    let r = python(HINT, &url, Duration::from_secs(60));
    assert_eq!(r["status"], 429, "{r}");
    let h = &r["headers"];
    assert!(h.get("retry-after").is_none(), "only retry-after-ms: {h}");
    let ms: f64 = h["retry-after-ms"].as_str().unwrap().parse().unwrap();
    assert_eq!(r["body"]["error"]["code"], "rate_limit_exceeded", "{r}");
    // cost = 2 + 4 (prompt estimate) + max_tokens; after the warm-up (7)
    // and two of 14,006, 30,000 − 7 − 2·14,006 is left; the third needs
    // 14,006: (3·14,006 + 7 − 30,000) / 500 per s, less the refill since
    // the warm-up (≤ the client's elapsed × X)
    let cost = 14_006.0;
    let full = (3.0 * cost + 7.0 - 30_000.0) / 500.0;
    let model_hint = ms / 1e3 * x;
    let elapsed = r["elapsed"].as_f64().unwrap() * x;
    assert!(
        model_hint <= full + 0.001 * x + 0.001 && model_hint >= full - elapsed - 0.001,
        "hint {model_hint:.3} model s; expected {full:.3} s less at most {elapsed:.3} s of refill"
    );
}

/// Bad requests get OpenAI-style 400s (the SDK raises BadRequestError).
#[test]
fn bad_requests_get_openai_style_400s() {
    crate::live!();
    let (_p, url) = serve(&model("databricks-claude-haiku-4-5.toml"), 20.0, 1);
    let script = r#"
import json, os, openai, urllib.request, urllib.error
url = os.environ["URL"]
c = openai.OpenAI(base_url=url + "/v1", api_key="k", max_retries=0)
m = [{"role": "user", "content": "x"}]
out = {}
for name, kw in [("max_tokens_0", dict(messages=m, max_tokens=0)),
                 ("no_messages", dict(messages=[])),
                 ("n_2", dict(messages=m, n=2)),
                 ("bad_role", dict(messages=[{"content": "x"}]))]:
    try:
        c.chat.completions.create(model="m", **kw)
        out[name] = None
    except openai.BadRequestError as e:
        out[name] = e.response.json()["error"]
def raw(path, data):
    try:
        r = urllib.request.urlopen(urllib.request.Request(url + path, data=data,
            headers={"content-type": "application/json"}), timeout=10)
        return [r.status, None]
    except urllib.error.HTTPError as e:
        return [e.code, json.loads(e.read())["error"]]
out["not_json"] = raw("/v1/chat/completions", b"{nope")
out["no_model"] = raw("/v1/chat/completions", json.dumps({"messages": m}).encode())
out["batch"] = raw("/v1/completions", json.dumps({"model": "m", "prompt": ["a", "b"]}).encode())
out["route"] = raw("/v1/embeddings", b"{}")
print(json.dumps(out))
"#;
    let r = python(script, &url, Duration::from_secs(60));
    for (k, code) in [
        ("max_tokens_0", "invalid_value"),
        ("no_messages", "invalid_value"),
        ("n_2", "unsupported_value"),
        ("bad_role", "invalid_value"),
    ] {
        assert_eq!(r[k]["type"], "invalid_request_error", "{k}: {r}");
        assert_eq!(r[k]["code"], code, "{k}: {r}");
        assert!(r[k]["message"].as_str().unwrap().len() > 10);
    }
    assert_eq!(r["not_json"][0], 400);
    assert_eq!(r["not_json"][1]["code"], "invalid_json");
    assert_eq!(r["no_model"][0], 400);
    assert_eq!(r["no_model"][1]["code"], "missing_required_parameter");
    assert_eq!(r["batch"][0], 400);
    assert_eq!(r["route"][0], 404);
}

/// A bad profile or flag: exit 2 with one line naming the field, before
/// binding (the port is held by this test: a bind would fail otherwise).
#[test]
fn bad_profile_exits_2_naming_the_field_before_binding() {
    crate::live!();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let good = std::fs::read_to_string(model("databricks-claude-haiku-4-5.toml")).unwrap();
    let cases = [
        (
            good.replacen("window_s = 60", "window_s = -60", 1),
            "limits.0.window_s",
        ),
        (
            good.replace("mean = 168, sd = 30", "mean = 168, sd = -30"),
            "serve.output_tokens",
        ),
        (
            good.replace("default_max_tokens = 4096", "default_max_tokens = 0"),
            "serve.default_max_tokens",
        ),
        (
            good.replace("[serve]", "[serve]\ncolour = 3"),
            "serve.colour",
        ),
        (good.replace("body = '{", "body = 'x{"), "rejection.body"),
        ("kind = \"shared\"\n".to_string(), "kind"),
    ];
    for (i, (text, field)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&p, text).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
            .arg("serve")
            .arg(&p)
            .args(["--listen", &addr])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "case {i}: {err}");
        assert!(out.stdout.is_empty(), "case {i}: nothing bound");
        assert_eq!(err.lines().count(), 1, "case {i}: one line: {err}");
        assert!(
            err.starts_with(&format!("qsim: {}: {field}", p.display())),
            "case {i}: {err}"
        );
    }
    // flags
    for (args, flag) in [
        (vec!["--listen", "nowhere"], "--listen"),
        (
            vec!["--listen", "127.0.0.1:0", "--time-scale", "0"],
            "--time-scale",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
            .arg("serve")
            .arg(model("databricks-claude-haiku-4-5.toml"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{err}");
    }
    // the good profile on the held port: an I/O error (exit 1), after validation
    let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .arg("serve")
        .arg(model("databricks-claude-haiku-4-5.toml"))
        .args(["--listen", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot listen"));
    drop(held);
}
