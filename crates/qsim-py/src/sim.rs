//! `qsim.run`, `qsim.sweep`, `qsim.plan`: the simulation library from
//! Python, as the CLI calls it (`src/cli/mod.rs`): the same loading,
//! `set` overrides, seeds, work budget and renderers, so the records and
//! the text report are the CLI's, byte for byte. The simulation runs with
//! the GIL released.
//!
//! The glue here (loading with named field paths, spreads → report) is the
//! CLI's, repeated until issue 37 gives both doors one library function per
//! command.

use crate::errors;
use pyo3::prelude::*;
use pyo3::types::PyList;
use qsim_results::{NamedColumn, Values};
use qsim_sim::budget::{Budget, Cost, DEFAULT_MAX_MEMORY_MB, DEFAULT_MAX_REQUESTS};
use qsim_sim::config::ConfigError;
use qsim_sim::experiment::{self, ExperimentFile};
use qsim_sim::plan::PlanError;
use qsim_sim::report;
use qsim_sim::report::records::{PointRecords, Records};
use qsim_sim::sweep::Axis;
use std::path::{Path, PathBuf};

/// What a run, sweep or plan returned: its records, the CLI's text report
/// and its results tables.
#[pyclass(frozen, module = "qsim._qsim")]
pub struct RunResult {
    text: String,
    /// (grid point, its records)
    points: Vec<(usize, Records)>,
    /// (point index → params) for CSV
    params: Vec<Vec<(String, String)>>,
    axes: Vec<Axis>,
}

fn err(e: PlanError, file: Option<&Path>, sets: &[String]) -> PyErr {
    match e {
        PlanError::Config(c) => errors::config(name_fields(c, file, sets)),
        PlanError::Unmet(m) => errors::UnmetError::new_err(m),
    }
}

/// The CLI's `load_experiment`: errors name array items by their names.
pub(crate) fn load(file: &Path, sets: &[String]) -> Result<ExperimentFile, ConfigError> {
    experiment::load(file, sets).map_err(|e| {
        let src = file.display().to_string();
        if e.source == src {
            if let Some(w) = qsim_sim::config::read_toml(file)
                .ok()
                .and_then(|v| qsim_sim::config::profile_not_experiment(&src, &v))
            {
                return w;
            }
        }
        name_fields(e, Some(file), sets)
    })
}

/// The CLI's `name_fields`.
fn name_fields(e: ConfigError, file: Option<&Path>, sets: &[String]) -> ConfigError {
    if !e.field.split('.').any(|s| s.parse::<usize>().is_ok()) {
        return e;
    }
    let doc = match file {
        Some(f) if f.display().to_string() == e.source => {
            qsim_sim::config::read_toml(f).ok().map(|mut v| {
                for s in sets {
                    let _ = qsim_sim::config::apply_set(&mut v, s);
                }
                v
            })
        }
        _ => {
            let name = e
                .source
                .strip_suffix(" (embedded)")
                .map(|n| PathBuf::from(format!("{}{n}", qsim_sim::embedded::PREFIX)));
            let p = name.unwrap_or_else(|| PathBuf::from(&e.source));
            if qsim_sim::config::source_exists(&p) {
                qsim_sim::config::read_toml(&p).ok()
            } else {
                None
            }
        }
    };
    match doc {
        Some(v) => e.named_in(&v),
        None => e,
    }
}

fn budget(max_requests: Option<u64>) -> Budget {
    Budget {
        max_requests: max_requests.unwrap_or(DEFAULT_MAX_REQUESTS),
        max_memory_mb: DEFAULT_MAX_MEMORY_MB,
    }
}

enum Failure {
    Config(ConfigError),
    Plan(PlanError),
}

impl From<ConfigError> for Failure {
    fn from(e: ConfigError) -> Self {
        Failure::Config(e)
    }
}

impl From<PlanError> for Failure {
    fn from(e: PlanError) -> Self {
        Failure::Plan(e)
    }
}

/// Run `f` under the work budget, as the CLI does.
fn scoped<R>(source: &str, max: u64, f: impl FnOnce() -> Result<R, Failure>) -> Result<R, Failure> {
    let (r, meter) = qsim_sim::work::scope(max, f);
    if meter.over() {
        return Err(qsim_sim::work::exceeded(source, &meter).into());
    }
    r
}

fn raise(e: Failure, file: Option<&Path>, sets: &[String]) -> PyErr {
    match e {
        Failure::Config(c) => errors::config(name_fields(c, file, sets)),
        Failure::Plan(p) => err(p, file, sets),
    }
}

