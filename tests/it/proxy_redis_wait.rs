//! `on_limit = "wait"` across replicas: two `qsim proxy` replicas share one
//! limiter state in a real `redis-server`, in front of `llmock`, and hold a
//! saturated consumer's requests (the official `openai` SDK as the client;
//! it sends its own timeout as `x-stainless-read-timeout`). The waiters of
//! both replicas are admitted at one global rate (one per second), each
//! before its own timeout; a request whose deadline is shorter than the
//! wait its replica predicts gets 429 at once with the limiter's retry time.
//! 127.0.0.1 only; bounded (8 requests, ≈ 10 s). Timings are compared with
//! the limiter's own waits (seconds), never with a latency budget.

use crate::common::{free_port, llmock, metric, proxy, python_env, redis_server, settled, warm};
use serde_json::Value;
use std::time::Duration;

const SCRIPT: &str = r#"
import json, os, threading, time, openai
urls = [os.environ["PROXY"], os.environ["PROXY2"]]
cs = [openai.OpenAI(base_url=u + "/v1", api_key="key-a", max_retries=0) for u in urls]
msgs = [{"role": "user", "content": "hi"}]
def call(r, timeout):
    t0 = time.monotonic()
    try:
        cs[r].with_options(timeout=timeout).chat.completions.create(
            model="gpt-4o-mini", messages=msgs, max_tokens=8)
        return {"replica": r, "status": 200, "start": t0, "end": time.monotonic()}
    except openai.RateLimitError as e:
        return {"replica": r, "status": 429, "start": t0, "end": time.monotonic(),
                "retry_after_ms": int(e.response.headers["retry-after-ms"])}
    except openai.APITimeoutError:
        return {"replica": r, "status": "timeout", "start": t0, "end": time.monotonic()}
out = {"first": call(0, 10.0)}
# six waiters (a 12 s timeout each), alternating between the replicas
waiters = [None] * 6
def waiter(i):
    waiters[i] = call(i % 2, 12.0)
ts = []
for i in range(6):
    t = threading.Thread(target=waiter, args=(i,)); t.start(); ts.append(t)
    time.sleep(0.05)
time.sleep(0.2)
# a short deadline (1.5 s) on each replica, behind its three waiters
out["short"] = [call(0, 1.5), call(1, 1.5)]
for t in ts: t.join()
out["waiters"] = waiters
print(json.dumps(out))
"#;

#[test]
fn waiters_on_two_replicas_share_one_rate_in_redis_and_short_deadlines_are_refused_at_once() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let rport = free_port();
    let _redis = redis_server(rport);
    let (_up, up) = llmock(&[]);
    warm(&up);
    let cfg = format!(
        "state = \"redis://127.0.0.1:{rport}\"\non_limit = \"wait\"\nmax_wait_s = 20\n\
         deadline_margin_s = 0.05\n{}",
        crate::common::TIGHT
    );
    let (_p0, u0) = proxy(&dir, "r0", &up, &cfg);
    let (_p1, u1) = proxy(&dir, "r1", &up, &cfg);
    let r = python_env(
        SCRIPT,
        &u0,
        &[("PROXY2", u1.as_str())],
        Duration::from_secs(60),
    );
    let f = |v: &Value, k: &str| v[k].as_f64().unwrap();
    assert_eq!(r["first"]["status"], 200, "{r}");
    let w = r["waiters"].as_array().unwrap();
    // every waiter admitted before its own timeout ...
    for (k, x) in w.iter().enumerate() {
        assert_eq!(x["status"], 200, "waiter {k}: {r}");
        assert!(f(x, "end") - f(x, "start") < 12.0, "{r}");
    }
    // ... at one global rate: sorted, the admissions (answers) of both
    // replicas are about a second apart (two independent limiters would
    // admit two per second); each answer adds llmock's time (warmed up
    // first: its very first answer takes ~1 s), so the gaps are compared
    // with 1 s less a margin for that jitter
    let mut ends: Vec<f64> = std::iter::once(&r["first"])
        .chain(w.iter())
        .map(|x| f(x, "end"))
        .collect();
    ends.sort_by(f64::total_cmp);
    let span = ends[ends.len() - 1] - ends[0];
    assert!(
        span > 5.5,
        "7 admissions at one per second span ≥ 6 s, got {span:.2} s: {r}"
    );
    for g in ends.windows(2) {
        assert!(
            g[1] - g[0] > 0.7,
            "two admissions {:.3} s apart: {r}",
            g[1] - g[0]
        );
    }
    // the short deadlines: 429 at once, pointing past the deadline
    for s in r["short"].as_array().unwrap() {
        assert_eq!(s["status"], 429, "{r}");
        let hint = f(s, "retry_after_ms") / 1e3;
        assert!(hint > 1.5, "the predicted wait is beyond the deadline: {r}");
        assert!(
            f(s, "end") - f(s, "start") < 1.0,
            "answered before its 1.5 s deadline, not held: {r}"
        );
    }
    let m0 = settled(&u0);
    let m1 = settled(&u1);
    let sum = |k: &str| metric(&m0, k) + metric(&m1, k);
    assert_eq!(sum("qsim_proxy_admitted_total{consumer=\"A\"}"), 7.0);
    assert_eq!(
        sum("qsim_proxy_waits_total{consumer=\"A\",outcome=\"refused_deadline\"}"),
        2.0
    );
    assert_eq!(sum("qsim_proxy_waiting"), 0.0);
}
