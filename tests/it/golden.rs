//! Golden outputs: the text and JSON reports of the main commands, saved
//! before the "one core, two drivers" restructuring (tests/golden/), must
//! stay byte-identical. A change that moves a figure on purpose updates the
//! golden file in the same commit and says why (regenerate with
//! `QSIM_BLESS=1 cargo test --release --test golden`).

use assert_cmd::Command;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(name: &str, args: &[&str]) {
    for (fmt, ext) in [(None, "txt"), (Some("json"), "json")] {
        let mut c = Command::cargo_bin("qsim").unwrap();
        c.current_dir(root()).args(args);
        if let Some(f) = fmt {
            c.args(["--format", f]);
        }
        let out = c.output().unwrap();
        assert!(
            out.status.success(),
            "qsim {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let path = root().join("tests/golden").join(format!("{name}.{ext}"));
        if std::env::var_os("QSIM_BLESS").is_some() {
            std::fs::write(&path, &out.stdout).unwrap();
            continue;
        }
        let want = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        if out.stdout != want {
            let got = String::from_utf8_lossy(&out.stdout);
            let want = String::from_utf8_lossy(&want);
            let first = got
                .lines()
                .zip(want.lines())
                .position(|(a, b)| a != b)
                .unwrap_or(got.lines().count().min(want.lines().count()));
            panic!(
                "qsim {args:?} ({ext}) differs from {} at line {}:\n  got:  {:?}\n  want: {:?}",
                path.display(),
                first + 1,
                got.lines().nth(first),
                want.lines().nth(first)
            );
        }
    }
}

#[test]
fn fmapi_pacing_20_seeds() {
    check("run-seeds20", &["run", "--seeds", "20"]);
}

#[test]
fn fmapi_policies_5_seeds() {
    check(
        "policies-seeds5",
        &["run", "experiments/fmapi-policies.toml", "--seeds", "5"],
    );
}

#[test]
fn nim_load() {
    check("nim-load", &["run", "experiments/nim-load.toml"]);
}

#[test]
fn plan_default() {
    check(
        "plan",
        &["plan", "--capacity", "1000", "--reserve", "30,20,30"],
    );
}

#[test]
fn plan_inverse() {
    check(
        "plan-need",
        &["plan", "--need", "A=250,B=150,C=250", "--e2e-p95", "4s"],
    );
}
