//! `qsim trace stats FILE`: a request trace's rates, burstiness and
//! lengths, and the synthetic workload fitted to it (qsim-sim's
//! `trace::stats` computes; this module reads the flags and renders).

use crate::cli::common::CliError;
use qsim_sim::config::ConfigError;
use qsim_sim::trace::stats::{self, TraceStats, PERCENTILES};
use qsim_sim::trace::{RawTrace, TraceSpec};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Which trace and how it is replayed: the fields of a `trace = { … }`
/// table as flags.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceFlags {
    /// The trace file.
    pub file: PathBuf,
    /// azure, burstgpt, mooncake, proxy or csv (default: from the first line).
    #[arg(long)]
    pub format: Option<String>,
    /// csv: the time column.
    #[arg(long)]
    pub time_column: Option<String>,
    /// csv: the time column's unit: s, ms, us, ns or datetime (default s).
    #[arg(long)]
    pub time_unit: Option<String>,
    /// csv: the input-token column.
    #[arg(long)]
    pub input_column: Option<String>,
    /// csv: the output-token column.
    #[arg(long)]
    pub output_column: Option<String>,
    /// A CSV column naming each request's consumer.
    #[arg(long)]
    pub consumer_column: Option<String>,
    /// Split requests among consumers by share: `--share a=0.7 --share b=0.3`.
    #[arg(long = "share", value_name = "NAME=WEIGHT")]
    pub shares: Vec<String>,
    /// Only requests from this many seconds after the first row.
    #[arg(long, value_name = "SECS")]
    pub from: Option<f64>,
    /// Only requests before this many seconds after the first row.
    #[arg(long, value_name = "SECS")]
    pub to: Option<f64>,
    /// Requests per row (2: the same pattern at twice the traffic).
    #[arg(long)]
    pub scale: Option<f64>,
    /// Time compression (2: the trace in half the time).
    #[arg(long)]
    pub compress: Option<f64>,
    /// Replay the trace this many times back to back.
    #[arg(long, allow_negative_numbers = true)]
    pub loops: Option<i64>,
}

impl TraceFlags {
    /// The flags as the `trace = { … }` table they stand for.
    pub fn raw(&self) -> Result<RawTrace, ConfigError> {
        let shares = if self.shares.is_empty() {
            None
        } else {
            let mut m = BTreeMap::new();
            for s in &self.shares {
                let (n, w) = s.split_once('=').ok_or_else(|| {
                    ConfigError::new("--share", "", format!("expected NAME=WEIGHT, got {s:?}"))
                })?;
                let w: f64 = w.trim().parse().map_err(|_| {
                    ConfigError::new("--share", "", format!("not a number: {w:?} in {s:?}"))
                })?;
                if m.insert(n.trim().to_string(), w).is_some() {
                    return Err(ConfigError::new(
                        "--share",
                        "",
                        format!("{n:?} given twice"),
                    ));
                }
            }
            Some(m)
        };
        Ok(RawTrace {
            file: self.file.display().to_string(),
            format: self.format.clone(),
            time_column: self.time_column.clone(),
            time_unit: self.time_unit.clone(),
            input_column: self.input_column.clone(),
            output_column: self.output_column.clone(),
            consumer_column: self.consumer_column.clone(),
            shares,
            from_s: self.from,
            to_s: self.to,
            scale: self.scale,
            compress: self.compress,
            loops: self.loops,
        })
    }

    /// The validated trace (errors name the flag: `--scale`).
    pub fn spec(&self) -> Result<TraceSpec, ConfigError> {
        let raw = self.raw()?;
        // the file is named as given (relative to the working directory)
        TraceSpec::from_raw("", "", Path::new(""), &raw, false).map_err(flag_names)
    }
}

/// A field of the trace table as the flag that set it.
fn flag_names(mut e: ConfigError) -> ConfigError {
    if e.source.is_empty() {
        let flag = match e.field.as_str() {
            "from_s" => "--from".to_string(),
            "to_s" => "--to".to_string(),
            "shares" => "--share".to_string(),
            f if f.starts_with("shares.") => "--share".to_string(),
            f => format!("--{}", f.replace('_', "-")),
        };
        e.source = flag;
        e.field = String::new();
    }
    e
}

#[derive(clap::Args, Debug)]
pub struct StatsArgs {
    #[command(flatten)]
    pub trace: TraceFlags,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Seed of the draws a fractional --scale or --share makes.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Draw the requests per minute and the length histograms into this
    /// directory (trace-rate, trace-input, trace-output; PNG and SVG).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// The work budget (a row read counts 1/4 of a request).
    #[command(flatten)]
    pub budget: crate::cli::flags::BudgetFlags,
}

