//! `qsim compare`: the records CSV (canonical) and `qsim run --format json`
//! as inputs, the agreement rule, and bad input (exit 2, one line).

use std::path::Path;
use std::process::Command;

fn qsim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(args)
        .output()
        .expect("qsim");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

fn run(dir: &Path, name: &str, args: &[&str]) -> String {
    let p = dir.join(name);
    let mut a = vec![
        "run",
        "builtin:experiments/fmapi-pacing.toml",
        "--only",
        "exp1-direct",
    ];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--out", p.to_str().unwrap()]);
    let (code, _, err) = qsim(&a);
    assert_eq!(code, 0, "{err}");
    p.to_str().unwrap().to_string()
}

#[test]
fn csv_and_json_inputs_and_the_agreement_rule() {
    let d = tempfile::tempdir().unwrap();
    let sim = run(d.path(), "sim.csv", &["--seeds", "5", "--format", "csv"]);
    let json = run(d.path(), "sim.json", &["--seeds", "5", "--format", "json"]);
    // one seed of the same model agrees with five seeds' prediction
    let obs = run(d.path(), "obs.csv", &["--seed", "3", "--format", "csv"]);
    let (code, out, err) = qsim(&["compare", &sim, &obs, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let ms = v["metrics"].as_array().unwrap();
    assert!(ms.len() >= 20, "{out}");
    assert_eq!(v["simulated_seeds"], 5);
    assert_eq!(v["observed_seeds"], 1);
    for m in ms {
        assert_eq!(m["agrees"], true, "{m}");
        let (lo, hi) = (
            m["interval90"][0].as_f64().unwrap(),
            m["interval90"][1].as_f64().unwrap(),
        );
        let o = m["observed"].as_f64().unwrap();
        assert_eq!(m["in_interval"], lo - 1e-9 <= o && o <= hi + 1e-9, "{m}");
    }
    // the run JSON gives the same predictions (rounded as the report rounds)
    let (code, out2, err) = qsim(&[
        "compare",
        &json,
        &obs,
        "--format",
        "json",
        "--metric",
        "ok,rejected_429,http_requests",
    ]);
    assert_eq!(code, 0, "{err}");
    let v2: serde_json::Value = serde_json::from_str(&out2).unwrap();
    let ms2 = v2["metrics"].as_array().unwrap();
    assert_eq!(ms2.len(), 3);
    for m in ms2 {
        let same = ms.iter().find(|x| x["metric"] == m["metric"]).unwrap();
        assert_eq!(
            m["predicted"].as_f64().unwrap().round(),
            same["predicted"].as_f64().unwrap().round(),
            "{m}"
        );
        assert_eq!(m["observed"], same["observed"]);
    }
    // a text table with a verdict per metric
    let (code, table, _) = qsim(&["compare", &sim, &obs, "--metric", "ok,elapsed_s"]);
    assert_eq!(code, 0);
    assert!(
        table.contains("exp1-direct") && table.contains("2 of 2 metrics agree"),
        "{table}"
    );
    // an observation far off the prediction does not agree
    let far = d.path().join("far.csv");
    std::fs::write(&far, "seed,subject,metric,value\n1,exp1-direct,ok,1000\n").unwrap();
    let (code, out, _) = qsim(&["compare", &sim, far.to_str().unwrap(), "--format", "json"]);
    assert_eq!(code, 0);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["total"], 1);
    assert_eq!(v["metrics"][0]["agrees"], false);
    assert_eq!(v["metrics"][0]["in_interval"], false);
}

#[test]
fn bad_inputs_exit_2_naming_the_file() {
    let d = tempfile::tempdir().unwrap();
    let sim = run(d.path(), "sim.csv", &["--format", "csv"]);
    let sweep = d.path().join("sweep.csv");
    std::fs::write(
        &sweep,
        "workers,seed,subject,metric,value\n8,1,exp1-direct,ok,3\n",
    )
    .unwrap();
    let (code, out, err) = qsim(&["compare", &sim, sweep.to_str().unwrap()]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.starts_with(&format!(
            "qsim: {}: expected a records CSV",
            sweep.display()
        )),
        "{err}"
    );
    assert!(err.contains("a sweep's records"), "{err}");
    let other = d.path().join("other.csv");
    std::fs::write(&other, "seed,subject,metric,value\n1,nope,ok,3\n").unwrap();
    let (code, _, err) = qsim(&["compare", &sim, other.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert!(err.contains("no (subject, metric) in common"), "{err}");
    let bad = d.path().join("bad.csv");
    std::fs::write(&bad, "seed,subject,metric,value\n1,e,ok,many\n").unwrap();
    let (code, _, err) = qsim(&["compare", &sim, bad.to_str().unwrap()]);
    assert_eq!(code, 2);
    assert_eq!(
        err.trim(),
        format!(
            "qsim: {}: row 2: value \"many\" is not a number",
            bad.display()
        )
    );
    let (code, _, err) = qsim(&["compare", &sim, "/nonexistent/x.csv"]);
    assert_eq!(code, 2);
    assert!(
        err.starts_with("qsim: /nonexistent/x.csv: cannot read"),
        "{err}"
    );
}
