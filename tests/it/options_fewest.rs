//! Issue 25's remaining pieces of `qsim options`: the inverse search
//! (`--fewest`: exact counts, each checked by plain runs of the file
//! changed with `--set` — the count meets the targets, one fewer misses),
//! the cost scatter (`--plot`: what it draws, byte-identical with any
//! thread count), p95 targets, bad input for the new fields and flags, and
//! the total cost of a server run over a request trace by hand.

use qsim_sim::options::fewest::{self, Knob};
use qsim_sim::options::{load, run_option, Outcome, Targets};
use std::path::{Path, PathBuf};

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn file() -> PathBuf {
    root().join("experiments/options-fmapi.toml")
}

const S: u64 = 1_000_000_000;

/// Option `name` run plainly with `set` (e.g. `replicas=2`) applied to it.
fn plain(name: &str, set: &str) -> Outcome {
    let f = load(&file(), &[format!("option.{name}.{set}")], None).unwrap();
    let i = f.options.iter().position(|o| o.name == name).unwrap();
    run_option(&f, i, 1)
}

/// The targets checked here by hand, not by `Targets::missed`.
fn meets(o: &Outcome, within_s: u64, e2e_p95_s: Option<f64>) -> bool {
    o.failed == 0 && o.elapsed <= within_s * S && e2e_p95_s.is_none_or(|t| o.e2e_p95_s <= t)
}

#[test]
fn fewest_counts_meet_the_targets_and_one_fewer_misses_by_plain_runs() {
    let f = load(&file(), &[], None).unwrap();
    // (within s, E2E p95 target s, option, knob, expected fewest)
    let cases: &[(u64, Option<f64>, &str, Knob, u64)] = &[
        (30, Some(5.0), "ptu-15", Knob::Units, 29),
        (30, Some(5.0), "ptu-50", Knob::Units, 29),
        (300, None, "ptu-15", Knob::Units, 27),
        (5, None, "h100-x1", Knob::Replicas, 2),
        (5, None, "h100-x4", Knob::Replicas, 2),
        (5, None, "h100-auto-1-4", Knob::AutoscaleMin, 2),
        (300, None, "h100-x4", Knob::Replicas, 1),
    ];
    for &(within, e2e, name, knob, want) in cases {
        let t = Targets {
            within: Some(within * S),
            e2e_p95: e2e.map(qsim_sim::time::secs),
            ttft_p95: None,
        };
        let i = f.options.iter().position(|o| o.name == name).unwrap();
        let found = fewest::search(&f, i, 1, &t);
        assert_eq!(found.knob, Some(knob), "{name}");
        assert_eq!(found.count, Some(want), "{name} within {within}: {found:?}");
        // bounded: doubling then bisection up to the cap
        let cap = fewest::knob(&f.options[i]).unwrap().2;
        let bound = 2 * (64 - (cap - 1).leading_zeros()) + 1;
        assert!(found.runs <= bound, "{name}: {} runs", found.runs);
        // the plain run of the file with the count set meets the targets …
        let field = knob.field();
        let at = plain(name, &format!("{field}={want}"));
        assert!(meets(&at, within, e2e), "{name} at {want}: {at:?}");
        assert_eq!(at.cost_usd, found.outcome.cost_usd, "{name}: same run");
        assert_eq!(at.elapsed, found.outcome.elapsed, "{name}: same run");
        // … and with one fewer it misses them
        if want > 1 {
            let below = plain(name, &format!("{field}={}", want - 1));
            assert!(
                !meets(&below, within, e2e),
                "{name} at {}: {below:?}",
                want - 1
            );
            assert_eq!(found.below.as_ref().map(|b| b.0), Some(want - 1));
        }
    }
}

