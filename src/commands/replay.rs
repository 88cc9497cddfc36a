//! `qsim replay`: its flags, mapped to [`qsim_api::replay::Spec`], and the
//! files it writes (attempts.csv, rows.csv, each also as Parquet, and
//! summary.csv).

use crate::cli::common::{duration_arg, emit, CliError, Format};
use crate::output;
use qsim_api::replay::{Spec, Table, Wire};
use qsim_sim::config::ConfigError;
use std::path::{Path, PathBuf};

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum WireArg {
    /// `POST {target}/chat/completions`, `model` in the body (OpenAI, vLLM,
    /// llmock, Databricks' `https://WORKSPACE/serving-endpoints`).
    Openai,
    /// `POST {target}/{model}/invocations` (Databricks serving endpoints).
    Databricks,
}

#[derive(clap::Args, Debug)]
pub struct ReplayArgs {
    /// The experiment file (a hosted-API experiment, `kind = "hosted"`).
    pub file: PathBuf,
    /// The endpoint's base URL, as an OpenAI SDK's `base_url`
    /// (`http://127.0.0.1:8000/v1`, `https://WORKSPACE/serving-endpoints`);
    /// a bare `http://host:port` gets `/v1`.
    #[arg(long)]
    pub target: String,
    /// The model name sent (default: the experiment's endpoint profile name).
    #[arg(long)]
    pub model: Option<String>,
    /// The wire format.
    #[arg(long, value_enum, default_value_t = WireArg::Openai)]
    pub wire: WireArg,
    /// Ask for SSE streams (and record TTFT).
    #[arg(long)]
    pub stream: bool,
    /// The environment variable holding the bearer token (never printed).
    #[arg(long, value_name = "VAR")]
    pub token_env: Option<String>,
    /// Read the prompts from this CSV or JSONL file (its first `rows` rows)
    /// instead of generating them as the experiment does.
    #[arg(long, value_name = "FILE")]
    pub rows: Option<PathBuf>,
    /// The column (CSV header or JSONL key) holding the prompt.
    #[arg(long, value_name = "COL", default_value = "prompt")]
    pub prompt_column: String,
    /// Write attempts.csv, rows.csv (each also as .parquet) and summary.csv into this directory
    /// (created if missing; existing files are kept unless --force).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace existing files in --out.
    #[arg(long)]
    pub force: bool,
    /// Model seconds per real second: every client-side duration (backoff,
    /// SDK delays, timeouts, the cool-down) is divided by it, every observed
    /// duration multiplied (for time-scaled endpoints such as `qsim serve
    /// --time-scale`).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Stop the whole replay after this long (model time; `s` or `ms`).
    #[arg(long, default_value = "3600s", value_parser = duration_arg)]
    pub timeout: qsim_sim::time::Nanos,
    /// Longest one HTTP attempt may take (model time; the OpenAI SDK's 600 s).
    #[arg(long, default_value = "600s", value_parser = duration_arg)]
    pub attempt_timeout: qsim_sim::time::Nanos,
    /// Spend the printed budget against a target that is not on this machine.
    #[arg(long)]
    pub yes: bool,
    /// Seed of the client's random draws (jitter) and the generated rows.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output format of the report on stdout.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Override a scalar in the file (as `qsim run --set`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// Replay only these experiments (comma-separated names).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
}

/// Write a results table to `path` (atomically, as `--out` files are, by
/// [`output::write_file`]): CSV with a header row, empty cells for missing
/// values, and the same table as Parquet beside it, both encoded by
/// qsim-results (the one CSV and Parquet path), written next to the
/// target and renamed: never a half file.
pub fn write_table(path: &Path, t: &Table, force: bool) -> Result<(), CliError> {
    let bad = |p: &Path, e: String| CliError::Io(format!("qsim: {}: {e}", p.display()));
    let enc = qsim_results::encode_table(t).map_err(|e| bad(path, e.reason))?;
    let text = String::from_utf8(enc.csv).map_err(|e| bad(path, e.to_string()))?;
    output::write_file(path, &text, force)?;
    let pq = path.with_extension("parquet");
    let tmp = pq.with_extension("parquet.tmp-qsim");
    std::fs::write(&tmp, &enc.parquet).map_err(|e| bad(&pq, e.to_string()))?;
    std::fs::rename(&tmp, &pq).map_err(|e| bad(&pq, e.to_string()))?;
    Ok(())
}

pub fn run_cli(a: ReplayArgs) -> Result<(), CliError> {
    let out_files = match &a.out {
        None => None,
        Some(dir) => {
            if dir.exists() && !dir.is_dir() {
                return Err(ConfigError::new(
                    format!("--out {}", dir.display()),
                    "",
                    "not a directory",
                )
                .into());
            }
            let files: Vec<PathBuf> = ["attempts.csv", "rows.csv", "summary.csv"]
                .iter()
                .map(|f| dir.join(f))
                .collect();
            if dir.is_dir() {
                for f in &files {
                    output::check_target(f, a.force)?;
                }
                // the Parquet twins of attempts.csv and rows.csv
                for f in &files[..2] {
                    output::check_target(&f.with_extension("parquet"), a.force)?;
                }
            }
            Some((dir.clone(), files))
        }
    };
    let spec = Spec {
        file: a.file.clone(),
        target: a.target.clone(),
        model: a.model.clone(),
        wire: match a.wire {
            WireArg::Openai => Wire::OpenAi,
            WireArg::Databricks => Wire::Databricks,
        },
        stream: a.stream,
        token_env: a.token_env.clone(),
        rows: a.rows.clone(),
        prompt_column: a.prompt_column.clone(),
        time_scale: a.time_scale,
        timeout: a.timeout,
        attempt_timeout: a.attempt_timeout,
        yes: a.yes,
        seed: a.seed,
        format: a.format.into(),
        sets: a.sets.clone(),
        only: a.only.clone(),
    };
    if let Some((dir, _)) = &out_files {
        std::fs::create_dir_all(dir).map_err(|e| {
            CliError::Config(ConfigError::new(
                format!("--out {}", dir.display()),
                "",
                e.to_string(),
            ))
        })?;
    }
    let r = qsim_api::replay::run(&spec, &mut |m| eprint!("{m}"))?;
    if let Some((_, files)) = &out_files {
        write_table(&files[0], &r.attempts_table(), a.force)?;
        write_table(&files[1], &r.rows_table(), a.force)?;
        output::write_file(&files[2], &r.summary_csv(), a.force)?;
    }
    emit(&r.text, None, false)?;
    match r.unreached() {
        Some(m) => Err(CliError::Io(m)),
        None => Ok(()),
    }
}
