//! `qsim plan`: reservation table, rule-of-thumb findings, decision-flow
//! recommendation, and the six seed scenarios simulated through the
//! admission limiter in front of the server model — plus inverse planning
//! (`--need`).

pub mod budget;
pub mod config;
pub mod findings;
pub mod inverse;
pub mod render;
pub mod run;
pub mod seeds;
pub mod sim;

use crate::config::{read_toml, ConfigError};
use crate::limiter::admission::{Unit, BP_FULL};
use crate::server::{load_profile, Cluster, RouterKind, ServerProfile};
use config::{parse_semantics, pct_to_bp, SharedFile};
use sim::{Backend, IdealBackend, ScenarioOutcome};
use std::path::PathBuf;
use std::sync::Arc;

/// Why a plan did not produce a report.
#[derive(Debug)]
pub enum PlanError {
    /// Bad input or over the work budget: exit 2.
    Config(ConfigError),
    /// A target that cannot be met (`--need`, `--e2e-p95`): exit 1 with the reason.
    Unmet(String),
}

impl From<ConfigError> for PlanError {
    fn from(e: ConfigError) -> Self {
        PlanError::Config(e)
    }
}

/// The plan's inputs (from the command line; `None` = from the scenario file).
#[derive(Debug, Clone, Default)]
pub struct PlanSpec {
    /// Deployment capacity per minute (requests, or tokens with --unit tpm).
    pub capacity: Option<String>,
    /// Reservations in percent of capacity, one per reserved consumer: 30,20,30.
    pub reserve: Option<String>,
    /// Utilization threshold in (0, 1] (enforcement point; burst headroom = (1 - threshold) x capacity).
    pub threshold: Option<String>,
    /// Names of the reserved consumers (then the unreserved ones): A,B,C[,dev].
    pub names: Option<String>,
    /// Reservation semantics: rate-limit-only, strict-floors, litellm-priority.
    pub semantics: Option<String>,
    /// Capacity unit: rpm or tpm.
    pub unit: Option<String>,
    /// Burst headroom in capacity units (default (1 - threshold) x capacity).
    pub burst: Option<String>,
    /// Server profile (TOML) or "ideal"; default: the embedded gpt-oss-20b NIM profile.
    pub model: Option<String>,
    /// Server replicas behind the limiter.
    pub replicas: Option<u32>,
    /// Scenario file (kind = "shared"); default: the embedded scenarios of the
    /// shared-deployment article.
    pub scenarios: Option<PathBuf>,
    /// Inverse planning: the minimum each consumer needs, NAME=RPM,...
    pub need: Option<String>,
    /// Inverse planning: E2E p95 target (e.g. 2s, 1500ms; units s or ms).
    pub e2e_p95: Option<crate::time::Nanos>,
    /// Seed of the simulation.
    pub seed: u64,
    /// Number of seeds (seed, seed+1, …): the report adds medians and 90 %
    /// intervals over seeds of each scenario's and consumer's figures.
    pub seeds: u64,
    /// `--set PATH=VALUE` overrides of the scenario file (from `qsim run`/`sweep`).
    pub sets: Vec<String>,
    /// Scenarios to run (from `qsim run --only`); empty: all.
    pub only: Vec<String>,
}

/// Apply `--set` overrides to a shared file. A path whose first segment is
/// not a top-level key but a key of `[deployment]` (`capacity`, `threshold`,
/// `semantics`, `unit`, `burst`, `accounting`) means that key.
pub fn apply_sets(v: &mut toml::Value, sets: &[String]) -> Result<(), ConfigError> {
    for s in sets {
        let first = s.split(['.', '=']).next().unwrap_or("").trim();
        let top = v.get(first).is_some();
        let in_deployment = v
            .get("deployment")
            .and_then(|d| d.as_table())
            .is_some_and(|d| d.contains_key(first) || matches!(first, "burst" | "accounting"));
        if !top && in_deployment {
            crate::config::apply_set(v, &format!("deployment.{}", s.trim())).map_err(|e| {
                ConfigError {
                    source: format!("--set {s}"),
                    ..e
                }
            })?;
        } else {
            crate::config::apply_set(v, s)?;
        }
    }
    Ok(())
}

/// The default server profile, embedded in the binary.
pub const EMBEDDED_PROFILE_PATH: &str = "models/gpt-oss-20b-h100-nim.toml";
pub const EMBEDDED_PROFILE_NAME: &str = "models/gpt-oss-20b-h100-nim.toml (embedded)";

/// The server model a plan runs against.
#[derive(Clone)]
pub enum Model {
    /// No queueing: TTFT 35 ms, ITL 18 ms (the shared-deployment article's unloaded figures).
    Ideal,
    /// The GPU server model (issue 3) with this profile.
    Server {
        name: String,
        profile: Arc<ServerProfile>,
    },
}

