//! `qsim fleet`'s one library function: a plain [`Spec`] (what the flags
//! say) → an [`Outcome`] (a fleet file's run, or the search for the
//! cheapest fleet with its what-if rates and router comparison). The CLI
//! maps flags to the spec and renders the outcome; nothing here names
//! clap.

use super::config::{self, RawDerive};
use super::optimize::{self, Answer, Candidate, Layout, Query, Slo};
use super::run::{self, FleetResult, RunOpts};
use super::workload::{HashedSpec, Len, Source, TokenCdf, Workload};
use super::{FleetSpec, PoolSpec};
use crate::config::ConfigError;
use crate::time::Nanos;
use crate::trace::{RawTrace, TraceSpec};
use crate::workload::{ArrivalProcess, RawArrivals};
use qsim_core::route::{Policy, Scorers, Spill};
use std::path::PathBuf;
use std::sync::Arc;

/// What `qsim fleet` is asked.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// A fleet file: run it (no SLO), or take its workload and its pools'
    /// profiles as the candidates of a search (an SLO).
    pub file: Option<PathBuf>,
    /// The workload: a token-length CDF at `rate`, a trace, or a Mooncake
    /// trace with block hashes.
    pub cdf: Option<PathBuf>,
    pub trace: Option<PathBuf>,
    pub mooncake: Option<PathBuf>,
    pub rate: Option<f64>,
    pub input_share: Option<f64>,
    pub slo: Slo,
    /// Candidates: GPUs (`NAME` or `NAME:TP`) for `model`, profile files.
    pub gpus: Vec<String>,
    pub model: Option<String>,
    pub tp: Option<u32>,
    pub profiles: Vec<PathBuf>,
    /// Two-pool layouts split at these totals (besides one pool).
    pub thresholds: Vec<u64>,
    /// The search again at each of these rates.
    pub whatif: Vec<f64>,
    /// Run the cheapest fleet under each router.
    pub compare_routers: bool,
    /// Requests per pool per run.
    pub requests: u64,
    pub seed: u64,
    /// The replicas' router in each pool (default least_outstanding).
    pub router: Option<String>,
}

/// The model and GPUs the search uses when none are named: vllm-sr-sim's
/// own calibration (Llama-3-70B on 8 GPUs) on the two GPUs with a price.
pub const DEFAULT_MODEL: &str = "llama-3.1-70b";
pub const DEFAULT_TP: u32 = 8;
pub const DEFAULT_GPUS: &[&str] = &["A100-80GB-SXM", "H100-80GB-SXM"];

/// `qsim fleet`'s default work budget (requests plus engine iterations):
/// 20 × `qsim run`'s, as a search is tens of runs (Azure's CDF at 200
/// req/s, two layouts, two GPUs: 40 runs, 10–20 M, ~1 CPU-s).
pub const MAX_REQUESTS: u64 = 20 * crate::budget::DEFAULT_MAX_REQUESTS;

/// A fleet file's run.
#[derive(Debug, Clone)]
pub struct FileRun {
    pub title: String,
    pub file: String,
    pub fleet: FleetSpec,
    pub result: FleetResult,
    pub seed: u64,
    pub warmup: Nanos,
}

/// A router's run of the cheapest fleet.
#[derive(Debug, Clone)]
pub struct RouterRun {
    /// Which level it changes: `pools` (between pools) or `replicas`.
    pub level: &'static str,
    pub name: String,
    pub result: FleetResult,
}

/// The search's outcome.
#[derive(Debug, Clone)]
pub struct Search {
    pub workload_label: String,
    pub rate: Option<f64>,
    pub query: Query,
    pub answer: Answer,
    /// (rate, its answer) for each what-if rate.
    pub whatif: Vec<(f64, Answer)>,
    pub routers: Vec<RouterRun>,
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Run(Box<FileRun>),
    Search(Box<Search>),
}

fn flag(name: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(name, "", reason)
}

