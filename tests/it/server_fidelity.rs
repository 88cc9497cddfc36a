//! Server-model fidelity across load: the Llama-3.1-8B profiles against
//! published measurements (experiments/data/llama-8b-fidelity-measured.toml:
//! NVIDIA's NIM sweep; experiments/data/llama-8b-vllm-blis-measured.toml: the
//! BLIS / inference-sim vLLM ground truth;
//! experiments/data/llama-8b-vllm-guidellm-measured.toml: Neural Magic's
//! GuideLLM maximum throughputs on vLLM v0.7.2), and gpt-oss-20b against the
//! shared-deployment article at 1000 RPM. Points marked `held_out` were never
//! used to choose a coefficient; their errors are checked here.
//!
//! `scripts/fidelity.sh` runs this test with `QSIM_FIDELITY_OUT=docs/fidelity.md`
//! to regenerate the tables between the GENERATED markers of that file.

use qsim_sim::experiment::server::{run_scenario, ServerSuite};
use qsim_sim::experiment::{load, ExperimentFile};
use qsim_sim::report::server::{values, METRICS};
use qsim_sim::server::profile::ServerProfile;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Thresholds on held-out points (relative error).
const ITL_TOL: f64 = 0.10;
const E2E_TOL: f64 = 0.10;
const TTFT_TOL: f64 = 0.15;
const SAT_TOL: f64 = 0.10;

/// Held-out (point, metric) pairs OUTSIDE their threshold today: unmet
/// acceptance, listed with numbers and the evidence about their cause in
/// docs/fidelity.md ("Known gaps"). Mean TTFT of identical closed-loop
/// clients at low and middle load: the clients follow AIPerf's concurrency
/// mode (all start together, each re-sends the moment its answer is
/// complete), and in a noise-free engine requests admitted together finish
/// together, so each client's next prompt lands in the same prefill iteration
/// as its clump's (verified with a per-iteration trace); the measured TTFT
/// shows the real system only partly clumped. E2E at concurrency 100 carries
/// that TTFT gap.
///
/// The BLIS vLLM points (bf16, vLLM v0.15.1, open-loop Poisson): none since
/// the vLLM profile got its own engine coefficients (async scheduling, and
/// HBM and compute efficiency fitted on BLIS experiments 23 and 25, which are
/// not checked here).
///
/// They are reported, not checked against the threshold; every other
/// held-out figure is. A listed pair that comes within its threshold fails
/// the test until it is removed from this list, so the list cannot go stale.
///
/// The GuideLLM maximum throughputs (vLLM v0.7.2's V0 engine, checked
/// against the v0.15.1 coefficients with v0.7.2's scheduler defaults): qsim
/// is 37-110 % above seven of the eight published figures (docs/fidelity.md,
/// "Known gaps": the engine versions differ, and the fitted compute
/// efficiency may carry prefix-cache hits of the fit runs).
const KNOWN_GAPS: &[(&str, &str)] = &[
    ("c5", "TTFT"),
    ("c25", "TTFT"),
    ("c100", "TTFT"),
    ("c100", "E2E"),
    ("instruction-following", "saturation"),
    ("multi-turn-chat", "saturation"),
    ("docstring-generation", "saturation"),
    ("rag", "saturation"),
    ("code-completion", "saturation"),
    ("code-fixing", "saturation"),
    ("large-summarization", "saturation"),
];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn suite(p: &Path) -> ServerSuite {
    match load(p, &[]).expect("experiment loads") {
        ExperimentFile::Server(s) => s,
        _ => panic!("{} is a server experiment", p.display()),
    }
}

fn metric(v: &[f64], key: &str) -> f64 {
    v[METRICS
        .iter()
        .position(|m| m.0 == key)
        .expect("metric exists")]
}

struct Point {
    scenario: String,
    held_out: bool,
    /// Offered load as a percentage of the saturation throughput.
    load_pct: f64,
    /// measured, qsim: TTFT (s), ITL (s), E2E (s), throughput (req/s); a
    /// figure that was not published is NaN and is neither shown nor checked.
    meas: [f64; 4],
    sim: [f64; 4],
}

