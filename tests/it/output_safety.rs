//! `--out` and stdout safety (issue 8, item 3; issue 13 for directories):
//! `--out FILE` (a name with an extension) writes only regular files and
//! never clobbers one without `--force`; a symbolic link is written
//! through. `--out DIR` (no extension, or a trailing `/`) writes a new or
//! empty directory, refuses a non-empty one without `--force` (and with it,
//! one holding anything qsim did not write), and never follows a link or
//! replaces a device, FIFO or file. Write errors exit non-zero with a
//! message; a closed pipe ends quietly. CI runs these as root, where a
//! rename over a device node would succeed: each refused target is checked
//! to be left as it was.

use crate::common::qsim;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Stdio;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A quick run: one experiment, few rows.
const QUICK: &[&str] = &[
    "run",
    "experiments/fmapi-pacing.toml",
    "--only",
    "exp1-direct",
    "--set",
    "rows=20",
];

/// Run with `--out target` (+ `extra`), return (exit code, stderr).
fn run_out(target: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let out = qsim()
        .args(QUICK)
        .arg("--out")
        .arg(target)
        .args(extra)
        .output()
        .unwrap();
    // the report goes to --out FILE; with --out DIR (the tables) it still
    // goes to stdout, but never when the run is refused
    let file_target = target.extension().is_some();
    if file_target || out.status.code() != Some(0) {
        assert!(out.stdout.is_empty(), "nothing on stdout");
    }
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!err.contains("panicked"), "{err}");
    (out.status.code(), err)
}

