//! The runs table (one row per run: point, parameters, seed, subject, every
//! metric as a column) and the points table (per point, subject and
//! metric: median, mean and 90 % interval over the seeds), built from tidy
//! records `(point, seed, subject, metric, value)`.
//!
//! Everything is ordered by what was pushed, never by a hash: rows by grid
//! point, then in the order each run was first seen in its point; metric
//! columns in the order each metric was first seen scanning the rows in that
//! order. So the tables depend only on the records, not on thread count or
//! sharding (a merge that pushes the shards' rows back in point order builds
//! the same tables).

use crate::columns::{NamedColumn, Values};
use crate::error::ResultsError;
use std::collections::BTreeMap;

/// One swept parameter: its path and its values, in grid order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Axis {
    pub path: String,
    pub values: Vec<String>,
}

/// The parameter values of grid point `index` (first axis outermost: the
/// last axis varies fastest), or None past the grid's end.
pub fn point_params(axes: &[Axis], index: usize) -> Option<Vec<&str>> {
    let mut rest = index;
    let mut out = vec![""; axes.len()];
    for (k, a) in axes.iter().enumerate().rev() {
        let n = a.values.len();
        if n == 0 {
            return None;
        }
        out[k] = a.values[rest % n].as_str();
        rest /= n;
    }
    (rest == 0).then_some(out)
}

/// The number of grid points (1 with no axes).
pub fn grid_size(axes: &[Axis]) -> usize {
    axes.iter().map(|a| a.values.len()).product()
}

/// How a parameter's values are typed in the tables: integers when every
/// value is one, else numbers when every value is one, else text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    Int,
    Float,
    Text,
}

/// The type of a parameter's column (public for the tests).
pub fn param_type(values: &[String]) -> ParamType {
    if values.iter().all(|v| v.parse::<i64>().is_ok()) {
        ParamType::Int
    } else if values
        .iter()
        .all(|v| v.parse::<f64>().is_ok_and(f64::is_finite))
    {
        ParamType::Float
    } else {
        ParamType::Text
    }
}

fn param_column(name: &str, ty: ParamType, values: Vec<&str>) -> NamedColumn {
    let v = match ty {
        ParamType::Int => Values::I64(values.iter().map(|s| s.parse().ok()).collect()),
        ParamType::Float => Values::F64(values.iter().map(|s| s.parse().ok()).collect()),
        ParamType::Text => Values::Str(values.iter().map(|s| Some(s.to_string())).collect()),
    };
    NamedColumn::new(name, v)
}

/// One run: a seed of one subject at one grid point, and its values
/// (metric id, value) in the order recorded.
#[derive(Debug, Clone)]
struct Run {
    point: usize,
    seed: u64,
    subject: u32,
    values: Vec<(u32, f64)>,
}

/// Collects tidy records, then builds the tables.
#[derive(Debug, Clone)]
pub struct ResultsBuilder {
    axes: Vec<Axis>,
    names: Vec<String>,
    ids: BTreeMap<String, u32>,
    runs: Vec<Run>,
    /// (point, seed, subject) → index in `runs`
    index: BTreeMap<(usize, u64, u32), usize>,
}

impl ResultsBuilder {
    /// A builder for a grid over `axes` (none: a single point, index 0).
    pub fn new(axes: Vec<Axis>) -> Self {
        ResultsBuilder {
            axes,
            names: Vec::new(),
            ids: BTreeMap::new(),
            runs: Vec::new(),
            index: BTreeMap::new(),
        }
    }

    pub fn axes(&self) -> &[Axis] {
        &self.axes
    }

