//! A set of provider-style rate limits (RPM, QPH, ITPM, OTPM, TPM …), each a
//! continuously refilling token bucket, decided all-or-nothing.
//!
//! This is the one rate-limit mechanism in qsim: the hosted-API model uses it
//! for provider limits and the admission limiter uses it for per-consumer and
//! deployment limits.

use super::bucket::{BucketSpec, TokenBucket};
use crate::time::Nanos;
use crate::units::Units;
use serde::{Deserialize, Serialize};

/// What a limit counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Counts {
    Requests,
    InputTokens,
    OutputTokens,
    /// Input plus output tokens.
    Tokens,
}

/// How output tokens are charged against a limit that counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OutputAccounting {
    /// Databricks FMAPI: `max_tokens` is reserved before admission; the unused
    /// part is refunded when the response completes (output above it is
    /// charged then).
    #[default]
    ReserveRefund,
    /// Azure OpenAI's estimate: `max_tokens` is charged at admission and
    /// nothing is refunded (output above it is charged at completion).
    ReserveNoRefund,
    /// Anthropic: `max_tokens` does not count; admission needs a non-empty
    /// bucket and the actual output is charged when the response completes.
    OnCompletion,
}

/// One limit: `limit` units per `window`, refilled continuously.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitSpec {
    pub name: String,
    pub counts: Counts,
    pub limit: u64,
    pub window: Nanos,
    pub accounting: OutputAccounting,
}

/// What one request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Cost {
    pub input_tokens: u64,
    pub max_tokens: u64,
}

/// A refusal: which limit, and the earliest time the same request could pass
/// every limit if nothing else happened (`NEVER` if it can never fit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denial {
    pub limit: usize,
    pub retry_at: Nanos,
}

/// A set of limits and their buckets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RateLimits {
    specs: Vec<LimitSpec>,
    buckets: Vec<TokenBucket>,
}

impl LimitSpec {
    /// Units charged at admission, and the minimum level needed to admit.
    /// Shared by the provider limits here and the admission limiter's
    /// deployment buckets (one set of accounting rules).
    #[inline]
    pub fn admit_charge(&self, c: Cost) -> (u64, u64) {
        // in saturating units: a huge max_tokens is a charge no bucket
        // holds (denied), never a wrapped small one
        let out = match self.accounting {
            OutputAccounting::OnCompletion => Units::ZERO,
            _ => Units(c.max_tokens),
        };
        let charge = match self.counts {
            Counts::Requests => 1,
            Counts::InputTokens => c.input_tokens,
            Counts::OutputTokens => out.get(),
            Counts::Tokens => (out + c.input_tokens).get(),
        };
        let counts_output = matches!(self.counts, Counts::OutputTokens | Counts::Tokens);
        let need = if counts_output && self.accounting == OutputAccounting::OnCompletion {
            charge.max(1)
        } else {
            charge
        };
        (charge, need)
    }

    /// Adjustment at completion: (refund, extra charge).
    #[inline]
    pub fn settle(&self, c: Cost, actual_output: u64) -> (u64, u64) {
        if !matches!(self.counts, Counts::OutputTokens | Counts::Tokens) {
            return (0, 0);
        }
        // output above the reservation (an upstream that honoured a larger
        // cap than the one reserved, or ignored it) is charged when known
        let (actual, reserved) = (Units(actual_output), Units(c.max_tokens));
        let over = (actual - reserved).get();
        match self.accounting {
            OutputAccounting::ReserveRefund => ((reserved - actual).get(), over),
            OutputAccounting::ReserveNoRefund => (0, over),
            OutputAccounting::OnCompletion => (0, actual_output),
        }
    }
}

impl RateLimits {
    /// All buckets full at `now`; every limit and window must be > 0.
    pub fn try_new(specs: Vec<LimitSpec>, now: Nanos) -> Result<Self, String> {
        let buckets = specs
            .iter()
            .map(|s| {
                BucketSpec::new(s.limit, s.window)
                    .map(|b| TokenBucket::full(b, now))
                    .map_err(|e| format!("limit {:?}: {e}", s.name))
            })
            .collect::<Result<_, _>>()?;
        Ok(RateLimits { specs, buckets })
    }

