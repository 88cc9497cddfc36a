//! Time-varying arrival rates (issue 22, item 2): a rate that changes over
//! the run, for every arrival process (poisson, constant, gamma).
//!
//! A shape is a multiplier `f(t) ≥ 0` of the scenario's rate, constant
//! within each minute: `per_minute` factors written out (the last one held
//! after the list ends), or a `daily` cycle (a period, by default 24 h,
//! whose trough is `1 / peak_to_trough` of the peak, the peak at half the
//! period; each minute's factor is the exact mean of the cosine over that
//! minute, so the one approximation is the rate being constant within a
//! minute).
//!
//! **Time rescaling.** The arrival process runs unchanged in *operational
//! time* `u = Λ(t) = ∫₀ᵗ f(s) ds`; an arrival at operational time `u`
//! happens at real time `Λ⁻¹(u)`. `Λ` is piecewise linear, so `Λ⁻¹` is a
//! binary search over the minutes' cumulative sums (O(log minutes) per
//! arrival, no draws added: the random stream is the one the process would
//! use at a constant rate, so the run stays deterministic). The number of
//! arrivals in a window `[a, b)` is the number of operational arrivals in
//! `[Λ(a), Λ(b))`: for a constant process exactly `rate·(Λ(b) − Λ(a))`
//! up to one, for poisson a Poisson count of that mean, for gamma a renewal
//! count of that mean. Operational times are kept as f64 nanoseconds
//! (exact to ~2 ns up to 10⁷ s); real times are rounded to the nanosecond
//! and never decrease.

use crate::time::{Nanos, NEVER};
use serde::Deserialize;

const MINUTE_NS: f64 = 60e9;
/// At most a year of minutes in one shape.
const MAX_MINUTES: usize = 525_600;

/// A rate shape as written in a file:
/// `{ kind = "per_minute", factors = [1, 1, 4, 4, 1] }` or
/// `{ kind = "daily", peak_to_trough = 4, period_s = 86400 }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum RawShape {
    PerMinute {
        factors: Vec<f64>,
    },
    Daily {
        peak_to_trough: f64,
        period_s: Option<f64>,
    },
}

/// A validated shape: one factor per minute and their cumulative sums
/// (operational nanoseconds at the start of each minute).
#[derive(Debug, Clone, PartialEq)]
pub struct RateShape {
    pub kind: &'static str,
    factors: Vec<f64>,
    /// `cum[k]` = Σ_{j<k} factors[j] · 60 s, in ns; `cum.len() == factors.len() + 1`.
    cum: Vec<f64>,
    /// Daily: the factors repeat; per_minute: the last factor is held.
    repeat: bool,
}

impl RateShape {
    /// Validate; errors are reasons (the caller names the field).
    pub fn new(raw: &RawShape) -> Result<Self, String> {
        let (kind, factors, repeat) = match raw {
            RawShape::PerMinute { factors } => {
                if factors.is_empty() || factors.len() > MAX_MINUTES {
                    return Err(format!(
                        "factors must have 1 to {MAX_MINUTES} entries, got {}",
                        factors.len()
                    ));
                }
                if let Some((i, f)) = factors
                    .iter()
                    .enumerate()
                    .find(|(_, f)| !(f.is_finite() && (0.0..=1e6).contains(*f)))
                {
                    return Err(format!("factors[{i}] must be in [0, 1e6], got {f}"));
                }
                if factors.iter().all(|&f| f == 0.0) {
                    return Err("factors must not all be 0".into());
                }
                ("per_minute", factors.clone(), false)
            }
            RawShape::Daily {
                peak_to_trough,
                period_s,
            } => {
                let r = *peak_to_trough;
                if !(r.is_finite() && (1.0..=1e6).contains(&r)) {
                    return Err(format!("peak_to_trough must be in [1, 1e6], got {r}"));
                }
                let p = period_s.unwrap_or(86_400.0);
                let n = p / 60.0;
                if !(p.is_finite() && n >= 1.0 && n.fract() == 0.0 && n as usize <= MAX_MINUTES) {
                    return Err(format!(
                        "period_s must be a whole number of minutes from 60 to {} s, got {p}",
                        MAX_MINUTES * 60
                    ));
                }
                let n = n as usize;
                let trough = 1.0 / r;
                // f(x) = trough + (1 − trough)·(1 − cos 2πx)/2, x = t / period;
                // the mean over [k/n, (k+1)/n] integrates the cosine exactly
                let w = std::f64::consts::TAU;
                let factors = (0..n)
                    .map(|k| {
                        let (a, b) = (k as f64 / n as f64, (k + 1) as f64 / n as f64);
                        let mean_cos = ((w * b).sin() - (w * a).sin()) / (w * (b - a));
                        trough + (1.0 - trough) * (1.0 - mean_cos) / 2.0
                    })
                    .collect();
                ("daily", factors, true)
            }
        };
        let mut cum = Vec::with_capacity(factors.len() + 1);
        let mut c = 0.0;
        cum.push(c);
        for f in &factors {
            c += f * MINUTE_NS;
            cum.push(c);
        }
        Ok(RateShape {
            kind,
            factors,
            cum,
            repeat,
        })
    }

