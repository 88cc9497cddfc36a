//! Sweep reports, for any experiment kind: one row per (grid point,
//! experiment or scenario) with the kind's metrics.

use super::table::Table;
use super::{round, Spread};
use serde_json::{json, Map, Value};

/// One experiment (or scenario) at one grid point: its name and every
/// metric as (JSON key, decimals, spread over seeds).
#[derive(Debug, Clone)]
pub struct Row {
    pub name: String,
    pub metrics: Vec<(&'static str, i32, Spread)>,
}

/// A grid point: the overrides applied, and its rows.
pub type Point = (Vec<(String, String)>, Vec<Row>);

/// The table: the overrides, the name, then the metrics in `cols` (medians).
pub fn render_table(file: &str, seed: u64, seeds: u64, points: &[Point], cols: &[&str]) -> String {
    let mut out = format!("sweep of {file}, ");
    if seeds > 1 {
        out.push_str(&format!("{seeds} seeds from {seed}: medians\n\n"));
    } else {
        out.push_str(&format!("seed {seed}\n\n"));
    }
    let Some((first, _)) = points.first() else {
        return out;
    };
    let mut header: Vec<String> = first.iter().map(|(k, _)| k.clone()).collect();
    header.push("experiment".into());
    header.extend(cols.iter().map(|k| k.to_string()));
    let mut t = Table::new(header);
    for (combo, rows) in points {
        for r in rows {
            let mut line: Vec<String> = combo.iter().map(|(_, v)| v.clone()).collect();
            line.push(r.name.clone());
            for k in cols {
                let (_, d, s) = r
                    .metrics
                    .iter()
                    .find(|m| m.0 == *k)
                    .unwrap_or_else(|| panic!("sweep column {k} is not a metric"));
                line.push(if s.median.is_nan() {
                    "–".to_string()
                } else {
                    super::fmt_spread(s, *d, 1)
                });
            }
            t.row(line);
        }
    }
    out.push_str(&t.render());
    out
}

/// JSON: `points[] {set {path: value}, experiments[] {name, metric: median…}}`.
pub fn render_json(file: &str, seed: u64, seeds: u64, points: &[Point]) -> Value {
    let pts: Vec<Value> = points
        .iter()
        .map(|(combo, rows)| {
            let set: Map<String, Value> =
                combo.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
            let exps: Vec<Value> = rows
                .iter()
                .map(|r| {
                    let mut o = Map::new();
                    o.insert("name".into(), json!(r.name));
                    for (key, d, s) in &r.metrics {
                        let v = if s.median.is_nan() {
                            Value::Null
                        } else if *d == 0 {
                            json!(s.median.round() as i64)
                        } else {
                            json!(round(s.median, (*d).max(3)))
                        };
                        o.insert((*key).into(), v);
                    }
                    Value::Object(o)
                })
                .collect();
            json!({ "set": set, "experiments": exps })
        })
        .collect();
    json!({ "file": file, "seed": seed, "seeds": seeds, "points": pts })
}
