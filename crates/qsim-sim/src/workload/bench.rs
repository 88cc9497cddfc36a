//! The benchmark workload of `qsim calibrate bench` and `qsim load
//! --token-ids` (vLLM's `benchmark_serving.py` "random" dataset): lengths,
//! Poisson arrival times and prompt token ids from seeded ChaCha streams.

use crate::config::ConfigError;
use crate::engine::rng::{component, stream, unit};

/// A token count flag's value: `N` or `LO..HI` (inclusive, each ≥ 1).
pub fn range(flag: &str, s: &str) -> Result<(u32, u32), ConfigError> {
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
