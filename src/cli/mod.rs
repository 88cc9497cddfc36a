//! The command line: clap's definitions of every subcommand and the
//! dispatch to [`crate::commands`]; the shared plumbing is in [`common`].

pub mod common;
pub mod flags;

use common::{emit, name_fields, plan_err, CliError, Format};
use flags::BudgetFlags;

use crate::output;
use clap::{Parser, Subcommand};
use qsim_sim::config::ConfigError;
use qsim_sim::report;
use qsim_sim::report::records::PointRecords;
use std::path::{Path, PathBuf};

#[derive(Parser, Debug)]
#[command(
    name = "qsim",
    version,
    about = "Deterministic simulator and capacity planner for shared LLM inference deployments"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

/// Options shared by `run` and `sweep`.
#[derive(clap::Args, Debug)]
pub struct RunOpts {
    /// Seed of the first run.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub seed: u64,
    /// Number of seeds (seed, seed+1, …); reports median and 90 % interval.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub seeds: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Override a scalar in the file: `--set workers=16 --set experiment.1.retry.max_attempts=5`
    /// (for sweep: fixed overrides applied before the grid's). In a hosted
    /// file `endpoint.PATH` reaches into the endpoint profile the file names:
    /// `--set endpoint.limits.OTPM.limit=50000`.
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// Run only these experiments of the file (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// FILE (a name with an extension): write the report there (atomically)
    /// instead of stdout; only a regular file is written, a symbolic link is
    /// written through. DIR (no extension, or ending in /): write the result
    /// tables there (runs.parquet, runs.csv, points.parquet, points.csv,
    /// manifest.json; the report still goes to stdout).
    #[arg(long, value_name = "FILE|DIR")]
    pub out: Option<PathBuf>,
    /// Replace the --out file, or the --out directory of qsim's files, if it exists.
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub budget: BudgetFlags,
    #[command(flatten)]
    pub plots: crate::plot::PlotOpts,
}

