//! The command line: `qsim run`, and the shared plumbing (output, exit codes).

use crate::config::ConfigError;
use crate::experiment::{self, ExperimentFile};
use crate::report;
use clap::{Parser, Subcommand, ValueEnum};
use std::io::Write;
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

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// Options shared by `run` and `sweep`.
#[derive(clap::Args, Debug)]
pub struct RunOpts {
    /// Seed of the first run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Number of seeds (seed, seed+1, …); reports median and 90 % interval.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub seeds: u64,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Override a scalar in the file: `--set workers=16 --set experiment.1.retry.max_attempts=5`
    /// (for sweep: fixed overrides applied before the grid's).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// Run only these experiments of the file (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Write the report to this file (atomically) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
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
        /// A dimension of the grid: `--vary workers=8,16,32,64,128`. Repeat for a product.
        #[arg(long = "vary", value_name = "PATH=V1,V2,..", required = true)]
        vary: Vec<String>,
        #[command(flatten)]
        opts: RunOpts,
    },
    /// Plan a shared deployment: reservations, findings, and the six seed
    /// scenarios simulated through the admission limiter (no files needed).
    Plan {
        #[command(flatten)]
        args: crate::plan::PlanArgs,
        #[arg(long, value_enum, default_value_t = Format::Table)]
        format: Format,
        /// Write the report to this file (atomically) instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// An error the CLI reports: configuration/usage problems exit 2, anything
/// else 1.
#[derive(Debug)]
pub enum CliError {
    Config(ConfigError),
    Io(String),
}

impl From<ConfigError> for CliError {
    fn from(e: ConfigError) -> Self {
        CliError::Config(e)
    }
}

impl CliError {
    pub fn exit_code(&self) -> i32 {
        match self {
            CliError::Config(_) => 2,
            CliError::Io(_) => 1,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Config(e) => write!(f, "{e}"),
            CliError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Write `text` to `out` atomically (temp file + rename), or to stdout.
pub fn emit(text: &str, out: Option<&Path>) -> Result<(), CliError> {
    match out {
        None => {
            let mut so = std::io::stdout().lock();
            // a closed pipe is not an error worth a panic
            let _ = so.write_all(text.as_bytes());
            Ok(())
        }
        Some(p) => {
            let dir = p
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .unwrap_or(Path::new("."));
            if !dir.is_dir() {
                return Err(CliError::Config(ConfigError::new(
                    "--out",
                    "",
                    format!("directory {} does not exist", dir.display()),
                )));
            }
            let tmp = dir.join(format!(
                ".{}.tmp-{}",
                p.file_name().and_then(|s| s.to_str()).unwrap_or("qsim-out"),
                std::process::id()
            ));
            std::fs::write(&tmp, text)
                .and_then(|_| std::fs::rename(&tmp, p))
                .map_err(|e| {
                    let _ = std::fs::remove_file(&tmp);
                    CliError::Io(format!("--out {}: {e}", p.display()))
                })
        }
    }
}

pub fn run(cli: Cli) -> Result<(), CliError> {
    match cli.cmd {
        Cmd::Plan { args, format, out } => {
            let text = crate::plan::run_cli(&args, format == Format::Json)?;
            emit(&text, out.as_deref())
        }
        Cmd::Run {
            file,
            opts:
                RunOpts {
                    seed,
                    seeds,
                    format,
                    sets,
                    only,
                    out,
                },
        } => {
            let ef = experiment::load(&file, &sets)?;
            let fname = file.display().to_string();
            let text = match ef {
                ExperimentFile::Hosted(mut suite) => {
                    suite.retain_only(&only)?;
                    let aggs = run_hosted(&suite, seed, seeds);
                    match format {
                        Format::Table => report::hosted::render_table(&suite, &fname, seed, &aggs),
                        Format::Json => report::json_text(&report::hosted::render_json(
                            &suite, &fname, seed, &aggs,
                        )),
                    }
                }
                ExperimentFile::Server(mut suite) => {
                    suite.retain_only(&only)?;
                    report::server::run_and_render(
                        &suite,
                        &fname,
                        seed,
                        seeds,
                        format == Format::Json,
                    )
                }
                ExperimentFile::Shared(path) => {
                    if !only.is_empty() || seeds > 1 {
                        return Err(CliError::Config(ConfigError::new(
                            &fname,
                            "kind",
                            "--only and --seeds are not supported for kind = \"shared\"; it runs as qsim plan --scenarios FILE",
                        )));
                    }
                    let args = crate::plan::PlanArgs {
                        scenarios: Some(path),
                        seed,
                        ..Default::default()
                    };
                    crate::plan::run_cli(&args, format == Format::Json)?
                }
            };
            emit(&text, out.as_deref())
        }
        Cmd::Sweep {
            file,
            vary,
            opts:
                RunOpts {
                    seed,
                    seeds,
                    format,
                    sets,
                    only,
                    out,
                },
        } => {
            let dims = parse_vary(&vary)?;
            let fname = file.display().to_string();
            let mut points = Vec::new();
            let mut cols: &[&str] = report::hosted::SWEEP_COLS;
            for combo in grid(&dims) {
                let mut all = sets.clone();
                all.extend(combo.iter().map(|(k, v)| format!("{k}={v}")));
                let rows = match experiment::load(&file, &all)? {
                    ExperimentFile::Hosted(mut suite) => {
                        suite.retain_only(&only)?;
                        report::hosted::sweep_rows(&run_hosted(&suite, seed, seeds))
                    }
                    ExperimentFile::Server(mut suite) => {
                        suite.retain_only(&only)?;
                        cols = report::server::SWEEP_COLS;
                        report::server::sweep_rows(&report::server::run(&suite, seed, seeds))
                    }
                    ExperimentFile::Shared(_) => {
                        return Err(CliError::Config(ConfigError::new(
                            &fname,
                            "kind",
                            "qsim sweep runs hosted and server files; for a shared deployment use qsim plan",
                        )))
                    }
                };
                points.push((combo, rows));
            }
            let text = match format {
                Format::Table => report::sweep::render_table(&fname, seed, seeds, &points, cols),
                Format::Json => {
                    report::json_text(&report::sweep::render_json(&fname, seed, seeds, &points))
                }
            };
            emit(&text, out.as_deref())
        }
    }
}

/// Run a hosted suite over `seeds` seeds from `seed` and aggregate.
pub fn run_hosted(
    suite: &experiment::HostedSuite,
    seed: u64,
    seeds: u64,
) -> Vec<report::hosted::Aggregate> {
    let runs: Vec<_> = (0..seeds)
        .map(|k| experiment::hosted::run_suite(suite, seed.wrapping_add(k)))
        .collect();
    report::hosted::aggregate(&runs)
}

/// `--vary path=v1,v2` → (path, [v1, v2]).
fn parse_vary(vary: &[String]) -> Result<Vec<(String, Vec<String>)>, CliError> {
    vary.iter()
        .map(|v| {
            let bad = |r: &str| {
                CliError::Config(ConfigError::new(format!("--vary {v}"), "", r.to_string()))
            };
            let (k, vals) = v
                .split_once('=')
                .ok_or_else(|| bad("expected PATH=V1,V2,.."))?;
            let vals: Vec<String> = vals.split(',').map(|x| x.trim().to_string()).collect();
            if k.trim().is_empty() || vals.iter().any(|x| x.is_empty()) {
                return Err(bad("empty path or value"));
            }
            Ok((k.trim().to_string(), vals))
        })
        .collect()
}

/// The Cartesian product of the dimensions, first dimension outermost.
fn grid(dims: &[(String, Vec<String>)]) -> Vec<Vec<(String, String)>> {
    let mut out: Vec<Vec<(String, String)>> = vec![vec![]];
    for (k, vals) in dims {
        out = out
            .into_iter()
            .flat_map(|p| {
                vals.iter().map(move |v| {
                    let mut q = p.clone();
                    q.push((k.clone(), v.clone()));
                    q
                })
            })
            .collect();
    }
    out
}
