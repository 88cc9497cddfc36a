//! `qsim run FILE` and `qsim sweep FILE --vary …` as library calls: a
//! plain spec in, the records and the rendered report out. The command line
//! and the Python package call these; neither re-implements a step.
//!
//! ```no_run
//! use qsim_sim::run::{run, RunSpec};
//! let out = run(&RunSpec { seeds: 20, ..RunSpec::default() }).unwrap();
//! print!("{}", out.text);
//! ```

use crate::budget::{Budget, Cost};
use crate::config::ConfigError;
use crate::experiment::extras::{records_with_extras, Extras};
use crate::experiment::{load_file, ExperimentFile};
use crate::plan::config::SharedFile;
use crate::plan::PlanError;
use crate::report;
use crate::report::records::{PointRecords, Records};
use crate::report::Format;
use crate::sweep::{Axis, Shard};
use std::path::PathBuf;

/// What `qsim run` is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct RunSpec {
    /// The experiment file (`builtin:NAME` for an embedded one).
    pub file: PathBuf,
    /// `--set PATH=VALUE` overrides.
    pub sets: Vec<String>,
    /// Only these experiments or scenarios (empty: all).
    pub only: Vec<String>,
    pub seed: u64,
    pub seeds: u64,
    pub format: Format,
    pub budget: Budget,
    /// Also keep what plots need ([`Extras`]): the same runs and records.
    pub extras: bool,
}

impl Default for RunSpec {
    fn default() -> Self {
        RunSpec {
            file: PathBuf::from("builtin:experiments/fmapi-pacing.toml"),
            sets: Vec::new(),
            only: Vec::new(),
            seed: 1,
            seeds: 1,
            format: Format::Table,
            budget: Budget::default(),
            extras: false,
        }
    }
}

/// What `qsim run` produced.
#[derive(Debug)]
pub struct RunOutput {
    /// The loaded file (after `only`).
    pub file: ExperimentFile,
    /// The tidy records over the seeds (always but for a shared file's
    /// CSV, whose report is the records).
    pub records: Option<Records>,
    /// The plots' extras (hosted and server files, when asked).
    pub extras: Option<Extras>,
    /// A shared file: the planned file (its plots need it).
    pub plan: Option<SharedFile>,
    /// The report in the spec's format.
    pub text: String,
}

/// Run an experiment file: the budget checked up front and while running,
/// then the report.
pub fn run(spec: &RunSpec) -> Result<RunOutput, PlanError> {
    let named = |e: ConfigError| crate::config::name_fields(e, Some(&spec.file), &spec.sets);
    let mut ef = load_file(&spec.file, &spec.sets)?;
    ef.retain_only(&spec.only)?;
    let fname = spec.file.display().to_string();
    ef.cost(spec.seeds)
        .and_then(|c| c.check(&fname, &spec.budget))
        .map_err(named)?;
    let (seed, seeds) = (spec.seed, spec.seeds);
    let shared = matches!(ef, ExperimentFile::Shared(_));
    let mut extras = None;
    let mut records = match &ef {
        ExperimentFile::Shared(_) => None,
        _ if spec.extras => {
            let (r, x) = records_with_extras(&ef, seed, seeds)?;
            extras = Some(x);
            Some(r)
        }
        _ => None,
    };
    if records.is_none() && (spec.format == Format::Csv || !shared) {
        records = Some(ef.records(seed, seeds)?);
    }
    crate::work::check(&fname)?;
    let spreads = |r: &Option<Records>| r.as_ref().map(|r| r.spreads()).unwrap_or_default();
    let mut plan = None;
    let text = match (&ef, spec.format) {
        (_, Format::Csv) => {
            if let ExperimentFile::Shared(args) = &ef {
                plan = Some(crate::plan::build(args)?.0);
            }
            report::records::to_csv(&[PointRecords {
                params: vec![],
                records: records.clone().unwrap_or_default(),
            }])
        }
        // a shared file is a plan: its full report (per-minute tables,
        // findings) plus the spreads over seeds
        (ExperimentFile::Shared(args), _) => {
            let args = crate::plan::PlanSpec {
                seed,
                seeds,
                ..args.clone()
            };
            let r =
                crate::plan::run::run_cli_full(&args, spec.format == Format::Json, &spec.budget)
                    .map_err(|e| match e {
                        PlanError::Config(c) => PlanError::Config(named(c)),
                        other => other,
                    })?;
            records = Some(r.records);
            plan = Some(r.file);
            r.text
        }
        (ExperimentFile::Hosted(suite), _) => {
            let s = spreads(&records);
            let aggs = report::hosted::aggregate(suite, &s);
            match spec.format {
                Format::Json => {
                    report::json_text(&report::hosted::render_json(suite, &fname, seed, &aggs))
                }
                _ => report::hosted::render_table(suite, &fname, seed, &aggs),
            }
        }
        (ExperimentFile::Server(suite), _) => {
            let s = spreads(&records);
            let aggs = report::server::aggregate(suite, &s);
            match spec.format {
                Format::Json => {
                    report::json_text(&report::server::render_json(suite, &fname, seed, &aggs))
                }
                _ => report::server::render_table(suite, &fname, seed, &aggs),
            }
        }
    };
    Ok(RunOutput {
        file: ef,
        records,
        extras,
        plan,
        text,
    })
}

