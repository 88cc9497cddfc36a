//! `qsim compare <simulated> <observed>...`: prediction against
//! observation, metric by metric.
//!
//! Inputs are records files. The canonical form is the tidy records CSV
//! (`seed,subject,metric,value`) that `qsim run --format csv` prints and
//! `qsim replay` writes as `summary.csv` (and prints with `--format csv`).
//! The JSON report of `qsim run --format json` (a hosted or server suite:
//! an `experiments` array whose fields are medians, with `interval90` when
//! several seeds ran) is accepted too.
//!
//! For every (subject, metric) present in both files: the prediction (the
//! median over the simulated seeds) and its 90 % interval, the observation
//! (the median over the observed seeds, usually one), the error
//! (observed − predicted) and the relative error, whether the observation
//! lies inside the interval, and whether it agrees: inside the interval or
//! within `--tolerance` of the median.
//!
//! Several observed records files are several runs (e.g. replays against
//! independent endpoints, or repeated replays): their records are pooled,
//! each (file, seed) a run of its own, and the observation is their median.
//! One replay is one draw: even the simulation's own seeds, taken one at a
//! time, fall outside the 90 % interval of some of a suite's metrics now
//! and then, where the median of a few draws does not.
//!
//! `--plot DIR` draws `compare.png`/`compare.svg` (a forest plot: per
//! metric, the simulated interval and median and the observation, in % of
//! the predicted median), `--html FILE` a page with the table and the plot.

use crate::config::ConfigError;
use crate::report::records::Records;
use crate::report::table::Table;
use crate::report::Spread;
use serde_json::{json, Value};
use std::path::PathBuf;

/// What `qsim compare` is asked (a plain spec).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The prediction: `qsim run --format csv` (or `--format json`) output.
    pub simulated: PathBuf,
    /// The observations (records CSVs pooled as runs of their own).
    pub observed: Vec<PathBuf>,
    /// Relative error within which an observation outside the interval
    /// still agrees.
    pub tolerance: f64,
    /// Only these metrics (empty: all).
    pub metrics: Vec<String>,
}

/// The comparison: both sides and a row per (subject, metric) they share.
#[derive(Debug, Clone)]
pub struct Comparison {
    pub spec: Spec,
    pub sim: Values,
    pub obs: Values,
    pub rows: Vec<Row>,
}

/// Read both sides and compare them.
///
/// ```no_run
/// use qsim_sim::compare::{run, Spec};
/// let c = run(&Spec {
///     simulated: "sim.csv".into(),
///     observed: vec!["out/summary.csv".into()],
///     tolerance: 0.10,
///     metrics: vec![],
/// })
/// .unwrap();
/// print!("{}", c.render_table());
/// ```
pub fn run(spec: &Spec) -> Result<Comparison, ConfigError> {
    if !(spec.tolerance.is_finite() && spec.tolerance >= 0.0) {
        return Err(ConfigError::new(
            "--tolerance",
            "",
            format!("must be >= 0, got {}", spec.tolerance),
        ));
    }
    let sim = read_values(&spec.simulated)?;
    let obs = read_observed(&spec.observed)?;
    check_conditions(
        &spec.simulated.display().to_string(),
        &observed_names(&spec.observed),
        &sim,
        &obs,
    )?;
    let rows = compare(&sim, &obs, spec.tolerance, &spec.metrics);
    if rows.is_empty() {
        return Err(ConfigError::new(
            observed_names(&spec.observed),
            "",
            format!(
                "no (subject, metric) in common with {}{}",
                spec.simulated.display(),
                if spec.metrics.is_empty() {
                    ""
                } else {
                    " among --metric"
                }
            ),
        ));
    }
    Ok(Comparison {
        spec: spec.clone(),
        sim,
        obs,
        rows,
    })
}

/// A file's values: (subject, metric) → spread over its seeds, in the
/// order they first appear.
#[derive(Debug, Clone)]
pub struct Values {
    pub seeds: usize,
    pub items: Vec<((String, String), Spread)>,
}

impl Values {
    /// (subject, metric) → spread, for lookups in log time (a linear
    /// search per metric made a comparison quadratic in the metrics).
    fn index(&self) -> std::collections::BTreeMap<(&str, &str), Spread> {
        self.items
            .iter()
            .map(|((s, m), v)| ((s.as_str(), m.as_str()), *v))
            .collect()
    }
}

