//! Workloads: open-loop arrival processes and closed-loop clients, with
//! input/output length distributions. Generation is lazy: a source holds
//! only its next arrival.

use crate::config::ConfigError;
use crate::engine::rng::{component, stream, unit, Rng};
use crate::engine::{RawDist, Sampler};
use crate::time::{secs, show, Nanos, MAX_SECS, NEVER};
use serde::Deserialize;
use std::sync::Arc;

pub mod bench;
pub mod rate;
pub use rate::{RateShape, RawShape};

/// An arrival process as written in a file:
/// `{ process = "poisson" }`, `{ process = "constant" }`, `{ process = "gamma", cv = 3 }`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(tag = "process", rename_all = "lowercase", deny_unknown_fields)]
pub enum RawArrivals {
    Poisson,
    Constant,
    Gamma { cv: f64 },
}

/// Inter-arrival times of an open-loop source.
#[derive(Debug, Clone, PartialEq)]
pub struct ArrivalProcess {
    pub kind: &'static str,
    /// Mean requests per second.
    pub rate: f64,
    /// Coefficient of variation of the gaps (poisson 1, constant 0).
    pub cv: f64,
    gap: Sampler,
    /// A rate that changes over the run (`rate` is then the rate at factor
    /// 1): the process runs in operational time (see [`rate`]).
    pub shape: Option<Arc<RateShape>>,
}

impl ArrivalProcess {
    /// `rate` requests per second with the given process: in
    /// [1e-9, 1e9] per second, so the mean gap is between 1 ns and 1e9 s
    /// (the longest duration) and every gap fits the clock.
    pub fn new(raw: &RawArrivals, rate: f64) -> Result<Self, String> {
        if !(rate.is_finite() && (1.0 / MAX_SECS..=1e9).contains(&rate)) {
            return Err(format!(
                "rate must be in [1e-9, 1e9] requests per second (a mean gap of 1 ns to 1e9 s), got {} per second",
                show(rate)
            ));
        }
        let mean = 1.0 / rate;
        let (kind, cv, d) = match raw {
            RawArrivals::Poisson => ("poisson", 1.0, RawDist::Exp { mean, max: None }),
            RawArrivals::Constant => ("constant", 0.0, RawDist::Const { value: mean }),
            RawArrivals::Gamma { cv } => (
                "gamma",
                *cv,
                RawDist::Gamma {
                    mean,
                    cv: *cv,
                    max: None,
                },
            ),
        };
        Ok(ArrivalProcess {
            kind,
            rate,
            cv,
            gap: d.validate()?,
            shape: None,
        })
    }

    /// The same process with its rate multiplied by `shape` over time.
    pub fn with_shape(mut self, shape: RateShape) -> Self {
        self.shape = Some(Arc::new(shape));
        self
    }

    #[inline]
    pub fn next_gap(&self, rng: &mut Rng) -> Nanos {
        secs(self.gap.sample(rng))
    }
}

/// Input/output token lengths of requests.
#[derive(Debug, Clone, PartialEq)]
pub struct Lengths {
    pub input: Sampler,
    pub output: Sampler,
}

impl Lengths {
    /// Validate `input_tokens` / `output_tokens` distributions; errors name
    /// the field as `{at}input_tokens` (pass `at = "scenario[2]."` for a
    /// nested table, `""` at top level).
    pub fn from_raw(
        file: &str,
        at: &str,
        input: &RawDist,
        output: &RawDist,
    ) -> Result<Self, ConfigError> {
        let f = |name: &str, d: &RawDist| {
            d.validate()
                .map_err(|r| ConfigError::new(file, format!("{at}{name}"), r))
        };
        Ok(Lengths {
            input: f("input_tokens", input)?,
            output: f("output_tokens", output)?,
        })
    }

    /// (input, output) tokens, each at least 1.
    #[inline]
    pub fn sample(&self, rng: &mut Rng) -> (u32, u32) {
        let i = self
            .input
            .sample(rng)
            .round()
            .clamp(1.0, u32::MAX as f64 / 4.0) as u32;
        let o = self
            .output
            .sample(rng)
            .round()
            .clamp(1.0, u32::MAX as f64 / 4.0) as u32;
        (i, o)
    }
}

/// An open-loop source: arrivals regardless of completions, generated one
/// at a time, from `start` until `end` (exclusive) or `limit` requests.
pub struct OpenLoop {
    process: ArrivalProcess,
    lengths: Lengths,
    rng: Rng,
    next_at: Nanos,
    /// With a rate shape: the next arrival in operational time.
    op_next: f64,
    end: Nanos,
    left: u64,
}

