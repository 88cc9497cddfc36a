//! `qsim proxy` under attack (issue 26): slow request heads and bodies are
//! cut off by `header_read_timeout_s` / `body_read_timeout_s` and counted
//! (`qsim_proxy_read_timeouts_total`); proxied paths with dot segments or
//! encoded slashes are refused before the proxy's credential goes
//! anywhere; the upstream base works with or without `/serving-endpoints`;
//! the credential in an upstream URL is never printed.
//!
//! No upstream but a recording one written here (a thread answering every
//! request 200 and keeping the paths it received), so these tests need no
//! live part. No verdict depends on speed: a connection must be closed and
//! counted within a generous bound (60 s), never "within 1.2 s".

use crate::common::{metric, metrics, proxy, Proc};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One consumer `A` (key `key-a`), plenty of capacity.
const KEYS: &str = r#"
[proxy.keys]
A = ["key-a"]

[deployment]
capacity = 100000
threshold = 1.0
semantics = "rate-limit-only"

[[consumer]]
name = "A"
"#;

/// An upstream on 127.0.0.1 that answers every request 200 with a small
/// chat completion and records each request's target and headers.
pub struct Recorder {
    pub url: String,
    pub seen: Arc<Mutex<Vec<(String, String)>>>,
}

pub fn recorder() -> Recorder {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let s = seen.clone();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { continue };
            let s = s.clone();
            std::thread::spawn(move || answer(c, &s));
        }
    });
    Recorder { url, seen }
}

fn answer(c: TcpStream, seen: &Mutex<Vec<(String, String)>>) {
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    let mut r = BufReader::new(c.try_clone().unwrap());
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let target = line.split_whitespace().nth(1).unwrap_or("").to_string();
        let mut headers = String::new();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            if h == "\r\n" {
                break;
            }
            let lower = h.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            }
            headers.push_str(&lower);
        }
        let mut body = vec![0; len];
        if r.read_exact(&mut body).is_err() {
            return;
        }
        seen.lock().unwrap().push((target, headers));
        let b = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
        let mut w = &c;
        let _ = write!(
            w,
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{b}",
            b.len()
        );
    }
}

const CHAT: &[u8] = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4}"#;

/// Send `head` (and nothing more) on a fresh connection and read until the
/// proxy closes it (bounded: 60 s); returns what was read.
fn held(url: &str, head: &str) -> String {
    let mut s = TcpStream::connect(url.strip_prefix("http://").unwrap()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    let t = Instant::now();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            // a reset is a close too
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!(
                "connection still open after {:?} ({e}); read so far: {:?}",
                t.elapsed(),
                String::from_utf8_lossy(&out)
            ),
        }
    }
    String::from_utf8_lossy(&out).to_string()
}