    /// The factor in force at real time `t`.
    pub fn factor_at(&self, t: Nanos) -> f64 {
        let n = self.factors.len();
        let m = (t as f64 / MINUTE_NS).floor() as u64;
        let k = if self.repeat {
            (m % n as u64) as usize
        } else {
            (m as usize).min(n - 1)
        };
        self.factors[k]
    }

    /// Λ(t) = ∫₀ᵗ f(s) ds, in operational nanoseconds.
    pub fn operational(&self, t: Nanos) -> f64 {
        let n = self.factors.len();
        let period = n as f64 * MINUTE_NS;
        let (cycles, rest) = if self.repeat {
            let c = (t as f64 / period).floor();
            (c, t as f64 - c * period)
        } else {
            (0.0, t as f64)
        };
        // past the list (per_minute) the last factor holds
        let k = ((rest / MINUTE_NS).floor() as usize).min(n - 1);
        cycles * self.cum[n] + self.cum[k] + (rest - k as f64 * MINUTE_NS) * self.factors[k]
    }

    /// Λ⁻¹(u): the real time at operational time `u` (NEVER if the rate is
    /// 0 from some time on and `u` lies beyond it).
    pub fn real(&self, u: f64) -> Nanos {
        let n = self.factors.len();
        let total = self.cum[n];
        let (base, rest) = if self.repeat {
            let c = (u / total).floor();
            (c * n as f64 * MINUTE_NS, (u - c * total).clamp(0.0, total))
        } else if u >= total {
            let f = self.factors[n - 1];
            if f == 0.0 {
                return NEVER;
            }
            let t = n as f64 * MINUTE_NS + (u - total) / f;
            return to_nanos(t);
        } else {
            (0.0, u)
        };
        // the largest k < n with cum[k] <= rest: its factor is positive
        // (a zero factor's successor has the same sum)
        let k = self.cum[..n].partition_point(|&c| c <= rest).max(1) - 1;
        let f = self.factors[k];
        let within = if f > 0.0 {
            ((rest - self.cum[k]) / f).min(MINUTE_NS)
        } else {
            0.0
        };
        to_nanos(base + k as f64 * MINUTE_NS + within)
    }
}