/// Metrics that state a run's conditions rather than its outcome: the rows
/// a hosted experiment sends (`total`). A prediction and an observation
/// that differ in them are different runs: every count, the elapsed time
/// and the percentiles' sampling differ for that reason alone.
pub const CONDITIONS: &[&str] = &["total"];

/// Refuse to compare runs made under different conditions ([`CONDITIONS`]):
/// a 5-row replay against a 200-row simulation would report every count
/// as a disagreement of the model. Refused rather than warned about: a
/// verdict per metric over different runs is wrong, not doubtful, and
/// simulating the observed conditions costs a second.
pub fn check_conditions(
    sim_name: &str,
    obs_name: &str,
    sim: &Values,
    obs: &Values,
) -> Result<(), ConfigError> {
    let o = obs.index();
    for ((s, m), p) in &sim.items {
        if !CONDITIONS.contains(&m.as_str()) {
            continue;
        }
        let Some(x) = o.get(&(s.as_str(), m.as_str())) else {
            continue;
        };
        if x.lo < p.lo - 1e-9 || x.hi > p.hi + 1e-9 {
            let obs_v = if x.lo == x.hi {
                num(x.median)
            } else {
                format!("{}–{}", num(x.lo), num(x.hi))
            };
            let sim_v = if p.lo == p.hi {
                num(p.median)
            } else {
                format!("{}–{}", num(p.lo), num(p.hi))
            };
            return Err(ConfigError::new(
                obs_name,
                "",
                format!(
                    "{s}: observed {obs_v} rows ({m}), but the prediction {sim_name} simulated {sim_v}: these are different runs, not a prediction of this one; simulate the observed rows (qsim run ... --set rows={obs_v}) and compare again"
                ),
            ));
        }
    }
    Ok(())
}

fn from_records(r: &Records) -> Values {
    let mut order: Vec<(String, String)> = Vec::new();
    let mut seen = std::collections::BTreeSet::new();
    for x in r.iter() {
        let k = (x.subject.to_string(), x.metric.to_string());
        if seen.insert(k.clone()) {
            order.push(k);
        }
    }
    let sp = r.spreads();
    Values {
        seeds: sp.runs,
        items: order
            .into_iter()
            .map(|(s, m)| {
                let v = sp.get(&s, &m);
                ((s, m), v)
            })
            .collect(),
    }
}

/// Read a records CSV or a `qsim run --format json` report.
pub fn read_values(path: &std::path::Path) -> Result<Values, ConfigError> {
    match read_file(path)? {
        Read::Json(v) => Ok(v),
        Read::Records(r) => Ok(from_records(&r)),
    }
}

/// Read several observation files: one file as [`read_values`]; several
/// must be records CSVs, pooled with each (file, seed) a run of its own.
pub fn read_observed(paths: &[PathBuf]) -> Result<Values, ConfigError> {
    if let [one] = paths {
        return read_values(one);
    }
    let mut all = Records::default();
    let mut run = 0u64;
    for p in paths {
        let Read::Records(r) = read_file(p)? else {
            return Err(ConfigError::new(
                p.display().to_string(),
                "",
                "several observations must be records CSVs (seed,subject,metric,value), not a JSON report",
            ));
        };
        // the file's seeds in order of appearance, renumbered after the
        // previous files' runs
        let mut ids = std::collections::BTreeMap::new();
        for x in r.iter() {
            let next = ids.len() as u64;
            let k = *ids.entry(x.seed).or_insert(next);
            all.push(run + k, x.subject, x.metric, x.value);
        }
        run += ids.len() as u64;
    }
    Ok(from_records(&all))
}

enum Read {
    Json(Values),
    Records(Records),
}

