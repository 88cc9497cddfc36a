//! Deployment options side by side (issue 25): one batch of rows — a hosted
//! experiment file's (rows, lengths, `max_tokens`, workers) — run against
//! several ways of buying the tokens: the hosted endpoint pay-per-token
//! with one of the file's client policies, provisioned units (a hosted
//! profile with `[provisioned]`), N fixed server replicas, or autoscaled
//! replicas. For each: when the batch finished, rows that failed, 429s,
//! p95 TTFT and E2E, and the cost; then the cheapest option that finished
//! within a given time with no failed row.
//!
//! ```toml
//! kind = "options"
//! batch = "fmapi-pacing.toml"     # a hosted experiment file
//! within_s = 300                  # default of --within
//!
//! [[option]]
//! name = "pay-per-token"
//! experiment = "exp3-ai-query"    # the batch file's experiment (client)
//!
//! [[option]]
//! name = "ptu-15"
//! experiment = "exp2-backoff"
//! endpoint = "../models/azure-openai-gpt-4o-ptu.toml"
//! provisioned = { units = 15 }
//!
//! [[option]]
//! name = "h100-x2"
//! server = "../models/llama-3.1-8b-h100-vllm.toml"
//! replicas = 2                    # or: autoscale = { ... } (scaling.rs)
//! ```
//!
//! **Costs.** Pay-per-token: the tokens of the rows that succeeded × the
//! profile's prices. Provisioned: units × the batch's elapsed hours × the
//! unit-hour price. Replicas: replica-hours over the batch's elapsed time
//! (autoscaled: the replicas holding a GPU, starting ones included) × the
//! replica-hour price. Every option is billed only for the batch's own
//! duration: nothing before it (no warm-up, no minimum period) or after it.
//! The server options serve the profile's model (an open model on your own
//! GPUs standing in for the hosted one).

pub mod batch;
pub mod emit;
pub mod fewest;
pub mod mix;
pub mod open;
pub mod render;
pub mod search;

use crate::config::{apply_set, from_value, read_toml, resolve_relative, ConfigError};
use crate::engine::DurationHist;
use crate::experiment::hosted::{run_suite, HostedResult};
use crate::experiment::scaling::RawAutoscale;
use crate::experiment::HostedSuite;
use crate::server::{load_profile, RouterKind, ServerProfile};
use crate::time::{secs, Nanos};
use qsim_core::autoscale::Params as AutoscaleParams;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOptions {
    kind: String,
    title: Option<String>,
    /// A hosted experiment file (closed loop), or
    batch: Option<String>,
    /// an open-loop workload.
    workload: Option<RawWorkload>,
    within_s: Option<f64>,
    /// p95 targets (seconds) an option must also meet.
    e2e_p95_s: Option<f64>,
    ttft_p95_s: Option<f64>,
    option: Vec<RawOption>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOption {
    name: String,
    // hosted
    experiment: Option<String>,
    endpoint: Option<String>,
    provisioned: Option<toml::Value>,
    // server replicas
    server: Option<String>,
    replicas: Option<i64>,
    router: Option<String>,
    autoscale: Option<RawAutoscale>,
    replica_hour_usd: Option<f64>,
    /// A hybrid (open-loop workload only): upstreams in spill order.
    route: Option<Vec<RawHop>>,
    /// The hybrid's policy: "first" (spillover, the default) or "weighted".
    policy: Option<String>,
    weights: Option<Vec<i64>>,
}

/// `[workload]`: the open-loop workload.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    rpm: f64,
    duration_s: f64,
    arrivals: Option<crate::workload::RawArrivals>,
    load_shape: Option<crate::workload::RawShape>,
    input_tokens: crate::engine::RawDist,
    output_tokens: crate::engine::RawDist,
    max_tokens: i64,
    /// The OpenAI SDK's hidden retries (default on: max_retries = 2).
    sdk_retries: Option<bool>,
    retry: Option<crate::client::RawRetry>,
}

/// One upstream of a hybrid's route: a hosted endpoint (with its
/// provisioned units) or server replicas; its spill threshold.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHop {
    name: Option<String>,
    endpoint: Option<String>,
    provisioned: Option<toml::Value>,
    server: Option<String>,
    replicas: Option<i64>,
    router: Option<String>,
    autoscale: Option<RawAutoscale>,
    replica_hour_usd: Option<f64>,
    /// Requests it may hold unanswered before the next one takes the rest.
    max_in_flight: Option<i64>,
    cooldown_s: Option<f64>,
    timeout_s: Option<f64>,
}