/// What `qsim sweep` is asked.
#[derive(Debug, Clone, PartialEq)]
pub struct SweepSpec {
    pub file: PathBuf,
    /// `--vary` dimensions (`workers=8..64:x2`, `policy=a,b`).
    pub vary: Vec<String>,
    /// Fixed `--set` overrides, applied before the grid's.
    pub sets: Vec<String>,
    pub only: Vec<String>,
    pub seed: u64,
    pub seeds: u64,
    /// Threads (None: all cores); the output is the same whatever the number.
    pub threads: Option<usize>,
    /// `I/N`: only the grid points whose index is I modulo N.
    pub shard: Option<String>,
    pub format: Format,
    pub budget: Budget,
    /// Keep the tidy records of every point (CSV, results tables).
    pub tidy: bool,
    /// Keep each point's table rows even for CSV (plots).
    pub rows: bool,
}

impl Default for SweepSpec {
    fn default() -> Self {
        SweepSpec {
            file: PathBuf::from("builtin:experiments/fmapi-pacing.toml"),
            vary: Vec::new(),
            sets: Vec::new(),
            only: Vec::new(),
            seed: 1,
            seeds: 1,
            threads: None,
            shard: None,
            format: Format::Table,
            budget: Budget::default(),
            tidy: false,
            rows: false,
        }
    }
}

/// A point's rows of the sweep table.
pub type PointRows = report::sweep::Point;

/// What `qsim sweep` produced.
#[derive(Debug)]
pub struct SweepOutput {
    pub dims: Vec<Axis>,
    /// Every grid point's parameters, in grid order.
    pub combos: Vec<Vec<(String, String)>>,
    /// The shard, if one.
    pub shard: Option<Shard>,
    /// The first point's file (plots name their subjects from it).
    pub first: Option<ExperimentFile>,
    /// The table rows of each point run (with their parameters).
    pub points: Vec<PointRows>,
    /// The sweep table's columns.
    pub cols: &'static [&'static str],
    /// (grid point, its tidy records), when asked.
    pub tidy: Vec<(usize, PointRecords)>,
    /// The report in the spec's format.
    pub text: String,
}

