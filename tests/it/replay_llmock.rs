//! `qsim replay` of the FMAPI pacing article's experiments 1 and 2 against a
//! third-party endpoint, `llmock` (PyPI, from the venv `scripts/live-deps.sh`
//! installs; missing, the test fails loudly), on 127.0.0.1 only, bounded
//! (≈ 30 s of real time, ≈ 220 requests).
//!
//! llmock's per-key token bucket is the article's quota shape: a 20,000-token
//! bucket that refills in a minute, charged `request bytes / 4 + max_tokens`
//! at admission and never refunded, 429 with `retry-after-ms`. Its window is
//! a real minute and cannot be scaled, so the client runs `TIME_SCALE`×
//! faster instead (`--time-scale`): seen from the client's model time the
//! bucket refills in 60·`TIME_SCALE` s. The simulation of the same
//! experiments runs against the llmock-equivalent hosted profile written
//! below (that bucket, that hint, llmock's latency measured once), and:
//!
//! - the observed 429 pattern matches the simulation's: surfaced failures in
//!   experiment 1, none in experiment 2, and `qsim compare` finds the rows
//!   succeeded, 429s surfaced and HTTP requests of both inside the
//!   simulated 90 % interval or within 20 % of its median;
//! - the replay's attempt log agrees with llmock's own journal of the
//!   exchanges: the same number of requests, the same statuses, row by row.

use crate::common::{http_json, llmock, qsim_env as qsim, read_csv};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const TIME_SCALE: f64 = 4.0;
const ROWS: u32 = 50;
const TPM: u32 = 20_000;
const LATENCY_MS: u32 = 100;

/// One HTTP/1.1 request to llmock's admin API: the JSON answer.
fn admin(base: &str, method: &str, path: &str) -> Value {
    http_json(base, method, path).1
}

fn metric(summary: &[BTreeMap<String, String>], exp: &str, m: &str) -> f64 {
    summary
        .iter()
        .find(|r| r["subject"] == exp && r["metric"] == m)
        .unwrap_or_else(|| panic!("no {exp}/{m} in the summary"))["value"]
        .parse()
        .unwrap()
}

/// The llmock-equivalent hosted profile: llmock's TPM bucket as qsim sees it
/// from the client's model time (window 60 s × the time scale), its
/// `retry-after-ms` hint, and its latency (`--latency-ms` plus the queueing
/// of a 64-request burst in one Python process, measured once: p50 ≈ 0.12 s,
/// p95 ≈ 0.6 s real for answers, p50 ≈ 0.11 s, p95 ≈ 0.45 s for 429s).
fn equivalent_profile(dir: &Path) -> PathBuf {
    let x = TIME_SCALE;
    let text = format!(
        r#"kind = "hosted"
name = "llmock-tpm"
description = "llmock serve --tpm {TPM} --latency-ms {LATENCY_MS}, seen from a client at --time-scale {x}"
[[limits]]
name = "TPM"
counts = "tokens"
limit = {TPM}
window_s = {window}
accounting = "reserve_no_refund"
[rejection]
hint = "retry_after_ms"
latency = {{ dist = "lognormal", p50 = {rp50}, p95 = {rp95} }}
[latency]
ttft = {{ dist = "lognormal", p50 = {p50}, p95 = {p95} }}
tpot = {{ dist = "const", value = 0.0 }}
"#,
        window = 60.0 * x,
        rp50 = 0.11 * x,
        rp95 = 0.45 * x,
        p50 = 0.12 * x,
        p95 = 0.6 * x,
    );
    let p = dir.join("llmock-equivalent.toml");
    std::fs::write(&p, text).unwrap();
    p
}

/// The row a journaled request was for ("Summarise review {i} in …").
fn row_of(body: &Value) -> u64 {
    let c = body
        .pointer("/messages/0/content")
        .and_then(Value::as_str)
        .expect("a chat request");
    c.strip_prefix("Summarise review ")
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("not a generated prompt: {c:.60}"))
}

