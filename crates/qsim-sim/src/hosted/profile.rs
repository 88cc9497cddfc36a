//! Hosted-API profiles (`models/*.toml` with `kind = "hosted"`).

use crate::config::{duration_s, from_value, ConfigError};
use crate::engine::{RawDist, Sampler};
use crate::limiter::rates::{Counts, LimitSpec, OutputAccounting};
use crate::time::secs;
use serde::Deserialize;

/// The shape of the retry hint a 429 carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HintShape {
    /// No hint at all (Databricks FMAPI as measured in the article).
    None,
    /// `{"retry_after": seconds}` in the body (Databricks docs' other shape).
    BodyRetryAfter,
    /// `Retry-After: seconds` header (Anthropic, OpenAI).
    RetryAfterHeader,
    /// `retry-after-ms` header (Azure OpenAI).
    RetryAfterMs,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimit {
    name: String,
    counts: Counts,
    limit: i64,
    window_s: f64,
    #[serde(default)]
    accounting: OutputAccounting,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRejection {
    hint: HintShape,
    latency: RawDist,
    #[serde(default)]
    body: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLatency {
    ttft: RawDist,
    tpot: RawDist,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHostedProfile {
    kind: String,
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    limits: Vec<RawLimit>,
    rejection: RawRejection,
    latency: RawLatency,
    #[serde(default)]
    server_error_rate: f64,
    /// Only `qsim serve` reads it (answer lengths).
    #[serde(default)]
    serve: Option<crate::serve_spec::RawServe>,
    /// Pay-per-token prices (issue 25).
    #[serde(default)]
    price: Option<RawTokenPrice>,
    /// Provisioned throughput bought in units (issue 25).
    #[serde(default)]
    provisioned: Option<super::provisioned::RawProvisioned>,
}

/// `[price]` of a hosted profile: dollars per million input and output
/// tokens, and where the figures come from (a price list and its date).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTokenPrice {
    input_per_m_usd: f64,
    output_per_m_usd: f64,
    source: String,
}

/// Dollars per million input and output tokens.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenPrice {
    pub input_per_m_usd: f64,
    pub output_per_m_usd: f64,
}

impl TokenPrice {
    /// Check both figures (finite, in [0, 1e6]); errors name `{at}.input_per_m_usd`…
    pub fn new(file: &str, at: &str, input: f64, output: f64) -> Result<Self, ConfigError> {
        for (k, v) in [("input_per_m_usd", input), ("output_per_m_usd", output)] {
            if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                return Err(ConfigError::new(
                    file,
                    format!("{at}.{k}"),
                    format!("must be in [0, 1e6] dollars per million tokens, got {v}"),
                ));
            }
        }
        Ok(TokenPrice {
            input_per_m_usd: input,
            output_per_m_usd: output,
        })
    }
}

/// A validated hosted-API profile.
#[derive(Debug, Clone)]
pub struct HostedProfile {
    pub name: String,
    pub description: String,
    pub limits: Vec<LimitSpec>,
    pub hint: HintShape,
    pub reject_latency: Sampler,
    pub reject_body: Option<String>,
    pub ttft: Sampler,
    pub tpot: Sampler,
    pub server_error_rate: f64,
    /// `[serve]`: how `qsim serve` sizes answers (the simulation takes
    /// lengths from the experiment file instead).
    pub serve: crate::serve_spec::ServeSpec,
    /// Pay-per-token prices (`[price]`), if known, and their source.
    pub price: Option<TokenPrice>,
    pub price_source: String,
    /// Provisioned throughput (`[provisioned]`): billed per unit-hour
    /// whatever the use; its rate limit is among `limits`.
    pub provisioned: Option<super::provisioned::Provisioned>,
}

fn dist(file: &str, field: &str, d: &RawDist) -> Result<Sampler, ConfigError> {
    d.validate().map_err(|r| ConfigError::new(file, field, r))
}

