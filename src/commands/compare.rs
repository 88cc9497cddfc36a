//! `qsim compare`: the arguments of [`qsim_sim::compare`] (both sides
//! read and compared, the report) and the forest plot.

use crate::cli::common::{emit, CliError, Format};
use qsim_sim::compare::{num, run, Row, Spec};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct CompareArgs {
    /// The prediction: `qsim run --format csv` (or `--format json`) output.
    pub simulated: PathBuf,
    /// The observation: `qsim replay`'s summary.csv (or any records file);
    /// several records CSVs are pooled as runs of their own, and the
    /// observation is their median.
    #[arg(required = true, num_args = 1..)]
    pub observed: Vec<PathBuf>,
    /// Relative error within which an observation outside the interval
    /// still agrees (0.10: 10 % of the predicted median).
    #[arg(long, default_value_t = 0.10)]
    pub tolerance: f64,
    /// Compare only these metrics (comma-separated keys, e.g. ok,elapsed_s).
    #[arg(long, value_delimiter = ',')]
    pub metric: Vec<String>,
    /// Output format (table or json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the report to this file (atomically) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the --out file (and write into a non-empty --plot DIR).
    #[arg(long)]
    pub force: bool,
    #[command(flatten)]
    pub plots: crate::plot::PlotOpts,
}

pub fn run_cli(a: CompareArgs) -> Result<(), CliError> {
    if let Some(p) = &a.out {
        crate::output::check_target(p, a.force)?;
    }
    let targets = a.plots.targets(a.force);
    targets.check()?;
    let c = run(&Spec {
        simulated: a.simulated.clone(),
        observed: a.observed.clone(),
        tolerance: a.tolerance,
        metrics: a.metric.clone(),
    })?;
    let table = c.render_table();
    let text = match a.format {
        Format::Json => qsim_sim::report::json_text(&c.render_json()),
        _ => table.clone(),
    };
    if targets.wanted() {
        crate::plot::write(
            &targets,
            "qsim compare: prediction vs observation",
            &c.intro(),
            vec![],
            &[figure(&c.rows, a.tolerance)],
            Some(&table),
        )?;
    }
    emit(&text, a.out.as_deref(), a.force)
}

/// The forest plot: per metric, in % of the predicted median, the
/// simulated interval and the observation (a metric predicted as 0 is drawn
/// at 0 if observed as 0, and only named otherwise).
pub fn figure(rows: &[Row], tolerance: f64) -> crate::plot::Fig {
    let rel = |x: f64, m: f64| {
        if m != 0.0 {
            (x - m) / m.abs() * 100.0
        } else if x == 0.0 {
            0.0
        } else {
            f64::NAN
        }
    };
    let frows = rows
        .iter()
        .map(|r| {
            let p = &r.predicted;
            let mut label = format!("{} {}", r.subject, r.metric);
            if p.median == 0.0 && r.observed != 0.0 {
                label.push_str(&format!(" (observed {} vs 0)", num(r.observed)));
            }
            qsim_plot::ForestRow {
                label,
                lo: rel(p.lo, p.median),
                median: 0.0,
                hi: rel(p.hi, p.median),
                observed: rel(r.observed, p.median),
                agrees: r.agrees,
            }
        })
        .collect();
    let n = rows.iter().filter(|r| r.agrees).count();
    crate::plot::Fig {
        name: "compare".into(),
        caption: format!(
            "Prediction vs observation: {n} of {} metrics agree (inside the 90 % interval or within {} % of the median).",
            rows.len(),
            tolerance * 100.0
        ),
        figure: qsim_plot::forest(qsim_plot::Forest {
            title: format!("observation vs simulation: {n} of {} metrics agree", rows.len()),
            x_label: format!(
                "% of the simulated median · bar: 90 % interval · dot: observed (red: disagrees) · shaded: ±{} %",
                tolerance * 100.0
            ),
            rows: frows,
            tolerance: Some(tolerance * 100.0),
        }),
    }
}
