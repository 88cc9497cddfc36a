//! Acceptance (issue 12): `qsim replay experiments/fmapi-pacing.toml`
//! against `qsim serve models/databricks-claude-haiku-4-5.toml`, then `qsim
//! compare` with `qsim run` of the same file: for each experiment, rows
//! succeeded, elapsed, latency p50/p95, rows retried and max attempts lie
//! within 10 % of the simulated median or inside its 90 % interval. Every
//! one of the 18 (experiment, metric) pairs is asserted.
//!
//! Needs `qsim serve` in this binary: without it the test FAILS (it is not
//! skipped). 127.0.0.1 only; bounded: the suite is ≈ 250 model seconds (two
//! 70 s cool-downs included), run in real time, and every command has a
//! deadline.
//!
//! **Several draws, at once.** One replay is one draw of a noisy system:
//! which rows meet a 429 depends on arrival order to the millisecond, and a
//! `qsim serve --seed` fixes one realisation of the answer lengths. Even the
//! simulation's own seeds, taken one at a time against a 100-seed
//! reference, break this rule on at least one of the 18 pairs in 19 % of
//! draws (exp 1's elapsed 7.8 %, its p95 5.1 %, exp 3's p95 3.0 %, exp 2's
//! p50 2.2 %: 2,000 draws from seeds 101–300 of `qsim run --seeds 300`);
//! the median of three draws breaks it in 1.3 %, of five in 0.2 %. So the
//! test runs [`DRAWS`] independent pairs at once — `qsim serve --seed k`
//! and `qsim replay --seed k`, k = 1…5, each its own endpoint (its own
//! quota) — and `qsim compare` takes the five summaries as five runs,
//! comparing their median. The pairs share the machine but little CPU
//! (≈ 4 CPU-s per serve, 0.3 per replay over the 245 s).
//!
//! Why real time (`TIME_SCALE` 1): each attempt's real-time overhead (both
//! processes' scheduling; ≈ 0.5 ms per attempt on the 2-core box) is
//! multiplied by the time scale; at 2× a run gave exp 2's p50 +12.4 %.
//! `tests/serve_virtual.rs` checks, without real time, that `qsim serve`'s
//! model keeps the simulation's semantics (40 seeds within 1.6 %), and
//! shows what a single fixed pair meets (serve seed 1: exp 2's p50 +6 %
//! over the simulated median, 2 of 40 timing-noise runs past the bound).

use crate::common::serve as serve_helpers;

use serde_json::Value;
use serve_helpers::{qsim, serve};
use std::path::Path;
use std::time::Duration;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const TIME_SCALE: f64 = 1.0;
/// The simulated reference: 100 seeds, so that its 90 % interval is one
/// (20 seeds' interval held only 81–86 % of new draws: tests/serve_virtual.rs).
const SEEDS: &str = "100";
const METRICS: &str = "ok,elapsed_s,latency_p50_s,latency_p95_s,retried,max_attempts";
const TOLERANCE: &str = "0.10";
const EXPERIMENTS: &[&str] = &["exp1-direct", "exp2-backoff", "exp3-ai-query"];
/// Independent (serve, replay) pairs run at once; their median is compared.
const DRAWS: u64 = 5;

#[test]
fn replay_against_qsim_serve_agrees_with_the_simulation() {
    crate::live!();
    let dir = tempfile::tempdir().unwrap();
    let exp = format!("{ROOT}/experiments/fmapi-pacing.toml");
    let profile = format!("{ROOT}/models/databricks-claude-haiku-4-5.toml");
    let (code, _, stderr) = qsim(&["serve", "--help"], Duration::from_secs(20));
    assert_eq!(
        code,
        0,
        "`qsim serve` is missing from this build: {}",
        stderr.trim()
    );
    let serves: Vec<_> = (1..=DRAWS)
        .map(|k| serve(Path::new(&profile), TIME_SCALE, k))
        .collect();
    let replays: Vec<_> = serves
        .iter()
        .zip(1..=DRAWS)
        .map(|((_, url), k)| {
            let out = dir.path().join(format!("replay{k}"));
            let (exp, url, o) = (exp.clone(), url.clone(), out.clone());
            let h = std::thread::spawn(move || {
                qsim(
                    &[
                        "replay",
                        &exp,
                        "--target",
                        &url,
                        "--time-scale",
                        &TIME_SCALE.to_string(),
                        "--seed",
                        &k.to_string(),
                        "--timeout",
                        "1200s",
                        "--out",
                        o.to_str().unwrap(),
                    ],
                    Duration::from_secs(600),
                )
            });
            (out, h)
        })
        .collect();
    let mut summaries = Vec::new();
    for (k, (out, h)) in (1..=DRAWS).zip(replays) {
        let (code, report, stderr) = h.join().unwrap();
        assert_eq!(code, 0, "qsim replay --seed {k}: {stderr}");
        if k == 1 {
            eprintln!("{report}");
        }
        summaries.push(out.join("summary.csv").to_str().unwrap().to_string());
    }
    drop(serves);
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
    let compare = |extra: &[&str]| {
        let mut a = vec!["compare", sim.to_str().unwrap()];
        a.extend(summaries.iter().map(String::as_str));
        a.extend_from_slice(&["--metric", METRICS, "--tolerance", TOLERANCE]);
        a.extend_from_slice(extra);
        qsim(&a, Duration::from_secs(20))
    };
    // each draw alone, for the log
    for s in &summaries {
        let (_, t, _) = qsim(
            &[
                "compare",
                sim.to_str().unwrap(),
                s,
                "--metric",
                METRICS,
                "--tolerance",
                TOLERANCE,
            ],
            Duration::from_secs(20),
        );
        eprintln!("{s}: {}", t.lines().last().unwrap_or(""));
    }
    let (code, table, stderr) = compare(&[]);
    assert_eq!(code, 0, "qsim compare: {stderr}");
    eprintln!("{table}");
    let (_, json, _) = compare(&["--format", "json"]);
    let v: Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["observed_seeds"], DRAWS, "{json}");
    let rows = v["metrics"].as_array().unwrap();
    let n_metrics = METRICS.split(',').count();
    assert_eq!(rows.len(), EXPERIMENTS.len() * n_metrics, "{table}");
    let bad: Vec<&Value> = rows.iter().filter(|m| m["agrees"] != true).collect();
    assert!(
        bad.is_empty(),
        "outside the 90 % interval and off by more than 10 %:\n{table}"
    );
}
