//! `qsim plan` end to end: output shape, exit codes, messages.

use crate::common::qsim;
use serde_json::Value;

fn plan_json(args: &[&str]) -> Value {
    let out = qsim()
        .arg("plan")
        .args(args)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn fails_with(args: &[&str], needle: &str) {
    let out = qsim().arg("plan").args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle),
        "{args:?}: stderr {err:?} lacks {needle:?}"
    );
}

#[test]
fn default_plan_json_shape() {
    let v = plan_json(&["--capacity", "1000", "--reserve", "30,20,30"]);
    let res = v["reservations"].as_array().unwrap();
    assert_eq!(res.len(), 3);
    assert_eq!(res[0]["consumer"], "A");
    assert_eq!(res[1]["reserved_pct"], 20.0);
    assert_eq!(res[2]["reserved_rpm"], 300.0);
    assert_eq!(v["unreserved_rpm"], 200.0);
    assert_eq!(v["semantics"], "strict-floors");
    for f in v["findings"].as_array().unwrap() {
        assert!(f["level"].is_string() && f["message"].is_string());
    }
    let sc = v["scenarios"].as_array().unwrap();
    let names: Vec<&str> = sc.iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "normal",
            "mild",
            "heavy",
            "extreme",
            "late-joiner",
            "reserved-only"
        ]
    );
    for s in sc {
        for c in s["consumers"].as_array().unwrap() {
            for k in [
                "consumer",
                "offered_rpm",
                "admitted_rpm",
                "success_rate",
                "rejected",
                "floor_rpm",
                "floor_met",
            ] {
                assert!(c.get(k).is_some(), "{k} missing in {c}");
            }
            // a success rate exists exactly when something was offered
            assert_eq!(
                c["success_rate"].is_null(),
                c["offered"] == 0,
                "success_rate of {c}"
            );
        }
        for k in [
            "e2e_p50_s",
            "ttft_p50_s",
            "itl_p50_s",
            "gpu_util",
            "kv_util",
            "concurrency_mean",
        ] {
            assert!(s["server"][k].is_number(), "server.{k} in {}", s["name"]);
            assert!(
                s["no_limiter"][k].is_number(),
                "no_limiter.{k} in {}",
                s["name"]
            );
        }
    }
    // normal: nothing rejected
    assert!(sc[0]["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["rejected"] == 0));
}

#[test]
fn table_output_names_sections() {
    let out = qsim()
        .args(["plan", "--capacity", "1000", "--reserve", "30,20,30"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let s = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "unreserved pool (dev)",
        "findings:",
        "decision flow:",
        "scenario late-joiner",
        "no limiter",
        "burst used",
    ] {
        assert!(s.contains(needle), "missing {needle:?}");
    }
}

#[test]
fn bad_flags_exit_2_naming_the_flag() {
    fails_with(&["--reserve", "60,50"], "--reserve");
    fails_with(&["--reserve", "60,50"], "more than 100 %");
    fails_with(&["--reserve", "30,-5"], "negative");
    fails_with(&["--reserve", "30,abc"], "not a number");
    fails_with(&["--threshold", "0"], "--threshold");
    fails_with(&["--threshold", "1.5"], "--threshold");
    fails_with(&["--semantics", "fair-share"], "unknown semantics");
    fails_with(&["--semantics", "fair-share"], "strict-floors");
    fails_with(&["--capacity", "0"], "--capacity");
    fails_with(&["--unit", "rps"], "--unit");
    fails_with(&["--model", "/nonexistent/profile.toml"], "--model");
    fails_with(&["--need", "A=abc"], "--need");
}

#[test]
fn fully_reserved_runs_with_an_error_finding() {
    let v = plan_json(&["--reserve", "50,50", "--names", "X,Y"]);
    assert_eq!(v["unreserved_rpm"], 0.0);
    let errs: Vec<&str> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["level"] == "error")
        .map(|f| f["message"].as_str().unwrap())
        .collect();
    assert!(
        errs.iter().any(|m| m.contains("100 % reserved")),
        "{errs:?}"
    );
    // the unreserved dev user gets nothing in a saturated scenario
    assert!(
        errs.iter().any(|m| m.contains("dev got nothing")),
        "{errs:?}"
    );
}

#[test]
fn every_semantics_runs_and_threshold_findings() {
    for s in ["rate-limit-only", "strict-floors", "litellm-priority"] {
        let v = plan_json(&["--semantics", s, "--model", "ideal"]);
        assert_eq!(v["semantics"], s);
    }
    let v = plan_json(&["--threshold", "0.95", "--model", "ideal"]);
    assert!(v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .any(|f| f["level"] == "warn" && f["message"].as_str().unwrap().contains("over 80 %")));
}

/// The inverse search's candidates, from its documented rule alone:
/// `Σneed / 0.9` rounded up, then 5 % steps (each rounded up).
fn candidates(needs: &[f64], n: usize) -> Vec<u64> {
    let mut c = vec![(needs.iter().sum::<f64>() / 0.9).ceil() as u64];
    while c.len() < n {
        let last = *c.last().unwrap() as f64;
        c.push((last * 1.05).ceil() as u64);
    }
    c
}

/// Reservations `need / C` rounded up to 0.01 %, and the pool.
fn split(needs: &[f64], cap: u64) -> (Vec<f64>, f64) {
    let r: Vec<f64> = needs
        .iter()
        .map(|n| (n / cap as f64 * 10_000.0).ceil() / 100.0)
        .collect();
    let pool = ((100.0 - r.iter().sum::<f64>()) * 100.0).round() / 100.0;
    (r, pool)
}

fn assert_inverse(v: &Value, needs: &[f64], cap: u64, replicas: u64) {
    let inv = &v["inverse"];
    assert_eq!(inv["feasible"], true);
    assert_eq!(inv["capacity"].as_u64().unwrap(), cap);
    assert_eq!(inv["replicas"].as_u64(), Some(replicas));
    let (r, pool) = split(needs, cap);
    let got: Vec<f64> = inv["reservations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["reserved_pct"].as_f64().unwrap())
        .collect();
    assert_eq!(got, r);
    assert_eq!(inv["unreserved_pct"].as_f64().unwrap(), pool);
    // the plan then runs at that capacity with the found reservations
    assert_eq!(v["capacity"].as_u64().unwrap(), cap);
    for (x, need) in v["reservations"].as_array().unwrap().iter().zip(needs) {
        assert!(x["reserved_rpm"].as_f64().unwrap() >= *need);
    }
}

/// Strict floors meet the needs at the first candidate (723 RPM).
#[test]
fn inverse_planning_finds_capacity() {
    let needs = [250.0, 150.0, 250.0];
    let v = plan_json(&["--need", "A=250,B=150,C=250", "--e2e-p95", "4s"]);
    assert_eq!(candidates(&needs, 1), [723]);
    assert_inverse(&v, &needs, 723, 1);
}

/// Under litellm-priority the floors hold only above saturation, so the
/// first seven candidates (723 … 971) leave a consumer below its need in a
/// saturated minute and the search must go on to the eighth, 1,020 RPM
/// (24.51 / 14.71 / 24.51 %, pool 36.27 %), with one replica.
#[test]
fn inverse_planning_steps_past_failing_candidates() {
    let needs = [250.0, 150.0, 250.0];
    let v = plan_json(&[
        "--need",
        "A=250,B=150,C=250",
        "--semantics",
        "litellm-priority",
        "--e2e-p95",
        "4s",
    ]);
    let cands = candidates(&needs, 8);
    assert_eq!(cands, [723, 760, 798, 838, 880, 924, 971, 1020]);
    assert_inverse(&v, &needs, cands[7], 1);
    let lines: Vec<&str> = v["inverse"]["explanation"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l.as_str().unwrap())
        .collect();
    for c in &cands[..7] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(&format!("capacity {c}: not enough"))),
            "{c} should fail: {lines:?}"
        );
    }
}