#[derive(clap::Args, Debug)]
pub struct PlanArgs {
    /// A server experiment file whose scenarios replay traces
    /// (`trace = { file = … }`): each is planned.
    pub file: PathBuf,
    /// The target: every minute's E2E p95 at most this (`10s`, `2500ms`).
    #[arg(long, value_parser = crate::cli::common::duration_arg)]
    pub e2e_p95: Option<qsim_sim::time::Nanos>,
    /// The target: every minute's TTFT p95 at most this.
    #[arg(long, value_parser = crate::cli::common::duration_arg)]
    pub ttft_p95: Option<qsim_sim::time::Nanos>,
    /// The most replicas tried.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub max_replicas: u32,
    /// Plan only these scenarios (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Override a scalar in the file (`--set scenario.code.trace.scale=2`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// Seed of the server model and the synthetic workloads.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Print JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// The work and memory budget, as `qsim run`'s.
    #[command(flatten)]
    pub budget: crate::cli::flags::BudgetFlags,
}

impl TraceCmd {
    /// The budget flags of the subcommand.
    pub fn budget(&self) -> crate::cli::flags::BudgetFlags {
        match self {
            TraceCmd::Plan(a) => a.budget,
            TraceCmd::Stats(a) => a.budget,
        }
    }

    /// What the budget's refusal names.
    pub fn source(&self) -> String {
        match self {
            TraceCmd::Plan(a) => a.file.display().to_string(),
            TraceCmd::Stats(a) => a.trace.file.display().to_string(),
        }
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum TraceCmd {
    /// The fewest server replicas that meet the latency targets in every
    /// minute of a trace, the minutes that set the answer, and the same
    /// plan on synthetic workloads fitted to the trace (gamma gaps of its
    /// CV; Poisson) beside it.
    Plan(PlanArgs),
    /// Requests, duration, mean and peak rates, inter-arrival CV, index of
    /// dispersion, length percentiles, and a synthetic workload fitted to
    /// the trace (a server scenario qsim accepts).
    Stats(StatsArgs),
}

pub fn run_cli(cmd: &TraceCmd) -> Result<(), CliError> {
    match cmd {
        TraceCmd::Plan(a) => plan(a),
        TraceCmd::Stats(a) => {
            // --plot DIR checked before the trace is read (an existing
            // file is an error naming the flag)
            crate::plot::Targets {
                plot: a.plot.clone(),
                html: None,
                force: false,
            }
            .check()?;
            let spec = a.trace.spec()?;
            // a scanned trace (looped) is counted before it is read again
            if let Some((n, _)) = spec.expected() {
                let mut c = qsim_sim::budget::Cost::default();
                c.part("reading the trace", n * 0.25, 0.0);
                c.check(&spec.label(), &a.budget.budget())?;
            }
            let st = stats::compute(&spec, a.seed).map_err(flag_names)?;
            if st.reordered > 0 {
                eprintln!(
                    "warning: {}: {} rows out of time order were put in order",
                    st.file, st.reordered
                );
            }
            if st.skipped > 0 {
                eprintln!(
                    "note: {}: {} records skipped (invalid requests, client retries or no token counts)",
                    st.file, st.skipped
                );
            }
            let fmt = spec.format.as_ref().map_or("", |f| f.name());
            let text = if a.json {
                json(&st, fmt)
            } else {
                table(&st, fmt)
            };
            if let Some(dir) = &a.plot {
                plots(&st, dir)?;
            }
            print!("{text}");
            Ok(())
        }
    }
}

/// `--plot DIR`: requests per minute, and the length histograms.
fn plots(st: &TraceStats, dir: &Path) -> Result<(), CliError> {
    use qsim_plot::{metric_lines, LineChart, Series};
    // minutes, or (a trace longer than the series keeps) the mean per
    // minute over longer windows
    let w_min = (st.rate.window_s / 60) as f64;
    let rate = LineChart {
        title: format!("{}: requests per minute", st.file),
        x_label: if w_min > 1.0 {
            format!("minutes after the first request (means over {w_min} min)")
        } else {
            "minutes after the first request".into()
        },
        y_label: "requests per minute".into(),
        series: vec![Series {
            name: "requests".into(),
            points: st
                .rate
                .counts
                .iter()
                .enumerate()
                .map(|(m, &k)| (m as f64 * w_min, k as f64 / w_min))
                .collect(),
            band: Vec::new(),
        }],
        ..Default::default()
    };
    let hist = |name: &str, h: &[(f64, u64)]| Series {
        name: name.into(),
        points: h.iter().map(|&(x, k)| (x, k as f64)).collect(),
        band: Vec::new(),
    };
    let lengths = |name: &str, h: &[(f64, u64)]| LineChart {
        title: format!("{}: {name} tokens", st.file),
        x_label: format!("{name} tokens (bin start, {} equal bins)", stats::HIST_BINS),
        y_label: "requests".into(),
        series: vec![hist(name, h)],
        ..Default::default()
    };
    let figs = vec![
        crate::plot::Fig {
            name: "trace-rate".into(),
            caption: "Requests per minute of arrival.".into(),
            figure: metric_lines(rate),
        },
        crate::plot::Fig {
            name: "trace-input".into(),
            caption: "Input tokens: requests per bin.".into(),
            figure: metric_lines(lengths("input", &st.input_hist)),
        },
        crate::plot::Fig {
            name: "trace-output".into(),
            caption: "Output tokens: requests per bin.".into(),
            figure: metric_lines(lengths("output", &st.output_hist)),
        },
    ];
    let t = crate::plot::Targets {
        plot: Some(dir.to_path_buf()),
        ..Default::default()
    };
    crate::plot::write(&t, "trace", "", Vec::new(), &figs, None)
}

fn num(v: f64) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let a = v.abs();
    if a >= 100.0 || v == v.trunc() {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

fn pct_label(q: f64) -> String {
    if q == 1.0 {
        "max".into()
    } else {
        format!("p{}", (q * 100.0).round())
    }
}

fn lengths(l: &stats::LengthStats) -> String {
    let mut s = String::new();
    for (q, v) in PERCENTILES.iter().zip(&l.percentiles) {
        let _ = write!(s, "{} {}  ", pct_label(*q), num(*v));
    }
    let _ = write!(s, "mean {}", num(l.mean));
    s
}

/// The report as text.
pub fn table(st: &TraceStats, fmt: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "trace {} ({fmt})", st.file);
    let _ = writeln!(s, "  requests        {}", st.requests);
    let _ = writeln!(s, "  duration        {} s", num(st.duration_s));
    let _ = writeln!(
        s,
        "  mean rate       {} /s ({} per minute)",
        num(st.mean_rate),
        num(st.mean_rate * 60.0)
    );
    let peaks: Vec<String> = st
        .peaks
        .iter()
        .map(|p| format!("{} in {} s (at {} s)", p.requests, p.window_s, p.start_s))
        .collect();
    let _ = writeln!(s, "  peak            {}", peaks.join(", "));
    let _ = writeln!(
        s,
        "  inter-arrival   mean {} s, CV {}",
        num(st.gap_mean_s),
        num(st.gap_cv)
    );
    let disp: Vec<String> = st
        .dispersion
        .iter()
        .map(|(w, d)| format!("{w} s: {}", num(*d)))
        .collect();
    let _ = writeln!(
        s,
        "  dispersion      {}  (variance/mean of counts; Poisson 1)",
        disp.join(", ")
    );
    let _ = writeln!(s, "  input tokens    {}", lengths(&st.input));
    let _ = writeln!(s, "  output tokens   {}", lengths(&st.output));
    if !st.consumers.is_empty() {
        let c: Vec<String> = st
            .consumers
            .iter()
            .map(|(n, k)| format!("{} {k}", qsim_sim::report::terminal_safe(n)))
            .collect();
        let _ = writeln!(s, "  consumers       {}", c.join(", "));
    }
    if let Some(f) = st.fitted_fields() {
        let _ = writeln!(
            s,
            "\n# fitted: the mean rate, gamma gaps of the trace's CV, log-normal lengths\n# through its p50 and p95, as a server experiment's scenario\n[[scenario]]\nname = \"fitted\"\n{}",
            f.trim_end()
        );
    }
    s
}

/// The report as JSON.
pub fn json(st: &TraceStats, fmt: &str) -> String {
    let l = |x: &stats::LengthStats| {
        let mut m = serde_json::Map::new();
        for (q, v) in PERCENTILES.iter().zip(&x.percentiles) {
            m.insert(pct_label(*q), serde_json::json!(v));
        }
        m.insert("mean".into(), serde_json::json!(x.mean));
        serde_json::Value::Object(m)
    };
    let v = serde_json::json!({
        "file": st.file,
        "format": fmt,
        "requests": st.requests,
        "duration_s": st.duration_s,
        "mean_rate_per_s": st.mean_rate,
        "peaks": st.peaks.iter().map(|p| serde_json::json!({"window_s": p.window_s, "requests": p.requests, "start_s": p.start_s})).collect::<Vec<_>>(),
        "inter_arrival_mean_s": st.gap_mean_s,
        "inter_arrival_cv": st.gap_cv,
        "index_of_dispersion": st.dispersion.iter().map(|(w, d)| serde_json::json!({"window_s": w, "value": d})).collect::<Vec<_>>(),
        "input_tokens": l(&st.input),
        "output_tokens": l(&st.output),
        "input_tokens_total": st.input_total,
        "output_tokens_total": st.output_total,
        "consumers": st.consumers.iter().map(|(n, k)| serde_json::json!({"name": n, "requests": k})).collect::<Vec<_>>(),
        "reordered": st.reordered,
        "skipped": st.skipped,
        "fitted": st.fitted_fields(),
    });
    let mut s = serde_json::to_string_pretty(&v).expect("JSON of plain values");
    s.push('\n');
    s
}

fn plan(a: &PlanArgs) -> Result<(), CliError> {
    use qsim_sim::experiment::server::Load;
    use qsim_sim::experiment::trace_plan::{compare, Targets};
    use qsim_sim::experiment::ExperimentFile;
    let targets = Targets {
        e2e_p95_s: a.e2e_p95.map(qsim_sim::time::to_secs),
        ttft_p95_s: a.ttft_p95.map(qsim_sim::time::to_secs),
    };
    if targets.e2e_p95_s.is_none() && targets.ttft_p95_s.is_none() {
        return Err(ConfigError::new(
            "--e2e-p95",
            "",
            "give a target: --e2e-p95 and/or --ttft-p95",
        )
        .into());
    }
    let mut f = crate::cli::common::load_experiment(&a.file, &a.sets)?;
    f.retain_only(&a.only)?;
    let ExperimentFile::Server(suite) = f else {
        return Err(ConfigError::new(
            a.file.display().to_string(),
            "kind",
            "qsim trace plan takes a server experiment file (kind = \"server\") with trace scenarios",
        )
        .into());
    };
    let scenarios: Vec<_> = suite
        .scenarios
        .iter()
        .filter(|s| matches!(s.load, Load::Trace(_)))
        .collect();
    if scenarios.is_empty() {
        return Err(ConfigError::new(
            a.file.display().to_string(),
            "scenario",
            "no scenario replays a trace (trace = { file = … })",
        )
        .into());
    }
    // the budget `qsim run` uses: the least this plan costs, refused at
    // once if over (the search's later runs are counted as they run)
    let mut cost = qsim_sim::budget::Cost::default();
    for s in &scenarios {
        cost.then(qsim_sim::experiment::trace_plan::cost(&suite.profile, s));
    }
    cost.check(&a.file.display().to_string(), &a.budget.budget())?;
    let mut out = Vec::new();
    for s in scenarios {
        let c = compare(&suite.profile, s, &targets, a.seed, a.max_replicas)?;
        qsim_sim::work::check(&a.file.display().to_string())?;
        out.push(c);
    }
    let profile = Path::new(&suite.profile_path)
        .file_stem()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    let text = if a.json {
        plan_json(&out, &targets)
    } else {
        plan_table(&out, &targets, &a.file, &profile, a.seed, a.max_replicas)
    };
    print!("{text}");
    if let Some(c) = out.iter().find(|c| c.answers[0].replicas.is_none()) {
        return Err(CliError::Unmet(format!(
            "scenario {:?}: no replica count up to {} meets the targets in every minute of the trace",
            c.scenario, a.max_replicas
        )));
    }
    Ok(())
}

fn secs(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0} s")
    } else if v >= 10.0 {
        format!("{v:.1} s")
    } else {
        format!("{v:.3} s")
    }
}