// parsed once per process: the size difference between variants is irrelevant
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Run an experiment file and report its metrics.
    Run {
        /// The experiment file (TOML); `builtin:NAME` for an embedded one.
        #[arg(default_value = "builtin:experiments/fmapi-pacing.toml")]
        file: PathBuf,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Run an experiment file over a grid of overrides (e.g. workers × max_tokens).
    Sweep {
        /// The experiment file (TOML).
        file: PathBuf,
        /// A dimension of the grid, for any scalar path: a list
        /// `--vary policy=article,full-jitter`, a geometric range
        /// `--vary workers=8..128:x2` (8,16,..,128) or an arithmetic one
        /// `--vary workers=8..64:+8`. Repeat for a product (first outermost).
        #[arg(
            long = "vary",
            value_name = "PATH=V1,V2,..|PATH=A..B:xK|PATH=A..B:+K",
            required = true
        )]
        vary: Vec<String>,
        /// Threads running the grid's points × seeds (default: all cores).
        /// The output is the same whatever the number.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
        threads: Option<u16>,
        /// Run only shard I of N (counted from 0): the grid points whose
        /// index is I modulo N. Needs `--out DIR` or `--format csv`; `qsim
        /// merge` joins the shards' directories (or CSV files) into the
        /// single-machine result.
        #[arg(long, value_name = "I/N", allow_hyphen_values = true)]
        shard: Option<String>,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Join the shards of `qsim sweep --shard I/N`: their `--out DIR`
    /// directories into the directory a single-machine run writes (needs
    /// `--out DIR`), or their `--format csv` files into the single-machine CSV.
    Merge {
        /// The shards' directories or files, in any order.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The merged directory (a name without an extension), or the file
        /// for merged CSV (atomically; default stdout).
        #[arg(long, value_name = "DIR|FILE")]
        out: Option<PathBuf>,
        /// Replace the --out file, or the --out directory of qsim's files, if it exists.
        #[arg(long)]
        force: bool,
    },
    /// Plan a shared deployment: reservations, findings, and the six
    /// scenarios of the shared-deployment article simulated through the
    /// admission limiter (no files needed).
    Plan {
        #[command(flatten)]
        args: flags::PlanFlags,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// FILE (a name with an extension): the report, instead of stdout.
        /// DIR (no extension, or ending in /): the result tables and
        /// manifest.json (the report still goes to stdout).
        #[arg(long, value_name = "FILE|DIR")]
        out: Option<PathBuf>,
        /// Replace the --out file, or the --out directory of qsim's files, if it exists.
        #[arg(long)]
        force: bool,
        #[command(flatten)]
        budget: BudgetFlags,
        /// Also write the sized limiter as a `qsim proxy` config to this file
        /// (plan, then enforce, with one schema).
        #[arg(long, value_name = "FILE")]
        emit_proxy_config: Option<PathBuf>,
        #[command(flatten)]
        plots: crate::plot::PlotOpts,
    },
    /// Search a hosted experiment's client knobs (workers, max_tokens, retry
    /// policy and its parameters, the AIMD window) for the best configuration
    /// under constraints; prints the winner, runner-ups, the Pareto front
    /// (elapsed vs p95) and the evidence.
    Recommend {
        #[command(flatten)]
        args: crate::commands::recommend::RecommendArgs,
    },
    /// Fleets of GPU server pools: run a fleet file (pools, routing, prefix
    /// caches; per-pool percentiles and cost), or find the cheapest fleet
    /// for a workload and P99 targets (candidate GPUs, one pool or two split
    /// by length; what-if rates, router comparison).
    Fleet {
        #[command(flatten)]
        args: crate::commands::fleet::FleetArgs,
    },
    /// One batch against several deployment options (hosted pay-per-token,
    /// provisioned units, fixed or autoscaled replicas): completion time,
    /// failures, 429s, p95s and cost of each, and the cheapest finishing
    /// within --within with no failed row.
    Options {
        #[command(flatten)]
        args: crate::commands::options::OptionsArgs,
    },
    /// The BLIS sim-to-real accuracy benchmark: the study's 38 real vLLM
    /// experiments predicted from public model and GPU figures, errors
    /// beside the published simulators'.
    Sim2real {
        #[command(flatten)]
        args: crate::commands::sim2real::Sim2realArgs,
    },
    /// Enforce a plan in front of a real endpoint: an HTTP proxy running the
    /// same admission limiter (OpenAI and Databricks serving-endpoints routes).
    Proxy {
        #[command(flatten)]
        args: crate::commands::proxy::ProxyArgs,
    },
    /// Answer OpenAI / serving-endpoints requests from a profile in real
    /// time: a hosted profile's limits, 429s and latency, or a server
    /// profile's continuous batching (`--time-scale` runs it faster).
    Serve {
        #[command(flatten)]
        args: crate::commands::serve::ServeArgs,
    },
    /// Play a shared-deployment scenario against a real endpoint (e.g. a
    /// `qsim proxy`) and report it in the plan's records, optionally beside
    /// the plan's prediction.
    Load {
        #[command(flatten)]
        args: crate::commands::load::LoadArgs,
    },
    /// Replay a `qsim proxy` decision log through the limiter under a
    /// proposed policy: per consumer and minute, admitted / rejected /
    /// waited beside what was observed.
    Whatif {
        #[command(flatten)]
        args: crate::commands::whatif::WhatifArgs,
    },
    /// Request traces (Azure, BurstGPT, Mooncake, a proxy's decision log, a
    /// CSV with named columns): `qsim trace stats FILE` (rates, burstiness,
    /// lengths, a fitted workload), `qsim trace plan FILE` (replicas for a trace).
    Trace {
        #[command(subcommand)]
        cmd: crate::commands::trace::TraceCmd,
    },
    /// Run a hosted experiment's client side for real against an endpoint
    /// (the same caller state machines as the simulation), log every HTTP
    /// attempt and write the summary records `qsim run` writes.
    Replay {
        #[command(flatten)]
        args: crate::commands::replay::ReplayArgs,
    },
    /// Prediction vs observation per metric: a simulation's records (`qsim
    /// run --format csv`) against one or more observations (`qsim replay`'s
    /// summary.csv; several are pooled and their median compared), as a
    /// table, JSON, or a plot (`--plot DIR`, `--html FILE`).
    Compare {
        #[command(flatten)]
        args: crate::commands::compare::CompareArgs,
    },
    /// Fit a profile to observations: `calibrate hosted` (a replay's attempt
    /// log), `calibrate server` (vLLM benchmark results), `calibrate bench`
    /// (measure a server as vLLM's benchmark_serving does).
    #[command(subcommand)]
    Calibrate(crate::commands::calibrate::CalibrateCmd),
    /// The files embedded in the binary (every shipped experiment, model,
    /// measured data set and trace), usable anywhere as `builtin:PATH`;
    /// `qsim examples PATH` prints one to copy and edit.
    Examples {
        #[command(flatten)]
        args: crate::commands::examples::ExamplesArgs,
    },
}