#[test]
fn fewest_reports_none_when_more_does_not_help_and_runs_pay_per_token_as_written() {
    let f = load(&file(), &[], None).unwrap();
    let t = Targets {
        within: Some(5 * S),
        ..Targets::default()
    };
    // the PTU endpoint's latency does not fall with units: 10.6 s at 32
    // units and at 64, so no count finishes within 5 s
    let i = f.options.iter().position(|o| o.name == "ptu-15").unwrap();
    let found = fewest::search(&f, i, 1, &t);
    assert_eq!(found.count, None);
    assert!(found.none.contains("32 → 64 changed nothing"), "{found:?}");
    assert_eq!(found.runs, 7, "1, 2, 4, …, 64");
    // pay-per-token has no count: one run, as written
    let j = f
        .options
        .iter()
        .position(|o| o.name == "ppt-ai-query")
        .unwrap();
    let p = fewest::search(&f, j, 1, &t);
    assert_eq!((p.knob, p.count, p.runs), (None, None, 1));
    assert_eq!(p.outcome.elapsed, run_option(&f, j, 1).elapsed);
    // a TTFT target: no unit count gives the hosted model a TTFT; one run
    let t = Targets {
        ttft_p95: Some(qsim_sim::time::secs(1.0)),
        ..Targets::default()
    };
    let ptu = fewest::search(&f, i, 1, &t);
    assert_eq!((ptu.count, ptu.runs), (None, 1));
    assert!(ptu.none.contains("does not measure TTFT"), "{ptu:?}");
    // while the replicas' TTFT is measured: 1 replica meets 1 s
    let k = f.options.iter().position(|o| o.name == "h100-x1").unwrap();
    assert_eq!(fewest::search(&f, k, 1, &t).count, Some(1));
}

fn qsim_ok(args: &[&str]) -> String {
    let out = crate::common::qsim().args(args).output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_fewest_report_names_counts_runs_and_the_cheapest() {
    let text = qsim_ok(&[
        "options",
        "experiments/options-fmapi.toml",
        "--fewest",
        "--within",
        "30s",
        "--e2e-p95",
        "5s",
    ]);
    assert!(
        text.contains("fewest units, replicas or autoscale.min finishing within 30 s with no failed row, E2E p95 ≤ 5 s"),
        "{text}"
    );
    let row = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} in {text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let r = row("ptu-15");
    assert_eq!(&r[1..4], ["provisioned.units", "15", "29"], "{r:?}");
    assert!(text.contains("28: E2E p95 5.66 s > 5 s"), "{text}");
    assert_eq!(&row("h100-x1")[1..4], ["replicas", "1", "1"]);
    assert!(
        text.contains("cheapest meeting the targets: h100-x1 with 1 replica ($0.0056)"),
        "{text}"
    );
    let runs: u32 = text
        .lines()
        .find_map(|l| l.strip_prefix("simulated runs: "))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(runs, 26, "{text}");
}

#[test]
fn p95_targets_enter_the_verdict() {
    let text = qsim_ok(&[
        "options",
        "experiments/options-fmapi.toml",
        "--e2e-p95",
        "1.6s",
    ]);
    // only 4 replicas (E2E p95 1.48 s) get under 1.6 s
    assert!(
        text.contains(
            "cheapest finishing within 300 s with no failed row, E2E p95 ≤ 1.6 s: h100-x4 ($0.0193)"
        ),
        "{text}"
    );
    // a TTFT target: the hosted options do not measure TTFT and miss it
    let t = qsim_ok(&[
        "options",
        "experiments/options-fmapi.toml",
        "--set",
        "ttft_p95_s=0.01",
    ]);
    assert!(
        t.contains("no priced option finished within 300 s with no failed row, TTFT p95 ≤ 0.01 s"),
        "{t}"
    );
}

fn svg_circles_stroked(svg: &str, color: &str) -> usize {
    qsim_plot::check::elements(svg, "circle")
        .iter()
        .filter(|e| {
            e.iter()
                .any(|(n, v)| *n == "stroke" && v.eq_ignore_ascii_case(color))
        })
        .count()
}

#[test]
fn the_cost_plot_marks_who_meets_the_targets_and_is_the_same_with_any_thread_count() {
    let d = tempfile::tempdir().unwrap();
    let base = [
        "options",
        "experiments/options-fmapi.toml",
        "--e2e-p95",
        "5s",
    ];
    let plain_text = qsim_ok(&base);
    let mut dirs = Vec::new();
    for threads in ["1", "2"] {
        let p = d.path().join(format!("t{threads}"));
        let mut args = base.to_vec();
        args.extend(["--threads", threads, "--plot", p.to_str().unwrap()]);
        assert_eq!(qsim_ok(&args), plain_text, "stdout unchanged by --plot");
        dirs.push(p);
    }
    let mut names: Vec<String> = std::fs::read_dir(&dirs[0])
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["options-cost.png", "options-cost.svg"]);
    for n in &names {
        assert_eq!(
            std::fs::read(dirs[0].join(n)).unwrap(),
            std::fs::read(dirs[1].join(n)).unwrap(),
            "{n}: byte-identical with 1 and 2 threads"
        );
    }
    let png = std::fs::read(dirs[0].join("options-cost.png")).unwrap();
    assert_eq!(qsim_plot::check::png_size(&png), Some((1520, 560)));
    let svg = std::fs::read_to_string(dirs[0].join("options-cost.svg")).unwrap();
    // two panels; 8 priced options: ppt-direct and ptu-15 fail rows,
    // ppt-backoff's E2E p95 is 44 s: 3 grey, 5 in colour, h100-x1 ringed
    let blue = qsim_plot::PALETTE[0];
    assert_eq!(qsim_plot::check::svg_circles(&svg, blue), 2 * 5);
    assert_eq!(
        qsim_plot::check::svg_circles(&svg, qsim_plot::DOMINATED),
        2 * 3
    );
    assert_eq!(svg_circles_stroked(&svg, "#E15759"), 2);
    for label in [
        "ppt-direct",
        "ptu-50",
        "h100-auto-1-4",
        "within 300 s",
        "E2E p95 target 5 s",
        "cheapest meeting them: h100-x1",
    ] {
        assert!(svg.contains(label), "{label}");
    }
    // with --fewest: the points at the counts found, labelled with them
    let f = d.path().join("fewest");
    qsim_ok(&[
        "options",
        "experiments/options-fmapi.toml",
        "--fewest",
        "--within",
        "5s",
        "--plot",
        f.to_str().unwrap(),
    ]);
    let svg = std::fs::read_to_string(f.join("options-cost.svg")).unwrap();
    assert!(
        svg.contains("h100-x1 (2 replicas)"),
        "labelled with the count"
    );
    assert!(svg.contains("h100-auto-1-4 (autoscale.min 2)"));
    // the PTU options found no count: not drawn
    assert!(!svg.contains("ptu-15"));
}

