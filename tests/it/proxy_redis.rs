//! Three `qsim proxy` replicas sharing one limiter state in a real
//! `redis-server` (Debian package, installed by scripts/live-deps.sh) in
//! front of `llmock` (PyPI), on 127.0.0.1 only, bounded in requests and time:
//! one global budget across the replicas; Redis stopped → each replica's
//! configured fail mode (closed: 503; open: forwarded unlimited), logged;
//! Redis restarted → enforcement resumes, logged.

use crate::common::{free_port, llmock, proxy_url, redis_server as redis, Proc};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A proxy replica; its stderr (the tracing log) goes to `log`.
fn replica(dir: &Path, name: &str, upstream: &str, redis_port: u16, fail: &str) -> (Proc, String) {
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(
        &cfg,
        format!(
            "kind = \"proxy\"\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"{upstream}\"\n\
             state = \"redis://127.0.0.1:{redis_port}\"\nstate_fail = \"{fail}\"\n{LIMITER}"
        ),
    )
    .unwrap();
    let log = std::fs::File::create(dir.join(format!("{name}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["proxy", "--threads", "1", "--config"])
        .arg(&cfg)
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start qsim proxy");
    let mut p = Proc(child);
    let url = proxy_url(&mut p);
    let addr = url.strip_prefix("http://").unwrap().to_string();
    (p, addr)
}

/// Capacity 60/min plus a burst of 300: over a test of T seconds the
/// deployment admits at most 300 + T (+1 for the replicas' clock spread).
const CAPACITY_PER_MIN: f64 = 60.0;
const BURST: f64 = 300.0;
const LIMITER: &str = r#"
[proxy.keys]
A = ["key-a"]
B = ["key-b"]

[deployment]
capacity = 60
burst = 300

[[consumer]]
name = "A"
reserved_pct = 20

[[consumer]]
name = "B"
"#;

/// One chat request on a fresh connection: (status, body).
fn chat(addr: &str, key: &str) -> (u16, String) {
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#;
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\
         content-type: application/json\r\nauthorization: Bearer {key}\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut resp = Vec::new();
    let _ = s.read_to_end(&mut resp);
    let text = String::from_utf8_lossy(&resp).to_string();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|x| x.1).unwrap_or("");
    (status, body.to_string())
}

/// Sum of the `qsim_proxy_admitted_total` counters of every replica.
fn admitted(replicas: &[String]) -> f64 {
    let mut sum = 0.0;
    for r in replicas {
        let mut s = TcpStream::connect(r.as_str()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(
            format!("GET /metrics HTTP/1.1\r\nhost: {r}\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .unwrap();
        let mut t = String::new();
        let _ = s.read_to_string(&mut t);
        sum += t
            .lines()
            .filter(|l| l.starts_with("qsim_proxy_admitted_total"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
    }
    sum
}

/// 600 requests from 12 threads, spread over the replicas and both
/// consumers: (statuses, seconds from the first send to the last answer).
fn burst(replicas: &[String]) -> (Vec<u16>, f64) {
    let replicas = Arc::new(replicas.to_vec());
    let t0 = Instant::now();
    let hs: Vec<_> = (0..12)
        .map(|i| {
            let rs = replicas.clone();
            std::thread::spawn(move || {
                (0..50)
                    .map(|j| {
                        let key = if (i + j) % 2 == 0 { "key-a" } else { "key-b" };
                        chat(&rs[(i + j) % rs.len()], key).0
                    })
                    .collect::<Vec<u16>>()
            })
        })
        .collect();
    let st: Vec<u16> = hs.into_iter().flat_map(|h| h.join().unwrap()).collect();
    (st, t0.elapsed().as_secs_f64())
}

fn check_budget(what: &str, admitted: f64, ok: usize, secs: f64) {
    let bound = BURST + CAPACITY_PER_MIN * secs / 60.0;
    eprintln!("{what}: admitted {admitted} (forwarded 200: {ok}) in {secs:.2} s; capacity + burst over that time = {bound:.1}");
    // strict floors keep A's accruing credit (one unit) out of B's reach
    assert!(
        admitted >= BURST * 0.99,
        "{what}: the burst was not used: {admitted}"
    );
    assert!(
        admitted <= bound * 1.01 + 1.0,
        "{what}: {admitted} admitted across 3 replicas, over {bound:.1} + 1 %"
    );
}

fn log_has(dir: &Path, name: &str, needle: &str) -> bool {
    std::fs::read_to_string(dir.join(format!("{name}.log")))
        .unwrap_or_default()
        .contains(needle)
}

#[test]
fn three_replicas_share_one_budget_in_redis_fail_modes_and_recovery() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let rport = free_port();
    let mut rs = Some(redis(rport));
    let (_up, up) = llmock(&[]);
    let names = ["r0", "r1", "r2"];
    let fails = ["closed", "closed", "open"];
    let procs: Vec<(Proc, String)> = names
        .iter()
        .zip(fails)
        .map(|(n, f)| replica(dir.path(), n, &up, rport, f))
        .collect();
    let addrs: Vec<String> = procs.iter().map(|p| p.1.clone()).collect();

    // 1. one budget across the replicas
    let (st, secs) = burst(&addrs);
    assert!(
        st.iter().all(|s| *s == 200 || *s == 429),
        "every request answered, forwarded or limited: {st:?}"
    );
    let ok = st.iter().filter(|s| **s == 200).count();
    let a1 = admitted(&addrs);
    assert_eq!(a1 as usize, ok, "admitted = forwarded with 200");
    check_budget("redis up", a1, ok, secs);

    // 2. Redis stopped: closed replicas answer 503, the open one forwards unlimited
    drop(rs.take());
    for _ in 0..10 {
        let (s, body) = chat(&addrs[0], "key-a");
        assert_eq!(s, 503, "fail closed: {body}");
        assert!(body.contains("limiter_state_unavailable"), "{body}");
    }
    let open: Vec<u16> = (0..10).map(|_| chat(&addrs[2], "key-b").0).collect();
    assert!(
        open.iter().all(|s| *s == 200),
        "fail open: forwarded although the budget is spent: {open:?}"
    );
    assert!(log_has(dir.path(), "r0", "failing closed"));
    assert!(log_has(dir.path(), "r2", "failing open"));

    // 3. Redis restarted (empty: --save ''): the state starts full again and
    // every replica enforces it once more
    rs = Some(redis(rport));
    std::thread::sleep(Duration::from_millis(400));
    let a_before = admitted(&addrs);
    let t0 = Instant::now();
    for (i, a) in addrs.iter().enumerate() {
        let (s, body) = chat(a, "key-a");
        assert_eq!(s, 200, "replica {i} after the restart: {body}");
        // r1 met no request during the outage: nothing to resume
        if i != 1 {
            assert!(
                log_has(dir.path(), names[i], "enforcement resumes"),
                "{} logs the recovery",
                names[i]
            );
        }
    }
    let (st, _) = burst(&addrs);
    let secs = t0.elapsed().as_secs_f64();
    assert!(st.iter().all(|s| *s == 200 || *s == 429), "{st:?}");
    let a3 = admitted(&addrs) - a_before;
    let ok = st.iter().filter(|s| **s == 200).count() + 3;
    assert_eq!(a3 as usize, ok, "admitted = forwarded with 200");
    check_budget("redis restarted", a3, ok, secs);
    drop(rs);
}