/// The workload from the flags, if they name one.
fn flag_workload(s: &Spec) -> Result<Option<(Workload, String)>, ConfigError> {
    let named = [
        ("--cdf", s.cdf.is_some()),
        ("--trace", s.trace.is_some()),
        ("--mooncake", s.mooncake.is_some()),
    ];
    let given: Vec<&str> = named.iter().filter(|n| n.1).map(|n| n.0).collect();
    if given.len() > 1 {
        return Err(flag(
            given[1],
            format!("give one workload, not {} and {}", given[0], given[1]),
        ));
    }
    if s.cdf.is_none() {
        if s.rate.is_some() && s.file.is_none() {
            return Err(flag(
                "--rate",
                "only with --cdf (a trace gives its own times)",
            ));
        }
        if s.input_share.is_some() {
            return Err(flag("--input-share", "only with --cdf"));
        }
    }
    let one = vec![(0u16, 1.0)];
    if let Some(c) = &s.cdf {
        let rate = s.rate.ok_or_else(|| {
            flag(
                "--rate",
                "a CDF workload needs an arrival rate (requests per second)",
            )
        })?;
        let process =
            ArrivalProcess::new(&RawArrivals::Poisson, rate).map_err(|r| flag("--rate", r))?;
        let share = s.input_share.unwrap_or(0.8);
        if !(share.is_finite() && share > 0.0 && share < 1.0) {
            return Err(flag(
                "--input-share",
                format!("must be in (0, 1), got {share}"),
            ));
        }
        let cdf = TokenCdf::load(c)?;
        let label = format!("{} at {} req/s", c.display(), crate::time::show(rate));
        return Ok(Some((
            Workload {
                source: Source::Open {
                    process,
                    len: Len::Cdf {
                        cdf: Arc::new(cdf),
                        input_share: share,
                    },
                    prefix: None,
                },
                mix: one,
            },
            label,
        )));
    }
    if let Some(t) = &s.trace {
        let raw = RawTrace {
            file: t.display().to_string(),
            ..Default::default()
        };
        let spec = TraceSpec::from_raw("--trace", "", std::path::Path::new(""), &raw, true)?;
        return Ok(Some((
            Workload {
                source: Source::Trace(Arc::new(spec)),
                mix: one,
            },
            t.display().to_string(),
        )));
    }
    if let Some(m) = &s.mooncake {
        let spec = HashedSpec::scan(m, 512, 1.0)?;
        return Ok(Some((
            Workload {
                source: Source::Hashed(Arc::new(spec)),
                mix: one,
            },
            m.display().to_string(),
        )));
    }
    Ok(None)
}

/// The candidates from the flags (GPUs for a model, profile files).
fn flag_candidates(s: &Spec) -> Result<Vec<Candidate>, ConfigError> {
    let mut out = Vec::new();
    let model = s.model.clone().unwrap_or_else(|| DEFAULT_MODEL.into());
    let gpus: Vec<String> = if s.gpus.is_empty() && s.profiles.is_empty() {
        DEFAULT_GPUS.iter().map(|g| g.to_string()).collect()
    } else {
        s.gpus.clone()
    };
    for g in &gpus {
        let (name, tp) = match g.split_once(':') {
            Some((n, t)) => (
                n.to_string(),
                t.parse::<i64>()
                    .map_err(|_| flag("--gpu", format!("{g:?}: the part after `:` is the tensor-parallel degree (1, 2, 4 or 8)")))?,
            ),
            None => (g.clone(), s.tp.unwrap_or(DEFAULT_TP) as i64),
        };
        let d = RawDerive {
            model: model.clone(),
            gpu: name,
            tp,
            max_num_seqs: None,
            max_batched_tokens: None,
            max_model_len: Some(131072),
            gpu_memory_utilization: None,
        };
        let r = config::derive_profile("--gpu", "", &d).map_err(|e| {
            let src = if e.field.ends_with("model") {
                "--model"
            } else {
                "--gpu"
            };
            ConfigError::new(src, "", e.reason)
        })?;
        let price = r
            .price
            .ok_or_else(|| {
                flag(
                    "--gpu",
                    format!(
                        "no price known for {}: give its profile (with [price]) by --profile",
                        r.label
                    ),
                )
            })?
            .0;
        out.push(Candidate {
            label: r.label,
            profile: r.profile,
            price,
        });
    }
    for p in &s.profiles {
        let r = config::file_profile(
            "--profile",
            "",
            std::path::Path::new("."),
            &p.display().to_string(),
        )
        .map_err(|e| ConfigError::new("--profile", "", format!("{}: {}", p.display(), e.reason)))?;
        let price = r.price.ok_or_else(|| {
            flag(
                "--profile",
                format!(
                    "{}: the profile has no [price] (replica_hour_usd)",
                    p.display()
                ),
            )
        })?;
        out.push(Candidate {
            label: r.label,
            profile: r.profile,
            price: price.0,
        });
    }
    Ok(out)
}