/// How an option buys the tokens.
#[derive(Debug, Clone)]
pub enum Kind {
    /// A hosted endpoint (pay-per-token or provisioned) called by one of
    /// the batch file's experiments.
    Hosted(Box<HostedSuite>),
    /// Server replicas, fixed or autoscaled.
    Replicas {
        profile: Arc<ServerProfile>,
        replicas: u32,
        router: RouterKind,
        autoscale: Option<AutoscaleParams>,
    },
    /// A route of upstreams against the open-loop workload (every option
    /// of a `[workload]` file: one upstream for a pure option, several for
    /// a hybrid).
    Route(Box<open::RouteSpec>),
}

/// One validated option.
#[derive(Debug, Clone)]
pub struct DeployOption {
    pub name: String,
    pub kind: Kind,
}

/// A validated options file.
#[derive(Debug, Clone)]
pub struct OptionsFile {
    pub title: String,
    pub batch_file: String,
    pub batch: batch::Batch,
    /// The open-loop workload (`[workload]`; then every option is a route).
    pub workload: Option<open::Workload>,
    pub within: Option<Nanos>,
    /// The file's p95 targets (`e2e_p95_s`, `ttft_p95_s`).
    pub e2e_p95: Option<Nanos>,
    pub ttft_p95: Option<Nanos>,
    pub options: Vec<DeployOption>,
}

/// What an option must do to count: finish within `within` (if set) with
/// no failed row, and keep its p95s at or under the targets that are set.
/// A TTFT target is missed by the hosted options, which do not measure TTFT.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Targets {
    pub within: Option<Nanos>,
    pub e2e_p95: Option<Nanos>,
    pub ttft_p95: Option<Nanos>,
}

impl Targets {
    /// Is any target set?
    pub fn any(&self) -> bool {
        self.within.is_some() || self.e2e_p95.is_some() || self.ttft_p95.is_some()
    }

    /// Why `o` misses the targets (None: it meets them). Times compare in
    /// whole nanoseconds; a p95 in seconds is rounded to them first.
    pub fn missed(&self, o: &Outcome) -> Option<String> {
        if o.failed > 0 {
            return Some(format!("{} failed", o.failed));
        }
        if let Some(w) = self.within.filter(|&w| o.elapsed > w) {
            return Some(format!(
                "done {:.1} s > {:.0} s",
                crate::time::to_secs(o.elapsed),
                crate::time::to_secs(w)
            ));
        }
        if let Some(t) = self.e2e_p95.filter(|&t| secs(o.e2e_p95_s) > t) {
            return Some(format!(
                "E2E p95 {:.2} s > {} s",
                o.e2e_p95_s,
                crate::time::to_secs(t)
            ));
        }
        if let Some(t) = self.ttft_p95 {
            match o.ttft_p95_s {
                None => return Some("TTFT not measured".into()),
                Some(v) if secs(v) > t => {
                    return Some(format!("TTFT p95 {v:.2} s > {} s", crate::time::to_secs(t)))
                }
                Some(_) => {}
            }
        }
        None
    }

    /// The targets in words: "finishing within 300 s with no failed row,
    /// E2E p95 ≤ 5 s".
    pub fn describe(&self) -> String {
        let mut s = match self.within {
            Some(w) => format!(
                "finishing within {:.0} s with no failed row",
                crate::time::to_secs(w)
            ),
            None => "with no failed row".to_string(),
        };
        if let Some(t) = self.e2e_p95 {
            s.push_str(&format!(", E2E p95 ≤ {} s", crate::time::to_secs(t)));
        }
        if let Some(t) = self.ttft_p95 {
            s.push_str(&format!(", TTFT p95 ≤ {} s", crate::time::to_secs(t)));
        }
        s
    }
}

/// What one option measured.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub name: String,
    /// "pay-per-token", "provisioned 15 units", "2 replicas", "autoscaled 1-4".
    pub kind: String,
    pub elapsed: Nanos,
    pub ok: u64,
    pub failed: u64,
    /// HTTP 429 responses (hosted options; none from replicas).
    pub http_429: u64,
    /// p95 TTFT of the rows that succeeded (replicas only: the hosted
    /// model does not record it per row).
    pub ttft_p95_s: Option<f64>,
    /// p95 of a row's end-to-end time (hosted: first send to final outcome,
    /// retries and waits included).
    pub e2e_p95_s: f64,
    pub cost_usd: Option<f64>,
    /// A hybrid: the requests its later upstreams answered (the spill).
    pub spilled: Option<u64>,
    /// A route's upstreams' profiles by name (what a hybrid is made of).
    pub profiles: Vec<String>,
}

