//! Helpers of the `qsim serve` live tests: start `qsim serve`, run a
//! Python script (the venv's interpreter, the official openai SDK).

#![allow(dead_code)]

use crate::common::{first_line_after, venv_bin, Proc};
use serde_json::Value;
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Start `qsim serve PROFILE --listen 127.0.0.1:0 --time-scale X --seed N`;
/// returns the process and the base URL read from stdout's first line.
pub fn serve(profile: &Path, time_scale: f64, seed: u64) -> (Proc, String) {
    serve_at(profile, "127.0.0.1:0", time_scale, seed)
}

/// [`serve`] on a given address (a fixed port: a restarted upstream is
/// found at the same address).
pub fn serve_at(profile: &Path, listen: &str, time_scale: f64, seed: u64) -> (Proc, String) {
    let child = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .arg("serve")
        .arg(profile)
        .args(["--listen", listen, "--time-scale"])
        .arg(time_scale.to_string())
        .arg("--seed")
        .arg(seed.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start qsim serve");
    let mut p = Proc(child);
    let url = first_line_after(&mut p, "listening on ", "qsim serve");
    (p, url)
}

/// Run `qsim ARGS`, killing it past `timeout`: (exit code, stdout, stderr).
/// Runs in the crate's root, so relative paths name the repository's files.
pub fn qsim(args: &[&str], timeout: Duration) -> (i32, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("qsim");
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("qsim {args:?} did not end in {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

pub fn model(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name)
}

/// Run a Python script with `URL` set; its last stdout line is JSON.
pub fn python(script: &str, url: &str, timeout: Duration) -> Value {
    python_env(script, url, &[], timeout)
}

/// [`python`] with more environment variables.
pub fn python_env(script: &str, url: &str, env: &[(&str, String)], timeout: Duration) -> Value {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(script.as_bytes()).unwrap();
    let mut child = Command::new(venv_bin("python"))
        .arg(f.path())
        .env("URL", url)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("python script timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}