fn err(sim: f64, meas: f64) -> f64 {
    sim / meas - 1.0
}

/// One measured file and qsim's runs of its experiment.
struct Sweep {
    title: String,
    pts: Vec<Point>,
    /// (measured, qsim) saturation throughput, req/s, when one was measured.
    saturation: Option<(f64, f64)>,
    /// How the load column was computed.
    load_note: String,
    /// Saturation intervals implied by the held-out measurements, when no
    /// saturation was measured.
    bounds: Vec<SatBound>,
}

/// What an open-loop sweep says about the saturation throughput it did not
/// measure, from its held-out points alone:
/// - at least the highest offered rate the engine kept up with: a stage of
///   600 s or more above capacity would queue for seconds on average, so a
///   point counts only if its measured mean TTFT is under 1 s;
/// - at most `max_num_seqs` / ((output − 1) × mean ITL) of the highest-rate
///   point: at saturation no more than `max_num_seqs` sequences run, and each
///   step takes at least as long as it did with the fewer sequences measured
///   (a larger batch reads more KV cache and does more work per step).
struct SatBound {
    workload: String,
    /// (req/s, point it comes from)
    lower: (f64, String),
    upper: (f64, String),
    /// qsim's saturation throughput for the workload, req/s.
    sim: f64,
}

fn run(s: &ServerSuite, name: &str, exp: &Path) -> Vec<f64> {
    let sc = s
        .scenarios
        .iter()
        .find(|x| x.name == name)
        .unwrap_or_else(|| panic!("scenario {name} in {}", exp.display()));
    let r = run_scenario(s.profile.clone(), sc, 1, sc.index);
    values(&r.metrics.total(r.until), r.until, 1)
}

fn measured(file: &str) -> (toml::Value, ServerSuite, PathBuf) {
    let mpath = root().join("experiments/data").join(file);
    let text = std::fs::read_to_string(&mpath).expect("measured file");
    let m: toml::Value = toml::from_str(&text).expect("measured TOML");
    let exp = root()
        .join("experiments")
        .join(m["experiment"].as_str().expect("experiment"));
    let s = suite(&exp);
    (m, s, exp)
}

fn use_of(p: &toml::Value) -> bool {
    let used = p["use"].as_str().expect("use");
    assert!(used == "fit" || used == "held_out", "use = {used:?}");
    used == "held_out"
}

/// NVIDIA's NIM sweep: closed loop; TTFT, ITL and output tokens/s published.
fn nim_sweep() -> Sweep {
    let (m, s, exp) = measured("llama-8b-fidelity-measured.toml");
    let out = m["output_tokens"].as_integer().expect("output_tokens") as f64;
    let mut pts = vec![];
    for p in m["point"].as_array().expect("points") {
        let name = p["scenario"].as_str().expect("scenario");
        let f = |k: &str| p[k].as_float().unwrap_or_else(|| panic!("{name}.{k}"));
        let (ttft, itl) = (f("ttft_ms") / 1e3, f("itl_ms") / 1e3);
        let meas = [
            ttft,
            itl,
            ttft + (out - 1.0) * itl,
            f("output_tokens_per_s") / out,
        ];
        let v = run(&s, name, &exp);
        let sim = [
            metric(&v, "ttft_mean_s"),
            metric(&v, "itl_mean_s"),
            metric(&v, "e2e_mean_s"),
            metric(&v, "throughput_rps"),
        ];
        pts.push(Point {
            scenario: name.to_string(),
            held_out: use_of(p),
            load_pct: 0.0,
            meas,
            sim,
        });
    }
    // Saturation throughput: the highest throughput over the sweep.
    let sat_m = pts.iter().map(|p| p.meas[3]).fold(0.0, f64::max);
    let sat_s = pts.iter().map(|p| p.sim[3]).fold(0.0, f64::max);
    for p in &mut pts {
        p.load_pct = p.meas[3] / sat_m * 100.0;
    }
    Sweep {
        title: m["title"].as_str().expect("title").to_string(),
        pts,
        saturation: Some((sat_m, sat_s)),
        load_note: "Load column: measured throughput / measured saturation".into(),
        bounds: vec![],
    }
}

