//! A fleet's requests: arrival times, token counts, the model asked for
//! and (for prefix caching) the block hashes of the prompt.
//!
//! - distributions of input and output tokens (as in server experiments);
//! - a token-length CDF in vllm-sr-sim's format: a JSON array of
//!   `[total tokens, cumulative fraction]` (or `{"cdf": [...]}`), lengths
//!   increasing, fractions non-decreasing in [0, 1] and ending at 1; a
//!   request's total is uniform within its bucket (the first bucket from
//!   1), split into input `⌊total × input_share⌋` (at least 1) and output
//!   the rest (at least 1), as vllm-sr-sim's `CdfWorkload` does;
//! - a request trace (any format `qsim trace` reads);
//!
//! The model of each request is drawn by the mix's shares. Every source
//! holds one arrival ahead (no per-request storage).

use crate::config::ConfigError;
use crate::engine::rng::{component, stream, unit, Rng};
use crate::time::Nanos;
use crate::trace::{TraceSource, TraceSpec};
use crate::workload::{ArrivalProcess, Lengths, OpenLoop};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

/// A validated token-length CDF: (total tokens, cumulative fraction),
/// lengths strictly increasing, fractions non-decreasing, the last 1.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenCdf {
    pub points: Vec<(u32, f64)>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum RawCdf {
    Array(Vec<(f64, f64)>),
    Object { cdf: Vec<(f64, f64)> },
}

impl TokenCdf {
    /// Read a CDF file (bounded, see [`crate::input`]); errors name the
    /// file and the entry (`cdf[3]`).
    pub fn load(path: &Path) -> Result<TokenCdf, ConfigError> {
        let name = path.display().to_string();
        let text = crate::input::read_text(path, crate::input::Kind::Config)
            .map_err(|r| ConfigError::new(&name, "", r))?;
        Self::parse(&name, &text)
    }

    /// Parse and validate the JSON text of a CDF named `name`.
    pub fn parse(name: &str, text: &str) -> Result<TokenCdf, ConfigError> {
        let raw: RawCdf = serde_json::from_str(text).map_err(|e| {
            ConfigError::new(
                name,
                "cdf",
                format!(
                    "not a token-length CDF (a JSON array of [tokens, cumulative fraction] pairs, or {{\"cdf\": [...]}}): {e}"
                ),
            )
        })?;
        let pts = match raw {
            RawCdf::Array(v) | RawCdf::Object { cdf: v } => v,
        };
        Self::from_points(name, &pts)
    }

    /// Validate points (errors name `cdf[i]`).
    pub fn from_points(name: &str, pts: &[(f64, f64)]) -> Result<TokenCdf, ConfigError> {
        if pts.is_empty() {
            return Err(ConfigError::new(name, "cdf", "no points"));
        }
        let mut out = Vec::with_capacity(pts.len());
        let (mut prev_len, mut prev_f) = (0u32, 0.0f64);
        for (i, &(len, f)) in pts.iter().enumerate() {
            let at = format!("cdf[{i}]");
            if !((1.0..=16_777_216.0).contains(&len) && len.fract() == 0.0) {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("token length must be a whole number in 1..=16777216, got {len}"),
                ));
            }
            let len = len as u32;
            if len <= prev_len {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("token lengths must increase: {len} after {prev_len}"),
                ));
            }
            if !(f.is_finite() && (0.0..=1.0).contains(&f)) {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("cumulative fraction must be in [0, 1], got {f}"),
                ));
            }
            if f < prev_f {
                return Err(ConfigError::new(
                    name,
                    at,
                    format!("not monotone: cumulative fraction {f} after {prev_f}"),
                ));
            }
            out.push((len, f));
            (prev_len, prev_f) = (len, f);
        }
        if prev_f != 1.0 {
            return Err(ConfigError::new(
                name,
                format!("cdf[{}]", pts.len() - 1),
                format!("the cumulative fraction must reach 1, ends at {prev_f}"),
            ));
        }
        Ok(TokenCdf { points: out })
    }

    /// The longest total a draw can give: the first length whose
    /// fraction is 1.
    pub fn max_len(&self) -> u32 {
        self.points
            .iter()
            .find(|p| p.1 >= 1.0)
            .map_or(self.points[self.points.len() - 1].0, |p| p.0)
    }

    /// The shortest total a draw can give.
    pub fn min_len(&self) -> u32 {
        let mut prev = 0;
        for &(len, f) in &self.points {
            if f > 0.0 {
                return prev + 1;
            }
            prev = len;
        }
        prev
    }

    /// Fraction of requests with total ≤ `x` tokens (linear within a
    /// bucket, as the draws are uniform there).
    pub fn fraction_below(&self, x: f64) -> f64 {
        let (mut pl, mut pf) = (0.0f64, 0.0f64);
        for &(len, f) in &self.points {
            let len = len as f64;
            if x <= len {
                return pf + (f - pf) * ((x - pl) / (len - pl)).clamp(0.0, 1.0);
            }
            (pl, pf) = (len, f);
        }
        1.0
    }

    /// Mean total tokens.
    pub fn mean(&self) -> f64 {
        let (mut pl, mut pf, mut m) = (0.0f64, 0.0f64, 0.0f64);
        for &(len, f) in &self.points {
            let len = len as f64;
            // uniform integers in [pl + 1, len]
            m += (f - pf) * (pl + 1.0 + len) / 2.0;
            (pl, pf) = (len, f);
        }
        m
    }

    /// One total: the bucket by a uniform draw, then uniform within it.
    pub fn sample(&self, rng: &mut Rng) -> u32 {
        let u = unit(rng);
        let mut prev = 0u32;
        for &(len, f) in &self.points {
            if u < f {
                let span = (len - prev) as f64;
                let k = (unit(rng) * span) as u32;
                return prev + 1 + k.min(len - prev - 1);
            }
            prev = len;
        }
        prev
    }
}