#[test]
fn replay_of_experiments_1_and_2_against_llmock_matches_the_simulation_and_the_journal() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let (_llmock, url) = llmock(&[
        "--tpm",
        &TPM.to_string(),
        "--latency-ms",
        &LATENCY_MS.to_string(),
    ]);
    let exp = concat!(env!("CARGO_MANIFEST_DIR"), "/experiments/fmapi-pacing.toml");
    let rows = format!("rows={ROWS}");
    let scale = TIME_SCALE.to_string();
    let mut input_mean = Vec::new();
    for (name, key) in [("exp1-direct", "key-exp1"), ("exp2-backoff", "key-exp2")] {
        // a fresh bucket per experiment: llmock keeps one per API key
        admin(&url, "DELETE", "/_llmock/requests");
        let out = dir.path().join(name);
        let (code, stdout, stderr) = qsim(
            &[
                "replay",
                exp,
                "--target",
                &url,
                "--token-env",
                "LLMOCK_KEY",
                "--only",
                name,
                "--set",
                &rows,
                "--time-scale",
                &scale,
                "--timeout",
                "600s",
                "--out",
                out.to_str().unwrap(),
            ],
            &[("LLMOCK_KEY", key)],
            Duration::from_secs(120),
        );
        assert_eq!(code, 0, "qsim replay {name}: {stderr}");
        eprintln!("{stdout}");
        let journal = admin(&url, "GET", "/_llmock/requests");
        let records = journal["requests"].as_array().expect("llmock journal");
        let attempts = read_csv(&out.join("attempts.csv"));
        // the same exchanges, counted and by status, row by row
        assert_eq!(attempts.len(), records.len(), "{name}: attempts vs journal");
        let mut ours: BTreeMap<(u64, String), u32> = BTreeMap::new();
        for a in &attempts {
            *ours
                .entry((a["row"].parse().unwrap(), a["status"].clone()))
                .or_default() += 1;
        }
        let mut theirs: BTreeMap<(u64, String), u32> = BTreeMap::new();
        let mut bytes = Vec::new();
        for r in records {
            *theirs
                .entry((row_of(&r["body"]), r["status"].to_string()))
                .or_default() += 1;
            bytes.push(serde_json::to_string(&r["body"]).unwrap().len() as f64);
        }
        assert_eq!(
            ours, theirs,
            "{name}: (row, status) counts differ from llmock's journal"
        );
        // llmock charges request bytes / 4 as the prompt: the simulation's
        // input tokens are that, measured from the requests (not the results)
        input_mean.push(bytes.iter().map(|b| (b / 4.0).floor()).sum::<f64>() / bytes.len() as f64);
        let rows_out = read_csv(&out.join("rows.csv"));
        assert_eq!(
            rows_out.len(),
            ROWS as usize,
            "{name}: every row is in rows.csv"
        );
    }
    let s1 = read_csv(&dir.path().join("exp1-direct/summary.csv"));
    let s2 = read_csv(&dir.path().join("exp2-backoff/summary.csv"));
    // observed pattern: surfaced failures in exp 1, none in exp 2
    let (ok1, rej1) = (
        metric(&s1, "exp1-direct", "ok"),
        metric(&s1, "exp1-direct", "rejected_429"),
    );
    let (ok2, rej2) = (
        metric(&s2, "exp2-backoff", "ok"),
        metric(&s2, "exp2-backoff", "rejected_429"),
    );
    assert!(
        rej1 > 0.0 && ok1 + rej1 == ROWS as f64,
        "exp1 observed: {ok1} ok, {rej1} 429"
    );
    assert_eq!((ok2, rej2), (ROWS as f64, 0.0), "exp2 observed");
    assert!(
        metric(&s2, "exp2-backoff", "retried") > 0.0,
        "exp2 needed its backoff"
    );

    // the simulation of the llmock-equivalent profile
    let profile = equivalent_profile(dir.path());
    let mean = input_mean.iter().sum::<f64>() / input_mean.len() as f64;
    let sim = dir.path().join("sim.csv");
    let (code, _, stderr) = qsim(
        &[
            "run",
            exp,
            "--set",
            &format!("endpoint={}", profile.display()),
            "--set",
            &rows,
            "--set",
            &format!("input_tokens.mean={mean:.1}"),
            "--only",
            "exp1-direct",
            "--seeds",
            "20",
            "--format",
            "csv",
            "--out",
            sim.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{stderr}");
    let sim2 = dir.path().join("sim2.csv");
    let (code, _, stderr) = qsim(
        &[
            "run",
            exp,
            "--set",
            &format!("endpoint={}", profile.display()),
            "--set",
            &rows,
            "--set",
            &format!("input_tokens.mean={mean:.1}"),
            "--only",
            "exp2-backoff",
            "--seeds",
            "20",
            "--format",
            "csv",
            "--out",
            sim2.to_str().unwrap(),
        ],
        &[],
        Duration::from_secs(60),
    );
    assert_eq!(code, 0, "{stderr}");
    for (sim, obs) in [
        (&sim, dir.path().join("exp1-direct/summary.csv")),
        (&sim2, dir.path().join("exp2-backoff/summary.csv")),
    ] {
        let (code, stdout, stderr) = qsim(
            &[
                "compare",
                sim.to_str().unwrap(),
                obs.to_str().unwrap(),
                "--metric",
                "ok,rejected_429,http_requests",
                "--tolerance",
                "0.2",
                "--format",
                "json",
            ],
            &[],
            Duration::from_secs(20),
        );
        assert_eq!(code, 0, "{stderr}");
        let v: Value = serde_json::from_str(&stdout).unwrap();
        let ms = v["metrics"].as_array().unwrap();
        assert_eq!(ms.len(), 3, "{stdout}");
        for m in ms {
            // the pattern: a 429 surfaced in the simulation iff observed
            if m["metric"] == "rejected_429" {
                let pred = m["predicted"].as_f64().unwrap();
                let obs = m["observed"].as_f64().unwrap();
                assert_eq!(pred > 0.0, obs > 0.0, "{m}");
            }
            assert!(
                m["agrees"].as_bool().unwrap(),
                "prediction vs observation: {m}"
            );
        }
    }
}
