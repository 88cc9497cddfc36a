//! `qsim calibrate server`: a server profile's iteration-time coefficients
//! fitted to vLLM serving benchmarks.
//!
//! **Input.** The JSON that vLLM's `benchmarks/benchmark_serving.py
//! --save-result` (or `vllm bench serve --save-result`) writes, one file per
//! request rate: `request_rate` (a number, or `"inf"`: every request at
//! once), `completed`, `mean_ttft_ms`, `mean_itl_ms`, `mean_e2el_ms`
//! (`mean_tpot_ms` is read if present), optionally `burstiness` (only 1.0,
//! Poisson arrivals) and `max_concurrency` (only null), and the per-request
//! arrays when the file has them: `input_lens`, `output_lens`, `ttfts`,
//! `itls` and `errors` (a request with an error or no output is left out).
//! Without the arrays the workload is `completed` requests of the mean
//! lengths (`total_input_tokens` / `total_output_tokens` over `completed`).
//!
//! **Model.** A benchmark is replayed in the simulator: its requests (the
//! arrays' lengths, in their order) arrive as a Poisson process at its rate
//! (the first at 0, as the benchmark sends it) on one replica of the
//! profile ([`Cluster`], the model `qsim serve` and `qsim run` use). The
//! arrival times of the measurement are not in vLLM's file, so each
//! benchmark is simulated `--reps` times with different arrival streams
//! (the same streams at every candidate: common random numbers, a smooth
//! objective) and the means are pooled. A file of `qsim calibrate bench`
//! also has `arrival_s`, each request's send time: with
//! `--recorded-arrivals` such a benchmark is replayed once, at those times
//! (sorted), so its prediction is of the load the server actually saw, not
//! of the rate's expectation. Opt-in: against `qsim serve` of a known
//! profile it predicted a held-out rate 11–15 % high where the Poisson
//! streams were within 10 % (not understood yet). Simulated TTFT = first token − arrival,
//! E2E = last token − arrival, ITL = Σ(last − first token) / Σ(output − 1)
//! (vLLM's `mean_itl_ms` is the mean of every gap between streamed tokens,
//! the same ratio), TPOT = the mean over requests of (last − first) / (output − 1).
//!
//! **Fit.** The coefficients named by `--fit` (dotted paths into the
//! profile TOML; a bare name is under `[iteration]`) are searched in log
//! space (each as a factor of its base value) by Nelder–Mead, minimising
//! Σ over benchmarks of ln(simulated / observed)² / σ² over mean ITL, E2E
//! and TTFT (with per-request TTFTs: the mean TTFT of the prompts longer
//! than the median and of the others, which tells prefill compute from
//! fixed costs). σ² is the variance of that mean across the simulated
//! arrival streams (one measurement's noise from its arrivals alone,
//! floored at [`MIN_REL_ERR`]), taken at the base profile, then again at
//! the first fit, which is refined with it. A candidate the profile loader
//! refuses (an efficiency above 1) scores +∞. The loader is the profile's
//! own, so the fitter knows no formula: a changed step-time form only
//! changes [`DEFAULT_FIT`].
//!
//! **Intervals.** A bootstrap over requests: each replicate resamples every
//! benchmark's requests with replacement (its observed means from the
//! per-request `ttfts` and `itls`; a request's E2E is its TTFT plus its
//! gaps), refits from the estimate, and predicts the held-out benchmarks
//! and the saturation rate; the interval is the 2.5–97.5 % percentiles. It
//! treats requests as independent, which they are not under queueing, so
//! it is narrower than the truth. A benchmark without the arrays keeps its
//! means in every replicate.
//!
//! **Saturation.** The largest request rate the profile sustains for the
//! benchmarks' length mix: 2,000 requests (the fitted benchmarks' requests,
//! cycled) all waiting at 0, and the completion rate between the 10th and
//! the 90th percentile of completions (the batch full, before the drain).

use crate::cli::common::{CliError, Format};
use qsim_core::stats::quantile;
use qsim_sim::config::{read_toml, ConfigError};
use qsim_sim::engine::rng::{component, stream, unit};
use qsim_sim::server::{Cluster, Request, RouterKind, ServerProfile};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

/// The coefficients fitted when `--fit` is not given: the step-time
/// efficiencies and CPU overheads, and the API server's ingress.
pub const DEFAULT_FIT: &[&str] = &[
    "iteration.bandwidth_efficiency",
    "iteration.compute_efficiency",
    "iteration.cpu_overhead_ms",
    "iteration.cpu_per_seq_us",
    "iteration.ingress_ms",
];

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// vLLM benchmark_serving result JSON files (one per request rate) to fit to.
    #[arg(required = true, value_name = "BENCH_JSON")]
    pub bench: Vec<PathBuf>,
    /// The server profile whose coefficients are fitted (the start values).
    #[arg(long, value_name = "FILE")]
    pub profile: PathBuf,
    /// Benchmarks not fitted to, only predicted (repeatable).
    #[arg(long, value_name = "BENCH_JSON")]
    pub holdout: Vec<PathBuf>,
    /// Coefficients to fit, comma-separated dotted paths into the profile
    /// (a bare name is under [iteration]); `none` fits nothing (evaluates
    /// the profile). Default: the step-time ones (see the README).
    #[arg(long, value_delimiter = ',', value_name = "COEF,...")]
    pub fit: Option<Vec<String>>,
    /// Write the fitted profile here (refused if it exists, unless --force).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub force: bool,
    /// The fitted profile's name (default: the base's with "-calibrated").
    #[arg(long)]
    pub name: Option<String>,
    /// Simulated arrival streams per benchmark (their means are pooled).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub reps: u32,
    /// Bootstrap replicates for the intervals (0: none).
    #[arg(long, default_value_t = 20)]
    pub bootstrap: u32,
    /// Objective evaluations of the main fit at most.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_evals: u32,
    /// Seed of the arrival streams and the bootstrap.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay a benchmark that has `arrival_s` (qsim calibrate bench) at
    /// those recorded send times instead of Poisson streams at its rate.
    #[arg(long)]
    pub recorded_arrivals: bool,
    /// Report format on stdout (table or json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

/// Means of one benchmark, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Means {
    pub ttft: f64,
    pub itl: f64,
    pub e2e: f64,
    pub tpot: f64,
    /// Mean TTFT of the requests with a prompt longer than the benchmark's
    /// median prompt, and of the others (NaN without per-request data).
    pub ttft_long: f64,
    pub ttft_short: f64,
}

/// One request's observations (seconds).
#[derive(Debug, Clone, Copy)]
struct Obs {
    ttft: f64,
    gaps: f64,
    n_gaps: u32,
    long: bool,
}

/// One benchmark file.
#[derive(Debug, Clone)]
pub struct Bench {
    pub file: String,
    /// Requests per second; infinite: all at once.
    pub rate: f64,
    /// (input, output) tokens of every successful request, in order.
    pub reqs: Vec<(u32, u32)>,
    pub observed: Means,
    /// Prompts longer than this are "long" (the median prompt length).
    pub split: u32,
    per_request: Option<Vec<Obs>>,
    /// Each request's recorded send time (ns from the first), in order
    /// (`arrival_s`, which `qsim calibrate bench` writes): the benchmark is
    /// replayed at these times instead of as Poisson streams.
    pub arrivals: Option<Vec<u64>>,
}

