//! `qsim plan` output: a text report and JSON.

use super::config::SharedFile;
use super::findings::{Finding, Level};
use super::sim::{ScenarioOutcome, ServerOutcome};
use super::{floor_met, Model, ScenarioPair};
use crate::limiter::admission::{Limit, BP_FULL};
use crate::report::round;
use crate::report::table::Table;
use serde_json::{json, Value};

/// Everything a plan reports.
pub struct Plan<'a> {
    pub file: &'a SharedFile,
    pub model: &'a Model,
    pub seed: u64,
    pub findings: Vec<Finding>,
    pub flow: Vec<String>,
    pub runs: Vec<ScenarioPair>,
    /// Inverse-planning result lines, if `--need` was given.
    pub inverse: Option<Value>,
}

fn minutes(o: &ScenarioOutcome) -> f64 {
    o.duration as f64 / 60e9
}

/// Saturated minutes and the largest deviation of the admitted total from capacity in them.
pub fn saturation_summary(o: &ScenarioOutcome, capacity: u64) -> (usize, f64) {
    let mut n = 0;
    let mut dev: f64 = 0.0;
    for (m, &s) in o.saturated.iter().enumerate() {
        if s {
            n += 1;
            let units: u64 = o
                .consumers
                .iter()
                .map(|c| c.admitted_units_per_min[m])
                .sum();
            dev = dev.max((units as f64 / capacity as f64 - 1.0).abs());
        }
    }
    (n, dev)
}

fn server_json(s: &ServerOutcome, dur_min: f64) -> Value {
    json!({
        "completed": s.completed,
        "e2e_p50_s": round(s.e2e.quantile_s(0.5), 4),
        "e2e_p95_s": round(s.e2e.quantile_s(0.95), 4),
        "ttft_p50_s": round(s.ttft.quantile_s(0.5), 4),
        "itl_p50_s": round(s.itl.quantile_s(0.5), 4),
        "gpu_util": s.gpu_util.map(|x| round(x, 4)),
        "kv_util": s.kv_util.map(|x| round(x, 4)),
        "concurrency_mean": round(s.concurrency_mean, 2),
        "concurrency_max": s.concurrency_max,
        "outstanding_at_end": s.outstanding_end,
        "input_tokens_per_min": round(s.input_tokens as f64 / dur_min, 0),
        "output_tokens_per_min": round(s.output_tokens as f64 / dur_min, 0),
    })
}

pub fn json(p: &Plan) -> Value {
    let l = &p.file.limiter;
    let cap = l.capacity as f64;
    let reservations: Vec<Value> = l
        .consumers
        .iter()
        .filter(|c| c.reserved_bp > 0)
        .map(|c| {
            json!({
                "consumer": c.name,
                "reserved_pct": c.reserved_bp as f64 / 100.0,
                "reserved_rpm": round(cap * c.reserved_bp as f64 / 10_000.0, 2),
            })
        })
        .collect();
    let scenarios: Vec<Value> = p
        .runs
        .iter()
        .map(|pair| {
            let o = &pair.limited;
            let mins = minutes(o);
            let (nsat, dev) = saturation_summary(o, l.capacity);
            let consumers: Vec<Value> = o
                .consumers
                .iter()
                .enumerate()
                .map(|(ci, c)| {
                    let mut by = serde_json::Map::new();
                    for lim in Limit::ALL {
                        by.insert(lim.name().into(), json!(c.denied[lim.index()]));
                    }
                    json!({
                        "consumer": c.name,
                        "offered_rpm": round(c.offered as f64 / mins, 1),
                        "admitted_rpm": round(c.admitted as f64 / mins, 1),
                        "offered": c.offered,
                        "admitted": c.admitted,
                        "success_rate": if c.offered == 0 { Value::Null } else { json!(round(c.success_rate(), 4)) },
                        "rejected": c.rejected(),
                        "rejected_by": by,
                        "floor_rpm": round(c.floor_rpm, 2),
                        "floor_met": floor_met(o, ci).unwrap_or(true),
                        "admitted_per_min": c.admitted_per_min,
                    })
                })
                .collect();
            json!({
                "name": o.name,
                "duration_s": o.duration / 1_000_000_000,
                "consumers": consumers,
                "offered_per_min": (0..o.minutes()).map(|m| o.consumers.iter().map(|c| c.offered_per_min[m]).sum::<u64>()).collect::<Vec<_>>(),
                "admitted_per_min": (0..o.minutes()).map(|m| o.admitted_in_minute(m)).collect::<Vec<_>>(),
                "saturated_minutes": nsat,
                "max_saturated_deviation": round(dev, 4),
                "burst_used": o.burst_used,
                "burst_depth": o.burst_depth,
                "server": server_json(&o.server, mins),
                "no_limiter": server_json(&pair.unlimited.server, mins),
            })
        })
        .collect();
    json!({
        "capacity": l.capacity,
        "unit": l.unit.name(),
        "threshold": l.threshold,
        "burst": l.burst_units(),
        "semantics": l.semantics.name(),
        "model": p.model.name(),
        "replicas": p.file.replicas,
        "seed": p.seed,
        "reservations": reservations,
        "unreserved_rpm": round(cap * (BP_FULL - l.reserved_bp_total()) as f64 / 10_000.0, 2),
        "unreserved_consumers": l.consumers.iter().filter(|c| c.reserved_bp == 0).map(|c| c.name.clone()).collect::<Vec<_>>(),
        "findings": p.findings.iter().map(|f| json!({"level": f.level.name(), "message": f.message})).collect::<Vec<_>>(),
        "decision_flow": p.flow,
        "scenarios": scenarios,
        "inverse": p.inverse,
    })
}

