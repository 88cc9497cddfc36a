//! `qsim trace stats` against figures computed here independently (the
//! shipped Azure 2023 traces), and bad trace inputs through the command
//! line: one line on stderr, exit 2, nothing on stdout.

use crate::common::qsim;
// (`refused` runs qsim itself, under a memory limit)
use std::path::{Path, PathBuf};

/// Seconds of the day of `YYYY-MM-DD HH:MM:SS.fffffff` (every row of the
/// Azure 2023 traces is on 2023-11-16, checked).
fn seconds_of_day(ts: &str) -> f64 {
    let (date, time) = ts.split_once(' ').unwrap();
    assert_eq!(date, "2023-11-16");
    let p: Vec<&str> = time.split(':').collect();
    p[0].parse::<f64>().unwrap() * 3600.0
        + p[1].parse::<f64>().unwrap() * 60.0
        + p[2].parse::<f64>().unwrap()
}

/// numpy's default percentile (linear between order statistics).
fn percentile(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    let x = q * (v.len() - 1) as f64;
    let i = x as usize;
    let f = x - i as f64;
    if i + 1 < v.len() {
        v[i] + f * (v[i + 1] - v[i])
    } else {
        v[i]
    }
}

fn stats_json(args: &[&str]) -> serde_json::Value {
    let out = qsim()
        .args(["trace", "stats", "--format", "json"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-9 * b.abs().max(1.0),
        "{what}: qsim {a}, here {b}"
    );
}

#[test]
fn azure_trace_stats_match_an_independent_computation() {
    for name in ["code", "conv"] {
        let path = format!("experiments/data/traces/AzureLLMInferenceTrace_{name}.csv");
        let text =
            std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(&path)).unwrap();
        let mut t = Vec::new();
        let (mut inp, mut out) = (Vec::new(), Vec::new());
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.trim_end().split(',').collect();
            t.push(seconds_of_day(f[0]));
            inp.push(f[1].parse::<f64>().unwrap());
            out.push(f[2].parse::<f64>().unwrap());
        }
        let n = t.len();
        let gaps: Vec<f64> = t.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let v = stats_json(&[&path]);
        assert_eq!(v["requests"].as_u64().unwrap(), n as u64, "{name}");
        assert_eq!(v["format"], "azure");
        // times to 100 ns in the file: f64 seconds of the day are exact to ~1e-11 s
        let dur = t[n - 1] - t[0];
        assert!(
            (v["duration_s"].as_f64().unwrap() - dur).abs() < 1e-6,
            "{name}"
        );
        let rate = v["mean_rate_per_s"].as_f64().unwrap();
        assert!(
            (rate - n as f64 / dur).abs() < 1e-9 * rate,
            "{name}: {rate}"
        );
        let cv = v["inter_arrival_cv"].as_f64().unwrap();
        assert!((cv - var.sqrt() / mean).abs() < 1e-6 * cv, "{name}: {cv}");
        for (key, vals) in [("input_tokens", &mut inp), ("output_tokens", &mut out)] {
            for (label, q) in [
                ("p50", 0.5),
                ("p90", 0.9),
                ("p95", 0.95),
                ("p99", 0.99),
                ("max", 1.0),
            ] {
                close(
                    v[key][label].as_f64().unwrap(),
                    percentile(vals, q),
                    &format!("{name} {key} {label}"),
                );
            }
            let total: f64 = vals.iter().sum();
            close(
                v[&format!("{key}_total")].as_f64().unwrap(),
                total,
                &format!("{name} {key} total"),
            );
        }
    }
    // the code trace is the bursty one (the "CV above 10")
    let v = stats_json(&["experiments/data/traces/AzureLLMInferenceTrace_code.csv"]);
    assert!(v["inter_arrival_cv"].as_f64().unwrap() > 10.0);
}

fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join(name);
    (d, p)
}

/// `qsim trace stats FILE` fails with exit 2, one stderr line naming the
/// file and containing `want`, and nothing on stdout.
/// It runs with 200 MB of address space (`ulimit -v`): reading a 1 GB
/// line, or /dev/zero, into memory would abort instead.
fn refused(file: &Path, extra: &[&str], want: &str) {
    let out = std::process::Command::new("sh")
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args(["-c", "ulimit -v 200000 && exec \"$0\" \"$@\""])
        .arg(env!("CARGO_BIN_EXE_qsim"))
        .args(["trace", "stats"])
        .arg(file)
        .args(extra)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&file.display().to_string()) && err.contains(want),
        "{err}"
    );
}

