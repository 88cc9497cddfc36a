//! A benchmark replayed in the simulator: its requests on one replica of
//! a profile ([`Cluster`], the model `qsim serve` and `qsim run` use), as
//! Poisson streams at its rate or at its recorded send times; the means it
//! predicts, and the profile's saturation rate for a length mix.

use super::bench::{Bench, Means};
use crate::engine::rng::{component, stream, unit};
use crate::server::{Cluster, Request, RouterKind, ServerProfile};
use rayon::prelude::*;
use std::sync::Arc;

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

pub(crate) fn means_of(a: &[f64; 9]) -> Means {
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
