//! The limiter's configuration as the user states it: capacity, unit,
//! threshold, burst, semantics, accounting and the consumers (names,
//! reservations, policies). [`super::Params`] compiles it once.

use crate::limiter::rates::{Counts, LimitSpec, OutputAccounting};
use crate::time::NS_PER_SEC;
use serde::{Deserialize, Serialize};

/// Reservations are kept in basis points (1/100 of a percent).
pub const BP_FULL: u32 = 10_000;

/// What deployment capacity counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Requests per minute.
    Rpm,
    /// Tokens (input + output) per minute.
    Tpm,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Rpm => "rpm",
            Unit::Tpm => "tpm",
        }
    }
    pub fn parse(s: &str) -> Option<Unit> {
        match s {
            "rpm" => Some(Unit::Rpm),
            "tpm" => Some(Unit::Tpm),
            _ => None,
        }
    }
}

/// Reservation semantics (selected by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Semantics {
    RateLimitOnly,
    StrictFloors,
    LitellmPriority,
    Partitioned,
}

impl Semantics {
    pub const ALL: [Semantics; 4] = [
        Semantics::RateLimitOnly,
        Semantics::StrictFloors,
        Semantics::LitellmPriority,
        Semantics::Partitioned,
    ];
    pub const NAMES: &'static str = "rate-limit-only, strict-floors, litellm-priority, partitioned";

    pub fn name(self) -> &'static str {
        match self {
            Semantics::RateLimitOnly => "rate-limit-only",
            Semantics::StrictFloors => "strict-floors",
            Semantics::LitellmPriority => "litellm-priority",
            Semantics::Partitioned => "partitioned",
        }
    }
    pub fn parse(s: &str) -> Option<Semantics> {
        Semantics::ALL.into_iter().find(|x| x.name() == s)
    }
    /// One line on what the semantics guarantees.
    pub fn guarantee(self) -> &'static str {
        match self {
            Semantics::RateLimitOnly => "one ceiling, first come first served: no consumer has a floor",
            Semantics::StrictFloors => {
                "each floor is guaranteed (minus one bucket depth); idle floor capacity is lent out (work-conserving)"
            }
            Semantics::LitellmPriority => {
                "anyone may use idle capacity below the saturation threshold; above it, floor + pool only (floors hold only above the threshold)"
            }
            Semantics::Partitioned => {
                "each floor is guaranteed and lent only to other reserved consumers; the unreserved pool serves only unreserved consumers (idle when they are silent)"
            }
        }
    }
}

/// Per-consumer rate limits (the ceiling). `None` = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConsumerPolicy {
    pub rpm: Option<u64>,
    pub tokens_per_hour: Option<u64>,
    pub concurrent: Option<u32>,
    pub max_input_tokens: Option<u64>,
}

impl ConsumerPolicy {
    /// Fields set in `over` replace those of `self` (a per-entity override of
    /// the default policy).
    pub fn overridden_by(self, over: &ConsumerPolicy) -> ConsumerPolicy {
        ConsumerPolicy {
            rpm: over.rpm.or(self.rpm),
            tokens_per_hour: over.tokens_per_hour.or(self.tokens_per_hour),
            concurrent: over.concurrent.or(self.concurrent),
            max_input_tokens: over.max_input_tokens.or(self.max_input_tokens),
        }
    }
}

/// One consumer: a name, its reservation and its effective policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerSpec {
    pub name: String,
    /// Reservation in basis points of capacity (3000 = 30 %); 0 = none.
    pub reserved_bp: u32,
    pub policy: ConsumerPolicy,
}

/// The limiter's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimiterConfig {
    /// Units per minute.
    pub capacity: u64,
    pub unit: Unit,
    /// Utilization threshold in (0, 1].
    pub threshold: f64,
    /// Burst headroom in units; `None` = `(1 − threshold)·capacity`.
    pub burst: Option<u64>,
    pub semantics: Semantics,
    /// How output tokens count against token limits (deployment in `tpm`,
    /// and per-consumer tokens per hour).
    pub accounting: OutputAccounting,
    pub consumers: Vec<ConsumerSpec>,
}

impl LimiterConfig {
    /// How a request is charged against capacity: the deployment's limit
    /// (units per minute) with its accounting. Its `admit_charge` and
    /// `settle` are the rules every driver counts capacity units by.
    pub fn deploy_spec(&self) -> LimitSpec {
        LimitSpec {
            name: "capacity".into(),
            counts: match self.unit {
                Unit::Rpm => Counts::Requests,
                Unit::Tpm => Counts::Tokens,
            },
            limit: self.capacity,
            window: 60 * NS_PER_SEC,
            accounting: self.accounting,
        }
    }
    pub fn burst_units(&self) -> u64 {
        self.burst.unwrap_or_else(|| {
            ((1.0 - self.threshold).max(0.0) * self.capacity as f64).round() as u64
        })
    }
    pub fn reserved_bp_total(&self) -> u32 {
        self.consumers.iter().map(|c| c.reserved_bp).sum()
    }
    /// Check the configuration (the CLI and files report these as exit 2).
    pub fn validate(&self) -> Result<(), String> {
        if self.capacity == 0 {
            return Err("capacity must be > 0".into());
        }
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(format!(
                "threshold must be in (0, 1], got {}",
                self.threshold
            ));
        }
        if self.consumers.is_empty() {
            return Err("at least one consumer is needed".into());
        }
        let total = self.reserved_bp_total();
        if total > BP_FULL {
            return Err(format!(
                "reservations add up to {:.2} %, more than 100 %",
                total as f64 / 100.0
            ));
        }
        Ok(())
    }
}
