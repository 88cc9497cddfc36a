//! Issue 41, cases 3–10 through the command line (case 1: `trust_caps`
//! and `proxy_trust`; case 2: `input_kinds`; case 7's statistic: the unit
//! test `the_index_of_dispersion_is_0_for_a_constant_rate_and_1_for_poisson`).
//! Verdicts are exit codes, messages, files left behind and peak memory
//! (the child's `ru_maxrss`); work is bounded by a CPU-time limit, never by
//! the wall clock.

use crate::common::qsim;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Run qsim under `sh` with `pre` (ulimits, traps) and a CPU-time limit:
/// (exit code, stdout, stderr, peak RSS in MB).
fn run_sh(pre: &str, args: &[&str], cpu_s: u32) -> (Option<i32>, String, String, f64) {
    // python's resource module reads the child's peak RSS (ru_maxrss, KB);
    // the shell line is its first argument (never quoted into its source)
    let script = "import resource, subprocess, sys\n\
         r = subprocess.run(['sh', '-c', sys.argv[1]] + sys.argv[2:], capture_output=True)\n\
         sys.stdout.buffer.write(r.stdout)\n\
         sys.stderr.buffer.write(r.stderr)\n\
         print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr)\n";
    let line = format!("{pre}; ulimit -t {cpu_s}; exec \"$0\" \"$@\"");
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(line)
        .arg(env!("CARGO_BIN_EXE_qsim"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    let (body, last) = err
        .trim_end()
        .rsplit_once('\n')
        .unwrap_or(("", err.trim_end()));
    let mut it = last.split_whitespace();
    let code: i32 = it.next().unwrap().parse().unwrap();
    let kb: f64 = it.next().unwrap().parse().unwrap();
    (
        (code >= 0).then_some(code),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        body.to_string(),
        kb / 1024.0,
    )
}

fn run(args: &[&str], cpu_s: u32) -> (Option<i32>, String, String, f64) {
    run_sh("true", args, cpu_s)
}

fn refused(args: &[&str], needles: &[&str]) -> String {
    let (code, _, err, _) = run(args, 10);
    assert_eq!(code, Some(2), "{args:?}: {err}");
    assert!(err.starts_with("qsim: "), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?}: {err} lacks {n:?}");
    }
    err
}

fn csv(dir: &Path, name: &str, rows: &[(f64, u32, u32)]) -> String {
    let mut t = String::from("t,i,o\n");
    for (s, i, o) in rows {
        t.push_str(&format!("{s},{i},{o}\n"));
    }
    let p = dir.join(name);
    std::fs::write(&p, t).unwrap();
    p.display().to_string()
}

/// experiments/azure-traces.toml with absolute paths, `extra` added to the
/// code scenario's trace table (`, loops = 113`), written into `dir`.
fn azure_exp(dir: &Path, name: &str, extra: &str) -> String {
    let r = root().display().to_string();
    let text = std::fs::read_to_string(root().join("experiments/azure-traces.toml"))
        .unwrap()
        .replace("../models/", &format!("{r}/models/"))
        .replace("\"data/traces/", &format!("\"{r}/experiments/data/traces/"))
        .replace(
            "AzureLLMInferenceTrace_code.csv\" }",
            &format!("AzureLLMInferenceTrace_code.csv\"{extra} }}"),
        );
    let f = dir.join(name);
    std::fs::write(&f, text).unwrap();
    f.display().to_string()
}

const CSV_FLAGS: [&str; 8] = [
    "--trace-format",
    "csv",
    "--time-column",
    "t",
    "--input-column",
    "i",
    "--output-column",
    "o",
];

/// Case 3: memory followed a trace's time span: two rows 9e9 s apart took
/// 1.18 GB (a slot per minute of the span); `--compress 3e-7` failed an
/// allocation; `--plot` of a 1e8 s span wrote a 167 MB SVG. A span past 1e9
/// s is now refused; within it, memory and plots follow the rows.
#[test]
fn trace_memory_and_plots_follow_rows_not_the_span() {
    let d = tempfile::tempdir().unwrap();
    let far = csv(d.path(), "far.csv", &[(0.0, 10, 10), (9e9, 10, 10)]);
    let mut a = vec!["trace", "stats", far.as_str()];
    a.extend(CSV_FLAGS);
    refused(&a, &["far.csv", "span at most 1e9 s"]);
    let wide = csv(d.path(), "wide.csv", &[(0.0, 10, 10), (1e9, 10, 10)]);
    let mut a = vec!["trace", "stats", wide.as_str()];
    a.extend(CSV_FLAGS);
    let mut c = a.clone();
    c.extend(["--compress", "3e-7"]);
    refused(&c, &["--compress", "past 1e9 s"]);
    let plot = d.path().join("plots");
    let p = plot.display().to_string();
    a.extend(["--plot", p.as_str()]);
    let (code, _, err, mb) = run(&a, 20);
    assert_eq!(code, Some(0), "{err}");
    assert!(mb < 64.0, "trace stats of 2 rows 1e9 s apart: {mb:.0} MB");
    let svg = std::fs::metadata(plot.join("trace-rate.svg"))
        .unwrap()
        .len();
    assert!(svg < 1 << 20, "trace-rate.svg: {svg} bytes");
    eprintln!("trace stats, 2 rows over 1e9 s: {mb:.1} MB peak, rate plot {svg} bytes");
    // trace plan of the same two rows (3.47 GB allocation failure before)
    let exp = d.path().join("wide.toml");
    std::fs::write(
        &exp,
        format!(
            "kind = \"server\"\nserver = \"{}\"\nreplicas = 1\ndrain = true\nduration_s = 60\ninput_tokens = {{ dist = \"const\", value = 10 }}\noutput_tokens = {{ dist = \"const\", value = 10 }}\n[[scenario]]\nname = \"wide\"\ntrace = {{ file = \"{wide}\", format = \"csv\", time_column = \"t\", input_column = \"i\", output_column = \"o\" }}\n",
            root().join("models/llama-3.1-8b-h100-vllm.toml").display()
        ),
    )
    .unwrap();
    let e = exp.display().to_string();
    let (code, out, err, mb) = run(&["trace", "plan", &e, "--e2e-p95", "10s"], 60);
    assert!(code == Some(0), "{err}\n{out}");
    assert!(mb < 100.0, "trace plan of 2 rows 1e9 s apart: {mb:.0} MB");
    eprintln!("trace plan, 2 rows over 1e9 s: {mb:.1} MB peak");
}

/// Case 4: `compress = 1e-7` put every row past the end and ran "submitted
/// 1" of 8,819 rows with exit 0; now refused naming the field.
#[test]
fn a_compress_that_moves_rows_past_1e9_s_is_refused() {
    let d = tempfile::tempdir().unwrap();
    let f = azure_exp(d.path(), "c.toml", ", compress = 1e-7");
    refused(
        &["run", &f, "--only", "code"],
        &["scenario.code.trace.compress", "past 1e9 s"],
    );
}

/// Case 5: dates wrapped: 2023-01-01 and 2608-08-07 gave "duration
/// 32919926 s"; now a date out of i64 nanoseconds is refused, naming the
/// file and line.
#[test]
fn dates_out_of_range_are_refused() {
    let d = tempfile::tempdir().unwrap();
    for (name, late) in [
        ("a.csv", "2608-08-07 00:00:00"),
        ("b.csv", "9999-12-31 23:59:59"),
    ] {
        let p = d.path().join(name);
        std::fs::write(
            &p,
            format!("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-01-01 00:00:00,10,10\n{late},10,10\n"),
        )
        .unwrap();
        refused(
            &["trace", "stats", p.to_str().unwrap()],
            &[name, "out of range"],
        );
    }
}

/// Case 6: `trace stats --loops 10000 --scale 1000` (8.8e10 rows) and the
/// same as a `trace plan` scenario ran past 15 s; a 10 M-row `trace plan`
/// took 31 CPU-s and 1 GB. Now both are under `qsim run`'s work budget:
/// refused at once (well inside a 10 CPU-s limit).
#[test]
fn trace_commands_run_under_the_work_budget() {
    let code = "experiments/data/traces/AzureLLMInferenceTrace_code.csv";
    refused(
        &[
            "trace", "stats", code, "--loops", "10000", "--scale", "1000",
        ],
        &["work budget", "--max-requests"],
    );
    let d = tempfile::tempdir().unwrap();
    for (loops, scale) in [(10_000, 1000), (1134, 1)] {
        let f = azure_exp(
            d.path(),
            &format!("l{loops}.toml"),
            &format!(", loops = {loops}, scale = {scale}"),
        );
        refused(
            &["trace", "plan", &f, "--only", "code", "--e2e-p95", "10s"],
            &["work budget", "--max-requests"],
        );
    }
}

/// Case 6: `qsim run` of a 10 M-row trace was refused by a memory estimate
/// of 1,562 MB (every request in flight) for a run that peaked at 16 MB.
/// The estimate (the trace's fluid backlog) is now within 2x of the peak
/// the run then uses: checked on the Azure code trace looped to ~1 M rows.
#[test]
fn the_memory_estimate_of_a_trace_run_is_within_2x_of_its_peak() {
    let d = tempfile::tempdir().unwrap();
    let f = azure_exp(d.path(), "loop.toml", ", loops = 113");
    let base = ["run", f.as_str(), "--only", "code"];
    let mut a = base.to_vec();
    a.extend(["--max-memory-mb", "1"]);
    let err = refused(&a, &["memory budget"]);
    let est: f64 = err
        .split("would need about ")
        .nth(1)
        .and_then(|s| s.split(" MB").next())
        .and_then(|s| s.replace(',', "").parse().ok())
        .unwrap_or_else(|| panic!("no estimate in {err}"));
    let (code, _, err, peak) = run(&base, 120);
    assert_eq!(code, Some(0), "{err}");
    eprintln!("qsim run, Azure code x113 (~1 M rows): estimate {est} MB, peak {peak:.1} MB");
    assert!(
        est <= 2.0 * peak && peak <= 2.0 * est,
        "estimate {est} MB against a peak of {peak:.1} MB"
    );
}

/// Case 8: `--plot` on a full disk left `.NAME.tmp.png` files (sim2real,
/// options, trace stats) and did not name the flag; `--html` on a full
/// disk said "--out"; `trace stats --plot EXISTING_FILE` exited 1 without
/// naming the flag; `plan --emit-proxy-config EXISTING` said "--out". A
/// full disk is a file-size limit here (`ulimit -f`, SIGXFSZ ignored: a
/// write past it fails with EFBIG, as on a full disk).
#[test]
fn failed_outputs_leave_nothing_and_name_their_flag() {
    let d = tempfile::tempdir().unwrap();
    let full = "trap '' XFSZ; ulimit -f 8";
    for (args, flag) in [
        (vec!["sim2real", "--plot", "PLOTS"], "--plot"),
        (
            vec![
                "trace",
                "stats",
                "experiments/data/traces/AzureLLMInferenceTrace_code.csv",
                "--plot",
                "PLOTS",
            ],
            "--plot",
        ),
        (vec!["sim2real", "--html", "PLOTS/page.html"], "--html"),
    ] {
        let plots = d.path().join("plots");
        let _ = std::fs::remove_dir_all(&plots);
        if flag == "--html" {
            std::fs::create_dir(&plots).unwrap();
        }
        let p = plots.display().to_string();
        let args: Vec<String> = args.iter().map(|a| a.replace("PLOTS", &p)).collect();
        let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let (code, _, err, _) = run_sh(full, &args, 60);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        let left: Vec<String> = std::fs::read_dir(&plots)
            .map(|r| {
                r.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        assert!(left.is_empty(), "{args:?} left {left:?}");
    }
    // an existing file as --plot DIR: exit 2 naming the flag
    let file = d.path().join("a-file");
    std::fs::write(&file, "keep").unwrap();
    let f = file.display().to_string();
    refused(
        &[
            "trace",
            "stats",
            "experiments/data/traces/AzureLLMInferenceTrace_code.csv",
            "--plot",
            &f,
        ],
        &["--plot", "not a directory"],
    );
    refused(
        &["plan", "--model", "ideal", "--emit-proxy-config", &f],
        &["--emit-proxy-config", "file exists"],
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep");
}

/// Case 8: `options --help` showed `--within 5m` and `--set
/// option[2].replicas=3`, both refused; `--fewest` with impossible targets
/// exited 0.
#[test]
fn options_takes_its_help_examples_and_fails_when_nothing_meets() {
    let f = "experiments/options-fmapi.toml";
    let (code, out, err, _) = run(
        &[
            "options",
            f,
            "--rows",
            "20",
            "--within",
            "5m",
            "--set",
            "option[6].replicas=3",
        ],
        60,
    );
    assert_eq!(code, Some(0), "{err}\n{out}");
    let (code, out, err, _) = run(
        &["options", f, "--rows", "20", "--fewest", "--e2e-p95", "1ms"],
        120,
    );
    assert_eq!(code, Some(1), "{err}\n{out}");
    assert!(
        out.contains("fewest") || !out.is_empty(),
        "the report is printed"
    );
    assert!(err.contains("no option meets"), "{err}");
}

/// Case 9: consumer names with escape sequences or newlines in a proxy log
/// were printed raw by `trace stats`; now shown escaped.
#[test]
fn names_from_a_log_cannot_drive_the_terminal_or_forge_lines() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("decisions-1.jsonl");
    let line = |consumer: &str, ns: u64| {
        format!(
            "{{\"id\":1,\"run_unix_ms\":1,\"time_scale\":1.0,\"consumer\":\"{consumer}\",\"arrival_ns\":{ns},\"arrival_unix_ms\":0,\"decided_ns\":null,\"input_tokens\":50,\"max_tokens\":200,\"stream\":false,\"decision\":\"admitted\",\"status\":200,\"usage_input\":50,\"usage_output\":20,\"generation\":1}}\n"
        )
    };
    let text = line("team\\u001b[31mRED", 0)
        + &line("x\\nforged: 1000 requests", 1_000_000_000)
        + &line("plain", 2_000_000_000);
    std::fs::write(&p, text).unwrap();
    let out = qsim()
        .args(["trace", "stats", "--trace-format", "proxy"])
        .arg(&p)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!stdout.contains('\u{1b}'), "{stdout}");
    assert!(!stdout.lines().any(|l| l.starts_with("forged")), "{stdout}");
    assert!(stdout.contains("team\\u{1b}[31mRED"), "{stdout}");
}

/// Case 10: `[proxy.log] dir` naming a regular file exited 1; now exit 2
/// naming the field, before any port is bound.
#[test]
fn a_log_dir_that_is_a_file_is_a_config_error() {
    let d = tempfile::tempdir().unwrap();
    let file = d.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let cfg = d.path().join("p.toml");
    std::fs::write(
        &cfg,
        format!(
            "kind = \"proxy\"\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"http://127.0.0.1:9\"\n[proxy.log]\ndir = \"{}\"\n[proxy.keys]\nA = [\"secret-a\"]\n[deployment]\ncapacity = 100\n[[consumer]]\nname = \"A\"\n",
            file.display()
        ),
    )
    .unwrap();
    refused(
        &["proxy", "--config", cfg.to_str().unwrap()],
        &["proxy.log.dir", "not a directory"],
    );
}