/// How token counts are drawn.
#[derive(Debug, Clone, PartialEq)]
pub enum Len {
    /// Input and output distributions.
    Dists(Lengths),
    /// A CDF of totals split by the input share.
    Cdf {
        cdf: Arc<TokenCdf>,
        input_share: f64,
    },
}

impl Len {
    /// (input, output), each ≥ 1.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> (u32, u32) {
        match self {
            Len::Dists(l) => l.sample(rng),
            Len::Cdf { cdf, input_share } => split(cdf.sample(rng), *input_share),
        }
    }
}

/// A total split as vllm-sr-sim does: input ⌊total × share⌋ (≥ 1), output
/// the rest (≥ 1).
#[inline]
pub fn split(total: u32, share: f64) -> (u32, u32) {
    let input = ((total as f64 * share) as u32).max(1);
    (input, total.saturating_sub(input).max(1))
}

/// Where requests come from.
#[derive(Debug, Clone)]
pub enum Source {
    /// An arrival process with token counts drawn from `len`.
    Open { process: ArrivalProcess, len: Len },
    /// A request trace's times and token counts.
    Trace(Arc<TraceSpec>),
}

/// A validated workload.
#[derive(Debug, Clone)]
pub struct Workload {
    pub source: Source,
    /// (model index, cumulative share), shares summing to 1; one entry:
    /// every request asks for that model.
    pub mix: Vec<(u16, f64)>,
}

/// One request as the workload gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub at: Nanos,
    pub input: u32,
    pub output: u32,
    pub model: u16,
}

enum Inner {
    Open(Box<OpenLoop>),
    Trace(Box<TraceSource>),
}

/// The workload's requests in time order, one ahead.
pub struct Requests {
    inner: Inner,
    /// Token counts drawn here (a CDF), not by the open loop.
    cdf: Option<Len>,
    mix: Vec<(u16, f64)>,
    rng: Rng,
}

/// Random-stream scope of a fleet run's workload (and its first pool's
/// cluster, see [`super::Fleet::new`]).
pub const SCOPE: u64 = 0x39;

impl Requests {
    /// From time 0 until `end` (exclusive), at most `limit` requests.
    pub fn new(w: &Workload, seed: u64, end: Nanos, limit: u64) -> Result<Self, ConfigError> {
        let inner = match &w.source {
            Source::Open { process, len } => Inner::Open(Box::new(OpenLoop::new(
                process.clone(),
                match len {
                    Len::Dists(l) => l.clone(),
                    // the CDF is drawn here: the open loop's own lengths
                    // are not used (a constant it never draws from)
                    Len::Cdf { .. } => Lengths {
                        input: crate::engine::Sampler::constant(1.0),
                        output: crate::engine::Sampler::constant(1.0),
                    },
                },
                seed,
                SCOPE,
                0,
                end,
                limit,
            ))),
            Source::Trace(spec) => Inner::Trace(Box::new(TraceSource::open(spec, seed, SCOPE)?)),
        };
        Ok(Requests {
            inner,
            cdf: w.cdf_len().cloned(),
            mix: w.mix.clone(),
            rng: stream(seed, SCOPE, component::WORKLOAD),
        })
    }

