//! Provisioned throughput (issue 25): capacity bought in units (Azure
//! OpenAI PTUs, Databricks provisioned-throughput model units), billed per
//! unit-hour whatever the use.
//!
//! ```toml
//! [provisioned]
//! units = 15
//! tokens_per_min_per_unit = 2500
//! unit_hour_usd = 2.0
//! source = "where the figures come from, and its date"
//! ```
//!
//! **Approximation.** The simulation treats the units as one more rate
//! limit of the hosted model: a continuously refilled bucket of `units ×
//! tokens_per_min_per_unit` tokens per minute (input plus output tokens
//! counted alike; `max_tokens` reserved at admission, the unused part
//! refunded on completion), above which requests get 429s; latency is the
//! profile's `[latency]` whatever the load. Real provisioned deployments
//! weigh output tokens more than input ones (Azure: one output token counts
//! as 3 to 4 input tokens, model by model) and slow down before they refuse;
//! neither is modelled. The bill is `units × hours × unit_hour_usd` over the
//! run's elapsed time (no minimum period, no reservation discount).

use crate::config::ConfigError;
use crate::limiter::rates::{Counts, LimitSpec, OutputAccounting};
use crate::time::secs;
use serde::Deserialize;

/// The name of the provisioned rate limit in reports (429s by limit).
pub const LIMIT_NAME: &str = "provisioned";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProvisioned {
    units: i64,
    tokens_per_min_per_unit: f64,
    unit_hour_usd: f64,
    pub(super) source: String,
}

/// Validated `[provisioned]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Provisioned {
    pub units: u64,
    pub tokens_per_min_per_unit: f64,
    pub unit_hour_usd: f64,
}

impl RawProvisioned {
    /// Check every field; errors name `{at}.units`…
    pub fn validate(&self, file: &str, at: &str) -> Result<Provisioned, ConfigError> {
        let f = |k: &str| format!("{at}.{k}");
        if !(1..=1_000_000).contains(&self.units) {
            return Err(ConfigError::new(
                file,
                f("units"),
                format!("must be in 1..=1000000, got {}", self.units),
            ));
        }
        let t = self.tokens_per_min_per_unit;
        if !(t.is_finite() && (1.0..=1e9).contains(&t)) {
            return Err(ConfigError::new(
                file,
                f("tokens_per_min_per_unit"),
                format!("must be in [1, 1e9] tokens per minute, got {t}"),
            ));
        }
        let p = self.unit_hour_usd;
        if !(p.is_finite() && (0.0..=1e6).contains(&p)) {
            return Err(ConfigError::new(
                file,
                f("unit_hour_usd"),
                format!("must be in [0, 1e6] dollars per unit-hour, got {p}"),
            ));
        }
        Ok(Provisioned {
            units: self.units as u64,
            tokens_per_min_per_unit: t,
            unit_hour_usd: p,
        })
    }
}

impl Provisioned {
    /// Tokens per minute of all units.
    pub fn tokens_per_min(&self) -> u64 {
        (self.units as f64 * self.tokens_per_min_per_unit).round() as u64
    }

    /// The rate limit the units stand for.
    pub fn limit(&self) -> LimitSpec {
        LimitSpec {
            name: LIMIT_NAME.into(),
            counts: Counts::Tokens,
            limit: self.tokens_per_min().max(1),
            window: secs(60.0),
            accounting: OutputAccounting::ReserveRefund,
        }
    }

    /// Dollars for `hours` of the units.
    pub fn cost(&self, hours: f64) -> f64 {
        self.units as f64 * hours * self.unit_hour_usd
    }
}

/// An experiment file's `provisioned` table: any of the profile's
/// `[provisioned]` figures replaced (`--set provisioned.units=30`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverride {
    pub units: Option<i64>,
    pub tokens_per_min_per_unit: Option<f64>,
    pub unit_hour_usd: Option<f64>,
}

impl RawOverride {
    /// `current` with this table's figures in place; errors name
    /// `provisioned.<field>` in `file` (the experiment file).
    pub fn resolve(&self, file: &str, current: Provisioned) -> Result<Provisioned, ConfigError> {
        RawProvisioned {
            units: self.units.unwrap_or(current.units as i64),
            tokens_per_min_per_unit: self
                .tokens_per_min_per_unit
                .unwrap_or(current.tokens_per_min_per_unit),
            unit_hour_usd: self.unit_hour_usd.unwrap_or(current.unit_hour_usd),
            source: String::new(),
        }
        .validate(file, "provisioned")
    }
}