/// Wait (bounded: 60 s) until `key` in /metrics reaches `n`.
fn counted(url: &str, key: &str, n: f64) {
    let t = Instant::now();
    loop {
        let m = metrics(url);
        if metric(&m, key) >= n {
            return;
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{key} is {} after 60 s, expected {n}",
            metric(&m, key)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn slow_heads_and_bodies_are_closed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let up = recorder();
    let cfg = format!("header_read_timeout_s = 1\nbody_read_timeout_s = 1\n{KEYS}");
    let (_p, url) = proxy(&dir, "slow", &up.url, &cfg);
    let host = url.strip_prefix("http://").unwrap();
    let auth = "authorization: Bearer key-a\r\ncontent-type: application/json\r\n";

    // a Content-Length larger than what is sent
    let r = held(
        &url,
        &format!("POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n{auth}content-length: 1000\r\n\r\n{{\"model\""),
    );
    assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    assert!(r.contains("\"code\":\"body_timeout\""), "{r}");
    // a chunked body that never ends
    let r = held(
        &url,
        &format!("POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n{auth}transfer-encoding: chunked\r\n\r\n5\r\n{{\"mod\r\n"),
    );
    assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    counted(&url, "qsim_proxy_read_timeouts_total{phase=\"body\"}", 2.0);

    // a request head that never ends
    held(
        &url,
        &format!("POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\n{auth}"),
    );
    counted(
        &url,
        "qsim_proxy_read_timeouts_total{phase=\"headers\"}",
        1.0,
    );
    // a connection that never sends anything
    held(&url, "");
    counted(&url, "qsim_proxy_read_timeouts_total{phase=\"idle\"}", 1.0);

    // nothing of these reached the upstream, and a normal request still works
    assert!(up.seen.lock().unwrap().is_empty());
    let (st, _, body) = crate::common::http(
        &url,
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", "Bearer key-a"),
            ("content-type", "application/json"),
        ],
        CHAT,
    );
    assert_eq!(st, 200, "{body}");
}

fn chat(url: &str, path: &str) -> (u16, String) {
    let (st, _, body) = crate::common::http(
        url,
        "POST",
        path,
        &[
            ("authorization", "Bearer key-a"),
            ("content-type", "application/json"),
        ],
        CHAT,
    );
    (st, body)
}

#[test]
fn dot_segments_and_encoded_slashes_are_refused_before_forwarding() {
    let dir = tempfile::tempdir().unwrap();
    let up = recorder();
    let cfg = format!("credential_env = \"QSIM_TRUST_TEST_CRED\"\n{KEYS}");
    let path = dir.path().join("paths.toml");
    std::fs::write(&path, crate::common::proxy_config(&up.url, &cfg)).unwrap();
    let child = crate::common::qsim()
        .args(["proxy", "--threads", "2", "--config"])
        .arg(&path)
        .env("QSIM_TRUST_TEST_CRED", "sekrit")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut p = Proc(child);
    let url = crate::common::proxy_url(&mut p);
    for bad in [
        "/serving-endpoints/../x/invocations",
        "/serving-endpoints/./invocations",
        "/serving-endpoints/%2e%2e/invocations",
        "/serving-endpoints/.%2E/invocations",
        "/serving-endpoints/x%2F..%2Fy/invocations",
        "/serving-endpoints/x%2fy/invocations",
        "/serving-endpoints/x%5Cy/invocations",
        "/serving-endpoints/%252e%252e/invocations",
    ] {
        let (st, body) = chat(&url, bad);
        assert_eq!(st, 400, "{bad}: {body}");
        assert!(body.contains("\"code\":\"invalid_path\""), "{bad}: {body}");
        assert_eq!(body.lines().count(), 1, "{body}");
    }
    assert!(
        up.seen.lock().unwrap().is_empty(),
        "forwarded: {:?}",
        up.seen.lock().unwrap()
    );
    // a plain one is forwarded to the same path, with the credential
    let (st, body) = chat(&url, "/serving-endpoints/my-ep/invocations");
    assert_eq!(st, 200, "{body}");
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].0, "/serving-endpoints/my-ep/invocations");
    assert!(
        seen[0].1.contains("authorization: bearer sekrit"),
        "{seen:?}"
    );
}

#[test]
fn upstream_base_with_or_without_serving_endpoints() {
    let dir = tempfile::tempdir().unwrap();
    let up = recorder();
    for (name, base) in [
        ("bare", up.url.clone()),
        ("suffixed", format!("{}/serving-endpoints", up.url)),
        ("slash", format!("{}/serving-endpoints/", up.url)),
    ] {
        let (_p, url) = proxy(&dir, name, &base, KEYS);
        up.seen.lock().unwrap().clear();
        for path in [
            "/serving-endpoints/chat/completions",
            "/serving-endpoints/my-ep/invocations",
        ] {
            let (st, body) = chat(&url, path);
            assert_eq!(st, 200, "{name}: {path}: {body}");
        }
        let seen: Vec<String> = up
            .seen
            .lock()
            .unwrap()
            .iter()
            .map(|x| x.0.clone())
            .collect();
        assert_eq!(
            seen,
            [
                "/serving-endpoints/chat/completions",
                "/serving-endpoints/my-ep/invocations"
            ],
            "upstream {base}"
        );
    }
}

#[test]
fn credential_in_upstream_url_is_not_printed() {
    let dir = tempfile::tempdir().unwrap();
    let up = recorder();
    let base = up.url.replace("http://", "http://user:hunter2@");
    let (p, url) = proxy(&dir, "cred", &base, KEYS);
    let (st, _) = chat(&url, "/v1/chat/completions");
    assert_eq!(st, 200);
    crate::common::stop(p);
    let log = std::fs::read_to_string(dir.path().join("cred.log")).unwrap();
    assert!(log.contains("listening"), "{log}");
    assert!(!log.contains("hunter2"), "{log}");
    assert!(log.contains("***@127.0.0.1"), "{log}");
}

