//! `autoscale` tables of server experiment files (issue 25): raw settings
//! → the core's checked [`Params`], errors naming the field.
//!
//! ```toml
//! [autoscale]
//! min = 1
//! max = 8
//! metric = "concurrency"    # queue_length | concurrency | kv_use | request_rate
//! target = 40               # per replica (request_rate: requests per minute)
//! window_s = 60
//! interval_s = 1            # sampling period (default 1 s)
//! cold_start_s = 180        # or: load_gb_s = 2 (+ startup_s): weights / bandwidth
//! scale_down_delay_s = 300
//! ```

use crate::config::ConfigError;
use crate::server::ServerProfile;
use qsim_core::autoscale::{Metric, Params};
use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAutoscale {
    min: i64,
    max: i64,
    metric: String,
    target: f64,
    window_s: f64,
    interval_s: Option<f64>,
    cold_start_s: Option<f64>,
    /// GB/s at which a new replica loads its weights.
    load_gb_s: Option<f64>,
    /// Seconds of start-up besides loading the weights.
    startup_s: Option<f64>,
    scale_down_delay_s: f64,
}

fn secs(file: &str, field: &str, v: f64, zero_ok: bool) -> Result<u64, ConfigError> {
    let ok = v.is_finite() && v <= 1e7 && if zero_ok { v >= 0.0 } else { v > 0.0 };
    if !ok {
        let lo = if zero_ok { "[0" } else { "(0" };
        return Err(ConfigError::new(
            file,
            field,
            format!("must be in {lo}, 1e7] seconds, got {v}"),
        ));
    }
    crate::time::try_secs(v).map_err(|e| ConfigError::new(file, field, e.to_string()))
}

impl RawAutoscale {
    /// Validate; `at` is the table's path (`autoscale`, `scenario[2].autoscale`).
    pub fn validate(
        &self,
        file: &str,
        at: &str,
        profile: &ServerProfile,
    ) -> Result<Params, ConfigError> {
        let fld = |x: &str| format!("{at}.{x}");
        let count = |x: &str, v: i64| {
            if (1..=4096).contains(&v) {
                Ok(v as u32)
            } else {
                Err(ConfigError::new(
                    file,
                    fld(x),
                    format!("must be in 1..=4096, got {v}"),
                ))
            }
        };
        let metric = Metric::parse(&self.metric).ok_or_else(|| {
            ConfigError::new(
                file,
                fld("metric"),
                format!(
                    "unknown metric {:?}; expected queue_length, concurrency, kv_use or request_rate",
                    self.metric
                ),
            )
        })?;
        let cold_start = match (self.cold_start_s, self.load_gb_s) {
            (Some(c), None) => {
                if self.startup_s.is_some() {
                    return Err(ConfigError::new(
                        file,
                        fld("startup_s"),
                        "goes with load_gb_s (cold_start_s is the whole cold start)",
                    ));
                }
                secs(file, &fld("cold_start_s"), c, true)?
            }
            (None, Some(bw)) => {
                if !(bw.is_finite() && bw > 0.0 && bw <= 1e6) {
                    return Err(ConfigError::new(
                        file,
                        fld("load_gb_s"),
                        format!("must be in (0, 1e6] GB/s, got {bw}"),
                    ));
                }
                let startup = secs(file, &fld("startup_s"), self.startup_s.unwrap_or(0.0), true)?;
                let load = profile.weights_gib * 1024f64.powi(3) / (bw * 1e9);
                startup + secs(file, &fld("load_gb_s"), load, true)?
            }
            (Some(_), Some(_)) => {
                return Err(ConfigError::new(
                    file,
                    fld("load_gb_s"),
                    "give cold_start_s or load_gb_s, not both",
                ))
            }
            (None, None) => {
                return Err(ConfigError::new(
                    file,
                    at,
                    "needs cold_start_s, or load_gb_s (weights / load bandwidth)",
                ))
            }
        };
        let p = Params {
            min: count("min", self.min)?,
            max: count("max", self.max)?,
            metric,
            target: self.target,
            window: secs(file, &fld("window_s"), self.window_s, false)?,
            interval: secs(
                file,
                &fld("interval_s"),
                self.interval_s.unwrap_or(1.0),
                false,
            )?,
            cold_start,
            scale_down_delay: secs(
                file,
                &fld("scale_down_delay_s"),
                self.scale_down_delay_s,
                true,
            )?,
        };
        p.check()
            .map_err(|(field, reason)| ConfigError::new(file, fld(field), reason))?;
        Ok(p)
    }
}
