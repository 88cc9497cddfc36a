//! Issue 41, case 2 and its acceptance: every input path of every command
//! — a file named on the command line, or a file another input names (an
//! experiment's endpoint, server profile and trace; an options file's
//! batch and endpoint; a proxy config's CA file) — given a FIFO, `/dev/zero`
//! or a directory is refused: exit 2, one `qsim: ` line naming the path,
//! before anything is read (`[proxy] upstream_ca_file` naming a FIFO used
//! to hang start-up; a link to `/dev/zero`, to be read until a 2 GB
//! allocation failed).
//!
//! No verdict rests on wall-clock speed: each run is limited to 10 CPU
//! seconds (`ulimit -t`) and 2 GB; a process still alive after 60 s of wall
//! time is hung (blocked opening a FIFO uses no CPU) — a liveness check, far
//! above the milliseconds a refusal takes. The wall times are printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// (exit code, stderr, wall time); `None` for a signal (CPU limit) or a hang.
fn run(args: &[String]) -> (Option<i32>, String, Duration) {
    let t = Instant::now();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 2000000; ulimit -t 10; exec \"$0\" \"$@\" > /dev/null")
        .arg(env!("CARGO_BIN_EXE_qsim"))
        .args(args)
        .current_dir(root())
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            use std::io::Read;
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (st.code(), err, t.elapsed());
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            return (None, "hung: still running after 60 s".into(), t.elapsed());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Which kinds of bad input a case is given.
#[derive(Clone, Copy, PartialEq)]
enum Takes {
    /// A file: a FIFO, `/dev/zero` and a directory are all refused.
    File,
    /// A directory input: a FIFO and `/dev/zero` are refused.
    Dir,
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

#[test]
fn every_input_refuses_fifos_devices_and_directories() {
    let d = tempfile::tempdir().unwrap();
    let fifo = d.path().join("input.fifo");
    let st = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(st.success(), "mkfifo");
    let zero = d.path().join("zero.toml");
    std::os::unix::fs::symlink("/dev/zero", &zero).unwrap();
    let dir = d.path().join("a-directory.toml");
    std::fs::create_dir(&dir).unwrap();
    let r = root();
    let path = |p: &str| r.join(p).display().to_string();
    let proxy_cfg = |extra: &str| {
        format!(
            "kind = \"proxy\"\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"https://127.0.0.1:9\"\n{extra}\n[proxy.keys]\nA = [\"secret-a\"]\n[deployment]\ncapacity = 1000\n[[consumer]]\nname = \"A\"\n"
        )
    };
    let hosted = std::fs::read_to_string(r.join("experiments/fmapi-pacing.toml")).unwrap();
    let server = std::fs::read_to_string(r.join("experiments/azure-traces.toml")).unwrap();
    let options = std::fs::read_to_string(r.join("experiments/options-fmapi.toml")).unwrap();
    let cfgs = tempfile::tempdir().unwrap();
    let good_proxy = write(cfgs.path(), "good-proxy.toml", &proxy_cfg(""));
    // (name, takes, args with "{P}" for the bad path, files to write with "{P}")
    type Case = (
        &'static str,
        Takes,
        Vec<String>,
        Vec<(&'static str, String)>,
    );
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let cases: Vec<Case> = vec![
        ("run FILE", Takes::File, s(&["run", "{P}"]), vec![]),
        (
            "sweep FILE",
            Takes::File,
            s(&["sweep", "{P}", "--vary", "workers=1,2"]),
            vec![],
        ),
        (
            "recommend FILE",
            Takes::File,
            s(&["recommend", "{P}"]),
            vec![],
        ),
        (
            "plan --scenarios",
            Takes::File,
            s(&["plan", "--scenarios", "{P}"]),
            vec![],
        ),
        (
            "plan --model",
            Takes::File,
            s(&["plan", "--model", "{P}"]),
            vec![],
        ),
        ("options FILE", Takes::File, s(&["options", "{P}"]), vec![]),
        (
            "trace stats FILE",
            Takes::File,
            s(&["trace", "stats", "{P}"]),
            vec![],
        ),
        (
            "trace plan FILE",
            Takes::File,
            s(&["trace", "plan", "{P}", "--e2e-p95", "10s"]),
            vec![],
        ),
        (
            "proxy --config",
            Takes::File,
            s(&["proxy", "--config", "{P}"]),
            vec![],
        ),
        (
            "[proxy] upstream_ca_file",
            Takes::File,
            s(&["proxy", "--config", "CFG"]),
            vec![("CFG", proxy_cfg("upstream_ca_file = \"{P}\""))],
        ),
        (
            "proxy --profile",
            Takes::File,
            vec![
                "proxy".into(),
                "--config".into(),
                good_proxy.clone(),
                "--profile".into(),
                "{P}".into(),
            ],
            vec![],
        ),
        (
            "serve PROFILE",
            Takes::File,
            s(&["serve", "{P}", "--listen", "127.0.0.1:0"]),
            vec![],
        ),
        (
            "load FILE",
            Takes::File,
            s(&["load", "{P}", "--target", "http://127.0.0.1:9"]),
            vec![],
        ),
        (
            "replay FILE",
            Takes::File,
            s(&["replay", "{P}", "--target", "http://127.0.0.1:9"]),
            vec![],
        ),
        (
            "replay --rows",
            Takes::File,
            vec![
                "replay".into(),
                path("experiments/fmapi-pacing.toml"),
                "--rows".into(),
                "{P}".into(),
                "--target".into(),
                "http://127.0.0.1:9".into(),
            ],
            vec![],
        ),
        (
            "compare SIMULATED",
            Takes::File,
            vec![
                "compare".into(),
                "{P}".into(),
                path("experiments/fmapi-pacing.toml"),
            ],
            vec![],
        ),
        (
            "compare OBSERVED",
            Takes::File,
            vec!["compare".into(), "SIM".into(), "{P}".into()],
            vec![("SIM", "seed,subject,metric,value\n1,exp1,ok,200\n".into())],
        ),
        (
            "calibrate hosted --log",
            Takes::File,
            s(&["calibrate", "hosted", "--log", "{P}", "--max-tokens", "10"]),
            vec![],
        ),
        (
            "calibrate server --profile",
            Takes::File,
            vec![
                "calibrate".into(),
                "server".into(),
                "--profile".into(),
                "{P}".into(),
                path("tests/golden/plan.json"),
            ],
            vec![],
        ),
        (
            "calibrate server BENCH",
            Takes::File,
            vec![
                "calibrate".into(),
                "server".into(),
                "--profile".into(),
                path("models/llama-3.1-8b-h100-vllm.toml"),
                "{P}".into(),
            ],
            vec![],
        ),
        (
            "whatif --policy",
            Takes::File,
            vec![
                "whatif".into(),
                "--log".into(),
                cfgs.path().display().to_string(),
                "--policy".into(),
                "{P}".into(),
            ],
            vec![],
        ),
        (
            "whatif --log",
            Takes::Dir,
            vec![
                "whatif".into(),
                "--log".into(),
                "{P}".into(),
                "--policy".into(),
                good_proxy.clone(),
            ],
            vec![],
        ),
        (
            "merge SHARD",
            Takes::Dir,
            s(&["merge", "{P}", "{P}"]),
            vec![],
        ),
        (
            "an experiment's endpoint",
            Takes::File,
            s(&["run", "EXP"]),
            vec![(
                "EXP",
                hosted.replace(
                    "endpoint = \"../models/databricks-claude-haiku-4-5.toml\"",
                    "endpoint = \"{P}\"",
                ),
            )],
        ),
        (
            "a server experiment's profile",
            Takes::File,
            s(&["run", "EXP"]),
            vec![(
                "EXP",
                server.replace(
                    "server = \"../models/llama-3.1-8b-h100-vllm.toml\"",
                    "server = \"{P}\"",
                ),
            )],
        ),
        (
            "a scenario's trace file",
            Takes::File,
            s(&["trace", "plan", "EXP", "--e2e-p95", "10s"]),
            vec![(
                "EXP",
                server
                    .replace("../models/", &path("models/"))
                    .replace("data/traces/AzureLLMInferenceTrace_code.csv", "{P}"),
            )],
        ),
        (
            "an options file's batch",
            Takes::File,
            s(&["options", "OPT"]),
            vec![(
                "OPT",
                options.replace("batch = \"fmapi-pacing.toml\"", "batch = \"{P}\""),
            )],
        ),
        (
            "an option's endpoint",
            Takes::File,
            s(&["options", "OPT"]),
            vec![(
                "OPT",
                options
                    .replace(
                        "batch = \"fmapi-pacing.toml\"",
                        &format!("batch = \"{}\"", path("experiments/fmapi-pacing.toml")),
                    )
                    .replace("\"../models/azure-openai-gpt-4o-ptu.toml\"", "\"{P}\""),
            )],
        ),
    ];
    let mut slowest = (Duration::ZERO, String::new());
    let mut checked = 0;
    let mut failures: Vec<String> = Vec::new();
    for (name, takes, args, files) in &cases {
        for (kind, bad) in [
            ("a FIFO", &fifo),
            ("/dev/zero", &zero),
            ("a directory", &dir),
        ] {
            if *takes == Takes::Dir && kind == "a directory" {
                continue;
            }
            let p = bad.display().to_string();
            let case_dir = tempfile::tempdir().unwrap();
            let mut args: Vec<String> = args.iter().map(|a| a.replace("{P}", &p)).collect();
            for (key, text) in files {
                let ext = if *key == "SIM" { "csv" } else { "toml" };
                let f = write(
                    case_dir.path(),
                    &format!("{key}.{ext}"),
                    &text.replace("{P}", &p),
                );
                for a in args.iter_mut() {
                    if a == key {
                        *a = f.clone();
                    }
                }
            }
            let (code, err, wall) = run(&args);
            let file_name = bad.file_name().unwrap().to_string_lossy().into_owned();
            if code != Some(2)
                || !err.starts_with("qsim: ")
                || err.trim_end().lines().count() != 1
                || !err.contains(&file_name)
            {
                failures.push(format!("{name} given {kind}: exit {code:?}: {err}"));
            }
            if wall > slowest.0 {
                slowest = (wall, format!("{name} given {kind}"));
            }
            checked += 1;
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked}:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!(
        "input kinds: {checked} refusals, the slowest {:.3} s wall ({})",
        slowest.0.as_secs_f64(),
        slowest.1
    );
}