/// The options file as shipped with absolute paths and without `within_s`.
fn without_targets(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(file()).unwrap();
    let exp = root().join("experiments");
    let t = text
        .replace(
            "batch = \"fmapi-pacing.toml\"",
            &format!(
                "batch = {:?}",
                exp.join("fmapi-pacing.toml").display().to_string()
            ),
        )
        .replace(
            "\"../models/",
            &format!("\"{}/", root().join("models").display()),
        )
        .replace("within_s = 300\n", "");
    let p = dir.join("no-targets.toml");
    std::fs::write(&p, t).unwrap();
    p
}

#[test]
fn bad_targets_and_flags_exit_2_naming_them_with_nothing_written() {
    let d = tempfile::tempdir().unwrap();
    let bare = without_targets(d.path());
    let bare = bare.to_str().unwrap();
    let out_file = d.path().join("report.txt");
    let plot_dir = d.path().join("plots");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["options", bare, "--fewest"], "--fewest"),
        (
            vec![
                "options",
                "experiments/options-fmapi.toml",
                "--set",
                "e2e_p95_s=-1",
            ],
            "e2e_p95_s",
        ),
        (
            vec![
                "options",
                "experiments/options-fmapi.toml",
                "--set",
                "ttft_p95_s=nan",
            ],
            "ttft_p95_s",
        ),
        (
            vec![
                "options",
                "experiments/options-fmapi.toml",
                "--set",
                "e2e_p95_s=0",
            ],
            "e2e_p95_s",
        ),
        (
            vec![
                "options",
                "experiments/options-fmapi.toml",
                "--e2e-p95",
                "0s",
            ],
            "--e2e-p95",
        ),
        (
            vec![
                "options",
                "experiments/options-fmapi.toml",
                "--ttft-p95",
                "soon",
            ],
            "--ttft-p95",
        ),
        // the work budget stops the search: it decided nothing
        (
            vec![
                "options",
                "experiments/options-fmapi.toml",
                "--fewest",
                "--max-requests",
                "5000",
            ],
            "work budget: exceeded",
        ),
    ];
    for (args, needle) in cases {
        let out = crate::common::qsim()
            .args(&args)
            .args(["--out", out_file.to_str().unwrap()])
            .args(["--plot", plot_dir.to_str().unwrap()])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {needle} not in {err}");
        assert!(out.stdout.is_empty());
        assert!(!out_file.exists(), "{args:?}: wrote the report");
        assert!(!plot_dir.exists(), "{args:?}: wrote plots");
    }
    // a --plot directory that is not empty, without --force
    std::fs::create_dir(&plot_dir).unwrap();
    std::fs::write(plot_dir.join("x"), "x").unwrap();
    let out = crate::common::qsim()
        .args(["options", "experiments/options-fmapi.toml", "--plot"])
        .arg(&plot_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plot"));
    assert_eq!(std::fs::read_dir(&plot_dir).unwrap().count(), 1);
}

