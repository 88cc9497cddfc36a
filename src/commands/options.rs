//! `qsim options FILE`: one batch against several deployment options
//! (hosted pay-per-token, provisioned units, fixed or autoscaled replicas),
//! each with its completion time, failures, 429s, p95s and cost, and the
//! cheapest that finishes within `--within` with no failed row (and under
//! the p95 targets); `--fewest`: the fewest units, replicas or autoscaler
//! minimum per option that meets them ([`qsim_sim::options::fewest`]);
//! `--plot DIR`: cost against completion time and E2E p95
//! (`options-cost.png`/`.svg`).

use crate::cli::common::CliError;
use qsim_plot::scatter::{Mark, Scatter, ScatterPoint, VLine};
use qsim_sim::config::ConfigError;
use qsim_sim::options::fewest;
use qsim_sim::options::{render, Outcome, Targets};
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct OptionsArgs {
    /// An options file (kind = "options").
    pub file: PathBuf,
    /// Name the cheapest option finishing within this time with no failed
    /// row (e.g. 300s, 5m; default: the file's within_s).
    #[arg(long, value_parser = crate::cli::common::duration_arg)]
    pub within: Option<qsim_sim::time::Nanos>,
    /// Also require an E2E p95 at or under this (e.g. 5s; default: the
    /// file's e2e_p95_s).
    #[arg(long = "e2e-p95", value_name = "DURATION", value_parser = crate::cli::common::duration_arg)]
    pub e2e_p95: Option<qsim_sim::time::Nanos>,
    /// Also require a TTFT p95 at or under this (default: the file's
    /// ttft_p95_s); hosted options, which do not measure TTFT, miss it.
    #[arg(long = "ttft-p95", value_name = "DURATION", value_parser = crate::cli::common::duration_arg)]
    pub ttft_p95: Option<qsim_sim::time::Nanos>,
    /// Search each option's fewest provisioned units, fixed replicas or
    /// autoscaler minimum that meets the targets (needs one: --within,
    /// --e2e-p95, --ttft-p95 or the file's).
    #[arg(long)]
    pub fewest: bool,
    /// Replace the batch's row count (e.g. 1000000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub rows: Option<u64>,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Override a scalar in the options file first (by name:
    /// `option.h100-x4.replicas=3`; by index: `option[6].replicas=3`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// Threads (default: all cores); the output is the same whatever the number.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Write the report to this file (atomically) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the --out file if it exists.
    #[arg(long)]
    pub force: bool,
    /// The run-time work budget.
    #[command(flatten)]
    pub budget: crate::cli::flags::BudgetFlags,
    /// `--plot DIR` (cost against completion time and E2E p95, PNG and
    /// SVG) and `--html FILE`.
    #[command(flatten)]
    pub plots: crate::plot::PlotOpts,
}

pub fn run_cli(a: &OptionsArgs) -> Result<(), CliError> {
    if let Some(p) = &a.out {
        crate::output::check_target(p, a.force)?;
    }
    let plots = a.plots.targets(a.force);
    plots.check()?;
    let fname = a.file.display().to_string();
    let file = qsim_sim::options::load(&a.file, &a.sets, a.rows)
        .map_err(|e| crate::cli::common::name_fields(e, Some(&a.file), &a.sets))?;
    let targets = Targets {
        within: a.within.or(file.within),
        e2e_p95: a.e2e_p95.or(file.e2e_p95),
        ttft_p95: a.ttft_p95.or(file.ttft_p95),
    };
    if a.fewest && !targets.any() {
        return Err(CliError::Config(ConfigError::new(
            "--fewest",
            "",
            format!("needs a target: --within, --e2e-p95 or --ttft-p95, or within_s, e2e_p95_s or ttft_p95_s in {fname}"),
        )));
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.map_or(0, usize::from))
        .build()
        .map_err(|e| ConfigError::new("--threads", "", e.to_string()))?;
    let n = file.options.len();
    let mut unmet = None;
    let (text, points) = if a.fewest {
        let found = each(&pool, n, |i| fewest::search(&file, i, a.seed, &targets));
        // a run the work budget stopped decided nothing
        qsim_sim::work::check(&fname)?;
        if !found.iter().any(|f| f.meets(&targets)) {
            // printed, then exit 1 (as `recommend` when nothing meets)
            unmet = Some(format!(
                "{fname}: no option meets the targets (see the report: each option's closest run and why it misses)"
            ));
        }
        let text = render::render_fewest(&file, &found, a.seed, &targets);
        let points: Vec<(String, Outcome)> = found
            .into_iter()
            .filter(|f| f.knob.is_none() || f.count.is_some())
            .map(|f| {
                let label = match (f.knob, f.count) {
                    (Some(k), Some(n)) => format!("{} ({})", f.name, fewest::count_words(k, n)),
                    _ => f.name.clone(),
                };
                (label, f.outcome)
            })
            .collect();
        (text, points)
    } else {
        let outcomes = each(&pool, n, |i| {
            qsim_sim::options::run_option(&file, i, a.seed)
        });
        qsim_sim::work::check(&fname)?;
        let text = render::render(&file, &outcomes, a.seed, &targets);
        let points = outcomes.into_iter().map(|o| (o.name.clone(), o)).collect();
        (text, points)
    };
    if plots.wanted() {
        let intro = format!(
            "qsim options {fname}{}: seed {}",
            if a.fewest { " --fewest" } else { "" },
            a.seed
        );
        crate::plot::write(
            &plots,
            "qsim options",
            &intro,
            Vec::new(),
            &[cost_figure(&file.title, &points, &targets)],
            Some(&text),
        )?;
    }
    crate::cli::common::emit(&text, a.out.as_deref(), a.force)?;
    match unmet {
        Some(m) => Err(CliError::Unmet(m)),
        None => Ok(()),
    }
}

