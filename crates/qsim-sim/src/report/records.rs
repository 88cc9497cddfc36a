//! Tidy records: the single output of a run.
//!
//! Every run of every experiment kind reduces, seed by seed, to records
//! `(seed, subject, metric, value)` — the subject is an experiment, a
//! scenario, `scenario/replica-K` or `scenario/consumer` — and a sweep adds
//! the point's parameters. Tables, JSON, the spreads over seeds (median and
//! 90 % interval) and the CSV that table tools read are all derived from
//! these records; nothing else survives a seed (no histograms are kept).

use super::{spread, Spread};
use std::collections::BTreeMap;

/// One measured value, as read back from [`Records`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record<'a> {
    pub seed: u64,
    /// What the value is about: an experiment, a scenario, `scenario/consumer`…
    pub subject: &'a str,
    /// The metric's key (the JSON name).
    pub metric: &'a str,
    pub value: f64,
}

/// Interned names: each subject and metric string is stored once.
#[derive(Debug, Clone, Default)]
struct Names {
    names: Vec<String>,
    index: BTreeMap<String, u32>,
}

impl Names {
    fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.to_string());
        self.index.insert(name.to_string(), i);
        i
    }
}

/// Records of one run, appended seed after seed: 24 bytes per value (seed,
/// interned subject and metric, value), so thousands of seeds stay small.
#[derive(Debug, Clone, Default)]
pub struct Records {
    names: Names,
    rows: Vec<(u64, u32, u32, f64)>,
}

impl Records {
    /// Record `value` of `metric` about `subject` for `seed`.
    pub fn push(&mut self, seed: u64, subject: &str, metric: &str, value: f64) {
        let s = self.names.id(subject);
        let m = self.names.id(metric);
        self.rows.push((seed, s, m, value));
    }

    /// The records in the order they were made.
    pub fn iter(&self) -> impl Iterator<Item = Record<'_>> {
        let n = &self.names.names;
        self.rows.iter().map(move |&(seed, s, m, value)| Record {
            seed,
            subject: &n[s as usize],
            metric: &n[m as usize],
            value,
        })
    }

    /// Append every record of `other`, in its order (as if pushed here).
    pub fn extend_from(&mut self, other: &Records) {
        // each of other's names interned here once (in first-use order, as
        // pushing its records one by one would), then its rows remapped
        let mut map = vec![u32::MAX; other.names.names.len()];
        for &(_, s, m, _) in &other.rows {
            for i in [s, m] {
                if map[i as usize] == u32::MAX {
                    map[i as usize] = self.names.id(&other.names.names[i as usize]);
                }
            }
        }
        self.rows.extend(
            other
                .rows
                .iter()
                .map(|&(seed, s, m, v)| (seed, map[s as usize], map[m as usize], v)),
        );
    }

    pub fn len(&self) -> usize {
        self.rows.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Number of distinct seeds.
    pub fn seeds(&self) -> usize {
        let mut s: Vec<u64> = self.rows.iter().map(|r| r.0).collect();
        s.sort_unstable();
        s.dedup();
        s.len()
    }

    /// The spreads over seeds of every (subject, metric).
    pub fn spreads(&self) -> Spreads {
        let mut by: BTreeMap<(u32, u32), Vec<f64>> = BTreeMap::new();
        for &(_, s, m, v) in &self.rows {
            by.entry((s, m)).or_default().push(v);
        }
        let n = &self.names.names;
        Spreads {
            runs: self.seeds(),
            map: by
                .into_iter()
                .map(|((s, m), v)| ((n[s as usize].clone(), n[m as usize].clone()), spread(&v)))
                .collect(),
        }
    }
}

/// Median and 90 % interval over seeds of each (subject, metric).
#[derive(Debug, Clone, Default)]
pub struct Spreads {
    pub runs: usize,
    map: BTreeMap<(String, String), Spread>,
}

impl Spreads {
    /// The spread of `metric` about `subject` (all zeros if never recorded).
    pub fn get(&self, subject: &str, metric: &str) -> Spread {
        self.map
            .get(&(subject.to_string(), metric.to_string()))
            .copied()
            .unwrap_or(Spread {
                median: 0.0,
                lo: 0.0,
                hi: 0.0,
            })
    }

    /// Whether `metric` was recorded about `subject`.
    pub fn has(&self, subject: &str, metric: &str) -> bool {
        self.map
            .contains_key(&(subject.to_string(), metric.to_string()))
    }
}

/// A sweep point: its parameters (path, value) and its records.
#[derive(Debug, Clone)]
pub struct PointRecords {
    pub params: Vec<(String, String)>,
    pub records: Records,
}

/// Quote a CSV field if it needs it (RFC 4180).
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

/// The records as CSV, one row per (point, seed, subject, metric): the
/// point's parameters first (one column per swept path), then `seed,
/// subject, metric, value`. Values are written with Rust's shortest
/// round-trip formatting, so the file reads back to the same numbers.
pub fn to_csv(points: &[PointRecords]) -> String {
    to_csv_refs(points.iter())
}

/// [`to_csv`] of points held elsewhere (a sweep's `(index, point)` pairs).
pub fn to_csv_refs<'a>(points: impl Iterator<Item = &'a PointRecords> + Clone) -> String {
    let cols: Vec<&str> = points
        .clone()
        .next()
        .map(|p| p.params.iter().map(|(k, _)| k.as_str()).collect())
        .unwrap_or_default();
    let mut out = String::new();
    for c in &cols {
        out.push_str(&csv_field(c));
        out.push(',');
    }
    out.push_str("seed,subject,metric,value\n");
    for p in points {
        let prefix: String = p
            .params
            .iter()
            .map(|(_, v)| format!("{},", csv_field(v)))
            .collect();
        for r in p.records.iter() {
            out.push_str(&prefix);
            out.push_str(&format!(
                "{},{},{},{}\n",
                r.seed,
                csv_field(r.subject),
                csv_field(r.metric),
                r.value
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spreads_group_by_subject_and_metric_over_seeds() {
        let mut r = Records::default();
        for seed in 1..=3 {
            r.push(seed, "exp1", "ok", seed as f64 * 10.0);
            r.push(seed, "exp2", "ok", 1.0);
        }
        let s = r.spreads();
        assert_eq!(s.runs, 3);
        assert_eq!(s.get("exp1", "ok").median, 20.0);
        assert_eq!(s.get("exp2", "ok").lo, 1.0);
        assert!(!s.has("exp3", "ok"));
    }

    #[test]
    fn csv_quotes_and_reads_back() {
        let mut r = Records::default();
        r.push(7, "a,b", "m\"x", 0.1 + 0.2);
        let csv = to_csv(&[PointRecords {
            params: vec![("workers".into(), "8".into())],
            records: r,
        }]);
        assert_eq!(
            csv,
            "workers,seed,subject,metric,value\n8,7,\"a,b\",\"m\"\"x\",0.30000000000000004\n"
        );
    }
}
