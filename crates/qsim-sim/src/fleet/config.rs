//! The fleet file (`kind = "fleet"`) and the pieces `qsim fleet` builds
//! fleets from: pools (a profile file, or a profile derived from a model's
//! and a GPU's public figures as `qsim sim2real` derives them), routing
//! policies, the workload. Raw serde structs (`deny_unknown_fields`) →
//! validated [`FleetSpec`] / [`Workload`]; every error names the file and
//! the field (`pool[1].max_tokens`, `workload.mix.llama`, `cdf[3]`).
//!
//! ```toml
//! kind = "fleet"
//! duration_s = 600
//! [route]                      # between pools (default: first)
//! policy = "spill"
//! max_waiting = 4              # per ready replica
//! [[pool]]
//! name = "short"
//! derive = { model = "llama-3.1-70b", gpu = "A100-80GB-SXM", tp = 8 }
//! replicas = 6
//! max_tokens = 6144            # the longest request (input + output) it takes
//! [[pool]]
//! name = "long"
//! profile = "../models/llama-3.1-8b-h100-vllm.toml"
//! replicas = 2
//! router = { policy = "scored", queue = 1, kv = 1, prefix = 2 }
//! [workload]
//! rate = 200                   # requests per second, Poisson
//! cdf = "../data/fleet-sim/azure_cdf.json"
//! ```

use super::workload::{HashedSpec, Len, Source, Synthetic, TokenCdf, Workload};
use super::{FleetSpec, PoolSpec, PrefillLink, Role};
use crate::config::{from_value, read_toml, resolve_relative, source_exists, ConfigError};
use crate::engine::RawDist;
use crate::experiment::scaling::RawAutoscale;
use crate::server::{load_profile, ServerProfile};
use crate::time::Nanos;
use crate::trace::{RawTrace, TraceSpec};
use crate::workload::{ArrivalProcess, Lengths, RawArrivals};
use qsim_core::route::{Policy, Scorers, Spill};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, OnceLock};

/// GPU prices per GPU-hour (embedded; see the file for sources).
pub const GPU_PRICES: &str = include_str!("../../../../data/fleet/gpu-prices.toml");
pub const GPU_PRICES_PATH: &str = "data/fleet/gpu-prices.toml";

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct GpuPrice {
    usd_per_gpu_hour: f64,
    source: String,
}

fn gpu_prices() -> &'static BTreeMap<String, GpuPrice> {
    static P: OnceLock<BTreeMap<String, GpuPrice>> = OnceLock::new();
    P.get_or_init(|| {
        let v = crate::config::parse_toml(GPU_PRICES_PATH, GPU_PRICES)
            .expect("the embedded GPU prices parse");
        from_value(GPU_PRICES_PATH, v).expect("the embedded GPU prices are valid")
    })
}

/// A profile derived from a model and a GPU (`qsim sim2real`'s derivation
/// with vLLM's defaults).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RawDerive {
    pub model: String,
    pub gpu: String,
    #[serde(default = "one")]
    pub tp: i64,
    pub max_num_seqs: Option<i64>,
    pub max_batched_tokens: Option<i64>,
    pub max_model_len: Option<i64>,
    pub gpu_memory_utilization: Option<f64>,
}

fn one() -> i64 {
    1
}

/// A routing policy as written: a name, or a table with its parameters.
#[derive(Debug, Clone, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub policy: String,
    pub max_waiting: Option<i64>,
    pub max_kv: Option<f64>,
    pub queue: Option<f64>,
    pub kv: Option<f64>,
    pub prefix: Option<f64>,
    pub weights: Option<Vec<i64>>,
}

impl RawRoute {
    pub fn named(policy: &str) -> Self {
        RawRoute {
            policy: policy.to_string(),
            ..Default::default()
        }
    }

    /// From a TOML value (a string or a table) at `at` of `file`.
    pub fn from_toml(file: &str, at: &str, v: &toml::Value) -> Result<Self, ConfigError> {
        match v {
            toml::Value::String(s) => Ok(RawRoute::named(s)),
            toml::Value::Table(_) => from_value(file, v.clone()).map_err(|e| e.under(at)),
            _ => Err(ConfigError::new(
                file,
                at,
                "must be a policy name or a table with `policy`",
            )),
        }
    }