/// `qsim run FILE`: (the report, the records).
fn run_inner(
    file: &Path,
    sets: &[String],
    only: &[String],
    seed: u64,
    seeds: u64,
    b: &Budget,
) -> Result<(String, Records), Failure> {
    let fname = file.display().to_string();
    let mut ef = load(file, sets)?;
    ef.retain_only(only)?;
    ef.cost(seeds)
        .and_then(|c| c.check(&fname, b))
        .map_err(|e| name_fields(e, Some(file), sets))?;
    if let ExperimentFile::Shared(args) = &ef {
        let args = qsim_sim::plan::PlanSpec {
            seed,
            seeds,
            ..args.clone()
        };
        let r = qsim_sim::plan::run::run_cli_full(&args, false, b)?;
        return Ok((r.text, r.records));
    }
    let records = ef.records(seed, seeds)?;
    qsim_sim::work::check(&fname)?;
    let s = records.spreads();
    let text = match &ef {
        ExperimentFile::Hosted(suite) => {
            report::hosted::render_table(suite, &fname, seed, &report::hosted::aggregate(suite, &s))
        }
        ExperimentFile::Server(suite) => {
            report::server::render_table(suite, &fname, seed, &report::server::aggregate(suite, &s))
        }
        ExperimentFile::Shared(_) => unreachable!("a plan returned above"),
    };
    Ok((text, records))
}

/// Run an experiment file (`builtin:NAME` for an embedded one) as `qsim
/// run` does: `set` overrides (`PATH=VALUE`), `only` experiments, seeds
/// `seed`..`seed + seeds - 1`. The simulation runs without the GIL.
#[pyfunction]
#[pyo3(signature = (file="builtin:experiments/fmapi-pacing.toml", set=vec![], only=vec![], seed=1, seeds=1, max_requests=None))]
pub fn run(
    py: Python<'_>,
    file: &str,
    set: Vec<String>,
    only: Vec<String>,
    seed: u64,
    seeds: u64,
    max_requests: Option<u64>,
) -> PyResult<RunResult> {
    check_seeds(seeds)?;
    let path = PathBuf::from(file);
    let b = budget(max_requests);
    let r = py.detach(|| {
        scoped(file, b.max_requests, || {
            run_inner(&path, &set, &only, seed, seeds, &b)
        })
    });
    let (text, records) = r.map_err(|e| raise(e, Some(&path), &set))?;
    Ok(RunResult {
        text,
        points: vec![(0, records)],
        params: vec![vec![]],
        axes: vec![],
    })
}

fn check_seeds(seeds: u64) -> PyResult<()> {
    if !(1..=100_000).contains(&seeds) {
        return Err(errors::config(ConfigError::new(
            "seeds",
            "",
            format!("must be in 1..=100000, got {seeds}"),
        )));
    }
    Ok(())
}

/// Run a file over a grid (`vary`: `PATH=V1,V2`, `PATH=A..B:xK`,
/// `PATH=A..B:+K`, first outermost), as `qsim sweep` does.
#[pyfunction]
#[pyo3(signature = (file, vary, set=vec![], only=vec![], seed=1, seeds=1, threads=None, max_requests=None))]
#[allow(clippy::too_many_arguments)]
pub fn sweep(
    py: Python<'_>,
    file: &str,
    vary: Vec<String>,
    set: Vec<String>,
    only: Vec<String>,
    seed: u64,
    seeds: u64,
    threads: Option<usize>,
    max_requests: Option<u64>,
) -> PyResult<RunResult> {
    check_seeds(seeds)?;
    if vary.is_empty() {
        return Err(errors::config(ConfigError::new(
            "vary",
            "",
            "at least one dimension is needed (PATH=V1,V2,...)",
        )));
    }
    let path = PathBuf::from(file);
    let b = budget(max_requests);
    let r = py.detach(|| {
        scoped(file, b.max_requests, || -> Result<_, Failure> {
            let dims = qsim_sim::sweep::parse_vary(&vary)?;
            let combos = qsim_sim::sweep::grid(&dims);
            let mine: Vec<usize> = (0..combos.len()).collect();
            let mut efs = Vec::with_capacity(combos.len());
            let mut cost = Cost::default();
            for combo in &combos {
                let mut all = set.clone();
                all.extend(combo.iter().map(|(k, v)| format!("{k}={v}")));
                let point_err = |mut e: ConfigError| {
                    if let Some((k, v)) = combo
                        .iter()
                        .find(|(k, v)| e.source == format!("--set {k}={v}"))
                    {
                        e.source = format!("--vary {k}={v}");
                    } else if !set.iter().any(|s| e.source == format!("--set {s}")) {
                        let at: Vec<String> =
                            combo.iter().map(|(k, v)| format!("{k}={v}")).collect();
                        e.reason =
                            format!("{} (at the sweep point --vary {})", e.reason, at.join(" "));
                    }
                    e
                };
                let mut ef = load(&path, &all).map_err(point_err)?;
                ef.retain_only(&only).map_err(point_err)?;
                cost.then(
                    ef.cost(seeds)
                        .map_err(|e| name_fields(e, Some(&path), &all))?,
                );
                efs.push(ef);
            }
            cost.check(file, &b)?;
            let results = qsim_sim::sweep::run_points(&efs, &mine, seed, seeds, threads)?;
            qsim_sim::work::check(file)?;
            let mut points = Vec::new();
            let mut table_points = Vec::new();
            let mut cols: &[&str] = report::hosted::SWEEP_COLS;
            for (p, records) in results.into_iter().enumerate() {
                let s = records.spreads();
                let rows = match &efs[p] {
                    ExperimentFile::Hosted(suite) => {
                        report::hosted::sweep_rows(&report::hosted::aggregate(suite, &s))
                    }
                    ExperimentFile::Server(suite) => {
                        cols = report::server::SWEEP_COLS;
                        report::server::sweep_rows(&report::server::aggregate(suite, &s))
                    }
                    ExperimentFile::Shared(args) => {
                        cols = qsim_sim::plan::seeds::SWEEP_COLS;
                        let (f, _) = qsim_sim::plan::build(args)?;
                        qsim_sim::plan::seeds::sweep_rows(&f, &s)
                    }
                };
                table_points.push((combos[p].clone(), rows));
                points.push((p, records));
            }
            let text = report::sweep::render_table(file, seed, seeds, &table_points, cols);
            Ok((text, points, combos, dims))
        })
    });
    let (text, points, combos, dims) = r.map_err(|e| raise(e, Some(&path), &set))?;
    Ok(RunResult {
        text,
        points,
        params: combos,
        axes: dims,
    })
}