fn assert_refused(target: &Path, extra: &[&str], needle: &str) {
    let (code, err) = run_out(target, extra);
    assert_eq!(code, Some(2), "--out {}: {err}", target.display());
    assert!(err.starts_with("qsim: --out "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.contains(needle), "{err:?} lacks {needle:?}");
}

/// Names in a directory (to show no temporary file is left behind).
fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(d)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `/dev/null` has no extension, so it is refused as a results directory
/// here; the report-file rules meet a device through `null-link.txt` below.
#[test]
fn character_device_is_refused_and_left_a_device() {
    let before = fs::metadata("/dev/null").unwrap();
    assert!(before.file_type().is_char_device());
    for extra in [&[][..], &["--force"][..]] {
        assert_refused(Path::new("/dev/null"), extra, "character device");
        let after = fs::metadata("/dev/null").unwrap();
        assert!(after.file_type().is_char_device(), "/dev/null replaced!");
        assert_eq!(after.rdev(), before.rdev());
        assert_eq!(after.ino(), before.ino());
    }
    // no temporary file left in /dev
    assert!(!names(Path::new("/dev"))
        .iter()
        .any(|n| n.contains("qsim-tmp")));
}

#[test]
fn fifo_is_refused_without_blocking() {
    let d = tempfile::tempdir().unwrap();
    // as a report file (pipe.txt) and as a results directory (pipe)
    for name in ["pipe.txt", "pipe"] {
        let fifo = d.path().join(name);
        let st = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(st.success());
        // opening a FIFO for writing would block with no reader: qsim must not
        // open it at all (the test would hang otherwise)
        assert_refused(&fifo, &["--force"], "FIFO");
        assert_refused(&fifo, &[], "FIFO");
        assert!(fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo());
    }
    assert_eq!(names(d.path()), ["pipe", "pipe.txt"]);
}

#[test]
fn directory_is_refused_as_a_report_file() {
    let d = tempfile::tempdir().unwrap();
    let sub = d.path().join("sub.txt");
    fs::create_dir(&sub).unwrap();
    assert_refused(&sub, &["--force"], "a directory");
    assert!(sub.is_dir());
    assert!(names(&sub).is_empty());
    assert_eq!(names(d.path()), ["sub.txt"]);
}

#[test]
fn nonempty_directory_is_kept_without_force_and_foreign_files_even_with_it() {
    let d = tempfile::tempdir().unwrap();
    let sub = d.path().join("sub");
    fs::create_dir(&sub).unwrap();
    fs::write(sub.join("mine.txt"), "precious\n").unwrap();
    assert_refused(&sub, &[], "not empty");
    assert_refused(&sub, &["--force"], "holds mine.txt");
    assert_eq!(names(&sub), ["mine.txt"]);
    assert_eq!(
        fs::read_to_string(sub.join("mine.txt")).unwrap(),
        "precious\n"
    );
    assert_eq!(names(d.path()), ["sub"], "no temporary directory left");
    // an empty directory is filled; a second run needs --force
    let empty = d.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let (code, err) = run_out(&empty, &[]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(
        names(&empty),
        [
            "manifest.json",
            "points.csv",
            "points.parquet",
            "runs.csv",
            "runs.parquet"
        ]
    );
    assert_refused(&empty, &[], "not empty");
    let (code, err) = run_out(&empty, &["--force"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(names(d.path()), ["empty", "sub"]);
}

#[test]
fn out_dir_never_follows_links_or_replaces_files() {
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("real");
    fs::create_dir(&real).unwrap();
    let link = d.path().join("link");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let null_link = d.path().join("null-link");
    std::os::unix::fs::symlink("/dev/null", &null_link).unwrap();
    let dangling = d.path().join("dangling");
    std::os::unix::fs::symlink(d.path().join("nowhere"), &dangling).unwrap();
    for l in [&link, &null_link, &dangling] {
        for extra in [&[][..], &["--force"][..]] {
            assert_refused(l, extra, "symbolic link");
        }
        assert!(fs::symlink_metadata(l).unwrap().file_type().is_symlink());
    }
    assert!(names(&real).is_empty(), "nothing written through the link");
    assert!(!d.path().join("nowhere").exists());
    let plain = d.path().join("plain");
    fs::write(&plain, "keep").unwrap();
    assert_refused(&plain, &["--force"], "a regular file");
    assert_eq!(fs::read_to_string(&plain).unwrap(), "keep");
    assert_eq!(
        names(d.path()),
        ["dangling", "link", "null-link", "plain", "real"]
    );
}

#[test]
fn existing_file_is_kept_without_force_and_replaced_with_it() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("report.txt");
    fs::write(&f, "precious\n").unwrap();
    assert_refused(&f, &[], "--force");
    assert_eq!(fs::read_to_string(&f).unwrap(), "precious\n");
    let (code, err) = run_out(&f, &["--force"]);
    assert_eq!(code, Some(0), "{err}");
    let text = fs::read_to_string(&f).unwrap();
    assert!(text.contains("exp1-direct"), "{text}");
    assert_eq!(names(d.path()), ["report.txt"], "no temporary file left");
}

#[test]
fn new_file_is_written_whole() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("new.json");
    let (code, err) = run_out(&f, &["--format", "json"]);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&f).unwrap()).unwrap();
    assert_eq!(v["experiments"].as_array().unwrap().len(), 1);
    assert_eq!(names(d.path()), ["new.json"]);
}

#[test]
fn symlink_is_written_through_and_stays_a_link() {
    let d = tempfile::tempdir().unwrap();
    let real = d.path().join("real.txt");
    let link = d.path().join("link.txt");
    fs::write(&real, "old\n").unwrap();
    std::os::unix::fs::symlink(&real, &link).unwrap();
    // the target exists: kept without --force
    assert_refused(&link, &[], "--force");
    assert_eq!(fs::read_to_string(&real).unwrap(), "old\n");
    // with --force the file the link points to is replaced; the link stays
    let (code, err) = run_out(&link, &["--force"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(fs::symlink_metadata(&link)
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read_link(&link).unwrap(), real);
    assert!(fs::read_to_string(&real).unwrap().contains("exp1-direct"));
    assert_eq!(names(d.path()), ["link.txt", "real.txt"]);
}

#[test]
fn symlink_to_a_device_or_to_nothing_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let to_null = d.path().join("null-link.txt");
    std::os::unix::fs::symlink("/dev/null", &to_null).unwrap();
    assert_refused(&to_null, &["--force"], "character device");
    assert!(fs::metadata("/dev/null")
        .unwrap()
        .file_type()
        .is_char_device());
    assert!(fs::symlink_metadata(&to_null)
        .unwrap()
        .file_type()
        .is_symlink());
    let dangling = d.path().join("dangling.txt");
    std::os::unix::fs::symlink(d.path().join("nowhere/x.txt"), &dangling).unwrap();
    assert_refused(&dangling, &["--force"], "symbolic link to nothing");
    let mut n = names(d.path());
    n.sort();
    assert_eq!(n, ["dangling.txt", "null-link.txt"]);
}

#[test]
fn unwritable_out_exits_2_before_running() {
    let d = tempfile::tempdir().unwrap();
    assert_refused(&d.path().join("no/such/dir/r.txt"), &[], "no/such/dir");
    // as root a mode-0500 directory is still writable, so use a path
    // through a regular file, which no user can create files in
    let file = d.path().join("plain");
    fs::write(&file, "x").unwrap();
    assert_refused(&file.join("r.txt"), &["--force"], "Not a directory");
    assert_eq!(fs::read_to_string(&file).unwrap(), "x");
}

#[test]
fn bad_input_writes_no_file() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("r.txt");
    let (code, _) = run_out(&f, &["--set", "cooldown_s=1e12"]);
    assert_eq!(code, Some(2));
    assert!(names(d.path()).is_empty());
}

