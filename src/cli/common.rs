//! The plumbing every command shares, a leaf of the crate's module graph
//! (it imports no command): errors and their exit codes, the output
//! format, `--out` writing, clap's usage errors as one line, experiment
//! loading with named field paths, and the duration flag's parser.

use crate::output::{self, OutputError};
use clap::ValueEnum;
use qsim_sim::config::ConfigError;
use qsim_sim::experiment::{self, ExperimentFile};
use qsim_sim::plan::PlanError;
use std::path::Path;

#[derive(Copy, Clone, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
    /// The tidy records, one per (sweep point, seed, subject, metric): CSV
    /// for table tools (run and sweep).
    Csv,
}

impl From<Format> for qsim_sim::report::Format {
    fn from(f: Format) -> Self {
        match f {
            Format::Table => qsim_sim::report::Format::Table,
            Format::Json => qsim_sim::report::Format::Json,
            Format::Csv => qsim_sim::report::Format::Csv,
        }
    }
}

/// An error the CLI reports: configuration/usage problems exit 2, anything
/// else 1.
#[derive(Debug)]
pub enum CliError {
    Config(ConfigError),
    Io(String),
    /// A target that cannot be met (`qsim plan --need/--e2e-p95`): exit 1.
    Unmet(String),
    /// Writing the report failed: exit 2 for a bad `--out`, else 1.
    Output(OutputError),
}

impl From<OutputError> for CliError {
    fn from(e: OutputError) -> Self {
        CliError::Output(e)
    }
}

impl From<qsim_api::Error> for CliError {
    fn from(e: qsim_api::Error) -> Self {
        match e {
            qsim_api::Error::Config(c) => CliError::Config(c),
            qsim_api::Error::Io(m) => CliError::Io(m),
            qsim_api::Error::Unmet(m) => CliError::Unmet(m),
        }
    }
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
            CliError::Io(_) | CliError::Unmet(_) => 1,
            CliError::Output(e) => e.exit_code(),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Config(e) => write!(f, "{e}"),
            CliError::Io(e) | CliError::Unmet(e) => write!(f, "{e}"),
            CliError::Output(e) => write!(f, "{e}"),
        }
    }
}

/// A plan's error as the CLI reports it, field paths named after `file`.
pub fn plan_err(e: PlanError, file: Option<&Path>, sets: &[String]) -> CliError {
    match e {
        PlanError::Config(c) => CliError::Config(name_fields(c, file, sets)),
        PlanError::Unmet(m) => CliError::Unmet(m),
    }
}

/// Write `text` to `out` (see [`crate::output`] for the rules), or to stdout.
pub fn emit(text: &str, out: Option<&Path>, force: bool) -> Result<(), CliError> {
    Ok(output::emit(text, out, force)?)
}

/// A clap usage error as one line (without the usage block): exit 2.
pub fn usage_error_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let mut parts: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("For more information")
        })
        .map(|l| l.strip_prefix("error: ").unwrap_or(l).to_string())
        .collect();
    parts.push("try --help".into());
    parts.join("; ")
}

/// Load an experiment file for `run` and `sweep` ([`experiment::load_file`]).
pub fn load_experiment(file: &Path, sets: &[String]) -> Result<ExperimentFile, ConfigError> {
    experiment::load_file(file, sets)
}

/// Field paths named after `file` ([`qsim_sim::config::name_fields`]).
pub fn name_fields(e: ConfigError, file: Option<&Path>, sets: &[String]) -> ConfigError {
    qsim_sim::config::name_fields(e, file, sets)
}

/// Clap value parser of every duration flag (`--e2e-p95`, `--timeout`, ...):
/// [`qsim_sim::time::parse_duration`], the one duration parser (a number
/// with the unit `s` or `ms`, a bare number is seconds; the unit is
/// explained when wrong; never zero).
pub fn duration_arg(s: &str) -> Result<qsim_sim::time::Nanos, String> {
    qsim_sim::time::parse_duration(s)
}
