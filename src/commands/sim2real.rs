//! `qsim sim2real`: the BLIS sim-to-real accuracy benchmark
//! ([`qsim_sim::sim2real`]): every test experiment predicted once with the
//! shipped coefficients, the errors beside the published ones; `--out DIR`
//! writes `predictions.csv` and the report; `--fit` re-fits the
//! coefficients on the training experiments and prints the file.

use crate::cli::common::CliError;
use qsim_sim::config::ConfigError;
use qsim_sim::sim2real::{self, data};
use std::path::PathBuf;

#[derive(Debug, Clone, clap::Args)]
pub struct Sim2realArgs {
    /// Write report.txt and predictions.csv (exp_id, stage_index, metric,
    /// predicted_ms, actual_ms) into this new directory.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Replace the --out directory if qsim wrote it.
    #[arg(long)]
    pub force: bool,
    /// Also run the training experiments and report their errors.
    #[arg(long)]
    pub training: bool,
    /// Only the median tables (no line per experiment).
    #[arg(long)]
    pub brief: bool,
    /// Re-fit the global coefficients on the training experiments (at most
    /// this many evaluations of the loss) and print the coefficients file
    /// instead of the report.
    #[arg(long, value_name = "EVALS", value_parser = clap::value_parser!(u64).range(8..=100_000))]
    pub fit: Option<u64>,
    /// Use these coefficients (a file as `--fit` prints it) instead of the
    /// shipped ones.
    #[arg(long, value_name = "FILE")]
    pub coefficients: Option<PathBuf>,
    /// Only these experiments (comma-separated ids).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<u64>,
    /// Write each experiment's derived server profile into this new directory.
    #[arg(long, value_name = "DIR")]
    pub emit_profiles: Option<PathBuf>,
    /// Seed (the constant arrivals' phase).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads (default: all cores); the output is the same whatever the number.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    /// `--plot DIR` (predicted against measured, and the error against the
    /// model's size, PNG and SVG) and `--html FILE`.
    #[command(flatten)]
    pub plots: crate::plot::PlotOpts,
}

/// The figures: each test experiment's whole-run mean E2E, TTFT and ITL,
/// predicted against measured; and its signed error against the model's
/// size (parameters, all experts), labelled with its id and GPU. A point
/// within 10 % is in colour, one further off in grey.
fn figures(data: &data::Data, results: &[sim2real::ExpResult]) -> Vec<crate::plot::Fig> {
    use qsim_plot::scatter::{Mark, Scatter, ScatterPoint};
    let rows = sim2real::rows(data, results);
    let exp = |id: u64| {
        results
            .iter()
            .find(|r| r.exp.id == id && r.exp.set == "test")
    };
    let names = [
        ("e2e_mean", "E2E"),
        ("ttft_mean", "TTFT"),
        ("itl_mean", "ITL"),
    ];
    let points = |metric: &str,
                  xy: &dyn Fn(&sim2real::Row) -> (f64, f64),
                  label: &dyn Fn(&sim2real::Row) -> String| {
        rows.iter()
            .filter(|r| r.set == "test" && r.stage == -1 && r.metric == metric)
            .map(|r| {
                let (x, y) = xy(r);
                let mark = if sim2real::ape(r.predicted_ms, r.actual_ms) <= 10.0 {
                    Mark::Meets
                } else {
                    Mark::Misses
                };
                ScatterPoint {
                    label: label(r),
                    x,
                    y,
                    mark,
                }
            })
            .collect::<Vec<_>>()
    };
    let pva: Vec<Scatter> = names
        .iter()
        .map(|(m, n)| Scatter {
            title: format!("mean {n}: predicted vs measured"),
            x_label: format!("measured mean {n} (ms)"),
            y_label: format!("qsim's mean {n} (ms)"),
            points: points(m, &|r| (r.actual_ms, r.predicted_ms), &|r| {
                r.exp_id.to_string()
            }),
            vline: None,
        })
        .collect();
    let size = |r: &sim2real::Row| {
        exp(r.exp_id).map_or(f64::NAN, |e| {
            data.models[&e.exp.model].params_computed / 1e9
        })
    };
    let by: Vec<Scatter> = names
        .iter()
        .map(|(m, n)| Scatter {
            title: format!("mean {n}: error by model and GPU"),
            x_label: "model parameters (billions, all experts)".into(),
            y_label: format!("mean {n} error (%)"),
            points: points(
                m,
                &|r| {
                    (
                        size(r),
                        100.0 * (r.predicted_ms - r.actual_ms) / r.actual_ms,
                    )
                },
                &|r| {
                    exp(r.exp_id).map_or(String::new(), |e| {
                        format!("{} {}", r.exp_id, sim2real::gpu_family(&e.exp.gpu))
                    })
                },
            ),
            vline: None,
        })
        .collect();
    vec![
        crate::plot::Fig {
            name: "sim2real-predicted-vs-measured".into(),
            caption: "qsim sim2real: each test experiment's whole-run means, qsim's prediction against the measurement (in colour: within 10 %)".into(),
            figure: qsim_plot::scatter_figure(pva),
        },
        crate::plot::Fig {
            name: "sim2real-error-by-model-gpu".into(),
            caption: "qsim sim2real: each test experiment's signed error against its model's size, labelled with its id and GPU (in colour: within 10 %)".into(),
            figure: qsim_plot::scatter_figure(by),
        },
    ]
}

