//! The optional `[serve]` table of a model profile: how `qsim serve` sizes
//! its answers (the simulation takes lengths from the experiment file).

use crate::config::ConfigError;
use crate::engine::{RawDist, Sampler};
use serde::Deserialize;

/// The optional `[serve]` table of a profile: what `qsim serve` needs that
/// the simulation takes from the experiment file instead.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct RawServe {
    /// Natural answer length in tokens (before the `max_tokens` cap).
    #[serde(default)]
    output_tokens: Option<RawDist>,
    /// `max_tokens` assumed when a request does not state it.
    #[serde(default)]
    default_max_tokens: Option<i64>,
}

/// `[serve]`, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeSpec {
    /// `None`: an answer is exactly `max_tokens` long.
    pub output_tokens: Option<Sampler>,
    pub default_max_tokens: u64,
}

pub const DEFAULT_MAX_TOKENS: u64 = 4096;

impl Default for ServeSpec {
    fn default() -> Self {
        ServeSpec {
            output_tokens: None,
            default_max_tokens: DEFAULT_MAX_TOKENS,
        }
    }
}

impl ServeSpec {
    /// Validate a profile's `[serve]` table (absent: the defaults).
    pub fn from_raw(file: &str, raw: Option<&RawServe>) -> Result<ServeSpec, ConfigError> {
        let Some(raw) = raw else {
            return Ok(ServeSpec::default());
        };
        let output_tokens = match &raw.output_tokens {
            None => None,
            Some(d) => Some(
                d.validate()
                    .map_err(|r| ConfigError::new(file, "serve.output_tokens", r))?,
            ),
        };
        let default_max_tokens = match raw.default_max_tokens {
            None => DEFAULT_MAX_TOKENS,
            Some(n) if (1..=1 << 30).contains(&n) => n as u64,
            Some(n) => {
                return Err(ConfigError::new(
                    file,
                    "serve.default_max_tokens",
                    format!("must be in 1..={}, got {n}", 1 << 30),
                ))
            }
        };
        Ok(ServeSpec {
            output_tokens,
            default_max_tokens,
        })
    }
}
