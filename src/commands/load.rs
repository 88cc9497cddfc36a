//! `qsim load`: its flags, mapped to [`qsim_api::load::Spec`].

use crate::cli::common::Format;
use std::path::PathBuf;

/// `qsim load` flags.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// The shared-deployment scenario file (kind = "shared");
    /// `builtin:experiments/shared-deployment.toml` for the embedded one.
    pub file: PathBuf,
    /// Base URL of the endpoint (a `qsim proxy`, or any OpenAI-compatible
    /// server), e.g. http://127.0.0.1:8080.
    #[arg(long)]
    pub target: String,
    /// The scenario to play (needed when the file has several).
    #[arg(long)]
    pub scenario: Option<String>,
    /// Compressed time: the scenario runs X times faster than real time (in
    /// (0, 100]; virtual time = real elapsed × X). Run the proxy with the same
    /// `--time-scale`: its limiter's clock and retry hints are then in the same time.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub time_scale: f64,
    /// At most this many HTTP attempts in all.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_requests: u64,
    /// Real-time limit of one attempt; rows still running this long after
    /// the scenario's end are abandoned (counted as unanswered).
    #[arg(long, default_value = "60s", value_parser = crate::cli::common::duration_arg)]
    pub timeout: qsim_sim::time::Nanos,
    /// Output format: table, json, or csv (the tidy records).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also simulate the scenario (`qsim plan`'s driver, same seed) and show
    /// the plan's admitted counts per consumer per minute beside the observed.
    #[arg(long)]
    pub compare_with_sim: bool,
    /// With --compare-with-sim: also simulate this many seeds (seed, seed+1,
    /// …) and show the plan's median and 90 % interval of each consumer's
    /// admitted count per saturated minute (which consumer wins a unit of the
    /// shared pool is a race: one seed is one draw of it).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub sim_seeds: u64,
    /// Seed of the scenario's random streams (arrivals, lengths, jitter).
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub seed: u64,
    /// A consumer's key, NAME=KEY (repeatable); default `key-NAME`, as
    /// `qsim plan --emit-proxy-config` writes them.
    #[arg(long = "key", value_name = "NAME=KEY")]
    pub keys: Vec<String>,
    /// Send the key in this header instead of `Authorization: Bearer`.
    #[arg(long)]
    pub consumer_header: Option<String>,
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    pub path: String,
    /// The requests' `model` field.
    #[arg(long, default_value = "qsim-load")]
    pub model: String,
    /// Send each prompt as LO..HI token ids (`{"prompt": [ids…]}`, for
    /// `--path /v1/completions` of an engine such as llama.cpp's or vLLM's
    /// server) instead of a chat message: the engine then computes exactly
    /// the drawn input length, and each row's ids are its own seeded draw,
    /// so no prefix cache serves a prompt (as `qsim calibrate bench`).
    #[arg(long, value_name = "LO..HI")]
    pub token_ids: Option<String>,
    /// Worker threads of the load generator (default: one per core).
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// Write the report to this file (atomically) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the --out file if it exists.
    #[arg(long)]
    pub force: bool,
}

impl LoadArgs {
    pub fn spec(&self) -> qsim_api::load::Spec {
        qsim_api::load::Spec {
            file: self.file.clone(),
            target: self.target.clone(),
            scenario: self.scenario.clone(),
            time_scale: self.time_scale,
            max_requests: self.max_requests,
            timeout: self.timeout,
            format: self.format.into(),
            compare_with_sim: self.compare_with_sim,
            sim_seeds: self.sim_seeds,
            seed: self.seed,
            keys: self.keys.clone(),
            consumer_header: self.consumer_header.clone(),
            path: self.path.clone(),
            model: self.model.clone(),
            token_ids: self.token_ids.clone(),
            threads: self.threads,
            out: self.out.clone(),
            force: self.force,
        }
    }
}

pub fn run_cli(args: &LoadArgs) -> Result<String, crate::cli::common::CliError> {
    Ok(qsim_api::load::run(&args.spec())?)
}