    /// Validate into the core's policy; `targets`: how many targets the
    /// router chooses among (for `weighted`).
    pub fn validate(&self, file: &str, at: &str, targets: usize) -> Result<Policy, ConfigError> {
        let fld = |x: &str| {
            if at.is_empty() {
                x.to_string()
            } else {
                format!("{at}.{x}")
            }
        };
        let unused = |name: &str, set: bool| -> Result<(), ConfigError> {
            if set {
                Err(ConfigError::new(
                    file,
                    fld(name),
                    format!("not a parameter of policy {:?}", self.policy),
                ))
            } else {
                Ok(())
            }
        };
        let spill_set = self.max_waiting.is_some() || self.max_kv.is_some();
        let score_set = self.queue.is_some() || self.kv.is_some() || self.prefix.is_some();
        let p = self.policy.as_str();
        if p != "spill" {
            unused("max_waiting", self.max_waiting.is_some())?;
            unused("max_kv", self.max_kv.is_some())?;
        }
        if p != "scored" {
            unused("queue", self.queue.is_some())?;
            unused("kv", self.kv.is_some())?;
            unused("prefix", self.prefix.is_some())?;
        }
        if p != "weighted" {
            unused("weights", self.weights.is_some())?;
        }
        Ok(match p {
            "first" => Policy::First,
            "round_robin" => Policy::RoundRobin,
            "least_outstanding" => Policy::LeastOutstanding,
            "least_kv" => Policy::LeastKv,
            "spill" => {
                if !spill_set {
                    return Err(ConfigError::new(
                        file,
                        fld("policy"),
                        "spill needs max_waiting or max_kv",
                    ));
                }
                let max_waiting = match self.max_waiting {
                    None => None,
                    Some(m) if (1..=1_000_000).contains(&m) => Some(m as u64),
                    Some(m) => {
                        return Err(ConfigError::new(
                            file,
                            fld("max_waiting"),
                            format!("must be in 1..=1000000, got {m}"),
                        ))
                    }
                };
                let max_kv = match self.max_kv {
                    None => None,
                    Some(k) if k.is_finite() && k > 0.0 && k <= 1.0 => Some(k),
                    Some(k) => {
                        return Err(ConfigError::new(
                            file,
                            fld("max_kv"),
                            format!("must be a fraction in (0, 1], got {k}"),
                        ))
                    }
                };
                Policy::Spill(Spill {
                    max_waiting,
                    max_kv,
                })
            }
            "scored" => {
                let w = |name: &str, v: Option<f64>| -> Result<f64, ConfigError> {
                    let v = v.unwrap_or(if score_set { 0.0 } else { 1.0 });
                    if v.is_finite() && (0.0..=1e6).contains(&v) {
                        Ok(v)
                    } else {
                        Err(ConfigError::new(
                            file,
                            fld(name),
                            format!("must be a weight in [0, 1e6], got {v}"),
                        ))
                    }
                };
                let s = Scorers {
                    queue: w("queue", self.queue)?,
                    kv: w("kv", self.kv)?,
                    prefix: w("prefix", self.prefix)?,
                };
                if s.queue + s.kv + s.prefix == 0.0 {
                    return Err(ConfigError::new(
                        file,
                        fld("queue"),
                        "at least one scorer needs a weight above 0",
                    ));
                }
                Policy::Scored(s)
            }
            "weighted" => {
                let ws = self.weights.as_ref().ok_or_else(|| {
                    ConfigError::new(file, fld("weights"), "weighted needs one weight per target")
                })?;
                if ws.len() != targets {
                    return Err(ConfigError::new(
                        file,
                        fld("weights"),
                        format!("needs {targets} weights (one per target), got {}", ws.len()),
                    ));
                }
                let mut out = Vec::with_capacity(ws.len());
                for (i, &w) in ws.iter().enumerate() {
                    if !(1..=1_000_000).contains(&w) {
                        return Err(ConfigError::new(
                            file,
                            fld(&format!("weights[{i}]")),
                            format!("must be in 1..=1000000, got {w}"),
                        ));
                    }
                    out.push(w as u64);
                }
                Policy::Weighted(out)
            }
            other => {
                return Err(ConfigError::new(
                    file,
                    fld("policy"),
                    format!(
                        "unknown policy {other:?}; expected first, round_robin, least_outstanding, least_kv, spill, scored or weighted"
                    ),
                ))
            }
        })
    }
}

