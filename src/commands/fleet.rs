//! `qsim fleet`: flags → [`qsim_sim::fleet::command::Spec`], one call,
//! and the outcome rendered (text or JSON), its tables (`--out DIR`:
//! Parquet and CSV) and figures (`--plot DIR`, `--html FILE`).

use crate::cli::common::{emit, CliError, Format};
use qsim_sim::config::ConfigError;
use qsim_sim::fleet::command::{self, Outcome, Spec};
use qsim_sim::fleet::optimize::Slo;
use qsim_sim::fleet::report::{self, Col, Tbl};
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct FleetArgs {
    /// A fleet file (kind = "fleet"): run it; with a target, its workload
    /// and its pools' profiles are the search's.
    pub file: Option<PathBuf>,
    /// A token-length CDF (vllm-sr-sim's JSON: [[tokens, cumulative
    /// fraction], ...]) drawn at --rate.
    #[arg(long, value_name = "FILE")]
    pub cdf: Option<PathBuf>,
    /// Requests per second (Poisson) for --cdf.
    #[arg(long, value_name = "REQ_PER_S")]
    pub rate: Option<f64>,
    /// The input's share of a CDF total (default 0.8).
    #[arg(long, value_name = "FRACTION")]
    pub input_share: Option<f64>,
    /// A request trace (any format `qsim trace` reads) as the workload.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// A Mooncake trace with block hashes (JSON Lines, 512-token blocks).
    #[arg(long, value_name = "FILE")]
    pub mooncake: Option<PathBuf>,
    /// Search for the cheapest fleet with a P99 TTFT at or under this.
    #[arg(long = "ttft-p99", value_name = "DURATION", value_parser = crate::cli::common::duration_arg)]
    pub ttft_p99: Option<qsim_sim::time::Nanos>,
    /// ... with a P99 inter-token latency at or under this.
    #[arg(long = "itl-p99", value_name = "DURATION", value_parser = crate::cli::common::duration_arg)]
    pub itl_p99: Option<qsim_sim::time::Nanos>,
    /// ... with a P99 end-to-end latency at or under this.
    #[arg(long = "e2e-p99", value_name = "DURATION", value_parser = crate::cli::common::duration_arg)]
    pub e2e_p99: Option<qsim_sim::time::Nanos>,
    /// A candidate GPU (repeatable): NAME or NAME:TP (A100-80GB-SXM,
    /// H100-80GB-SXM, L40S), a profile derived for --model. Default:
    /// A100-80GB-SXM and H100-80GB-SXM.
    #[arg(long = "gpu", value_name = "NAME[:TP]")]
    pub gpus: Vec<String>,
    /// The model of the --gpu candidates (default llama-3.1-70b).
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// Tensor parallelism of the --gpu candidates (default 8).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=8))]
    pub tp: Option<u32>,
    /// A candidate server profile file with a [price] (repeatable).
    #[arg(long = "profile", value_name = "FILE")]
    pub profiles: Vec<PathBuf>,
    /// Also try two pools split at this many tokens (input + output;
    /// repeatable), routed by length.
    #[arg(long = "threshold", value_name = "TOKENS")]
    pub thresholds: Vec<u64>,
    /// The search again at each of these rates (requests per second).
    #[arg(long, value_name = "R1,R2,...", value_delimiter = ',')]
    pub whatif: Vec<f64>,
    /// Run the cheapest fleet under each router (between pools and between
    /// replicas).
    #[arg(long)]
    pub compare_routers: bool,
    /// The replicas' router in every pool of the search (default
    /// least_outstanding).
    #[arg(long, value_name = "POLICY")]
    pub router: Option<String>,
    /// Requests per pool in each of the search's runs.
    #[arg(long, default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub requests: u64,
    /// Seed of every run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// FILE (a name with an extension): the report, instead of stdout. DIR
    /// (no extension, or ending in /): the result tables (Parquet and
    /// CSV); the report still goes to stdout.
    #[arg(long, value_name = "FILE|DIR")]
    pub out: Option<PathBuf>,
    /// Replace the --out file or directory of qsim's files if it exists.
    #[arg(long)]
    pub force: bool,
    /// Refuse (stop) once the runs have simulated more than N requests
    /// plus engine iterations. A search is tens of runs, so its default is
    /// 20 × `qsim run`'s (~10 CPU-s of the search's runs).
    #[arg(long, value_name = "N", default_value_t = command::MAX_REQUESTS)]
    pub max_requests: u64,
    /// `--plot DIR` (PNG and SVG) and `--html FILE`.
    #[command(flatten)]
    pub plots: crate::plot::PlotOpts,
}

