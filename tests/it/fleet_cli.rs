//! `qsim fleet` from the command line: bad input (a pool with an unknown
//! profile, no replica anywhere, a threshold outside the lengths, a model
//! no pool serves, a CDF that is not monotone or does not reach 1) exits 2
//! with one line naming the field and writes nothing; the same command
//! twice prints the same bytes, and its tables land in --out DIR.

use std::path::Path;
use std::process::Command;

fn qsim(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("qsim");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

const MODELS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models");

fn fleet_file(dir: &Path, name: &str, pools: &str, workload: &str) -> String {
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!("kind = \"fleet\"\nduration_s = 60\n{pools}\n[workload]\n{workload}\n"),
    )
    .unwrap();
    p.display().to_string()
}

/// Exit 2, one line on stderr naming `what`, nothing on stdout, nothing
/// written to `out`.
fn refused(args: &[&str], what: &str, out: &Path) {
    let (code, stdout, stderr) = qsim(args);
    assert_eq!(code, 2, "{args:?}: {stderr}");
    assert!(stdout.is_empty(), "{args:?}: {stdout}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(
        stderr.contains(what),
        "{args:?}: {stderr:?} should name {what:?}"
    );
    assert!(!out.exists(), "{args:?}: wrote {}", out.display());
}

#[test]
fn bad_fleet_input_exits_2_naming_the_field() {
    let d = tempfile::tempdir().unwrap();
    let out = d.path().join("tables");
    let out_s = format!("{}/", out.display());
    let wl = "rate = 5\ninput_tokens = { dist = \"const\", value = 100 }\noutput_tokens = { dist = \"const\", value = 10 }";
    let h100 = format!("profile = \"{MODELS}/llama-3.1-8b-h100-vllm.toml\"");
    let cases = [
        (
            fleet_file(
                d.path(),
                "a.toml",
                "[[pool]]\nname = \"a\"\nprofile = \"no-such.toml\"",
                wl,
            ),
            "pool.a.profile",
        ),
        (
            fleet_file(
                d.path(),
                "b.toml",
                &format!("[[pool]]\nname = \"a\"\n{h100}\nreplicas = 0"),
                wl,
            ),
            "no replica in any pool",
        ),
        // (a first pool's max_tokens below the workload's lengths is
        // accepted today: whether it should be refused is open, issue 39)
        (
            fleet_file(
                d.path(),
                "d.toml",
                &format!("[[pool]]\nname = \"a\"\n{h100}\nmodels = [\"x\"]"),
                &format!("{wl}\nmix = {{ x = 1, y = 1 }}"),
            ),
            "workload.mix.y",
        ),
        (
            fleet_file(
                d.path(),
                "e.toml",
                &format!("[[pool]]\nname = \"d\"\n{h100}\nprefill_pool = \"a\""),
                wl,
            ),
            "pool.d.prefill_pool",
        ),
    ];
    for (file, what) in &cases {
        refused(&["fleet", file, "--out", &out_s], what, &out);
    }
    let cdf = |name: &str, text: &str| {
        let p = d.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let search = |c: &str| {
        vec![
            "fleet".to_string(),
            "--cdf".into(),
            c.to_string(),
            "--rate".into(),
            "50".into(),
            "--ttft-p99".into(),
            "1s".into(),
            "--out".into(),
            out_s.clone(),
        ]
    };
    let not_monotone = cdf("nm.json", "[[100, 0.5], [200, 0.4], [300, 1.0]]");
    let short = cdf("short.json", "[[100, 0.5], [200, 0.9]]");
    for (c, what) in [(not_monotone, "cdf.1: not monotone"), (short, "reach 1")] {
        let a = search(&c);
        refused(
            &a.iter().map(String::as_str).collect::<Vec<_>>(),
            what,
            &out,
        );
    }
    let ok = cdf("ok.json", "[[100, 0.5], [200, 1.0]]");
    let mut a = search(&ok);
    a.extend(["--threshold".into(), "5000".into()]);
    refused(
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        "--threshold",
        &out,
    );
    let mut a = search(&ok);
    a.extend(["--gpu".into(), "Z80".into()]);
    refused(
        &a.iter().map(String::as_str).collect::<Vec<_>>(),
        "--gpu",
        &out,
    );
}

#[test]
fn a_search_is_deterministic_and_writes_its_tables() {
    let d = tempfile::tempdir().unwrap();
    let cdf = d.path().join("c.json");
    std::fs::write(&cdf, "[[200, 0.3], [1000, 0.9], [4000, 1.0]]").unwrap();
    let out = d.path().join("t");
    let args = |o: Option<&str>| {
        let mut a = vec![
            "fleet".to_string(),
            "--cdf".into(),
            cdf.display().to_string(),
            "--rate".into(),
            "20".into(),
            "--ttft-p99".into(),
            "1s".into(),
            "--gpu".into(),
            "H100-80GB-SXM:1".into(),
            "--model".into(),
            "llama-3.1-8b".into(),
            "--threshold".into(),
            "1000".into(),
            "--requests".into(),
            "2000".into(),
            "--format".into(),
            "json".into(),
        ];
        if let Some(o) = o {
            a.extend(["--out".into(), o.to_string()]);
        }
        a
    };
    let run = |a: Vec<String>| qsim(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let (c1, o1, e1) = run(args(None));
    assert_eq!(c1, 0, "{e1}");
    let (c2, o2, _) = run(args(Some(&format!("{}/", out.display()))));
    assert_eq!(c2, 0);
    assert_eq!(o1, o2, "the same search prints the same bytes");
    let v: serde_json::Value = serde_json::from_str(&o1).unwrap();
    let best = v["answer"]["best"].as_str().expect("a cheapest layout");
    assert!(
        best == "one pool" || best == "split at 1000 tokens",
        "{best}"
    );
    for f in ["runs.parquet", "runs.csv", "layouts.csv", "manifest.json"] {
        assert!(out.join(f).exists(), "{f}");
    }
    // every run of the cheapest pool's candidate with fewer replicas misses
    let runs = std::fs::read_to_string(out.join("runs.csv")).unwrap();
    assert!(runs.lines().count() > 2, "{runs}");
}