    fn id(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.ids.get(name) {
            return i;
        }
        let i = self.names.len() as u32;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), i);
        i
    }

    /// Record `value` of `metric` about `subject` at grid point `point`
    /// for `seed`. A point outside the grid or a value recorded twice is an
    /// error.
    pub fn push(
        &mut self,
        point: usize,
        seed: u64,
        subject: &str,
        metric: &str,
        value: f64,
    ) -> Result<(), ResultsError> {
        if point >= grid_size(&self.axes) {
            return Err(ResultsError::new(
                "results",
                format!(
                    "point {point} is outside the grid of {} points",
                    grid_size(&self.axes)
                ),
            ));
        }
        let s = self.id(subject);
        let m = self.id(metric);
        let next = self.runs.len();
        let r = *self.index.entry((point, seed, s)).or_insert(next);
        if r == next {
            self.runs.push(Run {
                point,
                seed,
                subject: s,
                values: Vec::new(),
            });
        }
        let run = &mut self.runs[r];
        if run.values.iter().any(|&(k, _)| k == m) {
            return Err(ResultsError::new(
                "results",
                format!("{metric} of {subject} at point {point}, seed {seed}, recorded twice"),
            ));
        }
        run.values.push((m, value));
        Ok(())
    }

    /// The tables. Rows are put in grid-point order (stable: within a
    /// point, in the order the runs were first recorded).
    pub fn finish(mut self) -> Results {
        self.runs.sort_by_key(|r| r.point);
        // metric columns in order of first appearance
        let mut metrics: Vec<u32> = Vec::new();
        for r in &self.runs {
            for &(m, _) in &r.values {
                if !metrics.contains(&m) {
                    metrics.push(m);
                }
            }
        }
        Results {
            axes: self.axes,
            names: self.names,
            runs: self.runs,
            metrics,
        }
    }
}

/// The runs and points tables of a run, sweep, plan or merge.
#[derive(Debug, Clone)]
pub struct Results {
    axes: Vec<Axis>,
    names: Vec<String>,
    runs: Vec<Run>,
    metrics: Vec<u32>,
}

/// Median, mean and 90 % interval (5th and 95th percentiles, linear
/// interpolation between order statistics: the definition qsim's text
/// reports use) of a non-empty sample.
pub fn summary(values: &[f64]) -> (f64, f64, f64, f64) {
    let v = qsim_core::stats::sorted(values);
    let n = v.len();
    let q = |p: f64| qsim_core::stats::quantile(&v, p);
    let mean = values.iter().sum::<f64>() / n as f64;
    (q(0.5), mean, q(0.05), q(0.95))
}

impl Results {
    /// The names of the metric columns of the runs table, in order.
    pub fn metric_names(&self) -> Vec<&str> {
        self.metrics
            .iter()
            .map(|&m| self.names[m as usize].as_str())
            .collect()
    }

    /// Number of rows of the runs table.
    pub fn run_count(&self) -> usize {
        self.runs.len()
    }

    fn params_columns(&self, points: &[usize]) -> Vec<NamedColumn> {
        self.axes
            .iter()
            .enumerate()
            .map(|(k, a)| {
                let vals: Vec<&str> = points
                    .iter()
                    .map(|&p| point_params(&self.axes, p).map_or("", |v| v[k]))
                    .collect();
                param_column(&a.path, param_type(&a.values), vals)
            })
            .collect()
    }

    /// The runs table: `point`, one column per swept parameter, `seed`,
    /// `subject`, then one column per metric (null where a run has no such
    /// metric).
    pub fn runs_columns(&self) -> Vec<NamedColumn> {
        let points: Vec<usize> = self.runs.iter().map(|r| r.point).collect();
        let mut cols = vec![NamedColumn::new(
            "point",
            Values::U32(points.iter().map(|&p| Some(p as u32)).collect()),
        )];
        cols.extend(self.params_columns(&points));
        cols.push(NamedColumn::new(
            "seed",
            Values::U64(self.runs.iter().map(|r| Some(r.seed)).collect()),
        ));
        cols.push(NamedColumn::new(
            "subject",
            Values::Str(
                self.runs
                    .iter()
                    .map(|r| Some(self.names[r.subject as usize].clone()))
                    .collect(),
            ),
        ));
        let taken: Vec<String> = cols.iter().map(|c| c.name.clone()).collect();
        for &m in &self.metrics {
            let vals = self
                .runs
                .iter()
                .map(|r| r.values.iter().find(|&&(k, _)| k == m).map(|&(_, v)| v))
                .collect();
            cols.push(NamedColumn::new(
                metric_column(&self.names[m as usize], &taken),
                Values::F64(vals),
            ));
        }
        cols
    }