fn replica_policy(s: &Spec) -> Result<Policy, ConfigError> {
    match &s.router {
        None => Ok(Policy::LeastOutstanding),
        Some(r) => config::RawRoute::named(r)
            .validate("--router", "", 1)
            .map_err(|e| flag("--router", e.reason)),
    }
}

/// Run `qsim fleet`.
pub fn run(s: &Spec) -> Result<Outcome, ConfigError> {
    if s.requests == 0 {
        return Err(flag("--requests", "must be at least 1"));
    }
    let searching = s.slo.any();
    if !searching {
        for (name, set) in [
            ("--gpu", !s.gpus.is_empty()),
            ("--profile", !s.profiles.is_empty()),
            ("--threshold", !s.thresholds.is_empty()),
            ("--whatif", !s.whatif.is_empty()),
            ("--compare-routers", s.compare_routers),
            ("--model", s.model.is_some()),
            ("--tp", s.tp.is_some()),
        ] {
            if set {
                return Err(flag(
                    name,
                    "only with a target to search for (--ttft-p99, --itl-p99 or --e2e-p99)",
                ));
            }
        }
        let Some(path) = &s.file else {
            return Err(flag(
                "--ttft-p99",
                "give a target (--ttft-p99, --itl-p99 or --e2e-p99) and a workload (--cdf with --rate, --trace, --mooncake), or a fleet file to run",
            ));
        };
        if flag_workload(s)?.is_some() || s.rate.is_some() {
            return Err(flag("--cdf", "a fleet file to run has its own [workload]"));
        }
        let f = config::load(path)?;
        let opts = RunOpts {
            drain: f.drain,
            warmup: f.warmup,
            ..RunOpts::new(f.duration)
        };
        let result = run::run(&f.fleet, &f.workload, opts, s.seed)?;
        crate::work::check(&path.display().to_string())?;
        return Ok(Outcome::Run(Box::new(FileRun {
            title: f.title,
            file: path.display().to_string(),
            fleet: f.fleet,
            result,
            seed: s.seed,
            warmup: f.warmup,
        })));
    }
    // the search: the workload and candidates from the flags, else the file
    let file = match &s.file {
        Some(p) => Some(config::load(p)?),
        None => None,
    };
    let (workload, label) = match (flag_workload(s)?, &file) {
        (Some(w), _) => w,
        (None, Some(f)) => (f.workload.clone(), s.file.as_ref().expect("file").display().to_string()),
        (None, None) => {
            return Err(flag(
                "--cdf",
                "a search needs a workload: --cdf FILE --rate R, --trace FILE, --mooncake FILE, or a fleet file's [workload]",
            ))
        }
    };
    let candidates = if let Some(f) = file
        .as_ref()
        .filter(|_| s.gpus.is_empty() && s.profiles.is_empty())
    {
        let mut seen = std::collections::BTreeSet::new();
        f.fleet
            .pools
            .iter()
            .filter(|p| seen.insert(p.profile_label.clone()))
            .map(|p| Candidate {
                label: p.profile_label.clone(),
                profile: p.profile.clone(),
                price: p.replica_hour_usd,
            })
            .collect()
    } else {
        flag_candidates(s)?
    };
    let range = workload.total_range();
    let mut layouts = vec![Layout::Single];
    for &t in &s.thresholds {
        if let Some((lo, hi)) = range {
            if t < lo || t >= hi {
                return Err(flag(
                    "--threshold",
                    format!("{t} is outside the workload's lengths ({lo} to {hi} tokens, input + output)"),
                ));
            }
        }
        if t == 0 {
            return Err(flag("--threshold", "must be at least 1"));
        }
        if !layouts.contains(&Layout::Split(t)) {
            layouts.push(Layout::Split(t));
        }
    }
    for &r in &s.whatif {
        if optimize::rate(&workload).is_none() {
            return Err(flag(
                "--whatif",
                "rates apply to a CDF workload (--cdf with --rate)",
            ));
        }
        ArrivalProcess::new(&RawArrivals::Poisson, r).map_err(|e| flag("--whatif", e))?;
    }
    let query = Query {
        workload: workload.clone(),
        slo: s.slo,
        candidates,
        layouts,
        replica_policy: replica_policy(s)?,
        requests: s.requests,
        seed: s.seed,
        max_replicas: 4096,
    };
    let answer = optimize::optimize(&query)?;
    crate::work::check(&label)?;
    let mut whatif = Vec::new();
    for &r in &s.whatif {
        let mut q = query.clone();
        if let Source::Open { process, .. } = &mut q.workload.source {
            *process =
                ArrivalProcess::new(&RawArrivals::Poisson, r).map_err(|e| flag("--whatif", e))?;
        }
        whatif.push((r, optimize::optimize(&q)?));
        crate::work::check(&label)?;
    }
    let routers = if s.compare_routers {
        compare_routers(&query, &answer)?
    } else {
        Vec::new()
    };
    crate::work::check(&label)?;
    Ok(Outcome::Search(Box::new(Search {
        workload_label: label,
        rate: optimize::rate(&workload),
        query,
        answer,
        whatif,
        routers,
    })))
}

