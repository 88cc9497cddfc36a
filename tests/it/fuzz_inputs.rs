//! Fuzzing the inputs (issue 8, item 6), seeded and bounded, plus the
//! hostile cases the issue lists, each as a test.
//!
//! Every file in `experiments/` and `models/` is mutated (numbers set to 0,
//! negative, huge, tiny, NaN, infinite; fields dropped, added, duplicated,
//! retyped; bytes flipped, deleted, inserted; lines duplicated), and random
//! flag sets are built for `run`, `sweep` and `plan`. Each case must end
//! without a panic, in bounded time, with either an accepted input or a
//! one-line error (exit 0 or 2).
//!
//! **What is run and what is only validated.** qsim has no work budget yet
//! (issue 8, item 1, is another change), so an accepted mutation such as
//! `rows = 1e8` or `replicas = 4096` could simulate for minutes. Therefore:
//! - [`validate_cases`] (the bulk, [`IN_PROCESS_CASES`]) calls the
//!   library's loaders and validators directly: `cli::load_experiment`,
//!   `HostedProfile::from_value`, `load_profile`, `plan::build`,
//!   `plan::parse_need`, `cli::duration_arg`, and the clap parser for the
//!   flag sets. Nothing is simulated. A panic is caught with its input and
//!   backtrace; a case over [`CASE_LIMIT`] counts as a hang (post hoc: an
//!   in-process call cannot be killed, but every validator is linear in
//!   the input).
//! - [`binary_cases`] ([`BINARY_CASES`]) spawns the `qsim` binary with a
//!   CPU-time limit (ulimit -t) and a 2 GB address-space limit on every mutated
//!   experiment file and on random `plan` flag sets (`--need` and
//!   `--e2e-p95` included), each under a small work budget
//!   (`--max-requests` [`FUZZ_BUDGET`]): whatever the mutation, the run is
//!   bounded or refused before it simulates. It checks exit 0 or 2 (1 for
//!   an unmet `--need`/`--e2e-p95` target), a one-line `qsim: ` message on
//!   exit 1 and 2, and no panic.
//!
//! The number of cases and cases per minute are printed (`--nocapture`).

use qsim::cli::{Cli, Cmd};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::io::Read;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// In-process (validate-only) cases.
const IN_PROCESS_CASES: usize = 6000;
/// Cases run through the binary.
const BINARY_CASES: usize = 320;
/// The work budget of every binary run (`--max-requests`): a fraction of a
/// second of simulation, so every mutated case can run.
const FUZZ_BUDGET: u64 = 400_000;
/// A validation using more CPU time than this (its thread's, not the
/// wall clock: a busy machine cannot fail it) counts as a hang.
const CASE_LIMIT: Duration = Duration::from_secs(5);
/// CPU-time limit of one binary run (`ulimit -t`, seconds): the verdict.
const BINARY_CPU_LIMIT_S: u32 = 60;
/// Wall-clock guard of one binary run, only against a process that never
/// ends without using CPU (qsim never sleeps in these runs); far above the
/// CPU limit so that load on the machine cannot trip it.
const BINARY_HANG_GUARD: Duration = Duration::from_secs(900);

