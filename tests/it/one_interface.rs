//! Every experiment kind through one interface: `--set`, `--seeds`,
//! `--only` and `qsim sweep` work for hosted, server and shared files, and
//! every report is derived from the tidy records (`--format csv`).

use crate::common::qsim;
use serde_json::Value;

fn stdout(args: &[&str]) -> String {
    let out = qsim().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "qsim {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn json(args: &[&str]) -> Value {
    serde_json::from_str(&stdout(args)).unwrap()
}

const SHARED: &str = "experiments/shared-deployment.toml";

/// Sweeping the capacity of a shared deployment: in the saturated heavy
/// scenario each reserved consumer's admitted units per saturated minute
/// follow its floor, capacity × reserved share (from the file: A 30 %,
/// B 20 %, C 30 %), and never fall below 99 % of it.
#[test]
fn sweep_over_a_shared_file_varies_capacity() {
    let v = json(&[
        "sweep",
        SHARED,
        "--vary",
        "capacity=800,1000,1200",
        "--seeds",
        "2",
        "--only",
        "heavy",
        "--format",
        "json",
    ]);
    let points = v["points"].as_array().unwrap();
    assert_eq!(points.len(), 3);
    for p in points {
        let cap: f64 = p["set"]["capacity"].as_str().unwrap().parse().unwrap();
        let rows = p["experiments"].as_array().unwrap();
        assert_eq!(rows.len(), 4, "heavy × 4 consumers");
        let mut reserved_total = 0.0;
        for (name, share) in [("heavy/A", 0.3), ("heavy/B", 0.2), ("heavy/C", 0.3)] {
            let r = rows.iter().find(|r| r["name"] == name).unwrap();
            let got = r["admitted_per_saturated_min"].as_f64().unwrap();
            let floor = cap * share;
            assert!(
                got >= 0.99 * floor,
                "{name} at {cap}: {got} < floor {floor}"
            );
            assert!(got <= cap, "{name} at {cap}: {got} above capacity");
            reserved_total += got;
            assert_eq!(r["floor_met"].as_f64(), Some(1.0));
        }
        let dev = rows.iter().find(|r| r["name"] == "heavy/dev").unwrap();
        assert!(dev["floor_met"].is_null(), "dev has no floor");
        let all = reserved_total + dev["admitted_per_saturated_min"].as_f64().unwrap();
        // sustained admission is the capacity per minute (+ at most the
        // burst depth 0.2 × capacity spread over the saturated minutes)
        assert!(all <= 1.2 * cap + 1.0, "{all} admitted per minute at {cap}");
        assert!(all >= 0.95 * cap, "{all} admitted per minute at {cap}");
    }
}

/// `qsim plan --seeds K` aggregates over seeds: medians inside their 90 %
/// intervals, for every scenario and consumer, in the text and the JSON.
#[test]
fn plan_over_seeds_reports_medians_and_intervals() {
    let v = json(&[
        "plan", "--model", "ideal", "--seeds", "4", "--format", "json",
    ]);
    let o = &v["over_seeds"];
    assert_eq!(o["seeds"], 4);
    let scenarios = o["scenarios"].as_array().unwrap();
    assert_eq!(scenarios.len(), 6);
    for sc in scenarios {
        for c in sc["consumers"].as_array().unwrap() {
            let a = &c["admitted"];
            let (m, lo, hi) = (
                a["median"].as_f64().unwrap(),
                a["interval90"][0].as_f64().unwrap(),
                a["interval90"][1].as_f64().unwrap(),
            );
            assert!(lo <= m && m <= hi, "{sc} {c}");
        }
    }
    let heavy = scenarios.iter().find(|s| s["name"] == "heavy").unwrap();
    let a = &heavy["consumers"][0]["admitted"]["interval90"];
    assert!(
        a[0].as_f64() < a[1].as_f64(),
        "different seeds give different draws: {a}"
    );
    let text = stdout(&["plan", "--model", "ideal", "--seeds", "3"]);
    assert!(text.contains("Over 3 seeds from 1: median [90% interval]"));
    assert!(text.contains("floor met (share of seeds)"));
}

