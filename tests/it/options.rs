//! Issue 25's provisioned throughput and options comparison: a provisioned
//! run's cost by hand (units × hours × price, whatever the use) and its
//! rate limit (units × throughput), fixed replicas' cost by hand, the
//! cheapest option within a time, the same report with any thread count,
//! and bad values refused with the field named and nothing written.

use qsim_sim::experiment::hosted::run_suite;
use qsim_sim::options::{cheapest, Outcome};
use std::path::Path;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The FMAPI batch against the shipped PTU profile with `units` units.
fn ptu_suite(units: u64) -> qsim_sim::experiment::HostedSuite {
    let file = root().join("experiments/fmapi-pacing.toml");
    let mut v = qsim_sim::config::read_toml(&file).unwrap();
    let t = v.as_table_mut().unwrap();
    let ep = root().join("models/azure-openai-gpt-4o-ptu.toml");
    t.insert("endpoint".into(), ep.display().to_string().into());
    let mut prov = toml::map::Map::new();
    prov.insert("units".into(), (units as i64).into());
    t.insert("provisioned".into(), prov.into());
    let mut s = qsim_sim::experiment::HostedSuite::from_value(&file, v).unwrap();
    s.retain_only(&["exp2-backoff".to_string()]).unwrap();
    s
}

#[test]
fn provisioned_cost_is_units_times_hours_times_price_whatever_the_use() {
    for units in [15u64, 50] {
        let s = ptu_suite(units);
        let p = s.profile.provisioned.expect("provisioned");
        assert_eq!(p.units, units);
        // the units are one rate limit: units × 2,500 tokens per minute
        let l = s
            .profile
            .limits
            .iter()
            .find(|l| l.name == "provisioned")
            .unwrap();
        assert_eq!(l.limit, units * 2500);
        assert_eq!(l.window, 60_000_000_000);
        let r = run_suite(&s, 1).pop().unwrap();
        let f = qsim_sim::report::cost::hosted_figures(&r).expect("priced");
        // $2 per PTU-hour over the batch's elapsed time, tokens not counted
        let hours = r.elapsed as f64 / 3.6e12;
        let want = units as f64 * hours * 2.0;
        assert!((f[0] - want).abs() < 1e-12, "{units}: {} vs {want}", f[0]);
        assert!((f[1] - units as f64 * 2.0).abs() < 1e-9, "{f:?}");
        assert!(r.elapsed > 0 && r.ok > 0);
    }
    // 15 units: 37,500 tokens a minute for ~84,000 tokens of rows: 429s
    let small = run_suite(&ptu_suite(15), 1).pop().unwrap();
    let big = run_suite(&ptu_suite(50), 1).pop().unwrap();
    assert!(
        small.http_429 > big.http_429,
        "{} {}",
        small.http_429,
        big.http_429
    );
    assert!(small.elapsed > big.elapsed);
}