fn read_file(path: &std::path::Path) -> Result<Read, ConfigError> {
    let f = path.display().to_string();
    let text = crate::input::read_text(path, crate::input::Kind::Data)
        .map_err(|e| ConfigError::new(&f, "", e))?;
    if text.trim_start().starts_with('{') {
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| ConfigError::new(&f, "", format!("not JSON: {e}")))?;
        return from_json(&f, &v).map(Read::Json);
    }
    let mut rd = csv::Reader::from_reader(text.as_bytes());
    let h = rd
        .headers()
        .map_err(|e| ConfigError::new(&f, "", format!("bad CSV header: {e}")))?
        .clone();
    let cols: Vec<&str> = h.iter().collect();
    if cols != ["seed", "subject", "metric", "value"] {
        return Err(ConfigError::new(
            &f,
            "",
            format!(
                "expected a records CSV with the header seed,subject,metric,value (qsim run --format csv, qsim replay's summary.csv); got {}{}",
                cols.join(","),
                if cols.len() > 4 { " (a sweep's records: compare one point's)" } else { "" }
            ),
        ));
    }
    let mut r = Records::default();
    for (i, rec) in rd.records().enumerate() {
        let at = format!("row {}", i + 2);
        let rec = rec.map_err(|e| ConfigError::new(&f, &at, format!("bad CSV: {e}")))?;
        let seed: u64 = rec[0].parse().map_err(|_| {
            ConfigError::new(&f, &at, format!("seed {:?} is not an integer", &rec[0]))
        })?;
        let value: f64 = rec[3].parse().map_err(|_| {
            ConfigError::new(&f, &at, format!("value {:?} is not a number", &rec[3]))
        })?;
        if !value.is_finite() {
            return Err(ConfigError::new(
                &f,
                format!("{at}, column value"),
                format!(
                    "{:?} is not a finite number (a record is a measured value)",
                    &rec[3]
                ),
            ));
        }
        r.push(seed, &rec[1], &rec[2], value);
    }
    if r.is_empty() {
        return Err(ConfigError::new(&f, "", "no records"));
    }
    Ok(Read::Records(r))
}

fn from_json(f: &str, v: &Value) -> Result<Values, ConfigError> {
    let exps = v
        .get("experiments")
        .and_then(Value::as_array)
        .ok_or_else(|| {
            ConfigError::new(
                f,
                "experiments",
                "missing: expected qsim run --format json of a hosted or server suite, or a records CSV",
            )
        })?;
    let seeds = v.get("seeds").and_then(Value::as_u64).unwrap_or(1) as usize;
    let mut items = Vec::new();
    for (i, e) in exps.iter().enumerate() {
        let name = e
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ConfigError::new(f, format!("experiments.{i}.name"), "missing"))?;
        let Some(o) = e.as_object() else { continue };
        for (k, x) in o {
            let Some(m) = x.as_f64() else { continue };
            let iv = e
                .pointer(&format!("/interval90/{k}"))
                .and_then(Value::as_array)
                .and_then(|a| Some((a.first()?.as_f64()?, a.get(1)?.as_f64()?)));
            let (lo, hi) = iv.unwrap_or((m, m));
            if ![m, lo, hi].iter().all(|x| x.is_finite()) {
                return Err(ConfigError::new(
                    f,
                    format!("experiments.{i}.{k}"),
                    "not a finite number",
                ));
            }
            items.push(((name.to_string(), k.clone()), Spread { median: m, lo, hi }));
        }
    }
    if items.is_empty() {
        return Err(ConfigError::new(f, "experiments", "no metrics"));
    }
    Ok(Values { seeds, items })
}

/// One compared metric.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    pub subject: String,
    pub metric: String,
    pub predicted: Spread,
    pub observed: f64,
    pub error: f64,
    /// `error / |predicted median|`; `None` when the prediction is 0.
    pub rel_error: Option<f64>,
    pub in_interval: bool,
    /// Inside the interval or within the tolerance of the median (an
    /// observation of 0 against a prediction of 0 agrees).
    pub agrees: bool,
}

/// Compare every (subject, metric) of `sim` that `obs` has too, in `sim`'s order.
pub fn compare(sim: &Values, obs: &Values, tolerance: f64, metrics: &[String]) -> Vec<Row> {
    let obs = obs.index();
    sim.items
        .iter()
        .filter(|((_, m), _)| metrics.is_empty() || metrics.contains(m))
        .filter_map(|((s, m), p)| {
            let o = obs.get(&(s.as_str(), m.as_str()))?.median;
            let error = o - p.median;
            let rel_error = (p.median != 0.0).then(|| error / p.median.abs());
            let in_interval = p.lo - 1e-9 <= o && o <= p.hi + 1e-9;
            let agrees = in_interval
                || rel_error.map_or(error.abs() < 1e-9, |r| r.abs() <= tolerance + 1e-12);
            Some(Row {
                subject: s.clone(),
                metric: m.clone(),
                predicted: *p,
                observed: o,
                error,
                rel_error,
                in_interval,
                agrees,
            })
        })
        .collect()
}