/// A pool as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPool {
    pub name: String,
    /// A server profile file (relative to the fleet file, or `builtin:…`).
    pub profile: Option<String>,
    /// Or a profile derived from a model and a GPU.
    pub derive: Option<RawDerive>,
    #[serde(default = "one")]
    pub replicas: i64,
    pub autoscale: Option<RawAutoscale>,
    /// Within the pool (default: least_outstanding).
    pub router: Option<toml::Value>,
    /// Models served (default: every model of the fleet).
    pub models: Option<Vec<String>>,
    /// The longest request (input + output tokens) the pool takes.
    pub max_tokens: Option<i64>,
    /// Requests of this many tokens or fewer go to other pools.
    pub min_tokens: Option<i64>,
    /// US dollars per replica-hour (default: the profile's `[price]`, or
    /// the GPU's price × tp for a derived profile).
    pub price_usd_hour: Option<f64>,
    /// Cache prefixes by the workload's block hashes (default: yes, as
    /// vLLM does).
    pub prefix_cache: Option<bool>,
    /// `"prefill"`: the pool only prefills for decode pools naming it
    /// (default `"serve"`).
    pub role: Option<String>,
    /// Prefill/decode disaggregation: the pool decodes, its prompts
    /// prefilled on this pool (of `role = "prefill"`).
    pub prefill_pool: Option<String>,
    /// The KV link into each decode replica, GB/s (default 50: a 400 Gb/s
    /// NIC).
    pub kv_link_gb_s: Option<f64>,
    /// Prompts whose uncached part is at most this many tokens are
    /// prefilled on the decode replica (default 0).
    pub local_prefill_tokens: Option<i64>,
}

/// A trace with block hashes (Mooncake's JSON Lines).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawMooncake {
    pub file: String,
    /// Tokens per hash (default 512, the Mooncake release's).
    pub block_tokens: Option<i64>,
    /// Times divided by this (default 1).
    pub compress: Option<f64>,
}

/// Synthetic shared prefixes on an open-loop workload.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrefix {
    /// Tokens per block hash (default 512).
    pub unit_tokens: Option<i64>,
    #[serde(default)]
    pub system_prompts: i64,
    #[serde(default)]
    pub system_tokens: i64,
    #[serde(default)]
    pub sessions: i64,
    pub turns: Option<f64>,
    pub max_prompt_tokens: Option<i64>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawWorkload {
    /// Requests per second (open loop).
    pub rate: Option<f64>,
    pub arrivals: Option<RawArrivals>,
    pub input_tokens: Option<RawDist>,
    pub output_tokens: Option<RawDist>,
    /// A token-length CDF file (vllm-sr-sim's format).
    pub cdf: Option<String>,
    /// The input's share of a CDF total (default 0.8, vllm-sr-sim's).
    pub input_share: Option<f64>,
    pub trace: Option<RawTrace>,
    /// A trace with block hashes.
    pub mooncake: Option<RawMooncake>,
    /// Shared prefixes drawn on the open loop.
    pub prefix: Option<RawPrefix>,
    /// Model → share of requests.
    pub mix: Option<BTreeMap<String, f64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFleetFile {
    kind: String,
    title: Option<String>,
    description: Option<String>,
    duration_s: f64,
    #[serde(default)]
    drain: bool,
    /// Requests arriving before this are left out of the percentiles.
    warmup_s: Option<f64>,
    route: Option<toml::Value>,
    #[serde(default)]
    pool: Vec<RawPool>,
    workload: RawWorkload,
}

/// A fleet file, validated.
#[derive(Debug, Clone)]
pub struct FleetFile {
    pub title: String,
    pub description: String,
    pub fleet: FleetSpec,
    pub workload: Workload,
    pub duration: Nanos,
    pub drain: bool,
    pub warmup: Nanos,
}

/// A resolved profile: the profile, its label, the model it serves by
/// default and its price per replica-hour (if known).
#[derive(Debug, Clone)]
pub struct Resolved {
    pub profile: Arc<ServerProfile>,
    pub label: String,
    pub model: String,
    pub price: Option<(f64, String)>,
}

/// The sim2real data, parsed once.
fn sim2real_data() -> Result<&'static crate::sim2real::data::Data, ConfigError> {
    static D: OnceLock<Result<crate::sim2real::data::Data, ConfigError>> = OnceLock::new();
    D.get_or_init(crate::sim2real::data::Data::embedded)
        .as_ref()
        .map_err(Clone::clone)
}

