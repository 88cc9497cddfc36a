//! Acceptance (issue 12): `qsim replay experiments/fmapi-pacing.toml`
//! against `qsim serve models/databricks-claude-haiku-4-5.toml`, time-scaled,
//! then `qsim compare` with `qsim run` of the same file: for each
//! experiment, rows succeeded, elapsed, latency p50/p95, rows retried and
//! max attempts lie within 10 % of the simulated median or inside its 90 %
//! interval.
//!
//! Needs `qsim serve` in this binary: without it the test FAILS (it is not
//! skipped). 127.0.0.1 only; bounded: the suite is ≈ 250 model seconds
//! (two 70 s cool-downs included), ≈ 125 s at `TIME_SCALE` 2, and every
//! command has a deadline.
//!
//! Why 2 and not faster: each attempt's real-time overhead (both processes'
//! scheduling on a busy machine, ≈ 15–30 ms with 64 requests in flight on
//! the shared 2-core box) is multiplied by the time scale. Run on a merge of
//! the serve branch: at 10× exp 1's latency p50 came out +15 % and its
//! elapsed +19 %; at 4× 18 of 18 agreed once and 17 of 18 the next time
//! (exp 2's latency p50 +11.2 %); at 2× 18 of 18 (closest calls: exp 2's
//! latency p50 +8.9 %, inside the interval; exp 3's elapsed +8.2 %).
//!
//! To adapt: the serve invocation is [`start_serve`] (flags and the
//! `listening on URL` line), the knobs are the constants below.

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const TIME_SCALE: &str = "2";
const SEEDS: &str = "20";
const METRICS: &str = "ok,elapsed_s,latency_p50_s,latency_p95_s,retried,max_attempts";
const TOLERANCE: &str = "0.10";
const EXPERIMENTS: &[&str] = &["exp1-direct", "exp2-backoff", "exp3-ai-query"];

struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn qsim(args: &[&str], timeout: Duration) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qsim");
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("qsim {args:?} did not end in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// `qsim serve PROFILE --listen 127.0.0.1:0 --time-scale X --seed 1`; its
/// first stdout line is `listening on http://127.0.0.1:PORT`.
fn start_serve(profile: &str) -> (Proc, String) {
    let (code, _, stderr) = qsim(&["serve", "--help"], Duration::from_secs(20));
    assert_eq!(
        code,
        0,
        "`qsim serve` is missing from this build (qsim serve --help: exit {code}: {}): \
         this acceptance test needs the serve branch merged",
        stderr.trim()
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["serve", profile, "--listen", "127.0.0.1:0"])
        .args(["--time-scale", TIME_SCALE, "--seed", "1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qsim serve");
    let out = child.stdout.take().unwrap();
    let p = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("qsim serve did not print its address in 20 s");
    let url = line
        .trim()
        .rsplit("listening on ")
        .next()
        .filter(|u| u.starts_with("http://127.0.0.1:"))
        .unwrap_or_else(|| panic!("unexpected first line of qsim serve: {line:?}"))
        .to_string();
    (p, url)
}

#[test]
fn replay_against_qsim_serve_agrees_with_the_simulation() {
    let dir = tempfile::tempdir().unwrap();
    let exp = format!("{ROOT}/experiments/fmapi-pacing.toml");
    let profile = format!("{ROOT}/models/databricks-claude-haiku-4-5.toml");
    let (_serve, url) = start_serve(&profile);
    let out = dir.path().join("replay");
    let (code, report, stderr) = qsim(
        &[
            "replay",
            &exp,
            "--target",
            &url,
            "--time-scale",
            TIME_SCALE,
            "--timeout",
            "1200s",
            "--out",
            out.to_str().unwrap(),
        ],
        Duration::from_secs(180),
    );
    assert_eq!(code, 0, "qsim replay: {stderr}");
    eprintln!("{report}");
    let sim = dir.path().join("sim.csv");
    let (code, _, stderr) = qsim(
        &[
            "run",
            &exp,
            "--seeds",
            SEEDS,
            "--format",
            "csv",
            "--out",
            sim.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert_eq!(code, 0, "qsim run: {stderr}");
    let (code, table, stderr) = qsim(
        &[
            "compare",
            sim.to_str().unwrap(),
            out.join("summary.csv").to_str().unwrap(),
            "--metric",
            METRICS,
            "--tolerance",
            TOLERANCE,
        ],
        Duration::from_secs(20),
    );
    assert_eq!(code, 0, "qsim compare: {stderr}");
    eprintln!("{table}");
    let (_, json, _) = qsim(
        &[
            "compare",
            sim.to_str().unwrap(),
            out.join("summary.csv").to_str().unwrap(),
            "--metric",
            METRICS,
            "--tolerance",
            TOLERANCE,
            "--format",
            "json",
        ],
        Duration::from_secs(20),
    );
    let v: Value = serde_json::from_str(&json).unwrap();
    let rows = v["metrics"].as_array().unwrap();
    let n_metrics = METRICS.split(',').count();
    assert_eq!(rows.len(), EXPERIMENTS.len() * n_metrics, "{table}");
    let bad: Vec<&Value> = rows.iter().filter(|m| m["agrees"] != true).collect();
    assert!(
        bad.is_empty(),
        "outside the 90 % interval and off by more than 10 %:\n{table}"
    );
}
