//! `--plot DIR` and `--html FILE`: where the figures of
//! [`qsim_api::figures`] (what each command draws) and the HTML page go,
//! written safely (never clobbering, nothing partial left on failure).

use crate::cli::common::CliError;
use crate::output;
use qsim_plot::html::{Block, Document};
use qsim_sim::config::ConfigError;
use qsim_sim::experiment::ExperimentFile;
use qsim_sim::plan::config::SharedFile;
use qsim_sim::report;
use qsim_sim::report::records::Records;
use qsim_sim::report::sweep::{Point, Row};
use std::path::{Path, PathBuf};

pub use qsim_api::figures::*;
pub use qsim_sim::experiment::extras::{sample_every, Extras, SAMPLES};

/// Where plots and the HTML page go (`--plot DIR`, `--html FILE`).
#[derive(Debug, Clone, Default)]
pub struct Targets {
    pub plot: Option<PathBuf>,
    pub html: Option<PathBuf>,
    pub force: bool,
}

impl Targets {
    pub fn wanted(&self) -> bool {
        self.plot.is_some() || self.html.is_some()
    }

    /// Refuse bad targets before any run: `--plot DIR` must be a directory
    /// that is empty or does not exist yet (its parent must), unless
    /// `--force`; `--html FILE` follows the rules of `--out`.
    pub fn check(&self) -> Result<(), CliError> {
        if let Some(d) = &self.plot {
            let flag = format!("--plot {}", d.display());
            let bad = |r: &str| CliError::Config(ConfigError::new(&flag, "", r.to_string()));
            match std::fs::metadata(d) {
                Ok(m) if !m.is_dir() => return Err(bad("exists and is not a directory")),
                Ok(_) => {
                    let empty = std::fs::read_dir(d)
                        .map_err(|e| bad(&e.to_string()))?
                        .next()
                        .is_none();
                    if !empty && !self.force {
                        return Err(bad(
                            "exists and is not empty; add --force to write the plots into it",
                        ));
                    }
                }
                Err(_) => {
                    let parent = d
                        .parent()
                        .filter(|p| !p.as_os_str().is_empty())
                        .unwrap_or(Path::new("."));
                    if !parent.is_dir() {
                        return Err(bad("its parent directory does not exist"));
                    }
                }
            }
        }
        if let Some(h) = &self.html {
            output::check_target_as("--html", h, self.force).map_err(|e| match e {
                output::OutputError::BadTarget { reason, .. } => CliError::Config(
                    ConfigError::new(format!("--html {}", h.display()), "", reason),
                ),
                other => CliError::Output(other),
            })?;
        }
        Ok(())
    }
}

/// Write the figures (PNG and SVG) into `--plot DIR` and the page into
/// `--html FILE`. `intro` and `tables` come first in the page, then the
/// figures, then the text report if given.
pub fn write(
    t: &Targets,
    title: &str,
    intro: &str,
    tables: Vec<Block>,
    figs: &[Fig],
    text: Option<&str>,
) -> Result<(), CliError> {
    let io = |what: &Path, e: String| CliError::Io(format!("{}: {e}", what.display()));
    if let Some(dir) = &t.plot {
        let flag = |e: String| CliError::Io(format!("--plot {}: {e}", dir.display()));
        let created = !dir.exists();
        std::fs::create_dir_all(dir).map_err(|e| flag(e.to_string()))?;
        // every file this run wrote, removed again if a later one fails
        // (a full disk): nothing partial is left behind
        let mut written: Vec<PathBuf> = Vec::new();
        let mut failed = None;
        'figs: for f in figs {
            for ext in ["png", "svg"] {
                let p = dir.join(format!("{}.{ext}", f.name));
                // drawn next to the target, then renamed: never a half file
                let tmp = dir.join(format!(".{}.tmp.{ext}", f.name));
                let r = f
                    .figure
                    .save(&tmp)
                    .map_err(|e| e.0)
                    .and_then(|_| std::fs::rename(&tmp, &p).map_err(|e| e.to_string()));
                match r {
                    Ok(()) => written.push(p),
                    Err(e) => {
                        let _ = std::fs::remove_file(&tmp);
                        failed = Some(format!("{}.{ext}: {e}", f.name));
                        break 'figs;
                    }
                }
            }
        }
        if let Some(e) = failed {
            for p in &written {
                let _ = std::fs::remove_file(p);
            }
            if created {
                let _ = std::fs::remove_dir(dir);
            }
            return Err(flag(e));
        }
    }
    if let Some(h) = &t.html {
        let mut doc = Document::new(title);
        doc.push(Block::Paragraph(intro.to_string()));
        for b in tables {
            doc.push(b);
        }
        for f in figs {
            let svg = f.figure.svg().map_err(|e| io(h, e.0))?;
            doc.push(Block::Figure {
                svg,
                caption: f.caption.clone(),
            });
        }
        if let Some(text) = text {
            doc.push(Block::Heading("Report".into()));
            doc.push(Block::Pre(text.to_string()));
        }
        output::write_file_as("--html", h, &doc.render(), t.force)?;
    }
    Ok(())
}