/// A profile derived from `d` (errors at `at` of `file`).
pub fn derive_profile(file: &str, at: &str, d: &RawDerive) -> Result<Resolved, ConfigError> {
    let data = sim2real_data()?;
    let fld = |x: &str| format!("{at}.{x}");
    let model = data.models.get(&d.model).ok_or_else(|| {
        ConfigError::new(
            file,
            fld("model"),
            format!(
                "unknown model {:?}; known: {}",
                d.model,
                data.models.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let gpu = data.gpus.get(&d.gpu).ok_or_else(|| {
        ConfigError::new(
            file,
            fld("gpu"),
            format!(
                "unknown GPU {:?}; known: {}",
                d.gpu,
                data.gpus.keys().cloned().collect::<Vec<_>>().join(", ")
            ),
        )
    })?;
    let int = |name: &str, v: Option<i64>, dflt: i64, max: i64| -> Result<u32, ConfigError> {
        let v = v.unwrap_or(dflt);
        if (1..=max).contains(&v) {
            Ok(v as u32)
        } else {
            Err(ConfigError::new(
                file,
                fld(name),
                format!("must be in 1..={max}, got {v}"),
            ))
        }
    };
    let tp = d.tp;
    if ![1, 2, 4, 8].contains(&tp) {
        return Err(ConfigError::new(
            file,
            fld("tp"),
            format!("must be 1, 2, 4 or 8, got {tp}"),
        ));
    }
    let util = d.gpu_memory_utilization.unwrap_or(0.9);
    if !(util.is_finite() && util > 0.0 && util <= 1.0) {
        return Err(ConfigError::new(
            file,
            fld("gpu_memory_utilization"),
            format!("must be in (0, 1], got {util}"),
        ));
    }
    // vLLM v0.15.1's defaults (the sim2real study's engine)
    let e = crate::sim2real::data::Experiment {
        id: 0,
        folder: String::new(),
        set: String::new(),
        model: d.model.clone(),
        gpu: d.gpu.clone(),
        tp: tp as u32,
        precision: if d.model.ends_with("fp8") {
            "fp8".into()
        } else {
            "bf16".into()
        },
        max_num_batched_tokens: int("max_batched_tokens", d.max_batched_tokens, 8192, 1 << 20)?,
        max_num_seqs: int("max_num_seqs", d.max_num_seqs, 256, 4096)?,
        max_model_len: int("max_model_len", d.max_model_len, 32768, 1 << 24)?,
        gpu_memory_utilization: util,
        cpu_offload: false,
        prefix_caching: false,
        workload: crate::sim2real::data::Workload {
            preset: String::new(),
            num_groups: 1,
            prompts_per_group: 1,
            system_prompt_len: 0,
            question_len: 1,
            output_len: 1,
            multi_turn: false,
            ignore_eos: false,
            stages: Vec::new(),
        },
    };
    let c = crate::sim2real::data::shipped_coefficients()?;
    let mut p = crate::sim2real::derive::profile(&e, model, gpu, &c).map_err(|e| {
        ConfigError::new(file, at, format!("cannot derive the profile: {}", e.reason))
    })?;
    let label = format!("{}@{}x{}", d.model, d.gpu, tp);
    p.name = label.clone();
    let price = gpu_prices().get(&d.gpu).map(|g| {
        (
            g.usd_per_gpu_hour * tp as f64,
            format!("{} × {tp} GPUs ({})", g.usd_per_gpu_hour, g.source),
        )
    });
    Ok(Resolved {
        profile: Arc::new(p),
        label,
        model: d.model.clone(),
        price,
    })
}

/// A profile file (relative to `base`) at `at` of `file`.
pub fn file_profile(file: &str, at: &str, base: &Path, p: &str) -> Result<Resolved, ConfigError> {
    let path = resolve_relative(base, p);
    if !source_exists(&path) {
        return Err(ConfigError::new(
            file,
            at,
            format!("server profile not found: {}", path.display()),
        ));
    }
    let prof = load_profile(&path)?;
    let price = prof
        .replica_hour_usd
        .map(|v| (v, prof.price_source.clone()));
    Ok(Resolved {
        label: p.to_string(),
        model: prof.name.clone(),
        profile: Arc::new(prof),
        price,
    })
}

/// Validate a workload table (`at`: its path, e.g. `workload`); `models`
/// the fleet's model names.
pub fn workload(
    file: &str,
    base: &Path,
    at: &str,
    w: &RawWorkload,
    models: &[String],
) -> Result<Workload, ConfigError> {
    let fld = |x: &str| format!("{at}.{x}");
    let lengths_given = w.input_tokens.is_some() || w.output_tokens.is_some();
    if let Some(m) = &w.mooncake {
        for (name, set) in [
            ("trace", w.trace.is_some()),
            ("cdf", w.cdf.is_some()),
            ("rate", w.rate.is_some()),
            ("arrivals", w.arrivals.is_some()),
            ("input_tokens", lengths_given),
            ("input_share", w.input_share.is_some()),
            ("prefix", w.prefix.is_some()),
        ] {
            if set {
                return Err(ConfigError::new(
                    file,
                    fld(name),
                    "not used with a mooncake trace (its rows give times, tokens and block hashes)",
                ));
            }
        }
        let bt = m.block_tokens.unwrap_or(512);
        if !(1..=1 << 20).contains(&bt) {
            return Err(ConfigError::new(
                file,
                fld("mooncake.block_tokens"),
                format!("must be in 1..=1048576, got {bt}"),
            ));
        }
        let compress = m.compress.unwrap_or(1.0);
        if !(compress.is_finite() && (1e-6..=1e6).contains(&compress)) {
            return Err(ConfigError::new(
                file,
                fld("mooncake.compress"),
                format!("must be in [1e-6, 1e6], got {compress}"),
            ));
        }
        let spec = HashedSpec::scan(&resolve_relative(base, &m.file), bt as u32, compress)?;
        let mix = mix(file, at, w.mix.as_ref(), models)?;
        return Ok(Workload {
            source: Source::Hashed(Arc::new(spec)),
            mix,
        });
    }
    let source = match (&w.trace, &w.cdf) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                file,
                fld("cdf"),
                "give a trace or a cdf, not both",
            ))
        }
        (Some(t), None) => {
            for (name, set) in [
                ("rate", w.rate.is_some()),
                ("arrivals", w.arrivals.is_some()),
                ("input_tokens", lengths_given),
                ("input_share", w.input_share.is_some()),
                ("prefix", w.prefix.is_some()),
            ] {
                if set {
                    return Err(ConfigError::new(
                        file,
                        fld(name),
                        "not used with a trace (its rows give times and tokens)",
                    ));
                }
            }
            let spec = TraceSpec::from_raw(file, &fld("trace."), base, t, true)?;
            Source::Trace(Arc::new(spec))
        }
        (None, cdf) => {
            let rate = w.rate.ok_or_else(|| {
                ConfigError::new(
                    file,
                    fld("rate"),
                    "an open-loop workload needs a rate (requests per second)",
                )
            })?;
            let process =
                ArrivalProcess::new(w.arrivals.as_ref().unwrap_or(&RawArrivals::Poisson), rate)
                    .map_err(|r| ConfigError::new(file, fld("rate"), r))?;
            let len = match cdf {
                Some(c) => {
                    if lengths_given {
                        return Err(ConfigError::new(
                            file,
                            fld("input_tokens"),
                            "give a cdf or input_tokens/output_tokens, not both",
                        ));
                    }
                    let share = w.input_share.unwrap_or(0.8);
                    if !(share.is_finite() && share > 0.0 && share < 1.0) {
                        return Err(ConfigError::new(
                            file,
                            fld("input_share"),
                            format!("must be in (0, 1), got {share}"),
                        ));
                    }
                    let cdf = TokenCdf::load(&resolve_relative(base, c))?;
                    Len::Cdf {
                        cdf: Arc::new(cdf),
                        input_share: share,
                    }
                }
                None => {
                    if w.input_share.is_some() {
                        return Err(ConfigError::new(
                            file,
                            fld("input_share"),
                            "only with a cdf",
                        ));
                    }
                    let (Some(i), Some(o)) = (&w.input_tokens, &w.output_tokens) else {
                        return Err(ConfigError::new(
                            file,
                            fld("input_tokens"),
                            "an open-loop workload needs a cdf, or input_tokens and output_tokens",
                        ));
                    };
                    Len::Dists(Lengths::from_raw(file, &format!("{at}."), i, o)?)
                }
            };
            let prefix = match &w.prefix {
                None => None,
                Some(p) => Some(synthetic(file, &fld("prefix"), p)?),
            };
            Source::Open {
                process,
                len,
                prefix,
            }
        }
    };
    let mix = mix(file, at, w.mix.as_ref(), models)?;
    Ok(Workload { source, mix })
}

