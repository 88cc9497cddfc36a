//! `qsim calibrate server`: the flags mapped to a
//! [`qsim_sim::calibrate::server::Spec`], one call of [`qsim_sim::calibrate::server::run`],
//! and the result rendered (a table, or its JSON). What the fit does, its
//! intervals and the identification of coefficients: the library's docs
//! (`crates/qsim-sim/src/calibrate/server/`).

use crate::cli::common::{CliError, Format};
use qsim_sim::calibrate::server::{
    num as g, BenchResult, Calibration, End, MeansMs, Spec, Status, Unidentified,
};
use std::fmt::Write as _;
use std::path::PathBuf;

#[derive(clap::Args, Debug)]
pub struct ServerArgs {
    /// vLLM benchmark_serving result JSON files (one per request rate) to fit to.
    #[arg(required = true, value_name = "BENCH_JSON")]
    pub bench: Vec<PathBuf>,
    /// The server profile whose coefficients are fitted (the start values).
    #[arg(long, value_name = "FILE")]
    pub profile: PathBuf,
    /// Benchmarks not fitted to, only predicted (repeatable).
    #[arg(long, value_name = "BENCH_JSON")]
    pub holdout: Vec<PathBuf>,
    /// Coefficients to fit, comma-separated dotted paths into the profile
    /// (a bare name is under [iteration]); `none` fits nothing (evaluates
    /// the profile). Default: the step-time ones (see the README).
    #[arg(long, value_delimiter = ',', value_name = "COEF,...")]
    pub fit: Option<Vec<String>>,
    /// Write the fitted profile here (refused if it exists, unless --force).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    #[arg(long)]
    pub force: bool,
    /// The fitted profile's name (default: the base's with "-calibrated").
    #[arg(long)]
    pub name: Option<String>,
    /// Simulated arrival streams per benchmark (their means are pooled).
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub reps: u32,
    /// Coefficient intervals: `profile` (profile likelihood, and the
    /// identification of each coefficient) or `none` (the fit alone).
    #[arg(long, value_enum, default_value_t = Intervals::Profile)]
    pub intervals: Intervals,
    /// A coefficient the benchmarks do not pin down (its 95 % interval
    /// open within a factor of 4): `fix` it at its base value and fit the
    /// rest, `warn`, or `refuse` (exit 2).
    #[arg(long, value_enum, default_value_t = UnidentifiedArg::Fix)]
    pub unidentified: UnidentifiedArg,
    /// Objective evaluations of the main fit at most.
    #[arg(long, default_value_t = 1500, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_evals: u32,
    /// Seed of the arrival streams.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Replay a benchmark that has `arrival_s` (qsim calibrate bench) at
    /// those recorded send times instead of Poisson streams at its rate.
    #[arg(long)]
    pub recorded_arrivals: bool,
    /// Report format on stdout (table or json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Intervals {
    Profile,
    None,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnidentifiedArg {
    Fix,
    Warn,
    Refuse,
}

/// The flags as a library spec.
pub fn spec(a: &ServerArgs) -> Spec {
    let mut s = Spec::new(a.profile.clone(), a.bench.clone());
    s.holdout = a.holdout.clone();
    s.fit = a.fit.as_ref().map(|v| {
        if v.len() == 1 && v[0] == "none" {
            Vec::new()
        } else {
            v.clone()
        }
    });
    s.name = a.name.clone();
    s.reps = a.reps;
    s.max_evals = a.max_evals;
    s.seed = a.seed;
    s.recorded_arrivals = a.recorded_arrivals;
    s.intervals = a.intervals == Intervals::Profile;
    s.unidentified = match a.unidentified {
        UnidentifiedArg::Fix => Unidentified::Fix,
        UnidentifiedArg::Warn => Unidentified::Warn,
        UnidentifiedArg::Refuse => Unidentified::Refuse,
    };
    s
}

pub fn run_cli(a: ServerArgs) -> Result<(), CliError> {
    if let Some(out) = &a.out {
        crate::output::check_target(out, a.force)?;
    }
    let c = qsim_sim::calibrate::server::run(&spec(&a))?;
    for w in &c.warnings {
        eprintln!("calibrate server: {w}");
    }
    if let Some(out) = &a.out {
        crate::output::write_file(out, &c.fitted_profile, a.force)?;
    }
    let text = match a.format {
        Format::Json => format!("{}\n", serde_json::to_string_pretty(&c).unwrap_or_default()),
        _ => table(&c),
    };
    crate::output::write_stdout(&text)?;
    Ok(())
}

fn pct(p: Option<f64>, o: Option<f64>) -> String {
    match (p, o) {
        (Some(p), Some(o)) if o != 0.0 => format!("{:+.1}%", (p / o - 1.0) * 100.0),
        _ => "–".into(),
    }
}

fn opt(x: Option<f64>) -> String {
    x.map(g).unwrap_or_else(|| "–".into())
}

fn ci_text(ci: Option<[f64; 2]>, ends: Option<[End; 2]>) -> String {
    match (ci, ends) {
        (Some([a, b]), Some([ea, eb])) => {
            let lo = if ea == End::Open {
                format!("<{}", g(a))
            } else {
                g(a)
            };
            let hi = match eb {
                End::Open => format!(">{}", g(b)),
                End::Bound => format!("{} (bound)", g(b)),
                End::Crossed => g(b),
            };
            format!("{lo}–{hi}")
        }
        _ => "–".into(),
    }
}

fn bench_rows(s: &mut String, b: &BenchResult, tag: &str) {
    let name = std::path::Path::new(&b.file)
        .file_name()
        .map(|f| f.to_string_lossy().to_string())
        .unwrap_or_else(|| b.file.clone());
    let rate = if b.request_rate.0.is_finite() {
        format!("{}", b.request_rate.0)
    } else {
        "inf".into()
    };
    type Pick = fn(&MeansMs) -> Option<f64>;
    let pick: [(&str, Pick); 6] = [
        ("ttft", |m| m.ttft_ms),
        ("ttft>med", |m| m.ttft_long_prompts_ms),
        ("ttft≤med", |m| m.ttft_short_prompts_ms),
        ("itl", |m| m.itl_ms),
        ("e2e", |m| m.e2e_ms),
        ("tpot", |m| m.tpot_ms),
    ];
    let mut first = true;
    for (label, get) in pick {
        let o = get(&b.observed);
        if o.is_none() {
            continue;
        }
        let (f, bs) = (get(&b.fitted), get(&b.base));
        let (l, r, n) = if first {
            (format!("{name}{tag}"), rate.clone(), b.requests.to_string())
        } else {
            (String::new(), String::new(), String::new())
        };
        first = false;
        let extra = match &b.fitted_ci95 {
            Some(c) => format!("  fitted 95% {}–{}", opt(get(&c.lo)), opt(get(&c.hi))),
            None => String::new(),
        };
        let _ = writeln!(
            s,
            "{l:<28} {r:>8} {n:>6} {label:<8} {:>10} {:>10} {:>8} {:>10} {:>8}{extra}",
            opt(o),
            opt(f),
            pct(f, o),
            opt(bs),
            pct(bs, o)
        );
    }
}

/// The text report.
pub fn table(c: &Calibration) -> String {
    let mut s = String::new();
    let fitted = c
        .coefficients
        .iter()
        .filter(|k| k.status == Status::Fitted)
        .count();
    let fixed = c.coefficients.len() - fitted;
    let _ = writeln!(
        s,
        "calibrate server: {}: {fitted} coefficient(s) fitted{} to {} benchmark(s), {} held out",
        c.profile,
        if fixed > 0 {
            format!(" ({fixed} fixed: not identified)")
        } else {
            String::new()
        },
        c.fit.len(),
        c.holdout.len()
    );
    let _ = writeln!(
        s,
        "objective Σ ln(sim/obs)²/σ² over mean TTFT, ITL, E2E: {:.5} after {} evaluations ({} arrival streams per benchmark)",
        c.objective, c.evaluations, c.reps
    );
    let recorded = c
        .fit
        .iter()
        .chain(&c.holdout)
        .filter(|b| b.arrivals == "recorded")
        .count();
    if recorded > 0 {
        let _ = writeln!(
            s,
            "{recorded} of {} benchmark(s) replayed at their recorded send times (arrival_s); the streams only weigh them",
            c.fit.len() + c.holdout.len()
        );
    }
    if !c.coefficients.is_empty() {
        let head = if c.intervals.method == "none" {
            "95% interval".to_string()
        } else {
            format!(
                "95% interval (profile likelihood: loss within {:.2} of its minimum, residual scale {:.2})",
                c.intervals.threshold, c.intervals.residual_scale
            )
        };
        let _ = writeln!(
            s,
            "\n{:<32} {:>10} {:>10}  {head}",
            "coefficient", "base", "fit"
        );
        for k in &c.coefficients {
            let iv = match k.status {
                Status::Fitted => ci_text(k.ci95, k.ci95_ends),
                Status::Fixed => "fixed at base: not identified".into(),
            };
            let _ = writeln!(s, "{:<32} {:>10} {:>10}  {iv}", k.name, g(k.base), g(k.fit));
        }
    }
    let _ = writeln!(
        s,
        "\n{:<28} {:>8} {:>6} {:<8} {:>10} {:>10} {:>8} {:>10} {:>8}",
        "benchmark", "rate/s", "n", "mean ms", "observed", "fitted", "error", "base", "error"
    );
    for b in &c.fit {
        bench_rows(&mut s, b, "");
    }
    for b in &c.holdout {
        bench_rows(&mut s, b, " (held out)");
    }
    let sci = match c.saturation_rps.ci95 {
        Some([a, b]) => format!(" (95% {}–{})", g(a), g(b)),
        None => String::new(),
    };
    let _ = writeln!(
        s,
        "\nsaturation (requests/s the profile sustains with this length mix): fitted {}{sci}, base {}",
        g(c.saturation_rps.fitted),
        g(c.saturation_rps.base)
    );
    for k in c.coefficients.iter().filter(|k| k.status == Status::Fixed) {
        if let Some(n) = &k.note {
            let _ = writeln!(s, "{}: fixed at {}: {n}", k.name, g(k.fit));
        }
    }
    s
}