/// CPU time of the calling thread so far (`/proc/thread-self/schedstat`).
fn thread_cpu() -> Duration {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").expect("schedstat");
    let ns: u64 = s.split_whitespace().next().unwrap().parse().unwrap();
    Duration::from_nanos(ns)
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The shipped files: (path relative to the root, text).
fn corpus() -> Vec<(String, String)> {
    let mut v = Vec::new();
    for dir in ["experiments", "models"] {
        let mut names: Vec<_> = std::fs::read_dir(root().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().and_then(|e| e.to_str()) == Some("toml"))
            .collect();
        names.sort();
        for p in names {
            let rel = format!("{dir}/{}", p.file_name().unwrap().to_string_lossy());
            v.push((rel, std::fs::read_to_string(&p).unwrap()));
        }
    }
    assert!(v.len() >= 8, "corpus too small: {}", v.len());
    v
}

// ---------------------------------------------------------------- mutation

const NUMBERS: &[f64] = &[
    0.0,
    -1.0,
    -0.5,
    1e-300,
    1e300,
    -1e300,
    1e12,
    2e10,
    1e10,
    4096.0,
    1e9,
    f64::NAN,
    f64::INFINITY,
    f64::NEG_INFINITY,
];
const INTS: &[i64] = &[0, -1, -1000, 1, 4097, i64::MAX, i64::MIN, 1 << 40];

/// Paths to every node of a document (table keys and array indices).
fn node_paths(v: &toml::Value, at: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
    match v {
        toml::Value::Table(t) => {
            for (k, c) in t {
                at.push(k.clone());
                out.push(at.clone());
                node_paths(c, at, out);
                at.pop();
            }
        }
        toml::Value::Array(a) => {
            for (i, c) in a.iter().enumerate() {
                at.push(i.to_string());
                out.push(at.clone());
                node_paths(c, at, out);
                at.pop();
            }
        }
        _ => {}
    }
}

fn node_mut<'a>(v: &'a mut toml::Value, path: &[String]) -> Option<&'a mut toml::Value> {
    let mut cur = v;
    for seg in path {
        cur = match cur {
            toml::Value::Table(t) => t.get_mut(seg)?,
            toml::Value::Array(a) => a.get_mut(seg.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(cur)
}

fn random_scalar(rng: &mut ChaCha8Rng) -> toml::Value {
    match rng.gen_range(0..6) {
        0 => toml::Value::Float(NUMBERS[rng.gen_range(0..NUMBERS.len())]),
        1 => toml::Value::Integer(INTS[rng.gen_range(0..INTS.len())]),
        2 => toml::Value::Boolean(rng.gen()),
        3 => toml::Value::String(
            ["", "x", "ideal", "none", "-1", "exp1-direct"][rng.gen_range(0..6)].into(),
        ),
        4 => toml::Value::Array(vec![]),
        _ => toml::Value::Table(toml::map::Map::new()),
    }
}

/// One structural mutation of a parsed document.
fn mutate_value(v: &mut toml::Value, rng: &mut ChaCha8Rng) -> String {
    let mut paths = Vec::new();
    node_paths(v, &mut Vec::new(), &mut paths);
    if paths.is_empty() {
        return "empty".into();
    }
    let p = paths[rng.gen_range(0..paths.len())].clone();
    let (parent_path, last) = p.split_at(p.len() - 1);
    let label = p.join(".");
    let op = rng.gen_range(0..7);
    let parent = node_mut(v, parent_path).unwrap();
    match (op, parent) {
        // a number to an edge value (or any leaf to a number)
        (0 | 1, parent) => {
            let node = node_mut(parent, last).unwrap();
            let new = match node {
                toml::Value::Integer(i) if rng.gen_bool(0.5) => toml::Value::Integer(
                    [0, -*i, i.saturating_mul(1 << 20), i64::MAX][rng.gen_range(0..4)],
                ),
                toml::Value::Float(f) if rng.gen_bool(0.3) => toml::Value::Float(-*f),
                _ => toml::Value::Float(NUMBERS[rng.gen_range(0..NUMBERS.len())]),
            };
            *node = new.clone();
            format!("{label} = {new}")
        }
        // drop a field or an array item
        (2, toml::Value::Table(t)) => {
            t.remove(&last[0]);
            format!("drop {label}")
        }
        (2, toml::Value::Array(a)) => {
            a.remove(last[0].parse::<usize>().unwrap());
            format!("drop {label}")
        }
        // duplicate an array item (duplicate names, twice the work)
        (3, toml::Value::Array(a)) => {
            let i: usize = last[0].parse().unwrap();
            let c = a[i].clone();
            a.insert(i, c);
            format!("duplicate {label}")
        }
        // retype
        (3..=5, parent) => {
            let node = node_mut(parent, last).unwrap();
            let new = random_scalar(rng);
            *node = new.clone();
            format!("{label} = {new} (retyped)")
        }
        // add an unknown or a known-elsewhere field
        (_, toml::Value::Table(t)) => {
            let k = [
                "bogus",
                "rows",
                "name",
                "kind",
                "duration_s",
                "replicas",
                "latency",
            ][rng.gen_range(0..7)];
            let val = random_scalar(rng);
            t.insert(k.into(), val.clone());
            format!("add {}.{k} = {val}", parent_path.join("."))
        }
        (_, _) => "no-op".into(),
    }
}

/// One textual mutation (bytes flipped, deleted, inserted; a line duplicated).
fn mutate_text(text: &str, rng: &mut ChaCha8Rng) -> (String, String) {
    let mut b = text.as_bytes().to_vec();
    if b.is_empty() {
        return (String::new(), "empty".into());
    }
    let i = rng.gen_range(0..b.len());
    let what = match rng.gen_range(0..4) {
        0 => {
            b[i] ^= 1 << rng.gen_range(0..8);
            format!("flip a bit of byte {i}")
        }
        1 => {
            b.remove(i);
            format!("delete byte {i}")
        }
        2 => {
            const BYTES: &[u8] = b"=[]{}\".,-0123456789e\n#";
            let c = BYTES[rng.gen_range(0..BYTES.len())];
            b.insert(i, c);
            format!("insert {:?} at {i}", c as char)
        }
        _ => {
            let lines: Vec<&str> = text.lines().collect();
            let l = rng.gen_range(0..lines.len());
            let mut out = lines.clone();
            out.insert(l, lines[l]);
            return (out.join("\n"), format!("duplicate line {}", l + 1));
        }
    };
    (String::from_utf8_lossy(&b).into_owned(), what)
}

/// A mutated version of `text`: (text, description).
fn mutate(text: &str, rng: &mut ChaCha8Rng) -> (String, String) {
    if rng.gen_bool(0.25) {
        return mutate_text(text, rng);
    }
    let mut v: toml::Value = toml::Value::Table(text.parse::<toml::Table>().unwrap());
    let n = rng.gen_range(1..=3);
    let what: Vec<String> = (0..n).map(|_| mutate_value(&mut v, rng)).collect();
    (toml::to_string(&v).unwrap_or_default(), what.join("; "))
}

// -------------------------------------------------------------- flag sets

fn random_number_text(rng: &mut ChaCha8Rng) -> String {
    [
        "0",
        "-1",
        "-10",
        "1",
        "1e300",
        "-1e300",
        "NaN",
        "inf",
        "1e9",
        "100",
        "0.5",
        "abc",
        "",
        "4d",
        "2s",
        "1500ms",
        "-2s",
        "1e12",
        "18446744073709551616",
        "30",
        "1e-300",
    ][rng.gen_range(0..21)]
    .to_string()
}

fn random_list(rng: &mut ChaCha8Rng) -> String {
    let n = rng.gen_range(1..5);
    (0..n)
        .map(|_| random_number_text(rng))
        .collect::<Vec<_>>()
        .join(",")
}

fn random_names(rng: &mut ChaCha8Rng) -> String {
    let n = rng.gen_range(1..5);
    (0..n)
        .map(|_| ["A", "B", "C", "dev", "", "X", "A"][rng.gen_range(0..7)])
        .collect::<Vec<_>>()
        .join(",")
}

/// Random `qsim plan` flags (no --need/--e2e-p95 when `runnable`, so that
/// a binary run stays short).
fn plan_flags(rng: &mut ChaCha8Rng, runnable: bool) -> Vec<String> {
    let mut a: Vec<String> = vec!["qsim".into(), "plan".into()];
    let n = rng.gen_range(0..6);
    for _ in 0..n {
        let pick = rng.gen_range(0..if runnable { 9 } else { 11 });
        let (flag, val) = match pick {
            0 => ("--capacity", random_number_text(rng)),
            1 => ("--reserve", random_list(rng)),
            2 => ("--threshold", random_number_text(rng)),
            3 => ("--names", random_names(rng)),
            4 => (
                "--semantics",
                [
                    "strict-floors",
                    "rate-limit-only",
                    "litellm-priority",
                    "partitioned",
                    "x",
                    "",
                ][rng.gen_range(0..6)]
                .into(),
            ),
            5 => (
                "--unit",
                ["rpm", "tpm", "qps", ""][rng.gen_range(0..4)].into(),
            ),
            6 => ("--burst", random_number_text(rng)),
            7 => ("--seed", random_number_text(rng)),
            8 => ("--replicas", random_number_text(rng)),
            9 => (
                "--need",
                format!("{}={}", random_names(rng), random_number_text(rng)),
            ),
            _ => ("--e2e-p95", random_number_text(rng)),
        };
        a.push(flag.into());
        a.push(val);
    }
    a
}

/// Random `--set PATH=VALUE` from a document's own paths.
fn random_set(doc: &toml::Value, rng: &mut ChaCha8Rng) -> String {
    let mut paths = Vec::new();
    node_paths(doc, &mut Vec::new(), &mut paths);
    let p = if paths.is_empty() || rng.gen_bool(0.1) {
        "no.such.path".to_string()
    } else {
        paths[rng.gen_range(0..paths.len())].join(".")
    };
    format!("{p}={}", random_number_text(rng))
}

// ------------------------------------------------------- panic capturing

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        eprintln!("panic: {info}");
        let bt = std::backtrace::Backtrace::force_capture();
        *LAST_PANIC.lock().unwrap() = Some(format!("{info}\n{bt}"));
    }));
}