/// `f(i)` for each option `i` on the pool, in option order, every call
/// charged to this command's work budget (an option's runs, e.g. its
/// search, stay in order inside its call).
fn each<T: Send>(pool: &rayon::ThreadPool, n: usize, f: impl Fn(usize) -> T + Sync) -> Vec<T> {
    let meter = qsim_sim::work::current();
    pool.install(|| {
        use rayon::prelude::*;
        (0..n)
            .into_par_iter()
            .map(|i| qsim_sim::work::enter(meter.clone(), || f(i)))
            .collect()
    })
}

/// The cost scatter: each priced option at (completion time, cost) and at
/// (E2E p95, cost), labelled; meeting the targets in colour, missing them
/// in grey, the cheapest meeting them ringed; the time and E2E targets as
/// dashed lines. Options without a price are left out (the caption says
/// how many).
pub fn cost_figure(
    title: &str,
    points: &[(String, Outcome)],
    targets: &Targets,
) -> crate::plot::Fig {
    let priced: Vec<&(String, Outcome)> =
        points.iter().filter(|p| p.1.cost_usd.is_some()).collect();
    let outcomes: Vec<Outcome> = priced.iter().map(|p| p.1.clone()).collect();
    let chosen = qsim_sim::options::cheapest_meeting(&outcomes, targets).map(|o| o.name.clone());
    let mut first_chosen = chosen.is_some();
    let marks: Vec<Mark> = priced
        .iter()
        .map(|(_, o)| {
            if targets.missed(o).is_some() {
                Mark::Misses
            } else if first_chosen && Some(&o.name) == chosen.as_ref() {
                first_chosen = false;
                Mark::Chosen
            } else {
                Mark::Meets
            }
        })
        .collect();
    let panel = |what: &str, x: &dyn Fn(&Outcome) -> f64, vline: Option<VLine>| Scatter {
        title: format!("cost vs {what}"),
        x_label: what.to_string(),
        y_label: "cost ($)".into(),
        points: priced
            .iter()
            .zip(&marks)
            .map(|((label, o), &mark)| ScatterPoint {
                label: label.clone(),
                x: x(o),
                y: o.cost_usd.unwrap_or(f64::NAN),
                mark,
            })
            .collect(),
        vline,
    };
    let secs = qsim_sim::time::to_secs;
    let done = panel(
        "completion time (s)",
        &|o| secs(o.elapsed),
        targets.within.map(|w| VLine {
            label: format!("within {} s", secs(w)),
            x: secs(w),
        }),
    );
    let e2e = panel(
        "E2E p95 (s)",
        &|o| o.e2e_p95_s,
        targets.e2e_p95.map(|t| VLine {
            label: format!("E2E p95 target {} s", secs(t)),
            x: secs(t),
        }),
    );
    let unpriced = points.len() - priced.len();
    crate::plot::Fig {
        name: "options-cost".into(),
        caption: format!(
            "{}: each option's cost against its completion time and its E2E p95 ({}){}",
            if title.is_empty() {
                "qsim options"
            } else {
                title
            },
            targets.describe(),
            if unpriced > 0 {
                format!("; {unpriced} option(s) without a price left out")
            } else {
                String::new()
            }
        ),
        figure: qsim_plot::scatter_figure(vec![done, e2e]),
    }
}