/// The cheapest fleet under other routers: between pools (when it has
/// several: by length, spillover from the short pool, least outstanding,
/// least KV, scored; the long pool then takes any length), and between
/// each pool's replicas (round robin, least outstanding, least KV, scored).
pub fn compare_routers(q: &Query, a: &Answer) -> Result<Vec<RouterRun>, ConfigError> {
    let Some((spec, _)) = &a.fleet else {
        return Ok(Vec::new());
    };
    let opts = {
        match optimize::rate(&q.workload) {
            Some(rate) => {
                let secs = q.requests as f64 / rate;
                RunOpts {
                    warmup: crate::time::secs(secs * 0.1),
                    max_requests: q.requests,
                    ..RunOpts::new(crate::time::secs(secs))
                }
            }
            None => RunOpts::new(crate::time::NEVER - 1),
        }
    };
    let mut out = Vec::new();
    if spec.pools.len() > 1 {
        let open: Vec<PoolSpec> = spec
            .pools
            .iter()
            .map(|p| PoolSpec {
                min_tokens: None,
                ..p.clone()
            })
            .collect();
        let policies = [
            ("length (first)", Policy::First, false),
            (
                "spill (short → long at 4 waiting per replica)",
                Policy::Spill(Spill {
                    max_waiting: Some(4),
                    max_kv: None,
                }),
                true,
            ),
            ("least_outstanding", Policy::LeastOutstanding, true),
            ("least_kv", Policy::LeastKv, true),
            (
                "scored (queue 1, kv 1)",
                Policy::Scored(Scorers {
                    queue: 1.0,
                    kv: 1.0,
                    prefix: 0.0,
                }),
                true,
            ),
        ];
        for (name, p, any_length) in policies {
            let f = FleetSpec {
                pools: if any_length {
                    open.clone()
                } else {
                    spec.pools.clone()
                },
                route: p,
                ..spec.clone()
            };
            out.push(RouterRun {
                level: "pools",
                name: name.into(),
                result: run::run(&f, &q.workload, opts, q.seed)?,
            });
        }
    }
    let replica = [
        ("round_robin", Policy::RoundRobin),
        ("least_outstanding", Policy::LeastOutstanding),
        ("least_kv", Policy::LeastKv),
        (
            "scored (queue 1, kv 1, prefix 2)",
            Policy::Scored(Scorers {
                queue: 1.0,
                kv: 1.0,
                prefix: 2.0,
            }),
        ),
    ];
    for (name, p) in replica {
        let f = FleetSpec {
            pools: spec
                .pools
                .iter()
                .map(|ps| PoolSpec {
                    policy: p.clone(),
                    ..ps.clone()
                })
                .collect(),
            ..spec.clone()
        };
        out.push(RouterRun {
            level: "replicas",
            name: name.into(),
            result: run::run(&f, &q.workload, opts, q.seed)?,
        });
    }
    Ok(out)
}