/// Load `path` with `--set` overrides (on the options file) and `--rows`
/// (replacing the batch's row count).
pub fn load(path: &Path, sets: &[String], rows: Option<u64>) -> Result<OptionsFile, ConfigError> {
    let f = &path.display().to_string();
    let mut v = read_toml(path)?;
    for s in sets {
        apply_set(&mut v, s)?;
    }
    let raw: RawOptions = from_value(f, v)?;
    crate::config::expect_kind(f, &raw.kind, "options", "a deployment-options file")?;
    let within = match raw.within_s {
        Some(w) if !(w.is_finite() && w > 0.0 && w <= 1e9) => {
            return Err(ConfigError::new(
                f,
                "within_s",
                format!("must be in (0, 1e9] seconds, got {w}"),
            ))
        }
        Some(w) => Some(secs(w)),
        None => None,
    };
    let p95_target = |name: &str, v: Option<f64>| match v {
        Some(x) if !(x.is_finite() && x > 0.0 && x <= 1e7) => Err(ConfigError::new(
            f,
            name,
            format!("must be in (0, 1e7] seconds, got {x}"),
        )),
        Some(x) => Ok(Some(secs(x))),
        None => Ok(None),
    };
    let e2e_p95 = p95_target("e2e_p95_s", raw.e2e_p95_s)?;
    let ttft_p95 = p95_target("ttft_p95_s", raw.ttft_p95_s)?;
    if raw.option.is_empty() {
        return Err(ConfigError::new(
            f,
            "option",
            "at least one [[option]] is needed",
        ));
    }
    let mut names = std::collections::HashSet::new();
    for (i, o) in raw.option.iter().enumerate() {
        if o.name.trim().is_empty() || !names.insert(o.name.as_str()) {
            return Err(ConfigError::new(
                f,
                format!("option[{i}].name"),
                format!("must be a non-empty name used once, got {:?}", o.name),
            ));
        }
    }
    match (&raw.batch, &raw.workload) {
        (Some(_), Some(_)) | (None, None) => Err(ConfigError::new(
            f,
            "batch",
            "give either batch (a hosted experiment file: a closed-loop batch) or [workload] (open-loop arrivals)",
        )),
        (None, Some(w)) => {
            if within.is_some() {
                return Err(ConfigError::new(
                    f,
                    "within_s",
                    "applies to a batch; an open-loop workload runs for its duration_s",
                ));
            }
            if rows.is_some() {
                return Err(ConfigError::new("--rows", "", "applies to a batch file, not to [workload]"));
            }
            let workload = load_workload(f, w)?;
            let options = raw
                .option
                .iter()
                .enumerate()
                .map(|(i, o)| open_option(f, path, i, o))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(OptionsFile {
                title: raw.title.unwrap_or_default(),
                batch_file: String::new(),
                batch: batch::Batch {
                    rows: 0,
                    max_tokens: workload.max_tokens,
                    workers: 0,
                    input_tokens: workload.lengths.input.clone(),
                    output_tokens: workload.lengths.output.clone(),
                },
                workload: Some(workload),
                within,
                e2e_p95,
                ttft_p95,
                options,
            })
        }
        (Some(batch), None) => load_batch(f, path, &raw, batch, rows, within, e2e_p95, ttft_p95),
    }
}