#[test]
fn scenario_file_override() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("s.toml");
    std::fs::write(
        &p,
        r#"
kind = "shared"
model = "ideal"
max_tokens = 128
input_tokens = { dist = "const", value = 100 }
output_tokens = { dist = "const", value = 50 }
[deployment]
capacity = 100
[[consumer]]
name = "solo"
reserved_pct = 50
[[consumer]]
name = "other"
[[scenario]]
name = "flood"
duration_s = 120
load = [{ who = "all", rpm = 400 }]
"#,
    )
    .unwrap();
    let v = plan_json(&["--scenarios", p.to_str().unwrap()]);
    assert_eq!(v["scenarios"].as_array().unwrap().len(), 1);
    assert_eq!(v["capacity"], 100);
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "kind = \"shared\"\nbogus = 1\n").unwrap();
    let out = qsim()
        .args(["plan", "--scenarios", bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn closed_loop_workers_with_retries() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("c.toml");
    std::fs::write(
        &p,
        r#"
kind = "shared"
model = "ideal"
max_tokens = 128
input_tokens = { dist = "const", value = 100 }
output_tokens = { dist = "const", value = 20 }
[deployment]
capacity = 120
threshold = 0.9
semantics = "rate-limit-only"
[defaults]
concurrent = 4
[[consumer]]
name = "batch"
[[scenario]]
name = "workers"
duration_s = 180
load = [{ who = "batch", workers = 8, think_s = 0.5, retry = { backoff = "constant", delay_s = 0.2, max_attempts = 3 } }]
"#,
    )
    .unwrap();
    let v = plan_json(&["--scenarios", p.to_str().unwrap()]);
    let c = &v["scenarios"][0]["consumers"][0];
    let by = &c["rejected_by"];
    // 8 workers but at most 4 in flight: the concurrency cap denies
    assert!(by["concurrent"].as_u64().unwrap() > 0, "{c}");
    // capacity 120/min over 3 min plus a burst of 12
    let admitted = c["admitted"].as_u64().unwrap();
    assert!(admitted <= 3 * 120 + 12 + 1, "{admitted}");
    assert!(admitted >= 3 * 120 - 12, "{admitted}");
}