#[test]
fn redis_outage_is_logged_once_per_transition_not_per_request() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let up = recorder();
    let rport = crate::common::free_port();
    let redis = crate::common::redis_server(rport);
    let cfg = format!("state = \"redis://127.0.0.1:{rport}\"\nstate_fail = \"closed\"\n{KEYS}");
    let (p, url) = proxy(&dir, "outage", &up.url, &cfg);
    assert_eq!(chat(&url, "/v1/chat/completions").0, 200);
    drop(redis);
    let mut refused = 0;
    for _ in 0..30 {
        let (st, _) = chat(&url, "/v1/chat/completions");
        refused += usize::from(st == 503);
    }
    assert!(refused >= 20, "{refused} of 30 refused while redis is down");
    let _redis = crate::common::redis_server(rport);
    let t = Instant::now();
    while chat(&url, "/v1/chat/completions").0 != 200 {
        assert!(t.elapsed() < Duration::from_secs(60), "not back in 60 s");
        std::thread::sleep(Duration::from_millis(100));
    }
    for _ in 0..5 {
        assert_eq!(chat(&url, "/v1/chat/completions").0, 200);
    }
    crate::common::stop(p);
    let log = std::fs::read_to_string(dir.path().join("outage.log")).unwrap();
    let count = |needle: &str| log.lines().filter(|l| l.contains(needle)).count();
    assert_eq!(count("shared limiter state unreachable"), 1, "{log}");
    assert_eq!(count("reachable again"), 1, "{log}");
    assert_eq!(count("limiter state unavailable"), 0, "{log}");
    assert!(
        log.lines()
            .filter(|l| l.contains("WARN") || l.contains("ERROR"))
            .count()
            <= 2,
        "{log}"
    );
}

#[test]
fn a_waiting_client_that_leaves_is_counted_abandoned() {
    let dir = tempfile::tempdir().unwrap();
    let up = recorder();
    // one admission per minute: a second request is held ~60 s
    let cfg = KEYS.replace("capacity = 100000", "capacity = 1\nburst = 0");
    let cfg = format!("on_limit = \"wait\"\nmax_wait_s = 600\n{cfg}");
    let (_p, url) = proxy(&dir, "abandon", &up.url, &cfg);
    // the one admission per second: taken
    assert_eq!(chat(&url, "/v1/chat/completions").0, 200);
    let key = "qsim_proxy_waits_total{consumer=\"A\",outcome=\"abandoned\"}";
    // held, then the client leaves
    let host = url.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(host).unwrap();
    write!(
        s,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer key-a\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        CHAT.len()
    )
    .unwrap();
    s.write_all(CHAT).unwrap();
    // joined the queue (the gauge of waiting requests), then gone
    let t = Instant::now();
    loop {
        let m = metrics(&url);
        if metric(&m, "qsim_proxy_waiting") >= 1.0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "never held");
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(s);
    counted(&url, key, 1.0);
    let m = metrics(&url);
    assert_eq!(metric(&m, "qsim_proxy_waiting"), 0.0);
    assert_eq!(
        metric(
            &m,
            "qsim_proxy_waits_total{consumer=\"A\",outcome=\"admitted\"}"
        ),
        0.0
    );
}