#[allow(clippy::too_many_arguments)]
fn load_batch(
    f: &str,
    path: &Path,
    raw: &RawOptions,
    batch_name: &str,
    rows: Option<u64>,
    within: Option<Nanos>,
    e2e_p95: Option<Nanos>,
    ttft_p95: Option<Nanos>,
) -> Result<OptionsFile, ConfigError> {
    let bpath = resolve_relative(path, batch_name);
    if let Some(why) = crate::config::source_problem("batch file", &bpath) {
        return Err(ConfigError::new(f, "batch", why));
    }
    let batch_value = |endpoint: Option<&PathBuf>, prov: Option<&toml::Value>| {
        let mut bv = read_toml(&bpath)?;
        let t = bv.as_table_mut().expect("a TOML document is a table");
        if let Some(n) = rows {
            t.insert(
                "rows".into(),
                toml::Value::Integer(n.min(i64::MAX as u64) as i64),
            );
        }
        if let Some(e) = endpoint {
            t.insert(
                "endpoint".into(),
                toml::Value::String(e.display().to_string()),
            );
        }
        if let Some(p) = prov {
            t.insert("provisioned".into(), p.clone());
        }
        Ok::<_, ConfigError>(bv)
    };
    let base = HostedSuite::from_value(&bpath, batch_value(None, None)?)?;
    let batch = batch::Batch {
        rows: base.base.rows,
        max_tokens: base.base.max_tokens,
        workers: base.base.workers,
        input_tokens: base.input_tokens.clone(),
        output_tokens: base.output_tokens.clone(),
    };
    let mut options = Vec::with_capacity(raw.option.len());
    for (i, o) in raw.option.iter().enumerate() {
        let fld = |x: &str| format!("option[{i}].{x}");
        if o.route.is_some() || o.policy.is_some() || o.weights.is_some() {
            return Err(ConfigError::new(
                f,
                fld("route"),
                "a hybrid (route of upstreams) runs against an open-loop [workload], not a batch",
            ));
        }
        let hosted = o.experiment.is_some() || o.endpoint.is_some() || o.provisioned.is_some();
        let server = o.server.is_some()
            || o.replicas.is_some()
            || o.router.is_some()
            || o.autoscale.is_some()
            || o.replica_hour_usd.is_some();
        let kind = match (hosted, server) {
            (true, true) | (false, false) => return Err(ConfigError::new(
                f,
                format!("option[{i}]"),
                "needs either `experiment` (a hosted endpoint) or `server` (replicas), not both",
            )),
            (true, false) => {
                let Some(exp) = &o.experiment else {
                    return Err(ConfigError::new(
                        f,
                        fld("experiment"),
                        "missing: the batch file's experiment that calls the endpoint",
                    ));
                };
                // absolute, as the batch file resolves it against itself
                let ep = o.endpoint.as_ref().map(|e| resolve_relative(path, e));
                // checked as named (before a link is resolved)
                if let Some(why) = ep
                    .as_ref()
                    .and_then(|e| crate::config::source_problem("endpoint profile", e))
                {
                    return Err(ConfigError::new(f, fld("endpoint"), why));
                }
                let ep = ep.map(|e| std::fs::canonicalize(&e).unwrap_or(e));
                let bsrc = bpath.display().to_string();
                let mut s = HostedSuite::from_value(
                    &bpath,
                    batch_value(ep.as_ref(), o.provisioned.as_ref())?,
                )
                .map_err(|e| {
                    // the option's own `provisioned` table, checked in the batch
                    if e.source == bsrc && e.field.starts_with("provisioned") {
                        ConfigError::new(f, fld(&e.field), e.reason)
                    } else {
                        e
                    }
                })?;
                s.retain_only(std::slice::from_ref(exp))
                    .map_err(|e| ConfigError::new(f, fld("experiment"), e.reason))?;
                Kind::Hosted(Box::new(s))
            }
            (false, true) => {
                let (profile, replicas, router, autoscale) = replicas_of(
                    f,
                    path,
                    &format!("option[{i}]"),
                    o.server.as_deref(),
                    o.replicas,
                    o.router.as_deref(),
                    o.autoscale.as_ref(),
                    o.replica_hour_usd,
                )?;
                Kind::Replicas {
                    profile,
                    replicas,
                    router,
                    autoscale,
                }
            }
        };
        options.push(DeployOption {
            name: o.name.clone(),
            kind,
        });
    }
    Ok(OptionsFile {
        title: raw.title.clone().unwrap_or_default(),
        batch_file: batch_name.to_string(),
        batch,
        workload: None,
        within,
        e2e_p95,
        ttft_p95,
        options,
    })
}