fn target_text(t: &qsim_sim::experiment::trace_plan::Targets) -> String {
    let mut v = Vec::new();
    if let Some(x) = t.e2e_p95_s {
        v.push(format!("E2E p95 <= {}", secs(x)));
    }
    if let Some(x) = t.ttft_p95_s {
        v.push(format!("TTFT p95 <= {}", secs(x)));
    }
    v.join(" and ")
}

fn minute_text(m: &qsim_sim::experiment::trace_plan::Minute, ttft: bool) -> String {
    if ttft {
        format!("E2E {} TTFT {}", secs(m.e2e_p95_s), secs(m.ttft_p95_s))
    } else {
        secs(m.e2e_p95_s)
    }
}

fn plan_table(
    cs: &[qsim_sim::experiment::trace_plan::Comparison],
    t: &qsim_sim::experiment::trace_plan::Targets,
    file: &Path,
    profile: &str,
    seed: u64,
    max: u32,
) -> String {
    let ttft = t.ttft_p95_s.is_some();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "qsim trace plan {}: {profile}, target {} in every minute, seed {seed}",
        file.display(),
        target_text(t)
    );
    for c in cs {
        let b = &c.busiest;
        let _ = writeln!(
            s,
            "\n{}: {} requests in {:.1} min, {:.0} per minute on average; busiest minute {} ({} requests)",
            c.scenario,
            c.stats.requests,
            c.stats.duration_s / 60.0,
            c.stats.mean_rate * 60.0,
            b.minute,
            b.requests
        );
        let mw = if ttft { 26 } else { 10 };
        let _ = writeln!(
            s,
            "  {:<30} {:>8}  {:<mw$}  {:<w2$}  trace at these replicas, min {}",
            "workload",
            "replicas",
            format!("min {}", b.minute),
            "worst minute",
            b.minute,
            w2 = mw + 9
        );
        for (a, at) in c.answers.iter().zip(&c.trace_at) {
            let r = a.replicas.map_or(format!("> {max}"), |r| r.to_string());
            let pred = a
                .run
                .minute(b.minute)
                .map_or("none".to_string(), |m| minute_text(m, ttft));
            let worst = a.run.worst(t).map_or("-".to_string(), |m| {
                format!("{} (min {})", minute_text(m, ttft), m.minute)
            });
            let tr = at
                .as_ref()
                .map_or("-".to_string(), |m| minute_text(m, ttft));
            let _ = writeln!(
                s,
                "  {:<30} {:>8}  {:<mw$}  {:<w2$}  {}",
                a.workload,
                r,
                pred,
                worst,
                tr,
                w2 = mw + 9
            );
        }
        let _ = writeln!(
            s,
            "  (p95 per minute of arrival: each workload's own run at its replica count; the last column is the trace's run)"
        );
        let tr = &c.answers[0];
        if let Some(r) = tr.replicas {
            if tr.setting.is_empty() {
                let _ = writeln!(s, "  one replica meets the target in every minute");
            } else {
                let shown: Vec<String> = tr
                    .setting
                    .iter()
                    .take(5)
                    .map(|m| {
                        format!(
                            "{} ({}, {} requests)",
                            m.minute,
                            minute_text(m, ttft),
                            m.requests
                        )
                    })
                    .collect();
                let more = tr.setting.len().saturating_sub(5);
                let _ = writeln!(
                    s,
                    "  minutes that set the trace's answer (over the target with {} replicas): {}{}",
                    r - 1,
                    shown.join(", "),
                    if more > 0 { format!(" and {more} more") } else { String::new() }
                );
            }
        }
        if tr.run.rejected > 0 {
            let _ = writeln!(
                s,
                "  {} requests the server can never run (longer than the model) are not timed",
                tr.run.rejected
            );
        }
    }
    s
}

