//! Inputs that cost without bound (issue 26, item 7): a huge `--burst`,
//! a character device or an oversized file given as input, and validation
//! superlinear in the number of consumers. Every verdict is by CPU time
//! (`ulimit -t`, the thread's CPU clock) or by counted work, never by the
//! wall clock, so a busy machine cannot fail them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Run the binary with a CPU-time limit of `cpu_s` seconds and a 2 GB
/// address-space limit: (exit code, stderr); `None` if a signal ended it
/// (over the CPU time or out of memory).
fn limited(args: &[&str], cpu_s: u32) -> (Option<i32>, String) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 2000000; ulimit -t {cpu_s}; exec \"$0\" \"$@\" > /dev/null"
        ))
        .arg(env!("CARGO_BIN_EXE_qsim"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Exit 2 within `cpu_s` CPU-seconds, one `qsim: ` line holding every needle.
fn refused_within(args: &[&str], cpu_s: u32, needles: &[&str]) {
    let (code, err) = limited(args, cpu_s);
    assert_eq!(
        code,
        Some(2),
        "{args:?}: exit {code:?} (None: killed, over {cpu_s} CPU-s or 2 GB): {err}"
    );
    assert!(err.starts_with("qsim: "), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
    }
}

/// `--burst 2^64` became a bucket of u64::MAX units: ~30 CPU-seconds of
/// admission decisions that the work meter did not count, then exit 0. Now
/// refused before anything runs (well under a CPU-second; 10 allowed).
#[test]
fn huge_burst_is_refused_up_front() {
    for b in ["18446744073709551616", "18446744073709551615", "1e300"] {
        refused_within(
            &["plan", "--burst", b, "--model", "ideal"],
            10,
            &["--burst", "deeper than a year of capacity", "give at most"],
        );
    }
    // the same bound on the file's field, named as such
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("s.toml");
    let text = std::fs::read_to_string(root().join("experiments/shared-deployment.toml")).unwrap();
    std::fs::write(
        &f,
        text.replace(
            "threshold = 0.8 ",
            "burst = 9223372036854775807\nthreshold = 0.8 ",
        ),
    )
    .unwrap();
    refused_within(
        &[
            "plan",
            "--scenarios",
            f.to_str().unwrap(),
            "--model",
            "ideal",
        ],
        10,
        &[
            "s.toml",
            "deployment.burst",
            "deeper than a year of capacity",
        ],
    );
    // a year of capacity is still accepted
    let (code, err) = limited(
        &[
            "plan",
            "--capacity",
            "1000",
            "--burst",
            "525600000",
            "--model",
            "ideal",
        ],
        20,
    );
    assert_eq!(code, Some(0), "{err}");
}

fn symlink(to: &str, at: &Path) {
    std::os::unix::fs::symlink(to, at).unwrap();
}

/// A character device is refused as input by every command that reads
/// one, before reading it (it used to be read until memory ran out).
#[test]
fn a_character_device_is_not_read() {
    let d = tempfile::tempdir().unwrap();
    let p = |n: &str| d.path().join(n).display().to_string();
    symlink("/dev/zero", &d.path().join("zero.csv"));
    symlink("/dev/zero", &d.path().join("zero.json"));
    symlink("/dev/zero", &d.path().join("log.csv"));
    for s in ["s1", "s2"] {
        std::fs::create_dir(d.path().join(s)).unwrap();
        symlink("/dev/zero", &d.path().join(s).join("manifest.json"));
    }
    let (zcsv, zjson, log, s1, s2, out) = (
        p("zero.csv"),
        p("zero.json"),
        p("log.csv"),
        p("s1"),
        p("s2"),
        p("out"),
    );
    let cases: Vec<Vec<&str>> = vec![
        vec!["run", "/dev/zero"],
        vec!["sweep", "/dev/zero", "--vary", "workers=1,2"],
        vec!["plan", "--scenarios", "/dev/zero"],
        vec!["proxy", "--config", "/dev/zero"],
        vec!["replay", "--target", "http://127.0.0.1:9", "/dev/zero"],
        vec!["compare", &zcsv, "experiments/fmapi-pacing.toml"],
        vec!["compare", "/dev/null", &zcsv],
        vec![
            "calibrate",
            "server",
            "--profile",
            "/dev/zero",
            "tests/golden/plan.json",
        ],
        vec![
            "calibrate",
            "server",
            "--profile",
            "models/llama-3.1-8b-h100-vllm.toml",
            &zjson,
        ],
        vec!["calibrate", "hosted", "--log", &log, "--max-tokens", "10"],
        vec!["merge", &zcsv, &zcsv],
        vec!["merge", &s1, &s2, "--out", &out],
    ];
    for args in cases {
        refused_within(&args, 20, &["not a regular file"]);
    }
}

/// A file over its kind's cap is refused with the cap in the message
/// (a sparse file: nothing is written to disk).
#[test]
fn an_oversized_file_is_refused_with_the_cap() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("big.toml");
    std::fs::File::create(&f)
        .unwrap()
        .set_len(qsim_sim::input::MAX_CONFIG_BYTES + 1)
        .unwrap();
    let name = f.display().to_string();
    refused_within(&["run", &name], 20, &[&name, "larger than 64 MiB"]);
}

/// CPU time of the calling thread so far (`/proc/thread-self/schedstat`):
/// what a busy machine does not inflate, unlike the wall clock.
fn thread_cpu() -> std::time::Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: u64 = s.split_whitespace().next().unwrap().parse().unwrap();
    std::time::Duration::from_nanos(ns)
}

