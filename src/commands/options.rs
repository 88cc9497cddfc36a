//! `qsim options FILE`: one batch against several deployment options
//! (hosted pay-per-token, provisioned units, fixed or autoscaled replicas),
//! each with its completion time, failures, 429s, p95s and cost, and the
//! cheapest that finishes within `--within` with no failed row
//! ([`qsim_sim::options`]).

use crate::cli::common::CliError;
use qsim_sim::config::ConfigError;
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct OptionsArgs {
    /// An options file (kind = "options").
    pub file: PathBuf,
    /// Name the cheapest option finishing within this time with no failed
    /// row (e.g. 300s, 5m; default: the file's within_s).
    #[arg(long, value_parser = crate::cli::common::duration_arg)]
    pub within: Option<qsim_sim::time::Nanos>,
    /// Replace the batch's row count (e.g. 1000000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub rows: Option<u64>,
    /// Seed of the simulation.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Override a scalar in the options file first (`option[2].replicas=3`).
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
}

pub fn run_cli(a: &OptionsArgs) -> Result<(), CliError> {
    if let Some(p) = &a.out {
        crate::output::check_target(p, a.force)?;
    }
    let fname = a.file.display().to_string();
    let file = qsim_sim::options::load(&a.file, &a.sets, a.rows)
        .map_err(|e| crate::cli::common::name_fields(e, Some(&a.file), &a.sets))?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.map_or(0, usize::from))
        .build()
        .map_err(|e| ConfigError::new("--threads", "", e.to_string()))?;
    let meter = qsim_sim::work::current();
    let outcomes = pool.install(|| {
        use rayon::prelude::*;
        (0..file.options.len())
            .into_par_iter()
            .map(|i| {
                qsim_sim::work::enter(meter.clone(), || {
                    qsim_sim::options::run_option(&file, i, a.seed)
                })
            })
            .collect::<Vec<_>>()
    });
    // a run the work budget stopped decided nothing
    qsim_sim::work::check(&fname)?;
    let within = a.within.or(file.within);
    let text = qsim_sim::options::render::render(&file, &outcomes, a.seed, within);
    crate::cli::common::emit(&text, a.out.as_deref(), a.force)
}
