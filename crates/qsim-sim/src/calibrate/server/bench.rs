//! Benchmark result files: the JSON of vLLM's `benchmark_serving.py
//! --save-result` (or `vllm bench serve --save-result`), one per request
//! rate, and the same format as `qsim calibrate bench` writes it (which
//! adds `arrival_s`, each request's send time). See the [module
//! docs](super) for the fields read and their limits.

use crate::config::ConfigError;
use serde_json::Value;

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
pub(crate) struct Obs {
    pub(crate) ttft: f64,
    pub(crate) long: bool,
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
    pub(crate) per_request: Option<Vec<Obs>>,
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

pub(crate) fn field_err(file: &str, field: &str, reason: impl Into<String>) -> ConfigError {
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
    let text = crate::input::read_text(path, crate::input::Kind::Data)
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
pub(crate) fn split_ttft<'a>(obs: impl Iterator<Item = &'a Obs>) -> (f64, f64) {
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