/// An error message must be one line and name its source.
fn check_message(msg: &str) -> Result<(), String> {
    if msg.is_empty() || msg.contains('\n') {
        return Err(format!("message not one line: {msg:?}"));
    }
    Ok(())
}

/// Validate one experiment file (as `run` does, without running it).
fn validate_experiment(path: &Path, sets: &[String], only: &[String]) -> Result<(), String> {
    use qsim_sim::experiment::ExperimentFile;
    let mut ef: ExperimentFile =
        qsim::cli::common::load_experiment(path, sets).map_err(|e| e.to_string())?;
    ef.retain_only(only).map_err(|e| e.to_string())
}

/// Validate one model file by its kind.
fn validate_model(name: &str, path: &Path, text: &str) -> Result<(), String> {
    let v = qsim_sim::config::parse_toml(name, text).map_err(|e| e.to_string())?;
    match v.get("kind").and_then(|k| k.as_str()) {
        Some("server") => qsim_sim::server::load_profile(path)
            .map(|_| ())
            .map_err(|e| e.to_string()),
        _ => qsim_sim::hosted::HostedProfile::from_value(name, v)
            .map(|_| ())
            .map_err(|e| e.to_string()),
    }
}

/// Validate a plan flag set as `qsim plan` does before simulating.
fn validate_plan(argv: &[String]) -> Result<(), String> {
    let cli = <Cli as clap::Parser>::try_parse_from(argv)
        .map_err(|e| qsim::cli::common::usage_error_line(&e))?;
    let Cmd::Plan { args, .. } = cli.cmd else {
        unreachable!("plan flags parse to plan")
    };
    if let Some(n) = &args.need {
        qsim_sim::plan::parse_need(n).map_err(|e| e.to_string())?;
    }
    qsim_sim::plan::build(&args.spec())
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// A scratch tree: `experiments/` (mutated files go here) next to a copy
/// of `models/`, so relative `../models/…` paths resolve.
fn scratch() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    std::fs::create_dir(d.path().join("experiments")).unwrap();
    std::fs::create_dir(d.path().join("models")).unwrap();
    for e in std::fs::read_dir(root().join("models")).unwrap() {
        let p = e.unwrap().path();
        std::fs::copy(&p, d.path().join("models").join(p.file_name().unwrap())).unwrap();
    }
    d
}

