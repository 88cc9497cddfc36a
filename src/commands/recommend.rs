//! `qsim recommend FILE`: the arguments of [`qsim_sim::recommend`] (the
//! search, its report) and the Pareto figure.

use crate::cli::common::{emit, CliError, Format};
use qsim_sim::config::ConfigError;
use qsim_sim::recommend::{recommend, Recommendation, Spec};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct RecommendArgs {
    /// A hosted experiment file (its endpoint, rows, token distributions,
    /// workers, max_tokens, sdk_retries and [managed] are the starting point).
    pub file: PathBuf,
    /// The metric to optimise, as a median over seeds: elapsed, p50, p95,
    /// http_429, http_requests, own_wait, … (minimised); throughput, ok
    /// (maximised).
    #[arg(long, default_value = "elapsed")]
    pub objective: String,
    /// A constraint `METRIC OP [K*]TERM [in P% of seeds]` (OP: <= >= < > ==;
    /// TERM: a number, `rows` or a metric). With `in P% of seeds` it must
    /// hold seed by seed in at least P % of the seeds; without, on the
    /// medians. Defaults, each replaced by a constraint on the same metric:
    /// "ok>=rows in 95% of seeds", "p95<=2*p50", "truncated<=0.01*rows".
    #[arg(long = "constraint", value_name = "EXPR")]
    pub constraints: Vec<String>,
    /// Seed of the first run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seeds per configuration.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub seeds: u64,
    /// Override a scalar in the file first (as `qsim run --set`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// Threads (default: all cores); the output is the same whatever the number.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the report to this file (atomically) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the --out file if it exists.
    #[arg(long)]
    pub force: bool,
    /// The work budget, checked against the grid stage's estimate.
    #[command(flatten)]
    pub budget: crate::cli::flags::BudgetFlags,
    /// `--plot DIR` (the Pareto scatter, PNG and SVG) and `--html FILE`.
    #[command(flatten)]
    pub plots: crate::plot::PlotOpts,
}

impl RecommendArgs {
    pub fn spec(&self) -> Spec {
        Spec {
            file: self.file.clone(),
            sets: self.sets.clone(),
            objective: self.objective.clone(),
            constraints: self.constraints.clone(),
            seed: self.seed,
            seeds: self.seeds,
            threads: self.threads.map(usize::from),
            budget: self.budget.budget(),
        }
    }
}

pub fn run_cli(a: &RecommendArgs) -> Result<(), CliError> {
    if a.format == Format::Csv {
        return Err(CliError::Config(ConfigError::new(
            "--format csv",
            "",
            "qsim recommend writes a table or JSON",
        )));
    }
    if let Some(p) = &a.out {
        crate::output::check_target(p, a.force)?;
    }
    let targets = a.plots.targets(a.force);
    targets.check()?;
    let rec = recommend(&a.spec())?;
    if rec.winner.is_none() {
        return Err(CliError::Unmet(rec.unmet()));
    }
    let text = match a.format {
        Format::Json => qsim_sim::report::json_text(&rec.render_json()),
        _ => rec.render_table(),
    };
    if targets.wanted() {
        let intro = format!(
            "qsim recommend {}: {} configurations evaluated over {} seeds from seed {}",
            rec.file,
            rec.evaluated.len(),
            rec.seeds,
            rec.seed
        );
        crate::plot::write(
            &targets,
            "qsim recommend",
            &intro,
            Vec::new(),
            &[pareto_figure(&rec)],
            Some(&rec.render_table()),
        )?;
    }
    emit(&text, a.out.as_deref(), a.force)
}

/// The Pareto scatter: every configuration that meets the constraints not
/// on its axes (median elapsed vs median p95), the front highlighted and
/// labelled, as in the table's "Pareto front".
fn pareto_figure(rec: &Recommendation) -> crate::plot::Fig {
    let points = rec
        .pareto_candidates()
        .map(|s| qsim_plot::ParetoPoint {
            label: s.config.label(),
            x: s.median_elapsed(),
            y: s.median_p95(),
        })
        .collect();
    crate::plot::Fig {
        name: "recommend-pareto".into(),
        caption: format!(
            "Configurations meeting the other constraints: median elapsed vs median p95 over {} seeds; the Pareto front highlighted",
            rec.seeds
        ),
        figure: qsim_plot::pareto(
            "qsim recommend: elapsed vs p95",
            "elapsed (s, median over seeds)",
            "latency p95 (s, median over seeds)",
            points,
        ),
    }
}
