//! `qsim plan` with request traces as consumers' loads (issue 22, item 4):
//! exact replay through the limiter, consumers mapped by the trace's column,
//! the inverse search scaling a trace, and refusals.

use crate::common::qsim;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// The trace: 3 consumers by column, rows every 0.7 s for 5 minutes,
/// lengths varying by row; (consumer, minute) → (rows, input, output).
fn write_trace(dir: &Path) -> BTreeMap<(String, usize), (u64, u64, u64)> {
    let mut csv = String::from("t,team,inp,out\n");
    let mut want: BTreeMap<(String, usize), (u64, u64, u64)> = BTreeMap::new();
    for k in 0..428u64 {
        let t_ms = k * 700;
        let team = ["a", "b", "c"][(k * 7 % 3) as usize];
        let (inp, out) = (10 + (k * 37) % 900, 1 + (k * 13) % 300);
        writeln!(csv, "{},{team},{inp},{out}", t_ms as f64 / 1000.0).unwrap();
        // the output the server writes: capped at the file's max_tokens
        let e = want
            .entry((team.to_string(), (t_ms / 60_000) as usize))
            .or_default();
        e.0 += 1;
        e.1 += inp;
        e.2 += out.min(256);
    }
    std::fs::write(dir.join("t.csv"), csv).unwrap();
    want
}

fn scenario(dir: &Path, unit: &str, accounting: &str, trace: &str, extra: &str) -> String {
    let p = dir.join("s.toml");
    std::fs::write(
        &p,
        format!(
            r#"kind = "shared"
model = "ideal"
max_tokens = 256
input_tokens = {{ dist = "const", value = 100 }}
output_tokens = {{ dist = "const", value = 50 }}
[deployment]
capacity = 100000000
unit = "{unit}"
accounting = "{accounting}"
[[consumer]]
name = "a"
reserved_pct = 30
[[consumer]]
name = "b"
reserved_pct = 20
[[consumer]]
name = "c"
[[scenario]]
name = "replay"
duration_s = 360
[[scenario.load]]
who = "all"
trace = {{ {trace} }}
{extra}
"#
        ),
    )
    .unwrap();
    p.display().to_string()
}

/// `qsim plan --format csv` records: (subject, metric) → value.
fn records(file: &str, extra: &[&str]) -> BTreeMap<(String, String), f64> {
    let out = qsim()
        .args(["plan", "--scenarios", file, "--format", "csv"])
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut m = BTreeMap::new();
    let mut lines = text.lines();
    let head: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |n: &str| head.iter().position(|h| *h == n).unwrap();
    let (s, k, v) = (col("subject"), col("metric"), col("value"));
    for l in lines {
        let f: Vec<&str> = l.split(',').collect();
        m.insert((f[s].to_string(), f[k].to_string()), f[v].parse().unwrap());
    }
    m
}

#[test]
fn a_trace_load_offers_exactly_the_files_requests_to_their_consumers() {
    let dir = tempfile::tempdir().unwrap();
    let want = write_trace(dir.path());
    let trace = r#"file = "t.csv", format = "csv", time_column = "t", input_column = "inp", output_column = "out", consumer_column = "team""#;
    // requests per minute, as offered and admitted (nothing is refused)
    let f = scenario(dir.path(), "rpm", "reserve_refund", trace, "");
    let r = records(&f, &[]);
    // tokens: offered = input alone (on_completion), admitted = input +
    // the output the server wrote, settled at completion
    let f = scenario(dir.path(), "tpm", "on_completion", trace, "");
    let t = records(&f, &[]);
    let mut total = 0.0;
    for c in ["a", "b", "c"] {
        let subj = format!("replay/{c}");
        for m in 0..6 {
            let (n, inp, out) = want.get(&(c.to_string(), m)).copied().unwrap_or_default();
            let get = |recs: &BTreeMap<(String, String), f64>, k: &str| {
                recs[&(subj.clone(), format!("{k}.{m}"))]
            };
            assert_eq!(get(&r, "offered_per_min"), n as f64, "{c} minute {m}");
            assert_eq!(get(&r, "admitted_per_min"), n as f64, "{c} minute {m}");
            assert_eq!(get(&t, "offered_per_min"), inp as f64, "{c} minute {m}");
            assert_eq!(
                get(&t, "admitted_per_min"),
                (inp + out) as f64,
                "{c} minute {m}"
            );
        }
        total += r[&(subj.clone(), "offered".to_string())];
        assert_eq!(r[&(subj, "failed".to_string())], 0.0);
    }
    assert_eq!(total, 428.0);
}