#[test]
fn validate_cases() {
    install_hook();
    let corpus = corpus();
    let dir = scratch();
    let mut rng = ChaCha8Rng::seed_from_u64(0x9_5eed);
    let mut failures = Vec::new();
    let (mut accepted, mut refused) = (0usize, 0usize);
    let mut slowest = (Duration::ZERO, String::new());
    let t0 = Instant::now();
    for case in 0..IN_PROCESS_CASES {
        let (rel, text) = &corpus[case % corpus.len()];
        let is_model = rel.starts_with("models/");
        // one case in five: a random flag set instead of a file mutation
        let flag_case = case % 5 == 4;
        let (desc, result) = if flag_case && case % 10 == 4 {
            let argv = plan_flags(&mut rng, false);
            let desc = argv.join(" ");
            let t = thread_cpu();
            let r = catch_unwind(AssertUnwindSafe(|| validate_plan(&argv)));
            (desc, (r, thread_cpu().saturating_sub(t)))
        } else if flag_case && !is_model {
            let doc = toml::Value::Table(text.parse::<toml::Table>().unwrap());
            let sets: Vec<String> = (0..rng.gen_range(0..3))
                .map(|_| random_set(&doc, &mut rng))
                .collect();
            let only: Vec<String> = if rng.gen_bool(0.3) {
                vec![["exp1-direct", "nope", "", "normal"][rng.gen_range(0..4)].to_string()]
            } else {
                vec![]
            };
            let mut argv: Vec<String> = vec!["qsim".into(), "run".into(), rel.clone()];
            for s in &sets {
                argv.extend(["--set".into(), s.clone()]);
            }
            if !only.is_empty() {
                argv.extend(["--only".into(), only.join(",")]);
            }
            for flag in ["--seed", "--seeds", "--format"] {
                if rng.gen_bool(0.2) {
                    let v = if flag == "--format" {
                        ["json", "table", "xml"][rng.gen_range(0..3)].to_string()
                    } else {
                        random_number_text(&mut rng)
                    };
                    argv.extend([flag.to_string(), v]);
                }
            }
            let desc = argv.join(" ");
            let t = thread_cpu();
            let r = catch_unwind(AssertUnwindSafe(|| {
                let cli = <Cli as clap::Parser>::try_parse_from(&argv)
                    .map_err(|e| qsim::cli::common::usage_error_line(&e))?;
                let Cmd::Run { file, opts } = cli.cmd else {
                    unreachable!("run flags parse to run")
                };
                validate_experiment(&root().join(file), &opts.sets, &opts.only)
            }));
            (desc, (r, thread_cpu().saturating_sub(t)))
        } else {
            let (mutated, what) = mutate(text, &mut rng);
            let name = rel.replace('/', "-");
            let path = dir
                .path()
                .join(if is_model { "models" } else { "experiments" })
                .join(format!("fuzz-{name}"));
            std::fs::write(&path, &mutated).unwrap();
            let desc = format!("{rel}: {what}");
            let t = thread_cpu();
            let r = catch_unwind(AssertUnwindSafe(|| {
                if is_model {
                    validate_model(&path.display().to_string(), &path, &mutated)
                } else {
                    validate_experiment(&path, &[], &[])
                }
            }));
            (desc, (r, thread_cpu().saturating_sub(t)))
        };
        let (r, took) = result;
        if took > slowest.0 {
            slowest = (took, desc.clone());
        }
        if took > CASE_LIMIT {
            failures.push(format!("case {case} took {took:?} (hang?): {desc}"));
        }
        match r {
            Ok(Ok(())) => accepted += 1,
            Ok(Err(msg)) => {
                refused += 1;
                if let Err(m) = check_message(&msg) {
                    failures.push(format!("case {case}: {desc}: {m}"));
                }
            }
            Err(_) => {
                let p = LAST_PANIC.lock().unwrap().take().unwrap_or_default();
                failures.push(format!("case {case} PANICKED: {desc}\n{p}"));
            }
        }
    }
    let _ = std::panic::take_hook();
    let el = t0.elapsed();
    eprintln!(
        "fuzz (validate only): {IN_PROCESS_CASES} cases in {:.1} s = {:.0} cases/min; {accepted} accepted, {refused} refused; slowest {:?}: {}",
        el.as_secs_f64(),
        IN_PROCESS_CASES as f64 / el.as_secs_f64() * 60.0,
        slowest.0,
        slowest.1
    );
    assert!(
        accepted > 50 && refused > 500,
        "mutations too weak or too strong: {accepted} accepted, {refused} refused"
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

/// Run the binary under a timeout and a 2 GB address-space limit; returns
/// (exit code, stderr), or Err if it timed out.
fn run_binary(args: &[String]) -> Result<(Option<i32>, String), String> {
    let bin = assert_cmd::cargo::cargo_bin("qsim");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -v 2000000; ulimit -t {BINARY_CPU_LIMIT_S}; exec \"$0\" \"$@\" > /dev/null"
        ))
        .arg(&bin)
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            if st.code().is_none() {
                return Err(format!(
                    "killed by a signal ({st}): over {BINARY_CPU_LIMIT_S} CPU-seconds or 2 GB; {err}"
                ));
            }
            return Ok((st.code(), err));
        }
        if t.elapsed() > BINARY_HANG_GUARD {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("still running after {BINARY_HANG_GUARD:?} (hang)"));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn binary_cases() {
    let corpus: Vec<_> = corpus()
        .into_iter()
        .filter(|(r, _)| r.starts_with("experiments/"))
        .collect();
    let dir = scratch();
    let mut rng = ChaCha8Rng::seed_from_u64(0xb1_0a7);
    let mut failures = Vec::new();
    let (mut n, mut ran, mut codes) = (0usize, 0usize, [0usize; 3]);
    let t0 = Instant::now();
    while n < BINARY_CASES {
        let (rel, text) = &corpus[n % corpus.len()];
        let (mut args, desc) = if n % 4 == 3 {
            let runnable = rng.gen_bool(0.5);
            let mut argv = plan_flags(&mut rng, runnable);
            argv.remove(0);
            if rng.gen_bool(0.5) {
                argv.extend(["--model".into(), "ideal".into()]);
            }
            let d = argv.join(" ");
            (argv, d)
        } else {
            let (mutated, what) = mutate(text, &mut rng);
            let path = dir
                .path()
                .join("experiments")
                .join(format!("bin-{}", rel.replace('/', "-")));
            std::fs::write(&path, &mutated).unwrap();
            let mut argv = vec!["run".to_string(), path.display().to_string()];
            if rng.gen_bool(0.3) {
                argv.extend(["--format".into(), "json".into()]);
            }
            (argv, format!("{rel}: {what}"))
        };
        args.extend(["--max-requests".into(), FUZZ_BUDGET.to_string()]);
        let plan_target = args.iter().any(|a| a == "--need");
        n += 1;
        ran += 1;
        match run_binary(&args) {
            Err(e) => failures.push(format!("{desc}: {e}")),
            Ok((code, err)) => {
                if err.contains("panicked") {
                    failures.push(format!("{desc}: PANIC\n{err}"));
                }
                match code {
                    Some(0) => codes[0] += 1,
                    Some(c @ 2) | Some(c @ 1) if c == 2 || plan_target => {
                        codes[c as usize] += 1;
                        if !(err.starts_with("qsim: ") && err.trim_end().lines().count() == 1) {
                            failures
                                .push(format!("{desc}: not a one-line `qsim: ` message: {err:?}"));
                        }
                    }
                    c => failures.push(format!("{desc}: exit {c:?}: {err}")),
                }
            }
        }
    }
    let el = t0.elapsed();
    eprintln!(
        "fuzz (binary): {ran} runs in {:.1} s = {:.0} runs/min; exit 0: {}, exit 1: {}, exit 2: {}",
        el.as_secs_f64(),
        ran as f64 / el.as_secs_f64() * 60.0,
        codes[0],
        codes[1],
        codes[2]
    );
    assert_eq!(ran, BINARY_CASES, "every case runs");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// ------------------------------------------- the listed cases

fn qsim_run(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(assert_cmd::cargo::cargo_bin("qsim"))
        .args(args)
        .current_dir(root())
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Exit 2, one line, and every needle in the message.
fn refused(args: &[&str], needles: &[&str]) {
    let (code, err) = qsim_run(args);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert!(err.starts_with("qsim: "), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err:?}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err:?} lacks {n:?}");
    }
}