/// `--only` on a shared file keeps each scenario's draws (they are scoped by
/// position in the file); `--set` reaches `[deployment]` keys by short path.
#[test]
fn shared_file_takes_only_seeds_and_set() {
    let all = json(&["run", SHARED, "--format", "json"]);
    let one = json(&["run", SHARED, "--only", "heavy", "--format", "json"]);
    let pick = |v: &Value| -> Value {
        v["scenarios"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["name"] == "heavy")
            .cloned()
            .unwrap()
    };
    assert_eq!(one["scenarios"].as_array().unwrap().len(), 1);
    assert_eq!(pick(&all), pick(&one));
    let part = json(&[
        "run",
        SHARED,
        "--only",
        "reserved-only",
        "--set",
        "semantics=partitioned",
        "--format",
        "json",
    ]);
    let strict = json(&["run", SHARED, "--only", "reserved-only", "--format", "json"]);
    assert_ne!(pick_admitted(&part), pick_admitted(&strict));
    let out = qsim()
        .args(["run", SHARED, "--only", "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no scenario named \"nope\""));
}

fn pick_admitted(v: &Value) -> Vec<u64> {
    v["scenarios"][0]["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["admitted"].as_u64().unwrap())
        .collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let x = 0.5 * (v.len() - 1) as f64;
    let (i, f) = (x.floor() as usize, x.fract());
    if i + 1 < v.len() {
        v[i] * (1.0 - f) + v[i + 1] * f
    } else {
        v[i]
    }
}

/// The tidy records are the run's output: the JSON report's medians are the
/// medians of the records (hosted and server kinds), per seed and metric.
#[test]
fn reports_are_derived_from_the_records() {
    for (file, list, key) in [
        ("experiments/fmapi-pacing.toml", "experiments", "ok"),
        ("experiments/nim-load.toml", "scenarios", "completed"),
    ] {
        let csv = stdout(&["run", file, "--seeds", "3", "--format", "csv"]);
        let mut lines = csv.lines();
        assert_eq!(lines.next(), Some("seed,subject,metric,value"));
        let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
        let seeds: std::collections::BTreeSet<&str> = rows.iter().map(|r| r[0]).collect();
        assert_eq!(seeds.len(), 3, "{file}");
        let rep = json(&["run", file, "--seeds", "3", "--format", "json"]);
        for item in rep[list].as_array().unwrap() {
            let name = item["name"].as_str().unwrap();
            let vals: Vec<f64> = rows
                .iter()
                .filter(|r| r[1] == name && r[2] == key)
                .map(|r| r[3].parse().unwrap())
                .collect();
            assert_eq!(vals.len(), 3, "{file} {name}");
            let got = item
                .get(key)
                .or_else(|| item["total"].get(key))
                .and_then(Value::as_f64)
                .unwrap_or_else(|| panic!("{file} {name}: no {key} in {item}"));
            assert_eq!(got, median(vals).round(), "{file} {name} {key}");
        }
    }
}

/// Many replicas are summarised in the text report (min, median, max across
/// replicas), not printed as one column each; the JSON keeps every replica.
#[test]
fn many_replicas_are_summarised() {
    let args = [
        "run",
        "experiments/nim-load.toml",
        "--only",
        "normal",
        "--set",
        "scenario.normal.replicas=12",
        "--set",
        "scenario.normal.duration_s=60",
    ];
    let text = stdout(&args);
    assert!(text.contains("normal: across 12 replicas"), "{text}");
    assert!(
        !text.contains("replica 11"),
        "no column per replica: {text}"
    );
    let mut a = args.to_vec();
    a.extend(["--format", "json"]);
    let v = json(&a);
    assert_eq!(
        v["scenarios"][0]["per_replica"].as_array().unwrap().len(),
        12
    );
}