/// `qsim plan`: the flags as keyword arguments (`capacity="1000"`,
/// `reserve="30,20,30"`, `scenarios=FILE`, `only`, `set`, ...).
#[pyfunction]
#[pyo3(signature = (capacity=None, reserve=None, threshold=None, names=None, semantics=None, unit=None, burst=None, model=None, replicas=None, scenarios=None, need=None, e2e_p95=None, set=vec![], only=vec![], seed=1, seeds=1, max_requests=None))]
#[allow(clippy::too_many_arguments)]
pub fn plan(
    py: Python<'_>,
    capacity: Option<String>,
    reserve: Option<String>,
    threshold: Option<String>,
    names: Option<String>,
    semantics: Option<String>,
    unit: Option<String>,
    burst: Option<String>,
    model: Option<String>,
    replicas: Option<u32>,
    scenarios: Option<PathBuf>,
    need: Option<String>,
    e2e_p95: Option<String>,
    set: Vec<String>,
    only: Vec<String>,
    seed: u64,
    seeds: u64,
    max_requests: Option<u64>,
) -> PyResult<RunResult> {
    check_seeds(seeds)?;
    let e2e_p95 = e2e_p95
        .map(|s| {
            qsim_sim::time::parse_duration(&s)
                .map_err(|r| errors::config(ConfigError::new("--e2e-p95", "", r)))
        })
        .transpose()?;
    let spec = qsim_sim::plan::PlanSpec {
        capacity,
        reserve,
        threshold,
        names,
        semantics,
        unit,
        burst,
        model,
        replicas,
        scenarios: scenarios.clone(),
        need,
        e2e_p95,
        seed,
        seeds,
        sets: set.clone(),
        only,
    };
    let b = budget(max_requests);
    let r = py.detach(|| {
        scoped("qsim plan", b.max_requests, || {
            Ok(qsim_sim::plan::run::run_cli_full(&spec, false, &b)?)
        })
    });
    let r = r.map_err(|e| raise(e, scenarios.as_deref(), &set))?;
    Ok(RunResult {
        text: r.text,
        points: vec![(0, r.records)],
        params: vec![vec![]],
        axes: vec![],
    })
}

/// A column as (name, dtype, values) for the Python side.
pub fn column<'py>(
    py: Python<'py>,
    c: &NamedColumn,
) -> PyResult<(String, &'static str, Bound<'py, PyList>)> {
    let (dtype, list) = match &c.values {
        Values::Str(v) => ("str", PyList::new(py, v)?),
        Values::F64(v) => ("f64", PyList::new(py, v)?),
        Values::I64(v) => ("i64", PyList::new(py, v)?),
        Values::U64(v) => ("u64", PyList::new(py, v)?),
        Values::U32(v) => ("u32", PyList::new(py, v)?),
        Values::Bool(v) => ("bool", PyList::new(py, v)?),
    };
    Ok((c.name.clone(), dtype, list))
}