/// Validate synthetic prefixes at `at`.
fn synthetic(file: &str, at: &str, p: &RawPrefix) -> Result<Synthetic, ConfigError> {
    let fld = |x: &str| format!("{at}.{x}");
    let int = |name: &str, v: i64, lo: i64, hi: i64| -> Result<u32, ConfigError> {
        if (lo..=hi).contains(&v) {
            Ok(v as u32)
        } else {
            Err(ConfigError::new(
                file,
                fld(name),
                format!("must be in {lo}..={hi}, got {v}"),
            ))
        }
    };
    let unit = int("unit_tokens", p.unit_tokens.unwrap_or(512), 1, 1 << 20)?;
    let system_prompts = int("system_prompts", p.system_prompts, 0, 1 << 20)?;
    let system_tokens = int("system_tokens", p.system_tokens, 0, 1 << 24)?;
    if (system_prompts == 0) != (system_tokens == 0) {
        return Err(ConfigError::new(
            file,
            fld("system_tokens"),
            "system prompts need both system_prompts and system_tokens",
        ));
    }
    let sessions = int("sessions", p.sessions, 0, 1 << 20)?;
    let turns = p.turns.unwrap_or(1.0);
    if !(turns.is_finite() && (1.0..=10_000.0).contains(&turns)) {
        return Err(ConfigError::new(
            file,
            fld("turns"),
            format!("must be a mean number of turns in [1, 10000], got {turns}"),
        ));
    }
    if p.turns.is_some() && sessions == 0 {
        return Err(ConfigError::new(file, fld("turns"), "only with sessions"));
    }
    if sessions == 0 && system_prompts == 0 {
        return Err(ConfigError::new(
            file,
            at,
            "give system prompts (system_prompts, system_tokens) or sessions",
        ));
    }
    let max_prompt = int(
        "max_prompt_tokens",
        p.max_prompt_tokens.unwrap_or(32768),
        1,
        1 << 24,
    )?;
    Ok(Synthetic {
        unit,
        system_prompts: system_prompts.max(1),
        system_tokens,
        sessions,
        turns,
        max_prompt,
    })
}

