//! Distributions used by profiles and workloads, configured in TOML as
//! `{ dist = "lognormal", p50 = 1.8, p95 = 3.2 }` and friends.

use super::rng::{unit, Rng};
use crate::time::{show, MAX_SECS};
use serde::{Deserialize, Serialize};

/// The largest value a distribution may have or draw: 1e9 (the longest
/// duration, [`MAX_SECS`] ≈ 31 years, and far above any token count).
/// Parameters above it are refused, and every draw is clamped to it, so a
/// drawn duration always fits the nanosecond clock.
pub const MAX_VALUE: f64 = MAX_SECS;

/// The largest coefficient of variation of a gamma distribution (shape
/// 1e-4): beyond it nearly every draw is 0 and the rest are enormous.
pub const MAX_CV: f64 = 100.0;

const Z95: f64 = 1.644_853_626_951_472_2;

/// A distribution as written in a file. Validated into [`Dist`].
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(tag = "dist", rename_all = "lowercase", deny_unknown_fields)]
pub enum RawDist {
    /// Always `value`.
    Const { value: f64 },
    /// Uniform on [min, max).
    Uniform { min: f64, max: f64 },
    /// Exponential with the given mean.
    Exp {
        mean: f64,
        #[serde(default)]
        max: Option<f64>,
    },
    /// Log-normal given by its median and 95th percentile.
    Lognormal {
        p50: f64,
        p95: f64,
        #[serde(default)]
        min: Option<f64>,
        #[serde(default)]
        max: Option<f64>,
    },
    /// Normal, clamped to [min, max] (min defaults to 0). Its mean must be
    /// at least 3 sd, so fewer than 0.14 % of draws would be negative: a
    /// wider normal describes no time or count (use lognormal or gamma).
    Normal {
        mean: f64,
        sd: f64,
        #[serde(default)]
        min: Option<f64>,
        #[serde(default)]
        max: Option<f64>,
    },
    /// Gamma given by mean and coefficient of variation (cv=1 is exponential).
    Gamma {
        mean: f64,
        cv: f64,
        #[serde(default)]
        max: Option<f64>,
    },
}

/// A validated distribution.
#[derive(Debug, Clone, PartialEq)]
pub enum Dist {
    Const(f64),
    Uniform { lo: f64, width: f64 },
    Exp { mean: f64 },
    LogNormal { mu: f64, sigma: f64 },
    Normal { mean: f64, sd: f64 },
    Gamma { shape: f64, scale: f64 },
}

/// A distribution plus optional clamping bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampler {
    pub dist: Dist,
    pub min: f64,
    pub max: f64,
}

/// `v` in `[0, MAX_VALUE]` (or `(0, MAX_VALUE]`), with a message naming
/// the parameter and the range.
fn in_range(name: &str, v: f64, positive: bool) -> Result<f64, String> {
    let ok = v.is_finite() && v <= MAX_VALUE && if positive { v > 0.0 } else { v >= 0.0 };
    if ok {
        Ok(v)
    } else {
        let lo = if positive { "(0" } else { "[0" };
        Err(format!(
            "`{name}` must be a number in {lo}, 1e9], got {}",
            show(v)
        ))
    }
}
fn positive(name: &str, v: f64) -> Result<f64, String> {
    in_range(name, v, true)
}
fn non_negative(name: &str, v: f64) -> Result<f64, String> {
    in_range(name, v, false)
}