fn plan_json(
    cs: &[qsim_sim::experiment::trace_plan::Comparison],
    t: &qsim_sim::experiment::trace_plan::Targets,
) -> String {
    let m = |m: &qsim_sim::experiment::trace_plan::Minute| serde_json::json!({"minute": m.minute, "requests": m.requests, "e2e_p95_s": m.e2e_p95_s, "ttft_p95_s": m.ttft_p95_s});
    let v: Vec<serde_json::Value> = cs
        .iter()
        .map(|c| {
            serde_json::json!({
                "scenario": c.scenario,
                "requests": c.stats.requests,
                "busiest_minute": m(&c.busiest),
                "workloads": c.answers.iter().zip(&c.trace_at).map(|(a, at)| serde_json::json!({
                    "workload": a.workload,
                    "replicas": a.replicas,
                    "predicted_at_busiest_minute": a.run.minute(c.busiest.minute).map(m),
                    "trace_at_these_replicas_busiest_minute": at.as_ref().map(m),
                    "minutes_setting_the_answer": a.setting.iter().map(m).collect::<Vec<_>>(),
                    "rejected": a.run.rejected,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut s = serde_json::to_string_pretty(&serde_json::json!({
        "targets": {"e2e_p95_s": t.e2e_p95_s, "ttft_p95_s": t.ttft_p95_s},
        "scenarios": v,
    }))
    .expect("JSON of plain values");
    s.push('\n');
    s
}