/// The largest finite request rate read (requests per second): a faster
/// benchmark sends its requests at once, which the file states as "inf".
pub const MAX_RATE: f64 = 1e5;
/// The most requests a benchmark file may state (`completed`, the arrays):
/// each is simulated `--reps` times at every candidate of the fit.
pub const MAX_BENCH_REQUESTS: f64 = 1e6;
/// The largest mean latency read (`mean_*_ms`, a request's `ttfts`, the
/// sum of its `itls`): a day.
pub const MAX_LATENCY_S: f64 = 86_400.0;
/// The largest mean prompt or answer read (tokens per request).
pub const MAX_MEAN_TOKENS: f64 = 1e7;

fn field_err(file: &str, field: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(file, field, reason)
}

fn get_num(file: &str, v: &Value, key: &str) -> Result<f64, ConfigError> {
    match v.get(key) {
        None | Some(Value::Null) => Err(field_err(file, key, "missing")),
        Some(x) => x
            .as_f64()
            .filter(|x| x.is_finite() && *x >= 0.0)
            .ok_or_else(|| field_err(file, key, format!("must be a number ≥ 0, got {x}"))),
    }
}

fn get_array<'a>(
    file: &str,
    v: &'a Value,
    key: &str,
) -> Result<Option<&'a Vec<Value>>, ConfigError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(_) => Err(field_err(file, key, "must be an array")),
    }
}

fn len_of(file: &str, key: &str, i: usize, x: &Value) -> Result<u32, ConfigError> {
    x.as_u64()
        .filter(|&n| n <= u32::MAX as u64)
        .map(|n| n as u32)
        .ok_or_else(|| {
            field_err(
                file,
                &format!("{key}.{i}"),
                format!("must be a token count, got {x}"),
            )
        })
}

fn secs_of(file: &str, key: &str, x: &Value) -> Result<f64, ConfigError> {
    x.as_f64()
        .filter(|s| s.is_finite() && *s >= 0.0)
        .ok_or_else(|| field_err(file, key, format!("must be seconds ≥ 0, got {x}")))
}

/// Without `--recorded-arrivals`, a benchmark's `arrival_s` is checked but
/// not used (Poisson streams at its rate, as for vLLM's files).
/// With it, the benchmark is replayed in time order: requests (and their
/// observations) sorted by their recorded send times (concurrent sends may
/// be logged a few µs out of order), the first at 0.
pub fn keep_arrivals(mut b: Bench, keep: bool) -> Bench {
    let Some(at) = b.arrivals.as_mut().filter(|_| keep) else {
        b.arrivals = None;
        return b;
    };
    let mut order: Vec<usize> = (0..at.len()).collect();
    order.sort_by_key(|&k| (at[k], k));
    let t0 = at[order[0]];
    b.reqs = order.iter().map(|&k| b.reqs[k]).collect();
    if let Some(obs) = b.per_request.as_mut() {
        *obs = order.iter().map(|&k| obs[k]).collect();
    }
    *at = order.iter().map(|&k| at[k] - t0).collect();
    b
}

