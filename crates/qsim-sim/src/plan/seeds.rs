//! A plan over several seeds: each seed's scenarios reduced to tidy records,
//! and the medians and 90 % intervals over seeds derived from them.

use super::{floor_met, ScenarioPair};
use crate::report::records::{Records, Spreads};
use crate::report::table::Table;
use crate::report::{fmt_spread, round};
use serde_json::{json, Map, Value};

/// Per consumer: (key, label, decimals).
pub const CONSUMER_METRICS: &[(&str, &str, i32)] = &[
    ("offered", "offered", 0),
    ("admitted", "admitted", 0),
    ("success_pct", "success %", 1),
    ("admitted_per_saturated_min", "admitted / saturated min", 0),
    ("floor_met", "floor met (share of seeds)", 2),
    ("failed", "failed after retries", 0),
];

/// Per scenario: (key, label, decimals).
pub const SCENARIO_METRICS: &[(&str, &str, i32)] = &[
    ("saturated_minutes", "saturated minutes", 0),
    ("burst_used", "burst used", 0),
    ("e2e_p50_s", "server E2E p50 (s)", 2),
    ("ttft_p50_s", "server TTFT p50 (s)", 3),
    ("itl_p50_s", "server ITL p50 (s)", 4),
    ("concurrency_mean", "server concurrency (mean)", 1),
    ("no_limiter.e2e_p50_s", "no limiter: E2E p50 (s)", 2),
    (
        "no_limiter.outstanding_end",
        "no limiter: in server at end",
        0,
    ),
];

/// The subject of a consumer's records in a scenario.
pub fn consumer_subject(scenario: &str, consumer: &str) -> String {
    format!("{scenario}/{consumer}")
}

/// One seed's scenarios as tidy records: per scenario (subject: its name)
/// and per consumer (subject: `scenario/consumer`), including the admitted
/// and offered units of every minute (`admitted_per_min.M`).
pub fn records(out: &mut Records, seed: u64, runs: &[ScenarioPair]) {
    for pair in runs {
        let o = &pair.limited;
        let sat: Vec<usize> = (0..o.saturated.len()).filter(|&m| o.saturated[m]).collect();
        out.push(seed, &o.name, "saturated_minutes", sat.len() as f64);
        out.push(seed, &o.name, "burst_used", o.burst_used as f64);
        out.push(seed, &o.name, "e2e_p50_s", o.server.e2e.quantile_s(0.5));
        out.push(seed, &o.name, "ttft_p50_s", o.server.ttft.quantile_s(0.5));
        out.push(seed, &o.name, "itl_p50_s", o.server.itl.quantile_s(0.5));
        out.push(seed, &o.name, "concurrency_mean", o.server.concurrency_mean);
        if !pair.unlimited.limited {
            let u = &pair.unlimited.server;
            out.push(seed, &o.name, "no_limiter.e2e_p50_s", u.e2e.quantile_s(0.5));
            let left = u.outstanding_end as f64;
            out.push(seed, &o.name, "no_limiter.outstanding_end", left);
        }
        for (c, co) in o.consumers.iter().enumerate() {
            let s = consumer_subject(&o.name, &co.name);
            out.push(seed, &s, "offered", co.offered as f64);
            out.push(seed, &s, "admitted", co.admitted as f64);
            out.push(seed, &s, "failed", co.failed as f64);
            if co.offered > 0 {
                let pct = 100.0 * co.admitted as f64 / co.offered as f64;
                out.push(seed, &s, "success_pct", pct);
            }
            if !sat.is_empty() {
                let sum: u64 = sat.iter().map(|&m| co.admitted_units_per_min[m]).sum();
                let mean = sum as f64 / sat.len() as f64;
                out.push(seed, &s, "admitted_per_saturated_min", mean);
            }
            if let Some(met) = floor_met(o, c) {
                out.push(seed, &s, "floor_met", if met { 1.0 } else { 0.0 });
            }
            for m in 0..co.admitted_per_min.len() {
                let a = co.admitted_units_per_min[m] as f64;
                out.push(seed, &s, &format!("admitted_per_min.{m}"), a);
                let f = co.offered_units_per_min[m] as f64;
                out.push(seed, &s, &format!("offered_per_min.{m}"), f);
            }
        }
    }
}