#[test]
fn bad_traces_are_one_line_errors_with_exit_2() {
    let header = "TIMESTAMP,ContextTokens,GeneratedTokens\n";
    let row = "2023-11-16 18:17:03.9799600,10,5\n";
    for (text, want) in [
        ("", "empty: no header and no requests"),
        (header, "no requests (a header only?)"),
        (
            &*format!("{header}{row}2023-11-16 18:17:04.0,-3,5\n"),
            "line 3, column 2 (ContextTokens): a negative token count",
        ),
        (
            &*format!("{header}{row}2023-11-16 18:17:04.0,7,x1\n"),
            "line 3, column 3 (GeneratedTokens): not a token count",
        ),
        (
            &*format!("{header}{row}yesterday,7,1\n"),
            "line 3, column 1 (TIMESTAMP): not a datetime",
        ),
    ] {
        let (_d, p) = tmp("t.csv");
        std::fs::write(&p, text).unwrap();
        refused(&p, &[], want);
    }
    // a 1 GB line: a sparse file (no disk used), refused after 1 MiB
    let (_d, p) = tmp("long.csv");
    std::fs::File::create(&p)
        .unwrap()
        .set_len(1_000_000_000)
        .unwrap();
    refused(&p, &[], "line 1: longer than 1 MiB");
    refused(
        Path::new("/dev/zero"),
        &[],
        "a character device, not a regular file",
    );
    // a FIFO is refused before it is opened (opening one would block)
    let (_d, p) = tmp("fifo");
    assert!(std::process::Command::new("mkfifo")
        .arg(&p)
        .status()
        .unwrap()
        .success());
    refused(&p, &[], "a FIFO, not a regular file");
    // bad options name their flag
    let shipped = PathBuf::from("experiments/data/traces/AzureLLMInferenceTrace_code.csv");
    let out = qsim()
        .args(["trace", "stats"])
        .arg(&shipped)
        .args(["--scale", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("qsim: --scale: must be in (0, 1000]"));
}

#[test]
fn the_fitted_workload_is_a_scenario_qsim_runs() {
    let v = stats_json(&["experiments/data/traces/AzureLLMInferenceTrace_conv.csv"]);
    let fitted = v["fitted"].as_str().unwrap();
    let d = tempfile::tempdir().unwrap();
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/llama-3.1-8b-h100-vllm.toml");
    let exp = format!(
        "kind = \"server\"\nserver = {:?}\nreplicas = 2\nduration_s = 60\ninput_tokens = {{ dist = \"const\", value = 1 }}\noutput_tokens = {{ dist = \"const\", value = 1 }}\n[[scenario]]\nname = \"fitted\"\n{fitted}\n[[scenario]]\nname = \"trace\"\nduration_s = 60\ntrace = {{ file = {:?} }}\n",
        model.display().to_string(),
        Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/data/traces/AzureLLMInferenceTrace_conv.csv").display().to_string()
    );
    let f = d.path().join("fit.toml");
    std::fs::write(&f, exp).unwrap();
    let out = qsim()
        .arg("run")
        .arg(&f)
        .args(["--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("\"fitted\"") && s.contains("\"trace\""), "{s}");
}

#[test]
fn unsorted_rows_are_sorted_with_a_warning() {
    let (_d, p) = tmp("u.csv");
    std::fs::write(
        &p,
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:02.0,10,5\n2023-11-16 18:00:01.0,20,5\n2023-11-16 18:00:03.0,30,5\n",
    )
    .unwrap();
    let out = qsim()
        .args(["trace", "stats", "--format", "json"])
        .arg(&p)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.trim(),
        format!(
            "warning: {}: 1 rows out of time order were put in order",
            p.display()
        )
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["duration_s"], 2.0);
    assert_eq!(v["reordered"], 1);
}

#[test]
fn trace_plan_needs_a_target_and_trace_scenarios() {
    let out = qsim()
        .args(["trace", "plan", "experiments/azure-traces.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--e2e-p95: give a target"));
    let out = qsim()
        .args([
            "trace",
            "plan",
            "experiments/llama-8b-clients.toml",
            "--e2e-p95",
            "5s",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no scenario replays a trace"));
    assert!(out.stdout.is_empty());
    // a target no replica count reaches: the report, then exit 1
    let out = qsim()
        .args([
            "trace",
            "plan",
            "experiments/azure-traces.toml",
            "--only",
            "conv",
            "--e2e-p95",
            "100ms",
            "--max-replicas",
            "2",
        ])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("> 2"));
}

#[test]
fn stats_plots_are_drawn() {
    let d = tempfile::tempdir().unwrap();
    let out = qsim()
        .args([
            "trace",
            "stats",
            "experiments/data/traces/AzureLLMInferenceTrace_code.csv",
            "--plot",
        ])
        .arg(d.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for n in ["trace-rate", "trace-input", "trace-output"] {
        for ext in ["png", "svg"] {
            let p = d.path().join(format!("{n}.{ext}"));
            assert!(
                std::fs::metadata(&p).unwrap().len() > 1000,
                "{}",
                p.display()
            );
        }
    }
}
