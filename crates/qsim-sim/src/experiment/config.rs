//! Hosted-API experiment files (`kind = "hosted"`): a suite of experiments
//! against one endpoint profile, run one after another with a cool-down.

use crate::client::managed::AimdParams;
use crate::client::policy::{RetryPolicy, SdkRetry};
use crate::client::presets::{aimd_window, preset, ClientPolicy};
use crate::client::throttle::{AdaptiveThrottle, RetryQuota};
use crate::client::RawRetry;
use crate::client::{CallerPolicy, PoolShared};
use crate::config::{duration_s, from_value, read_toml, resolve_relative, ConfigError};
use crate::engine::{RawDist, Sampler};
use crate::hosted::HostedProfile;
use crate::time::{secs, Nanos};
use serde::Deserialize;
use std::path::Path;
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawManaged {
    initial_concurrency: Option<f64>,
    min_concurrency: Option<f64>,
    max_concurrency: Option<f64>,
    increase: Option<f64>,
    decrease: Option<f64>,
    retry_base_s: Option<f64>,
    retry_cap_s: Option<f64>,
    max_attempts: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawSdk {
    max_retries: Option<i64>,
    initial_delay_s: Option<f64>,
    max_delay_s: Option<f64>,
    hint_max_s: Option<f64>,
    hint_over_max: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawQuota {
    capacity: Option<i64>,
    cost: Option<i64>,
    success_increment: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawThrottle {
    k: Option<f64>,
    window_s: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: String,
    client: String,
    description: Option<String>,
    rows: Option<i64>,
    max_tokens: Option<i64>,
    workers: Option<i64>,
    sdk_retries: Option<bool>,
    retry: Option<RawRetry>,
    /// AWS-style retry quota shared by the pool's workers.
    retry_quota: Option<RawQuota>,
    /// Google SRE client-side adaptive throttling shared by the pool.
    throttle: Option<RawThrottle>,
    managed: Option<RawManaged>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHostedSuite {
    kind: String,
    title: Option<String>,
    description: Option<String>,
    endpoint: String,
    rows: i64,
    max_tokens: i64,
    workers: i64,
    #[serde(default = "default_cooldown")]
    cooldown_s: f64,
    #[serde(default)]
    sdk_retries: bool,
    sdk: Option<RawSdk>,
    input_tokens: RawDist,
    output_tokens: RawDist,
    managed: Option<RawManaged>,
    /// A named client policy ([`crate::client::presets`]) for every pool
    /// experiment, in place of its own retry layers.
    policy: Option<String>,
    /// Overrides the profile's `[price]` (`--set price.output_per_m_usd=5`).
    price: Option<RawPriceOverride>,
    /// Overrides fields of the profile's `[provisioned]`
    /// (`--set provisioned.units=30`).
    provisioned: Option<crate::hosted::provisioned::RawOverride>,
    experiment: Vec<RawExperiment>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPriceOverride {
    input_per_m_usd: f64,
    output_per_m_usd: f64,
}

fn default_cooldown() -> f64 {
    70.0
}

/// How the rows are called.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientKind {
    /// A closed-loop pool of `workers` threads (Python's ThreadPoolExecutor):
    /// a worker takes the next row when its call (with all retries) ends.
    Pool {
        workers: u32,
        /// The caller's layers: own retry policy and the SDK's hidden retries.
        caller: CallerPolicy,
        /// The retry quota and adaptive throttle shared by the workers
        /// (cloned fresh for each run).
        shared: PoolShared,
    },
    /// A managed batch executor (ai_query) with AIMD concurrency.
    Managed(AimdParams),
}

#[derive(Debug, Clone)]
pub struct Experiment {
    /// Position in the file: it scopes the experiment's random streams, so
    /// running a subset (`--only`) does not change any experiment's draws.
    pub index: u64,
    pub name: String,
    pub description: String,
    pub rows: u64,
    pub max_tokens: u64,
    pub client: ClientKind,
}

/// The file's top-level client settings, which its experiments inherit
/// (what `qsim recommend` searches from).
#[derive(Debug, Clone)]
pub struct SuiteBase {
    pub rows: u64,
    pub max_tokens: u64,
    pub workers: u32,
    /// The SDK's hidden retry layer of pool clients, if `sdk_retries` is on.
    pub sdk: Option<SdkRetry>,
    /// The managed executor's parameters (`[managed]` or the defaults).
    pub managed: AimdParams,
    /// The `policy` knob, if set.
    pub policy: Option<String>,
}

/// A validated hosted-API suite.
#[derive(Debug, Clone)]
pub struct HostedSuite {
    pub title: String,
    pub description: String,
    pub profile: Arc<HostedProfile>,
    pub profile_path: String,
    pub cooldown: Nanos,
    pub input_tokens: Sampler,
    pub output_tokens: Sampler,
    pub experiments: Vec<Experiment>,
    pub base: SuiteBase,
}

fn positive_int(file: &str, field: &str, v: i64, max: i64) -> Result<u64, ConfigError> {
    if v <= 0 {
        Err(ConfigError::new(
            file,
            field,
            format!("must be > 0, got {v}"),
        ))
    } else if v > max {
        Err(ConfigError::new(
            file,
            field,
            format!("must be <= {max}, got {v}"),
        ))
    } else {
        Ok(v as u64)
    }
}

fn managed_params(
    file: &str,
    at: &str,
    base: AimdParams,
    m: Option<&RawManaged>,
) -> Result<AimdParams, ConfigError> {
    let Some(m) = m else { return Ok(base) };
    let f = |name: &str, v: Option<f64>, d: f64, lo: f64, hi: f64| -> Result<f64, ConfigError> {
        let v = v.unwrap_or(d);
        if v.is_finite() && v >= lo && v <= hi {
            Ok(v)
        } else {
            Err(ConfigError::new(
                file,
                format!("{at}.{name}"),
                format!("must be in [{lo}, {hi}], got {v}"),
            ))
        }
    };
    let p = AimdParams {
        initial: f(
            "initial_concurrency",
            m.initial_concurrency,
            base.initial,
            1.0,
            1e6,
        )?,
        min: f("min_concurrency", m.min_concurrency, base.min, 1.0, 1e6)?,
        max: f("max_concurrency", m.max_concurrency, base.max, 1.0, 1e6)?,
        increase: f("increase", m.increase, base.increase, 0.0, 1e6)?,
        decrease: f("decrease", m.decrease, base.decrease, 0.01, 1.0)?,
        retry_base_s: f(
            "retry_base_s",
            m.retry_base_s,
            base.retry_base_s,
            0.0,
            3600.0,
        )?,
        retry_cap_s: f("retry_cap_s", m.retry_cap_s, base.retry_cap_s, 0.0, 3600.0)?,
        max_attempts: f(
            "max_attempts",
            m.max_attempts.map(|x| x as f64),
            base.max_attempts as f64,
            1.0,
            1e6,
        )? as u32,
    };
    if p.min > p.max {
        return Err(ConfigError::new(
            file,
            format!("{at}.min_concurrency"),
            format!("must be <= max_concurrency ({}), got {}", p.max, p.min),
        ));
    }
    Ok(p)
}

/// `[sdk]`: the SDK's hidden retry layer (the OpenAI Python SDK's
/// defaults, each field overridable; field paths `sdk.*`). Shared by hosted
/// experiment files and shared-deployment files.
pub(crate) fn sdk_layer(f: &str, raw: Option<&RawSdk>) -> Result<SdkRetry, ConfigError> {
    let d = SdkRetry::default();
    let Some(s) = raw else { return Ok(d) };
    let nn = |name: &str, v: Option<f64>, dv: f64| -> Result<f64, ConfigError> {
        duration_s(f, &format!("sdk.{name}"), v.unwrap_or(dv), false)
    };
    let mr = s.max_retries.unwrap_or(d.max_retries as i64);
    if !(0..=100).contains(&mr) {
        return Err(ConfigError::new(
            f,
            "sdk.max_retries",
            format!("must be in 0..=100, got {mr}"),
        ));
    }
    Ok(SdkRetry {
        max_retries: mr as u32,
        initial: nn("initial_delay_s", s.initial_delay_s, d.initial)?,
        max_delay: nn("max_delay_s", s.max_delay_s, d.max_delay)?,
        hint_max: nn("hint_max_s", s.hint_max_s, d.hint_max)?,
        hint_over_max_backoff: match s.hint_over_max.as_deref() {
            None => d.hint_over_max_backoff,
            Some("no_retry") => false,
            Some("backoff") => true,
            Some(o) => {
                return Err(ConfigError::new(
                    f,
                    "sdk.hint_over_max",
                    format!(
                        "expected \"no_retry\" (current SDKs) or \"backoff\" (1.x SDKs), got {o:?}"
                    ),
                ))
            }
        },
        retry_on: d.retry_on,
    })
}

/// The own layers of a pool of callers as written: the `retry`,
/// `retry_quota` and `throttle` of a hosted file's `[[experiment]]` or a
/// shared-deployment file's `[[scenario.load]]` (each table keeps its own
/// fields; this is their one validation).
pub(crate) struct PoolLayers<'a> {
    pub retry: Option<&'a RawRetry>,
    pub retry_quota: Option<&'a RawQuota>,
    pub throttle: Option<&'a RawThrottle>,
}

impl PoolLayers<'_> {
    /// The callers' policy (with the SDK layer `sdk`, if on) and the state
    /// their workers share; errors name fields under `at`.
    pub(crate) fn validate(
        &self,
        f: &str,
        at: &str,
        sdk: Option<SdkRetry>,
    ) -> Result<(CallerPolicy, PoolShared), ConfigError> {
        let retry = match self.retry {
            Some(r) => r.validate(f, &format!("{at}.retry"))?,
            None => RetryPolicy::none(),
        };
        let int = |field: &str, v: Option<i64>, d: u32| -> Result<u32, ConfigError> {
            let v = v.unwrap_or(d as i64);
            u32::try_from(v).map_err(|_| {
                ConfigError::new(
                    f,
                    format!("{at}.{field}"),
                    format!("must be in 0..=4294967295, got {v}"),
                )
            })
        };
        let quota = match self.retry_quota {
            None => None,
            Some(q) => {
                let cap = int("retry_quota.capacity", q.capacity, 500)?;
                let cost = int("retry_quota.cost", q.cost, 5)?;
                if cost == 0 {
                    return Err(ConfigError::new(
                        f,
                        format!("{at}.retry_quota.cost"),
                        "must be > 0",
                    ));
                }
                Some(RetryQuota::new(
                    cap,
                    cost,
                    int("retry_quota.success_increment", q.success_increment, 1)?,
                ))
            }
        };
        let throttle = match self.throttle {
            None => None,
            Some(t) => {
                let k = t.k.unwrap_or(2.0);
                if !(k.is_finite() && k >= 1.0) {
                    return Err(ConfigError::new(
                        f,
                        format!("{at}.throttle.k"),
                        format!("must be >= 1, got {k}"),
                    ));
                }
                let w = t.window_s.unwrap_or(120.0);
                duration_s(f, &format!("{at}.throttle.window_s"), w, true)?;
                Some(AdaptiveThrottle::new(k, secs(w)))
            }
        };
        Ok((CallerPolicy { retry, sdk }, PoolShared { quota, throttle }))
    }
}

impl HostedSuite {
    /// Keep only the named experiments (`--only`); empty keeps all.
    pub fn retain_only(&mut self, names: &[String]) -> Result<(), ConfigError> {
        if names.is_empty() {
            return Ok(());
        }
        for n in names {
            if !self.experiments.iter().any(|e| &e.name == n) {
                let known: Vec<&str> = self.experiments.iter().map(|e| e.name.as_str()).collect();
                return Err(ConfigError::new(
                    "--only",
                    "",
                    format!(
                        "no experiment named {n:?}; the file has {}",
                        known.join(", ")
                    ),
                ));
            }
        }
        self.experiments.retain(|e| names.contains(&e.name));
        Ok(())
    }

    /// Validate a parsed experiment file (`file` is its path, used to
    /// resolve the endpoint profile and in error messages).
    pub fn from_value(file: &Path, v: toml::Value) -> Result<Self, ConfigError> {
        let fname = file.display().to_string();
        let f = fname.as_str();
        let raw: RawHostedSuite = from_value(f, v)?;
        crate::config::expect_kind(f, &raw.kind, "hosted", "a hosted experiment file")?;
        let ppath = resolve_relative(file, &raw.endpoint);
        if let Some(why) = crate::config::source_problem("endpoint profile", &ppath) {
            return Err(ConfigError::new(f, "endpoint", why));
        }
        let pv = read_toml(&ppath)?;
        let mut profile = HostedProfile::from_value(&ppath.display().to_string(), pv)?;
        if let Some(o) = &raw.provisioned {
            profile.override_provisioned(f, o)?;
        }
        if let Some(p) = &raw.price {
            if profile.provisioned.is_some() {
                return Err(ConfigError::new(
                    f,
                    "price",
                    "the endpoint is provisioned (billed per unit-hour): set provisioned.unit_hour_usd instead",
                ));
            }
            profile.price = Some(crate::hosted::profile::TokenPrice::new(
                f,
                "price",
                p.input_per_m_usd,
                p.output_per_m_usd,
            )?);
            profile.price_source = format!("{f}: price");
        }
        let profile = Arc::new(profile);
        let rows = positive_int(f, "rows", raw.rows, 100_000_000)?;
        let max_tokens = positive_int(f, "max_tokens", raw.max_tokens, 10_000_000)?;
        let workers = positive_int(f, "workers", raw.workers, 1_000_000)?;
        duration_s(f, "cooldown_s", raw.cooldown_s, false)?;
        let sdk = sdk_layer(f, raw.sdk.as_ref())?;
        let managed_base =
            managed_params(f, "managed", AimdParams::default(), raw.managed.as_ref())?;
        let policy = match &raw.policy {
            None => None,
            Some(name) => Some(preset(name).map_err(|r| ConfigError::new(f, "policy", r))?),
        };
        if raw.experiment.is_empty() {
            return Err(ConfigError::new(
                f,
                "experiment",
                "at least one [[experiment]] is needed",
            ));
        }
        let mut experiments = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for (i, e) in raw.experiment.iter().enumerate() {
            let at = format!("experiment[{i}]");
            let rows = positive_int(
                f,
                &format!("{at}.rows"),
                e.rows.unwrap_or(rows as i64),
                100_000_000,
            )?;
            let max_tokens = positive_int(
                f,
                &format!("{at}.max_tokens"),
                e.max_tokens.unwrap_or(max_tokens as i64),
                10_000_000,
            )?;
            let client = match e.client.as_str() {
                "pool" => {
                    let workers = positive_int(
                        f,
                        &format!("{at}.workers"),
                        e.workers.unwrap_or(workers as i64),
                        1_000_000,
                    )? as u32;
                    let sdk = e
                        .sdk_retries
                        .unwrap_or(raw.sdk_retries)
                        .then(|| sdk.clone());
                    let layers = PoolLayers {
                        retry: e.retry.as_ref(),
                        retry_quota: e.retry_quota.as_ref(),
                        throttle: e.throttle.as_ref(),
                    };
                    let (caller, shared) = layers.validate(f, &at, sdk)?;
                    match &policy {
                        None => ClientKind::Pool {
                            workers,
                            caller,
                            shared,
                        },
                        Some(p) => client_with(p, workers, caller.sdk, &managed_base),
                    }
                }
                "managed" => {
                    if e.retry_quota.is_some() || e.throttle.is_some() {
                        return Err(ConfigError::new(
                            f,
                            format!("{at}.client"),
                            "retry_quota and throttle apply to client = \"pool\"; a managed executor paces itself",
                        ));
                    }
                    if e.retry.is_some() {
                        return Err(ConfigError::new(
                            f,
                            format!("{at}.retry"),
                            "a managed executor does its own retries; remove `retry`",
                        ));
                    }
                    ClientKind::Managed(managed_params(
                        f,
                        &format!("{at}.managed"),
                        managed_base.clone(),
                        e.managed.as_ref(),
                    )?)
                }
                other => {
                    return Err(ConfigError::new(
                        f,
                        format!("{at}.client"),
                        format!("unknown client {other:?}; expected \"pool\" or \"managed\""),
                    ))
                }
            };
            if !seen.insert(e.name.as_str()) {
                return Err(ConfigError::new(
                    f,
                    format!("{at}.name"),
                    format!("duplicate experiment name {:?}", e.name),
                ));
            }
            experiments.push(Experiment {
                index: i as u64,
                name: e.name.clone(),
                description: e.description.clone().unwrap_or_default(),
                rows,
                max_tokens,
                client,
            });
        }
        let dist =
            |field: &str, d: &RawDist| d.validate().map_err(|r| ConfigError::new(f, field, r));
        Ok(HostedSuite {
            title: raw.title.unwrap_or_default(),
            description: raw.description.unwrap_or_default(),
            profile,
            profile_path: ppath.display().to_string(),
            cooldown: secs(raw.cooldown_s),
            input_tokens: dist("input_tokens", &raw.input_tokens)?,
            output_tokens: dist("output_tokens", &raw.output_tokens)?,
            experiments,
            base: SuiteBase {
                rows,
                max_tokens,
                workers: workers as u32,
                sdk: raw.sdk_retries.then_some(sdk),
                managed: managed_base,
                policy: raw.policy,
            },
        })
    }
}

/// The client of a pool of `workers` under the client policy `p` (the
/// SDK layer `sdk` applies to pool policies; `aimd` is the managed
/// executor with its window's ceiling at `workers`).
pub fn client_with(
    p: &ClientPolicy,
    workers: u32,
    sdk: Option<SdkRetry>,
    managed: &AimdParams,
) -> ClientKind {
    match p {
        ClientPolicy::Pool { retry, shared } => ClientKind::Pool {
            workers,
            caller: CallerPolicy {
                retry: retry.clone(),
                sdk,
            },
            shared: shared.clone(),
        },
        ClientPolicy::Aimd => ClientKind::Managed(aimd_window(managed, workers)),
    }
}
