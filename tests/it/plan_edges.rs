//! `qsim plan` edge cases (issue 8, item 4): tiny capacities, tokens as the
//! unit, --names/--reserve/--need combinations, 0 offered, infeasible
//! latency targets. Each run is bounded by a timeout that only catches a hang.

use assert_cmd::Command;
use std::time::Duration;

fn plan(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::cargo_bin("qsim")
        .unwrap()
        .arg("plan")
        .args(args)
        .timeout(Duration::from_secs(120))
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn refused(args: &[&str], code: i32, needles: &[&str]) -> String {
    let (c, _, err) = plan(args);
    assert_eq!(c, Some(code), "{args:?}: {err}");
    assert!(
        err.starts_with("qsim: ") && err.trim_end().lines().count() == 1,
        "{args:?}: {err:?}"
    );
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
    }
    err
}

#[test]
fn tiny_capacity_figures_agree_and_lend_the_pool() {
    let (c, out, err) = plan(&["--capacity", "10", "--model", "ideal"]);
    assert_eq!(c, Some(0), "{err}");
    // the header's depth matches "burst used N of N": the three credits
    // (one each), the one each accrues, and the pool's one unit
    assert!(
        out.contains(
            "burst headroom 2 units (bucket depth 7: the floors' credits and a pool beyond them"
        ),
        "{out}"
    );
    assert!(out.contains("burst used 7 of 7"), "{out}");
    // issue 26: with the bucket exactly as deep as the credits nothing beyond
    // the floors was lent out (8 per minute, dev refused forever when the
    // others were idle); now the whole capacity is admitted, dev included
    assert!(out.contains("admitted per minute: 13 10 |"), "{out}");
    let dev = out
        .lines()
        .find(|l| l.starts_with("dev ") && l.split_whitespace().nth(2) != Some("0"))
        .expect("dev admitted in some scenario");
    assert!(!dev.is_empty());
    // with a deeper bucket, as before
    let (_, deeper, _) = plan(&["--capacity", "10", "--burst", "10", "--model", "ideal"]);
    assert!(deeper.contains("admitted per minute: 16 10"), "{deeper}");
}

#[test]
fn floors_under_one_unit_are_not_judged_per_minute() {
    let (c, out, err) = plan(&["--capacity", "1", "--model", "ideal"]);
    assert_eq!(c, Some(0), "{err}");
    assert!(out.contains("A's floor is 0.30 RPM"), "{out}");
    assert!(
        !out.contains(" NO"),
        "a fractional floor judged per minute: {out}"
    );
    assert!(!out.contains("floor 0 "), "{out}");
}

#[test]
fn capacity_above_u64_refused_not_clamped() {
    refused(&["--capacity", "1e30"], 2, &["--capacity", "too large"]);
    refused(
        &["--capacity", "18446744073709551616"],
        2,
        &["--capacity", "too large"],
    );
}

#[test]
fn many_shares_get_distinct_default_names() {
    let shares = vec!["1"; 30].join(",");
    let (c, out, err) = plan(&["--reserve", &shares, "--model", "ideal", "--format", "json"]);
    assert_eq!(c, Some(0), "{err}");
    assert!(!err.contains("--names"), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let text = v.to_string();
    for n in ["\"Z\"", "\"AA\"", "\"AD\""] {
        assert!(text.contains(n), "{n} missing");
    }
}

#[test]
fn names_must_match_the_shares() {
    refused(
        &["--reserve", "30,20,30", "--names", "X,Y"],
        2,
        &["--names", "2 names for 3 reserved consumers"],
    );
    // one per share, or one per consumer: accepted
    let (c, _, err) = plan(&[
        "--reserve",
        "30,20,30",
        "--names",
        "X,Y,Z",
        "--model",
        "ideal",
    ]);
    assert_eq!(c, Some(0), "{err}");
}

#[test]
fn need_names_must_be_consumers() {
    refused(
        &["--need", "Z=250"],
        2,
        &["--need", "no consumer named \"Z\"", "A, B, C, dev"],
    );
}

#[test]
fn need_keeps_consumers_it_does_not_name() {
    let (c, out, err) = plan(&["--need", "A=250", "--model", "ideal", "--format", "json"]);
    assert_eq!(c, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let expl = v["inverse"]["explanation"].to_string();
    assert!(expl.contains("no need given for B, C"), "{expl}");
    let text = v.to_string();
    assert!(text.contains("\"consumer\":\"B\""), "B dropped");
}

#[test]
fn zero_offered_is_not_full_success() {
    let (c, out, _) = plan(&["--model", "ideal"]);
    assert_eq!(c, Some(0));
    let dev_idle = out
        .lines()
        .find(|l| l.starts_with("dev ") && l.split_whitespace().nth(1) == Some("0"))
        .expect("a scenario where dev offers nothing");
    assert!(!dev_idle.contains('%'), "{dev_idle}");
}

#[test]
fn tpm_with_defaults_says_why_nothing_is_admitted() {
    let (c, out, _) = plan(&["--unit", "tpm", "--model", "ideal"]);
    assert_eq!(c, Some(0));
    assert!(out.contains("more than can ever be admitted for"), "{out}");
    assert!(out.contains("372 tokens"), "{out}");
}

#[test]
fn infeasible_latency_target_exits_1_with_the_reason() {
    let err = refused(
        &["--need", "A=250,B=150,C=250", "--e2e-p95", "2s"],
        1,
        &["--e2e-p95", "at least", "tokens"],
    );
    assert!(!err.contains("64"), "{err}");
    // the ideal server: no replica count helps either
    refused(
        &[
            "--need",
            "A=250,B=150,C=250",
            "--e2e-p95",
            "2s",
            "--model",
            "ideal",
        ],
        1,
        &["--e2e-p95"],
    );
}
