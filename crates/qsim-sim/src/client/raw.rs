//! The TOML form of a retry policy (`[experiment.retry]`, `[[scenario.load]].retry`).

use crate::config::{duration_s, ConfigError};
use qsim_core::client::policy::{Backoff, RetryPolicy, StatusSet};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRetry {
    /// none | constant | exponential | full_jitter | equal_jitter | decorrelated
    pub backoff: String,
    #[serde(default)]
    pub base_s: Option<f64>,
    #[serde(default)]
    pub cap_s: Option<f64>,
    #[serde(default)]
    pub jitter_s: Option<f64>,
    #[serde(default)]
    pub delay_s: Option<f64>,
    #[serde(default)]
    pub max_attempts: Option<i64>,
    #[serde(default)]
    pub retry_on: Option<Vec<String>>,
    #[serde(default)]
    pub honor_hint: Option<bool>,
}

impl RawRetry {
    pub fn validate(&self, file: &str, at: &str) -> Result<RetryPolicy, ConfigError> {
        let err = |f: &str, r: String| ConfigError::new(file, format!("{at}.{f}"), r);
        // every delay is a duration: [0, 1e9] s, so backoff sums never
        // saturate the clock
        let num = |f: &str, v: Option<f64>, default: f64| -> Result<f64, ConfigError> {
            duration_s(file, &format!("{at}.{f}"), v.unwrap_or(default), false)
        };
        let base = num("base_s", self.base_s, 1.0)?;
        let cap = num("cap_s", self.cap_s, 32.0)?;
        let backoff = match self.backoff.as_str() {
            "none" => Backoff::None,
            "constant" => Backoff::Constant {
                delay: num("delay_s", self.delay_s, 1.0)?,
            },
            "exponential" => Backoff::Exponential {
                base,
                cap,
                jitter: num("jitter_s", self.jitter_s, 1.0)?,
            },
            "full_jitter" => Backoff::FullJitter { base, cap },
            "equal_jitter" => Backoff::EqualJitter { base, cap },
            "decorrelated" => Backoff::Decorrelated { base, cap },
            other => {
                return Err(err(
                    "backoff",
                    format!(
                        "unknown backoff {other:?}; expected one of none, constant, exponential, full_jitter, equal_jitter, decorrelated"
                    ),
                ))
            }
        };
        let default_attempts = if backoff == Backoff::None { 1 } else { 8 };
        let max_attempts = self.max_attempts.unwrap_or(default_attempts);
        if !(1..=1000).contains(&max_attempts) {
            return Err(err(
                "max_attempts",
                format!("must be in 1..=1000, got {max_attempts}"),
            ));
        }
        let retry_on = StatusSet::parse(
            self.retry_on
                .as_deref()
                .unwrap_or(&["429".to_string(), "5xx".to_string()]),
        )
        .map_err(|r| err("retry_on", r))?;
        Ok(RetryPolicy {
            backoff,
            max_attempts: max_attempts as u32,
            retry_on,
            honor_hint: self.honor_hint.unwrap_or(true),
        })
    }
}
