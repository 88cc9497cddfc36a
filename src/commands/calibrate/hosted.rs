//! `qsim calibrate hosted`: the arguments of
//! [`qsim_sim::calibrate::hosted`] (the fit) and where its profile goes.

use crate::cli::common::{CliError, Format};
use qsim_sim::calibrate::hosted::{calibrate, Spec, DEFAULT_BOOTSTRAP};
use qsim_sim::config::ConfigError;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct HostedArgs {
    /// The replay's attempt log (`qsim replay --out DIR` writes DIR/attempts.csv;
    /// replay with `--stream` so TTFT is recorded).
    #[arg(long, value_name = "FILE")]
    pub log: PathBuf,
    /// The max_tokens the replay sent with every request (the experiment's).
    #[arg(long, value_name = "N")]
    pub max_tokens: u64,
    /// Write the fitted profile here (refused if it exists, unless --force).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub force: bool,
    /// The fitted profile's name.
    #[arg(long, default_value = "calibrated")]
    pub name: String,
    /// How far (model seconds, either way) the endpoint's clock may be from
    /// the log's start and end times (transport, scheduling). The bucket is
    /// fitted at lag 0 (the estimate) and at ±lag: the interval covers all three.
    #[arg(long, default_value_t = 0.1)]
    pub lag: f64,
    /// Bootstrap replicates for the latency intervals.
    #[arg(long, default_value_t = DEFAULT_BOOTSTRAP)]
    pub bootstrap: u32,
    /// Seed of the bootstrap's resampling.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Report format on stdout (table or json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

pub fn run_cli(a: HostedArgs) -> Result<(), CliError> {
    let log = a.log.display().to_string();
    if let Some(out) = &a.out {
        if out.exists() && !a.force {
            return Err(ConfigError::new(
                out.display().to_string(),
                "--out",
                "exists (use --force to replace it)",
            )
            .into());
        }
    }
    let f = calibrate(&Spec {
        log: a.log.clone(),
        max_tokens: a.max_tokens,
        lag: a.lag,
        bootstrap: a.bootstrap,
        seed: a.seed,
    })?;
    let toml = f.profile_toml(&a.name, &log)?;
    if let Some(out) = &a.out {
        crate::output::write_file_as("--out", out, &toml, a.force)?;
    }
    match a.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&f.json()).unwrap_or_default()
        ),
        _ => print!("{}", f.table(&log)),
    }
    Ok(())
}