fn options_out(args: &[&str]) -> std::process::Output {
    crate::common::qsim()
        .args(["options", "experiments/options-fmapi.toml"])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn fixed_replicas_cost_replicas_times_elapsed_hours_times_price() {
    let file = qsim_sim::options::load(
        &root().join("experiments/options-fmapi.toml"),
        &["option.h100-x1.replicas=3".to_string()],
        None,
    )
    .unwrap();
    assert_eq!(file.options[5].name, "h100-x1");
    let o = qsim_sim::options::run_option(&file, 5, 1);
    assert_eq!(o.kind, "3 replicas");
    assert_eq!((o.ok, o.failed, o.http_429), (200, 0, 0));
    // 3 replicas × the batch's hours × $3.78 (the profile's price)
    let want = 3.0 * o.elapsed as f64 / 3.6e12 * 3.78;
    assert!((o.cost_usd.unwrap() - want).abs() < 1e-12, "{o:?}");
}

fn outcome(name: &str, elapsed_s: u64, failed: u64, cost: Option<f64>) -> Outcome {
    Outcome {
        name: name.into(),
        kind: String::new(),
        elapsed: elapsed_s * 1_000_000_000,
        ok: 10 - failed,
        failed,
        http_429: 0,
        ttft_p95_s: None,
        e2e_p95_s: 1.0,
        cost_usd: cost,
        spilled: None,
        profiles: Vec::new(),
    }
}

#[test]
fn cheapest_is_the_least_cost_in_time_with_no_failed_row() {
    let v = vec![
        outcome("cheap-but-failed", 10, 1, Some(0.1)),
        outcome("cheap-but-late", 100, 0, Some(0.2)),
        outcome("unpriced", 10, 0, None),
        outcome("ok", 10, 0, Some(0.5)),
        outcome("dear", 10, 0, Some(0.9)),
        outcome("tie", 10, 0, Some(0.5)),
    ];
    let s = 1_000_000_000;
    assert_eq!(cheapest(&v, 60 * s).unwrap().name, "ok");
    assert_eq!(cheapest(&v, 100 * s).unwrap().name, "cheap-but-late");
    assert!(cheapest(&v, 5 * s).is_none());
}

#[test]
fn the_options_report_names_the_cheapest_and_is_the_same_with_any_thread_count() {
    let a = options_out(&["--threads", "1"]);
    let b = options_out(&["--threads", "2"]);
    assert_eq!(
        a.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&a.stderr)
    );
    assert_eq!(a.stdout, b.stdout);
    let text = String::from_utf8(a.stdout).unwrap();
    assert!(
        text.contains("cheapest finishing within 300 s with no failed row: "),
        "{text}"
    );
    // a deadline no option meets
    let c = options_out(&["--within", "1s"]);
    let t = String::from_utf8(c.stdout).unwrap();
    assert!(t.contains("no priced option finished within 1 s"), "{t}");
}

#[test]
fn bad_provisioned_and_option_values_exit_2_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let prof = std::fs::read_to_string(root().join("models/azure-openai-gpt-4o-ptu.toml")).unwrap();
    let mut cases: Vec<(Vec<String>, &str)> = Vec::new();
    for (from, to, field) in [
        ("units = 15", "units = 0", "provisioned.units"),
        ("units = 15", "units = -2", "provisioned.units"),
        (
            "tokens_per_min_per_unit = 2500",
            "tokens_per_min_per_unit = nan",
            "provisioned.tokens_per_min_per_unit",
        ),
        (
            "unit_hour_usd = 2.0",
            "unit_hour_usd = -2.0",
            "provisioned.unit_hour_usd",
        ),
        (
            "unit_hour_usd = 2.0",
            "unit_hour_usd = inf",
            "provisioned.unit_hour_usd",
        ),
        (
            "[provisioned]",
            "[price]\ninput_per_m_usd = 1\noutput_per_m_usd = 1\nsource = \"x\"\n[provisioned]",
            "provisioned",
        ),
    ] {
        let p = dir.path().join(format!("p{}.toml", cases.len()));
        assert!(prof.contains(from));
        std::fs::write(&p, prof.replacen(from, to, 1)).unwrap();
        cases.push((
            vec![format!("option.ptu-15.endpoint={}", p.display())],
            field,
        ));
    }
    for (set, field) in [
        (
            "option.ptu-50.provisioned.units=0",
            "option.ptu-50.provisioned.units",
        ),
        (
            "option.ptu-50.provisioned.unit_hour_usd=nan",
            "option.ptu-50.provisioned.unit_hour_usd",
        ),
        ("option.h100-x1.replicas=0", "option.h100-x1.replicas"),
        (
            "option.h100-x1.replica_hour_usd=-1",
            "option.h100-x1.replica_hour_usd",
        ),
        ("option.h100-x1.experiment=exp1-direct", "option.h100-x1"),
        (
            "option.h100-auto-1-4.autoscale.min=5",
            "option.h100-auto-1-4.autoscale.max",
        ),
        (
            "option.h100-auto-1-4.autoscale.window_s=0",
            "option.h100-auto-1-4.autoscale.window_s",
        ),
        ("within_s=-1", "within_s"),
    ] {
        cases.push((vec![set.to_string()], field));
    }
    for (sets, field) in cases {
        let out_file = dir.path().join("report.txt");
        let mut cmd = crate::common::qsim();
        cmd.args(["options", "experiments/options-fmapi.toml"]);
        for s in &sets {
            cmd.args(["--set", s]);
        }
        let out = cmd
            .args(["--out", out_file.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{sets:?}: {err}");
        assert!(err.contains(field), "{sets:?}: {field} not in {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!out_file.exists(), "{sets:?}: wrote the report");
    }
}