/// Read and check one vLLM benchmark result file.
pub fn read_bench(path: &std::path::Path) -> Result<Bench, ConfigError> {
    let file = path.display().to_string();
    let text = qsim_sim::input::read_text(path, qsim_sim::input::Kind::Data)
        .map_err(|e| field_err(&file, "", e))?;
    let v: Value =
        serde_json::from_str(&text).map_err(|e| field_err(&file, "", format!("not JSON: {e}")))?;
    if !v.is_object() {
        return Err(field_err(
            &file,
            "",
            "must be a JSON object (a benchmark_serving result)",
        ));
    }
    let rate = match v.get("request_rate") {
        None | Some(Value::Null) => return Err(field_err(&file, "request_rate", "missing")),
        Some(Value::String(s)) if s == "inf" => f64::INFINITY,
        Some(x) => x
            .as_f64()
            .filter(|r| r.is_finite() && *r > 0.0 && *r <= MAX_RATE)
            .ok_or_else(|| {
                field_err(
                    &file,
                    "request_rate",
                    format!(
                        "must be a rate > 0 and at most {MAX_RATE} requests/s (\"inf\" for every request at once), got {x}"
                    ),
                )
            })?,
    };
    if let Some(b) = v.get("burstiness").filter(|b| !b.is_null()) {
        if b.as_f64() != Some(1.0) {
            return Err(field_err(
                &file,
                "burstiness",
                format!("only 1.0 (Poisson arrivals) is supported, got {b}"),
            ));
        }
    }
    if let Some(c) = v.get("max_concurrency").filter(|c| !c.is_null()) {
        return Err(field_err(
            &file,
            "max_concurrency",
            format!("a concurrency cap is not supported (open-loop arrivals only), got {c}"),
        ));
    }
    let completed = get_num(&file, &v, "completed")?;
    if completed < 1.0 || completed.fract() != 0.0 || completed > MAX_BENCH_REQUESTS {
        return Err(field_err(
            &file,
            "completed",
            format!("must be a count from 1 to {MAX_BENCH_REQUESTS}, got {completed}"),
        ));
    }
    let ms = |k: &str| get_num(&file, &v, k).map(|x| x / 1e3);
    let (ttft, itl, e2e) = (ms("mean_ttft_ms")?, ms("mean_itl_ms")?, ms("mean_e2el_ms")?);
    let tpot = match v.get("mean_tpot_ms") {
        None | Some(Value::Null) => f64::NAN,
        Some(_) => ms("mean_tpot_ms")?,
    };
    for (k, x) in [
        ("mean_ttft_ms", ttft),
        ("mean_itl_ms", itl),
        ("mean_e2el_ms", e2e),
    ] {
        if x <= 0.0 {
            return Err(field_err(&file, k, "must be > 0 to fit to"));
        }
        if x > MAX_LATENCY_S {
            return Err(field_err(
                &file,
                k,
                format!("{} ms is more than a day: not a latency to fit to", x * 1e3),
            ));
        }
    }
    let mut observed = Means {
        ttft,
        itl,
        e2e,
        tpot,
        ttft_long: f64::NAN,
        ttft_short: f64::NAN,
    };
    let ins = get_array(&file, &v, "input_lens")?;
    let outs = get_array(&file, &v, "output_lens")?;
    let (reqs, mut per_request, arrivals) = match (ins, outs) {
        (Some(ins), Some(outs)) => {
            if ins.len() as f64 > MAX_BENCH_REQUESTS {
                return Err(field_err(
                    &file,
                    "input_lens",
                    format!(
                        "{} requests, more than {MAX_BENCH_REQUESTS} to simulate",
                        ins.len()
                    ),
                ));
            }
            if ins.len() != outs.len() {
                return Err(field_err(
                    &file,
                    "output_lens",
                    format!("has {} items, input_lens {}", outs.len(), ins.len()),
                ));
            }
            let errors = get_array(&file, &v, "errors")?;
            let ttfts = get_array(&file, &v, "ttfts")?;
            let itls = get_array(&file, &v, "itls")?;
            let sends = get_array(&file, &v, "arrival_s")?;
            for (k, a) in [
                ("errors", errors),
                ("ttfts", ttfts),
                ("itls", itls),
                ("arrival_s", sends),
            ] {
                if let Some(a) = a {
                    if a.len() != ins.len() {
                        return Err(field_err(
                            &file,
                            k,
                            format!("has {} items, input_lens {}", a.len(), ins.len()),
                        ));
                    }
                }
            }
            let mut reqs = Vec::new();
            let mut obs = Vec::new();
            let mut at = Vec::new();
            for i in 0..ins.len() {
                let input = len_of(&file, "input_lens", i, &ins[i])?;
                let output = len_of(&file, "output_lens", i, &outs[i])?;
                let failed = errors
                    .and_then(|e| e[i].as_str())
                    .is_some_and(|s| !s.is_empty());
                if failed || output == 0 {
                    continue;
                }
                reqs.push((input.max(1), output));
                if let Some(a) = sends {
                    let x = secs_of(&file, &format!("arrival_s.{i}"), &a[i])?;
                    if x > MAX_LATENCY_S {
                        return Err(field_err(
                            &file,
                            &format!("arrival_s.{i}"),
                            format!("{x} s is more than a day after the start"),
                        ));
                    }
                    at.push((x * 1e9).round() as u64);
                }
                if let (Some(t), Some(g)) = (ttfts, itls) {
                    let _ = output;
                    let ttft = secs_of(&file, &format!("ttfts.{i}"), &t[i])?;
                    if ttft > MAX_LATENCY_S {
                        return Err(field_err(
                            &file,
                            &format!("ttfts.{i}"),
                            format!("{ttft} s is more than a day"),
                        ));
                    }
                    let gaps = g[i].as_array().ok_or_else(|| {
                        field_err(&file, &format!("itls.{i}"), "must be an array of seconds")
                    })?;
                    let mut sum = 0.0;
                    for (j, x) in gaps.iter().enumerate() {
                        sum += secs_of(&file, &format!("itls.{i}.{j}"), x)?;
                    }
                    if sum > MAX_LATENCY_S {
                        return Err(field_err(
                            &file,
                            &format!("itls.{i}"),
                            format!("the gaps add up to {sum} s, more than a day"),
                        ));
                    }
                    obs.push(Obs {
                        ttft,
                        gaps: sum,
                        n_gaps: gaps.len() as u32,
                        long: input.max(1) > 0,
                    });
                }
            }
            if reqs.is_empty() {
                return Err(field_err(&file, "output_lens", "no successful request"));
            }
            let per = (ttfts.is_some() && itls.is_some()).then_some(obs);
            (reqs, per, sends.is_some().then_some(at))
        }
        (Some(_), None) => {
            return Err(field_err(
                &file,
                "output_lens",
                "missing (input_lens is given)",
            ))
        }
        (None, Some(_)) => {
            return Err(field_err(
                &file,
                "input_lens",
                "missing (output_lens is given)",
            ))
        }
        (None, None) => {
            let n = completed as usize;
            let tin = get_num(&file, &v, "total_input_tokens")?;
            let tout = get_num(&file, &v, "total_output_tokens")?;
            let (i, o) = ((tin / completed).round(), (tout / completed).round());
            for (k, m) in [("total_input_tokens", i), ("total_output_tokens", o)] {
                if m > MAX_MEAN_TOKENS {
                    return Err(field_err(
                        &file,
                        k,
                        format!("{m} tokens per request, more than {MAX_MEAN_TOKENS}"),
                    ));
                }
            }
            if o < 1.0 {
                return Err(field_err(
                    &file,
                    "total_output_tokens",
                    "must be ≥ completed",
                ));
            }
            (vec![((i.max(1.0)) as u32, o as u32); n], None, None)
        }
    };
    let mut sorted: Vec<u32> = reqs.iter().map(|r| r.0).collect();
    sorted.sort_unstable();
    let split = sorted[(sorted.len() - 1) / 2];
    if let Some(obs) = per_request.as_mut() {
        for (o, r) in obs.iter_mut().zip(&reqs) {
            o.long = r.0 > split;
        }
        let (l, s) = split_ttft(obs.iter());
        observed.ttft_long = l;
        observed.ttft_short = s;
    }
    Ok(Bench {
        file,
        rate,
        reqs,
        observed,
        split,
        per_request,
        arrivals,
    })
}

/// Mean TTFT of the long-prompt and of the short-prompt requests.
fn split_ttft<'a>(obs: impl Iterator<Item = &'a Obs>) -> (f64, f64) {
    let (mut l, mut nl, mut s, mut ns) = (0.0, 0.0, 0.0, 0.0);
    for o in obs {
        if o.long {
            l += o.ttft;
            nl += 1.0;
        } else {
            s += o.ttft;
            ns += 1.0;
        }
    }
    let m = |a: f64, n: f64| if n > 0.0 { a / n } else { f64::NAN };
    (m(l, nl), m(s, ns))
}

/// Simulate `reqs` arriving at the times `at` (ns) when given, else as a
/// Poisson process at `rate`, on one replica; returns the sums (ttft, e2e, gap time, gaps, tpot, counted requests,
/// tpot requests, ttft of prompts over `split`, their count) over the
/// requests that ran.
fn simulate(
    profile: &Arc<ServerProfile>,
    reqs: &[(u32, u32)],
    split: u32,
    rate: f64,
    at: Option<&[u64]>,
    seed: u64,
    scope: u64,
) -> [f64; 9] {
    let mut cl = Cluster::new(profile.clone(), 1, RouterKind::RoundRobin, seed);
    let mut rng = stream(seed, scope, component::ARRIVALS);
    let mut t = 0.0f64;
    let mut acc = [0.0; 9];
    let drain = |cl: &mut Cluster, acc: &mut [f64; 9]| {
        while let Some(c) = cl.poll_completion() {
            if c.rejected {
                continue;
            }
            let ttft = (c.first_token - c.arrival) as f64 / 1e9;
            let e2e = (c.finished - c.arrival) as f64 / 1e9;
            acc[0] += ttft;
            acc[1] += e2e;
            acc[5] += 1.0;
            if reqs[c.id as usize].0 > split {
                acc[7] += ttft;
                acc[8] += 1.0;
            }
            if c.output_tokens > 1 {
                let d = (c.finished - c.first_token) as f64 / 1e9;
                acc[2] += d;
                acc[3] += (c.output_tokens - 1) as f64;
                acc[4] += d / (c.output_tokens - 1) as f64;
                acc[6] += 1.0;
            }
        }
    };
    for (k, &(i, o)) in reqs.iter().enumerate() {
        let now = match at {
            Some(at) => at[k],
            None => {
                if k > 0 && rate.is_finite() {
                    t += -(1.0 - unit(&mut rng)).ln() / rate;
                }
                (t * 1e9).round() as u64
            }
        };
        while let Some(d) = cl.poll_timeout() {
            if d > now {
                break;
            }
            cl.handle_timeout(d);
        }
        cl.submit(
            now,
            Request {
                id: k as u64,
                input_tokens: i,
                output_tokens: o,
            },
        );
        drain(&mut cl, &mut acc);
    }
    while let Some(d) = cl.poll_timeout() {
        cl.handle_timeout(d);
        drain(&mut cl, &mut acc);
    }
    drain(&mut cl, &mut acc);
    acc
}