impl RawDist {
    /// Validate. Every distribution here describes a non-negative quantity
    /// (a time or a count), so negative parameters are rejected.
    pub fn validate(&self) -> Result<Sampler, String> {
        let (dist, min, max) = match *self {
            RawDist::Const { value } => (Dist::Const(non_negative("value", value)?), None, None),
            RawDist::Uniform { min, max } => {
                non_negative("min", min)?;
                non_negative("max", max)?;
                if max < min {
                    return Err(format!("`max` ({max}) must be >= `min` ({min})"));
                }
                (
                    Dist::Uniform {
                        lo: min,
                        width: max - min,
                    },
                    None,
                    None,
                )
            }
            RawDist::Exp { mean, max } => (
                Dist::Exp {
                    mean: positive("mean", mean)?,
                },
                None,
                max,
            ),
            RawDist::Lognormal { p50, p95, min, max } => {
                positive("p50", p50)?;
                positive("p95", p95)?;
                if p95 < p50 {
                    return Err(format!("`p95` ({p95}) must be >= `p50` ({p50})"));
                }
                (
                    Dist::LogNormal {
                        mu: p50.ln(),
                        sigma: (p95.ln() - p50.ln()) / Z95,
                    },
                    min,
                    max,
                )
            }
            RawDist::Normal { mean, sd, min, max } => {
                positive("mean", mean)?;
                non_negative("sd", sd)?;
                if mean < 3.0 * sd {
                    return Err(format!(
                        "a normal with `mean` {} and `sd` {} puts more than 0.14 % of its draws below 0; it needs mean >= 3 * sd (for a wider spread of a time or count use lognormal or gamma)",
                        show(mean),
                        show(sd)
                    ));
                }
                (Dist::Normal { mean, sd }, min, max)
            }
            RawDist::Gamma { mean, cv, max } => {
                positive("mean", mean)?;
                positive("cv", cv)?;
                if cv > MAX_CV {
                    return Err(format!("`cv` must be in (0, 100], got {}", show(cv)));
                }
                let shape = 1.0 / (cv * cv);
                (
                    Dist::Gamma {
                        shape,
                        scale: mean / shape,
                    },
                    None,
                    max,
                )
            }
        };
        let min = non_negative("min", min.unwrap_or(0.0))?;
        let max = match max {
            Some(m) => non_negative("max", m)?,
            None => MAX_VALUE,
        };
        if max < min {
            return Err(format!("`max` ({max}) must be >= `min` ({min})"));
        }
        Ok(Sampler { dist, min, max })
    }
}