/// Server replicas as an option or a hop writes them (`at`: the table's
/// path): the profile (its price replaced by `replica_hour_usd`), the
/// count or the autoscaler, the router.
#[allow(clippy::too_many_arguments)]
fn replicas_of(
    f: &str,
    path: &Path,
    at: &str,
    server: Option<&str>,
    replicas: Option<i64>,
    router: Option<&str>,
    autoscale: Option<&RawAutoscale>,
    replica_hour_usd: Option<f64>,
) -> Result<(Arc<ServerProfile>, u32, RouterKind, Option<AutoscaleParams>), ConfigError> {
    let fld = |x: &str| format!("{at}.{x}");
    let Some(sp) = server else {
        return Err(ConfigError::new(
            f,
            fld("server"),
            "missing: a server profile",
        ));
    };
    let sp = resolve_relative(path, sp);
    if let Some(why) = crate::config::source_problem("server profile", &sp) {
        return Err(ConfigError::new(f, fld("server"), why));
    }
    let mut profile = load_profile(&sp)?;
    if let Some(v) = replica_hour_usd {
        if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
            return Err(ConfigError::new(
                f,
                fld("replica_hour_usd"),
                format!("must be in [0, 1e6] dollars per replica-hour, got {v}"),
            ));
        }
        profile.replica_hour_usd = Some(v);
    }
    let router = match router {
        None => RouterKind::LeastOutstanding,
        Some(r) => RouterKind::parse(r).ok_or_else(|| {
            ConfigError::new(
                f,
                fld("router"),
                format!(
                    "unknown router {r:?}; expected round_robin, least_outstanding or least_kv"
                ),
            )
        })?,
    };
    let autoscale = match autoscale {
        Some(a) => Some(a.validate(f, &fld("autoscale"), &profile)?),
        None => None,
    };
    let replicas = match (replicas, &autoscale) {
        (Some(_), Some(_)) => {
            return Err(ConfigError::new(
                f,
                fld("replicas"),
                "an autoscaled option starts at autoscale.min: leave replicas out",
            ))
        }
        (None, Some(a)) => a.min,
        (Some(r), None) if (1..=4096).contains(&r) => r as u32,
        (r, None) => {
            return Err(ConfigError::new(
                f,
                fld("replicas"),
                format!(
                    "must be in 1..=4096, got {}",
                    r.map_or("nothing".into(), |r| r.to_string())
                ),
            ))
        }
    };
    Ok((Arc::new(profile), replicas, router, autoscale))
}

/// A hosted endpoint profile as an option or a hop writes it, with its
/// `provisioned` table applied.
fn hosted_of(
    f: &str,
    path: &Path,
    at: &str,
    endpoint: &str,
    provisioned: Option<&toml::Value>,
) -> Result<Arc<crate::hosted::HostedProfile>, ConfigError> {
    let ep = resolve_relative(path, endpoint);
    if let Some(why) = crate::config::source_problem("endpoint profile", &ep) {
        return Err(ConfigError::new(f, format!("{at}.endpoint"), why));
    }
    let v = read_toml(&ep)?;
    let mut p = crate::hosted::HostedProfile::from_value(&ep.display().to_string(), v)?;
    if let Some(o) = provisioned {
        let o: crate::hosted::provisioned::RawOverride =
            from_value(f, o.clone()).map_err(|e| e.under(&format!("{at}.provisioned")))?;
        p.override_provisioned(f, &o)
            .map_err(|e| ConfigError::new(f, format!("{at}.{}", e.field), e.reason))?;
    }
    Ok(Arc::new(p))
}

fn load_workload(f: &str, w: &RawWorkload) -> Result<open::Workload, ConfigError> {
    use crate::workload::{ArrivalProcess, Lengths, RateShape, RawArrivals};
    if !(w.rpm.is_finite() && w.rpm > 0.0 && w.rpm <= 6e10) {
        return Err(ConfigError::new(
            f,
            "workload.rpm",
            format!("must be in (0, 6e10] requests per minute, got {}", w.rpm),
        ));
    }
    let duration = secs(crate::config::duration_s(
        f,
        "workload.duration_s",
        w.duration_s,
        true,
    )?);
    let mut process = ArrivalProcess::new(
        w.arrivals.as_ref().unwrap_or(&RawArrivals::Poisson),
        w.rpm / 60.0,
    )
    .map_err(|r| ConfigError::new(f, "workload.arrivals", r))?;
    if let Some(sh) = &w.load_shape {
        let shape =
            RateShape::new(sh).map_err(|r| ConfigError::new(f, "workload.load_shape", r))?;
        process = process.with_shape(shape);
    }
    let lengths = Lengths::from_raw(f, "workload.", &w.input_tokens, &w.output_tokens)?;
    if !(1..=10_000_000).contains(&w.max_tokens) {
        return Err(ConfigError::new(
            f,
            "workload.max_tokens",
            format!("must be in 1..=10000000, got {}", w.max_tokens),
        ));
    }
    let sdk = w
        .sdk_retries
        .unwrap_or(true)
        .then(crate::client::policy::SdkRetry::default);
    let layers = crate::experiment::config::PoolLayers {
        retry: w.retry.as_ref(),
        retry_quota: None,
        throttle: None,
    };
    let (caller, shared) = layers.validate(f, "workload", sdk)?;
    Ok(open::Workload {
        rpm: w.rpm,
        duration,
        process,
        lengths,
        max_tokens: w.max_tokens as u64,
        caller,
        shared,
    })
}