impl FleetArgs {
    pub fn spec(&self) -> Spec {
        Spec {
            file: self.file.clone(),
            cdf: self.cdf.clone(),
            trace: self.trace.clone(),
            mooncake: self.mooncake.clone(),
            rate: self.rate,
            input_share: self.input_share,
            slo: Slo {
                ttft_p99: self.ttft_p99,
                itl_p99: self.itl_p99,
                e2e_p99: self.e2e_p99,
            },
            gpus: self.gpus.clone(),
            model: self.model.clone(),
            tp: self.tp,
            profiles: self.profiles.clone(),
            thresholds: self.thresholds.clone(),
            whatif: self.whatif.clone(),
            compare_routers: self.compare_routers,
            requests: self.requests,
            seed: self.seed,
            router: self.router.clone(),
        }
    }

    /// What the work budget names when it stops the command.
    pub fn source(&self) -> String {
        self.file
            .as_ref()
            .or(self.cdf.as_ref())
            .or(self.trace.as_ref())
            .or(self.mooncake.as_ref())
            .map_or("qsim fleet".into(), |p| p.display().to_string())
    }
}

/// Every file `--out DIR` may hold.
const FILES: &[&str] = &[
    "pools.parquet",
    "pools.csv",
    "runs.parquet",
    "runs.csv",
    "layouts.parquet",
    "layouts.csv",
    "whatif.parquet",
    "whatif.csv",
    "routers.parquet",
    "routers.csv",
    "manifest.json",
];

pub fn run_cli(a: &FleetArgs) -> Result<(), CliError> {
    if a.format == Format::Csv {
        return Err(ConfigError::new(
            "--format csv",
            "",
            "qsim fleet writes a table or JSON (--out DIR for CSV and Parquet tables)",
        )
        .into());
    }
    let dir = a.out.as_deref().filter(|p| crate::output::is_dir_target(p));
    let file = a
        .out
        .as_deref()
        .filter(|p| !crate::output::is_dir_target(p));
    if let Some(d) = dir {
        crate::output::check_dir("--out", d, FILES, a.force)?;
    }
    if let Some(f) = file {
        crate::output::check_target(f, a.force)?;
    }
    let targets = a.plots.targets(a.force);
    targets.check()?;
    let outcome = command::run(&a.spec())
        .map_err(|e| crate::cli::common::name_fields(e, a.file.as_deref(), &[]))?;
    let text = match a.format {
        Format::Json => qsim_sim::report::json_text(&report::json(&outcome)),
        _ => report::text(&outcome),
    };
    if let Some(d) = dir {
        let mut files = Vec::new();
        for t in report::tables(&outcome) {
            let enc = qsim_results::encode_table(&columns(&t))
                .map_err(|e| CliError::Io(format!("results tables: {e}")))?;
            files.push((format!("{}.parquet", t.name), enc.parquet));
            files.push((format!("{}.csv", t.name), enc.csv));
        }
        let m = crate::results::manifest(&[], a.seed, 1, None).to_json(&files);
        files.push((qsim_results::MANIFEST.to_string(), m.into_bytes()));
        crate::output::write_dir("--out", d, &files, a.force)?;
    }
    if targets.wanted() {
        let intro = format!("qsim fleet {}: seed {}", a.source(), a.seed);
        crate::plot::write(
            &targets,
            "qsim fleet",
            &intro,
            Vec::new(),
            &figures(&outcome),
            Some(&report::text(&outcome)),
        )?;
    }
    emit(&text, file, a.force)?;
    if let Outcome::Search(s) = &outcome {
        if s.answer.best.is_none() {
            return Err(CliError::Unmet(format!(
                "{}: no fleet of these candidates meets the targets (see the report)",
                a.source()
            )));
        }
    }
    Ok(())
}