#[test]
fn placeholder_keys_of_an_emitted_config_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("p.toml");
    let o = crate::common::qsim()
        .args(["plan", "--capacity", "1000", "--reserve", "30,20,30"])
        .arg("--emit-proxy-config")
        .arg(&cfg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let text = std::fs::read_to_string(&cfg).unwrap();
    // every setting is in it, as a comment with its default
    for s in [
        "header_read_timeout_s",
        "body_read_timeout_s",
        "max_body_bytes",
    ] {
        assert!(text.contains(&format!("# {s} ")), "{s}:\n{text}");
    }
    let (code, _, err) = crate::common::qsim_env(
        &[
            "proxy",
            "--config",
            cfg.to_str().unwrap(),
            "--listen",
            "127.0.0.1:0",
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(cfg.to_str().unwrap()), "{err}");
    assert!(err.contains("proxy.keys."), "{err}");
    assert!(err.contains("placeholder"), "{err}");
}

/// Start `qsim proxy` on `cfg` (its `[proxy.keys]` and limiter tables) in
/// front of the recording upstream.
fn trust_proxy(dir: &tempfile::TempDir, name: &str, up: &Recorder, cfg: &str) -> (Proc, String) {
    let path = dir.path().join(name);
    std::fs::write(&path, crate::common::proxy_config(&up.url, cfg)).unwrap();
    let child = crate::common::qsim()
        .args(["proxy", "--threads", "2", "--config"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut p = Proc(child);
    let url = crate::common::proxy_url(&mut p);
    (p, url)
}

fn post(url: &str, key: &str, body: &str) -> (u16, String) {
    let auth = format!("Bearer {key}");
    let (st, _, b) = crate::common::http(
        url,
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", &auth),
            ("content-type", "application/json"),
        ],
        body.as_bytes(),
    );
    (st, b)
}

/// Issue 26, cases 2 and 5: under a TPM limit (10,000 TPM, no burst, all
/// of it reserved for A: A's credits hold 5 s, 834 tokens, and the bucket
/// behind them 836, so A can never be admitted more than 835), `{"max_tokens": 1,
/// "max_completion_tokens": 90000}` was reserved 1 token and forwarded
/// (200), and `max_tokens` 10^12 was told "retry in 18446744070 s" (429,
/// type `requests`). Now the larger cap is what is reserved, and a request
/// that no wait can admit is a 400 that says so (nothing forwarded); a
/// consumer with no capacity at all (partitioned, everything reserved for
/// another) a 403.
#[test]
fn output_caps_are_all_reserved_and_what_never_fits_is_a_400() {
    let dir = tempfile::tempdir().unwrap();
    let up = recorder();
    let cfg = r#"
[proxy.keys]
A = ["key-a"]
B = ["key-b"]

[deployment]
capacity = 10000
unit = "tpm"
threshold = 1.0
semantics = "partitioned"

[[consumer]]
name = "A"
reserved_pct = 100

[[consumer]]
name = "B"
"#;
    let (_p, url) = trust_proxy(&dir, "tpm.toml", &up, cfg);
    let msg =
        |m: &str| format!(r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],{m}}}"#);
    let (st, body) = post(&url, "key-a", &msg(r#""max_tokens":4"#));
    assert_eq!(st, 200, "{body}");
    for m in [
        r#""max_tokens":1,"max_completion_tokens":90000"#,
        r#""max_tokens":null,"max_completion_tokens":90000"#,
        r#""max_tokens":1000000000000"#,
        r#""max_tokens":100,"n":50"#,
        // issue 41, case 1: these wrapped `input + max_tokens` to a few
        // tokens and were forwarded (200)
        r#""max_tokens":18446744073709551615"#,
        r#""max_tokens":18446744073709551614"#,
        r#""max_tokens":18446744073709551611"#,
        r#""max_completion_tokens":18446744073709551615"#,
        r#""max_output_tokens":18446744073709551613"#,
        r#""max_tokens":4,"n":9223372036854775808"#,
        r#""max_tokens":3,"best_of":6148914691236517206"#,
    ] {
        let (st, body) = post(&url, "key-a", &msg(m));
        assert_eq!(st, 400, "{m}: {body}");
        assert!(
            body.contains("\"code\":\"request_too_large\""),
            "{m}: {body}"
        );
        assert!(body.contains("can never hold more than"), "{m}: {body}");
        assert!(!body.contains("retry in"), "{m}: {body}");
    }
    // B: nothing unreserved under partitioned
    let (st, body) = post(&url, "key-b", &msg(r#""max_tokens":4"#));
    assert_eq!(st, 403, "{body}");
    assert!(body.contains("\"code\":\"no_capacity\""), "{body}");
    // issue 41, case 10: the scheme is case-insensitive (RFC 7235)
    let (st, _, body) = crate::common::http(
        &url,
        "POST",
        "/v1/chat/completions",
        &[
            ("authorization", "bearer key-a"),
            ("content-type", "application/json"),
        ],
        msg(r#""max_tokens":4"#).as_bytes(),
    );
    assert_eq!(st, 200, "{body}");
    // only the two requests that fit reached the upstream
    assert_eq!(up.seen.lock().unwrap().len(), 2);
}