pub fn num(x: f64) -> String {
    if x == x.round() && x.abs() < 1e12 {
        format!("{}", x as i64)
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

fn observed_names(observed: &[PathBuf]) -> String {
    observed
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// "1 seed", "5 seeds".
pub fn count(n: usize, what: &str) -> String {
    format!("{n} {what}{}", if n == 1 { "" } else { "s" })
}

/// The observation's runs: seeds of one file, runs of several.
fn observed_count(observed: &[PathBuf], obs: &Values) -> String {
    count(obs.seeds, if observed.len() > 1 { "run" } else { "seed" })
}

impl Comparison {
    /// The report as a table.
    pub fn render_table(&self) -> String {
        let (a, sim, obs, rows) = (&self.spec, &self.sim, &self.obs, &self.rows);
        let mut out = format!(
        "prediction {} ({}) vs observation {} ({}); agrees: inside the 90% interval or within {}% of the median\n\n",
        a.simulated.display(),
        count(sim.seeds, "seed"),
        observed_names(&a.observed),
        observed_count(&a.observed, obs),
        a.tolerance * 100.0
    );
        let mut t = Table::new([
            "subject",
            "metric",
            "predicted",
            "90% interval",
            "observed",
            "error",
            "rel. error",
            "in interval",
            "agrees",
        ]);
        for r in rows {
            t.row([
                r.subject.clone(),
                r.metric.clone(),
                num(r.predicted.median),
                format!("{}–{}", num(r.predicted.lo), num(r.predicted.hi)),
                num(r.observed),
                num(r.error),
                r.rel_error
                    .map_or("–".to_string(), |x| format!("{:+.1}%", x * 100.0)),
                if r.in_interval { "yes" } else { "no" }.to_string(),
                if r.agrees { "yes" } else { "NO" }.to_string(),
            ]);
        }
        out.push_str(&t.render());
        let n = rows.iter().filter(|r| r.agrees).count();
        out.push_str(&format!("\n{n} of {} metrics agree\n", rows.len()));
        out
    }

    /// The report as JSON.
    pub fn render_json(&self) -> Value {
        let (a, sim, obs, rows) = (&self.spec, &self.sim, &self.obs, &self.rows);
        json!({
            "simulated": a.simulated.display().to_string(),
            "observed": observed_names(&a.observed),
            "observed_files": a.observed.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
            "simulated_seeds": sim.seeds,
            "observed_seeds": obs.seeds,
            "tolerance": a.tolerance,
            "metrics": rows.iter().map(|r| json!({
                "subject": r.subject,
                "metric": r.metric,
                "predicted": r.predicted.median,
                "interval90": [r.predicted.lo, r.predicted.hi],
                "observed": r.observed,
                "error": r.error,
                "rel_error": r.rel_error,
                "in_interval": r.in_interval,
                "agrees": r.agrees,
            })).collect::<Vec<_>>(),
            "agree": rows.iter().filter(|r| r.agrees).count(),
            "total": rows.len(),
        })
    }

    /// What the figure's page says of the comparison.
    pub fn intro(&self) -> String {
        format!(
            "qsim compare {} {}: per metric, the prediction's median and 90 % interval over {} (simulated), and the observation (median over {}).",
            self.spec.simulated.display(),
            observed_names(&self.spec.observed),
            count(self.sim.seeds, "seed"),
            observed_count(&self.spec.observed, &self.obs),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::spread;

    #[test]
    fn agreement_by_interval_or_tolerance() {
        let mut s = Records::default();
        for (seed, v) in [(1, 10.0), (2, 12.0), (3, 14.0)] {
            s.push(seed, "e", "ok", v);
            s.push(seed, "e", "zero", 0.0);
        }
        let mut o = Records::default();
        o.push(1, "e", "ok", 14.9);
        o.push(1, "e", "zero", 0.0);
        let rows = compare(&from_records(&s), &from_records(&o), 0.10, &[]);
        assert_eq!(rows.len(), 2);
        // 14.9 is outside [10.2, 13.8] and 24 % above 12
        assert!(!rows[0].in_interval && !rows[0].agrees);
        assert!((rows[0].rel_error.unwrap() - 2.9 / 12.0).abs() < 1e-12);
        assert!(rows[1].agrees && rows[1].rel_error.is_none());
        let rows = compare(&from_records(&s), &from_records(&o), 0.25, &["ok".into()]);
        assert_eq!(rows.len(), 1);
        assert!(rows[0].agrees);
    }

    #[test]
    fn spread_of_one_seed_is_the_value() {
        let sp = spread(&[3.0]);
        assert_eq!((sp.median, sp.lo, sp.hi), (3.0, 3.0, 3.0));
    }
}