/// Simulated means of one benchmark: replayed at its recorded send times
/// if it has them (one run), else its Poisson arrival streams pooled.
pub fn predict(profile: &Arc<ServerProfile>, b: &Bench, idx: u64, reps: u32, seed: u64) -> Means {
    match &b.arrivals {
        Some(at) => means_of(&simulate(
            profile,
            &b.reqs,
            b.split,
            b.rate,
            Some(at),
            seed,
            0,
        )),
        None => predict_full(profile, b, idx, reps, seed).0,
    }
}

fn means_of(a: &[f64; 9]) -> Means {
    let n = a[5].max(1.0);
    Means {
        ttft: a[0] / n,
        e2e: a[1] / n,
        itl: if a[3] > 0.0 { a[2] / a[3] } else { f64::NAN },
        tpot: if a[6] > 0.0 { a[4] / a[6] } else { f64::NAN },
        ttft_long: if a[8] > 0.0 { a[7] / a[8] } else { f64::NAN },
        ttft_short: if a[5] > a[8] {
            (a[0] - a[7]) / (a[5] - a[8])
        } else {
            f64::NAN
        },
    }
}

/// Simulated means of one benchmark ([`predict`]), and the variance over
/// Poisson arrival streams at its rate of ln(one stream's mean) of (TTFT
/// of long prompts, of short prompts, TTFT, ITL, E2E): how far one
/// measurement of this many requests may be from the expectation by its
/// arrivals alone. A benchmark replayed at its recorded times has no
/// arrival noise, but the same variance weighs it: it says how sensitive
/// each mean is to chance in the timing (the engine's own jitter moves a
/// mean near saturation as arrival noise does).
pub fn predict_full(
    profile: &Arc<ServerProfile>,
    b: &Bench,
    idx: u64,
    reps: u32,
    seed: u64,
) -> (Means, [f64; 5]) {
    let sums: Vec<[f64; 9]> = (0..reps as u64)
        .into_par_iter()
        .map(|r| {
            simulate(
                profile,
                &b.reqs,
                b.split,
                b.rate,
                None,
                seed,
                (idx << 8) | r,
            )
        })
        .collect();
    let mut a = [0.0; 9];
    for s in &sums {
        for (x, y) in a.iter_mut().zip(s) {
            *x += y;
        }
    }
    let pick = |m: &Means| [m.ttft_long, m.ttft_short, m.ttft, m.itl, m.e2e];
    let logs: Vec<[f64; 5]> = sums
        .iter()
        .map(|s| pick(&means_of(s)).map(f64::ln))
        .collect();
    let mut var = [f64::NAN; 5];
    if logs.len() >= 2 {
        let k = logs.len() as f64;
        for (j, v) in var.iter_mut().enumerate() {
            let mean = logs.iter().map(|l| l[j]).sum::<f64>() / k;
            *v = logs.iter().map(|l| (l[j] - mean).powi(2)).sum::<f64>() / (k - 1.0);
        }
    }
    let means = match &b.arrivals {
        Some(_) => predict(profile, b, idx, reps, seed),
        None => means_of(&a),
    };
    (means, var)
}

/// Requests the profile completes per second with a standing backlog of
/// the length mix `pool` (see the module docs).
pub fn saturation(profile: &Arc<ServerProfile>, pool: &[(u32, u32)]) -> f64 {
    const M: usize = 2000;
    if pool.is_empty() {
        return f64::NAN;
    }
    let mut cl = Cluster::new(profile.clone(), 1, RouterKind::RoundRobin, 1);
    for k in 0..M {
        let (i, o) = pool[k % pool.len()];
        cl.submit(
            0,
            Request {
                id: k as u64,
                input_tokens: i,
                output_tokens: o,
            },
        );
    }
    let mut ends = Vec::with_capacity(M);
    while let Some(d) = cl.poll_timeout() {
        cl.handle_timeout(d);
        while let Some(c) = cl.poll_completion() {
            if !c.rejected {
                ends.push(c.finished);
            }
        }
    }
    if ends.len() < 20 {
        return f64::NAN;
    }
    ends.sort_unstable();
    let (a, b) = (ends.len() / 10, ends.len() * 9 / 10);
    let span = (ends[b] - ends[a]) as f64 / 1e9;
    if span > 0.0 {
        (b - a) as f64 / span
    } else {
        f64::NAN
    }
}

/// A profile with named coefficients set: the base TOML value edited and
/// loaded by the profile's own loader.
pub struct Coefs {
    base: toml::Value,
    file: String,
    pub names: Vec<String>,
    pub start: Vec<f64>,
}

fn lookup<'a>(v: &'a toml::Value, path: &str) -> Option<&'a toml::Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

impl Coefs {
    pub fn new(file: &str, base: toml::Value, names: &[String]) -> Result<Self, ConfigError> {
        ServerProfile::from_value(file, base.clone())?;
        let mut start = Vec::new();
        let mut full = Vec::new();
        for n in names {
            let path = if n.contains('.') {
                n.clone()
            } else {
                format!("iteration.{n}")
            };
            if full.contains(&path) {
                return Err(field_err(
                    "--fit",
                    "--fit",
                    format!("{path} is named twice"),
                ));
            }
            let v = lookup(&base, &path)
                .and_then(|x| x.as_float().or(x.as_integer().map(|i| i as f64)));
            let v = v.ok_or_else(|| {
                field_err(
                    file,
                    &path,
                    "absent or not a number: --fit needs its start value in the profile",
                )
            })?;
            if v.is_nan() || v <= 0.0 {
                return Err(field_err(
                    file,
                    &path,
                    format!("start value must be > 0 to fit it as a factor, got {v}"),
                ));
            }
            full.push(path);
            start.push(v);
        }
        let c = Coefs {
            base,
            file: file.to_string(),
            names: full,
            start,
        };
        // Every coefficient must be a real number the loader takes.
        for (i, n) in c.names.iter().enumerate() {
            let mut x = c.start.clone();
            x[i] *= 1.0 + 1e-9;
            c.profile(&x).map_err(|e| {
                field_err(
                    "--fit",
                    "--fit",
                    format!("{n}: not a fittable real coefficient ({e})"),
                )
            })?;
        }
        Ok(c)
    }

    pub fn value(&self, values: &[f64]) -> toml::Value {
        let mut v = self.base.clone();
        for (n, &x) in self.names.iter().zip(values) {
            let mut cur = &mut v;
            let parts: Vec<&str> = n.split('.').collect();
            for p in &parts[..parts.len() - 1] {
                cur = cur.get_mut(*p).expect("checked in new");
            }
            if let Some(t) = cur.as_table_mut() {
                t.insert(parts[parts.len() - 1].to_string(), toml::Value::Float(x));
            }
        }
        v
    }