#[test]
fn plan_and_sweep_take_force_too() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("plan.txt");
    fs::write(&f, "keep").unwrap();
    let out = qsim()
        .args(["plan", "--model", "ideal", "--out"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(fs::read_to_string(&f).unwrap(), "keep");
    let out = qsim()
        .args(["plan", "--model", "ideal", "--force", "--out"])
        .arg(&f)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(fs::read_to_string(&f).unwrap().len() > 100);
    let s = d.path().join("sweep.txt");
    fs::write(&s, "keep").unwrap();
    let out = qsim()
        .args([
            "sweep",
            "experiments/fmapi-pacing.toml",
            "--vary",
            "rows=10,20",
        ])
        .args(["--only", "exp1-direct", "--out"])
        .arg(&s)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(fs::read_to_string(&s).unwrap(), "keep");
}

#[test]
fn stdout_write_error_exits_1_with_a_message() {
    let full = fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let out = std::process::Command::new(assert_cmd::cargo::cargo_bin("qsim"))
        .current_dir(root())
        .args(QUICK)
        .stdout(Stdio::from(full))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.starts_with("qsim: stdout: write failed"), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
}

#[test]
fn closed_pipe_ends_quietly() {
    // a reader that closes at once: the report (several KB of JSON for 20
    // seeds) meets a closed pipe
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("qsim"))
        .current_dir(root())
        .args(["run", "--seeds", "3", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "quiet on a closed pipe: {err}");
}

/// The write itself fails after the temporary file exists: a file-size
/// limit (`ulimit -f`, with SIGXFSZ ignored so the write returns EFBIG)
/// smaller than the report. The old file stays whole and no temporary file
/// is left behind: the report is written to a temporary file and renamed
/// over the target only once complete.
#[test]
fn a_write_failing_midway_keeps_the_old_file_and_leaves_no_temp() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("report.json");
    // every experiment of the file: a report larger than the limit below
    let args = [
        "run",
        "experiments/fmapi-pacing.toml",
        "--set",
        "rows=20",
        "--format",
        "json",
    ];
    let ok = qsim().args(args).arg("--out").arg(&f).output().unwrap();
    assert_eq!(ok.status.code(), Some(0));
    let whole = fs::read(&f).unwrap();
    assert!(whole.len() > 2048, "report of {} bytes", whole.len());
    fs::write(&f, "precious\n").unwrap();
    // 1 block of the shell's ulimit unit (512 or 1,024 bytes)
    let out = std::process::Command::new("sh")
        .current_dir(root())
        .arg("-c")
        .arg("trap '' XFSZ; ulimit -f 1 && exec \"$0\" \"$@\"")
        .arg(assert_cmd::cargo::cargo_bin("qsim"))
        .args(args)
        .args(["--force", "--out"])
        .arg(&f)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        matches!(out.status.code(), Some(c) if c != 0),
        "a failed write must fail the run: {:?} {err}",
        out.status
    );
    assert!(err.starts_with("qsim: --out "), "{err}");
    assert_eq!(
        fs::read_to_string(&f).unwrap(),
        "precious\n",
        "old file intact"
    );
    assert_eq!(names(d.path()), ["report.json"], "no temporary file left");
}