/// The model mix: (model index, cumulative share).
fn mix(
    file: &str,
    at: &str,
    m: Option<&BTreeMap<String, f64>>,
    models: &[String],
) -> Result<Vec<(u16, f64)>, ConfigError> {
    let Some(m) = m else {
        if models.len() == 1 {
            return Ok(vec![(0, 1.0)]);
        }
        return Err(ConfigError::new(
            file,
            format!("{at}.mix"),
            format!(
                "the pools serve several models ({}): give each model's share of the requests",
                models.join(", ")
            ),
        ));
    };
    let total: f64 = m.values().sum();
    let mut out = Vec::new();
    let mut acc = 0.0;
    for (name, &share) in m {
        let f = format!("{at}.mix.{name}");
        let Some(i) = models.iter().position(|x| x == name) else {
            return Err(ConfigError::new(
                file,
                f,
                format!(
                    "no pool serves model {name:?} (served: {})",
                    models.join(", ")
                ),
            ));
        };
        if !(share.is_finite() && share > 0.0 && share <= 1e9) {
            return Err(ConfigError::new(
                file,
                f,
                format!("a share must be above 0, got {share}"),
            ));
        }
        acc += share / total;
        out.push((i as u16, acc));
    }
    if let Some(l) = out.last_mut() {
        l.1 = 1.0;
    }
    Ok(out)
}

/// Pools from their raw tables (`at`: `pool`), the models they serve (in
/// order of first mention) and the checks between them.
pub fn pools(
    file: &str,
    base: &Path,
    raw: &[RawPool],
) -> Result<(Vec<PoolSpec>, Vec<String>), ConfigError> {
    if raw.is_empty() {
        return Err(ConfigError::new(
            file,
            "pool",
            "at least one [[pool]] is needed",
        ));
    }
    let mut resolved = Vec::new();
    let mut models: Vec<String> = Vec::new();
    let mut names = std::collections::HashSet::new();
    for (i, p) in raw.iter().enumerate() {
        let at = format!("pool[{i}]");
        let fld = |x: &str| format!("{at}.{x}");
        if p.name.trim().is_empty() {
            return Err(ConfigError::new(file, fld("name"), "must not be empty"));
        }
        if !names.insert(p.name.clone()) {
            return Err(ConfigError::new(
                file,
                fld("name"),
                format!("pool {:?} is named twice", p.name),
            ));
        }
        let r = match (&p.profile, &p.derive) {
            (Some(f), None) => file_profile(file, &fld("profile"), base, f)?,
            (None, Some(d)) => derive_profile(file, &fld("derive"), d)?,
            _ => {
                return Err(ConfigError::new(
                    file,
                    fld("profile"),
                    "give a profile file or derive = { model, gpu, tp }, one of the two",
                ))
            }
        };
        let served = p.models.clone().unwrap_or_default();
        for m in &served {
            if m.trim().is_empty() {
                return Err(ConfigError::new(
                    file,
                    fld("models"),
                    "a model name is empty",
                ));
            }
            if !models.contains(m) {
                models.push(m.clone());
            }
        }
        resolved.push((r, served));
    }
    if models.is_empty() {
        // no pool names a model: one model, served everywhere
        models.push("*".into());
    }
    if models.len() > 64 {
        return Err(ConfigError::new(file, "pool", "at most 64 models"));
    }
    let mut out = Vec::new();
    for (i, (p, (r, served))) in raw.iter().zip(resolved).enumerate() {
        let at = format!("pool[{i}]");
        let fld = |x: &str| format!("{at}.{x}");
        if !(0..=4096).contains(&p.replicas) {
            return Err(ConfigError::new(
                file,
                fld("replicas"),
                format!("must be in 0..=4096, got {}", p.replicas),
            ));
        }
        let autoscale = match &p.autoscale {
            Some(a) => Some(a.validate(file, &fld("autoscale"), &r.profile)?),
            None => None,
        };
        let policy = match &p.router {
            None => Policy::LeastOutstanding,
            Some(v) => RawRoute::from_toml(file, &fld("router"), v)?.validate(
                file,
                &fld("router"),
                p.replicas.max(1) as usize,
            )?,
        };
        if let (Some(_), Policy::Weighted(_)) = (&autoscale, &policy) {
            return Err(ConfigError::new(
                file,
                fld("router"),
                "weighted routing needs fixed replicas (one weight each), not an autoscaler",
            ));
        }
        let max_tokens = match p.max_tokens {
            None => None,
            Some(m) if m >= 2 && m <= r.profile.max_model_len as i64 => Some(m as u64),
            Some(m) => {
                return Err(ConfigError::new(
                    file,
                    fld("max_tokens"),
                    format!(
                        "must be in 2..={} (the profile's max_model_len), got {m}",
                        r.profile.max_model_len
                    ),
                ))
            }
        };
        let min_tokens = match p.min_tokens {
            None => None,
            Some(m) if m >= 1 && max_tokens.is_none_or(|x| (m as u64) < x) => Some(m as u64),
            Some(m) => {
                return Err(ConfigError::new(
                    file,
                    fld("min_tokens"),
                    format!("must be at least 1 and below max_tokens, got {m}"),
                ))
            }
        };
        let price = match p.price_usd_hour {
            Some(v) if v.is_finite() && (0.0..=1e6).contains(&v) => v,
            Some(v) => {
                return Err(ConfigError::new(
                    file,
                    fld("price_usd_hour"),
                    format!("must be in [0, 1e6] dollars per replica-hour, got {v}"),
                ))
            }
            None => match &r.price {
                Some((v, _)) => *v,
                None => {
                    return Err(ConfigError::new(
                        file,
                        fld("price_usd_hour"),
                        format!("no price known for {}: give price_usd_hour", r.label),
                    ))
                }
            },
        };
        let idx: Vec<u16> = if served.is_empty() {
            (0..models.len() as u16).collect()
        } else {
            served
                .iter()
                .map(|m| models.iter().position(|x| x == m).expect("listed") as u16)
                .collect()
        };
        out.push(PoolSpec {
            name: p.name.clone(),
            profile: r.profile,
            profile_label: r.label,
            replicas: if autoscale.is_some() {
                autoscale.as_ref().map_or(1, |a| a.min)
            } else {
                p.replicas as u32
            },
            autoscale,
            policy,
            models: idx,
            max_tokens,
            min_tokens,
            replica_hour_usd: price,
            prefix_cache: p.prefix_cache.unwrap_or(true),
            role: match p.role.as_deref() {
                None | Some("serve") => Role::Serve,
                Some("prefill") => Role::Prefill,
                Some(r) => {
                    return Err(ConfigError::new(
                        file,
                        fld("role"),
                        format!("{r:?}: \"serve\" or \"prefill\""),
                    ))
                }
            },
        });
    }
    disagg(file, raw, &mut out)?;
    Ok((out, models))
}

