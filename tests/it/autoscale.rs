//! Issue 25's autoscaling acceptance: exact timelines of a step in load
//! (scale-up after the window's mean passes the target, ready a cold start
//! later, not before), scale-down after its delay, no request lost while a
//! replica drains, the same timeline with any thread count, and bad
//! settings refused with the field named.

use qsim_sim::experiment::server::{run_scenario, ServerSuite};
use qsim_sim::server::ScaleEvent;
use std::path::Path;

const S: u64 = 1_000_000_000;

/// 60 RPM constant for 10 minutes, 240 RPM for 10, then 60 again; the
/// autoscaler watches the request rate (target 100 RPM per replica, window
/// 60 s sampled every second), cold start 120 s, scale-down delay 300 s.
fn suite(extra: &str) -> ServerSuite {
    let text = format!(
        r#"
kind = "server"
server = "../models/llama-3.1-8b-h100-vllm.toml"
duration_s = 2400
drain = true
arrivals = {{ process = "constant" }}
load_shape = {{ kind = "per_minute", factors = [1,1,1,1,1,1,1,1,1,1, 4,4,4,4,4,4,4,4,4,4, 1] }}
input_tokens = {{ dist = "const", value = 200 }}
output_tokens = {{ dist = "const", value = 100 }}
[autoscale]
min = 1
max = 4
metric = "request_rate"
target = 100
window_s = 60
cold_start_s = 120
scale_down_delay_s = 300
{extra}
[[scenario]]
name = "step"
rpm = 60
"#
    );
    let v: toml::Value = toml::from_str(&text).unwrap();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/autoscale-test.toml");
    ServerSuite::from_value(&file, v).unwrap()
}

fn ev(at: u64, replica: u32, what: &'static str) -> ScaleEvent {
    ScaleEvent {
        at: at * S,
        replica,
        what,
    }
}

#[test]
fn a_step_scales_up_after_the_window_and_the_cold_start_and_down_after_the_delay() {
    let s = suite("");
    let sc = &s.scenarios[0];
    let r = run_scenario(s.profile.clone(), sc, 7, 0);
    // Constant arrivals: every 1-s sample holds exactly 1 arrival (60 RPM)
    // before 600 s and 4 (240 RPM) after, so k s after the step the
    // window's mean is 60 + 3k RPM: above 100 (2 replicas) at k = 14, above
    // 200 (3) at k = 47. Each new replica serves 120 s after its decision.
    let ups: Vec<ScaleEvent> = r
        .scale_log
        .iter()
        .copied()
        .filter(|e| e.what == "start" || e.what == "ready")
        .collect();
    assert_eq!(
        ups,
        vec![
            ev(614, 1, "start"),
            ev(647, 2, "start"),
            ev(734, 1, "ready"),
            ev(767, 2, "ready"),
        ]
    );
    // Back to 60 RPM at 1200 s: the mean is 240 − 3k, at most 200 from
    // k = 14 (desired 2, since 1214 s), at most 100 from k = 47 (desired 1).
    // 300 s after 1214 s: down to the largest desired since (2); 300 s
    // later: down to 1.
    let downs: Vec<(u64, &str)> = r
        .scale_log
        .iter()
        .filter(|e| e.what == "drain")
        .map(|e| (e.at / S, e.what))
        .collect();
    assert_eq!(downs, vec![(1514, "drain"), (1814, "drain")]);
    // a drained replica is removed once empty, never before its drain
    for e in r.scale_log.iter().filter(|e| e.what == "removed") {
        let d = r
            .scale_log
            .iter()
            .rfind(|d| d.what == "drain" && d.replica == e.replica && d.at <= e.at)
            .expect("removed after a drain");
        assert!(e.at >= d.at && e.at < d.at + 60 * S, "{d:?} {e:?}");
    }
    assert_eq!(
        r.scale_log.iter().filter(|e| e.what == "removed").count(),
        2
    );
    // no replica but the first served before 734 s: the others' first
    // requests come after they are ready (their E2E counts from arrival)
    let m = &r.metrics.replicas;
    assert!(m[1].submitted > 0 && m[2].submitted > 0);
    // no request lost: every one submitted completed (drained to the end)
    let total = r.metrics.total(r.until);
    assert_eq!(r.unfinished, 0);
    assert_eq!(total.completed, total.submitted);
    // 60·10 + 240·10 + 60·20 arrivals, ±1 (the first arrival's phase)
    assert!(total.submitted.abs_diff(4200) <= 1, "{}", total.submitted);
    // GPU time: the first replica's life from 0, two more from 614 and 647 s,
    // two lives ended by the removals (whichever replicas they were)
    let gone: Vec<u64> = r
        .scale_log
        .iter()
        .filter(|e| e.what == "removed")
        .map(|e| e.at)
        .collect();
    let until = r.until as u128;
    let want = 3 * until
        - (614 * S) as u128
        - (647 * S) as u128
        - (until - gone[0] as u128)
        - (until - gone[1] as u128);
    assert_eq!(r.gpu_ns, want);
}