/// A copy of fmapi-pacing.toml and its profile with edits, in `d`.
fn pacing_variant(d: &Path, exp_edit: &str, profile_edit: (&str, &str)) -> PathBuf {
    let exp = std::fs::read_to_string(root().join("experiments/fmapi-pacing.toml")).unwrap();
    let prof =
        std::fs::read_to_string(root().join("models/databricks-claude-haiku-4-5.toml")).unwrap();
    assert!(prof.contains(profile_edit.0));
    std::fs::write(
        d.join("p.toml"),
        prof.replace(profile_edit.0, profile_edit.1),
    )
    .unwrap();
    let exp = exp.replace("../models/databricks-claude-haiku-4-5.toml", "p.toml") + exp_edit;
    let p = d.join("e.toml");
    std::fs::write(&p, exp).unwrap();
    p
}

#[test]
fn listed_durations_are_refused_naming_the_field() {
    const EXP: &str = "experiments/fmapi-pacing.toml";
    refused(
        &["run", EXP, "--set", "cooldown_s=1e12"],
        &[
            "fmapi-pacing.toml: cooldown_s: ",
            "[0, 1e9] seconds",
            "1e12",
        ],
    );
    refused(
        &["run", EXP, "--set", "experiment.1.retry.base_s=1e300"],
        &["experiment.exp2-backoff.retry.base_s: ", "1e300"],
    );
    let d = tempfile::tempdir().unwrap();
    // ttft = 1e10 s
    let f = pacing_variant(
        d.path(),
        "",
        (
            "[latency]\n",
            "[latency]\nttft = { dist = \"const\", value = 1e10 }\n#",
        ),
    );
    let prof = std::fs::read_to_string(d.path().join("p.toml")).unwrap();
    assert!(prof.contains("value = 1e10"), "{prof}");
    refused(
        &["run", f.to_str().unwrap()],
        &["p.toml: latency.ttft: ", "`value`", "1e10"],
    );
    // a retry delay of 2e10 s
    refused(
        &[
            "run",
            EXP,
            "--set",
            "experiment.1.retry.backoff=constant",
            "--set",
            "experiment.1.retry.delay_s=2e10",
        ],
        &["experiment.exp2-backoff.retry.delay_s: ", "2e10"],
    );
    // a normal latency with a negative mean
    let f = pacing_variant(
        d.path(),
        "",
        (
            "[latency]\n",
            "[latency]\nttft = { dist = \"normal\", mean = -0.5, sd = 0.1 }\n#",
        ),
    );
    refused(
        &["run", f.to_str().unwrap()],
        &["latency.ttft: ", "`mean`", "-0.5"],
    );
    // a normal whose spread reaches below 0
    refused(
        &["run", EXP, "--set", "output_tokens.sd=100"],
        &["output_tokens: ", "mean >= 3 * sd"],
    );
}