/// One point of the BLIS measured file.
struct BlisPoint {
    /// Row name (`name`, else the scenario's).
    name: String,
    scenario: String,
    held_out: bool,
    rate: f64,
    out: f64,
    /// Measured mean TTFT and mean E2E, s.
    ttft: f64,
    e2e: f64,
    /// `--set`-style overrides of the BLIS profile: that run's engine flags.
    sets: Vec<String>,
}

impl BlisPoint {
    /// The workload of a `<workload>-<rate>` scenario.
    fn workload(&self) -> &str {
        self.scenario.split('-').next().expect("workload-rate name")
    }
}

fn blis_points() -> (toml::Value, ServerSuite, PathBuf, Vec<BlisPoint>) {
    let (m, s, exp) = measured("llama-8b-vllm-blis-measured.toml");
    let mut pts = vec![];
    for p in m["point"].as_array().expect("points") {
        let scenario = p["scenario"].as_str().expect("scenario").to_string();
        let name = p
            .get("name")
            .map(|n| n.as_str().expect("name").to_string())
            .unwrap_or_else(|| scenario.clone());
        let f = |k: &str| p[k].as_float().unwrap_or_else(|| panic!("{name}.{k}"));
        let sets = p
            .get("profile_set")
            .map(|a| {
                a.as_array()
                    .expect("profile_set")
                    .iter()
                    .map(|x| x.as_str().expect("profile_set item").to_string())
                    .collect()
            })
            .unwrap_or_default();
        pts.push(BlisPoint {
            held_out: use_of(p),
            rate: f("rate_per_s"),
            out: p["output_tokens"].as_integer().expect("output_tokens") as f64,
            ttft: f("ttft_ms") / 1e3,
            e2e: f("e2e_ms") / 1e3,
            sets,
            name,
            scenario,
        });
    }
    (m, s, exp, pts)
}

/// The experiment's profile with `sets` applied (`--set` syntax), validated
/// like any profile file.
fn profile_with(s: &ServerSuite, sets: &[String]) -> Arc<ServerProfile> {
    if sets.is_empty() {
        return s.profile.clone();
    }
    let path = Path::new(&s.profile_path);
    let mut v = qsim_sim::config::read_toml(path).expect("profile file");
    for a in sets {
        qsim_sim::config::apply_set(&mut v, a).expect("profile override");
    }
    Arc::new(ServerProfile::from_value(&s.profile_path, v).expect("profile with overrides"))
}

/// qsim's mean TTFT and mean E2E (s) for one BLIS point under `profile`.
fn run_blis(s: &ServerSuite, p: &BlisPoint, profile: Arc<ServerProfile>) -> (f64, f64) {
    let sc = s
        .scenarios
        .iter()
        .find(|x| x.name == p.scenario)
        .unwrap_or_else(|| panic!("scenario {}", p.scenario));
    let r = run_scenario(profile, sc, 1, sc.index);
    let v = values(&r.metrics.total(r.until), r.until, 1);
    (metric(&v, "ttft_mean_s"), metric(&v, "e2e_mean_s"))
}