/// `--plot`/`--html` of a plan (`qsim plan`, `qsim run` on a shared file):
/// the per-minute figure and the per-consumer table, from the records.
pub fn plan_outputs(
    t: &Targets,
    f: &SharedFile,
    records: &Records,
    seed: u64,
    seeds: u64,
    text: Option<&str>,
) -> Result<(), CliError> {
    let s = records.spreads();
    let figs = plan_figures(f, &s, seed, seeds);
    let rows = qsim_sim::plan::seeds::sweep_rows(f, &s);
    let cols: Vec<&str> = qsim_sim::plan::seeds::CONSUMER_METRICS
        .iter()
        .map(|m| m.0)
        .collect();
    let title = if f.title.is_empty() {
        format!("qsim plan: {}", f.source)
    } else {
        format!("qsim plan: {}", f.title)
    };
    let intro = format!(
        "{}; capacity {} {}, semantics {}; {}. Per scenario and consumer: median [90 % interval] over seeds.",
        f.source,
        f.limiter.capacity,
        f.limiter.unit.name(),
        f.limiter.semantics.name(),
        seeds_note(seed, seeds)
    );
    write(
        t,
        &title,
        &intro,
        vec![rows_table(&rows, &cols, s.runs)],
        &figs,
        text,
    )
}

/// `--plot`/`--html` of `qsim run` on a hosted or server file.
#[allow(clippy::too_many_arguments)]
pub fn run_outputs(
    t: &Targets,
    ef: &ExperimentFile,
    file: &str,
    records: &Records,
    x: &Extras,
    seed: u64,
    seeds: u64,
    text: Option<&str>,
) -> Result<(), CliError> {
    let s = records.spreads();
    let (title, rows, cols): (String, Vec<Row>, Vec<&str>) = match ef {
        ExperimentFile::Hosted(suite) => (
            suite.title.clone(),
            report::hosted::sweep_rows(&report::hosted::aggregate(suite, &s)),
            report::hosted::METRICS.iter().map(|m| m.0).collect(),
        ),
        ExperimentFile::Server(suite) => (
            suite.title.clone(),
            report::server::sweep_rows(&report::server::aggregate(suite, &s)),
            report::server::SWEEP_COLS.to_vec(),
        ),
        ExperimentFile::Shared(_) => return Ok(()),
    };
    let title = if title.is_empty() {
        format!("qsim run {file}")
    } else {
        title
    };
    let intro = format!(
        "qsim run {file}, {}: median [90 % interval] over seeds.",
        seeds_note(seed, seeds)
    );
    let figs = run_figures(ef, x, seed, seeds);
    write(
        t,
        &title,
        &intro,
        vec![metrics_table(&rows, &cols, s.runs)],
        &figs,
        text,
    )
}

/// `--plot`/`--html` of `qsim sweep`: the grid's figures and its table.
#[allow(clippy::too_many_arguments)]
pub fn sweep_outputs(
    t: &Targets,
    ef: &ExperimentFile,
    file: &str,
    dims: &[qsim_sim::sweep::Axis],
    points: &[Point],
    cols: &[&str],
    seed: u64,
    seeds: u64,
    text: Option<&str>,
) -> Result<(), CliError> {
    let (lines, heat) = sweep_metrics(ef);
    let figs = sweep_figures(dims, points, lines, heat, seed, seeds);
    let axes: Vec<String> = dims
        .iter()
        .map(|(k, v)| format!("{k} = {}", v.join(", ")))
        .collect();
    let intro = format!(
        "qsim sweep {file} over {}; {}: medians.",
        axes.join("; "),
        seeds_note(seed, seeds)
    );
    write(
        t,
        &format!("qsim sweep {file}"),
        &intro,
        vec![sweep_table(points, cols)],
        &figs,
        text,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use qsim_sim::report::records::{to_csv, PointRecords};

    fn csv(r: Records) -> String {
        to_csv(&[PointRecords {
            params: vec![],
            records: r,
        }])
    }

    /// Plots ask the drivers for more; the records stay the same.
    #[test]
    fn records_with_extras_equal_plain_records() {
        for (file, sets) in [
            ("experiments/fmapi-pacing.toml", vec![]),
            (
                "experiments/nim-load.toml",
                vec!["duration_s=120".to_string(), "drain=true".to_string()],
            ),
            (
                "experiments/llama-8b-clients.toml",
                vec!["duration_s=60".to_string()],
            ),
        ] {
            let p = Path::new(env!("CARGO_MANIFEST_DIR")).join(file);
            let ef = qsim_sim::experiment::load(&p, &sets).unwrap();
            let plain = ef.records(3, 2).unwrap();
            let (with, x) = qsim_sim::experiment::extras::records_with_extras(&ef, 3, 2).unwrap();
            assert_eq!(csv(plain), csv(with), "{file}");
            assert!(!x.latency.is_empty(), "{file}");
            if let ExperimentFile::Server(s) = &ef {
                assert_eq!(x.series.len(), s.scenarios.len());
                for (_, se) in &x.series {
                    assert!(!se.t.is_empty() && se.t.len() as u64 <= SAMPLES);
                }
            }
        }
    }
}

/// `--plot DIR` and `--html FILE` (run, sweep, plan): see [`crate::plot`]
/// for what each command draws.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PlotOpts {
    /// Also draw the plots (PNG and SVG) into this directory (created if
    /// missing; if it is not empty, only with --force).
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Also write one self-contained HTML report (tables and SVG plots) to
    /// this file.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

impl PlotOpts {
    pub fn targets(&self, force: bool) -> Targets {
        Targets {
            plot: self.plot.clone(),
            html: self.html.clone(),
            force,
        }
    }
}