impl HostedProfile {
    /// Parse and validate a profile; `file` names it in errors.
    pub fn from_value(file: &str, v: toml::Value) -> Result<Self, ConfigError> {
        let raw: RawHostedProfile = from_value(file, v)?;
        crate::config::expect_kind(file, &raw.kind, "hosted", "a hosted-API profile")?;
        let mut limits = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, l) in raw.limits.iter().enumerate() {
            let f = |x: &str| format!("limits.{i}.{x}");
            if l.limit <= 0 {
                return Err(ConfigError::new(
                    file,
                    f("limit"),
                    format!("must be > 0, got {}", l.limit),
                ));
            }
            duration_s(file, &f("window_s"), l.window_s, true)?;
            if l.name.trim().is_empty() {
                return Err(ConfigError::new(file, f("name"), "must not be empty"));
            }
            if !seen.insert(l.name.as_str()) {
                return Err(ConfigError::new(
                    file,
                    f("name"),
                    format!("duplicate limit name {:?}", l.name),
                ));
            }
            limits.push(LimitSpec {
                name: l.name.clone(),
                counts: l.counts,
                limit: l.limit as u64,
                window: secs(l.window_s),
                accounting: l.accounting,
            });
        }
        if !(0.0..=1.0).contains(&raw.server_error_rate) {
            return Err(ConfigError::new(
                file,
                "server_error_rate",
                format!("must be in [0, 1], got {}", raw.server_error_rate),
            ));
        }
        let _ = raw.source;
        let provisioned = match &raw.provisioned {
            Some(p) => {
                if raw.price.is_some() {
                    return Err(ConfigError::new(
                        file,
                        "provisioned",
                        "a provisioned endpoint is billed per unit-hour: remove [price] (per-token prices)",
                    ));
                }
                let p = p.validate(file, "provisioned")?;
                if !seen.insert(super::provisioned::LIMIT_NAME) {
                    return Err(ConfigError::new(
                        file,
                        "provisioned",
                        format!(
                            "a limit is already named {:?}",
                            super::provisioned::LIMIT_NAME
                        ),
                    ));
                }
                limits.push(p.limit());
                Some(p)
            }
            None => None,
        };
        if limits.is_empty() {
            return Err(ConfigError::new(
                file,
                "limits",
                "at least one limit (or a [provisioned] table) is needed",
            ));
        }
        Ok(HostedProfile {
            name: raw.name,
            description: raw.description.unwrap_or_default(),
            limits,
            hint: raw.rejection.hint,
            reject_latency: dist(file, "rejection.latency", &raw.rejection.latency)?,
            reject_body: raw.rejection.body,
            ttft: dist(file, "latency.ttft", &raw.latency.ttft)?,
            tpot: dist(file, "latency.tpot", &raw.latency.tpot)?,
            server_error_rate: raw.server_error_rate,
            serve: crate::serve_spec::ServeSpec::from_raw(file, raw.serve.as_ref())?,
            price: match &raw.price {
                Some(p) => Some(TokenPrice::new(
                    file,
                    "price",
                    p.input_per_m_usd,
                    p.output_per_m_usd,
                )?),
                None => None,
            },
            price_source: match (raw.price, raw.provisioned) {
                (Some(p), _) => p.source,
                (None, Some(p)) => p.source,
                _ => String::new(),
            },
            provisioned,
        })
    }
}

impl HostedProfile {
    /// An experiment file's `provisioned` table applied to this profile
    /// (which must be provisioned): the figures and the rate limit replaced.
    pub fn override_provisioned(
        &mut self,
        file: &str,
        o: &super::provisioned::RawOverride,
    ) -> Result<(), ConfigError> {
        let Some(cur) = self.provisioned else {
            return Err(ConfigError::new(
                file,
                "provisioned",
                format!(
                    "the endpoint profile {:?} has no [provisioned] table",
                    self.name
                ),
            ));
        };
        let p = o.resolve(file, cur)?;
        let name = super::provisioned::LIMIT_NAME;
        for l in self.limits.iter_mut().filter(|l| l.name == name) {
            *l = p.limit();
        }
        self.provisioned = Some(p);
        Ok(())
    }
}