/// Consumers in the validation test.
const MANY: usize = 50_000;
/// Thread CPU time allowed to validate [`MANY`] consumers. Linear
/// validation takes about 0.3 CPU-s here (parsing the 1 MB file
/// included); the quadratic name checks it replaced (n²/2 name comparisons
/// per check) took 15 CPU-s; the bound leaves a factor of ~6 for a slower
/// machine, and CPU time is not inflated by a busy one.
const MANY_CPU: std::time::Duration = std::time::Duration::from_secs(2);

/// Validation is linear in the number of consumers (issue 26, item 7):
/// a scenario file with 50,000 consumers, renamed by `--names` and all
/// needed by `--need`, validates within a CPU-time bound (duplicate-name
/// checks by a set, not by a search of the names before each).
#[test]
fn validation_is_linear_in_the_consumers() {
    let d = tempfile::tempdir().unwrap();
    let f = d.path().join("many.toml");
    let mut text =
        std::fs::read_to_string(root().join("experiments/shared-deployment.toml")).unwrap();
    for i in 0..MANY {
        text.push_str(&format!(
            "\n[[consumer]]\nname = \"c{i}\"\nreserved_pct = 0\n"
        ));
    }
    std::fs::write(&f, text).unwrap();
    let mut names: Vec<String> = ["A", "B", "C", "dev"].map(String::from).to_vec();
    names.extend((0..MANY).map(|i| format!("n{i}")));
    let need: Vec<String> = names.iter().map(|n| format!("{n}=1")).collect();
    let spec = qsim_sim::plan::PlanSpec {
        scenarios: Some(f),
        // the scenarios' loads name A, B, C and dev: keep those names
        names: Some(names.join(",")),
        model: Some("ideal".into()),
        seeds: 1,
        ..Default::default()
    };
    let t0 = thread_cpu();
    let (file, _) = qsim_sim::plan::build(&spec).expect("valid");
    let needs = qsim_sim::plan::parse_need(&need.join(",")).expect("valid");
    let cpu = thread_cpu() - t0;
    assert_eq!(file.limiter.consumers.len(), MANY + 4);
    assert_eq!(needs.len(), MANY + 4);
    eprintln!("validated {} consumers in {cpu:?} of CPU time", MANY + 4);
    assert!(cpu < MANY_CPU, "{cpu:?} of CPU time for {MANY} consumers");
    // a duplicate is still found, and named
    let e = qsim_sim::plan::parse_need("a=1,b=1,a=2")
        .unwrap_err()
        .to_string();
    assert!(e.contains("a given twice"), "{e}");
}