/// An option of a `[workload]` file: a route of one upstream (hosted or
/// replicas), or of several (`route = [ … ]`).
fn open_option(f: &str, path: &Path, i: usize, o: &RawOption) -> Result<DeployOption, ConfigError> {
    let at = format!("option[{i}]");
    let fld = |x: &str| format!("{at}.{x}");
    if o.experiment.is_some() {
        return Err(ConfigError::new(
            f,
            fld("experiment"),
            "names a batch file's experiment; a [workload] option gives `endpoint`, `server` or `route`",
        ));
    }
    let hops: Vec<RawHop> = match &o.route {
        Some(r) => {
            let single = o.endpoint.is_some()
                || o.provisioned.is_some()
                || o.server.is_some()
                || o.replicas.is_some()
                || o.router.is_some()
                || o.autoscale.is_some()
                || o.replica_hour_usd.is_some();
            if single {
                return Err(ConfigError::new(
                    f,
                    fld("route"),
                    "a route's upstreams are its entries: move endpoint/server settings into them",
                ));
            }
            if r.len() < 2 {
                return Err(ConfigError::new(
                    f,
                    fld("route"),
                    "a hybrid needs at least two upstreams (a single one: give endpoint or server)",
                ));
            }
            r.iter()
                .map(|h| RawHop {
                    name: h.name.clone(),
                    endpoint: h.endpoint.clone(),
                    provisioned: h.provisioned.clone(),
                    server: h.server.clone(),
                    replicas: h.replicas,
                    router: h.router.clone(),
                    autoscale: h.autoscale.clone(),
                    replica_hour_usd: h.replica_hour_usd,
                    max_in_flight: h.max_in_flight,
                    cooldown_s: h.cooldown_s,
                    timeout_s: h.timeout_s,
                })
                .collect()
        }
        None => {
            if o.policy.is_some() || o.weights.is_some() {
                return Err(ConfigError::new(
                    f,
                    fld("policy"),
                    "a policy chooses among a route's upstreams: give `route`",
                ));
            }
            vec![RawHop {
                name: None,
                endpoint: o.endpoint.clone(),
                provisioned: o.provisioned.clone(),
                server: o.server.clone(),
                replicas: o.replicas,
                router: o.router.clone(),
                autoscale: o.autoscale.clone(),
                replica_hour_usd: o.replica_hour_usd,
                max_in_flight: None,
                cooldown_s: None,
                timeout_s: None,
            }]
        }
    };
    let mut ups = Vec::with_capacity(hops.len());
    let mut core_ups = Vec::with_capacity(hops.len());
    let mut seen = std::collections::HashSet::new();
    for (k, h) in hops.iter().enumerate() {
        let hat = if o.route.is_some() {
            format!("{at}.route[{k}]")
        } else {
            at.clone()
        };
        let hf = |x: &str| format!("{hat}.{x}");
        let hosted = h.endpoint.is_some() || h.provisioned.is_some();
        let server = h.server.is_some()
            || h.replicas.is_some()
            || h.router.is_some()
            || h.autoscale.is_some()
            || h.replica_hour_usd.is_some();
        let up =
            match (hosted, server) {
                (true, true) | (false, false) => return Err(ConfigError::new(
                    f,
                    hat.clone(),
                    "needs either `endpoint` (a hosted endpoint) or `server` (replicas), not both",
                )),
                (true, false) => {
                    let Some(ep) = &h.endpoint else {
                        return Err(ConfigError::new(
                            f,
                            hf("endpoint"),
                            "missing: the endpoint profile",
                        ));
                    };
                    open::Up::Hosted(hosted_of(f, path, &hat, ep, h.provisioned.as_ref())?)
                }
                (false, true) => {
                    let (profile, replicas, router, autoscale) = replicas_of(
                        f,
                        path,
                        &hat,
                        h.server.as_deref(),
                        h.replicas,
                        h.router.as_deref(),
                        h.autoscale.as_ref(),
                        h.replica_hour_usd,
                    )?;
                    open::Up::Replicas {
                        profile,
                        replicas,
                        router,
                        autoscale,
                    }
                }
            };
        let name = h.name.clone().unwrap_or_else(|| match hops.len() {
            1 => o.name.clone(),
            _ => format!("{}.{k}", o.name),
        });
        if name.trim().is_empty() || !seen.insert(name.clone()) {
            return Err(ConfigError::new(
                f,
                hf("name"),
                format!("must be a non-empty name used once in the route, got {name:?}"),
            ));
        }
        let max_in_flight = match h.max_in_flight {
            None => None,
            Some(m) if (1..=1_000_000).contains(&m) => Some(m as u64),
            Some(m) => {
                return Err(ConfigError::new(
                    f,
                    hf("max_in_flight"),
                    format!("must be in 1..=1000000, got {m}"),
                ))
            }
        };
        let d =
            |x: &str, v: Option<f64>, dflt: f64, positive: bool| -> Result<Nanos, ConfigError> {
                Ok(secs(crate::config::duration_s(
                    f,
                    &hf(x),
                    v.unwrap_or(dflt),
                    positive,
                )?))
            };
        // a hybrid's gateway keeps each upstream's own limits (it spills
        // at them); a pure option's is transparent (the endpoint alone)
        let limits = match &up {
            open::Up::Hosted(p) if hops.len() > 1 => p.limits.clone(),
            _ => Vec::new(),
        };
        core_ups.push(qsim_core::gateway::Upstream {
            name,
            limits,
            max_in_flight,
            timeout: d("timeout_s", h.timeout_s, 600.0, true)?,
            cooldown: if hops.len() > 1 {
                d(
                    "cooldown_s",
                    h.cooldown_s,
                    crate::plan::routes::DEFAULT_COOLDOWN_S,
                    false,
                )?
            } else {
                0
            },
            breaker: qsim_core::gateway::Breaker {
                failures: if hops.len() > 1 {
                    crate::plan::routes::DEFAULT_BREAKER.0
                } else {
                    0
                },
                open_for: secs(crate::plan::routes::DEFAULT_BREAKER.1),
                probes: crate::plan::routes::DEFAULT_BREAKER.2,
            },
            probe_every: None,
        });
        ups.push(up);
    }
    let n = ups.len();
    let policy = match (o.policy.as_deref(), &o.weights) {
        (None | Some("first"), None) => qsim_core::route::Policy::First,
        (Some("weighted"), Some(w)) if w.len() == n => {
            if let Some((k, x)) = w.iter().enumerate().find(|(_, &x)| x <= 0) {
                return Err(ConfigError::new(
                    f,
                    fld(&format!("weights[{k}]")),
                    format!("must be a positive integer, got {x}"),
                ));
            }
            qsim_core::route::Policy::Weighted(w.iter().map(|&x| x as u64).collect())
        }
        (Some("weighted"), _) => {
            return Err(ConfigError::new(
                f,
                fld("weights"),
                format!("one positive integer weight per upstream ({n})"),
            ))
        }
        (Some("first"), Some(_)) | (None, Some(_)) => {
            return Err(ConfigError::new(
                f,
                fld("weights"),
                "weights need policy = \"weighted\"",
            ))
        }
        (Some(p), _) => {
            return Err(ConfigError::new(
                f,
                fld("policy"),
                format!("expected \"first\" or \"weighted\", got {p:?}"),
            ))
        }
    };
    let core = qsim_core::gateway::Config {
        upstreams: core_ups,
        routes: vec![qsim_core::gateway::Route {
            model: qsim_core::gateway::ANY_MODEL.into(),
            tiers: vec![qsim_core::gateway::Tier {
                upstreams: (0..n).collect(),
                policy,
            }],
            max_attempts: n as u32,
        }],
    };
    core.check()
        .map_err(|e| ConfigError::new(f, fld("route"), format!("{}: {}", e.field, e.reason)))?;
    Ok(DeployOption {
        name: o.name.clone(),
        kind: Kind::Route(Box::new(open::RouteSpec { ups, core })),
    })
}