/// Run a file over a grid of overrides.
pub fn sweep(spec: &SweepSpec) -> Result<SweepOutput, ConfigError> {
    let dims = crate::sweep::parse_vary(&spec.vary)?;
    let shard = spec.shard.as_deref().map(Shard::parse).transpose()?;
    if shard.is_some() && !spec.tidy {
        return Err(ConfigError::new(
            "--shard",
            "",
            "a shard writes records to merge: add --out DIR or --format csv (qsim merge joins the shards)",
        ));
    }
    let fname = spec.file.display().to_string();
    // every point is loaded (the whole grid validated, whatever the shard)
    // and the shard's cost added up before any runs
    let combos = crate::sweep::grid(&dims);
    let mine: Vec<usize> = (0..combos.len())
        .filter(|&p| shard.is_none_or(|s| s.owns(p)))
        .collect();
    let mut efs = Vec::with_capacity(combos.len());
    let mut cost = Cost::default();
    for (p, combo) in combos.iter().enumerate() {
        let mut all = spec.sets.clone();
        all.extend(combo.iter().map(|(k, v)| format!("{k}={v}")));
        let point_err = |mut e: ConfigError| {
            if let Some((k, v)) = combo
                .iter()
                .find(|(k, v)| e.source == format!("--set {k}={v}"))
            {
                e.source = format!("--vary {k}={v}");
            } else if !spec.sets.iter().any(|s| e.source == format!("--set {s}")) {
                let at: Vec<String> = combo.iter().map(|(k, v)| format!("{k}={v}")).collect();
                e.reason = format!("{} (at the sweep point --vary {})", e.reason, at.join(" "));
            }
            e
        };
        let mut ef = load_file(&spec.file, &all).map_err(point_err)?;
        ef.retain_only(&spec.only).map_err(point_err)?;
        if mine.binary_search(&p).is_ok() {
            cost.then(
                ef.cost(spec.seeds)
                    .map_err(|e| crate::config::name_fields(e, Some(&spec.file), &all))?,
            );
        }
        efs.push(ef);
    }
    cost.check(&fname, &spec.budget)?;
    let results = crate::sweep::run_points(&efs, &mine, spec.seed, spec.seeds, spec.threads)?;
    crate::work::check(&fname)?;
    let mut points = Vec::new();
    let mut tidy = Vec::new();
    let mut cols: &'static [&'static str] = report::hosted::SWEEP_COLS;
    for (p, records) in mine.iter().copied().zip(results) {
        let combo = combos[p].clone();
        // rows for the table and JSON, and for plots
        let s = (spec.format != Format::Csv || spec.rows).then(|| records.spreads());
        if spec.tidy {
            tidy.push((
                p,
                PointRecords {
                    params: combo.clone(),
                    records,
                },
            ));
        }
        let Some(s) = s else { continue };
        let rows = match &efs[p] {
            ExperimentFile::Hosted(suite) => {
                report::hosted::sweep_rows(&report::hosted::aggregate(suite, &s))
            }
            ExperimentFile::Server(suite) => {
                cols = report::server::SWEEP_COLS;
                report::server::sweep_rows(&report::server::aggregate(suite, &s))
            }
            ExperimentFile::Shared(args) => {
                cols = crate::plan::seeds::SWEEP_COLS;
                let (f, _) = crate::plan::build(args)?;
                crate::plan::seeds::sweep_rows(&f, &s)
            }
        };
        points.push((combo, rows));
    }
    let text = match (spec.format, shard) {
        (Format::Csv, Some(_)) => {
            let axes: Vec<String> = dims.iter().map(|(k, _)| k.clone()).collect();
            crate::sweep::shard_csv(&axes, combos.len(), &tidy)
        }
        (Format::Csv, None) => report::records::to_csv_refs(tidy.iter().map(|(_, p)| p)),
        (Format::Table, _) => {
            report::sweep::render_table(&fname, spec.seed, spec.seeds, &points, cols)
        }
        (Format::Json, _) => report::json_text(&report::sweep::render_json(
            &fname, spec.seed, spec.seeds, &points,
        )),
    };
    Ok(SweepOutput {
        dims,
        combos,
        shard,
        first: efs.into_iter().next(),
        points,
        cols,
        tidy,
        text,
    })
}
