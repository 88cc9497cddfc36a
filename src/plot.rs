//! `--plot DIR` and `--html FILE`: the glue between qsim's results (tidy
//! records and their spreads, sweep rows, the plan's file) and the
//! `qsim-plot` crate's plain-data figures and HTML pages.
//!
//! What each command draws (every figure as `NAME.png` and `NAME.svg`):
//!
//! - `qsim run` on a hosted-API file: `latency-cdf` — each experiment's
//!   (policy's) row latency CDF, all seeds pooled;
//! - `qsim run` on a server file: `server-over-time` — per scenario, the
//!   waiting queue and the E2E p50 of the requests finished in each of 240
//!   equal intervals of the first seed; `e2e-cdf` — per scenario, the E2E
//!   CDF over all seeds;
//! - `qsim plan`, and `qsim run` on a shared file: `plan-admitted` — per
//!   scenario, each consumer's admitted units per minute (median over seeds,
//!   90 % band), its floor dashed in its colour, the capacity in black;
//! - `qsim sweep`: `sweep-METRIC[-K]` — the metric's median against the
//!   first `--vary` path with its 90 % interval over seeds, one line per
//!   experiment (or scenario, or scenario/consumer) and value of the second
//!   path, one figure per combination of the further paths (and per
//!   experiment when the lines would be more than ten);
//!   `heatmap-METRIC-EXPERIMENT[-K]` (with two or more paths) — the median
//!   over the first two paths, one per experiment and combination of the
//!   further paths. At most [`MAX_FIGURES`] of each per metric.
//!
//! The latency histograms and server samples are not in the records: the
//! run that makes the records also returns them when plots are asked for
//! ([`records_with_extras`]); the records are the same as without plots.

use crate::cli::common::CliError;
use crate::output;
use qsim_plot::html::{Block, Document};
use qsim_plot::{
    Figure, Heatmap, LineChart, PlanConsumer, PlanScenario, Series, ServerSeries, XAxis, MAX_SERIES,
};
use qsim_sim::config::ConfigError;
use qsim_sim::engine::DurationHist;
use qsim_sim::experiment::{self, ExperimentFile};
use qsim_sim::plan::config::SharedFile;
use qsim_sim::report::records::{Records, Spreads};
use qsim_sim::report::sweep::{Point, Row};
use qsim_sim::report::{self, fmt_spread};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use qsim_sim::experiment::extras::{sample_every, Extras, SAMPLES};
/// Points of a CDF (quantiles 0, 1/N, …, 1).
pub const CDF_POINTS: usize = 200;
/// Most figures of one kind per metric a sweep draws (the first in grid
/// order; the rest are left out).
pub const MAX_FIGURES: usize = 64;

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

/// Three panels over the minutes of a run: arrivals, replicas and p95 TTFT.
fn replicas_over_time(
    title: &str,
    minutes: &[(String, Vec<experiment::server::Minute>)],
) -> Figure {
    let (ms, _) = capped(minutes.iter().collect());
    let panel = |what: &str, y: &str, f: &dyn Fn(&experiment::server::Minute) -> f64| {
        qsim_plot::Panel::Lines(LineChart {
            title: format!("{title}: {what}"),
            x_label: "time (h)".into(),
            y_label: y.into(),
            series: ms
                .iter()
                .map(|(n, m)| Series {
                    name: n.clone(),
                    points: m
                        .iter()
                        .enumerate()
                        .map(|(i, x)| ((i + 1) as f64 / 60.0, f(x)))
                        .collect(),
                    band: vec![],
                })
                .collect(),
            ..Default::default()
        })
    };
    Figure::grid(
        vec![
            panel("arrivals per minute", "requests per minute", &|m| {
                m.arrivals as f64
            }),
            panel("replicas (mean over each minute)", "replicas", &|m| {
                m.replicas
            }),
            panel(
                "TTFT p95 of the requests finished in each minute",
                "TTFT p95 (s)",
                &|m| m.ttft_p95_s,
            ),
        ],
        1,
        900,
        320,
    )
}

/// A named figure with its caption.
pub struct Fig {
    pub name: String,
    pub caption: String,
    pub figure: Figure,
}