fn p95(h: &DurationHist) -> f64 {
    if h.count() == 0 {
        0.0
    } else {
        h.quantile_s(0.95)
    }
}

/// Run option `i` with `seed`.
pub fn run_option(file: &OptionsFile, i: usize, seed: u64) -> Outcome {
    run_as(file, &file.options[i], i, seed)
}

/// Run `o` (option `i` of `file`, or a variant of it: [`fewest`]) with
/// `seed`; `i` separates the replicas' random streams, as in
/// [`run_option`], so a variant runs exactly as the file changed with
/// `--set` would.
pub fn run_as(file: &OptionsFile, o: &DeployOption, i: usize, seed: u64) -> Outcome {
    match &o.kind {
        Kind::Hosted(suite) => {
            let r: HostedResult = run_suite(suite, seed).pop().expect("one experiment");
            let kind = match suite.profile.provisioned {
                Some(p) => format!("provisioned {} units", p.units),
                None => "pay-per-token".to_string(),
            };
            Outcome {
                name: o.name.clone(),
                kind,
                elapsed: r.elapsed,
                ok: r.ok,
                failed: r.total - r.ok,
                http_429: r.http_429,
                ttft_p95_s: None,
                e2e_p95_s: p95(&r.latency),
                cost_usd: crate::report::cost::hosted_figures(&r).map(|v| v[0]),
                spilled: None,
                profiles: Vec::new(),
            }
        }
        Kind::Replicas {
            profile,
            replicas,
            router,
            autoscale,
        } => {
            let r = batch::run(
                profile.clone(),
                *replicas,
                *router,
                autoscale.clone(),
                &file.batch,
                seed,
                i as u64,
            );
            let kind = match autoscale {
                Some(a) => format!("autoscaled {}-{}", a.min, a.max),
                None if *replicas == 1 => "1 replica".to_string(),
                None => format!("{replicas} replicas"),
            };
            Outcome {
                name: o.name.clone(),
                kind,
                elapsed: r.elapsed,
                ok: r.ok,
                failed: file.batch.rows - r.ok,
                http_429: 0,
                ttft_p95_s: Some(p95(&r.ttft)),
                e2e_p95_s: p95(&r.e2e),
                cost_usd: profile
                    .replica_hour_usd
                    .map(|p| r.gpu_ns as f64 / 3.6e12 * p),
                spilled: None,
                profiles: Vec::new(),
            }
        }
        Kind::Route(route) => {
            let w = file
                .workload
                .as_ref()
                .expect("route options belong to a [workload] file");
            let r = open::run(w, route, seed, i as u64);
            let hosted = route.ups.iter().any(|u| matches!(u, open::Up::Hosted(_)));
            Outcome {
                name: o.name.clone(),
                kind: route_kind(route),
                elapsed: r.elapsed,
                ok: r.ok,
                failed: r.failed + (r.requests - r.ok - r.failed),
                // the 429s the callers saw: the upstreams' and the gateway's
                http_429: r.http_429 + r.refused,
                ttft_p95_s: (!hosted).then(|| p95(&r.ttft)),
                e2e_p95_s: p95(&r.e2e),
                cost_usd: r.cost,
                spilled: (route.ups.len() > 1).then(|| r.spilled()),
                profiles: route
                    .ups
                    .iter()
                    .map(|u| match u {
                        open::Up::Hosted(p) => p.name.clone(),
                        open::Up::Replicas { profile, .. } => profile.name.clone(),
                    })
                    .collect(),
            }
        }
    }
}