    /// All buckets full at `now`, for specs already validated (the hosted
    /// profiles check limit > 0 and window > 0). Never panics: a zero limit
    /// or window is raised to 1; use [`try_new`](Self::try_new) for an error
    /// instead.
    pub fn new(specs: Vec<LimitSpec>, now: Nanos) -> Self {
        let buckets = specs
            .iter()
            .map(|s| TokenBucket::full(BucketSpec::at_least_one(s.limit, s.window), now))
            .collect();
        RateLimits { specs, buckets }
    }

    #[inline]
    pub fn specs(&self) -> &[LimitSpec] {
        &self.specs
    }
    #[inline]
    pub fn buckets(&self) -> &[TokenBucket] {
        &self.buckets
    }

    /// Check every limit without changing anything. `Err` names the first
    /// limit that fails and the earliest time *every* limit would pass.
    #[inline]
    pub fn check(&self, now: Nanos, cost: Cost) -> Result<(), Denial> {
        let mut denied: Option<usize> = None;
        let mut retry_at = now;
        for (i, (s, b)) in self.specs.iter().zip(&self.buckets).enumerate() {
            let (_, need) = s.admit_charge(cost);
            let t = b.earliest(now, need);
            if t > now && denied.is_none() {
                denied = Some(i);
            }
            retry_at = retry_at.max(t);
        }
        match denied {
            Some(limit) => Err(Denial { limit, retry_at }),
            None => Ok(()),
        }
    }

    /// Charge every limit for an admitted request (call after [`check`](Self::check)).
    #[inline]
    pub fn commit(&mut self, now: Nanos, cost: Cost) {
        for (s, b) in self.specs.iter().zip(self.buckets.iter_mut()) {
            let (charge, _) = s.admit_charge(cost);
            if charge > 0 {
                b.force_take(now, charge);
            }
        }
    }

    /// Check every limit; admit (charging all) only if all pass.
    #[inline]
    pub fn admit(&mut self, now: Nanos, cost: Cost) -> Result<(), Denial> {
        self.check(now, cost)?;
        self.commit(now, cost);
        Ok(())
    }

    /// Settle an admitted request at completion: refund unused reservations
    /// or charge output counted on completion.
    #[inline]
    pub fn settle(&mut self, now: Nanos, cost: Cost, actual_output: u64) {
        for (s, b) in self.specs.iter().zip(self.buckets.iter_mut()) {
            let (refund, extra) = s.settle(cost, actual_output);
            if refund > 0 {
                b.refund(now, refund);
            }
            if extra > 0 {
                b.force_take(now, extra);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NS_PER_SEC;

    fn otpm(acc: OutputAccounting) -> RateLimits {
        RateLimits::new(
            vec![LimitSpec {
                name: "OTPM".into(),
                counts: Counts::OutputTokens,
                limit: 1000,
                window: 60 * NS_PER_SEC,
                accounting: acc,
            }],
            0,
        )
    }

    #[test]
    fn reserve_refund_depends_on_declared_max_tokens() {
        let mut l = otpm(OutputAccounting::ReserveRefund);
        let c = Cost {
            input_tokens: 10,
            max_tokens: 400,
        };
        assert!(l.admit(0, c).is_ok());
        assert!(l.admit(0, c).is_ok());
        let d = l.admit(0, c).unwrap_err();
        assert_eq!(d.limit, 0);
        assert!(d.retry_at > 0);
        // one completes having produced only 100 tokens: 300 come back at once
        l.settle(0, c, 100);
        assert!(l.admit(0, c).is_ok());
    }

    #[test]
    fn on_completion_ignores_max_tokens() {
        let mut l = otpm(OutputAccounting::OnCompletion);
        let c = Cost {
            input_tokens: 10,
            max_tokens: 4000,
        };
        for _ in 0..10 {
            assert!(l.admit(0, c).is_ok());
        }
        l.settle(0, c, 1500);
        assert!(l.admit(0, c).is_err(), "in debt after the actual output");
    }

    #[test]
    fn impossible_request_is_never() {
        let mut l = otpm(OutputAccounting::ReserveRefund);
        let d = l
            .admit(
                0,
                Cost {
                    input_tokens: 0,
                    max_tokens: 5000,
                },
            )
            .unwrap_err();
        assert_eq!(d.retry_at, crate::time::NEVER);
    }
}
