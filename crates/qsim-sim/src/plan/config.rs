//! Shared-deployment experiment files (`kind = "shared"`): one deployment
//! behind the admission limiter, several consumers, and a list of load
//! scenarios. `experiments/shared-deployment.toml` (the shared-deployment article) is embedded in
//! the binary as the default for `qsim plan`.

use crate::client::presets::{preset, ClientPolicy};
use crate::client::RawRetry;
use crate::client::{CallerPolicy, PoolShared};
use crate::config::{from_value, parse_toml, ConfigError};
use crate::engine::{RawDist, Sampler};
use crate::experiment::config::{sdk_layer, PoolLayers, RawQuota, RawSdk, RawThrottle};
use crate::limiter::admission::{
    ConsumerPolicy, ConsumerSpec, LimiterConfig, Semantics, Unit, BP_FULL,
};
use crate::limiter::rates::OutputAccounting;
use crate::time::{try_secs, Nanos};
use crate::trace::{Consumers, RawTrace, TraceSpec};
use serde::Deserialize;
use std::path::Path;

/// The proxy config's and hosted files' `[[upstream]]` and `[[route]]`
/// tables (the gateway's routes): parsed and validated in [`super::routes`].
pub use super::routes::{RawRoute, RawUpstream};

/// The embedded default scenario file.
pub const EMBEDDED_SCENARIOS_PATH: &str = "experiments/shared-deployment.toml";
pub const EMBEDDED_SCENARIOS_NAME: &str = "experiments/shared-deployment.toml (embedded)";

#[derive(Debug, Deserialize, Default, Clone, Copy)]
#[serde(deny_unknown_fields)]
pub struct RawPolicy {
    rpm: Option<i64>,
    tokens_per_hour: Option<i64>,
    concurrent: Option<i64>,
    max_input_tokens: Option<i64>,
}

