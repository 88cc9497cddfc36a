//! `qsim trace plan FILE`: every trace scenario of a server experiment
//! planned ([`super::trace_plan::compare`]) under the work budget, and the
//! report (table, JSON).

use super::server::Load;
use super::trace_plan::{compare, Comparison, Minute, Targets};
use super::ExperimentFile;
use crate::budget::{Budget, Cost};
use crate::config::ConfigError;
use crate::time::Nanos;
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// What `qsim trace plan` is asked (a plain spec).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// A server experiment file with trace scenarios.
    pub file: PathBuf,
    /// `--set` overrides.
    pub sets: Vec<String>,
    /// Only these scenarios (empty: all).
    pub only: Vec<String>,
    /// Targets: every minute's E2E / TTFT p95 at most this.
    pub e2e_p95: Option<Nanos>,
    pub ttft_p95: Option<Nanos>,
    /// The most replicas tried.
    pub max_replicas: u32,
    pub seed: u64,
    pub budget: Budget,
}

/// The plans of a file's trace scenarios.
#[derive(Debug, Clone)]
pub struct TracePlan {
    pub file: PathBuf,
    /// The server profile's file stem.
    pub profile: String,
    pub targets: Targets,
    pub seed: u64,
    pub max_replicas: u32,
    pub comparisons: Vec<Comparison>,
}

/// Plan each trace scenario of the file: the fewest replicas meeting the
/// targets in every minute, beside the fitted workloads'.
///
/// ```no_run
/// use qsim_sim::experiment::trace_plan_run::{plan, Spec};
/// let p = plan(&Spec {
///     file: "builtin:experiments/azure-traces.toml".into(),
///     sets: vec![],
///     only: vec!["code".into()],
///     e2e_p95: Some(10_000_000_000),
///     ttft_p95: None,
///     max_replicas: 64,
///     seed: 1,
///     budget: Default::default(),
/// })
/// .unwrap();
/// print!("{}", p.render_table());
/// ```
pub fn plan(spec: &Spec) -> Result<TracePlan, ConfigError> {
    let targets = Targets {
        e2e_p95_s: spec.e2e_p95.map(crate::time::to_secs),
        ttft_p95_s: spec.ttft_p95.map(crate::time::to_secs),
    };
    if targets.e2e_p95_s.is_none() && targets.ttft_p95_s.is_none() {
        return Err(ConfigError::new(
            "--e2e-p95",
            "",
            "give a target: --e2e-p95 and/or --ttft-p95",
        ));
    }
    let fname = spec.file.display().to_string();
    let mut f = super::load_file(&spec.file, &spec.sets)?;
    f.retain_only(&spec.only)?;
    let ExperimentFile::Server(suite) = f else {
        return Err(ConfigError::new(
            &fname,
            "kind",
            "qsim trace plan takes a server experiment file (kind = \"server\") with trace scenarios",
        ));
    };
    let scenarios: Vec<_> = suite
        .scenarios
        .iter()
        .filter(|s| matches!(s.load, Load::Trace(_)))
        .collect();
    if scenarios.is_empty() {
        return Err(ConfigError::new(
            &fname,
            "scenario",
            "no scenario replays a trace (trace = { file = … })",
        ));
    }
    // the budget `qsim run` uses: the least this plan costs, refused at
    // once if over (the search's later runs are counted as they run)
    let mut cost = Cost::default();
    for s in &scenarios {
        cost.then(super::trace_plan::cost(&suite.profile, s));
    }
    cost.check(&fname, &spec.budget)?;
    let mut comparisons = Vec::new();
    for s in scenarios {
        let c = compare(&suite.profile, s, &targets, spec.seed, spec.max_replicas)?;
        crate::work::check(&fname)?;
        comparisons.push(c);
    }
    let profile = Path::new(&suite.profile_path)
        .file_stem()
        .map_or(String::new(), |n| n.to_string_lossy().into_owned());
    Ok(TracePlan {
        file: spec.file.clone(),
        profile,
        targets,
        seed: spec.seed,
        max_replicas: spec.max_replicas,
        comparisons,
    })
}

impl TracePlan {
    pub fn render_table(&self) -> String {
        plan_table(
            &self.comparisons,
            &self.targets,
            &self.file,
            &self.profile,
            self.seed,
            self.max_replicas,
        )
    }
    pub fn render_json(&self) -> String {
        plan_json(&self.comparisons, &self.targets)
    }
    /// Why the plan is not met (exit 1), if a trace has no answer.
    pub fn unmet(&self) -> Option<String> {
        self.comparisons
            .iter()
            .find(|c| c.answers[0].replicas.is_none())
            .map(|c| {
                format!(
                    "scenario {:?}: no replica count up to {} meets the targets in every minute of the trace",
                    c.scenario, self.max_replicas
                )
            })
    }
}

fn secs(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0} s")
    } else if v >= 10.0 {
        format!("{v:.1} s")
    } else {
        format!("{v:.3} s")
    }
}