/// The BLIS vLLM ground truth: open loop; mean TTFT and mean E2E published,
/// ITL derived as (E2E - TTFT) / (output - 1) on both sides. No saturation
/// was measured: the load column is the offered rate over qsim's saturation
/// throughput for the same workload (the `<workload>-sat` scenario). Fit
/// points run with their own engine flags (`profile_set`).
fn blis_sweep() -> Sweep {
    let (m, s, exp, bpts) = blis_points();
    let mut pts = vec![];
    let mut sats: Vec<(String, f64)> = vec![];
    for p in &bpts {
        let (sttft, se2e) = run_blis(&s, p, profile_with(&s, &p.sets));
        let workload = p.workload();
        let sat = match sats.iter().find(|x| x.0 == workload) {
            Some(x) => x.1,
            None => {
                let v = run(&s, &format!("{workload}-sat"), &exp);
                sats.push((workload.to_string(), metric(&v, "throughput_rps")));
                sats[sats.len() - 1].1
            }
        };
        pts.push(Point {
            scenario: p.name.clone(),
            held_out: p.held_out,
            load_pct: p.rate / sat * 100.0,
            meas: [p.ttft, (p.e2e - p.ttft) / (p.out - 1.0), p.e2e, f64::NAN],
            sim: [sttft, (se2e - sttft) / (p.out - 1.0), se2e, f64::NAN],
        });
    }
    let max_seqs = f64::from(s.profile.max_num_seqs);
    let bounds = sats
        .iter()
        .map(|(w, sim)| {
            let mut held: Vec<&BlisPoint> = bpts
                .iter()
                .filter(|p| p.held_out && p.workload() == w)
                .collect();
            held.sort_by(|a, b| a.rate.total_cmp(&b.rate));
            let hi = *held.last().expect("a held-out point");
            let lo = held
                .iter()
                .rev()
                .find(|p| p.ttft < 1.0)
                .expect("a held-out point that kept up");
            SatBound {
                workload: w.clone(),
                lower: (lo.rate, lo.name.clone()),
                // (output − 1) × mean ITL = mean E2E − mean TTFT
                upper: (max_seqs / (hi.e2e - hi.ttft), hi.name.clone()),
                sim: *sim,
            }
        })
        .collect();
    Sweep {
        title: m["title"].as_str().expect("title").to_string(),
        pts,
        saturation: None,
        bounds,
        load_note: format!(
            "Load column: offered rate / qsim's saturation throughput for the workload \
             (the `<workload>-sat` scenario: {}); no saturation was measured for these settings",
            sats.iter()
                .map(|(w, v)| format!("{w} {v:.2} req/s"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// One published maximum (saturation) throughput and qsim's.
struct SatPoint {
    scenario: String,
    prompt: i64,
    out: i64,
    /// Published maximum throughput and qsim's throughput, req/s.
    meas: f64,
    sim: f64,
}

/// Neural Magic's GuideLLM maximum throughputs (vLLM v0.7.2, bf16, one H100):
/// closed loop of 512 clients, fixed lengths with ignore_eos; qsim's
/// throughput over the same 360 s against the published QPS. Every point is
/// held out.
fn guidellm_sat() -> (String, Vec<SatPoint>) {
    let (m, s, exp) = measured("llama-8b-vllm-guidellm-measured.toml");
    let mut pts = vec![];
    for p in m["point"].as_array().expect("points") {
        let name = p["scenario"].as_str().expect("scenario");
        assert!(use_of(p), "{name}: a saturation point must be held out");
        let int = |k: &str| p[k].as_integer().unwrap_or_else(|| panic!("{name}.{k}"));
        let (prompt, out) = (int("prompt_tokens"), int("output_tokens"));
        let sc = s
            .scenarios
            .iter()
            .find(|x| x.name == name)
            .unwrap_or_else(|| panic!("scenario {name} in {}", exp.display()));
        assert_eq!(
            (sc.lengths.input.mean(), sc.lengths.output.mean()),
            (prompt as f64, out as f64),
            "{name}: the scenario's lengths are the measurement's"
        );
        let v = run(&s, name, &exp);
        pts.push(SatPoint {
            scenario: name.to_string(),
            prompt,
            out,
            meas: p["max_qps"].as_float().expect("max_qps"),
            sim: metric(&v, "throughput_rps"),
        });
    }
    (m["title"].as_str().expect("title").to_string(), pts)
}

fn sat_report(title: &str, pts: &[SatPoint]) -> String {
    let mut t = String::new();
    let _ = writeln!(
        t,
        "### {title}

Held-out saturation throughput (no point of this file was used for \
         fitting): the published maximum throughput per use case against qsim's throughput \
         with 512 closed-loop clients for 360 s.\n"
    );
    t.push_str("| use case | prompt / output tokens | measured (req/s) | qsim (req/s) | error |\n");
    t.push_str("|---|---:|---:|---:|---:|\n");
    for p in pts {
        let _ = writeln!(
            t,
            "| {} | {} / {} | {:.1} | {:.2} | {:+.1} % |",
            p.scenario,
            p.prompt,
            p.out,
            p.meas,
            p.sim,
            err(p.sim, p.meas) * 100.0
        );
    }
    t.push('\n');
    t
}

/// Check the saturation points against SAT_TOL (KNOWN_GAPS as for the
/// other sweeps); returns how many were checked.
fn check_sat(pts: &[SatPoint], failures: &mut Vec<String>) -> usize {
    for p in pts {
        let e = err(p.sim, p.meas);
        if KNOWN_GAPS.contains(&(p.scenario.as_str(), "saturation")) {
            println!("known gap: {} saturation {:+.1} %", p.scenario, e * 100.0);
            if e.abs() <= SAT_TOL {
                failures.push(format!(
                    "{} saturation is listed in KNOWN_GAPS but within its threshold ({:+.1} %): remove it",
                    p.scenario,
                    e * 100.0
                ));
            }
        } else if e.abs() > SAT_TOL {
            failures.push(format!(
                "{} saturation: qsim {:.3} vs {:.3} req/s ({:+.1} %, limit {:.0} %)",
                p.scenario,
                p.sim,
                p.meas,
                e * 100.0,
                SAT_TOL * 100.0
            ));
        }
    }
    pts.len()
}

fn table(pts: &[Point], held_out: bool) -> String {
    let mut t = String::new();
    t.push_str("| point | load (% of sat.) | metric | measured | qsim | error |\n");
    t.push_str("|---|---:|---|---:|---:|---:|\n");
    for p in pts.iter().filter(|p| p.held_out == held_out) {
        let names = [
            ("mean TTFT", 1e3, "ms"),
            ("mean ITL", 1e3, "ms"),
            ("mean E2E", 1.0, "s"),
            ("throughput", 1.0, "req/s"),
        ];
        for (i, (n, k, u)) in names.iter().enumerate() {
            if p.meas[i].is_nan() {
                continue;
            }
            let _ = writeln!(
                t,
                "| {} | {:.0} | {n} ({u}) | {:.3} | {:.3} | {:+.1} % |",
                p.scenario,
                p.load_pct,
                p.meas[i] * k,
                p.sim[i] * k,
                err(p.sim[i], p.meas[i]) * 100.0
            );
        }
    }
    t
}

fn report(sw: &Sweep) -> String {
    let mut doc = String::new();
    let _ = writeln!(doc, "### {}\n", sw.title);
    if let Some((sat_m, sat_s)) = sw.saturation {
        let _ = writeln!(
            doc,
            "Saturation throughput (highest over the sweep): measured {sat_m:.2} req/s, \
             qsim {sat_s:.2} req/s ({:+.1} %).\n",
            err(sat_s, sat_m) * 100.0
        );
    }
    let _ = writeln!(doc, "{}.\n", sw.load_note);
    if sw.pts.iter().any(|p| !p.held_out) {
        let _ = writeln!(doc, "Points used for fitting:\n\n{}", table(&sw.pts, false));
    } else {
        let _ = writeln!(doc, "No point of this file was used for fitting.\n");
    }
    let _ = writeln!(doc, "Held-out points:\n\n{}", table(&sw.pts, true));
    if !sw.bounds.is_empty() {
        doc.push_str(
            "Saturation throughput bounded by the held-out points (no saturation was \
             measured): at least the highest offered rate the engine kept up with (mean \
             TTFT under 1 s), at most `max_num_seqs` / ((output − 1) × mean ITL) of the \
             highest-rate point; qsim's error is at least the first and at most the second \
             of the range shown.\n\n",
        );
        doc.push_str(
            "| workload | at least (req/s) | at most (req/s) | qsim (req/s) | qsim's error |\n\
             |---|---:|---:|---:|---:|\n",
        );
        for b in &sw.bounds {
            let _ = writeln!(
                doc,
                "| {} | {:.2} ({}) | {:.2} ({}) | {:.2} | {:+.1} % to {:+.1} % |",
                b.workload,
                b.lower.0,
                b.lower.1,
                b.upper.0,
                b.upper.1,
                b.sim,
                err(b.sim, b.upper.0) * 100.0,
                err(b.sim, b.lower.0) * 100.0
            );
        }
        doc.push('\n');
    }
    doc
}

/// Check the held-out points of a sweep; returns how many were checked.
fn check(sw: &Sweep, failures: &mut Vec<String>) -> usize {
    let mut checked = 0;
    for p in sw.pts.iter().filter(|p| p.held_out) {
        // points past the measured saturation are reported, not checked
        let past = match sw.saturation {
            Some((sat_m, _)) => p.meas[3] >= 0.99 * sat_m || p.scenario == "c250",
            None => p.load_pct >= 100.0,
        };
        if past {
            continue;
        }
        checked += 1;
        for (i, (n, tol)) in [("TTFT", TTFT_TOL), ("ITL", ITL_TOL), ("E2E", E2E_TOL)]
            .iter()
            .enumerate()
        {
            let e = err(p.sim[i], p.meas[i]);
            if KNOWN_GAPS.contains(&(p.scenario.as_str(), *n)) {
                println!("known gap: {} {n} {:+.1} %", p.scenario, e * 100.0);
                if e.abs() <= *tol {
                    failures.push(format!(
                        "{} {n} is listed in KNOWN_GAPS but within its threshold ({:+.1} %): remove it",
                        p.scenario,
                        e * 100.0
                    ));
                }
                continue;
            }
            if e.abs() > *tol {
                failures.push(format!(
                    "{} {n}: qsim {:.4} vs {:.4} ({:+.1} %, limit {:.0} %)",
                    p.scenario,
                    p.sim[i],
                    p.meas[i],
                    e * 100.0,
                    tol * 100.0
                ));
            }
        }
    }
    for b in &sw.bounds {
        if !(b.lower.0..=b.upper.0).contains(&b.sim) {
            failures.push(format!(
                "{} saturation: qsim {:.3} req/s outside the {:.3}-{:.3} the held-out points allow",
                b.workload, b.sim, b.lower.0, b.upper.0
            ));
        }
    }
    if let Some((sat_m, sat_s)) = sw.saturation {
        let e = err(sat_s, sat_m);
        if e.abs() > SAT_TOL {
            failures.push(format!(
                "saturation {sat_s:.2} vs {sat_m:.2} ({:+.1} %)",
                e * 100.0
            ));
        }
    }
    checked
}

fn gpt_oss() -> (Vec<f64>, String) {
    let s = suite(&root().join("experiments/nim-load.toml"));
    let sc = s
        .scenarios
        .iter()
        .find(|x| x.name == "capacity")
        .expect("capacity scenario");
    let r = run_scenario(s.profile.clone(), sc, 1, sc.index);
    let v = values(&r.metrics.total(r.until), r.until, 1);
    let rows = [
        ("TTFT p50 (ms)", 35.0, metric(&v, "ttft_p50_s") * 1e3),
        ("ITL p50 (ms)", 18.0, metric(&v, "itl_p50_s") * 1e3),
        ("E2E p50 (s)", 1.25, metric(&v, "e2e_p50_s")),
        ("GPU utilization", 0.93, metric(&v, "gpu_util")),
    ];
    let mut t = String::new();
    t.push_str("| point | metric | measured | qsim | error |\n|---|---|---:|---:|---:|\n");
    for (n, want, got) in rows {
        let _ = writeln!(
            t,
            "| 1000 RPM (fit) | {n} | {want} | {got:.3} | {:+.1} % |",
            err(got, want) * 100.0
        );
    }
    (v, t)
}

#[test]
fn llama_8b_held_out_points_within_thresholds() {
    let (nim, blis) = (nim_sweep(), blis_sweep());
    let (sat_title, sat) = guidellm_sat();
    let mut doc = report(&nim);
    doc.push_str(&report(&blis));
    doc.push_str(&sat_report(&sat_title, &sat));
    let (_, g) = gpt_oss();
    let _ = writeln!(
        doc,
        "### gpt-oss-20b, 1x H100, NIM (the shared-deployment article, DataRobot)\n\n{g}"
    );
    println!("{doc}");
    if let Some(out) = std::env::var_os("QSIM_FIDELITY_OUT") {
        let path = PathBuf::from(out);
        let old = std::fs::read_to_string(&path).expect("report file");
        let (b, e) = ("<!-- BEGIN GENERATED -->\n", "<!-- END GENERATED -->");
        let i = old.find(b).expect("BEGIN marker") + b.len();
        let j = old.find(e).expect("END marker");
        let new = format!("{}\n{doc}{}", &old[..i], &old[j..]);
        std::fs::write(&path, new).expect("write report");
    }

    let mut failures = vec![];
    let checked = check(&nim, &mut failures);
    assert!(
        checked >= 3,
        "only {checked} NIM held-out points below saturation"
    );
    let checked = check(&blis, &mut failures);
    let in_band = blis
        .pts
        .iter()
        .filter(|p| p.held_out && (20.0..=90.0).contains(&p.load_pct))
        .count();
    assert!(
        checked >= 4 && in_band >= 4,
        "BLIS: {checked} held-out points checked, {in_band} in 20-90 % of saturation"
    );
    let checked = check_sat(&sat, &mut failures);
    assert!(checked >= 8, "only {checked} GuideLLM saturation points");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The BLIS runs' profile and the GuideLLM runs' (vLLM v0.7.2 defaults)
/// differ from llama-3.1-8b-h100-vllm.toml only in the scheduler flags of
/// those runs: the KV cache and every iteration coefficient are the same, so
/// no coefficient was chosen on the BLIS or GuideLLM points.
#[test]
fn blis_profile_shares_the_vllm_coefficients() {
    let read = |f: &str| -> toml::Value {
        let p = root().join("models").join(f);
        toml::from_str(&std::fs::read_to_string(&p).expect("profile")).expect("profile TOML")
    };
    let base = read("llama-3.1-8b-h100-vllm.toml");
    for copy in [
        "llama-3.1-8b-h100-vllm-blis.toml",
        "llama-3.1-8b-h100-vllm-v072.toml",
    ] {
        let other = read(copy);
        for table in ["iteration", "kv_cache"] {
            assert_eq!(base[table], other[table], "{copy}: [{table}] differs");
        }
    }
}

/// Relative errors (mean ITL, mean TTFT) at every fit point of the BLIS file
/// with the vLLM profile's HBM bandwidth efficiency `bw` and compute
/// efficiency `ce`, each point run by a copy of the BLIS profile carrying
/// that run's flags.
fn fit_residuals(s: &ServerSuite, pts: &[BlisPoint], bw: f64, ce: f64) -> Vec<(f64, f64)> {
    pts.iter()
        .filter(|p| !p.held_out)
        .map(|p| {
            let mut sets = p.sets.clone();
            sets.push(format!("iteration.bandwidth_efficiency={bw}"));
            sets.push(format!("iteration.compute_efficiency={ce}"));
            let (ttft, e2e) = run_blis(s, p, profile_with(s, &sets));
            let itl = (e2e - ttft) / (p.out - 1.0);
            let mitl = (p.e2e - p.ttft) / (p.out - 1.0);
            (err(itl, mitl), err(ttft, p.ttft))
        })
        .collect()
}

/// The least-squares objective: sum of squared relative errors of mean ITL
/// and mean TTFT over the fit points.
fn fit_cost(r: &[(f64, f64)]) -> f64 {
    r.iter().map(|(a, b)| a * a + b * b).sum()
}

/// The shipped profile's (bandwidth_efficiency, compute_efficiency).
fn shipped_efficiencies(s: &ServerSuite) -> (f64, f64) {
    let v = qsim_sim::config::read_toml(Path::new(&s.profile_path)).expect("profile");
    let it = &v["iteration"];
    (
        it["bandwidth_efficiency"]
            .as_float()
            .expect("bandwidth_efficiency"),
        it["compute_efficiency"]
            .as_float()
            .expect("compute_efficiency"),
    )
}

/// Grid on hundredths: (cost, bw, ce) of the best point of a grid.
fn grid_min(
    s: &ServerSuite,
    pts: &[BlisPoint],
    bws: impl Iterator<Item = i64> + Clone,
    ces: impl Iterator<Item = i64>,
    log: bool,
) -> (f64, i64, i64) {
    let mut best = (f64::INFINITY, 0, 0);
    for c in ces {
        for b in bws.clone() {
            let cost = fit_cost(&fit_residuals(s, pts, b as f64 / 100.0, c as f64 / 100.0));
            if log {
                println!(
                    "bw {:.2} ce {:.2}: cost {cost:.6}",
                    b as f64 / 100.0,
                    c as f64 / 100.0
                );
            }
            if cost < best.0 {
                best = (cost, b, c);
            }
        }
    }
    best
}

/// The fit of the vLLM v0.15.1 bf16 profile's two engine coefficients
/// (`scripts/fit-vllm-8b.sh` runs it): least squares on the relative mean
/// ITL and mean TTFT of the fit points (BLIS experiments 23 and 25), over
/// bandwidth efficiency 0.50-1.00 and compute efficiency 0.30-1.00 on a grid
/// of 0.05, then on hundredths within 0.05 of the best coarse point. Prints
/// the result; `vllm_profile_is_the_fit` checks that the shipped figures are it.
#[test]
#[ignore = "the fit itself; run by scripts/fit-vllm-8b.sh"]
fn fit_vllm_8b() {
    let (_, s, _, pts) = blis_points();
    let (_, b, c) = grid_min(&s, &pts, (50..=100).step_by(5), (30..=100).step_by(5), true);
    let (cost, b, c) = grid_min(
        &s,
        &pts,
        (b - 5).max(1)..=(b + 5).min(100),
        (c - 5).max(1)..=(c + 5).min(100),
        false,
    );
    let (bw, ce) = (b as f64 / 100.0, c as f64 / 100.0);
    println!("fit: bandwidth_efficiency = {bw:.2}, compute_efficiency = {ce:.2}, cost {cost:.6}");
    let fit: Vec<&BlisPoint> = pts.iter().filter(|p| !p.held_out).collect();
    for (p, (itl, ttft)) in fit.iter().zip(fit_residuals(&s, &pts, bw, ce)) {
        println!(
            "  {}: mean ITL {:+.1} %, mean TTFT {:+.1} %",
            p.name,
            itl * 100.0,
            ttft * 100.0
        );
    }
    let shipped = shipped_efficiencies(&s);
    println!(
        "shipped: bandwidth_efficiency = {:.2}, compute_efficiency = {:.2}",
        shipped.0, shipped.1
    );
}

/// The shipped vLLM coefficients are the fit's result: no neighbour on the
/// fit's grid of hundredths has a lower least-squares cost on the fit points.
#[test]
fn vllm_profile_is_the_fit() {
    let (_, s, _, pts) = blis_points();
    assert!(pts.iter().filter(|p| !p.held_out).count() >= 4);
    let (bw, ce) = shipped_efficiencies(&s);
    let (b, c) = ((bw * 100.0).round() as i64, (ce * 100.0).round() as i64);
    let here = fit_cost(&fit_residuals(&s, &pts, bw, ce));
    for db in -1..=1 {
        for dc in -1..=1 {
            if (db, dc) == (0, 0) {
                continue;
            }
            let (nb, nc) = ((b + db) as f64 / 100.0, (c + dc) as f64 / 100.0);
            let cost = fit_cost(&fit_residuals(&s, &pts, nb, nc));
            assert!(
                here <= cost,
                "bw {nb:.2} ce {nc:.2} fits better ({cost:.6}) than the shipped {bw:.2} / {ce:.2} ({here:.6})"
            );
        }
    }
}
