//! Workloads: open-loop arrival processes and closed-loop clients, with
//! input/output length distributions. Generation is lazy: a source holds
//! only its next arrival.

use crate::config::ConfigError;
use crate::engine::rng::{component, stream, unit, Rng};
use crate::engine::{RawDist, Sampler};
use crate::time::{secs, Nanos, NEVER};
use serde::Deserialize;

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
    gap: Sampler,
}

impl ArrivalProcess {
    /// `rate` requests per second with the given process.
    pub fn new(raw: &RawArrivals, rate: f64) -> Result<Self, String> {
        if !(rate.is_finite() && rate > 0.0) {
            return Err(format!("rate must be > 0, got {rate}"));
        }
        let mean = 1.0 / rate;
        let (kind, d) = match raw {
            RawArrivals::Poisson => ("poisson", RawDist::Exp { mean, max: None }),
            RawArrivals::Constant => ("constant", RawDist::Const { value: mean }),
            RawArrivals::Gamma { cv } => (
                "gamma",
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
            gap: d.validate()?,
        })
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
        let first = match process.kind {
            "constant" => start + (process.next_gap(&mut rng) as f64 * unit(&mut rng)) as Nanos,
            _ => start + process.next_gap(&mut rng),
        };
        OpenLoop {
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
        self.next_at = t.saturating_add(self.process.next_gap(&mut self.rng));
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
