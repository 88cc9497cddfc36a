//! `qsim trace stats FILE`: a request trace's rates, burstiness and
//! lengths, and the synthetic workload fitted to it (qsim-sim's
//! `trace::stats` computes; this module reads the flags and renders).

use crate::cli::common::{CliError, Format};
use qsim_sim::config::ConfigError;
use qsim_sim::experiment::trace_plan_run;
use qsim_sim::trace::stats::{self, TraceStats};
use qsim_sim::trace::{render, RawTrace, TraceSpec};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Which trace and how it is replayed: the fields of a `trace = { … }`
/// table as flags.
#[derive(clap::Args, Debug, Clone)]
pub struct TraceFlags {
    /// The trace file.
    pub file: PathBuf,
    /// The trace file's format: azure, burstgpt, mooncake, proxy or csv
    /// (default: from the first line).
    #[arg(long, value_name = "FORMAT")]
    pub trace_format: Option<String>,
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
            format: self.trace_format.clone(),
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
            "format" => "--trace-format".to_string(),
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
    /// Output format (table or json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// The same as `--format json` (kept for earlier scripts).
    #[arg(long, hide = true)]
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
    /// Output format (table or json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// The same as `--format json` (kept for earlier scripts).
    #[arg(long, hide = true)]
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

/// `--format json` (or the old `--json`); CSV is not a report of these.
fn json_out(format: Format, json: bool) -> Result<bool, CliError> {
    if format == Format::Csv {
        return Err(
            ConfigError::new("--format csv", "", "qsim trace writes a table or JSON").into(),
        );
    }
    Ok(json || format == Format::Json)
}

pub fn run_cli(cmd: &TraceCmd) -> Result<(), CliError> {
    match cmd {
        TraceCmd::Plan(a) => {
            let json = json_out(a.format, a.json)?;
            let p = trace_plan_run::plan(&trace_plan_run::Spec {
                file: a.file.clone(),
                sets: a.sets.clone(),
                only: a.only.clone(),
                e2e_p95: a.e2e_p95,
                ttft_p95: a.ttft_p95,
                max_replicas: a.max_replicas,
                seed: a.seed,
                budget: a.budget.budget(),
            })?;
            print!(
                "{}",
                if json {
                    p.render_json()
                } else {
                    p.render_table()
                }
            );
            match p.unmet() {
                Some(m) => Err(CliError::Unmet(m)),
                None => Ok(()),
            }
        }
        TraceCmd::Stats(a) => {
            let json = json_out(a.format, a.json)?;
            // --plot DIR checked before the trace is read (an existing
            // file is an error naming the flag)
            crate::plot::Targets {
                plot: a.plot.clone(),
                html: None,
                force: false,
            }
            .check()?;
            let spec = a.trace.spec()?;
            let st = stats::measure(&spec, a.seed, &a.budget.budget()).map_err(flag_names)?;
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
            let text = if json {
                render::json(&st, fmt)
            } else {
                render::table(&st, fmt)
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