fn seeds_note(seed: u64, seeds: u64) -> String {
    if seeds > 1 {
        format!("{seeds} seeds from {seed}")
    } else {
        format!("seed {seed}")
    }
}

/// CDF points of a histogram: (latency s, fraction ≤ it).
pub fn cdf(h: &DurationHist) -> Vec<(f64, f64)> {
    if h.count() == 0 {
        return vec![];
    }
    (0..=CDF_POINTS)
        .map(|i| {
            let q = i as f64 / CDF_POINTS as f64;
            (h.quantile_s(q), q)
        })
        .collect()
}

fn capped<T>(v: Vec<T>) -> (Vec<T>, String) {
    let n = v.len();
    if n > MAX_SERIES {
        let kept = v.into_iter().take(MAX_SERIES).collect();
        (kept, format!(" (first {MAX_SERIES} of {n})"))
    } else {
        (v, String::new())
    }
}

/// The figures of `qsim run` on a hosted or server file.
pub fn run_figures(ef: &ExperimentFile, x: &Extras, seed: u64, seeds: u64) -> Vec<Fig> {
    let note = if seeds > 1 {
        format!("{} pooled", seeds_note(seed, seeds))
    } else {
        seeds_note(seed, seeds)
    };
    let mut figs = Vec::new();
    match ef {
        ExperimentFile::Hosted(suite) => {
            let (lat, more) = capped(x.latency.iter().collect());
            let series = lat.iter().map(|(n, h)| (n.clone(), cdf(h))).collect();
            let title = format!("Row latency CDF per experiment{more}, {note}");
            figs.push(Fig {
                name: "latency-cdf".into(),
                caption: format!(
                    "{}: latency of each row (first send to final outcome, waits included), {note}",
                    suite.title
                ),
                figure: qsim_plot::latency_cdf(&title, "row latency (s)", series),
            });
        }
        ExperimentFile::Server(_) => {
            let (ser, more) = capped(x.series.iter().collect());
            let ss: Vec<ServerSeries> = ser
                .iter()
                .map(|(n, s)| ServerSeries {
                    name: n.clone(),
                    t_s: s.t.iter().map(|&t| t as f64 / 1e9).collect(),
                    waiting: s.waiting.iter().map(|&w| w as f64).collect(),
                    e2e_p50_s: s.e2e_p50_s.clone(),
                })
                .collect();
            figs.push(Fig {
                name: "server-over-time".into(),
                caption: format!(
                    "Requests waiting and E2E p50 of the requests finished in each of {SAMPLES} intervals, per scenario{more}, seed {seed}"
                ),
                figure: qsim_plot::server_over_time(&format!("seed {seed}"), &ss),
            });
            if !x.minutes.is_empty() {
                figs.push(Fig {
                    name: "replicas-over-time".into(),
                    caption: format!(
                        "Per minute: arrivals, replicas holding a GPU (starting, ready or draining) and the p95 TTFT of the requests finished, per scenario, seed {seed}"
                    ),
                    figure: replicas_over_time(&format!("seed {seed}"), &x.minutes),
                });
            }
            let (lat, more) = capped(x.latency.iter().collect());
            let series = lat.iter().map(|(n, h)| (n.clone(), cdf(h))).collect();
            figs.push(Fig {
                name: "e2e-cdf".into(),
                caption: format!("E2E latency CDF per scenario, {note}"),
                figure: qsim_plot::latency_cdf(
                    &format!("E2E CDF per scenario{more}, {note}"),
                    "E2E (s)",
                    series,
                ),
            });
        }
        ExperimentFile::Shared(_) => {}
    }
    figs
}

