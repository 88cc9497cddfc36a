//! `--out DIR` (issue 13, item 2): run, sweep and plan write runs.parquet,
//! runs.csv, points.parquet, points.csv and manifest.json; the files are
//! byte-identical with 1 and 2 threads, and two shards merged give the
//! single run's tables; bad input writes nothing.

use assert_cmd::Command;
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn qsim_in(cwd: &Path) -> Command {
    let mut c = Command::cargo_bin("qsim").unwrap();
    c.current_dir(cwd);
    c
}

const FILES: [&str; 5] = [
    "manifest.json",
    "points.csv",
    "points.parquet",
    "runs.csv",
    "runs.parquet",
];

fn pacing() -> String {
    root()
        .join("experiments/fmapi-pacing.toml")
        .display()
        .to_string()
}

/// A small grid: 2 × 2 points, 3 seeds, two experiments.
fn grid(extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "sweep",
        &pacing(),
        "--vary",
        "workers=8..16:x2",
        "--vary",
        "sdk_retries=true,false",
        "--only",
        "exp1-direct,exp2-backoff",
        "--seeds",
        "3",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// Run qsim in `cwd` (with RAYON_NUM_THREADS = `threads`), expect success.
fn ok(cwd: &Path, args: &[String], threads: &str) -> String {
    let o = qsim_in(cwd)
        .env("RAYON_NUM_THREADS", threads)
        .args(args)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "qsim {args:?}: {err}");
    String::from_utf8(o.stdout).unwrap()
}

fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn files(d: &Path) -> BTreeMap<String, Vec<u8>> {
    listing(d)
        .into_iter()
        .map(|n| {
            let b = fs::read(d.join(&n)).unwrap();
            (n, b)
        })
        .collect()
}

/// A CSV (no quoted commas in these files) as header + rows of fields.
fn csv(text: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = text.lines();
    let header = lines
        .next()
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    let rows = lines
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect();
    (header, rows)
}

fn sha256(path: &Path) -> String {
    let o = std::process::Command::new("sha256sum")
        .arg(path)
        .output()
        .expect("sha256sum");
    String::from_utf8(o.stdout).unwrap()[..64].to_string()
}

#[test]
fn sweep_dir_is_byte_identical_with_one_and_two_threads() {
    // the same command line in two working directories, so that the
    // manifests (which record it) can be compared too
    let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let args = grid(&["--out", "res"]);
    let t1 = ok(a.path(), &args, "1");
    let t2 = ok(b.path(), &args, "2");
    assert_eq!(t1, t2, "the report on stdout");
    assert!(
        t1.contains("exp2-backoff"),
        "the report still goes to stdout: {t1}"
    );
    let (one, two) = (files(&a.path().join("res")), files(&b.path().join("res")));
    assert_eq!(
        one.keys().collect::<Vec<_>>(),
        FILES.iter().collect::<Vec<_>>()
    );
    for (name, bytes) in &one {
        assert!(
            bytes == &two[name],
            "{name} differs between 1 and 2 threads"
        );
    }
    assert_eq!(listing(a.path()), ["res"], "no temporary left");

    // one row per run: 4 points x 3 seeds x 2 experiments
    let (h, rows) = csv(std::str::from_utf8(&one["runs.csv"]).unwrap());
    assert_eq!(
        h[..5],
        ["point", "workers", "sdk_retries", "seed", "subject"]
    );
    assert!(h.contains(&"elapsed_s".to_string()) && h.contains(&"latency_p95_s".to_string()));
    assert_eq!(rows.len(), 4 * 3 * 2);
    assert_eq!(rows[0][..5], ["0", "8", "true", "1", "exp1-direct"]);
    assert_eq!(rows[23][..5], ["3", "16", "false", "3", "exp2-backoff"]);
    // parquet files are parquet
    assert_eq!(&one["runs.parquet"][..4], b"PAR1");
    assert_eq!(&one["points.parquet"][..4], b"PAR1");

    // the manifest: version, command line, inputs with their hashes, seeds, grid
    let m: serde_json::Value = serde_json::from_slice(&one["manifest.json"]).unwrap();
    assert_eq!(m["qsim_version"], env!("CARGO_PKG_VERSION"));
    let cmd: Vec<String> = std::iter::once("qsim".to_string())
        .chain(args.clone())
        .collect();
    assert_eq!(m["command"], serde_json::json!(cmd));
    assert_eq!(
        (m["seed"].as_u64(), m["seeds"].as_u64()),
        (Some(1), Some(3))
    );
    assert_eq!(m["grid"]["points"], 4);
    assert_eq!(
        m["grid"]["axes"][1]["values"],
        serde_json::json!(["true", "false"])
    );
    let inputs = m["inputs"].as_array().unwrap();
    let exp = inputs
        .iter()
        .find(|i| i["path"] == pacing().as_str())
        .unwrap();
    assert_eq!(exp["sha256"], sha256(Path::new(&pacing())));
    assert!(
        inputs.iter().any(|i| i["path"]
            .as_str()
            .unwrap()
            .ends_with("databricks-claude-haiku-4-5.toml")),
        "the endpoint profile the experiment names is an input too: {inputs:?}"
    );
    let listed = m["files"].as_array().unwrap();
    assert_eq!(listed.len(), 4);
    for f in listed {
        let n = f["name"].as_str().unwrap();
        assert_eq!(f["sha256"], sha256(&a.path().join("res").join(n)), "{n}");
    }
}