/// A route in words: "pay-per-token", "provisioned 300 units +
/// pay-per-token", "1 replica + pay-per-token".
pub fn route_kind(r: &open::RouteSpec) -> String {
    r.ups
        .iter()
        .map(open::Up::describe)
        .collect::<Vec<_>>()
        .join(" + ")
}

/// Is option `o` a hybrid (a route of several upstreams)?
pub fn is_hybrid(o: &DeployOption) -> bool {
    matches!(&o.kind, Kind::Route(r) if r.ups.len() > 1)
}

/// Run every option with `seed`, in file order.
pub fn run(file: &OptionsFile, seed: u64) -> Vec<Outcome> {
    (0..file.options.len())
        .map(|i| run_option(file, i, seed))
        .collect()
}

/// The cheapest option that finished within `within` with no failed row
/// (ties: the first in the file); options without a cost are left out.
pub fn cheapest(outcomes: &[Outcome], within: Nanos) -> Option<&Outcome> {
    cheapest_meeting(
        outcomes,
        &Targets {
            within: Some(within),
            ..Targets::default()
        },
    )
}

/// The cheapest option that meets `targets` (ties: the first in the
/// file); options without a cost are left out.
pub fn cheapest_meeting<'a>(outcomes: &'a [Outcome], targets: &Targets) -> Option<&'a Outcome> {
    outcomes
        .iter()
        .filter(|o| targets.missed(o).is_none())
        .filter(|o| o.cost_usd.is_some())
        .fold(None, |best: Option<&Outcome>, o| match best {
            Some(b) if b.cost_usd <= o.cost_usd => Some(b),
            _ => Some(o),
        })
}