/// A standard normal draw (Box–Muller, one value per two uniforms).
#[inline]
pub fn std_normal(rng: &mut Rng) -> f64 {
    let u1 = 1.0 - unit(rng); // (0, 1]
    let u2 = unit(rng);
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

fn gamma(rng: &mut Rng, shape: f64) -> f64 {
    // Marsaglia & Tsang (2000); boost for shape < 1.
    if shape < 1.0 {
        let u = 1.0 - unit(rng);
        return gamma(rng, shape + 1.0) * u.powf(1.0 / shape);
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = std_normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = 1.0 - unit(rng);
        if u.ln() < 0.5 * x * x + d - d * v + d * v.ln() {
            return d * v;
        }
    }
}

impl Sampler {
    pub fn constant(v: f64) -> Self {
        Sampler {
            dist: Dist::Const(v),
            min: 0.0,
            max: MAX_VALUE,
        }
    }

    /// Draw one value (clamped to [min, max]; max is at most [`MAX_VALUE`]
    /// after validation).
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> f64 {
        let v = match self.dist {
            Dist::Const(v) => v,
            Dist::Uniform { lo, width } => lo + width * unit(rng),
            Dist::Exp { mean } => -mean * (1.0 - unit(rng)).ln(),
            Dist::LogNormal { mu, sigma } => (mu + sigma * std_normal(rng)).exp(),
            Dist::Normal { mean, sd } => mean + sd * std_normal(rng),
            Dist::Gamma { shape, scale } => gamma(rng, shape) * scale,
        };
        v.clamp(self.min, self.max)
    }

    /// The mean of the unclamped distribution.
    pub fn mean(&self) -> f64 {
        match self.dist {
            Dist::Const(v) => v,
            Dist::Uniform { lo, width } => lo + width / 2.0,
            Dist::Exp { mean } => mean,
            Dist::LogNormal { mu, sigma } => (mu + sigma * sigma / 2.0).exp(),
            Dist::Normal { mean, .. } => mean,
            Dist::Gamma { shape, scale } => shape * scale,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng::stream;

    fn parse(s: &str) -> Result<RawDist, toml::de::Error> {
        #[derive(Deserialize)]
        struct W {
            d: RawDist,
        }
        toml::from_str::<W>(&format!("d = {s}")).map(|w| w.d)
    }

    #[test]
    fn lognormal_quantiles_match() {
        let s = parse("{ dist = \"lognormal\", p50 = 2.0, p95 = 5.0 }")
            .unwrap()
            .validate()
            .unwrap();
        let mut rng = stream(1, 0, 0);
        let mut v: Vec<f64> = (0..200_000).map(|_| s.sample(&mut rng)).collect();
        v.sort_by(f64::total_cmp);
        let p50 = v[100_000];
        let p95 = v[190_000];
        assert!((p50 - 2.0).abs() < 0.03, "p50 {p50}");
        assert!((p95 - 5.0).abs() < 0.1, "p95 {p95}");
    }

    #[test]
    fn gamma_and_exp_means() {
        let mut rng = stream(2, 0, 0);
        for (txt, mean) in [
            ("{ dist = \"gamma\", mean = 3.0, cv = 2.0 }", 3.0),
            ("{ dist = \"gamma\", mean = 3.0, cv = 0.5 }", 3.0),
            ("{ dist = \"exp\", mean = 0.5 }", 0.5),
        ] {
            let s = parse(txt).unwrap().validate().unwrap();
            let n = 400_000;
            let m: f64 = (0..n).map(|_| s.sample(&mut rng)).sum::<f64>() / n as f64;
            assert!((m - mean).abs() / mean < 0.02, "{txt}: mean {m}");
        }
    }

    #[test]
    fn rejects_bad_parameters() {
        assert!(parse("{ dist = \"lognormal\", p50 = 2.0, p95 = 1.0 }")
            .unwrap()
            .validate()
            .is_err());
        assert!(parse("{ dist = \"exp\", mean = -1 }")
            .unwrap()
            .validate()
            .is_err());
        assert!(parse("{ dist = \"const\", value = 1, extra = 2 }").is_err());
        assert!(parse("{ dist = \"weibull\", k = 1 }").is_err());
    }

    #[test]
    fn refuses_values_beyond_the_clock_and_negative_support() {
        for (txt, needle) in [
            ("{ dist = \"lognormal\", p50 = 1e10, p95 = 2e10 }", "`p50`"),
            ("{ dist = \"const\", value = 2e10 }", "`value`"),
            ("{ dist = \"exp\", mean = 1e300 }", "1e300"),
            ("{ dist = \"normal\", mean = -5, sd = 1 }", "`mean`"),
            ("{ dist = \"normal\", mean = 1, sd = 1 }", "mean >= 3 * sd"),
            ("{ dist = \"gamma\", mean = 1, cv = 1e5 }", "`cv`"),
            ("{ dist = \"uniform\", min = 0, max = inf }", "`max`"),
            ("{ dist = \"exp\", mean = 1, max = nan }", "`max`"),
        ] {
            let e = parse(txt).unwrap().validate().unwrap_err();
            assert!(e.contains(needle), "{txt}: {e}");
        }
        // shipped shapes still pass, and draws are bounded by MAX_VALUE
        let s = parse("{ dist = \"normal\", mean = 168, sd = 30, min = 40 }")
            .unwrap()
            .validate()
            .unwrap();
        assert_eq!(s.max, MAX_VALUE);
        let s = parse("{ dist = \"gamma\", mean = 1e8, cv = 100 }")
            .unwrap()
            .validate()
            .unwrap();
        let mut rng = stream(5, 0, 0);
        assert!((0..10_000).all(|_| s.sample(&mut rng) <= MAX_VALUE));
    }
}