/// Refuse a bad `--out` (file or directory) before any simulation runs.
fn check_out(out: Option<&Path>, force: bool) -> Result<(), CliError> {
    match out {
        Some(p) if output::is_dir_target(p) => crate::results::check(p, force),
        Some(p) => {
            output::check_target(p, force)?;
            Ok(())
        }
        None => Ok(()),
    }
}

/// The `--out` path if it names a results directory ([`output::is_dir_target`]).
fn out_dir(out: Option<&Path>) -> Option<&Path> {
    out.filter(|p| output::is_dir_target(p))
}

/// The `--out` path if it names a report file.
fn out_file(out: Option<&Path>) -> Option<&Path> {
    out.filter(|p| !output::is_dir_target(p))
}

/// Run a command; `run`, `sweep` and `plan` under the run-time work budget
/// ([`qsim_sim::work`]) of their `--max-requests`.
pub fn run(cli: Cli) -> Result<(), CliError> {
    let max = match &cli.cmd {
        Cmd::Plan { budget, .. } => Some(budget.max_requests),
        Cmd::Run { opts, .. } | Cmd::Sweep { opts, .. } => Some(opts.budget.max_requests),
        Cmd::Recommend { args } => Some(args.budget.max_requests),
        Cmd::Options { args } => Some(args.budget.max_requests),
        Cmd::Fleet { args } => Some(args.max_requests),
        Cmd::Trace { cmd } => Some(cmd.budget().max_requests),
        _ => None,
    };
    let Some(max) = max else {
        return dispatch(cli);
    };
    let source = match &cli.cmd {
        Cmd::Run { file, .. } | Cmd::Sweep { file, .. } => file.display().to_string(),
        Cmd::Recommend { args } => args.file.display().to_string(),
        Cmd::Options { args } => args.file.display().to_string(),
        Cmd::Fleet { args } => args.source(),
        Cmd::Trace { cmd } => cmd.source(),
        _ => "qsim plan".to_string(),
    };
    let (r, meter) = qsim_sim::work::scope(max, || dispatch(cli));
    // every command checks before it writes; this is the backstop
    if meter.over() {
        return Err(qsim_sim::work::exceeded(&source, &meter).into());
    }
    r
}

