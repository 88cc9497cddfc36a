//! `qsim calibrate bench`: measure an OpenAI-compatible server the way
//! vLLM's `benchmark_serving.py` does (Poisson arrivals at `--rate`,
//! streaming completions, random lengths as its "random" dataset) and
//! write its result JSON, the input of `qsim calibrate server`. The client
//! is `qsim_live::bench`; this module draws the workload from seeded
//! ChaCha streams (same seed, same requests and arrival times).

use crate::cli::common::CliError;
use qsim_sim::config::ConfigError;
use qsim_sim::engine::rng::{component, stream, unit};
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

pub(crate) fn range(flag: &str, s: &str) -> Result<(u32, u32), ConfigError> {
    let bad = || {
        ConfigError::new(
            flag,
            flag,
            format!("must be N or LO..HI token counts ≥ 1, got {s:?}"),
        )
    };
    let p = |x: &str| x.trim().parse::<u32>().ok().filter(|&n| n >= 1);
    let (lo, hi) = match s.split_once("..") {
        Some((a, b)) => (p(a).ok_or_else(bad)?, p(b).ok_or_else(bad)?),
        None => {
            let n = p(s).ok_or_else(bad)?;
            (n, n)
        }
    };
    if lo > hi {
        return Err(bad());
    }
    Ok((lo, hi))
}

/// The prompt of request `i`: `n` token ids uniform in `ids`, from the
/// request's own stream, so prompts are the same for a seed and never
/// share a prefix by construction.
pub fn prompt(seed: u64, ids: (u32, u32), i: usize, n: u32) -> Vec<u32> {
    let mut r = stream(seed, i as u64, component::PROMPT);
    let span = (ids.1 - ids.0 + 1) as f64;
    (0..n)
        .map(|_| ids.0 + ((unit(&mut r) * span) as u32).min(ids.1 - ids.0))
        .collect()
}

/// The workload: (arrival model s, input, output) per request.
pub fn workload(
    rate: f64,
    n: u32,
    input: (u32, u32),
    output: (u32, u32),
    seed: u64,
) -> Vec<(f64, u32, u32)> {
    let mut arr = stream(seed, 1, component::ARRIVALS);
    let mut len = stream(seed, 1, component::WORKLOAD);
    let mut draw =
        |(lo, hi): (u32, u32)| lo + ((unit(&mut len) * (hi - lo + 1) as f64) as u32).min(hi - lo);
    let mut t = 0.0;
    (0..n)
        .map(|k| {
            if k > 0 {
                t += -(1.0 - unit(&mut arr)).ln() / rate;
            }
            let i = draw(input);
            let o = draw(output);
            (t, i, o)
        })
        .collect()
}

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
    if !crate::commands::replay::is_loopback(&a.target) && !a.yes {
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