impl OpenLoop {
    /// `scope` separates several sources of one run.
    pub fn new(
        process: ArrivalProcess,
        lengths: Lengths,
        seed: u64,
        scope: u64,
        start: Nanos,
        end: Nanos,
        limit: u64,
    ) -> Self {
        let mut rng = stream(seed, scope, component::ARRIVALS);
        // the first arrival comes after one gap (a random phase for constant rates)
        let op_start = process.shape.as_ref().map_or(0.0, |s| s.operational(start));
        let gap = match process.kind {
            "constant" => (process.next_gap(&mut rng) as f64 * unit(&mut rng)) as Nanos,
            _ => process.next_gap(&mut rng),
        };
        let op_next = op_start + gap as f64;
        let first = match &process.shape {
            Some(s) => s.real(op_next).max(start),
            None => start + gap,
        };
        OpenLoop {
            op_next,
            process,
            lengths,
            rng,
            next_at: first,
            end,
            left: limit,
        }
    }

    /// Time of the next arrival, if any.
    #[inline]
    pub fn peek(&self) -> Option<Nanos> {
        (self.left > 0 && self.next_at < self.end).then_some(self.next_at)
    }

    /// Take the next arrival: (time, input tokens, output tokens).
    pub fn pop(&mut self) -> Option<(Nanos, u32, u32)> {
        let t = self.peek()?;
        let (i, o) = self.lengths.sample(&mut self.rng);
        self.left -= 1;
        let gap = self.process.next_gap(&mut self.rng);
        self.next_at = match &self.process.shape {
            Some(s) => {
                self.op_next += gap as f64;
                s.real(self.op_next).max(t)
            }
            None => t.saturating_add(gap),
        };
        Some((t, i, o))
    }
}

/// Closed-loop clients: each sends a request, waits for its completion,
/// thinks, and sends the next.
pub struct ClosedLoop {
    lengths: Lengths,
    think: Sampler,
    rng: Rng,
    pub clients: u32,
    end: Nanos,
}

impl ClosedLoop {
    pub fn new(
        clients: u32,
        think: Sampler,
        lengths: Lengths,
        seed: u64,
        scope: u64,
        end: Nanos,
    ) -> Self {
        ClosedLoop {
            lengths,
            think,
            rng: stream(seed, scope, component::CLIENT),
            clients,
            end,
        }
    }

    /// When a client that finished at `now` sends its next request (NEVER
    /// after the end of the run).
    pub fn next_send(&mut self, now: Nanos) -> Nanos {
        let t = now.saturating_add(secs(self.think.sample(&mut self.rng)));
        if t < self.end {
            t
        } else {
            NEVER
        }
    }

    /// Lengths of a new request.
    pub fn lengths(&mut self) -> (u32, u32) {
        self.lengths.sample(&mut self.rng)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lengths() -> Lengths {
        Lengths {
            input: Sampler::constant(10.0),
            output: Sampler::constant(5.0),
        }
    }

    /// (mean gap s, squared coefficient of variation) of `n` arrivals.
    fn gaps(raw: RawArrivals, rate: f64, n: u64) -> (f64, f64) {
        let p = ArrivalProcess::new(&raw, rate).unwrap();
        let mut src = OpenLoop::new(p, lengths(), 3, 0, 0, NEVER, n);
        let mut prev = None;
        let (mut s, mut s2, mut k) = (0.0, 0.0, 0.0);
        while let Some((t, i, o)) = src.pop() {
            assert_eq!((i, o), (10, 5));
            if let Some(p) = prev {
                let g = (t - p) as f64 / 1e9;
                s += g;
                s2 += g * g;
                k += 1.0;
            }
            prev = Some(t);
        }
        let m = s / k;
        (m, (s2 / k - m * m) / (m * m))
    }

    #[test]
    fn arrival_processes_have_their_rate_and_burstiness() {
        let (m, scv) = gaps(RawArrivals::Poisson, 50.0, 200_000);
        assert!(
            (m - 0.02).abs() / 0.02 < 0.01 && (scv - 1.0).abs() < 0.03,
            "{m} {scv}"
        );
        let (m, scv) = gaps(RawArrivals::Constant, 50.0, 1000);
        assert!((m - 0.02).abs() < 1e-9 && scv < 1e-9, "{m} {scv}");
        let (m, scv) = gaps(RawArrivals::Gamma { cv: 3.0 }, 50.0, 400_000);
        assert!(
            (m - 0.02).abs() / 0.02 < 0.03 && (scv - 9.0).abs() < 0.9,
            "{m} {scv}"
        );
    }

    #[test]
    fn open_loop_stops_at_end_and_limit() {
        let p = ArrivalProcess::new(&RawArrivals::Constant, 10.0).unwrap();
        let mut src = OpenLoop::new(p.clone(), lengths(), 1, 0, 0, 1_000_000_000, u64::MAX);
        let mut n = 0;
        while src.pop().is_some() {
            n += 1;
        }
        assert_eq!(n, 10);
        let mut src = OpenLoop::new(p, lengths(), 1, 0, 0, NEVER, 3);
        assert_eq!(std::iter::from_fn(|| src.pop()).count(), 3);
        assert!(ArrivalProcess::new(&RawArrivals::Poisson, 0.0).is_err());
        assert!(ArrivalProcess::new(&RawArrivals::Gamma { cv: -1.0 }, 1.0).is_err());
    }
}