/// The plan's figure: per scenario, each consumer's admitted units per
/// minute (median over seeds with its 90 % band), floors and capacity.
pub fn plan_figures(f: &SharedFile, s: &Spreads, seed: u64, seeds: u64) -> Vec<Fig> {
    let l = &f.limiter;
    let unit = match l.unit.name() {
        "tpm" => "tokens",
        _ => "requests",
    };
    let scenarios: Vec<PlanScenario> = f
        .scenarios
        .iter()
        .map(|sc| PlanScenario {
            name: sc.name.clone(),
            consumers: l
                .consumers
                .iter()
                .take(MAX_SERIES)
                .map(|c| {
                    let sub = qsim_sim::plan::seeds::consumer_subject(&sc.name, &c.name);
                    let mins = sc.duration.div_ceil(60_000_000_000) as usize;
                    let per: Vec<_> = (0..mins)
                        .map(|m| s.get(&sub, &format!("admitted_per_min.{m}")))
                        .collect();
                    let floor = l.capacity as f64 * c.reserved_bp as f64 / 10_000.0;
                    PlanConsumer {
                        name: c.name.clone(),
                        admitted_per_min: per.iter().map(|p| p.median).collect(),
                        band: if seeds > 1 {
                            per.iter().map(|p| (p.lo, p.hi)).collect()
                        } else {
                            vec![]
                        },
                        floor: (floor > 0.0).then_some(floor),
                    }
                })
                .collect(),
        })
        .collect();
    let title = if seeds > 1 {
        format!("median of {seeds} seeds")
    } else {
        format!("seed {seed}")
    };
    vec![Fig {
        name: "plan-admitted".into(),
        caption: format!(
            "Admitted {unit} per minute per consumer ({}), floors dashed in the consumer's colour, capacity {} {unit}/min in black; {}",
            if seeds > 1 { "median and 90 % interval" } else { "one seed" },
            l.capacity,
            seeds_note(seed, seeds)
        ),
        figure: qsim_plot::plan_minutes(&title, unit, l.capacity as f64, &scenarios),
    }]
}

/// A metric's label with its unit, from the reports' tables.
pub fn metric_label(key: &str) -> String {
    let tables: [&[(&str, &str, i32)]; 4] = [
        report::hosted::METRICS,
        report::server::METRICS,
        qsim_sim::plan::seeds::CONSUMER_METRICS,
        qsim_sim::plan::seeds::SCENARIO_METRICS,
    ];
    for t in tables {
        if let Some((_, label, d)) = t.iter().find(|(k, _, _)| *k == key) {
            return if label.contains('(') || label.contains('%') || *d != 0 {
                label.to_string()
            } else {
                format!("{label} (count)")
            };
        }
    }
    key.to_string()
}

/// The metrics a sweep of this kind plots as lines, and as heatmaps.
pub fn sweep_metrics(ef: &ExperimentFile) -> (&'static [&'static str], &'static [&'static str]) {
    match ef {
        ExperimentFile::Hosted(_) => (
            &["elapsed_s", "latency_p95_s", "ok", "rejected_429"],
            &["elapsed_s", "latency_p95_s"],
        ),
        ExperimentFile::Server(_) => (
            &["throughput_rpm", "e2e_p50_s", "e2e_p99_s", "ttft_p50_s"],
            &["e2e_p99_s", "throughput_rpm"],
        ),
        ExperimentFile::Shared(_) => (&["admitted", "success_pct"], &["success_pct"]),
    }
}

fn file_key(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// The values of the further `--vary` paths at a grid point.
type Combo = Vec<(String, String)>;

/// A grid point's values: x, the second path's, the further paths'.
fn key<'a>(
    xv: &'a str,
    iv: Option<(&'a str, &'a str)>,
    ov: &'a [(String, String)],
) -> Vec<&'a str> {
    let mut k = vec![xv];
    k.extend(iv.map(|(_, v)| v));
    k.extend(ov.iter().map(|(_, v)| v.as_str()));
    k
}

fn spread_of<'a>(rows: &'a [Row], name: &str, metric: &str) -> Option<&'a report::Spread> {
    rows.iter()
        .find(|r| r.name == name)?
        .metrics
        .iter()
        .find(|m| m.0 == metric)
        .map(|m| &m.2)
}

