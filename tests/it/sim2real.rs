//! `qsim sim2real` (issue 23): every test experiment runs, the report's
//! medians are the ones its predictions give (recomputed here from
//! predictions.csv and the shipped actuals), the output is the same with any
//! thread count, the shipped coefficients are the fit's result, and the fit
//! never looks at the test set.

use crate::common::qsim;
use std::collections::BTreeMap;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = qsim().arg("sim2real").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// (exp_id, stage, metric) → actual ms of the test set, read from the CSV.
fn actuals() -> BTreeMap<(u64, i64, String), f64> {
    let text = std::fs::read_to_string("experiments/sim2real/actuals.csv").unwrap();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |n: &str| head.iter().position(|h| *h == n).unwrap();
    let mut m = BTreeMap::new();
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        if f[col("set")] == "test" {
            m.insert(
                (
                    f[col("exp_id")].parse().unwrap(),
                    f[col("stage_index")].parse().unwrap(),
                    f[col("metric")].to_string(),
                ),
                f[col("actual_ms")].parse().unwrap(),
            );
        }
    }
    m
}

#[test]
fn all_38_run_and_the_medians_are_the_predictions() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s2r");
    let (code, text, err) = run(&["--out", out.to_str().unwrap(), "--threads", "2"]);
    assert_eq!(code, 0, "{err}");
    // the same with one thread
    let (code, one, _) = run(&["--threads", "1"]);
    assert_eq!(code, 0);
    assert_eq!(one, text);
    assert_eq!(
        std::fs::read_to_string(out.join("report.txt")).unwrap(),
        text
    );
    let csv = std::fs::read_to_string(out.join("predictions.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(
        lines.next().unwrap(),
        "exp_id,stage_index,metric,predicted_ms,actual_ms"
    );
    let act = actuals();
    let ids: std::collections::BTreeSet<u64> = act.keys().map(|k| k.0).collect();
    assert_eq!(ids.len(), 38);
    let mut ape: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    let mut n = 0;
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        let (id, stage, metric): (u64, i64, &str) =
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2]);
        let (p, a): (f64, f64) = (f[3].parse().unwrap(), f[4].parse().unwrap());
        assert_eq!(act[&(id, stage, metric.to_string())], a, "{l}");
        assert!(p.is_finite() && p > 0.0, "{l}");
        n += 1;
        if stage == -1 {
            seen.insert((id, metric.to_string()));
            ape.entry(metric.to_string())
                .or_default()
                .push(100.0 * (p - a).abs() / a);
        }
    }
    // every measured figure of every test experiment is predicted
    assert_eq!(n, act.len());
    for id in &ids {
        for m in ["e2e_mean", "ttft_mean", "itl_mean"] {
            assert!(seen.contains(&(*id, m.to_string())), "{id} {m}");
        }
    }
    let want = format!(
        "qsim                          38 {:>8.1} {:>8.1} {:>8.1}",
        median(ape["e2e_mean"].clone()),
        median(ape["ttft_mean"].clone()),
        median(ape["itl_mean"].clone())
    );
    assert!(text.lines().any(|l| l == want), "{want:?} not in\n{text}");
    // the published figures the issue quotes, from the study's own records
    assert!(
        text.contains("blis-trained-physics          38      6.8     18.4      6.5"),
        "{text}"
    );
    assert!(text.contains("llmservingsim                 32     18.8     72.5     21.8"));
    // by GPU: 32 H100, 4 A100, 2 L40S
    for g in [
        "H100                          32",
        "A100                           4",
        "L40S                           2",
    ] {
        assert!(text.contains(g), "{g}");
    }
}

#[test]
fn the_shipped_coefficients_are_the_fits_result() {
    // the fit: ~1,000 evaluations of the 13 training experiments (80–110 CPU-s)
    let (code, fitted, err) = run(&["--fit", "1000"]);
    assert_eq!(code, 0, "{err}");
    let shipped = std::fs::read_to_string("experiments/sim2real/coefficients.toml").unwrap();
    assert_eq!(fitted, shipped);
}

#[test]
fn bad_flags_are_one_line_errors() {
    let (code, out, err) = run(&["--only", "999"]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--only") && err.contains("999"), "{err}");
    // an --out directory that holds something else is refused before any run
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("mine.txt"), "x").unwrap();
    let (code, out, err) = run(&["--out", dir.path().to_str().unwrap(), "--force"]);
    assert_eq!(code, 2, "{err}");
    assert!(out.is_empty());
    assert!(err.contains("--out") && err.contains("mine.txt"), "{err}");
    let (code, _, err) = run(&["--fit", "3"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--fit"), "{err}");
}

#[test]
fn the_plots_are_drawn_and_the_same_with_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    for (d, t) in [(&a, "1"), (&b, "2")] {
        let (code, _, err) = run(&["--brief", "--threads", t, "--plot", d.to_str().unwrap()]);
        assert_eq!(code, 0, "{err}");
    }
    for f in [
        "sim2real-predicted-vs-measured.png",
        "sim2real-predicted-vs-measured.svg",
        "sim2real-error-by-model-gpu.png",
        "sim2real-error-by-model-gpu.svg",
    ] {
        let x = std::fs::read(a.join(f)).unwrap();
        assert!(x.len() > 1000, "{f}");
        assert_eq!(x, std::fs::read(b.join(f)).unwrap(), "{f}");
    }
    // one point per test experiment in each of the six panels
    let svg = std::fs::read_to_string(a.join("sim2real-error-by-model-gpu.svg")).unwrap();
    assert!(svg.contains("54 L40S") && svg.contains("41 A100"));
}
