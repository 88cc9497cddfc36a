//! What the limiter decides on and answers: a [`Request`], the [`Decision`]
//! (a [`Grant`] charged to a [`Source`], or a denial by a [`Limit`]).

use crate::limiter::rates::Cost;
use crate::time::Nanos;
use serde::{Deserialize, Serialize};

/// Per-consumer limits that can deny, and the deployment's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    MaxInputTokens,
    Concurrent,
    Rpm,
    TokensPerHour,
    Capacity,
}

impl Limit {
    pub const ALL: [Limit; 5] = [
        Limit::MaxInputTokens,
        Limit::Concurrent,
        Limit::Rpm,
        Limit::TokensPerHour,
        Limit::Capacity,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Limit::MaxInputTokens => "max_input_tokens",
            Limit::Concurrent => "concurrent",
            Limit::Rpm => "rpm",
            Limit::TokensPerHour => "tokens_per_hour",
            Limit::Capacity => "capacity",
        }
    }
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One request as the limiter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Index into the configuration's consumers.
    pub consumer: usize,
    pub input_tokens: u64,
    /// Declared `max_tokens` (reserved under reserve-refund accounting).
    pub max_tokens: u64,
}

impl Request {
    pub fn cost(&self) -> Cost {
        Cost {
            input_tokens: self.input_tokens,
            max_tokens: self.max_tokens,
        }
    }
}

/// Which capacity bucket an admitted request was charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// The consumer's own floor bucket.
    Own,
    /// The unreserved pool.
    Pool,
    /// Another consumer's floor bucket.
    Borrowed(usize),
    /// strict-floors: the deployment bucket, using `credit` units of the
    /// consumer's own floor credits (the rest is borrowed).
    Shared { credit: u64 },
}

/// What an admission returns; hand it back to [`complete`](super::complete).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub consumer: usize,
    pub source: Source,
    pub input_tokens: u64,
    pub max_tokens: u64,
    /// The effective time of the admission plus the lease: if no completion
    /// arrives, the concurrency slot is free again at this time.
    pub lease_until: Nanos,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    Admit(Grant),
    /// Denied by `limit`; the same request would pass at `retry_at` if
    /// nothing else happened (`NEVER`: not by the passage of time alone).
    Deny {
        limit: Limit,
        retry_at: Nanos,
    },
}

impl Decision {
    pub fn is_admit(&self) -> bool {
        matches!(self, Decision::Admit(_))
    }
}
