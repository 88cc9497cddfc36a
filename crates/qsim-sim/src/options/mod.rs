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
pub mod fewest;
pub mod render;

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
    batch: String,
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
    let bpath = resolve_relative(path, &raw.batch);
    if let Some(why) = crate::config::source_problem("batch file", &bpath) {
        return Err(ConfigError::new(f, "batch", why));
    }
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
    if raw.option.is_empty() {
        return Err(ConfigError::new(
            f,
            "option",
            "at least one [[option]] is needed",
        ));
    }
    let mut options = Vec::with_capacity(raw.option.len());
    let mut names = std::collections::HashSet::new();
    for (i, o) in raw.option.iter().enumerate() {
        let fld = |x: &str| format!("option[{i}].{x}");
        if o.name.trim().is_empty() || !names.insert(o.name.as_str()) {
            return Err(ConfigError::new(
                f,
                fld("name"),
                format!("must be a non-empty name used once, got {:?}", o.name),
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
                let Some(sp) = &o.server else {
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
                if let Some(v) = o.replica_hour_usd {
                    if !(v.is_finite() && (0.0..=1e6).contains(&v)) {
                        return Err(ConfigError::new(
                            f,
                            fld("replica_hour_usd"),
                            format!("must be in [0, 1e6] dollars per replica-hour, got {v}"),
                        ));
                    }
                    profile.replica_hour_usd = Some(v);
                }
                let router = match &o.router {
                    None => RouterKind::LeastOutstanding,
                    Some(r) => RouterKind::parse(r).ok_or_else(|| {
                        ConfigError::new(
                            f,
                            fld("router"),
                            format!("unknown router {r:?}; expected round_robin, least_outstanding or least_kv"),
                        )
                    })?,
                };
                let autoscale = match &o.autoscale {
                    Some(a) => Some(a.validate(f, &fld("autoscale"), &profile)?),
                    None => None,
                };
                let replicas = match (o.replicas, &autoscale) {
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
                Kind::Replicas {
                    profile: Arc::new(profile),
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
        title: raw.title.unwrap_or_default(),
        batch_file: raw.batch,
        batch,
        within,
        e2e_p95,
        ttft_p95,
        options,
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
            }
        }
    }
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