impl RunResult {
    fn results(&self) -> PyResult<qsim_results::Results> {
        let axes: Vec<qsim_results::Axis> = self
            .axes
            .iter()
            .map(|(path, values)| qsim_results::Axis {
                path: path.clone(),
                values: values.clone(),
            })
            .collect();
        let mut b = qsim_results::ResultsBuilder::new(axes);
        for (p, records) in &self.points {
            for r in records.iter() {
                b.push(*p, r.seed, r.subject, r.metric, r.value)
                    .map_err(|e| errors::qsim(format!("results tables: {e}")))?;
            }
        }
        Ok(b.finish())
    }
}

#[pymethods]
impl RunResult {
    /// The CLI's text report.
    fn __str__(&self) -> &str {
        &self.text
    }

    #[getter]
    fn text(&self) -> &str {
        &self.text
    }

    /// The tidy records as `qsim run --format csv` prints them.
    fn to_csv(&self) -> String {
        let pts: Vec<PointRecords> = self
            .points
            .iter()
            .map(|(p, r)| PointRecords {
                params: self.params.get(*p).cloned().unwrap_or_default(),
                records: r.clone(),
            })
            .collect();
        report::records::to_csv(&pts)
    }

    /// The tidy records: [(point, seed, subject, metric, value)].
    fn records(&self) -> Vec<(usize, u64, String, String, f64)> {
        self.points
            .iter()
            .flat_map(|(p, r)| {
                r.iter().map(move |x| {
                    (
                        *p,
                        x.seed,
                        x.subject.to_string(),
                        x.metric.to_string(),
                        x.value,
                    )
                })
            })
            .collect()
    }

    /// One results table's columns (`runs` or `points`, as the CLI's `--out
    /// DIR` writes them): [(name, dtype, values)].
    #[pyo3(signature = (table="runs"))]
    fn columns<'py>(
        &self,
        py: Python<'py>,
        table: &str,
    ) -> PyResult<Vec<(String, &'static str, Bound<'py, PyList>)>> {
        let r = self.results()?;
        let cols = match table {
            "runs" => r.runs_columns(),
            "points" => r.points_columns(),
            other => {
                return Err(errors::config(ConfigError::new(
                    "table",
                    "",
                    format!("unknown table {other:?}; expected \"runs\" or \"points\""),
                )))
            }
        };
        cols.iter().map(|c| column(py, c)).collect()
    }
}

/// The simulation's own attempts for a hosted experiment file (its first
/// experiment, or `experiment`): what the endpoint answered each attempt
/// and what the simulation's caller did next — the reference the Pacer's
/// decisions are checked against (python/tests). One tuple per attempt:
/// (row, attempt, sdk_retry, sent_ns, replied_ns, kind, status, hint_ns,
/// next_at_ns or None, outcome_status or None), kind `ok` / `error` /
/// `local_reject`.
#[pyfunction]
#[pyo3(signature = (file, seed=1, set=vec![]))]
#[allow(clippy::type_complexity)]
pub fn simulate_attempts(
    py: Python<'_>,
    file: &str,
    seed: u64,
    set: Vec<String>,
) -> PyResult<
    Vec<(
        u64,
        u32,
        u32,
        u64,
        u64,
        &'static str,
        u16,
        Option<u64>,
        Option<u64>,
        Option<(u16, u32, u64, u64, bool)>,
    )>,
> {
    use qsim_core::client::{Next, Reply};
    let path = PathBuf::from(file);
    let suite = match load(&path, &set).map_err(errors::config)? {
        ExperimentFile::Hosted(s) => s,
        _ => return Err(errors::qsim("a hosted experiment file is needed")),
    };
    let out = py.detach(|| {
        let mut out = Vec::new();
        qsim_sim::experiment::hosted::run_suite_observed(&suite, seed, &mut |a| {
            let (kind, status, hint) = match a.reply {
                Reply::Ok => ("ok", 200, None),
                Reply::Error { status, hint } => ("error", status, hint),
                Reply::LocalReject => ("local_reject", 429, None),
            };
            let (at, o) = match a.next {
                Next::SendAt { at, .. } => (Some(at), None),
                Next::Done(o) => (
                    None,
                    Some((o.status, o.attempts, o.own_wait, o.latency, o.quota_denied)),
                ),
            };
            out.push((
                a.row,
                a.attempt,
                a.sdk_retry,
                a.sent,
                a.replied,
                kind,
                status,
                hint,
                at,
                o,
            ));
        });
        out
    });
    Ok(out)
}