fn to_nanos(t: f64) -> Nanos {
    if t.is_finite() && t < NEVER as f64 {
        t.round() as Nanos
    } else {
        NEVER
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Sampler;
    use crate::workload::{ArrivalProcess, Lengths, OpenLoop, RawArrivals};

    fn lengths() -> Lengths {
        Lengths {
            input: Sampler::constant(10.0),
            output: Sampler::constant(5.0),
        }
    }

    /// Arrivals per minute over `minutes` minutes.
    fn per_minute(
        raw: RawArrivals,
        rpm: f64,
        shape: &RawShape,
        seed: u64,
        minutes: u64,
    ) -> Vec<u64> {
        let p = ArrivalProcess::new(&raw, rpm / 60.0)
            .unwrap()
            .with_shape(RateShape::new(shape).unwrap());
        let end = minutes * 60_000_000_000;
        let mut src = OpenLoop::new(p, lengths(), seed, 0, 0, end, u64::MAX);
        let mut counts = vec![0u64; minutes as usize];
        let mut prev = 0;
        while let Some((t, _, _)) = src.pop() {
            assert!(t >= prev && t < end);
            prev = t;
            counts[(t / 60_000_000_000) as usize] += 1;
        }
        counts
    }

    #[test]
    fn operational_time_inverts() {
        for raw in [
            RawShape::PerMinute {
                factors: vec![1.0, 0.0, 0.0, 3.0, 0.5],
            },
            RawShape::Daily {
                peak_to_trough: 5.0,
                period_s: Some(600.0),
            },
        ] {
            let s = RateShape::new(&raw).unwrap();
            for t in (0..40u64).map(|i| i * 37_000_000_000 + 12_345) {
                let u = s.operational(t);
                let back = s.real(u);
                // a time in zero-rate minutes maps to where the rate turns
                // positive again; elsewhere back to itself within 2 ns
                if s.factor_at(t) > 0.0 {
                    assert!(back.abs_diff(t) <= 2, "{raw:?} {t} {back}");
                } else {
                    assert!(back >= t && s.factor_at(back) > 0.0, "{raw:?} {t} {back}");
                }
            }
        }
        let zero_tail = RateShape::new(&RawShape::PerMinute {
            factors: vec![1.0, 0.0],
        })
        .unwrap();
        assert_eq!(zero_tail.real(61e9), NEVER);
    }

    #[test]
    fn daily_factors_span_trough_to_peak_with_mean_midway() {
        let s = RateShape::new(&RawShape::Daily {
            peak_to_trough: 4.0,
            period_s: None,
        })
        .unwrap();
        assert_eq!(s.factors.len(), 1440);
        let (lo, hi) = s
            .factors
            .iter()
            .fold((f64::MAX, 0.0f64), |(a, b), &f| (a.min(f), b.max(f)));
        assert!(
            (lo - 0.25).abs() < 1e-4 && (hi - 1.0).abs() < 1e-4,
            "{lo} {hi}"
        );
        // the integral over a day: trough + (1 − trough)/2 = 0.625 of the peak
        let mean = s.cum[1440] / (1440.0 * MINUTE_NS);
        assert!((mean - 0.625).abs() < 1e-12, "{mean}");
    }

    #[test]
    fn constant_arrivals_count_the_integral_of_the_rate_exactly() {
        // 600 rpm × factors: the count in each minute is 600·f up to one
        // (the phase of the first arrival)
        let shape = RawShape::PerMinute {
            factors: vec![1.0, 0.5, 2.0, 0.0, 0.25, 3.0],
        };
        let c = per_minute(RawArrivals::Constant, 600.0, &shape, 1, 8);
        let want = [600.0, 300.0, 1200.0, 0.0, 150.0, 1800.0, 1800.0, 1800.0];
        for (m, (&got, &w)) in c.iter().zip(&want).enumerate() {
            assert!((got as f64 - w).abs() <= 1.0, "minute {m}: {got} vs {w}");
        }
        // cumulative counts: at most one off the integral at every minute
        let (mut got, mut w) = (0.0, 0.0);
        for (g, x) in c.iter().zip(&want) {
            got += *g as f64;
            w += x;
            assert!((got - w).abs() <= 1.0, "{got} {w}");
        }
    }

    #[test]
    fn poisson_and_gamma_counts_follow_the_daily_cycle() {
        // a 2-hour cycle, 4:1, peak 1200 rpm, 3 cycles, three seeds each:
        // every 10-minute window's count is within 5 standard deviations
        // of the integral (sd = √λ for poisson, cv·√λ for a gamma renewal
        // process), and the total within 3 standard deviations
        let shape = RawShape::Daily {
            peak_to_trough: 4.0,
            period_s: Some(7200.0),
        };
        let s = RateShape::new(&shape).unwrap();
        for (raw, cv) in [
            (RawArrivals::Poisson, 1.0),
            (RawArrivals::Gamma { cv: 2.0 }, 2.0),
        ] {
            for seed in 1..=3 {
                let c = per_minute(raw.clone(), 1200.0, &shape, seed, 360);
                let (mut tot, mut tot_want) = (0.0, 0.0);
                for w in 0..36u64 {
                    let got: u64 = c[(w * 10) as usize..(w * 10 + 10) as usize].iter().sum();
                    let (a, b) = (w * 600_000_000_000, (w + 1) * 600_000_000_000);
                    let lam = 20.0 * (s.operational(b) - s.operational(a)) / 1e9;
                    let sd = cv * lam.sqrt();
                    assert!(
                        (got as f64 - lam).abs() <= 5.0 * sd,
                        "{raw:?} seed {seed} window {w}: {got} vs {lam}"
                    );
                    tot += got as f64;
                    tot_want += lam;
                }
                // 3 cycles × 2 h × 60 × 1200 × 0.625 = 270,000
                assert!((tot_want - 270_000.0).abs() < 1e-3, "{tot_want}");
                assert!(
                    (tot - tot_want).abs() <= 3.0 * cv * tot_want.sqrt(),
                    "{raw:?} seed {seed}: {tot} vs {tot_want}"
                );
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        for raw in [
            RawShape::PerMinute { factors: vec![] },
            RawShape::PerMinute {
                factors: vec![0.0, 0.0],
            },
            RawShape::PerMinute {
                factors: vec![1.0, f64::NAN],
            },
            RawShape::PerMinute {
                factors: vec![-1.0],
            },
            RawShape::Daily {
                peak_to_trough: 0.5,
                period_s: None,
            },
            RawShape::Daily {
                peak_to_trough: f64::NAN,
                period_s: None,
            },
            RawShape::Daily {
                peak_to_trough: 2.0,
                period_s: Some(90.0),
            },
            RawShape::Daily {
                peak_to_trough: 2.0,
                period_s: Some(0.0),
            },
        ] {
            assert!(RateShape::new(&raw).is_err(), "{raw:?}");
        }
    }
}
