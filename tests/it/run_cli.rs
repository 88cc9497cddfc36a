//! `qsim run` and `qsim sweep` end to end: determinism, seeds, overrides and
//! invalid input (exit 2 naming the file, the field and the reason).

use crate::common::qsim;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn run_json(args: &[&str]) -> serde_json::Value {
    let out = qsim().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "qsim {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

const EXP: &str = "experiments/fmapi-pacing.toml";

#[test]
fn same_seed_gives_identical_json() {
    let a = qsim()
        .args(["run", EXP, "--seed", "7", "--format", "json"])
        .output()
        .unwrap();
    let b = qsim()
        .args(["run", EXP, "--seed", "7", "--format", "json"])
        .output()
        .unwrap();
    assert!(a.status.success());
    assert!(!a.stdout.is_empty());
    assert_eq!(
        a.stdout, b.stdout,
        "same seed must give byte-identical output"
    );
}

#[test]
fn different_seeds_differ() {
    let a = run_json(&["run", EXP, "--seed", "1", "--format", "json"]);
    let b = run_json(&["run", EXP, "--seed", "2", "--format", "json"]);
    assert_ne!(a["experiments"], b["experiments"]);
}

#[test]
fn json_has_the_article_fields() {
    let v = run_json(&["run", EXP, "--format", "json"]);
    let exps = v["experiments"].as_array().unwrap();
    assert_eq!(exps.len(), 3);
    for e in exps {
        for k in [
            "name",
            "elapsed_s",
            "ok",
            "total",
            "rejected_429",
            "latency_p50_s",
            "latency_p95_s",
            "own_wait_s",
            "output_tokens",
            "throughput_rows_per_s",
            "retried",
            "max_attempts",
            "max_wait_s",
        ] {
            assert!(e.get(k).is_some(), "missing {k} in {e}");
        }
        assert_eq!(e["total"], 200);
    }
}

/// The FMAPI pacing article's table, 20 seeds, default modelling choices.
#[test]
fn reproduces_the_article_within_tolerance() {
    let v = run_json(&["run", EXP, "--seeds", "20", "--format", "json"]);
    let e = &v["experiments"];
    let f = |i: usize, k: &str| e[i][k].as_f64().unwrap();
    let within = |x: f64, target: f64, tol: f64| (x - target).abs() <= tol * target;
    // experiment 1: direct, no own retry
    assert!(within(f(0, "ok"), 143.0, 0.15), "exp1 ok {}", f(0, "ok"));
    assert!(
        within(f(0, "elapsed_s"), 8.4, 0.15),
        "exp1 elapsed {}",
        f(0, "elapsed_s")
    );
    assert!(
        within(f(0, "latency_p50_s"), 1.81, 0.15),
        "exp1 p50 {}",
        f(0, "latency_p50_s")
    );
    assert!(
        within(f(0, "latency_p95_s"), 3.16, 0.15),
        "exp1 p95 {}",
        f(0, "latency_p95_s")
    );
    // experiment 2: own exponential backoff
    assert_eq!(f(1, "ok"), 200.0);
    assert!(
        within(f(1, "elapsed_s"), 48.3, 0.20),
        "exp2 elapsed {}",
        f(1, "elapsed_s")
    );
    assert!(
        within(f(1, "latency_p95_s"), 42.83, 0.20),
        "exp2 p95 {}",
        f(1, "latency_p95_s")
    );
    assert!(
        within(f(1, "own_wait_s"), 1094.7, 0.20),
        "exp2 own wait {}",
        f(1, "own_wait_s")
    );
    let ma = f(1, "max_attempts");
    assert!((5.0..=7.0).contains(&ma), "exp2 max attempts {ma}");
    // experiment 3: managed executor
    assert_eq!(f(2, "ok"), 200.0);
    assert_eq!(f(2, "rejected_429"), 0.0);
    assert!(
        within(f(2, "elapsed_s"), 53.2, 0.20),
        "exp3 elapsed {}",
        f(2, "elapsed_s")
    );
}

/// The article's predictions: halving max_tokens means fewer 429s, and
/// there is a worker count below which no 429 occurs.
#[test]
fn max_tokens_and_workers_effects() {
    let v = run_json(&[
        "sweep",
        EXP,
        "--vary",
        "max_tokens=128,256",
        "--vary",
        "workers=8,64",
        "--seeds",
        "5",
        "--format",
        "json",
    ]);
    let pts = v["points"].as_array().unwrap();
    let http429 = |i: usize| pts[i]["experiments"][0]["http_429"].as_f64().unwrap();
    // points: (128,8) (128,64) (256,8) (256,64)
    assert_eq!(
        http429(0),
        0.0,
        "8 workers at 128 tokens never hit the limit"
    );
    assert_eq!(
        http429(2),
        0.0,
        "8 workers at 256 tokens never hit the limit"
    );
    assert!(
        http429(1) > 0.0 && http429(3) > http429(1),
        "128 tokens: fewer 429s than 256 at 64 workers"
    );
}

#[test]
fn set_overrides_change_the_run() {
    let v = run_json(&[
        "run",
        EXP,
        "--set",
        "workers=4",
        "--set",
        "rows=20",
        "--format",
        "json",
    ]);
    assert_eq!(v["experiments"][0]["total"], 20);
    assert_eq!(v["experiments"][0]["rejected_429"], 0);
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A copy of the shipped experiment with `edit` applied, next to a copy of its profile.
fn variant(
    dir: &Path,
    edit: impl Fn(String) -> String,
    profile_edit: impl Fn(String) -> String,
) -> PathBuf {
    let exp = std::fs::read_to_string(root().join(EXP)).unwrap();
    let prof =
        std::fs::read_to_string(root().join("models/databricks-claude-haiku-4-5.toml")).unwrap();
    write(dir, "profile.toml", &profile_edit(prof));
    let exp = exp.replace("../models/databricks-claude-haiku-4-5.toml", "profile.toml");
    write(dir, "exp.toml", &edit(exp))
}

fn expect_exit2(file: &Path, needles: &[&str]) {
    let out = qsim()
        .args(["run", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "no partial output on error");
    let err = String::from_utf8_lossy(&out.stderr);
    for n in needles {
        assert!(err.contains(n), "stderr {err:?} lacks {n:?}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn unknown_field_is_rejected() {
    let d = tempfile::tempdir().unwrap();
    let f = variant(
        d.path(),
        |s| s.replace("rows = 200", "rows = 200\nrowz = 3"),
        |p| p,
    );
    expect_exit2(&f, &["exp.toml", "rowz", "unknown field"]);
}

#[test]
fn negative_limit_is_rejected() {
    let d = tempfile::tempdir().unwrap();
    let f = variant(
        d.path(),
        |s| s,
        |p| p.replace("limit = 20000\n", "limit = -20000\n"),
    );
    expect_exit2(&f, &["profile.toml", "limits.OTPM.limit", "must be > 0"]);
}

#[test]
fn zero_max_tokens_is_rejected() {
    let d = tempfile::tempdir().unwrap();
    let f = variant(
        d.path(),
        |s| s.replace("max_tokens = 256", "max_tokens = 0"),
        |p| p,
    );
    expect_exit2(&f, &["exp.toml", "max_tokens", "must be > 0"]);
}

#[test]
fn missing_endpoint_profile_is_rejected() {
    let d = tempfile::tempdir().unwrap();
    let f = variant(d.path(), |s| s.replace("profile.toml", "nope.toml"), |p| p);
    expect_exit2(&f, &["exp.toml", "endpoint", "not found", "nope.toml"]);
    let f = variant(
        d.path(),
        |s| s.replace("endpoint = \"profile.toml\"", ""),
        |p| p,
    );
    expect_exit2(&f, &["exp.toml", "endpoint", "missing field"]);
}

#[test]
fn bad_flags_exit_2() {
    for args in [
        vec!["run", EXP, "--set", "nosuch.path=1"],
        vec!["run", EXP, "--set", "workers"],
        vec!["run", EXP, "--set", "workers=-3"],
        vec!["run", EXP, "--seeds", "0"],
        vec!["run", "experiments/does-not-exist.toml"],
        vec!["sweep", EXP, "--vary", "workers"],
    ] {
        let out = qsim().args(&args).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
    }
}

#[test]
fn out_file_is_written_whole_or_not_at_all() {
    let d = tempfile::tempdir().unwrap();
    let target = d.path().join("r.json");
    assert!(qsim()
        .args([
            "run",
            EXP,
            "--format",
            "json",
            "--out",
            target.to_str().unwrap(),
        ])
        .status()
        .unwrap()
        .success());
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&target).unwrap()).unwrap();
    assert_eq!(v["experiments"].as_array().unwrap().len(), 3);
    let bad = d.path().join("bad.json");
    let out = qsim()
        .args([
            "run",
            EXP,
            "--set",
            "max_tokens=0",
            "--out",
            bad.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(!bad.exists());
    assert_eq!(
        std::fs::read_dir(d.path()).unwrap().count(),
        1,
        "no temp files left"
    );
}

#[test]
fn only_runs_a_subset_with_the_same_draws() {
    let all = run_json(&[
        "run",
        EXP,
        "--seed",
        "3",
        "--format",
        "json",
        "--set",
        "cooldown_s=600",
    ]);
    let one = run_json(&[
        "run",
        EXP,
        "--seed",
        "3",
        "--format",
        "json",
        "--only",
        "exp2-backoff",
        "--set",
        "cooldown_s=600",
    ]);
    assert_eq!(one["experiments"].as_array().unwrap().len(), 1);
    assert_eq!(one["experiments"][0], all["experiments"][1]);
    let out = qsim()
        .args(["run", EXP, "--only", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--only"));
}

/// Every shipped experiment file loads and runs (one seed).
#[test]
fn all_shipped_experiments_run() {
    let mut n = 0;
    for entry in std::fs::read_dir(root().join("experiments")).unwrap() {
        let p = entry.unwrap().path();
        if p.extension().and_then(|e| e.to_str()) != Some("toml") {
            continue;
        }
        // options files run with `qsim options` (tests/it/options.rs)
        if std::fs::read_to_string(&p)
            .unwrap()
            .contains("kind = \"options\"")
        {
            continue;
        }
        let out = qsim()
            .args([
                "run",
                p.to_str().unwrap(),
                "--format",
                "json",
                "--set",
                "rows=40",
            ])
            .output()
            .unwrap();
        // files without a top-level `rows` (or that take no --set) reject
        // the override; run them as they are
        let out = if out.status.code() == Some(2) {
            qsim()
                .args(["run", p.to_str().unwrap(), "--format", "json"])
                .output()
                .unwrap()
        } else {
            out
        };
        assert!(
            out.status.success(),
            "{}: {}",
            p.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        n += 1;
    }
    assert!(n >= 2);
}