pub fn run_cli(a: &Sim2realArgs) -> Result<(), CliError> {
    let plots = a.plots.targets(a.force);
    plots.check()?;
    let data = data::Data::embedded()?;
    for id in &a.only {
        if !data.experiments.iter().any(|e| e.id == *id) {
            return Err(ConfigError::new("--only", "", format!("no experiment {id}")).into());
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.map_or(0, usize::from))
        .build()
        .map_err(|e| ConfigError::new("--threads", "", e.to_string()))?;
    if let Some(evals) = a.fit {
        let fit = pool.install(|| sim2real::fit::fit(&data, a.seed, evals as usize))?;
        let train = data.experiments.iter().filter(|e| e.set != "test").count();
        return Ok(crate::output::write_stdout(
            &sim2real::fit::coefficients_toml(&fit, train),
        )?);
    }
    let c = match &a.coefficients {
        Some(f) => data::read_coefficients(f)?,
        None => data::shipped_coefficients()?,
    };
    let exps: Vec<data::Experiment> = data
        .experiments
        .iter()
        .filter(|e| {
            (e.set == "test" || a.training) && (a.only.is_empty() || a.only.contains(&e.id))
        })
        .cloned()
        .collect();
    if let Some(dir) = &a.emit_profiles {
        let files: Vec<(String, Vec<u8>)> = exps
            .iter()
            .map(|e| {
                let t = sim2real::derive::profile_toml(
                    e,
                    &data.models[&e.model],
                    &data.gpus[&e.gpu],
                    &c,
                );
                (format!("{}-{}.toml", e.set, e.id), t.into_bytes())
            })
            .collect();
        crate::output::write_dir("--emit-profiles", dir, &files, a.force)?;
    }
    if let Some(dir) = &a.out {
        crate::output::check_dir("--out", dir, &["report.txt", "predictions.csv"], a.force)?;
    }
    let results = pool.install(|| sim2real::run_all(&data, &exps, &c, a.seed))?;
    qsim_sim::work::check("qsim sim2real")?;
    let text = sim2real::report(&data, &results, &c, a.brief);
    if plots.wanted() {
        crate::plot::write(
            &plots,
            "qsim sim2real",
            "qsim sim2real: the BLIS sim-to-real study's test experiments, predicted",
            Vec::new(),
            &figures(&data, &results),
            Some(&text),
        )?;
    }
    if let Some(dir) = &a.out {
        let files = vec![
            ("report.txt".to_string(), text.clone().into_bytes()),
            (
                "predictions.csv".to_string(),
                sim2real::predictions_csv(&data, &results).into_bytes(),
            ),
        ];
        crate::output::write_dir("--out", dir, &files, a.force)?;
    }
    Ok(crate::output::write_stdout(&text)?)
}