fn cell(s: &Spreads, subject: &str, key: &str, d: i32) -> String {
    if s.has(subject, key) {
        fmt_spread(&s.get(subject, key), d, s.runs)
    } else {
        "–".into()
    }
}

/// The "over seeds" section of the text report: per scenario, its figures
/// and one column per consumer.
pub fn table(runs: &[ScenarioPair], s: &Spreads, seed: u64) -> String {
    let mut out = format!(
        "\nOver {} seeds from {seed}: median [90% interval]\n",
        s.runs
    );
    for pair in runs {
        let o = &pair.limited;
        out.push_str(&format!("\nscenario {}\n", o.name));
        let mut t = Table::new(
            std::iter::once("metric".to_string()).chain(o.consumers.iter().map(|c| c.name.clone())),
        );
        for (key, label, d) in CONSUMER_METRICS {
            t.row(
                std::iter::once(label.to_string()).chain(
                    o.consumers
                        .iter()
                        .map(|c| cell(s, &consumer_subject(&o.name, &c.name), key, *d)),
                ),
            );
        }
        out.push_str(&t.render());
        out.push('\n');
        let mut t = Table::new(["scenario metric".to_string(), "value".to_string()]);
        for (key, label, d) in SCENARIO_METRICS {
            t.row([label.to_string(), cell(s, &o.name, key, *d)]);
        }
        out.push_str(&t.render());
    }
    out
}

fn num(s: &Spreads, subject: &str, key: &str, d: i32) -> Value {
    let r = |x: f64| json!(round(x, d.max(3)));
    if !s.has(subject, key) {
        return Value::Null;
    }
    let v = s.get(subject, key);
    json!({ "median": r(v.median), "interval90": [r(v.lo), r(v.hi)] })
}

/// The `over_seeds` object of the JSON report.
pub fn json(runs: &[ScenarioPair], s: &Spreads, seed: u64) -> Value {
    let scenarios: Vec<Value> = runs
        .iter()
        .map(|pair| {
            let o = &pair.limited;
            let mut m = Map::new();
            m.insert("name".into(), json!(o.name));
            for (key, _, d) in SCENARIO_METRICS {
                m.insert((*key).into(), num(s, &o.name, key, *d));
            }
            let consumers: Vec<Value> = o
                .consumers
                .iter()
                .map(|c| {
                    let sub = consumer_subject(&o.name, &c.name);
                    let mut cm = Map::new();
                    cm.insert("name".into(), json!(c.name));
                    for (key, _, d) in CONSUMER_METRICS {
                        cm.insert((*key).into(), num(s, &sub, key, *d));
                    }
                    Value::Object(cm)
                })
                .collect();
            m.insert("consumers".into(), Value::Array(consumers));
            Value::Object(m)
        })
        .collect();
    json!({ "seed": seed, "seeds": s.runs, "scenarios": scenarios })
}

/// The metrics shown per (scenario, consumer) in a sweep table.
pub const SWEEP_COLS: &[&str] = &[
    "offered",
    "admitted",
    "success_pct",
    "admitted_per_saturated_min",
    "floor_met",
];

/// Sweep rows: one per (scenario, consumer), every consumer metric (a
/// metric never recorded — no saturated minute, no floor — is NaN: "–").
pub fn sweep_rows(f: &super::config::SharedFile, s: &Spreads) -> Vec<crate::report::sweep::Row> {
    let mut rows = Vec::new();
    for sc in &f.scenarios {
        for c in &f.limiter.consumers {
            let sub = consumer_subject(&sc.name, &c.name);
            rows.push(crate::report::sweep::Row {
                name: sub.clone(),
                metrics: CONSUMER_METRICS
                    .iter()
                    .map(|(k, _, d)| {
                        let v = if s.has(&sub, k) {
                            s.get(&sub, k)
                        } else {
                            let nan = f64::NAN;
                            crate::report::Spread {
                                median: nan,
                                lo: nan,
                                hi: nan,
                            }
                        };
                        (*k, *d, v)
                    })
                    .collect(),
            });
        }
    }
    rows
}