fn dispatch(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Plan {
            args,
            format,
            out,
            force,
            budget,
            emit_proxy_config,
            plots,
        } => {
            let (args, budget) = (args.spec(), budget.budget());
            check_out(out.as_deref(), force)?;
            let dir = out_dir(out.as_deref());
            let targets = plots.targets(force);
            targets.check()?;
            if let Some(p) = &emit_proxy_config {
                output::check_target_as("--emit-proxy-config", p, force)?;
                let (f, _) = qsim_sim::plan::build(&args).map_err(|e| name_fields(e, None, &[]))?;
                let text = qsim_api::proxy::emit_config(&f.limiter, &f.source);
                output::write_file_as("--emit-proxy-config", p, &text, force)?;
            }
            let (text, records) = if format == Format::Csv {
                let (f, model) =
                    qsim_sim::plan::build(&args).map_err(|e| name_fields(e, None, &[]))?;
                qsim_sim::plan::budget::simulate(&f, &model)
                    .and_then(|c| {
                        c.times(args.seeds as f64, "seeds")
                            .check(&f.source, &budget)
                    })
                    .map_err(|e| name_fields(e, None, &[]))?;
                let mut records = report::records::Records::default();
                for k in 0..args.seeds {
                    let seed = args.seed.wrapping_add(k);
                    let runs = qsim_sim::plan::simulate(&f, &model, seed, true);
                    qsim_sim::plan::seeds::records(&mut records, seed, &runs);
                }
                qsim_sim::work::check(&f.source)?;
                if targets.wanted() {
                    crate::plot::plan_outputs(&targets, &f, &records, args.seed, args.seeds, None)?;
                }
                let text = report::records::to_csv(&[PointRecords {
                    params: vec![],
                    records: records.clone(),
                }]);
                (text, records)
            } else {
                let r = qsim_sim::plan::run::run_cli_full(&args, format == Format::Json, &budget)
                    .map_err(|e| plan_err(e, None, &[]))?;
                if targets.wanted() {
                    let text = (format == Format::Table).then_some(r.text.as_str());
                    crate::plot::plan_outputs(
                        &targets, &r.file, &r.records, args.seed, args.seeds, text,
                    )?;
                }
                (r.text, r.records)
            };
            if let Some(d) = dir {
                let t = crate::results::tables(&[], &[(0, &records)])?;
                let m = crate::results::manifest(&[], args.seed, args.seeds, None);
                crate::results::write(d, force, &t, &m)?;
            }
            emit(&text, out_file(out.as_deref()), force)
        }
        Cmd::Recommend { args } => crate::commands::recommend::run_cli(&args),
        Cmd::Options { args } => crate::commands::options::run_cli(&args),
        Cmd::Fleet { args } => crate::commands::fleet::run_cli(&args),
        Cmd::Sim2real { args } => crate::commands::sim2real::run_cli(&args),
        Cmd::Proxy { args } => {
            let spec = args.spec();
            let cfg = qsim_api::proxy::load_checked(&spec)
                .map_err(|e| name_fields(e, Some(&spec.config), &[]))?;
            let file = spec.config.display().to_string();
            let proxy = qsim_live::Proxy::new(cfg)
                .map_err(|r| CliError::Config(ConfigError::new(file, "deployment", r)))?
                .with_reload(Box::new(move || qsim_api::proxy::reload(&spec)))
                .with_log_encoder(qsim_api::whatif::encoder());
            proxy.run().map_err(CliError::Io)
        }
        Cmd::Serve { args } => crate::commands::serve::run(&args),
        Cmd::Whatif { args } => crate::commands::whatif::run_cli(&args),
        Cmd::Trace { cmd } => crate::commands::trace::run_cli(&cmd),
        Cmd::Load { args } => {
            check_out(args.out.as_deref(), args.force)?;
            let text = crate::commands::load::run_cli(&args)?;
            emit(&text, args.out.as_deref(), args.force)
        }
        Cmd::Replay { args } => crate::commands::replay::run_cli(args),
        Cmd::Compare { args } => crate::commands::compare::run_cli(args),
        Cmd::Calibrate(cmd) => crate::commands::calibrate::run_cli(cmd),
        Cmd::Examples { args } => crate::commands::examples::run(args),
        Cmd::Run { file, opts } => {
            let RunOpts {
                seed,
                seeds,
                format,
                sets,
                only,
                out,
                force,
                budget,
                plots,
            } = opts;
            check_out(out.as_deref(), force)?;
            let targets = plots.targets(force);
            targets.check()?;
            let fname = file.display().to_string();
            let r = qsim_sim::run::run(&qsim_sim::run::RunSpec {
                file: file.clone(),
                sets: sets.clone(),
                only,
                seed,
                seeds,
                format: format.into(),
                budget: budget.budget(),
                extras: targets.wanted(),
            })
            .map_err(|e| plan_err(e, Some(&file), &sets))?;
            if targets.wanted() {
                let t = (format == Format::Table).then_some(r.text.as_str());
                match (&r.plan, &r.records, &r.extras) {
                    (Some(f), Some(records), _) => {
                        crate::plot::plan_outputs(&targets, f, records, seed, seeds, t)?
                    }
                    (None, Some(records), Some(x)) => crate::plot::run_outputs(
                        &targets, &r.file, &fname, records, x, seed, seeds, t,
                    )?,
                    _ => {}
                }
            }
            if let (Some(d), Some(records)) = (out_dir(out.as_deref()), &r.records) {
                let t = crate::results::tables(&[], &[(0, records)])?;
                let m = crate::results::manifest(&[], seed, seeds, None);
                crate::results::write(d, force, &t, &m)?;
            }
            emit(&r.text, out_file(out.as_deref()), force)
        }
        Cmd::Merge { files, out, force } => {
            let dirs = files.iter().filter(|f| f.is_dir()).count();
            if dirs > 0 {
                if let Some(f) = files.iter().find(|f| !f.is_dir()) {
                    return Err(CliError::Config(ConfigError::new(
                        f.display().to_string(),
                        "",
                        "not a directory: give either the shards' --out directories or their CSV files",
                    )));
                }
                return match out_dir(out.as_deref()) {
                    Some(d) => crate::results::merge(&files, d, force),
                    None => Err(CliError::Config(ConfigError::new(
                        "qsim merge",
                        "",
                        "merging output directories writes a directory: add --out DIR (a name without an extension)",
                    ))),
                };
            }
            if let Some(d) = out_dir(out.as_deref()) {
                return Err(CliError::Config(ConfigError::new(
                    format!("--out {}", d.display()),
                    "",
                    "merging CSV files writes a CSV file: give --out a file name with an extension (e.g. all.csv)",
                )));
            }
            check_out(out.as_deref(), force)?;
            let mut texts = Vec::with_capacity(files.len());
            for f in &files {
                let name = f.display().to_string();
                let text = qsim_sim::input::read_text(f, qsim_sim::input::Kind::Data)
                    .map_err(|e| CliError::Config(ConfigError::new(&name, "", e)))?;
                texts.push((name, text));
            }
            let text = qsim_sim::sweep::merge(&texts)?;
            emit(&text, out.as_deref(), force)
        }
        Cmd::Sweep {
            file,
            vary,
            threads,
            shard,
            opts,
        } => {
            let RunOpts {
                seed,
                seeds,
                format,
                sets,
                only,
                out,
                force,
                budget,
                plots,
            } = opts;
            let targets = plots.targets(force);
            let dir = out_dir(out.as_deref());
            if let (Some(_), true) = (&shard, targets.wanted()) {
                return Err(CliError::Config(ConfigError::new(
                    "--shard",
                    "",
                    "--plot and --html need the whole grid: run without --shard",
                )));
            }
            check_out(out.as_deref(), force)?;
            targets.check()?;
            let fname = file.display().to_string();
            let r = qsim_sim::run::sweep(&qsim_sim::run::SweepSpec {
                file,
                vary,
                sets,
                only,
                seed,
                seeds,
                threads: threads.map(usize::from),
                shard,
                format: format.into(),
                budget: budget.budget(),
                tidy: format == Format::Csv || dir.is_some(),
                rows: targets.wanted(),
            })?;
            if let Some(d) = dir {
                let recs: Vec<(usize, &report::records::Records)> =
                    r.tidy.iter().map(|(p, t)| (*p, &t.records)).collect();
                let t = crate::results::tables(&r.dims, &recs)?;
                let m = crate::results::manifest(&r.dims, seed, seeds, r.shard);
                crate::results::write(d, force, &t, &m)?;
            }
            if let (true, Some(ef)) = (targets.wanted(), &r.first) {
                let t = (format == Format::Table).then_some(r.text.as_str());
                crate::plot::sweep_outputs(
                    &targets, ef, &fname, &r.dims, &r.points, r.cols, seed, seeds, t,
                )?;
            }
            emit(&r.text, out_file(out.as_deref()), force)
        }
    }
}