/// The decode pools' links to their prefill pools.
fn disagg(file: &str, raw: &[RawPool], out: &mut [PoolSpec]) -> Result<(), ConfigError> {
    for (i, p) in raw.iter().enumerate() {
        let fld = |x: &str| format!("pool[{i}].{x}");
        let Some(name) = &p.prefill_pool else {
            for (set, f) in [
                (p.kv_link_gb_s.is_some(), "kv_link_gb_s"),
                (p.local_prefill_tokens.is_some(), "local_prefill_tokens"),
            ] {
                if set {
                    return Err(ConfigError::new(file, fld(f), "only with prefill_pool"));
                }
            }
            continue;
        };
        let Some(k) = raw.iter().position(|q| &q.name == name) else {
            return Err(ConfigError::new(
                file,
                fld("prefill_pool"),
                format!("no pool is named {name:?}"),
            ));
        };
        if out[k].role != Role::Prefill || k == i {
            return Err(ConfigError::new(
                file,
                fld("prefill_pool"),
                format!("pool {name:?} is not a prefill pool (role = \"prefill\")"),
            ));
        }
        if out[i].role == Role::Prefill {
            return Err(ConfigError::new(
                file,
                fld("prefill_pool"),
                "a prefill pool does not decode",
            ));
        }
        if out[k].replicas == 0 && out[k].autoscale.is_none() {
            return Err(ConfigError::new(
                file,
                fld("prefill_pool"),
                format!("pool {name:?} has no replicas"),
            ));
        }
        let gb = p.kv_link_gb_s.unwrap_or(50.0);
        if !(gb.is_finite() && gb > 0.0 && gb <= 1e4) {
            return Err(ConfigError::new(
                file,
                fld("kv_link_gb_s"),
                format!("must be in (0, 1e4] GB/s, got {gb}"),
            ));
        }
        let local = p.local_prefill_tokens.unwrap_or(0);
        if !(0..=u32::MAX as i64).contains(&local) {
            return Err(ConfigError::new(
                file,
                fld("local_prefill_tokens"),
                format!("must be 0 or more, got {local}"),
            ));
        }
        out[i].role = Role::Decode(PrefillLink {
            pool: k as u16,
            bytes_per_s: gb * 1e9,
            local_max: local as u32,
        });
    }
    for (i, p) in out.iter().enumerate() {
        let used = out
            .iter()
            .any(|q| matches!(q.role, Role::Decode(l) if l.pool as usize == i));
        if p.role == Role::Prefill && !used {
            return Err(ConfigError::new(
                file,
                format!("pool[{i}].role"),
                "no pool names this prefill pool as its prefill_pool",
            ));
        }
    }
    Ok(())
}