#[test]
fn a_trace_replay_costs_replicas_times_trace_hours_times_price() {
    let d = tempfile::tempdir().unwrap();
    // four requests, the last 30 minutes after the first
    std::fs::write(
        d.path().join("t.csv"),
        "TIMESTAMP,ContextTokens,GeneratedTokens\n\
         2023-11-16 18:00:00.0000000,100,10\n\
         2023-11-16 18:10:00.0000000,200,20\n\
         2023-11-16 18:20:00.0000000,300,30\n\
         2023-11-16 18:30:00.0000000,400,40\n",
    )
    .unwrap();
    let model = root().join("models/llama-3.1-8b-h100-vllm.toml");
    for (replicas, price) in [(3u64, 2.5f64), (2, 3.78)] {
        let exp = d.path().join(format!("e{replicas}.toml"));
        std::fs::write(
            &exp,
            format!(
                "kind = \"server\"\nserver = {:?}\nreplicas = {replicas}\nduration_s = 60\n\
                 input_tokens = {{ dist = \"const\", value = 1 }}\n\
                 output_tokens = {{ dist = \"const\", value = 1 }}\n\
                 price = {{ replica_hour_usd = {price} }}\n\
                 [[scenario]]\nname = \"trace\"\ntrace = {{ file = \"t.csv\" }}\n",
                model.display().to_string()
            ),
        )
        .unwrap();
        let out = qsim_ok(&["run", exp.to_str().unwrap(), "--format", "json"]);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let c = &v["scenarios"][0]["cost"];
        // the run lasts the trace: its last arrival (1800 s) plus 1 ns, not
        // drained; the last request is still running then
        let hours = (1800.0 * 1e9 + 1.0) / 3.6e12;
        let gpu_hours = replicas as f64 * hours;
        let cost = gpu_hours * price;
        let close = |k: &str, want: f64| {
            let got = c[k].as_f64().unwrap_or_else(|| panic!("{k} in {c}"));
            assert!(
                (got - want).abs() <= 1e-9 * want.abs().max(1.0),
                "{k}: {got} vs {want} by hand"
            );
        };
        close("replicas_mean", replicas as f64);
        close("gpu_hours", gpu_hours);
        close("cost_usd", cost);
        close("cost_per_hour_usd", replicas as f64 * price);
        // three requests finished, 10 + 20 + 30 output tokens
        close("cost_per_m_output_tokens_usd", cost / 60.0 * 1e6);
        close("cost_per_request_usd", cost / 3.0);
        assert_eq!(v["scenarios"][0]["unfinished"], 1);
        // and the text report shows the total
        let text = qsim_ok(&["run", exp.to_str().unwrap()]);
        assert!(text.contains("capacity and cost"), "{text}");
        assert!(
            text.contains(&format!("{:.2}", cost)),
            "cost {cost:.2} in {text}"
        );
    }
}