    /// The next arrival's time.
    #[inline]
    pub fn peek(&self) -> Option<Nanos> {
        match &self.inner {
            Inner::Open(o) => o.peek(),
            Inner::Trace(t) => t.peek(),
        }
    }

    /// The next request.
    pub fn pop(&mut self) -> Option<Arrival> {
        let (at, mut input, mut output) = match &mut self.inner {
            Inner::Open(o) => o.pop()?,
            Inner::Trace(t) => {
                let a = t.pop()?;
                (a.at, a.input, a.output)
            }
        };
        if let Some(l) = &self.cdf {
            (input, output) = l.sample(&mut self.rng);
        }
        let model = if self.mix.len() == 1 {
            self.mix[0].0
        } else {
            let u = unit(&mut self.rng);
            self.mix
                .iter()
                .find(|m| u < m.1)
                .unwrap_or(&self.mix[self.mix.len() - 1])
                .0
        };
        Some(Arrival {
            at,
            input,
            output,
            model,
        })
    }
}

impl Workload {
    /// The CDF lengths, if the source draws from one.
    pub fn cdf_len(&self) -> Option<&Len> {
        match &self.source {
            Source::Open {
                len: l @ Len::Cdf { .. },
                ..
            } => Some(l),
            _ => None,
        }
    }

    /// The range of totals (input + output) the workload can give, when
    /// known before the run (distributions: their clamps; a CDF: its
    /// buckets; a trace: unknown).
    pub fn total_range(&self) -> Option<(u64, u64)> {
        match &self.source {
            Source::Open {
                len: Len::Cdf { cdf, .. },
                ..
            } => Some((cdf.min_len().max(2) as u64, cdf.max_len().max(2) as u64)),
            Source::Open {
                len: Len::Dists(l), ..
            } => {
                let lo = l.input.min.max(1.0) + l.output.min.max(1.0);
                let hi = l.input.max + l.output.max;
                Some((lo as u64, hi.min(u64::MAX as f64 / 2.0) as u64))
            }
            Source::Trace(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cdf_is_checked_entry_by_entry() {
        let ok = TokenCdf::parse("c.json", "[[64, 0.1], [128, 0.5], [256, 1.0]]").unwrap();
        assert_eq!(ok.points.len(), 3);
        assert_eq!((ok.min_len(), ok.max_len()), (1, 256));
        let obj = TokenCdf::parse("c.json", r#"{"cdf": [[10, 0.0], [20, 1.0]]}"#).unwrap();
        assert_eq!((obj.min_len(), obj.max_len()), (11, 20));
        let err = |t: &str| TokenCdf::parse("c.json", t).unwrap_err();
        let e = err("[[64, 0.5], [128, 0.4], [256, 1.0]]");
        assert_eq!(e.field, "cdf.1");
        assert!(e.reason.contains("not monotone"), "{}", e.reason);
        let e = err("[[64, 0.5], [128, 0.9]]");
        assert_eq!(e.field, "cdf.1");
        assert!(e.reason.contains("must reach 1"), "{}", e.reason);
        assert_eq!(err("[[64, 0.5], [64, 1.0]]").field, "cdf.1");
        assert_eq!(err("[[0, 0.5], [64, 1.0]]").field, "cdf.0");
        assert_eq!(err("[[8, 1.5]]").field, "cdf.0");
        assert_eq!(err("[]").field, "cdf");
        assert_eq!(err("{\"x\": 1}").field, "cdf");
    }

    /// Draws fall in their buckets in the CDF's proportions, uniform
    /// within (the mean as computed from the points).
    #[test]
    fn draws_follow_the_cdf() {
        let c = TokenCdf::parse("c", "[[100, 0.25], [1000, 0.75], [2000, 1.0]]").unwrap();
        let mut rng = stream(3, 0, 1);
        let n = 200_000;
        let (mut b, mut sum) = ([0u32; 3], 0f64);
        for _ in 0..n {
            let x = c.sample(&mut rng);
            assert!((1..=2000).contains(&x));
            b[if x <= 100 {
                0
            } else if x <= 1000 {
                1
            } else {
                2
            }] += 1;
            sum += x as f64;
        }
        let share = |k: usize| b[k] as f64 / n as f64;
        assert!((share(0) - 0.25).abs() < 0.005 && (share(1) - 0.5).abs() < 0.005);
        assert!((sum / n as f64 / c.mean() - 1.0).abs() < 0.01);
        assert!((c.fraction_below(550.0) - 0.5).abs() < 1e-12);
        assert_eq!(split(1000, 0.8), (800, 200));
        assert_eq!(split(1, 0.8), (1, 1));
    }
}