fn columns(t: &Tbl) -> Vec<qsim_results::NamedColumn> {
    t.cols
        .iter()
        .map(|(name, c)| qsim_results::NamedColumn {
            name: name.to_string(),
            values: match c {
                Col::Str(v) => {
                    qsim_results::Values::Str(v.iter().map(|x| Some(x.clone())).collect())
                }
                Col::F64(v) => qsim_results::Values::F64(
                    v.iter().map(|x| x.is_finite().then_some(*x)).collect(),
                ),
                Col::U64(v) => qsim_results::Values::U64(v.iter().map(|x| Some(*x)).collect()),
            },
        })
        .collect()
}

/// The search: each pool's P99 against replicas per candidate, the target
/// dashed; what-if: cost per hour against the rate. A file's run: each
/// pool's TTFT CDF.
fn figures(o: &Outcome) -> Vec<crate::plot::Fig> {
    use qsim_plot::{metric_lines, HLine, LineChart, Series};
    let mut figs = Vec::new();
    match o {
        Outcome::Search(s) => {
            for (k, (title, ylabel, series, target)) in
                report::search_curves(s).into_iter().enumerate()
            {
                figs.push(crate::plot::Fig {
                    name: format!("fleet-search-{k}"),
                    caption: format!("{title}: the search's runs, P99 against replicas per candidate; the target dashed"),
                    figure: metric_lines(LineChart {
                        title: format!("qsim fleet: {title}"),
                        x_label: "replicas".into(),
                        y_label: ylabel,
                        x_axis: qsim_plot::XAxis::Log,
                        series: series
                            .into_iter()
                            .map(|(name, points)| Series { name, points, band: vec![] })
                            .collect(),
                        hlines: vec![HLine { label: "target".into(), y: target, series: None }],
                        markers: true,
                        y_range: None,
                        legend: Default::default(),
                    }),
                });
            }
            if !s.whatif.is_empty() {
                let points: Vec<(f64, f64)> = s
                    .whatif
                    .iter()
                    .filter_map(|(r, a)| a.best().and_then(|l| l.cost_per_hour).map(|c| (*r, c)))
                    .collect();
                figs.push(crate::plot::Fig {
                    name: "fleet-whatif".into(),
                    caption: "The cheapest fleet's cost per hour at each arrival rate".into(),
                    figure: metric_lines(LineChart {
                        title: "qsim fleet: cost against arrival rate".into(),
                        x_label: "requests per second".into(),
                        y_label: "$ per hour".into(),
                        x_axis: Default::default(),
                        series: vec![Series {
                            name: "cheapest fleet".into(),
                            points,
                            band: vec![],
                        }],
                        hlines: vec![],
                        markers: true,
                        y_range: None,
                        legend: Default::default(),
                    }),
                });
            }
        }
        Outcome::Run(r) => {
            let series = r
                .result
                .pools
                .iter()
                .map(|p| Series {
                    name: p.name.clone(),
                    points: crate::plot::cdf(&p.lat.ttft),
                    band: vec![],
                })
                .filter(|s| !s.points.is_empty())
                .collect();
            figs.push(crate::plot::Fig {
                name: "fleet-ttft".into(),
                caption: "TTFT per pool (CDF)".into(),
                figure: metric_lines(LineChart {
                    title: format!("qsim fleet: {}", r.title),
                    x_label: "TTFT (s)".into(),
                    y_label: "fraction of requests".into(),
                    x_axis: qsim_plot::XAxis::Log,
                    series,
                    hlines: vec![],
                    markers: false,
                    y_range: Some((0.0, 1.0)),
                    legend: qsim_plot::Legend::UpperLeft,
                }),
            });
        }
    }
    figs
}