    pub fn profile(&self, values: &[f64]) -> Result<ServerProfile, ConfigError> {
        ServerProfile::from_value(&self.file, self.value(values))
    }
}

/// Minimise `f` by Nelder–Mead (reflection 1, expansion 2, contraction ½,
/// shrink ½; Lagarias et al. 1998) from `x0` with initial steps `step`
/// along each axis, for at most `max_evals` evaluations or until the
/// simplex's values agree to `ftol` and its points to `xtol`.
/// Deterministic. Returns (best point, its value, evaluations).
pub fn nelder_mead(
    f: &mut dyn FnMut(&[f64]) -> f64,
    x0: &[f64],
    step: f64,
    max_evals: u32,
    ftol: f64,
    xtol: f64,
) -> (Vec<f64>, f64, u32) {
    let n = x0.len();
    let mut evals = 0u32;
    let mut eval = |x: &[f64], evals: &mut u32| {
        *evals += 1;
        let y = f(x);
        if y.is_nan() {
            f64::INFINITY
        } else {
            y
        }
    };
    if n == 0 {
        let y = eval(x0, &mut evals);
        return (Vec::new(), y, evals);
    }
    let mut pts: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    let y0 = eval(x0, &mut evals);
    pts.push((x0.to_vec(), y0));
    for i in 0..n {
        let mut x = x0.to_vec();
        x[i] += step;
        let y = eval(&x, &mut evals);
        pts.push((x, y));
    }
    let comb = |a: &[f64], b: &[f64], t: f64| -> Vec<f64> {
        a.iter().zip(b).map(|(a, b)| a + t * (b - a)).collect()
    };
    while evals < max_evals {
        pts.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (pts[0].1, pts[n].1);
        let spread = pts
            .iter()
            .flat_map(|p| p.0.iter().zip(&pts[0].0).map(|(a, b)| (a - b).abs()))
            .fold(0.0f64, f64::max);
        if (worst - best).abs() <= ftol && spread <= xtol {
            break;
        }
        let mut c = vec![0.0; n];
        for p in &pts[..n] {
            for (ck, pk) in c.iter_mut().zip(&p.0) {
                *ck += pk / n as f64;
            }
        }
        let xr = comb(&c, &pts[n].0, -1.0);
        let yr = eval(&xr, &mut evals);
        if yr < pts[0].1 {
            let xe = comb(&c, &pts[n].0, -2.0);
            let ye = eval(&xe, &mut evals);
            pts[n] = if ye < yr { (xe, ye) } else { (xr, yr) };
        } else if yr < pts[n - 1].1 {
            pts[n] = (xr, yr);
        } else {
            let (xc, yc) = if yr < pts[n].1 {
                let xc = comb(&c, &xr, 0.5);
                let yc = eval(&xc, &mut evals);
                (xc, yc)
            } else {
                let xc = comb(&c, &pts[n].0, 0.5);
                let yc = eval(&xc, &mut evals);
                (xc, yc)
            };
            if yc < yr.min(pts[n].1) {
                pts[n] = (xc, yc);
            } else {
                let x0 = pts[0].0.clone();
                for p in pts.iter_mut().skip(1) {
                    let x = comb(&x0, &p.0, 0.5);
                    let y = eval(&x, &mut evals);
                    *p = (x, y);
                }
            }
        }
    }
    pts.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (x, y) = pts.swap_remove(0);
    (x, y, evals)
}

/// The smallest relative error a mean is trusted to: the client's and the
/// server's own overheads are not in the arrival noise.
pub const MIN_REL_ERR: f64 = 0.02;

/// Σ over benchmarks and over mean TTFT (of the long and of the short
/// prompts, when the file has per-request TTFTs), ITL and E2E of
/// ln(sim / obs)².
/// Each term is divided by its variance (see [`predict_full`]; at least
/// [`MIN_REL_ERR`]²): a weighted least squares, so the means that one
/// benchmark's arrivals make noisy (TTFT near saturation) weigh less.
fn loss(pred: &[Means], obs: &[Means], var: &[[f64; 5]], reps: u32) -> f64 {
    pred.iter()
        .zip(obs)
        .zip(var)
        .map(|((p, o), v)| {
            let ttft = if o.ttft_long.is_finite() && o.ttft_short.is_finite() {
                vec![
                    (p.ttft_long, o.ttft_long, v[0]),
                    (p.ttft_short, o.ttft_short, v[1]),
                ]
            } else {
                vec![(p.ttft, o.ttft, v[2])]
            };
            ttft.into_iter()
                .chain([(p.itl, o.itl, v[3]), (p.e2e, o.e2e, v[4])])
                .map(|(s, m, v)| {
                    let r = (s / m).ln();
                    let v = if v.is_finite() {
                        v * (1.0 + 1.0 / reps as f64)
                    } else {
                        0.0
                    };
                    if r.is_finite() {
                        r * r / v.max(MIN_REL_ERR * MIN_REL_ERR)
                    } else {
                        1e12
                    }
                })
                .sum::<f64>()
        })
        .sum()
}

/// The fit's inputs.
pub struct Problem {
    pub coefs: Coefs,
    pub fit: Vec<Bench>,
    pub holdout: Vec<Bench>,
    pub reps: u32,
    pub seed: u64,
}

/// Fitted values with their intervals, and what they predict.
pub struct Fit {
    pub values: Vec<f64>,
    pub intervals: Vec<Option<(f64, f64)>>,
    pub loss: f64,
    pub evals: u32,
    pub base_fit: Vec<Means>,
    pub fitted_fit: Vec<Means>,
    pub base_holdout: Vec<Means>,
    pub fitted_holdout: Vec<Means>,
    pub holdout_ci: Vec<Option<Means2>>,
    pub saturation_base: f64,
    pub saturation: f64,
    pub saturation_ci: Option<(f64, f64)>,
    pub bootstrap: u32,
}

/// (low, high) of each mean.
#[derive(Debug, Clone, Copy)]
pub struct Means2 {
    pub lo: Means,
    pub hi: Means,
}

impl Problem {
    fn pool(&self) -> Vec<(u32, u32)> {
        self.fit
            .iter()
            .flat_map(|b| b.reqs.iter().copied())
            .collect()
    }

    fn predict_all(&self, p: &Arc<ServerProfile>, benches: &[Bench], offset: u64) -> Vec<Means> {
        benches
            .iter()
            .enumerate()
            .map(|(i, b)| predict(p, b, offset + i as u64, self.reps, self.seed))
            .collect()
    }

    fn variances(&self, p: &Arc<ServerProfile>) -> Vec<[f64; 5]> {
        self.fit
            .iter()
            .enumerate()
            .map(|(i, b)| predict_full(p, b, i as u64, self.reps, self.seed).1)
            .collect()
    }

    fn solve(
        &self,
        obs: &[Means],
        var: &[[f64; 5]],
        x0: &[f64],
        step: f64,
        max_evals: u32,
    ) -> (Vec<f64>, f64, u32) {
        let mut f = |x: &[f64]| -> f64 {
            let vals: Vec<f64> = x
                .iter()
                .zip(&self.coefs.start)
                .map(|(x, s)| s * x.exp())
                .collect();
            match self.coefs.profile(&vals) {
                Ok(p) => loss(
                    &self.predict_all(&Arc::new(p), &self.fit, 0),
                    obs,
                    var,
                    self.reps,
                ),
                Err(_) => f64::INFINITY,
            }
        };
        nelder_mead(&mut f, x0, step, max_evals, 1e-7, 1e-4)
    }

