//! `qsim calibrate bench`: measure an OpenAI-compatible server the way
//! vLLM's `benchmark_serving.py` does (Poisson arrivals at `--rate`,
//! streaming completions, random lengths as its "random" dataset) and
//! write its result JSON, the input of `qsim calibrate server`. The client
//! is `qsim_live::bench`; this module draws the workload from seeded
//! ChaCha streams (same seed, same requests and arrival times).

use crate::cli::common::CliError;
use qsim_sim::config::ConfigError;
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Base URL of the server, e.g. http://127.0.0.1:8000.
    #[arg(long)]
    pub target: String,
    /// Offered load, requests per (model) second: Poisson arrivals.
    #[arg(long)]
    pub rate: f64,
    /// Number of requests.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub requests: u32,
    /// Prompt tokens per request: N, or LO..HI (uniform).
    #[arg(long, default_value = "512")]
    pub input_len: String,
    /// Output tokens (max_tokens) per request: N, or LO..HI (uniform).
    #[arg(long, default_value = "128")]
    pub output_len: String,
    /// The server's --time-scale (a `qsim serve` runs that many times
    /// faster than real time): arrivals are sent and times reported in model time.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// The model name sent.
    #[arg(long, default_value = "bench")]
    pub model: String,
    /// Prompt token ids are drawn uniformly from LO..HI (inclusive), fresh
    /// for every request, so no prefix cache can serve one prompt from
    /// another; keep HI below the model's vocabulary size.
    #[arg(long, default_value = "1000..30000")]
    pub token_ids: String,
    /// Real-time limit of one request.
    #[arg(long, default_value = "120s", value_parser = crate::cli::common::duration_arg)]
    pub timeout: qsim_sim::time::Nanos,
    /// Seed of the lengths and arrival times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Where to write the result JSON (refused if it exists, unless --force).
    #[arg(long, value_name = "FILE")]
    pub out: PathBuf,
    #[arg(long)]
    pub force: bool,
    /// Needed for a target that is not on this machine (it spends its tokens).
    #[arg(long)]
    pub yes: bool,
}

pub use qsim_sim::workload::bench::{prompt, range, workload};

pub fn run_cli(a: BenchArgs) -> Result<(), CliError> {
    if !(a.rate.is_finite() && a.rate > 0.0) {
        return Err(ConfigError::new(
            "--rate",
            "--rate",
            format!("must be a rate > 0, got {}", a.rate),
        )
        .into());
    }
    if !(a.time_scale.is_finite() && a.time_scale > 0.0 && a.time_scale <= 1e6) {
        return Err(ConfigError::new(
            "--time-scale",
            "--time-scale",
            format!("must be in (0, 1e6], got {}", a.time_scale),
        )
        .into());
    }
    let input = range("--input-len", &a.input_len)?;
    let output = range("--output-len", &a.output_len)?;
    let ids = range("--token-ids", &a.token_ids)?;
    if !qsim_api::replay::is_loopback(&a.target) && !a.yes {
        return Err(ConfigError::new(
            "--yes",
            "--yes",
            format!(
                "the target {} is not on this machine: rerun with --yes to send {} requests",
                a.target, a.requests
            ),
        )
        .into());
    }
    crate::output::check_target(&a.out, a.force)?;
    let timeout = Duration::from_nanos(a.timeout);
    let cfg = qsim_live::bench::BenchConfig {
        target: a.target.clone(),
        model: a.model.clone(),
        rate: a.rate,
        requests: workload(a.rate, a.requests, input, output, a.seed),
        prompt: {
            let seed = a.seed;
            std::sync::Arc::new(move |i, n| prompt(seed, ids, i, n))
        },
        time_scale: a.time_scale,
        timeout,
    };
    let r = qsim_live::bench::run(cfg).map_err(|e| CliError::Io(format!("{}: {e}", a.target)))?;
    let text = serde_json::to_string(&r).unwrap_or_default();
    crate::output::write_file(&a.out, &format!("{text}\n"), a.force)?;
    let f = |k: &str| r.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    let line = format!(
        "{}: {} of {} completed in {:.2} s; mean TTFT {:.2} ms, ITL {:.3} ms, E2E {:.1} ms\n",
        a.out.display(),
        f("completed"),
        a.requests,
        f("duration"),
        f("mean_ttft_ms"),
        f("mean_itl_ms"),
        f("mean_e2el_ms")
    );
    crate::output::write_stdout(&line)?;
    Ok(())
}
