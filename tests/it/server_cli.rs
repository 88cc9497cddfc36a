//! `qsim run` on server experiment files: JSON fields, and exit code 2 with
//! file/field/reason on bad input.

use assert_cmd::Command;
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn json_has_the_server_fields() {
    let out = Command::cargo_bin("qsim")
        .unwrap()
        .current_dir(root())
        .args([
            "run",
            "experiments/nim-load.toml",
            "--format",
            "json",
            "--set",
            "duration_s=61",
            "--set",
            "replicas=2",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let sc = &v["scenarios"][0];
    for k in [
        "ttft_p50_s",
        "ttft_p99_s",
        "itl_p50_s",
        "e2e_p50_s",
        "e2e_p99_s",
        "gpu_util",
        "kv_util",
        "concurrency_mean",
        "throughput_rps",
        "preemptions",
    ] {
        assert!(sc["total"][k].is_number(), "total.{k}");
        assert!(sc["per_replica"][1][k].is_number(), "per_replica[1].{k}");
    }
    assert_eq!(sc["per_replica"].as_array().unwrap().len(), 2);
    assert!(sc["snapshots"][0]["waiting"].is_number());
    // utilisations aggregate as the mean over replicas (regression: the
    // summed busy time was clamped at 1 before dividing, so two replicas at
    // 93 % reported 50 %)
    for k in ["gpu_util", "engine_util"] {
        let mean = (sc["per_replica"][0][k].as_f64().unwrap()
            + sc["per_replica"][1][k].as_f64().unwrap())
            / 2.0;
        let total = sc["total"][k].as_f64().unwrap();
        assert!(
            (total - mean).abs() < 0.002,
            "{k}: total {total} vs replica mean {mean}"
        );
    }
}

#[test]
fn sweep_runs_server_files() {
    let out = Command::cargo_bin("qsim")
        .unwrap()
        .current_dir(root())
        .args([
            "sweep",
            "experiments/nim-load.toml",
            "--only",
            "capacity",
            "--vary",
            "replicas=1,2",
            "--set",
            "duration_s=60",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let pts = v["points"].as_array().unwrap();
    assert_eq!(pts.len(), 2);
    let e2e = |i: usize| pts[i]["experiments"][0]["e2e_p50_s"].as_f64().unwrap();
    assert!(e2e(1) < e2e(0), "a second replica shortens E2E at 1000 RPM");
}

fn bad(file_text: &str, field: &str) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.toml");
    let model = root().join("models/gpt-oss-20b-h100-nim.toml");
    std::fs::write(&p, file_text.replace("MODEL", &model.display().to_string())).unwrap();
    let out = Command::cargo_bin("qsim")
        .unwrap()
        .arg("run")
        .arg(&p)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{file_text}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("x.toml") && err.contains(field), "{err}");
}

const BASE: &str = r#"
kind = "server"
server = "MODEL"
duration_s = 10
input_tokens = { dist = "const", value = 100 }
output_tokens = { dist = "const", value = 100 }
"#;

#[test]
fn bad_files_exit_2_naming_the_field() {
    bad(
        &format!("{BASE}[[scenario]]\nname = \"a\"\nrpm = 10\nclients = 3\n"),
        "scenario.a",
    );
    bad(&format!("{BASE}[[scenario]]\nname = \"a\"\n"), "scenario.a");
    bad(
        &format!("{BASE}router = \"random\"\n[[scenario]]\nname = \"a\"\nrpm = 10\n"),
        "router",
    );
    bad(
        &format!("{BASE}[[scenario]]\nname = \"a\"\nrpm = -5\n"),
        "scenario.a.rpm",
    );
    bad(
        &format!("{BASE}snapshots_s = [5, 2]\n[[scenario]]\nname = \"a\"\nrpm = 5\n"),
        "snapshots_s.1",
    );
    bad(&format!("{BASE}[[scenario]]\nname = \"a\"\nrpm = 5\narrivals = {{ process = \"gamma\", cv = 0 }}\n"), "scenario.a.arrivals");
    bad(
        &format!("{BASE}[[scenario]]\nname = \"a\"\nrpm = 5\nbogus = 1\n"),
        "scenario.a",
    );
    bad(
        &format!(
            "{}[[scenario]]\nname = \"a\"\nrpm = 5\n",
            BASE.replace("MODEL", "/nonexistent.toml")
        ),
        "server",
    );
}
