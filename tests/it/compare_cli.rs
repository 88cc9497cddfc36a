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

/// Several observation files are several runs: pooled, each (file, seed)
/// its own run, the observation their median; a JSON report cannot be
/// pooled.
#[test]
fn several_observations_are_pooled_as_runs() {
    let d = tempfile::tempdir().unwrap();
    let sim = run(d.path(), "sim.csv", &["--seeds", "5", "--format", "csv"]);
    // three files, two of them with the same seed (two replays with the
    // default seed are two runs, not one)
    let mk = |name: &str, seed: u64, ok: f64| {
        let p = d.path().join(name);
        std::fs::write(
            &p,
            format!("seed,subject,metric,value\n{seed},exp1-direct,ok,{ok}\n"),
        )
        .unwrap();
        p.to_str().unwrap().to_string()
    };
    let (a, b, c) = (
        mk("a.csv", 1, 100.0),
        mk("b.csv", 1, 140.0),
        mk("c.csv", 2, 120.0),
    );
    let (code, out, err) = qsim(&["compare", &sim, &a, &b, &c, "--format", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["observed_seeds"], 3, "{out}");
    assert_eq!(v["observed_files"].as_array().unwrap().len(), 3);
    assert_eq!(v["metrics"].as_array().unwrap().len(), 1, "{out}");
    assert_eq!(v["metrics"][0]["observed"], 120.0, "{out}");
    let (code, table, err) = qsim(&["compare", &sim, &a, &b, &c]);
    assert_eq!(code, 0, "{err}");
    assert!(table.contains("(3 runs)"), "{table}");
    // one file with two seeds and one with one: three runs as well
    let two = d.path().join("two.csv");
    std::fs::write(
        &two,
        "seed,subject,metric,value\n1,exp1-direct,ok,100\n2,exp1-direct,ok,140\n",
    )
    .unwrap();
    let (_, out, _) = qsim(&[
        "compare",
        &sim,
        two.to_str().unwrap(),
        &c,
        "--format",
        "json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["observed_seeds"], 3, "{out}");
    assert_eq!(v["metrics"][0]["observed"], 120.0, "{out}");
    // a JSON report among several: exit 2 naming it
    let json = run(d.path(), "sim.json", &["--format", "json"]);
    let (code, out, err) = qsim(&["compare", &sim, &a, &json]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert!(
        err.starts_with(&format!(
            "qsim: {json}: several observations must be records CSVs"
        )),
        "{err}"
    );
}

/// `--plot DIR` draws the forest plot (one dot per metric, red where the
/// observation disagrees) as PNG and SVG; `--html` a page with it.
#[test]
fn plot_and_html_of_a_comparison() {
    let d = tempfile::tempdir().unwrap();
    let sim = run(d.path(), "sim.csv", &["--seeds", "5", "--format", "csv"]);
    let obs = d.path().join("obs.csv");
    // ok agrees (the simulated median of exp 1's rows), elapsed is 10× off
    let (_, out, _) = qsim(&[
        "compare",
        &sim,
        &sim,
        "--format",
        "json",
        "--metric",
        "ok,elapsed_s",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let pred = |k: &str| {
        v["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["metric"] == k)
            .unwrap()["predicted"]
            .as_f64()
            .unwrap()
    };
    let (ok, el) = (pred("ok"), pred("elapsed_s"));
    std::fs::write(
        &obs,
        format!(
            "seed,subject,metric,value\n1,exp1-direct,ok,{ok}\n1,exp1-direct,elapsed_s,{}\n",
            el * 10.0
        ),
    )
    .unwrap();
    let plot = d.path().join("plots");
    let html = d.path().join("cmp.html");
    let (code, table, err) = qsim(&[
        "compare",
        &sim,
        obs.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
        "--html",
        html.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(table.contains("1 of 2 metrics agree"), "{table}");
    let png = std::fs::read(plot.join("compare.png")).unwrap();
    assert_eq!(&png[1..4], b"PNG");
    let svg = std::fs::read_to_string(plot.join("compare.svg")).unwrap();
    let dots = qsim_plot::check::elements(&svg, "circle");
    let fill = |c: (u8, u8, u8)| format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2);
    let count = |c| {
        dots.iter()
            .filter(|e| e.iter().any(|(n, v)| *n == "fill" && *v == fill(c)))
            .count()
    };
    assert_eq!(count(qsim_plot::AGREES), 1, "{svg}");
    assert_eq!(count(qsim_plot::DISAGREES), 1, "{svg}");
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<svg"), "no inline figure");
    assert!(page.contains("1 of 2 metrics agree"));
    // a non-empty --plot DIR without --force: exit 2, nothing drawn
    let (code, _, err) = qsim(&[
        "compare",
        &sim,
        obs.to_str().unwrap(),
        "--plot",
        plot.to_str().unwrap(),
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--plot"), "{err}");
}

/// Issue 26, item 6: a non-finite value is refused naming the file, row and
/// column; a prediction of other conditions (200 rows simulated against a
/// 5-row replay) is refused, not compared metric by metric.
#[test]
fn non_finite_values_and_different_runs_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let sim = run(d.path(), "sim.csv", &["--format", "csv"]);
    for v in ["NaN", "inf", "-inf", "1e400"] {
        let bad = d.path().join("nan.csv");
        std::fs::write(
            &bad,
            format!("seed,subject,metric,value\n1,exp1-direct,ok,3\n1,exp1-direct,elapsed_s,{v}\n"),
        )
        .unwrap();
        let (code, out, err) = qsim(&["compare", &sim, bad.to_str().unwrap()]);
        assert_eq!((code, out.as_str()), (2, ""), "{v}: {err}");
        assert_eq!(
            err.trim(),
            format!(
                "qsim: {}: row 3, column value: {v:?} is not a finite number (a record is a measured value)",
                bad.display()
            )
        );
    }
    // 5 rows observed, 200 simulated
    let small = run(
        d.path(),
        "small.csv",
        &["--format", "csv", "--set", "rows=5"],
    );
    let (code, out, err) = qsim(&["compare", &sim, &small]);
    assert_eq!((code, out.as_str()), (2, ""), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.starts_with(&format!(
            "qsim: {small}: exp1-direct: observed 5 rows (total)"
        )),
        "{err}"
    );
    assert!(
        err.contains("simulated 200") && err.contains("--set rows=5"),
        "{err}"
    );
    // the same conditions compare
    let sim5 = run(
        d.path(),
        "sim5.csv",
        &["--format", "csv", "--set", "rows=5", "--seeds", "3"],
    );
    let (code, _, err) = qsim(&["compare", &sim5, &small]);
    assert_eq!(code, 0, "{err}");
}