fn target_text(t: &Targets) -> String {
    let mut v = Vec::new();
    if let Some(x) = t.e2e_p95_s {
        v.push(format!("E2E p95 <= {}", secs(x)));
    }
    if let Some(x) = t.ttft_p95_s {
        v.push(format!("TTFT p95 <= {}", secs(x)));
    }
    v.join(" and ")
}

fn minute_text(m: &Minute, ttft: bool) -> String {
    if ttft {
        format!("E2E {} TTFT {}", secs(m.e2e_p95_s), secs(m.ttft_p95_s))
    } else {
        secs(m.e2e_p95_s)
    }
}

fn plan_table(
    cs: &[Comparison],
    t: &Targets,
    file: &Path,
    profile: &str,
    seed: u64,
    max: u32,
) -> String {
    let ttft = t.ttft_p95_s.is_some();
    let mut s = String::new();
    let _ = writeln!(
        s,
        "qsim trace plan {}: {profile}, target {} in every minute, seed {seed}",
        file.display(),
        target_text(t)
    );
    for c in cs {
        let b = &c.busiest;
        let _ = writeln!(
            s,
            "\n{}: {} requests in {:.1} min, {:.0} per minute on average; busiest minute {} ({} requests)",
            c.scenario,
            c.stats.requests,
            c.stats.duration_s / 60.0,
            c.stats.mean_rate * 60.0,
            b.minute,
            b.requests
        );
        let mw = if ttft { 26 } else { 10 };
        let _ = writeln!(
            s,
            "  {:<30} {:>8}  {:<mw$}  {:<w2$}  trace at these replicas, min {}",
            "workload",
            "replicas",
            format!("min {}", b.minute),
            "worst minute",
            b.minute,
            w2 = mw + 9
        );
        for (a, at) in c.answers.iter().zip(&c.trace_at) {
            let r = a.replicas.map_or(format!("> {max}"), |r| r.to_string());
            let pred = a
                .run
                .minute(b.minute)
                .map_or("none".to_string(), |m| minute_text(m, ttft));
            let worst = a.run.worst(t).map_or("-".to_string(), |m| {
                format!("{} (min {})", minute_text(m, ttft), m.minute)
            });
            let tr = at
                .as_ref()
                .map_or("-".to_string(), |m| minute_text(m, ttft));
            let _ = writeln!(
                s,
                "  {:<30} {:>8}  {:<mw$}  {:<w2$}  {}",
                a.workload,
                r,
                pred,
                worst,
                tr,
                w2 = mw + 9
            );
        }
        let _ = writeln!(
            s,
            "  (p95 per minute of arrival: each workload's own run at its replica count; the last column is the trace's run)"
        );
        let tr = &c.answers[0];
        if let Some(r) = tr.replicas {
            if tr.setting.is_empty() {
                let _ = writeln!(s, "  one replica meets the target in every minute");
            } else {
                let shown: Vec<String> = tr
                    .setting
                    .iter()
                    .take(5)
                    .map(|m| {
                        format!(
                            "{} ({}, {} requests)",
                            m.minute,
                            minute_text(m, ttft),
                            m.requests
                        )
                    })
                    .collect();
                let more = tr.setting.len().saturating_sub(5);
                let _ = writeln!(
                    s,
                    "  minutes that set the trace's answer (over the target with {} replicas): {}{}",
                    r - 1,
                    shown.join(", "),
                    if more > 0 { format!(" and {more} more") } else { String::new() }
                );
            }
        }
        if tr.run.rejected > 0 {
            let _ = writeln!(
                s,
                "  {} requests the server can never run (longer than the model) are not timed",
                tr.run.rejected
            );
        }
    }
    s
}

fn plan_json(cs: &[Comparison], t: &Targets) -> String {
    let m = |m: &Minute| serde_json::json!({"minute": m.minute, "requests": m.requests, "e2e_p95_s": m.e2e_p95_s, "ttft_p95_s": m.ttft_p95_s});
    let v: Vec<serde_json::Value> = cs
        .iter()
        .map(|c| {
            serde_json::json!({
                "scenario": c.scenario,
                "requests": c.stats.requests,
                "busiest_minute": m(&c.busiest),
                "workloads": c.answers.iter().zip(&c.trace_at).map(|(a, at)| serde_json::json!({
                    "workload": a.workload,
                    "replicas": a.replicas,
                    "predicted_at_busiest_minute": a.run.minute(c.busiest.minute).map(m),
                    "trace_at_these_replicas_busiest_minute": at.as_ref().map(m),
                    "minutes_setting_the_answer": a.setting.iter().map(m).collect::<Vec<_>>(),
                    "rejected": a.run.rejected,
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    let mut s = serde_json::to_string_pretty(&serde_json::json!({
        "targets": {"e2e_p95_s": t.e2e_p95_s, "ttft_p95_s": t.ttft_p95_s},
        "scenarios": v,
    }))
    .expect("JSON of plain values");
    s.push('\n');
    s
}