impl Model {
    pub fn name(&self) -> String {
        match self {
            Model::Ideal => "ideal (no queueing: TTFT 35 ms, ITL 18 ms)".into(),
            Model::Server { name, .. } => name.clone(),
        }
    }
    pub fn backend(&self, replicas: u32, seed: u64) -> Box<dyn Backend> {
        match self {
            Model::Ideal => Box::new(IdealBackend::seed_nim()),
            Model::Server { profile, .. } => Box::new(Cluster::new(
                profile.clone(),
                replicas,
                RouterKind::LeastOutstanding,
                seed,
            )),
        }
    }
    /// The embedded default profile (gpt-oss-20b on H100 with NIM).
    pub fn embedded() -> Result<Model, ConfigError> {
        let v = crate::config::parse_toml(
            EMBEDDED_PROFILE_NAME,
            crate::config::embedded_must(EMBEDDED_PROFILE_PATH),
        )?;
        let p = ServerProfile::from_value(EMBEDDED_PROFILE_NAME, v)?;
        Ok(Model::Server {
            name: EMBEDDED_PROFILE_NAME.into(),
            profile: Arc::new(p),
        })
    }
}

pub(crate) fn flag_err(flag: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(flag, "", reason)
}

fn parse_num(flag: &str, s: &str) -> Result<f64, ConfigError> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| flag_err(flag, format!("{s:?} is not a number")))?;
    if !v.is_finite() {
        return Err(flag_err(flag, format!("{s:?} is not a finite number")));
    }
    Ok(v)
}

/// `--capacity`: a whole number in 1..=u64::MAX (`1000` or `1e3`), never clamped.
pub fn parse_capacity(c: &str) -> Result<u64, ConfigError> {
    if let Ok(v) = c.trim().parse::<u64>() {
        if v >= 1 {
            return Ok(v);
        }
    }
    let v = parse_num("--capacity", c)?;
    if v < 1.0 || v.fract() != 0.0 {
        return Err(flag_err(
            "--capacity",
            format!("must be a whole number >= 1, got {c}"),
        ));
    }
    // above 2^53 a float no longer holds every whole number
    if v > 9_007_199_254_740_992.0 {
        return Err(flag_err(
            "--capacity",
            format!(
                "{c} is too large: write it in digits up to {} (the largest capacity)",
                u64::MAX
            ),
        ));
    }
    Ok(v as u64)
}

/// The deepest burst headroom a plan accepts, in minutes of capacity: a
/// year. A bucket deeper than that never refills within any plan (the
/// scenarios last minutes to hours), and a depth near `u64::MAX` (what
/// `--burst 18446744073709551616` becomes) overflows the limiter's window
/// arithmetic, where each admission decision then iterates up to 10,000
/// times (about 40 CPU-seconds for the default plan, not counted by the
/// work meter, which counts requests): refused up front instead.
pub const MAX_BURST_MINUTES: u64 = 365 * 24 * 60;

/// Refuse a burst headroom deeper than [`MAX_BURST_MINUTES`] of capacity
/// (naming `--burst` if the flag set it, else the file's `deployment.burst`).
pub fn check_burst(
    source: &str,
    from_flag: bool,
    lim: &crate::limiter::admission::LimiterConfig,
) -> Result<(), ConfigError> {
    let Some(b) = lim.burst else { return Ok(()) };
    let max = lim.capacity.saturating_mul(MAX_BURST_MINUTES);
    if b <= max {
        return Ok(());
    }
    let reason = format!(
        "burst headroom of {b} units is deeper than a year of capacity ({max} units at {} per minute): a bucket that deep never refills within a plan; give at most {max}",
        lim.capacity
    );
    Err(if from_flag {
        flag_err("--burst", reason)
    } else {
        ConfigError::new(source, "deployment.burst", reason)
    })
}