/// The figures of a sweep over `dims` (the grid in order, every point).
pub fn sweep_figures(
    dims: &[qsim_sim::sweep::Axis],
    points: &[Point],
    lines: &[&str],
    heat: &[&str],
    seed: u64,
    seeds: u64,
) -> Vec<Fig> {
    let mut figs = Vec::new();
    let Some(((x_path, x_vals), rest)) = dims.split_first() else {
        return figs;
    };
    let by: BTreeMap<Vec<&str>, &[Row]> = points
        .iter()
        .map(|(combo, rows)| {
            (
                combo.iter().map(|(_, v)| v.as_str()).collect(),
                rows.as_slice(),
            )
        })
        .collect();
    let names: Vec<String> = points
        .first()
        .map(|(_, r)| r.iter().map(|r| r.name.clone()).collect())
        .unwrap_or_default();
    let numeric: Option<Vec<f64>> = x_vals.iter().map(|v| v.parse::<f64>().ok()).collect();
    let (x_axis, xs) = match numeric {
        Some(xs) => (XAxis::Linear, xs),
        None => (
            XAxis::Categories(x_vals.clone()),
            (0..x_vals.len()).map(|i| i as f64).collect(),
        ),
    };
    let inner: Vec<Option<(&str, &str)>> = match rest.first() {
        Some((p, vals)) => vals
            .iter()
            .map(|v| Some((p.as_str(), v.as_str())))
            .collect(),
        None => vec![None],
    };
    let outer_dims = if rest.len() > 1 { &rest[1..] } else { &[][..] };
    let outer = qsim_sim::sweep::grid(outer_dims);
    let note = seeds_note(seed, seeds);
    let band_note = if seeds > 1 {
        "median and 90 % interval over seeds"
    } else {
        "one seed"
    };
    let at = |ov: &[(String, String)]| -> String {
        if ov.is_empty() {
            String::new()
        } else {
            let s: Vec<String> = ov.iter().map(|(k, v)| format!("{k}={v}")).collect();
            format!(" at {}", s.join(" "))
        }
    };
    for &metric in lines {
        let label = metric_label(metric);
        // charts: per outer combination; per name too if the series would
        // not fit one chart
        let split = names.len() * inner.len() > MAX_SERIES && names.len() > 1;
        let groups: Vec<(Vec<&String>, &Combo)> = outer
            .iter()
            .flat_map(|ov| {
                if split {
                    names.iter().map(|n| (vec![n], ov)).collect::<Vec<_>>()
                } else {
                    vec![(names.iter().collect(), ov)]
                }
            })
            .collect();
        let total = groups.len();
        for (gi, (group, ov)) in groups.into_iter().take(MAX_FIGURES).enumerate() {
            let mut series = Vec::new();
            for name in &group {
                for iv in &inner {
                    let mut s = Series {
                        name: match (names.len() > 1 && !split, iv) {
                            (true, Some((p, v))) => format!("{name}, {p}={v}"),
                            (true, None) => name.to_string(),
                            (false, Some((p, v))) => format!("{p}={v}"),
                            (false, None) => name.to_string(),
                        },
                        ..Default::default()
                    };
                    for (xi, xv) in x_vals.iter().enumerate() {
                        let k = key(xv, *iv, ov);
                        if let Some(sp) = by.get(&k).and_then(|rows| spread_of(rows, name, metric))
                        {
                            if sp.median.is_finite() {
                                s.points.push((xs[xi], sp.median));
                                if seeds > 1 {
                                    s.band.push((xs[xi], sp.lo, sp.hi));
                                }
                            }
                        }
                    }
                    series.push(s);
                }
            }
            let (series, more) = capped(series);
            let who = if split {
                format!(" — {}", group[0])
            } else {
                String::new()
            };
            let title = format!("{label} vs {x_path}{who}{}{more}", at(ov));
            let name = if total > 1 {
                format!("sweep-{}-{}", file_key(metric), gi + 1)
            } else {
                format!("sweep-{}", file_key(metric))
            };
            figs.push(Fig {
                name,
                caption: format!("{title}: {band_note}, {note}"),
                figure: qsim_plot::metric_lines(LineChart {
                    title,
                    x_label: x_path.clone(),
                    y_label: label.clone(),
                    x_axis: x_axis.clone(),
                    series,
                    ..Default::default()
                }),
            });
        }
    }
    let Some((y_path, y_vals)) = rest.first() else {
        return figs;
    };
    for &metric in heat {
        let label = metric_label(metric);
        let groups: Vec<(usize, &String, &Combo)> = outer
            .iter()
            .enumerate()
            .flat_map(|(oi, ov)| names.iter().map(move |n| (oi, n, ov)))
            .collect();
        for (oi, name, ov) in groups.into_iter().take(MAX_FIGURES) {
            let cells = y_vals
                .iter()
                .map(|yv| {
                    x_vals
                        .iter()
                        .map(|xv| {
                            let k = key(xv, Some((y_path, yv)), ov);
                            by.get(&k)
                                .and_then(|rows| spread_of(rows, name, metric))
                                .map(|s| s.median)
                                .filter(|m| m.is_finite())
                        })
                        .collect()
                })
                .collect();
            let decimals = if metric.ends_with("_s") || metric.ends_with("pct") {
                1
            } else {
                0
            };
            let title = format!("{name}{}: {label}", at(ov));
            figs.push(Fig {
                name: if outer.len() > 1 {
                    format!("heatmap-{}-{}-{}", file_key(metric), file_key(name), oi + 1)
                } else {
                    format!("heatmap-{}-{}", file_key(metric), file_key(name))
                },
                caption: if seeds > 1 {
                    format!("{title}, median over {note}")
                } else {
                    format!("{title}, {note}")
                },
                figure: qsim_plot::heatmap(Heatmap {
                    title,
                    x_label: x_path.clone(),
                    y_label: y_path.clone(),
                    value_label: label.clone(),
                    x_values: x_vals.clone(),
                    y_values: y_vals.clone(),
                    cells,
                    decimals,
                }),
            });
        }
    }
    figs
}