impl RawPolicy {
    fn validate(&self, file: &str, at: &str) -> Result<ConsumerPolicy, ConfigError> {
        let pos = |name: &str, v: Option<i64>| -> Result<Option<u64>, ConfigError> {
            match v {
                None => Ok(None),
                Some(x) if x > 0 => Ok(Some(x as u64)),
                Some(x) => Err(ConfigError::new(
                    file,
                    format!("{at}.{name}"),
                    format!("must be > 0, got {x}"),
                )),
            }
        };
        Ok(ConsumerPolicy {
            rpm: pos("rpm", self.rpm)?,
            tokens_per_hour: pos("tokens_per_hour", self.tokens_per_hour)?,
            concurrent: pos("concurrent", self.concurrent)?.map(|x| x.min(u32::MAX as u64) as u32),
            max_input_tokens: pos("max_input_tokens", self.max_input_tokens)?,
        })
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawDeployment {
    capacity: i64,
    #[serde(default = "default_unit")]
    unit: String,
    #[serde(default = "default_threshold")]
    threshold: f64,
    burst: Option<i64>,
    #[serde(default = "default_semantics")]
    semantics: String,
    #[serde(default = "default_accounting")]
    accounting: String,
}

fn default_unit() -> String {
    "rpm".into()
}
fn default_threshold() -> f64 {
    0.8
}
fn default_semantics() -> String {
    "strict-floors".into()
}
fn default_accounting() -> String {
    "reserve_refund".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConsumer {
    name: String,
    #[serde(default)]
    reserved_pct: f64,
    limits: Option<RawPolicy>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLoad {
    /// "all", "reserved", "unreserved", or a consumer name.
    who: String,
    rpm: Option<f64>,
    ramp_to_rpm: Option<f64>,
    workers: Option<i64>,
    think_s: Option<f64>,
    #[serde(default)]
    start_s: f64,
    stop_s: Option<f64>,
    /// A request trace replayed from `start_s` (times and token counts as
    /// logged), in place of `rpm` or `workers`.
    trace: Option<RawTrace>,
    /// The callers' layers, as a hosted experiment's pool takes them.
    sdk_retries: Option<bool>,
    retry: Option<RawRetry>,
    retry_quota: Option<RawQuota>,
    throttle: Option<RawThrottle>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: String,
    description: Option<String>,
    duration_s: f64,
    load: Vec<RawLoad>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShared {
    kind: String,
    title: Option<String>,
    description: Option<String>,
    /// Server profile (path relative to the file), or "ideal".
    model: Option<String>,
    #[serde(default = "default_replicas")]
    replicas: i64,
    max_tokens: i64,
    #[serde(default = "default_reject_ms")]
    reject_latency_ms: f64,
    /// The SDK's hidden retries for every load (a load's `sdk_retries`
    /// overrides), with `[sdk]`'s settings: as in hosted experiment files.
    #[serde(default)]
    sdk_retries: bool,
    sdk: Option<RawSdk>,
    /// A named client policy for every load, in place of its own layers
    /// (as in hosted experiment files; pool policies only).
    policy: Option<String>,
    input_tokens: RawDist,
    output_tokens: RawDist,
    deployment: RawDeployment,
    defaults: Option<RawPolicy>,
    consumer: Vec<RawConsumer>,
    scenario: Vec<RawScenario>,
}

fn default_replicas() -> i64 {
    1
}
fn default_reject_ms() -> f64 {
    5.0
}

/// The limiter tables of a file — `[deployment]`, `[defaults]` and
/// `[[consumer]]` — validated into a [`LimiterConfig`]. Shared by
/// shared-deployment files and `qsim proxy` configs (one schema, one
/// validation; field paths name the tables as written).
pub fn limiter_config(
    f: &str,
    d: &RawDeployment,
    defaults: Option<RawPolicy>,
    consumers_raw: &[RawConsumer],
) -> Result<LimiterConfig, ConfigError> {
    if d.capacity <= 0 {
        return Err(ConfigError::new(
            f,
            "deployment.capacity",
            format!("must be > 0, got {}", d.capacity),
        ));
    }
    let unit = Unit::parse(&d.unit).ok_or_else(|| {
        ConfigError::new(
            f,
            "deployment.unit",
            format!("expected \"rpm\" or \"tpm\", got {:?}", d.unit),
        )
    })?;
    if !(d.threshold > 0.0 && d.threshold <= 1.0) {
        return Err(ConfigError::new(
            f,
            "deployment.threshold",
            format!("must be in (0, 1], got {}", d.threshold),
        ));
    }
    let burst = match d.burst {
        None => None,
        Some(b) if b >= 0 => Some(b as u64),
        Some(b) => {
            return Err(ConfigError::new(
                f,
                "deployment.burst",
                format!("must be >= 0, got {b}"),
            ))
        }
    };
    let semantics = parse_semantics(f, "deployment.semantics", &d.semantics)?;
    let accounting = match d.accounting.as_str() {
        "reserve_refund" => OutputAccounting::ReserveRefund,
        "reserve_no_refund" => OutputAccounting::ReserveNoRefund,
        "on_completion" => OutputAccounting::OnCompletion,
        o => {
        return Err(ConfigError::new(
            f,
            "deployment.accounting",
            format!("unknown accounting {o:?}; expected reserve_refund, reserve_no_refund or on_completion"),
        ))
        }
    };
    let default_policy = defaults.unwrap_or_default().validate(f, "defaults")?;
    let mut consumers = Vec::with_capacity(consumers_raw.len());
    // names seen so far: a set, so validation stays linear in the consumers
    let mut seen = std::collections::HashSet::with_capacity(consumers_raw.len());
    for (i, c) in consumers_raw.iter().enumerate() {
        let at = format!("consumer.{i}");
        if c.name.trim().is_empty() || !seen.insert(c.name.as_str()) {
            return Err(ConfigError::new(
                f,
                format!("{at}.name"),
                format!("must be a unique non-empty name, got {:?}", c.name),
            ));
        }
        let bp = pct_to_bp(c.reserved_pct).ok_or_else(|| {
            ConfigError::new(
                f,
                format!("{at}.reserved_pct"),
                format!("must be in [0, 100], got {}", c.reserved_pct),
            )
        })?;
        let over = c
            .limits
            .unwrap_or_default()
            .validate(f, &format!("{at}.limits"))?;
        consumers.push(ConsumerSpec {
            name: c.name.clone(),
            reserved_bp: bp,
            policy: default_policy.overridden_by(&over),
        });
    }
    let limiter = LimiterConfig {
        capacity: d.capacity as u64,
        unit,
        threshold: d.threshold,
        burst,
        semantics,
        accounting,
        consumers,
    };
    limiter
        .validate()
        .map_err(|r| ConfigError::new(f, "consumer", r))?;
    if limiter.reserved_bp_total() > BP_FULL {
        return Err(ConfigError::new(f, "consumer", "reservations exceed 100 %"));
    }
    Ok(limiter)
}

/// Which consumers a load line drives.
#[derive(Debug, Clone, PartialEq)]
pub enum Who {
    All,
    Reserved,
    Unreserved,
    Named(String),
}

/// How a consumer's requests arrive.
#[derive(Debug, Clone, PartialEq)]
pub enum Arrival {
    /// Open loop: Poisson at `rpm`, ramping linearly to `ramp_to_rpm` at the stop time.
    Open { rpm: f64, ramp_to_rpm: f64 },
    /// Closed loop: `workers` each send, wait for the outcome (and retries),
    /// think, and send again.
    Closed { workers: u32, think: Nanos },
    /// A request trace, replayed from the load's start until its stop:
    /// each row one request with its logged input and output tokens (the
    /// output capped at `max_tokens`), its time from the trace's first row
    /// (after the trace's window, compression, scale and loops).
    Trace { spec: Box<TraceSpec>, to: TraceTo },
}

/// Whose requests a trace's rows are.
#[derive(Debug, Clone, PartialEq)]
pub enum TraceTo {
    /// The trace names no consumers: every consumer the load drives replays
    /// the whole trace (as every one of them sends at an open load's `rpm`).
    Each,
    /// The trace's consumers (its column, or its split by share) by index:
    /// the file's consumer each one is.
    Mapped(Vec<u32>),
}

#[derive(Debug, Clone)]
pub struct Load {
    pub who: Who,
    pub arrival: Arrival,
    pub start: Nanos,
    pub stop: Nanos,
    /// The callers' layers: own retry policy and the SDK's hidden retries.
    pub caller: CallerPolicy,
    /// The retry quota and adaptive throttle each consumer's callers under
    /// this load share (fresh for each run; one per consumer the load drives).
    pub shared: PoolShared,
}

#[derive(Debug, Clone)]
pub struct Scenario {
    /// Position in the file: it scopes the scenario's random streams, so
    /// running a subset (`--only`) does not change any scenario's draws.
    pub index: usize,
    pub name: String,
    pub description: String,
    pub duration: Nanos,
    pub loads: Vec<Load>,
}

/// A validated shared-deployment file.
#[derive(Debug, Clone)]
pub struct SharedFile {
    pub source: String,
    pub title: String,
    pub description: String,
    /// Server profile path as written (relative to the file) or "ideal"; `None` = the default profile.
    pub model: Option<String>,
    pub replicas: u32,
    pub max_tokens: u64,
    pub reject_latency: Nanos,
    pub input_tokens: Sampler,
    pub output_tokens: Sampler,
    pub limiter: LimiterConfig,
    pub scenarios: Vec<Scenario>,
}

/// Parse a reservation in percent into basis points (0..=10000).
pub fn pct_to_bp(p: f64) -> Option<u32> {
    if p.is_finite() && (0.0..=100.0).contains(&p) {
        Some((p * 100.0).round() as u32)
    } else {
        None
    }
}

pub fn parse_semantics(src: &str, field: &str, s: &str) -> Result<Semantics, ConfigError> {
    Semantics::parse(s).ok_or_else(|| {
        ConfigError::new(
            src,
            field,
            format!(
                "unknown semantics {s:?}; expected one of {}",
                Semantics::NAMES
            ),
        )
    })
}

impl SharedFile {
    /// Keep only the named scenarios (`--only`), in file order; each keeps
    /// its random streams (scoped by its position in the file).
    pub fn retain_only(&mut self, only: &[String]) -> Result<(), ConfigError> {
        if only.is_empty() {
            return Ok(());
        }
        for n in only {
            if !self.scenarios.iter().any(|s| &s.name == n) {
                let names: Vec<&str> = self.scenarios.iter().map(|s| s.name.as_str()).collect();
                return Err(ConfigError::new(
                    "--only",
                    "",
                    format!(
                        "no scenario named {n:?} in {}; it has {}",
                        self.source,
                        names.join(", ")
                    ),
                ));
            }
        }
        self.scenarios.retain(|s| only.contains(&s.name));
        Ok(())
    }

    pub fn embedded() -> Result<Self, ConfigError> {
        let v = parse_toml(
            EMBEDDED_SCENARIOS_NAME,
            crate::config::embedded_must(EMBEDDED_SCENARIOS_PATH),
        )?;
        Self::from_value(EMBEDDED_SCENARIOS_NAME, v)
    }

    pub fn from_value(file: &str, v: toml::Value) -> Result<Self, ConfigError> {
        let f = file;
        let raw: RawShared = from_value(f, v)?;
        crate::config::expect_kind(f, &raw.kind, "shared", "a shared-deployment file")?;
        let limiter = limiter_config(f, &raw.deployment, raw.defaults, &raw.consumer)?;
        if raw.max_tokens <= 0 {
            return Err(ConfigError::new(
                f,
                "max_tokens",
                format!("must be > 0, got {}", raw.max_tokens),
            ));
        }
        if !(1..=4096).contains(&raw.replicas) {
            return Err(ConfigError::new(
                f,
                "replicas",
                format!("must be in 1..=4096, got {}", raw.replicas),
            ));
        }
        let reject_latency = try_secs(raw.reject_latency_ms / 1e3).map_err(|_| {
            ConfigError::new(
                f,
                "reject_latency_ms",
                format!(
                    "must be a number of milliseconds in [0, 1e12] (up to 1e9 s), got {}",
                    crate::time::show(raw.reject_latency_ms)
                ),
            )
        })?;
        let input_tokens = raw
            .input_tokens
            .validate()
            .map_err(|r| ConfigError::new(f, "input_tokens", r))?;
        let output_tokens = raw
            .output_tokens
            .validate()
            .map_err(|r| ConfigError::new(f, "output_tokens", r))?;
        let sdk = sdk_layer(f, raw.sdk.as_ref())?;
        let policy = match &raw.policy {
            None => None,
            Some(name) => match preset(name).map_err(|r| ConfigError::new(f, "policy", r))? {
                ClientPolicy::Pool { retry, shared } => Some((retry, shared)),
                ClientPolicy::Aimd => {
                    return Err(ConfigError::new(
                        f,
                        "policy",
                        "\"aimd\" is the managed executor; a shared scenario's loads are callers: choose a pool policy",
                    ))
                }
            },
        };
        if raw.scenario.is_empty() {
            return Err(ConfigError::new(
                f,
                "scenario",
                "at least one scenario is needed",
            ));
        }
        let mut scenarios = Vec::new();
        for (si, s) in raw.scenario.iter().enumerate() {
            let at = format!("scenario.{si}");
            if !(s.duration_s.is_finite() && s.duration_s > 0.0 && s.duration_s <= 86_400.0) {
                return Err(ConfigError::new(
                    f,
                    format!("{at}.duration_s"),
                    format!("must be in (0, 86400], got {}", s.duration_s),
                ));
            }
            let duration = try_secs(s.duration_s)
                .map_err(|e| ConfigError::new(f, format!("{at}.duration_s"), e.to_string()))?;
            let mut loads = Vec::new();
            for (li, l) in s.load.iter().enumerate() {
                let la = format!("{at}.load.{li}");
                let who = match l.who.as_str() {
                    "all" => Who::All,
                    "reserved" => Who::Reserved,
                    "unreserved" => Who::Unreserved,
                    n => Who::Named(n.to_string()),
                };
                let dur = |name: &str, v: f64| -> Result<Nanos, ConfigError> {
                    try_secs(v)
                        .map_err(|e| ConfigError::new(f, format!("{la}.{name}"), e.to_string()))
                };
                let nonneg = |name: &str, v: f64| -> Result<f64, ConfigError> {
                    if v.is_finite() && v >= 0.0 {
                        Ok(v)
                    } else {
                        Err(ConfigError::new(
                            f,
                            format!("{la}.{name}"),
                            format!("must be a number >= 0, got {v}"),
                        ))
                    }
                };
                let arrival = match (l.rpm, l.workers) {
                    _ if l.trace.is_some() => {
                        if l.rpm.is_some()
                            || l.workers.is_some()
                            || l.ramp_to_rpm.is_some()
                            || l.think_s.is_some()
                        {
                            return Err(ConfigError::new(
                                f,
                                &la,
                                "a trace load takes no `rpm`, `ramp_to_rpm`, `workers` or `think_s`: the trace sets the arrivals",
                            ));
                        }
                        let raw_trace = l.trace.as_ref().expect("a trace");
                        trace_arrival(self_resolve(&limiter, &who), f, &la, raw_trace, &limiter)?
                    }
                    (Some(r), None) => {
                        let r = nonneg("rpm", r)?;
                        let to = nonneg("ramp_to_rpm", l.ramp_to_rpm.unwrap_or(r))?;
                        Arrival::Open {
                            rpm: r,
                            ramp_to_rpm: to,
                        }
                    }
                    (None, Some(w)) if (1..=1_000_000).contains(&w) => Arrival::Closed {
                        workers: w as u32,
                        think: dur("think_s", l.think_s.unwrap_or(0.0))?,
                    },
                    (None, Some(w)) => {
                        return Err(ConfigError::new(
                            f,
                            format!("{la}.workers"),
                            format!("must be in 1..=1000000, got {w}"),
                        ))
                    }
                    _ => {
                        return Err(ConfigError::new(
                            f,
                            &la,
                            "give exactly one of `rpm` (open loop), `workers` (closed loop) or `trace` (a request trace)",
                        ))
                    }
                };
                let start = dur("start_s", l.start_s)?;
                let stop = l
                    .stop_s
                    .map(|x| dur("stop_s", x))
                    .transpose()?
                    .unwrap_or(duration)
                    .min(duration);
                if stop <= start {
                    return Err(ConfigError::new(
                        f,
                        format!("{la}.stop_s"),
                        "must be after start_s and inside the scenario",
                    ));
                }
                let layers = PoolLayers {
                    retry: l.retry.as_ref(),
                    retry_quota: l.retry_quota.as_ref(),
                    throttle: l.throttle.as_ref(),
                };
                let sdk_on = l.sdk_retries.unwrap_or(raw.sdk_retries);
                let (mut caller, mut shared) =
                    layers.validate(f, &la, sdk_on.then(|| sdk.clone()))?;
                if let Some((retry, preset_shared)) = &policy {
                    caller.retry = retry.clone();
                    shared = preset_shared.clone();
                }
                loads.push(Load {
                    who,
                    arrival,
                    start,
                    stop,
                    caller,
                    shared,
                });
            }
            scenarios.push(Scenario {
                index: scenarios.len(),
                name: s.name.clone(),
                description: s.description.clone().unwrap_or_default(),
                duration,
                loads,
            });
        }
        Ok(SharedFile {
            source: f.to_string(),
            title: raw.title.unwrap_or_default(),
            description: raw.description.unwrap_or_default(),
            model: raw.model,
            replicas: raw.replicas as u32,
            max_tokens: raw.max_tokens as u64,
            reject_latency,
            input_tokens,
            output_tokens,
            limiter,
            scenarios,
        })
    }

    /// Consumer indices a load line drives (in consumer order).
    pub fn resolve(&self, who: &Who) -> Vec<usize> {
        self_resolve(&self.limiter, who)
    }
}

/// Consumer indices of `limiter` that `who` names (in consumer order).
fn self_resolve(limiter: &LimiterConfig, who: &Who) -> Vec<usize> {
    limiter
        .consumers
        .iter()
        .enumerate()
        .filter(|(_, c)| match who {
            Who::All => true,
            Who::Reserved => c.reserved_bp > 0,
            Who::Unreserved => c.reserved_bp == 0,
            Who::Named(n) => &c.name == n,
        })
        .map(|(i, _)| i)
        .collect()
}

/// A trace load: the trace checked row by row (once, here), and its
/// consumers mapped to the file's. A trace that names consumers (a column,
/// a proxy log's names, or a split by share) sends each row to the file's
/// consumer of that name, which must be one the load drives; a trace that
/// names none is replayed whole by every consumer the load drives.
fn trace_arrival(
    targets: Vec<usize>,
    f: &str,
    la: &str,
    raw: &RawTrace,
    limiter: &LimiterConfig,
) -> Result<Arrival, ConfigError> {
    let at = format!("{la}.trace.");
    let spec = TraceSpec::from_raw(f, &at, Path::new(f), raw, true)?;
    let to = match &spec.consumers {
        Consumers::One => TraceTo::Each,
        Consumers::Column | Consumers::Shares(_) => {
            let names = &spec.summary.as_ref().expect("a scanned trace").consumers;
            let mut to = Vec::with_capacity(names.len());
            for n in names {
                let hit = targets
                    .iter()
                    .copied()
                    .find(|&c| &limiter.consumers[c].name == n);
                match hit {
                    Some(c) => to.push(c as u32),
                    None => {
                        let drives: Vec<&str> = targets
                            .iter()
                            .map(|&c| limiter.consumers[c].name.as_str())
                            .collect();
                        return Err(ConfigError::new(
                            f,
                            format!("{la}.trace"),
                            format!(
                                "the trace's consumer {n:?} is not one this load drives ({})",
                                if drives.is_empty() {
                                    "none".to_string()
                                } else {
                                    drives.join(", ")
                                }
                            ),
                        ));
                    }
                }
            }
            TraceTo::Mapped(to)
        }
    };
    Ok(Arrival::Trace {
        spec: Box::new(spec),
        to,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = r#"
kind = "shared"
max_tokens = 256
input_tokens = { dist = "const", value = 100 }
output_tokens = { dist = "const", value = 50 }

[deployment]
capacity = 100

[[consumer]]
name = "a"

[[consumer]]
name = "b"
"#;

    /// `top`: top-level keys, or a table (`[sdk]`) last.
    fn parse(top: &str, load: &str) -> Result<SharedFile, ConfigError> {
        let (keys, table) = match top.find('[') {
            Some(i) => top.split_at(i),
            None => (top, ""),
        };
        let text = format!(
            "{keys}\n{BASE}\n{table}\n[[scenario]]\nname = \"s\"\nduration_s = 60\n\n\
             [[scenario.load]]\nwho = \"all\"\nrpm = 10\n{load}"
        );
        SharedFile::from_value("t.toml", toml::from_str(&text).unwrap())
    }

    fn err(extra_top: &str, load: &str) -> String {
        parse(extra_top, load).unwrap_err().to_string()
    }

    #[test]
    fn loads_default_to_no_client_layers() {
        let f = parse("", "").unwrap();
        let l = &f.scenarios[0].loads[0];
        assert_eq!(l.caller.retry, crate::client::policy::RetryPolicy::none());
        assert_eq!(l.caller.sdk, None);
        assert_eq!(l.shared, PoolShared::default());
    }

    #[test]
    fn loads_take_the_hosted_client_layers() {
        let f = parse(
            "sdk_retries = true\n[sdk]\nmax_retries = 3\n",
            "retry = { backoff = \"exponential\", max_attempts = 5 }\n\
             retry_quota = { capacity = 50 }\nthrottle = { k = 1.5 }\n",
        )
        .unwrap();
        let l = &f.scenarios[0].loads[0];
        assert_eq!(l.caller.retry.max_attempts, 5);
        assert_eq!(l.caller.sdk.as_ref().map(|s| s.max_retries), Some(3));
        assert!(l.shared.quota.is_some() && l.shared.throttle.is_some());
        // a load turns the file's SDK layer off
        let f = parse("sdk_retries = true", "sdk_retries = false").unwrap();
        assert_eq!(f.scenarios[0].loads[0].caller.sdk, None);
        // a pool preset replaces the own layers
        let f = parse("policy = \"sre-throttle\"", "").unwrap();
        let l = &f.scenarios[0].loads[0];
        assert!(l.shared.throttle.is_some());
        assert_eq!(l.caller.retry.max_attempts, 8);
    }

    #[test]
    fn client_layer_errors_name_the_field() {
        let e = err("", "throttle = { k = 0.5 }");
        assert!(e.contains("scenario.0.load.0.throttle.k"), "{e}");
        let e = err("", "retry_quota = { cost = 0 }");
        assert!(e.contains("scenario.0.load.0.retry_quota.cost"), "{e}");
        let e = err("", "retry = { backoff = \"sometimes\" }");
        assert!(e.contains("scenario.0.load.0.retry.backoff"), "{e}");
        let e = err("[sdk]\nmax_retries = 101\n", "");
        assert!(e.contains("sdk.max_retries"), "{e}");
        let e = err("policy = \"aimd\"", "");
        assert!(e.contains("policy"), "{e}");
        // unknown fields are refused, in the load's tables too
        let e = err("", "throttle = { k = 2, window = 3 }");
        assert!(e.contains("window"), "{e}");
        let e = err("", "sdk = { max_retries = 1 }");
        assert!(e.contains("sdk"), "{e}");
    }
}