#[test]
fn two_shards_merged_equal_the_single_run() {
    let d = tempfile::tempdir().unwrap();
    ok(d.path(), &grid(&["--out", "whole"]), "2");
    ok(d.path(), &grid(&["--shard", "1/2", "--out", "s1"]), "2");
    ok(d.path(), &grid(&["--shard", "0/2", "--out", "s0"]), "1");
    let args: Vec<String> = ["merge", "s1", "s0", "--out", "merged"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(ok(d.path(), &args, "2"), "", "merge prints nothing");
    let (whole, merged) = (
        files(&d.path().join("whole")),
        files(&d.path().join("merged")),
    );
    for n in ["runs.parquet", "runs.csv", "points.parquet", "points.csv"] {
        assert!(
            whole[n] == merged[n],
            "{n}: merged shards differ from the single run"
        );
    }
    let m: serde_json::Value = serde_json::from_slice(&merged["manifest.json"]).unwrap();
    let w: serde_json::Value = serde_json::from_slice(&whole["manifest.json"]).unwrap();
    assert_eq!(m["inputs"], w["inputs"]);
    assert_eq!(m["grid"], w["grid"]);
    assert_eq!(m["files"], w["files"], "the same table files");
    assert_eq!(m["shard"], serde_json::Value::Null);
    let from: Vec<&str> = m["merged_from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["dir"].as_str().unwrap())
        .collect();
    assert_eq!(from, ["s0", "s1"], "in shard order");
    // a shard alone holds only its points: 0/2 has points 0 and 2
    let (_, rows) =
        csv(&String::from_utf8(files(&d.path().join("s0"))["runs.csv"].clone()).unwrap());
    assert!(rows.iter().all(|r| r[0] == "0" || r[0] == "2"));
}

fn refused(cwd: &Path, args: &[String], needles: &[&str]) {
    let o = qsim_in(cwd).args(args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert!(
        err.starts_with("qsim: ") && err.trim_end().lines().count() == 1,
        "{err}"
    );
    for n in needles {
        assert!(err.contains(n), "{args:?}: {n:?} not in {err}");
    }
    assert!(o.stdout.is_empty(), "nothing on stdout");
}

#[test]
fn merge_refuses_missing_doubled_and_changed_shards() {
    let d = tempfile::tempdir().unwrap();
    ok(d.path(), &grid(&["--shard", "0/2", "--out", "s0"]), "2");
    ok(d.path(), &grid(&["--shard", "1/2", "--out", "s1"]), "2");
    ok(d.path(), &grid(&["--out", "whole"]), "2");
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    refused(
        d.path(),
        &s(&["merge", "s0", "--out", "m"]),
        &["shard 1/2", "a shard is missing"],
    );
    refused(
        d.path(),
        &s(&["merge", "s0", "s1", "s0", "--out", "m"]),
        &["given twice"],
    );
    refused(
        d.path(),
        &s(&["merge", "s0", "whole", "--out", "m"]),
        &["whole", "not a shard"],
    );
    refused(d.path(), &s(&["merge", "s0", "s1"]), &["add --out DIR"]);
    refused(
        d.path(),
        &s(&["merge", "s0", "s1", "--out", "m.csv"]),
        &["add --out DIR"],
    );
    // a shard of another sweep (other seeds)
    let mut other = grid(&["--shard", "1/2", "--out", "o1"]);
    let i = other.iter().position(|a| a == "--seeds").unwrap();
    other[i + 1] = "2".into();
    ok(d.path(), &other, "2");
    refused(
        d.path(),
        &s(&["merge", "s0", "o1", "--out", "m"]),
        &["o1", "shards of different sweeps"],
    );
    // a table changed after qsim wrote it
    let mut b = fs::read(d.path().join("s1/runs.parquet")).unwrap();
    let k = b.len() / 2;
    b[k] ^= 1;
    fs::write(d.path().join("s1/runs.parquet"), b).unwrap();
    refused(
        d.path(),
        &s(&["merge", "s0", "s1", "--out", "m"]),
        &["runs.parquet", "sha256"],
    );
    assert!(!d.path().join("m").exists(), "nothing written");
    assert!(!listing(d.path()).iter().any(|n| n.contains("qsim-tmp")));
}

#[test]
fn run_and_plan_write_the_same_tables_as_their_records() {
    let d = tempfile::tempdir().unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let args = s(&["run", &pacing(), "--set", "rows=40", "--seeds", "3"]);
    let report = ok(
        d.path(),
        &[args.clone(), s(&["--out", "run/"])].concat(),
        "2",
    );
    assert!(report.contains("exp1-direct"), "{report}");
    assert_eq!(listing(&d.path().join("run")), FILES);
    // every tidy record of --format csv is a cell of runs.csv
    let tidy = ok(d.path(), &[args, s(&["--format", "csv"])].concat(), "2");
    let (rh, rows) = csv(&fs::read_to_string(d.path().join("run/runs.csv")).unwrap());
    let (_, recs) = csv(&tidy);
    let mut n = 0;
    for r in &recs {
        let (seed, subject, metric, value) = (&r[0], &r[1], &r[2], &r[3]);
        let row = rows
            .iter()
            .find(|x| &x[1] == seed && &x[2] == subject)
            .unwrap();
        let col = rh.iter().position(|h| h == metric).unwrap();
        let (a, b): (f64, f64) = (row[col].parse().unwrap(), value.parse().unwrap());
        assert!(
            a == b || (a - b).abs() <= 1e-12 * b.abs(),
            "{r:?}: {a} != {b}"
        );
        n += 1;
    }
    assert!(n > 100, "{n} records");
    // points: the median over the 3 seeds of each (subject, metric)
    let (ph, prow) = csv(&fs::read_to_string(d.path().join("run/points.csv")).unwrap());
    assert_eq!(
        ph,
        ["point", "subject", "metric", "runs", "median", "mean", "p05", "p95"]
    );
    let el = prow
        .iter()
        .find(|r| r[1] == "exp1-direct" && r[2] == "elapsed_s")
        .unwrap();
    let mut v: Vec<f64> = recs
        .iter()
        .filter(|r| r[1] == "exp1-direct" && r[2] == "elapsed_s")
        .map(|r| r[3].parse().unwrap())
        .collect();
    v.sort_by(f64::total_cmp);
    assert_eq!(el[3], "3");
    assert_eq!(el[4].parse::<f64>().unwrap(), v[1]);

    // plan: consumers and scenarios as subjects, every minute a column
    let out = ok(
        d.path(),
        &s(&["plan", "--model", "ideal", "--seeds", "2", "--out", "plan"]),
        "2",
    );
    assert!(out.contains("scenario"), "{out}");
    let (h, rows) = csv(&fs::read_to_string(d.path().join("plan/runs.csv")).unwrap());
    assert!(h.contains(&"admitted_per_min.0".to_string()), "{h:?}");
    assert!(rows.iter().any(|r| r[2] == "heavy/A"));
    let m: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(d.path().join("plan/manifest.json")).unwrap())
            .unwrap();
    assert_eq!(
        m["inputs"][0]["path"],
        "builtin:experiments/shared-deployment.toml"
    );
}

#[test]
fn bad_input_and_a_nonempty_dir_write_nothing() {
    let d = tempfile::tempdir().unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let sweep = |vary: &str, extra: &[&str]| {
        [
            s(&["sweep", &pacing(), "--vary", vary, "--only", "exp1-direct"]),
            s(extra),
            s(&["--out", "out"]),
        ]
        .concat()
    };
    refused(
        d.path(),
        &sweep("nosuch=1,2", &[]),
        &["nosuch", "unknown field"],
    );
    refused(
        d.path(),
        &sweep("workers=8,many", &[]),
        &["sweep point --vary workers=many"],
    );
    refused(d.path(), &sweep("workers=", &[]), &["empty value"]);
    refused(
        d.path(),
        &sweep("workers=8..64:*2", &[]),
        &["malformed range"],
    );
    refused(
        d.path(),
        &sweep("workers=8,16", &["--shard", "2/2"]),
        &["--shard 2/2", "I/N"],
    );
    refused(
        d.path(),
        &sweep("workers=8,16", &["--shard", "x"]),
        &["--shard x"],
    );
    assert!(
        listing(d.path()).is_empty(),
        "nothing written: {:?}",
        listing(d.path())
    );

    // an existing non-empty directory: refused without --force, kept
    fs::create_dir(d.path().join("out")).unwrap();
    fs::write(d.path().join("out/notes.txt"), "mine").unwrap();
    refused(
        d.path(),
        &sweep("workers=8,16", &[]),
        &["--out out", "not empty", "--force"],
    );
    // with --force too: it holds a file qsim did not write
    refused(
        d.path(),
        &sweep("workers=8,16", &["--force"]),
        &["--out out", "holds notes.txt"],
    );
    assert_eq!(listing(&d.path().join("out")), ["notes.txt"]);
    // a directory qsim wrote is replaced with --force
    fs::remove_file(d.path().join("out/notes.txt")).unwrap();
    ok(d.path(), &sweep("workers=8,16", &[]), "2");
    refused(d.path(), &sweep("workers=8,16,32", &[]), &["not empty"]);
    ok(d.path(), &sweep("workers=8,16,32", &["--force"]), "2");
    let m = fs::read_to_string(d.path().join("out/manifest.json")).unwrap();
    assert!(m.contains("\"points\": 3"), "{m}");
    assert_eq!(
        listing(d.path()),
        ["out"],
        "no temporary or old directory left"
    );
}