    fn to_values(&self, x: &[f64]) -> Vec<f64> {
        x.iter()
            .zip(&self.coefs.start)
            .map(|(x, s)| s * x.exp())
            .collect()
    }

    pub fn run(&self, max_evals: u32, bootstrap: u32) -> Result<Fit, ConfigError> {
        let obs: Vec<Means> = self.fit.iter().map(|b| b.observed).collect();
        let n = self.coefs.names.len();
        let base = Arc::new(self.coefs.profile(&self.coefs.start)?);
        // Weights from the base profile, then again from the first fit.
        let var0 = self.variances(&base);
        let (x1, _, e1) = self.solve(&obs, &var0, &vec![0.0; n], 0.2, max_evals);
        let var = self.variances(&Arc::new(self.coefs.profile(&self.to_values(&x1))?));
        let (x, l, e2) = self.solve(&obs, &var, &x1, 0.05, max_evals);
        let evals = e1 + e2;
        let values = self.to_values(&x);
        let fitted = Arc::new(self.coefs.profile(&values)?);
        let ho = self.fit.len() as u64;
        let pool = self.pool();
        let mut fit = Fit {
            base_fit: self.predict_all(&base, &self.fit, 0),
            fitted_fit: self.predict_all(&fitted, &self.fit, 0),
            base_holdout: self.predict_all(&base, &self.holdout, ho),
            fitted_holdout: self.predict_all(&fitted, &self.holdout, ho),
            saturation_base: saturation(&base, &pool),
            saturation: saturation(&fitted, &pool),
            values,
            intervals: vec![None; n],
            holdout_ci: vec![None; self.holdout.len()],
            saturation_ci: None,
            loss: l,
            evals,
            bootstrap: 0,
        };
        if bootstrap == 0 || n == 0 {
            return Ok(fit);
        }
        let mut rng = stream(self.seed, 0, 0xb007);
        let mut vals: Vec<Vec<f64>> = vec![Vec::new(); n];
        let mut sats = Vec::new();
        let mut hos: Vec<Vec<Means>> = vec![Vec::new(); self.holdout.len()];
        for _ in 0..bootstrap {
            let o: Vec<Means> = self
                .fit
                .iter()
                .map(|b| match &b.per_request {
                    Some(reqs) if !reqs.is_empty() => {
                        let k = reqs.len();
                        let (mut t, mut e, mut g, mut ng) = (0.0, 0.0, 0.0, 0.0);
                        let mut pick = Vec::with_capacity(k);
                        for _ in 0..k {
                            let r = &reqs[((unit(&mut rng) * k as f64) as usize).min(k - 1)];
                            t += r.ttft;
                            e += r.ttft + r.gaps;
                            g += r.gaps;
                            ng += r.n_gaps as f64;
                            pick.push(r);
                        }
                        let (tl, ts) = split_ttft(pick.into_iter());
                        Means {
                            ttft: t / k as f64,
                            e2e: e / k as f64,
                            itl: if ng > 0.0 { g / ng } else { b.observed.itl },
                            tpot: b.observed.tpot,
                            ttft_long: tl,
                            ttft_short: ts,
                        }
                    }
                    _ => b.observed,
                })
                .collect();
            let (xb, _, _) = self.solve(&o, &var, &x, 0.05, (max_evals / 3).max(20));
            let vb = self.to_values(&xb);
            for (k, v) in vb.iter().enumerate() {
                vals[k].push(*v);
            }
            let p = Arc::new(self.coefs.profile(&vb)?);
            sats.push(saturation(&p, &pool));
            for (h, m) in self
                .predict_all(&p, &self.holdout, ho)
                .into_iter()
                .enumerate()
            {
                hos[h].push(m);
            }
        }
        fit.bootstrap = bootstrap;
        fit.intervals = vals.iter_mut().map(|v| Some(ci(v))).collect();
        fit.saturation_ci = Some(ci(&mut sats));
        fit.holdout_ci = hos
            .iter()
            .map(|ms| {
                let col = |g: &dyn Fn(&Means) -> f64| ci(&mut ms.iter().map(g).collect::<Vec<_>>());
                let (t, i, e, p) = (
                    col(&|m| m.ttft),
                    col(&|m| m.itl),
                    col(&|m| m.e2e),
                    col(&|m| m.tpot),
                );
                let (tl, ts) = (col(&|m| m.ttft_long), col(&|m| m.ttft_short));
                Some(Means2 {
                    lo: Means {
                        ttft: t.0,
                        itl: i.0,
                        e2e: e.0,
                        tpot: p.0,
                        ttft_long: tl.0,
                        ttft_short: ts.0,
                    },
                    hi: Means {
                        ttft: t.1,
                        itl: i.1,
                        e2e: e.1,
                        tpot: p.1,
                        ttft_long: tl.1,
                        ttft_short: ts.1,
                    },
                })
            })
            .collect();
        Ok(fit)
    }
}

/// 2.5–97.5 % percentiles.
fn ci(v: &mut [f64]) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (quantile(v, 0.025), quantile(v, 0.975))
}