#[test]
fn a_trace_without_consumers_is_replayed_by_each_consumer_from_the_loads_start() {
    let dir = tempfile::tempdir().unwrap();
    let want = write_trace(dir.path());
    let rows_by_min = |m: usize| -> f64 {
        ["a", "b", "c"]
            .iter()
            .map(|c| want.get(&(c.to_string(), m)).map_or(0, |w| w.0))
            .sum::<u64>() as f64
    };
    let trace = r#"file = "t.csv", format = "csv", time_column = "t", input_column = "inp", output_column = "out""#;
    // the load starts a minute in: the trace's minute m lands in minute m + 1;
    // its last minute falls past the scenario's end
    let f = scenario(dir.path(), "rpm", "reserve_refund", trace, "start_s = 60");
    let r = records(&f, &[]);
    for c in ["a", "b", "c"] {
        let subj = format!("replay/{c}");
        assert_eq!(r[&(subj.clone(), "offered_per_min.0".into())], 0.0);
        for m in 0..5 {
            let got = r[&(subj.clone(), format!("offered_per_min.{}", m + 1))];
            assert_eq!(got, rows_by_min(m), "{c} trace minute {m}");
        }
    }
}

#[test]
fn the_inverse_search_scales_a_trace_load_with_capacity() {
    let dir = tempfile::tempdir().unwrap();
    write_trace(dir.path());
    let trace = r#"file = "t.csv", format = "csv", time_column = "t", input_column = "inp", output_column = "out", consumer_column = "team""#;
    // a deployment of 60 rpm: the trace offers ~86 requests a minute; the
    // needs fit in less
    let f = scenario(dir.path(), "rpm", "reserve_refund", trace, "");
    let text = std::fs::read_to_string(&f)
        .unwrap()
        .replace("capacity = 100000000", "capacity = 60");
    std::fs::write(&f, text).unwrap();
    let out = qsim()
        .args([
            "plan",
            "--scenarios",
            &f,
            "--need",
            "a=20,b=15",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cap = v["inverse"]["capacity"].as_f64().unwrap();
    assert!(cap < 60.0, "{v}");
    // the plan at the found capacity replays the trace at cap / 60 of its
    // traffic: each row sent floor(scale) times, plus once more with the
    // fraction's probability (a seeded draw per row)
    let offered: f64 = v["scenarios"][0]["consumers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["offered"].as_f64().unwrap())
        .sum();
    let (mean, sd) = (428.0 * cap / 60.0, (428.0f64 * 0.25).sqrt());
    assert!(
        (offered - mean).abs() < 4.0 * sd && offered < 428.0,
        "offered {offered}, expected {mean} ± {sd}"
    );
}

fn refused(dir: &Path, trace: &str, extra: &str, want: &str) {
    let f = scenario(dir, "rpm", "reserve_refund", trace, extra);
    let out = qsim().args(["plan", "--scenarios", &f]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains(want), "{err:?} lacks {want:?}");
    assert!(out.stdout.is_empty());
}

#[test]
fn bad_trace_loads_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    write_trace(dir.path());
    let by_team = r#"file = "t.csv", format = "csv", time_column = "t", input_column = "inp", output_column = "out", consumer_column = "team""#;
    // a trace and a rate
    refused(
        dir.path(),
        by_team,
        "rpm = 10",
        "scenario.replay.load.0: a trace load takes no `rpm`",
    );
    // the trace's consumer "c" is not one the load drives
    let f = dir.path().join("t.csv");
    let text = std::fs::read_to_string(&f).unwrap().replace(",c,", ",zed,");
    std::fs::write(&f, text).unwrap();
    refused(
        dir.path(),
        by_team,
        "",
        "scenario.replay.load.0.trace: the trace's consumer \"zed\" is not one this load drives (a, b, c)",
    );
    // a malformed row: file, line and column
    std::fs::write(&f, "t,team,inp,out\n0,a,10,5\n1,a,-3,5\n").unwrap();
    refused(dir.path(), by_team, "", "line 3");
    // a missing file
    refused(dir.path(), r#"file = "nope.csv""#, "", "nope.csv");
}