/// The checks between pools and the workload: some replica somewhere;
/// each pool's length threshold inside the workload's lengths; for each
/// model asked for, a pool with replicas for its longest requests.
pub fn check(file: &str, fleet: &FleetSpec, w: &Workload) -> Result<(), ConfigError> {
    if let Some(u) = fleet.prefix_unit {
        for (i, p) in fleet.pools.iter().enumerate() {
            if p.prefix_cache && !u.is_multiple_of(p.profile.block_size) {
                return Err(ConfigError::new(
                    file,
                    format!("pool[{i}].prefix_cache"),
                    format!(
                        "the workload's block hashes cover {u} tokens, not a multiple of the profile's KV block ({} tokens): set prefix_cache = false or change the hash size",
                        p.profile.block_size
                    ),
                ));
            }
        }
    }
    if fleet
        .pools
        .iter()
        .all(|p| p.replicas == 0 && p.autoscale.is_none() || p.role == Role::Prefill)
    {
        return Err(ConfigError::new(
            file,
            "pool",
            "no replica in any pool: give some pool replicas = 1 or more",
        ));
    }
    let range = w.total_range();
    for (i, p) in fleet.pools.iter().enumerate() {
        if let (Some(m), Some((lo, hi))) = (p.max_tokens, range) {
            if m < lo || m >= hi {
                return Err(ConfigError::new(
                    file,
                    format!("pool[{i}].max_tokens"),
                    format!(
                        "threshold {m} is outside the workload's lengths ({lo} to {hi} tokens, input + output): every request would go {}",
                        if m < lo { "past this pool" } else { "to it" }
                    ),
                ));
            }
        }
    }
    for &(model, _) in &w.mix {
        let serving: Vec<&PoolSpec> = fleet
            .pools
            .iter()
            .filter(|p| {
                p.models.contains(&model)
                    && p.role != Role::Prefill
                    && (p.replicas > 0 || p.autoscale.is_some())
            })
            .collect();
        let name = &fleet.models[model as usize];
        if serving.is_empty() {
            return Err(ConfigError::new(
                file,
                format!("workload.mix.{name}"),
                format!("no pool with replicas serves model {name:?}"),
            ));
        }
        if let Some((_, hi)) = range {
            let most = serving
                .iter()
                .map(|p| p.max_tokens.unwrap_or(u64::MAX))
                .max()
                .unwrap_or(0);
            if most < hi {
                return Err(ConfigError::new(
                    file,
                    "pool",
                    format!(
                        "no pool takes requests of model {name:?} over {most} tokens, and the workload has up to {hi}: leave max_tokens off the last pool"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Load and validate a fleet file.
pub fn load(path: &Path) -> Result<FleetFile, ConfigError> {
    let f = path.display().to_string();
    let v = read_toml(path)?;
    let raw: RawFleetFile = from_value(&f, v)?;
    crate::config::expect_kind(&f, &raw.kind, "fleet", "a fleet file")?;
    let (pools, models) = pools(&f, path, &raw.pool)?;
    let route = match &raw.route {
        None => Policy::First,
        Some(v) => RawRoute::from_toml(&f, "route", v)?.validate(&f, "route", pools.len())?,
    };
    let workload = workload(&f, path, "workload", &raw.workload, &models)?;
    let fleet = FleetSpec {
        models,
        pools,
        route,
        prefix_unit: workload.prefix_unit(),
    };
    check(&f, &fleet, &workload)?;
    crate::config::duration_s(&f, "duration_s", raw.duration_s, true)?;
    let duration = crate::time::secs(raw.duration_s);
    let warmup = match raw.warmup_s {
        None => 0,
        Some(w) => {
            crate::config::duration_s(&f, "warmup_s", w, false)?;
            let w = crate::time::secs(w);
            if w >= duration {
                return Err(ConfigError::new(
                    &f,
                    "warmup_s",
                    "must be shorter than duration_s",
                ));
            }
            w
        }
    };
    Ok(FleetFile {
        title: raw.title.unwrap_or_else(|| f.clone()),
        description: raw.description.unwrap_or_default(),
        fleet,
        workload,
        duration,
        drain: raw.drain,
        warmup,
    })
}
