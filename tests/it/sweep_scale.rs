//! `qsim sweep` at scale (issue 13, item 1): the same files whatever the
//! thread count, shards merged equal to a single-machine run, and bad
//! `--vary` / `--shard` refused with exit 2 before anything is written.

use crate::common::qsim;
use std::path::{Path, PathBuf};

const PACING: &str = "experiments/fmapi-pacing.toml";

/// Run `qsim args… --out out` and return the file's bytes.
fn to_file(args: &[&str], out: &Path) -> Vec<u8> {
    let o = qsim().args(args).arg("--out").arg(out).output().unwrap();
    assert!(
        o.status.success(),
        "qsim {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    std::fs::read(out).unwrap()
}

fn grid(extra: &[&'static str]) -> Vec<&'static str> {
    let mut a = vec![
        "sweep",
        PACING,
        "--vary",
        "workers=8..32:x2",
        "--vary",
        "max_tokens=128..256:+128",
        "--only",
        "exp2-backoff,exp3-ai-query",
        "--seeds",
        "3",
    ];
    a.extend_from_slice(extra);
    a
}

#[test]
fn one_and_two_threads_write_identical_files() {
    let d = tempfile::tempdir().unwrap();
    for fmt in ["csv", "table", "json"] {
        let one = to_file(
            &grid(&["--format", fmt, "--threads", "1"]),
            &d.path().join(format!("1.{fmt}")),
        );
        let two = to_file(
            &grid(&["--format", fmt, "--threads", "2"]),
            &d.path().join(format!("2.{fmt}")),
        );
        assert!(one == two, "{fmt}: 1 and 2 threads differ");
        assert!(!one.is_empty());
    }
    // the ranges expand to 8,16,32 × 128,256 in grid order, 3 seeds each
    let csv = String::from_utf8(std::fs::read(d.path().join("1.csv")).unwrap()).unwrap();
    let mut order: Vec<String> = Vec::new();
    for l in csv.lines().skip(1) {
        let p: Vec<&str> = l.splitn(3, ',').collect();
        let key = format!("{},{}", p[0], p[1]);
        if order.last() != Some(&key) {
            order.push(key);
        }
    }
    assert_eq!(
        order,
        ["8,128", "8,256", "16,128", "16,256", "32,128", "32,256"]
    );
}

#[test]
fn server_and_shared_sweeps_do_not_depend_on_threads() {
    let d = tempfile::tempdir().unwrap();
    for (i, args) in [
        vec![
            "sweep",
            "experiments/nim-load.toml",
            "--only",
            "capacity",
            "--set",
            "duration_s=30",
            "--vary",
            "replicas=1,2",
            "--seeds",
            "2",
            "--format",
            "csv",
        ],
        vec![
            "sweep",
            "experiments/shared-deployment.toml",
            "--only",
            "heavy",
            "--vary",
            "capacity=800..1200:+400",
            "--seeds",
            "2",
            "--format",
            "csv",
        ],
    ]
    .into_iter()
    .enumerate()
    {
        let mut a1 = args.clone();
        a1.extend(["--threads", "1"]);
        let mut a2 = args.clone();
        a2.extend(["--threads", "2"]);
        let one = to_file(&a1, &d.path().join(format!("{i}-1.csv")));
        let two = to_file(&a2, &d.path().join(format!("{i}-2.csv")));
        assert!(one == two, "{args:?}: 1 and 2 threads differ");
        assert!(one.len() > 100);
    }
}

#[test]
fn shards_merged_equal_the_unsharded_csv() {
    let d = tempfile::tempdir().unwrap();
    let whole = to_file(&grid(&["--format", "csv"]), &d.path().join("whole.csv"));
    for n in [2usize, 4, 7] {
        // 6 points: with 7 shards one file holds no point at all
        let mut files: Vec<PathBuf> = Vec::new();
        for i in 0..n {
            let shard = format!("{i}/{n}");
            let f = d.path().join(format!("shard-{i}-of-{n}.csv"));
            let s: &'static str = Box::leak(shard.into_boxed_str());
            to_file(&grid(&["--format", "csv", "--shard", s]), &f);
            files.push(f);
        }
        files.reverse(); // any order
        let merged = d.path().join(format!("merged-{n}.csv"));
        let o = qsim()
            .arg("merge")
            .args(&files)
            .arg("--out")
            .arg(&merged)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(
            std::fs::read(&merged).unwrap() == whole,
            "{n} shards merged differ from the unsharded CSV"
        );
        // a missing shard (here shard 0, last after the reversal) is named,
        // nothing written
        let partial = d.path().join(format!("partial-{n}.csv"));
        let o = qsim()
            .arg("merge")
            .args(&files[..n - 1])
            .arg("--out")
            .arg(&partial)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2));
        assert!(String::from_utf8_lossy(&o.stderr).contains("a shard is missing"));
        assert!(!partial.exists());
    }
}

fn refused(extra: &[&str], names: &[&str]) {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("never.csv");
    let o = qsim()
        .args(["sweep", PACING, "--seeds", "1"])
        .args(extra)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{extra:?}: {err}");
    for n in names {
        assert!(err.contains(n), "{extra:?}: {n:?} not in {err}");
    }
    assert!(!err.contains("panicked"), "{err}");
    assert!(!out.exists(), "{extra:?} wrote {}", out.display());
    assert!(o.stdout.is_empty());
}

#[test]
fn bad_vary_and_shard_exit_2_naming_the_problem() {
    // unknown path
    refused(
        &["--vary", "nosuch=1,2"],
        &["nosuch", "unknown field", "sweep point --vary nosuch=1"],
    );
    refused(
        &["--vary", "experiment.9.rows=1,2"],
        &["--vary experiment.9.rows=1", "index out of range"],
    );
    // wrong type (a string where a number is expected), at a named point
    refused(
        &["--vary", "workers=8,many"],
        &["workers", "sweep point --vary workers=many"],
    );
    // a table, not a scalar
    refused(&["--vary", "experiment=1,2"], &["not a scalar"]);
    // empty list and empty values
    refused(&["--vary", "workers="], &["--vary workers=", "empty value"]);
    refused(&["--vary", "workers=8,,16"], &["empty value"]);
    // malformed ranges
    for r in [
        "workers=8..64",
        "workers=8..64:*2",
        "workers=8..:x2",
        "workers=64..8:+8",
        "workers=8..64:x1",
        "workers=8..64:+0",
    ] {
        refused(&["--vary", r], &[&format!("--vary {r}")]);
    }
    refused(&["--vary", "workers=8..64"], &["malformed range"]);
    // bad shards
    for s in ["2/2", "1/0", "x", "1/2/3", "-1/2"] {
        refused(
            &["--vary", "workers=8,16", "--format", "csv", "--shard", s],
            &["--shard", "I/N"],
        );
    }
    refused(
        &["--vary", "workers=8,16", "--shard", "0/2"],
        &["--shard", "--format csv"],
    );
    refused(
        &["--vary", "workers=8,16", "--threads", "0"],
        &["--threads"],
    );
}