#[test]
fn listed_messages() {
    // a negative share reaches validation instead of clap's "unexpected argument '-1'"
    refused(
        &["plan", "--reserve", "-10,20,30"],
        &["--reserve", "negative"],
    );
    // units are explained
    refused(
        &["plan", "--need", "A=100", "--e2e-p95", "4d"],
        &["--e2e-p95", "accepted units are ms, s, m and h"],
    );
    // a model file given as an experiment
    refused(
        &["run", "models/gpt-oss-20b-h100-nim.toml"],
        &["this is a server profile (kind = \"server\"), not an experiment file"],
    );
    refused(
        &["run", "models/databricks-claude-haiku-4-5.toml"],
        &["this is a hosted-API profile (kind = \"hosted\"), not an experiment file"],
    );
    // duplicates
    refused(
        &[
            "sweep",
            "experiments/fmapi-pacing.toml",
            "--vary",
            "workers=8,16",
            "--vary",
            "workers=32",
        ],
        &["--vary workers", "twice"],
    );
    refused(
        &[
            "sweep",
            "experiments/fmapi-pacing.toml",
            "--vary",
            "workers=8,8",
        ],
        &["given twice"],
    );
    let d = tempfile::tempdir().unwrap();
    let f = pacing_variant(d.path(), "", ("name = \"OTPM\"", "name = \"ITPM\""));
    refused(
        &["run", f.to_str().unwrap()],
        &["p.toml: limits.", "duplicate limit name \"ITPM\""],
    );
    // --vary on a shared file names the real problem
    refused(
        &[
            "sweep",
            "experiments/shared-deployment.toml",
            "--vary",
            "no_such_field=1,2",
        ],
        &["no_such_field"],
    );
    // serde errors on one line, path with names
    refused(
        &[
            "run",
            "experiments/fmapi-pacing.toml",
            "--set",
            "experiment.0.rowz=3",
        ],
        &["experiment.exp1-direct.rowz: ", "unknown field `rowz`"],
    );
    // usage errors on one line
    refused(&["run", "--seeds", "-1"], &["--seeds"]);
}