fn g(x: f64) -> String {
    if !x.is_finite() {
        "–".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else if x.abs() >= 1.0 {
        format!("{x:.3}")
    } else {
        format!("{x:.4}")
    }
}

fn pct(p: f64, o: f64) -> String {
    let e = (p / o - 1.0) * 100.0;
    if e.is_finite() {
        format!("{e:+.1}%")
    } else {
        "–".into()
    }
}

fn rate_s(r: f64) -> String {
    if r.is_finite() {
        format!("{r}")
    } else {
        "inf".into()
    }
}

impl Fit {
    pub fn table(&self, pr: &Problem, base_file: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "calibrate server: {base_file}: {} coefficient(s) fitted to {} benchmark(s), {} held out",
            pr.coefs.names.len(),
            pr.fit.len(),
            pr.holdout.len()
        );
        let _ = writeln!(
            s,
            "objective Σ ln(sim/obs)²/σ² over mean TTFT, ITL, E2E: {:.5} after {} evaluations ({} arrival streams per benchmark)",
            self.loss, self.evals, pr.reps
        );
        let recorded = pr
            .fit
            .iter()
            .chain(&pr.holdout)
            .filter(|b| b.arrivals.is_some())
            .count();
        if recorded > 0 {
            let _ = writeln!(
                s,
                "{recorded} of {} benchmark(s) replayed at their recorded send times (arrival_s); the streams only weigh them",
                pr.fit.len() + pr.holdout.len()
            );
        }
        if !pr.coefs.names.is_empty() {
            let head = if self.bootstrap > 0 {
                format!("95% interval (bootstrap over requests, {})", self.bootstrap)
            } else {
                "95% interval".into()
            };
            let _ = writeln!(
                s,
                "\n{:<32} {:>10} {:>10}  {head}",
                "coefficient", "base", "fit"
            );
            for (k, n) in pr.coefs.names.iter().enumerate() {
                let iv = match self.intervals[k] {
                    Some((a, b)) => format!("{}–{}", g(a), g(b)),
                    None => "–".into(),
                };
                let _ = writeln!(
                    s,
                    "{n:<32} {:>10} {:>10}  {iv}",
                    g(pr.coefs.start[k]),
                    g(self.values[k])
                );
            }
        }
        let _ = writeln!(
            s,
            "\n{:<28} {:>8} {:>6} {:<8} {:>10} {:>10} {:>8} {:>10} {:>8}",
            "benchmark", "rate/s", "n", "mean ms", "observed", "fitted", "error", "base", "error"
        );
        let rows = |s: &mut String,
                    b: &Bench,
                    base: &Means,
                    fitted: &Means,
                    tag: &str,
                    ci: Option<&Means2>| {
            let name = std::path::Path::new(&b.file)
                .file_name()
                .map(|f| f.to_string_lossy().to_string())
                .unwrap_or_else(|| b.file.clone());
            type Line<'a> = (&'a str, f64, f64, f64, Option<(f64, f64)>);
            let lines: [Line; 6] = [
                (
                    "ttft",
                    b.observed.ttft,
                    fitted.ttft,
                    base.ttft,
                    ci.map(|c| (c.lo.ttft, c.hi.ttft)),
                ),
                (
                    "ttft>med",
                    b.observed.ttft_long,
                    fitted.ttft_long,
                    base.ttft_long,
                    ci.map(|c| (c.lo.ttft_long, c.hi.ttft_long)),
                ),
                (
                    "ttft≤med",
                    b.observed.ttft_short,
                    fitted.ttft_short,
                    base.ttft_short,
                    ci.map(|c| (c.lo.ttft_short, c.hi.ttft_short)),
                ),
                (
                    "itl",
                    b.observed.itl,
                    fitted.itl,
                    base.itl,
                    ci.map(|c| (c.lo.itl, c.hi.itl)),
                ),
                (
                    "e2e",
                    b.observed.e2e,
                    fitted.e2e,
                    base.e2e,
                    ci.map(|c| (c.lo.e2e, c.hi.e2e)),
                ),
                (
                    "tpot",
                    b.observed.tpot,
                    fitted.tpot,
                    base.tpot,
                    ci.map(|c| (c.lo.tpot, c.hi.tpot)),
                ),
            ];
            for (j, (m, o, f, bs, c)) in lines.into_iter().enumerate() {
                if !o.is_finite() {
                    continue;
                }
                let (label, r, n) = if j == 0 {
                    (
                        format!("{name}{tag}"),
                        rate_s(b.rate),
                        b.reqs.len().to_string(),
                    )
                } else {
                    (String::new(), String::new(), String::new())
                };
                let extra = match c {
                    Some((a, z)) => format!("  fitted 95% {}–{}", g(a * 1e3), g(z * 1e3)),
                    None => String::new(),
                };
                let _ = writeln!(
                    s,
                    "{label:<28} {r:>8} {n:>6} {m:<8} {:>10} {:>10} {:>8} {:>10} {:>8}{extra}",
                    g(o * 1e3),
                    g(f * 1e3),
                    pct(f, o),
                    g(bs * 1e3),
                    pct(bs, o)
                );
            }
        };
        for (i, b) in pr.fit.iter().enumerate() {
            rows(&mut s, b, &self.base_fit[i], &self.fitted_fit[i], "", None);
        }
        for (i, b) in pr.holdout.iter().enumerate() {
            rows(
                &mut s,
                b,
                &self.base_holdout[i],
                &self.fitted_holdout[i],
                " (held out)",
                self.holdout_ci[i].as_ref(),
            );
        }
        let sci = match self.saturation_ci {
            Some((a, b)) => format!(" (95% {}–{})", g(a), g(b)),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "\nsaturation (requests/s the profile sustains with this length mix): fitted {}{sci}, base {}",
            g(self.saturation),
            g(self.saturation_base)
        );
        s
    }

    pub fn json(&self, pr: &Problem) -> Value {
        let ms = |v: f64| {
            if v.is_finite() {
                json!(v * 1e3)
            } else {
                Value::Null
            }
        };
        let m = |x: &Means| {
            json!({"ttft_ms": ms(x.ttft), "itl_ms": ms(x.itl), "e2e_ms": ms(x.e2e),
            "tpot_ms": ms(x.tpot), "ttft_long_prompts_ms": ms(x.ttft_long), "ttft_short_prompts_ms": ms(x.ttft_short)})
        };
        let bench = |b: &Bench, base: &Means, f: &Means| {
            json!({"file": b.file, "request_rate": if b.rate.is_finite() { json!(b.rate) } else { json!("inf") },
                "requests": b.reqs.len(), "arrivals": if b.arrivals.is_some() { "recorded" } else { "poisson" },
                "observed": m(&b.observed), "fitted": m(f), "base": m(base)})
        };
        json!({
            "coefficients": pr.coefs.names.iter().enumerate().map(|(k, n)| json!({
                "name": n, "base": pr.coefs.start[k], "fit": self.values[k],
                "ci95": self.intervals[k].map(|(a, b)| json!([a, b])),
            })).collect::<Vec<_>>(),
            "objective": self.loss,
            "evaluations": self.evals,
            "reps": pr.reps,
            "bootstrap": self.bootstrap,
            "fit": pr.fit.iter().enumerate().map(|(i, b)| bench(b, &self.base_fit[i], &self.fitted_fit[i])).collect::<Vec<_>>(),
            "holdout": pr.holdout.iter().enumerate().map(|(i, b)| {
                let mut v = bench(b, &self.base_holdout[i], &self.fitted_holdout[i]);
                if let Some(c) = &self.holdout_ci[i] {
                    v["fitted_ci95"] = json!({"lo": m(&c.lo), "hi": m(&c.hi)});
                }
                v
            }).collect::<Vec<_>>(),
            "saturation_rps": {"fitted": self.saturation, "base": self.saturation_base,
                "ci95": self.saturation_ci.map(|(a, b)| json!([a, b]))},
        })
    }
}

/// The base profile's text with the fitted values written in place (a
/// coefficient absent from its section is added under the section's
/// header), and a header comment saying where it comes from.
pub fn fitted_toml(
    text: &str,
    names: &[String],
    values: &[f64],
    name: &str,
    comment: &str,
) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for (n, v) in names.iter().zip(values) {
        let (sect, key) = match n.rsplit_once('.') {
            Some((s, k)) => (s.to_string(), k.to_string()),
            None => (String::new(), n.clone()),
        };
        let mut cur = String::new();
        let mut header_at = None;
        let mut done = false;
        for (i, line) in lines.iter_mut().enumerate() {
            let t = line.trim().to_string();
            if t.starts_with('[') {
                cur = t.trim_matches(|c| c == '[' || c == ']').trim().to_string();
                if cur == sect {
                    header_at = Some(i);
                }
                continue;
            }
            if cur == sect {
                if let Some((k, _)) = t.split_once('=') {
                    if k.trim() == key {
                        *line = format!("{key} = {v:.6}  # fitted");
                        done = true;
                        break;
                    }
                }
            }
        }
        if !done {
            let at = header_at.map(|h| h + 1).unwrap_or(0);
            lines.insert(at, format!("{key} = {v:.6}  # fitted"));
        }
    }
    for l in lines.iter_mut() {
        if l.trim_start().starts_with("name")
            && l.split_once('=').is_some_and(|(k, _)| k.trim() == "name")
        {
            *l = format!("name = {name:?}");
            break;
        }
    }
    let mut out = String::new();
    for c in comment.lines() {
        let _ = writeln!(out, "# {c}");
    }
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    out
}