/// A table of metrics (rows) × experiments or scenarios (columns), each
/// cell `median [lo–hi]` over seeds: the text report's layout.
pub fn metrics_table(rows: &[Row], cols: &[&str], runs: usize) -> Block {
    let mut header = vec!["metric".to_string()];
    header.extend(rows.iter().map(|r| r.name.clone()));
    Block::Table {
        header,
        rows: cols
            .iter()
            .map(|k| {
                let mut line = vec![metric_label(k)];
                for r in rows {
                    line.push(match r.metrics.iter().find(|m| m.0 == *k) {
                        Some((_, d, s)) if s.median.is_finite() => fmt_spread(s, *d, runs),
                        _ => "–".into(),
                    });
                }
                line
            })
            .collect(),
    }
}

/// A table of rows (experiments, scenarios, consumers) × metrics, each
/// cell `median [lo–hi]` over seeds.
pub fn rows_table(rows: &[Row], cols: &[&str], runs: usize) -> Block {
    let mut header = vec!["".to_string()];
    header.extend(cols.iter().map(|k| metric_label(k)));
    Block::Table {
        header,
        rows: rows
            .iter()
            .map(|r| {
                let mut line = vec![r.name.clone()];
                for k in cols {
                    line.push(match r.metrics.iter().find(|m| m.0 == *k) {
                        Some((_, d, s)) if s.median.is_finite() => fmt_spread(s, *d, runs),
                        _ => "–".into(),
                    });
                }
                line
            })
            .collect(),
    }
}

/// The sweep's table: one row per (point, experiment), medians.
pub fn sweep_table(points: &[Point], cols: &[&str]) -> Block {
    let mut header: Vec<String> = points
        .first()
        .map(|(c, _)| c.iter().map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    header.push("experiment".into());
    header.extend(cols.iter().map(|k| metric_label(k)));
    let mut rows = Vec::new();
    for (combo, rs) in points {
        for r in rs {
            let mut line: Vec<String> = combo.iter().map(|(_, v)| v.clone()).collect();
            line.push(r.name.clone());
            for k in cols {
                line.push(match r.metrics.iter().find(|m| m.0 == *k) {
                    Some((_, d, s)) if s.median.is_finite() => fmt_spread(s, *d, 1),
                    _ => "–".into(),
                });
            }
            rows.push(line);
        }
    }
    Block::Table { header, rows }
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
            let ef = experiment::load(&p, &sets).unwrap();
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