fn fmt_s(x: f64) -> String {
    if x < 1.0 {
        format!("{:.0} ms", x * 1e3)
    } else {
        format!("{x:.2} s")
    }
}

pub fn table(p: &Plan) -> String {
    let l = &p.file.limiter;
    let cap = l.capacity as f64;
    let u = l.unit.name().to_uppercase();
    let mut s = String::new();
    // the deployment bucket holds the floors' credits, the one each is
    // accruing and the pool beyond them, so with a small burst it is deeper
    // than the burst headroom asked for
    let depth = p.runs.first().map_or(0, |r| r.limited.burst_depth);
    let depth_note = if depth > l.burst_units() {
        format!(" (bucket depth {depth}: the floors' credits and a pool beyond them)")
    } else {
        String::new()
    };
    s.push_str(&format!(
        "qsim plan: capacity {} {u}, threshold {:.0} % (enforcement at {:.0} {u}), burst headroom {} units{depth_note}, semantics {}\n",
        l.capacity,
        l.threshold * 100.0,
        l.threshold * cap,
        l.burst_units(),
        l.semantics.name()
    ));
    s.push_str(&format!(
        "server: {} x {} replica(s); seed {}\n\n",
        p.model.name(),
        p.file.replicas,
        p.seed
    ));
    let mut t = Table::new(["consumer", "reserved %", &format!("floor {u}")]);
    for c in &l.consumers {
        if c.reserved_bp > 0 {
            t.row([
                c.name.clone(),
                format!("{:.0}", c.reserved_bp as f64 / 100.0),
                match cap * c.reserved_bp as f64 / 10_000.0 {
                    x if x >= 10.0 => format!("{x:.0}"),
                    x => format!("{x:.2}"),
                },
            ]);
        }
    }
    let pool_bp = BP_FULL - l.reserved_bp_total();
    let un: Vec<_> = l
        .consumers
        .iter()
        .filter(|c| c.reserved_bp == 0)
        .map(|c| c.name.as_str())
        .collect();
    t.row([
        format!(
            "unreserved pool ({})",
            if un.is_empty() {
                "nobody".into()
            } else {
                un.join(", ")
            }
        ),
        format!("{:.0}", pool_bp as f64 / 100.0),
        format!("{:.0}", cap * pool_bp as f64 / 10_000.0),
    ]);
    s.push_str(&t.render());
    s.push_str("\nfindings:\n");
    let mut fs = p.findings.clone();
    fs.sort_by_key(|f| std::cmp::Reverse(f.level));
    for f in &fs {
        s.push_str(&format!("  [{}] {}\n", f.level.name(), f.message));
    }
    s.push_str("\ndecision flow:\n");
    for line in &p.flow {
        s.push_str(&format!("  {line}\n"));
    }
    for pair in &p.runs {
        let o = &pair.limited;
        let mins = minutes(o);
        let (nsat, dev) = saturation_summary(o, l.capacity);
        let desc = p
            .file
            .scenarios
            .iter()
            .find(|x| x.name == o.name)
            .map(|x| x.description.clone())
            .unwrap_or_default();
        s.push_str(&format!(
            "\nscenario {} ({:.0} min): {desc}\n",
            o.name, mins
        ));
        let mut t = Table::new([
            "consumer",
            "offered/min",
            "admitted/min",
            "success",
            "rejected",
            "by limit",
            "floor",
            "floor met",
        ]);
        for (ci, c) in o.consumers.iter().enumerate() {
            let by: Vec<String> = Limit::ALL
                .iter()
                .filter(|x| c.denied[x.index()] > 0)
                .map(|x| format!("{} {}", x.name(), c.denied[x.index()]))
                .collect();
            t.row([
                c.name.clone(),
                format!("{:.0}", c.offered as f64 / mins),
                format!("{:.0}", c.admitted as f64 / mins),
                if c.offered == 0 {
                    "-".into()
                } else {
                    format!("{:.1} %", 100.0 * c.success_rate())
                },
                c.rejected().to_string(),
                if by.is_empty() {
                    "-".into()
                } else {
                    by.join(", ")
                },
                if c.floor_rpm >= 10.0 {
                    format!("{:.0}", c.floor_rpm)
                } else if c.floor_rpm > 0.0 {
                    format!("{:.2}", c.floor_rpm)
                } else {
                    "-".into()
                },
                match floor_met(o, ci) {
                    None => "-".into(),
                    Some(true) => "yes".into(),
                    Some(false) => "NO".into(),
                },
            ]);
        }
        s.push_str(&t.render());
        let per_min: Vec<String> = (0..o.minutes())
            .map(|m| o.admitted_in_minute(m).to_string())
            .collect();
        let off_min: Vec<String> = (0..o.minutes())
            .map(|m| {
                o.consumers
                    .iter()
                    .map(|c| c.offered_per_min[m])
                    .sum::<u64>()
                    .to_string()
            })
            .collect();
        s.push_str(&format!("  offered per minute: {}\n", off_min.join(" ")));
        s.push_str(&format!(
            "  admitted per minute: {} | saturated minutes {nsat}, max deviation from capacity {:.1} % | burst used {} of {} ({:.0} %)\n",
            per_min.join(" "),
            dev * 100.0,
            o.burst_used,
            o.burst_depth,
            if o.burst_depth > 0 { 100.0 * o.burst_used as f64 / o.burst_depth as f64 } else { 0.0 }
        ));
        let mut t = Table::new([
            "server",
            "E2E p50",
            "E2E p95",
            "TTFT p50",
            "ITL p50",
            "GPU",
            "KV",
            "conc. mean",
            "max conc.",
            "in server at end",
        ]);
        for (name, sv) in [
            ("with limiter", &o.server),
            ("no limiter", &pair.unlimited.server),
        ] {
            t.row([
                name.to_string(),
                fmt_s(sv.e2e.quantile_s(0.5)),
                fmt_s(sv.e2e.quantile_s(0.95)),
                fmt_s(sv.ttft.quantile_s(0.5)),
                fmt_s(sv.itl.quantile_s(0.5)),
                sv.gpu_util
                    .map_or("-".into(), |x| format!("{:.0} %", x * 100.0)),
                sv.kv_util
                    .map_or("-".into(), |x| format!("{:.1} %", x * 100.0)),
                format!("{:.1}", sv.concurrency_mean),
                sv.concurrency_max.to_string(),
                sv.outstanding_end.to_string(),
            ]);
        }
        s.push_str(&t.render());
    }
    if let Some(inv) = &p.inverse {
        s.push_str("\ninverse plan:\n");
        if let Some(lines) = inv.get("explanation").and_then(|x| x.as_array()) {
            for x in lines {
                s.push_str(&format!("  {}\n", x.as_str().unwrap_or("")));
            }
        }
    }
    let errors = p
        .findings
        .iter()
        .filter(|f| f.level == Level::Error)
        .count();
    if errors > 0 {
        s.push_str(&format!("\n{errors} error-level finding(s)\n"));
    }
    s
}