#[test]
fn the_same_seed_gives_the_same_timeline_with_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("step.toml");
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/daily-autoscale.toml"),
    )
    .unwrap()
    .replace(
        "../models/",
        &format!("{}/models/", env!("CARGO_MANIFEST_DIR")),
    );
    std::fs::write(&f, text).unwrap();
    let run = |threads: &str| {
        let out = crate::common::qsim()
            .env("RAYON_NUM_THREADS", threads)
            .args([
                "run",
                f.to_str().unwrap(),
                "--seeds",
                "3",
                "--format",
                "csv",
            ])
            .args([
                "--only",
                "autoscaled",
                "--set",
                "duration_s=10800",
                "--max-requests",
                "100000000",
            ])
            .args(["--set", "load_shape.period_s=10800"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    };
    let one = run("1");
    assert!(String::from_utf8_lossy(&one).contains("minute.100.replicas"));
    assert!(one == run("2"), "1 and 2 threads differ");
}

#[test]
fn bad_autoscaler_settings_exit_2_naming_the_field() {
    for (set, field) in [
        ("autoscale.min=3", "autoscale.max"),
        ("autoscale.min=-1", "autoscale.min"),
        ("autoscale.window_s=0", "autoscale.window_s"),
        ("autoscale.target=-5", "autoscale.target"),
        ("autoscale.target=nan", "autoscale.target"),
        ("autoscale.load_gb_s=-1", "autoscale.load_gb_s"),
        ("autoscale.startup_s=nan", "autoscale.startup_s"),
        (
            "autoscale.scale_down_delay_s=nan",
            "autoscale.scale_down_delay_s",
        ),
        ("autoscale.metric=\"gpu\"", "autoscale.metric"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out_dir = dir.path().join("out");
        let out = crate::common::qsim()
            .args(["run", "experiments/daily-autoscale.toml"])
            .args(["--set", "scenario.autoscaled.autoscale.max=2", "--set"])
            .arg(format!("scenario.autoscaled.{set}"))
            .args(["--out", out_dir.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{set}: {err}");
        assert!(err.contains(field), "{set}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!out_dir.exists(), "{set}: wrote {}", out_dir.display());
    }
}

#[test]
fn bad_prices_exit_2_naming_the_field() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    // an experiment's price override, set on the command line
    let exp = dir.path().join("exp.toml");
    let text = std::fs::read_to_string(format!("{root}/experiments/daily-autoscale.toml"))
        .unwrap()
        .replace("../models/", &format!("{root}/models/"))
        .replace(
            "kind = \"server\"\n",
            "kind = \"server\"\nprice = { replica_hour_usd = 3 }\n",
        );
    assert!(text.contains("price = "));
    std::fs::write(&exp, text).unwrap();
    // a profile's own [price]
    let prof = dir.path().join("p.toml");
    let ptext = std::fs::read_to_string(format!("{root}/models/llama-3.1-8b-h100-vllm.toml"))
        .unwrap()
        .replace("replica_hour_usd = 3.78", "replica_hour_usd = -3.78");
    std::fs::write(&prof, ptext).unwrap();
    let exp2 = dir.path().join("exp2.toml");
    std::fs::write(
        &exp2,
        std::fs::read_to_string(&exp)
            .unwrap()
            .replace(
                &format!("{root}/models/llama-3.1-8b-h100-vllm.toml"),
                prof.to_str().unwrap(),
            )
            .replace("price = { replica_hour_usd = 3 }\n", ""),
    )
    .unwrap();
    let mut cases: Vec<(Vec<String>, &str)> = ["-1", "nan", "inf"]
        .iter()
        .map(|v| {
            (
                vec![
                    exp.to_str().unwrap().to_string(),
                    "--set".into(),
                    format!("price.replica_hour_usd={v}"),
                ],
                "price.replica_hour_usd",
            )
        })
        .collect();
    cases.push((
        vec![exp2.to_str().unwrap().to_string()],
        "price.replica_hour_usd",
    ));
    for (args, field) in cases {
        let out_dir = dir.path().join("out");
        let out = crate::common::qsim()
            .arg("run")
            .args(&args)
            .args(["--out", out_dir.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(field) && err.contains("must be in"),
            "{args:?}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!out_dir.exists());
    }
}

/// Cost of a fixed run by hand: replicas × hours × price.
#[test]
fn fixed_run_cost_is_replicas_times_hours_times_price() {
    let text = r#"
kind = "server"
server = "../models/llama-3.1-8b-h100-vllm.toml"
duration_s = 1800
replicas = 3
price = { replica_hour_usd = 2.5 }
input_tokens = { dist = "const", value = 200 }
output_tokens = { dist = "const", value = 100 }
[[scenario]]
name = "fixed"
rpm = 120
"#;
    let v: toml::Value = toml::from_str(text).unwrap();
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/cost-test.toml");
    let s = ServerSuite::from_value(&file, v).unwrap();
    let r = run_scenario(s.profile.clone(), &s.scenarios[0], 1, 0);
    let f = qsim_sim::report::cost::figures(&r);
    let t = r.metrics.total(r.until);
    // 3 replicas × 0.5 h × $2.5 = $3.75, i.e. $7.50 an hour
    assert_eq!(f[0], 3.0);
    assert_eq!(f[1], 3.0);
    assert!((f[2] - 1.5).abs() < 1e-12, "{f:?}");
    assert!((f[3] - 3.75).abs() < 1e-12, "{f:?}");
    assert!((f[4] - 7.5).abs() < 1e-12, "{f:?}");
    assert!(
        (f[5] - 3.75 / t.output_tokens as f64 * 1e6).abs() < 1e-9,
        "{f:?}"
    );
    assert!((f[6] - 3.75 / t.completed as f64).abs() < 1e-12, "{f:?}");
    // 120 RPM × 30 min ≈ 3600 requests of 100 output tokens
    assert!(t.completed > 3400 && t.completed < 3800, "{}", t.completed);
}

/// Cost of a hosted run by hand: the succeeded rows' tokens × the prices.
#[test]
fn hosted_run_cost_is_tokens_times_prices() {
    use qsim_sim::experiment::ExperimentFile;
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/fmapi-pacing.toml");
    let ef: ExperimentFile = qsim_sim::experiment::load(&file, &[]).unwrap();
    let suite = ef.into_hosted().unwrap();
    let rs = qsim_sim::experiment::hosted::run_suite(&suite, 3);
    for r in &rs {
        let f = qsim_sim::report::cost::hosted_figures(r).expect("priced");
        // the profile: $1 per million input tokens, $5 per million output
        let want = r.input_tokens as f64 * 1e-6 + r.output_tokens as f64 * 5e-6;
        assert!(
            (f[0] - want).abs() < 1e-12,
            "{}: {} vs {want}",
            r.name,
            f[0]
        );
        assert!((f[3] - want / r.ok as f64).abs() < 1e-15);
        assert!(r.input_tokens >= r.ok && r.ok > 100, "{}", r.input_tokens);
    }
}
