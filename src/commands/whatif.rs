//! `qsim whatif`: its flags, mapped to [`qsim_api::whatif::Spec`]; the
//! report rendered, the tables written, the plot drawn.

use crate::cli::common::CliError;
use qsim_api::whatif::{Format, Outcome};
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, clap::Args)]
pub struct WhatifArgs {
    /// The proxy's decision-log directory (`[proxy.log] dir`).
    #[arg(long)]
    pub log: PathBuf,
    /// The proposed policy: a proxy config (kind = "proxy", e.g. from
    /// `qsim plan --emit-proxy-config`).
    #[arg(long)]
    pub policy: PathBuf,
    /// Only the requests in FROM..TO (seconds of the log's time from its
    /// first request, `90`, `90s`, `2m`; either side may be left out).
    #[arg(long)]
    pub window: Option<String>,
    /// table, json or csv.
    #[arg(long, default_value = "table")]
    pub format: String,
    /// Also write whatif.csv and whatif.parquet into this directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Draw per-consumer admitted per minute, observed vs what-if, into this directory.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Replace existing output files.
    #[arg(long)]
    pub force: bool,
}

impl WhatifArgs {
    pub fn spec(&self) -> qsim_api::whatif::Spec {
        qsim_api::whatif::Spec {
            log: self.log.clone(),
            policy: self.policy.clone(),
            window: self.window.clone(),
        }
    }
}

pub fn run_cli(args: &WhatifArgs) -> Result<(), CliError> {
    let format = Format::parse(&args.format)?;
    let w = qsim_api::whatif::run(&args.spec())?;
    let text = w.render(format);
    if let Some(d) = &args.out {
        w.write_tables(d, args.force)?;
    }
    if let Some(d) = &args.plot {
        plot(&w.outcome, d)?;
    }
    crate::cli::common::emit(&text, None, args.force)
}

/// Per consumer, admitted per minute: observed vs what-if (one PNG).
fn plot(o: &Outcome, dir: &Path) -> Result<(), CliError> {
    use qsim_plot::{metric_lines, LineChart, Series};
    std::fs::create_dir_all(dir).map_err(|e| CliError::Io(format!("{}: {e}", dir.display())))?;
    let mut series = Vec::new();
    for (c, name) in o.consumers.iter().enumerate() {
        for (which, label) in [(0, "observed"), (1, "what-if")] {
            let points: Vec<(f64, f64)> = o
                .table
                .iter()
                .filter(|(k, _)| k.0 == c)
                .map(|(k, v)| {
                    let x = if which == 0 {
                        v.0.admitted
                    } else {
                        v.1.admitted
                    };
                    (k.1 as f64, x as f64)
                })
                .collect();
            if !points.is_empty() {
                series.push(Series {
                    name: format!("{name} {label}"),
                    points,
                    band: vec![],
                });
            }
        }
    }
    let fig = metric_lines(LineChart {
        title: "admitted per minute: observed vs what-if".into(),
        x_label: "minute".into(),
        y_label: "admitted requests".into(),
        x_axis: Default::default(),
        series,
        hlines: vec![],
        markers: true,
        y_range: None,
        legend: Default::default(),
    });
    let p = dir.join("whatif_admitted.png");
    fig.save(&p)
        .map_err(|e| CliError::Io(format!("{}: {e}", p.display())))
}