    /// The points table, one row per (point, subject, metric): `point`, the
    /// parameters, `subject`, `metric`, `runs` (values over seeds),
    /// `median`, `mean`, `p05`, `p95`. Subjects in order of first
    /// appearance in the point, metrics in column order of the runs table.
    pub fn points_columns(&self) -> Vec<NamedColumn> {
        let mut point = Vec::new();
        let mut subject = Vec::new();
        let mut metric = Vec::new();
        let mut runs = Vec::new();
        let (mut med, mut mean, mut lo, mut hi) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut start = 0;
        while start < self.runs.len() {
            let p = self.runs[start].point;
            let end = start
                + self.runs[start..]
                    .iter()
                    .take_while(|r| r.point == p)
                    .count();
            let group = &self.runs[start..end];
            let mut subjects: Vec<u32> = Vec::new();
            for r in group {
                if !subjects.contains(&r.subject) {
                    subjects.push(r.subject);
                }
            }
            for &s in &subjects {
                for &m in &self.metrics {
                    let v: Vec<f64> = group
                        .iter()
                        .filter(|r| r.subject == s)
                        .filter_map(|r| r.values.iter().find(|&&(k, _)| k == m).map(|&(_, v)| v))
                        .collect();
                    if v.is_empty() {
                        continue;
                    }
                    let (a, b, c, d) = summary(&v);
                    point.push(p);
                    subject.push(Some(self.names[s as usize].clone()));
                    metric.push(Some(self.names[m as usize].clone()));
                    runs.push(Some(v.len() as u64));
                    med.push(Some(a));
                    mean.push(Some(b));
                    lo.push(Some(c));
                    hi.push(Some(d));
                }
            }
            start = end;
        }
        let mut cols = vec![NamedColumn::new(
            "point",
            Values::U32(point.iter().map(|&p| Some(p as u32)).collect()),
        )];
        cols.extend(self.params_columns(&point));
        cols.extend([
            NamedColumn::new("subject", Values::Str(subject)),
            NamedColumn::new("metric", Values::Str(metric)),
            NamedColumn::new("runs", Values::U64(runs)),
            NamedColumn::new("median", Values::F64(med)),
            NamedColumn::new("mean", Values::F64(mean)),
            NamedColumn::new("p05", Values::F64(lo)),
            NamedColumn::new("p95", Values::F64(hi)),
        ]);
        cols
    }

    /// The four table files, (name, bytes), in this order: runs.parquet,
    /// runs.csv, points.parquet, points.csv.
    #[cfg(feature = "polars")]
    pub fn encode(&self) -> Result<Vec<(String, Vec<u8>)>, ResultsError> {
        let runs = crate::table::encode_table(&self.runs_columns())?;
        let points = crate::table::encode_table(&self.points_columns())?;
        Ok(vec![
            (RUNS_PARQUET.into(), runs.parquet),
            (RUNS_CSV.into(), runs.csv),
            (POINTS_PARQUET.into(), points.parquet),
            (POINTS_CSV.into(), points.csv),
        ])
    }
}

/// The runs table's column of a metric: its name, or `metric.NAME` when a
/// fixed or parameter column has that name (`--vary sdk_retries=…` and the
/// metric `sdk_retries`).
pub fn metric_column(name: &str, taken: &[String]) -> String {
    if taken.iter().any(|t| t == name) {
        format!("metric.{name}")
    } else {
        name.to_string()
    }
}

/// The metric a runs-table column holds (the inverse of [`metric_column`]).
pub fn column_metric<'a>(column: &'a str, taken: &[&str]) -> &'a str {
    match column.strip_prefix("metric.") {
        Some(n) if taken.contains(&n) => n,
        _ => column,
    }
}

pub const RUNS_PARQUET: &str = "runs.parquet";
pub const RUNS_CSV: &str = "runs.csv";
pub const POINTS_PARQUET: &str = "points.parquet";
pub const POINTS_CSV: &str = "points.csv";
pub const MANIFEST: &str = "manifest.json";

/// Every file name qsim writes into an `--out DIR`.
pub const FILE_NAMES: &[&str] = &[RUNS_PARQUET, RUNS_CSV, POINTS_PARQUET, POINTS_CSV, MANIFEST];
