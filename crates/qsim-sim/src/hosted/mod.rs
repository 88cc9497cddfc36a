//! A hosted model API endpoint (Databricks FMAPI, OpenAI, Anthropic, Azure
//! OpenAI) seen from the caller: provider rate limits decided before the
//! model runs, fast 429s in one of several shapes, and a service time drawn
//! from the profile.
//!
//! Sans-IO: [`HostedEndpoint::call`] takes `now` and returns when the reply
//! arrives; the caller schedules it. The endpoint owns its random stream.

pub mod profile;
pub mod provisioned;
pub mod routed;

pub use profile::{HintShape, HostedProfile};

use crate::engine::{Rng, Sampler};
use crate::limiter::rates::{Cost, RateLimits};
use crate::time::{secs, Nanos, NEVER, NS_PER_MS, NS_PER_SEC};
use std::sync::Arc;

/// The natural (uncapped) length of one answer drawn from `dist`: rounded,
/// at least one token. The one rule for both drivers: the simulation draws
/// each row's from its workload stream, `qsim serve` each prompt's from a
/// stream keyed by its seed and the prompt.
pub fn natural_output(dist: &Sampler, rng: &mut Rng) -> u64 {
    dist.sample(rng).round().max(1.0) as u64
}

/// What the endpoint answers to one HTTP request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Reply {
    /// 200: the response completes at `done_at` with `output_tokens`. The
    /// caller must call [`HostedEndpoint::complete`] at `done_at`.
    Ok {
        done_at: Nanos,
        output_tokens: u64,
        /// Time to first token (for streaming callers).
        ttft: Nanos,
    },
    /// 429 decided at admission, delivered at `at`.
    RateLimited {
        at: Nanos,
        /// Index of the limit in the profile.
        limit: usize,
        /// The retry hint the response carries (already converted to a
        /// duration as the client would read it), if the shape has one.
        hint: Option<Nanos>,
    },
    /// 5xx (fault injection), delivered at `at`. Consumes no quota.
    ServerError { at: Nanos },
}

/// One endpoint's state: its limits and its random stream.
pub struct HostedEndpoint {
    profile: Arc<HostedProfile>,
    limits: RateLimits,
    rng: Rng,
}

impl HostedEndpoint {
    pub fn new(profile: Arc<HostedProfile>, now: Nanos, rng: Rng) -> Self {
        let limits = RateLimits::new(profile.limits.clone(), now);
        HostedEndpoint {
            profile,
            limits,
            rng,
        }
    }

    /// Replace the random stream (each experiment of a suite draws from its
    /// own stream while the buckets carry over).
    pub fn reseed(&mut self, rng: Rng) {
        self.rng = rng;
    }

    pub fn profile(&self) -> &HostedProfile {
        &self.profile
    }

    pub fn limits(&self) -> &RateLimits {
        &self.limits
    }

    /// A request arrives at `now` with its declared cost. `natural_output` is
    /// the length the model would produce for this prompt with no cap; the
    /// actual output is `min(natural_output, max_tokens)`.
    pub fn call(&mut self, now: Nanos, cost: Cost, natural_output: u64) -> Reply {
        let p = &*self.profile;
        if p.server_error_rate > 0.0
            && crate::engine::rng::unit(&mut self.rng) < p.server_error_rate
        {
            let at = now + secs(p.reject_latency.sample(&mut self.rng));
            return Reply::ServerError { at };
        }
        match self.limits.admit(now, cost) {
            Ok(()) => {
                let out = natural_output.min(cost.max_tokens);
                let ttft = secs(p.ttft.sample(&mut self.rng));
                let tpot = p.tpot.sample(&mut self.rng);
                let done_at = now + ttft + secs(tpot * out as f64);
                Reply::Ok {
                    done_at,
                    output_tokens: out,
                    ttft,
                }
            }
            Err(d) => {
                let at = now + secs(p.reject_latency.sample(&mut self.rng));
                let wait = if d.retry_at == NEVER {
                    None
                } else {
                    Some(d.retry_at.saturating_sub(now))
                };
                let hint = match (p.hint, wait) {
                    (HintShape::None, _) | (_, None) => None,
                    // Header `Retry-After: <whole seconds>`, rounded up.
                    (HintShape::RetryAfterHeader, Some(w)) => {
                        Some(w.div_ceil(NS_PER_SEC) * NS_PER_SEC)
                    }
                    // Header `retry-after-ms: <whole ms>`, rounded up.
                    (HintShape::RetryAfterMs, Some(w)) => Some(w.div_ceil(NS_PER_MS) * NS_PER_MS),
                    // Body `retry_after: <seconds, float>`, millisecond precision.
                    (HintShape::BodyRetryAfter, Some(w)) => Some(w.div_ceil(NS_PER_MS) * NS_PER_MS),
                };
                Reply::RateLimited {
                    at,
                    limit: d.limit,
                    hint,
                }
            }
        }
    }

    /// The response of an admitted request completed at `now`: refund or
    /// charge according to each limit's output accounting.
    pub fn complete(&mut self, now: Nanos, cost: Cost, output_tokens: u64) {
        self.limits.settle(now, cost, output_tokens);
    }
}