/// Independent observed means a benchmark gives the fit: mean TTFT, ITL
/// and E2E, and with per-request arrays the split of TTFT between long and
/// short prompts (one more: the two halves average to the mean TTFT).
pub fn data_points(b: &Bench) -> usize {
    3 + usize::from(b.observed.ttft_long.is_finite() && b.observed.ttft_short.is_finite())
}

/// Refuse to fit more coefficients than the benchmarks have independent
/// observed means: the fit would be underdetermined, any of a family of
/// values fitting as well, and the one reported an accident of the search.
pub fn check_determined(
    names: &[String],
    from_flag: bool,
    fit: &[Bench],
) -> Result<(), ConfigError> {
    let points: usize = fit.iter().map(data_points).sum();
    if names.len() <= points {
        return Ok(());
    }
    Err(field_err(
        "--fit",
        "",
        format!(
            "{} coefficients{} to fit to {points} independent observed means ({} benchmark file(s): mean TTFT, ITL and E2E each, and the long/short-prompt TTFT split where the file has per-request arrays): the fit is underdetermined; give benchmarks at more request rates, or fit fewer coefficients with --fit",
            names.len(),
            if from_flag { "" } else { " (the default --fit)" },
            fit.len()
        ),
    ))
}

pub fn run_cli(a: ServerArgs) -> Result<(), CliError> {
    let base_file = a.profile.display().to_string();
    if let Some(out) = &a.out {
        crate::output::check_target(out, a.force)?;
    }
    let base = read_toml(&a.profile)?;
    let names: Vec<String> = match &a.fit {
        None => DEFAULT_FIT.iter().map(|s| s.to_string()).collect(),
        Some(v) if v.len() == 1 && v[0] == "none" => Vec::new(),
        Some(v) => {
            if v.iter().any(|n| n.trim().is_empty()) {
                return Err(field_err("--fit", "--fit", "an empty coefficient name").into());
            }
            v.iter().map(|n| n.trim().to_string()).collect()
        }
    };
    let coefs = Coefs::new(&base_file, base, &names)?;
    let fit = a
        .bench
        .iter()
        .map(|p| read_bench(p).map(|b| keep_arrivals(b, a.recorded_arrivals)))
        .collect::<Result<Vec<_>, _>>()?;
    let holdout = a
        .holdout
        .iter()
        .map(|p| read_bench(p).map(|b| keep_arrivals(b, a.recorded_arrivals)))
        .collect::<Result<Vec<_>, _>>()?;
    check_determined(&coefs.names, a.fit.is_some(), &fit)?;
    let pr = Problem {
        coefs,
        fit,
        holdout,
        reps: a.reps,
        seed: a.seed,
    };
    let f = pr.run(a.max_evals, a.bootstrap)?;
    if let Some(out) = &a.out {
        let base_name = pr
            .coefs
            .base
            .get("name")
            .and_then(|n| n.as_str())
            .unwrap_or("server")
            .to_string();
        let name = a.name.clone().unwrap_or(format!("{base_name}-calibrated"));
        let text = qsim_sim::input::read_text(&a.profile, qsim_sim::input::Kind::Config)
            .map_err(|e| field_err(&base_file, "", e))?;
        let files: Vec<String> = pr.fit.iter().map(|b| b.file.clone()).collect();
        let mut comment = format!(
            "Fitted by `qsim calibrate server --profile {base_file}` to {}.\nObjective Σ ln(sim/obs)²/σ² over mean TTFT, ITL, E2E: {:.5}; saturation {} req/s.",
            files.join(", "),
            f.loss,
            g(f.saturation)
        );
        for (k, n) in pr.coefs.names.iter().enumerate() {
            let iv = f.intervals[k]
                .map(|(a, b)| format!(" (95 % {}–{})", g(a), g(b)))
                .unwrap_or_default();
            let _ = write!(
                comment,
                "\n{n}: base {} → {}{iv}",
                g(pr.coefs.start[k]),
                g(f.values[k])
            );
        }
        let toml = fitted_toml(&text, &pr.coefs.names, &f.values, &name, &comment);
        let v = qsim_sim::config::parse_toml("fitted profile", &toml)?;
        ServerProfile::from_value("fitted profile", v)?;
        crate::output::write_file(out, &toml, a.force)?;
    }
    let text = match a.format {
        Format::Json => format!(
            "{}\n",
            serde_json::to_string_pretty(&f.json(&pr)).unwrap_or_default()
        ),
        _ => f.table(&pr, &base_file),
    };
    crate::output::write_stdout(&text)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nelder_mead_finds_a_quadratic_minimum() {
        let mut f =
            |x: &[f64]| (x[0] - 1.0).powi(2) + 3.0 * (x[1] + 0.5).powi(2) + 0.5 * x[0] * x[1];
        let (x, y, _) = nelder_mead(&mut f, &[0.0, 0.0], 0.3, 500, 1e-12, 1e-8);
        // ∇ = 0: 2(x−1) + 0.5y = 0, 6(y+0.5) + 0.5x = 0
        let det = 2.0 * 6.0 - 0.25;
        let xs = (2.0 * 6.0 + 0.5 * 3.0) / det;
        let ys = (2.0 * -3.0 - 0.5 * 2.0) / det;
        assert!(
            (x[0] - xs).abs() < 1e-3 && (x[1] - ys).abs() < 1e-3,
            "{x:?} vs {xs} {ys}"
        );
        assert!(y.is_finite());
    }

    #[test]
    fn fitted_toml_rewrites_values_in_their_section() {
        let t = "kind = \"server\"\nname = \"a\"\n[scheduler]\nx = 1\n[iteration]\nbandwidth_efficiency = 0.67\ncpu_overhead_ms = 0.8\n";
        let out = fitted_toml(
            t,
            &[
                "iteration.bandwidth_efficiency".into(),
                "iteration.gpu_fixed_ms".into(),
            ],
            &[0.5, 0.25],
            "b",
            "hi",
        );
        let v: toml::Value = toml::from_str(&out).unwrap();
        assert_eq!(v["iteration"]["bandwidth_efficiency"].as_float(), Some(0.5));
        assert_eq!(v["iteration"]["gpu_fixed_ms"].as_float(), Some(0.25));
        assert_eq!(v["iteration"]["cpu_overhead_ms"].as_float(), Some(0.8));
        assert_eq!(v["name"].as_str(), Some("b"));
        assert!(out.starts_with("# hi\n"));
    }
}