/// Default names of reserved consumers: A..Z, then AA, AB, … (as
/// spreadsheet columns), so any number of shares gets distinct names.
pub fn default_name(i: usize) -> String {
    let mut n = i + 1;
    let mut out = Vec::new();
    while n > 0 {
        n -= 1;
        out.push(b'A' + (n % 26) as u8);
        n /= 26;
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII")
}

/// A parsed `--need A=250,B=150`: (consumer name, units per minute).
pub fn parse_need(s: &str) -> Result<Vec<(String, f64)>, ConfigError> {
    let mut v = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for part in s.split(',') {
        let (n, x) = part
            .split_once('=')
            .ok_or_else(|| flag_err("--need", format!("expected NAME=RPM, got {part:?}")))?;
        let n = n.trim();
        if n.is_empty() {
            return Err(flag_err(
                "--need",
                format!("empty consumer name in {part:?}"),
            ));
        }
        let x = parse_num("--need", x)?;
        if x <= 0.0 {
            return Err(flag_err(
                "--need",
                format!("need of {n} must be > 0, got {x}"),
            ));
        }
        if !seen.insert(n) {
            return Err(flag_err("--need", format!("{n} given twice")));
        }
        v.push((n.to_string(), x));
    }
    Ok(v)
}

/// Load the scenario file (embedded unless `--scenarios`) and apply the flags.
pub fn build(args: &PlanSpec) -> Result<(SharedFile, Model), ConfigError> {
    let mut f = match &args.scenarios {
        None if args.sets.is_empty() => SharedFile::embedded()?,
        None => {
            let mut v = crate::config::parse_toml(
                config::EMBEDDED_SCENARIOS_NAME,
                crate::config::embedded_must(config::EMBEDDED_SCENARIOS_PATH),
            )?;
            apply_sets(&mut v, &args.sets)?;
            SharedFile::from_value(config::EMBEDDED_SCENARIOS_NAME, v)?
        }
        Some(p) => {
            let mut v = read_toml(p)?;
            apply_sets(&mut v, &args.sets)?;
            SharedFile::from_value(&p.display().to_string(), v)?
        }
    };
    f.retain_only(&args.only)?;
    let lim = &mut f.limiter;
    if let Some(c) = &args.capacity {
        lim.capacity = parse_capacity(c)?;
    }
    if let Some(t) = &args.threshold {
        let v = parse_num("--threshold", t)?;
        if !(v > 0.0 && v <= 1.0) {
            return Err(flag_err(
                "--threshold",
                format!("must be in (0, 1], got {t}"),
            ));
        }
        lim.threshold = v;
    }
    if let Some(u) = &args.unit {
        lim.unit = Unit::parse(u)
            .ok_or_else(|| flag_err("--unit", format!("expected rpm or tpm, got {u:?}")))?;
    }
    if let Some(s) = &args.semantics {
        lim.semantics = parse_semantics("--semantics", "", s)?;
    }
    if let Some(b) = &args.burst {
        let v = parse_num("--burst", b)?;
        if v < 0.0 || v.fract() != 0.0 {
            return Err(flag_err(
                "--burst",
                format!("must be a whole number >= 0, got {b}"),
            ));
        }
        lim.burst = Some(v as u64);
    }
    let names: Option<Vec<String>> = args
        .names
        .as_ref()
        .map(|n| n.split(',').map(|x| x.trim().to_string()).collect());
    if let Some(ns) = &names {
        if ns.iter().any(|x| x.is_empty()) {
            return Err(flag_err("--names", "empty name"));
        }
        let mut seen = std::collections::HashSet::with_capacity(ns.len());
        for a in ns {
            if !seen.insert(a.as_str()) {
                return Err(flag_err("--names", format!("{a} given twice")));
            }
        }
    }
    if let Some(r) = &args.reserve {
        let mut bps = Vec::new();
        for part in r.split(',') {
            let v = parse_num("--reserve", part).map_err(|_| {
                flag_err(
                    "--reserve",
                    format!("share {part:?} is not a number (expected percentages like 30,20,30)"),
                )
            })?;
            if v < 0.0 {
                return Err(flag_err("--reserve", format!("share {part} is negative")));
            }
            let bp = pct_to_bp(v)
                .ok_or_else(|| flag_err("--reserve", format!("share {part} is above 100 %")))?;
            bps.push(bp);
        }
        let total: u32 = bps.iter().sum();
        if total > BP_FULL {
            return Err(flag_err(
                "--reserve",
                format!(
                    "shares add up to {:.4} %, more than 100 % of capacity",
                    total as f64 / 100.0
                ),
            ));
        }
        // the reserved consumers are replaced; unreserved ones stay
        let unreserved: Vec<_> = lim
            .consumers
            .iter()
            .filter(|c| c.reserved_bp == 0)
            .cloned()
            .collect();
        let template = lim.consumers.first().cloned().expect("file has consumers");
        let ns = names.clone().unwrap_or_default();
        if names.is_some() && ns.len() != bps.len() && ns.len() != bps.len() + unreserved.len() {
            return Err(flag_err(
                "--names",
                format!(
                    "{} names for {} reserved consumers (one per --reserve share){}: give {} names{}",
                    ns.len(),
                    bps.len(),
                    if unreserved.is_empty() {
                        String::new()
                    } else {
                        format!(" and {} unreserved", unreserved.len())
                    },
                    bps.len(),
                    if unreserved.is_empty() {
                        String::new()
                    } else {
                        format!(", or {} to rename the unreserved ones too", bps.len() + unreserved.len())
                    }
                ),
            ));
        }
        let mut cs = Vec::new();
        for (i, bp) in bps.iter().enumerate() {
            let mut c = template.clone();
            c.name = ns.get(i).cloned().unwrap_or_else(|| default_name(i));
            c.reserved_bp = *bp;
            cs.push(c);
        }
        for (k, mut u) in unreserved.into_iter().enumerate() {
            if let Some(n) = ns.get(bps.len() + k) {
                u.name = n.clone();
            }
            cs.push(u);
        }
        let mut seen = std::collections::HashSet::with_capacity(cs.len());
        for c in &cs {
            if !seen.insert(c.name.as_str()) {
                let (flag, why) = if names.is_some() {
                    ("--names", String::new())
                } else {
                    (
                        "--reserve",
                        " (a default name of a reserved consumer is also an unreserved consumer's name; name them with --names)"
                            .to_string(),
                    )
                };
                return Err(flag_err(
                    flag,
                    format!("consumer name {} used twice{why}", c.name),
                ));
            }
        }
        lim.consumers = cs;
    } else if let Some(ns) = &names {
        let reserved = lim.consumers.iter().filter(|c| c.reserved_bp > 0).count();
        if ns.len() != lim.consumers.len() && ns.len() != reserved {
            return Err(flag_err(
                "--names",
                format!(
                    "{} names for {} consumers ({reserved} reserved, listed first): give {reserved} or {} names",
                    ns.len(),
                    lim.consumers.len(),
                    lim.consumers.len()
                ),
            ));
        }
        for (c, n) in lim.consumers.iter_mut().zip(ns) {
            c.name = n.clone();
        }
    }
    lim.validate().map_err(|r| flag_err("plan", r))?;
    check_burst(&f.source, args.burst.is_some(), &f.limiter)?;
    let known: std::collections::HashSet<&str> = f
        .limiter
        .consumers
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    for (si, s) in f.scenarios.iter().enumerate() {
        for (li, l) in s.loads.iter().enumerate() {
            if let config::Who::Named(n) = &l.who {
                if !known.contains(n.as_str()) {
                    return Err(ConfigError::new(
                        &f.source,
                        format!("scenario.{si}.load.{li}.who"),
                        format!("no consumer named {n:?}"),
                    ));
                }
            }
        }
    }
    if let Some(r) = args.replicas {
        if r == 0 {
            return Err(flag_err("--replicas", "must be >= 1"));
        }
        f.replicas = r;
    }
    let model = match (&args.model, &f.model) {
        (Some(m), _) if m == "ideal" => Model::Ideal,
        (Some(p), _) => {
            let path = std::path::Path::new(p);
            if let Some(why) = crate::config::source_problem("server profile", path) {
                return Err(flag_err("--model", why));
            }
            Model::Server {
                name: p.clone(),
                profile: Arc::new(load_profile(path)?),
            }
        }
        (None, Some(m)) if m == "ideal" => Model::Ideal,
        (None, Some(p)) => {
            let path = crate::config::resolve_relative(std::path::Path::new(&f.source), p);
            Model::Server {
                name: path.display().to_string(),
                profile: Arc::new(load_profile(&path)?),
            }
        }
        (None, None) => Model::embedded()?,
    };
    Ok((f, model))
}

/// One scenario with and without the limiter.
pub struct ScenarioPair {
    pub limited: ScenarioOutcome,
    pub unlimited: ScenarioOutcome,
}

/// Simulate every scenario of the file.
pub fn simulate(
    f: &SharedFile,
    model: &Model,
    seed: u64,
    counterfactual: bool,
) -> Vec<ScenarioPair> {
    (0..f.scenarios.len())
        .map(|si| {
            let mut b = model.backend(f.replicas, seed);
            let limited = sim::run_scenario(f, si, Some(&f.limiter), b.as_mut(), seed);
            let unlimited = if counterfactual {
                let mut b = model.backend(f.replicas, seed);
                sim::run_scenario(f, si, None, b.as_mut(), seed)
            } else {
                limited.clone()
            };
            ScenarioPair { limited, unlimited }
        })
        .collect()
}

/// Per saturated minute: does the reserved consumer get ≥ 99 % of its floor
/// whenever its demand that minute was at least the floor?
pub fn floor_met(o: &ScenarioOutcome, c: usize) -> Option<bool> {
    let co = &o.consumers[c];
    // a floor under one unit per minute cannot show in per-minute counts
    if co.floor_rpm < 1.0 {
        return None;
    }
    let missed = o.saturated.iter().enumerate().any(|(m, &sat)| {
        sat && co.offered_units_per_min[m] as f64 >= co.floor_rpm
            && (co.admitted_units_per_min[m] as f64) < 0.99 * co.floor_rpm
    });
    Some(!missed)
}
