//! `qsim recommend FILE`: search a hosted experiment's client knobs
//! (workers, max_tokens, the client policy and its parameters, the AIMD
//! window) for the configuration that is best on an objective under
//! constraints, with the evidence.
//!
//! The search (deterministic: the same inputs give the same output, whatever
//! the thread count):
//! 1. a grid: workers {4, 6, 8, 10, 12, 16, 24, 32, 48, 64} and the file's,
//!    max_tokens {1, 7/8, 3/4, 1/2} × the file's, every policy preset
//!    ([`qsim_sim::client::presets`]) at its preset parameters;
//! 2. local refinement, up to [`MAX_ROUNDS`] rounds: around the
//!    [`REFINE_TOP`] best configurations (the least violating ones while
//!    none meets the constraints), every single-knob step: workers ±1, ±2,
//!    ±4; max_tokens ±16; each retry parameter (base, cap, jitter, delay)
//!    ×2 and ÷2 (a constant delay ×1.5, ÷1.5), max_attempts ±2; the AIMD
//!    window's start ×2, ÷2, its increase ×2, ÷2 and its decrease factor
//!    ±0.1. A round that does not improve the winner ends the search.
//!
//! Every configuration runs the file's rows alone against the file's
//! endpoint on the same seeds (common random numbers), so differences
//! between configurations are not seed noise.

use crate::cli::common::{emit, CliError, Format};
use qsim_sim::budget::Cost;
use qsim_sim::client::managed::AimdParams;
use qsim_sim::client::policy::{Backoff, RetryPolicy};
use qsim_sim::client::presets::{self, ClientPolicy, PRESETS};
use qsim_sim::config::ConfigError;
use qsim_sim::experiment::config::{client_with, ClientKind, Experiment};
use qsim_sim::experiment::{hosted, ExperimentFile, HostedSuite};
use qsim_sim::report::records::Records;
use qsim_sim::report::table::Table;
use qsim_sim::report::{json_text, round, spread, Spread};
use rayon::prelude::*;
use serde_json::{json, Value};
use std::path::PathBuf;

/// Rounds of local refinement at most.
pub const MAX_ROUNDS: usize = 4;
/// Configurations refined around in each round.
pub const REFINE_TOP: usize = 4;
/// The workers of the grid (plus the file's).
pub const GRID_WORKERS: &[u32] = &[4, 6, 8, 10, 12, 16, 24, 32, 48, 64];
/// The max_tokens of the grid, as fractions of the file's (eighths).
pub const GRID_MAX_TOKENS_EIGHTHS: &[u64] = &[8, 7, 6, 4];

/// The constraints that apply unless one on the same metric is given.
pub const DEFAULT_CONSTRAINTS: &[&str] = &[
    "ok>=rows in 95% of seeds",
    "p95<=2*p50",
    "truncated<=0.01*rows",
];

#[derive(clap::Args, Debug)]
pub struct RecommendArgs {
    /// A hosted experiment file (its endpoint, rows, token distributions,
    /// workers, max_tokens, sdk_retries and [managed] are the starting point).
    pub file: PathBuf,
    /// The metric to optimise, as a median over seeds: elapsed, p50, p95,
    /// http_429, http_requests, own_wait, … (minimised); throughput, ok
    /// (maximised).
    #[arg(long, default_value = "elapsed")]
    pub objective: String,
    /// A constraint `METRIC OP [K*]TERM [in P% of seeds]` (OP: <= >= < > ==;
    /// TERM: a number, `rows` or a metric). With `in P% of seeds` it must
    /// hold seed by seed in at least P % of the seeds; without, on the
    /// medians. Defaults, each replaced by a constraint on the same metric:
    /// "ok>=rows in 95% of seeds", "p95<=2*p50", "truncated<=0.01*rows".
    #[arg(long = "constraint", value_name = "EXPR")]
    pub constraints: Vec<String>,
    /// Seed of the first run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Seeds per configuration.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub seeds: u64,
    /// Override a scalar in the file first (as `qsim run --set`).
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// Threads (default: all cores); the output is the same whatever the number.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    pub threads: Option<u16>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Write the report to this file (atomically) instead of stdout.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Replace the --out file if it exists.
    #[arg(long)]
    pub force: bool,
    /// The work budget, checked against the grid stage's estimate.
    #[command(flatten)]
    pub budget: crate::cli::flags::BudgetFlags,
    /// `--plot DIR` (the Pareto scatter, PNG and SVG) and `--html FILE`.
    #[command(flatten)]
    pub plots: crate::plot::PlotOpts,
}

// ---------------------------------------------------------------- metrics

/// The metrics of one run, in the order of [`qsim_sim::report::hosted::METRICS`].
fn metric_keys() -> impl Iterator<Item = &'static str> {
    qsim_sim::report::hosted::METRICS.iter().map(|m| m.0)
}

/// A metric's index by its key or short name.
fn metric_index(name: &str) -> Option<usize> {
    let key = match name {
        "elapsed" => "elapsed_s",
        "p50" => "latency_p50_s",
        "p95" => "latency_p95_s",
        "own_wait" => "own_wait_s",
        "max_wait" => "max_wait_s",
        "throughput" => "throughput_rows_per_s",
        other => other,
    };
    metric_keys().position(|k| k == key)
}

fn metric_names() -> String {
    let mut v = vec![
        "elapsed",
        "p50",
        "p95",
        "own_wait",
        "max_wait",
        "throughput",
    ];
    v.extend(metric_keys());
    v.join(", ")
}

const fn idx(key: &str) -> usize {
    // the positions of the metrics the report always shows (checked in tests)
    match key.as_bytes() {
        b"elapsed_s" => 0,
        b"ok" => 1,
        b"latency_p50_s" => 5,
        b"latency_p95_s" => 6,
        b"truncated" => 9,
        b"http_429" => 16,
        _ => usize::MAX,
    }
}
const ELAPSED: usize = idx("elapsed_s");
const OK: usize = idx("ok");
const P50: usize = idx("latency_p50_s");
const P95: usize = idx("latency_p95_s");
const TRUNCATED: usize = idx("truncated");
const HTTP_429: usize = idx("http_429");

// ------------------------------------------------------------ constraints

#[derive(Debug, Clone, Copy, PartialEq)]
enum Atom {
    Number,
    Rows,
    Metric(usize),
}

/// `k × atom` (a bare number is `k` with [`Atom::Number`]).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Term {
    k: f64,
    atom: Atom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Le,
    Ge,
    Lt,
    Gt,
    Eq,
}

impl Op {
    fn holds(self, a: f64, b: f64) -> bool {
        let tol = 1e-9 * a.abs().max(b.abs()).max(1.0);
        match self {
            Op::Le => a <= b + tol,
            Op::Ge => a + tol >= b,
            Op::Lt => a < b,
            Op::Gt => a > b,
            Op::Eq => (a - b).abs() <= tol,
        }
    }
}

/// A parsed constraint.
#[derive(Debug, Clone, PartialEq)]
pub struct Constraint {
    pub text: String,
    pub default: bool,
    lhs: Term,
    op: Op,
    rhs: Term,
    /// Seed by seed in at least this share of the seeds; None: on medians.
    share: Option<f64>,
}

fn cerr(text: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(format!("--constraint {text:?}"), "", reason)
}

fn parse_term(text: &str, s: &str) -> Result<Term, ConfigError> {
    let s = s.trim();
    if s.is_empty() {
        return Err(cerr(text, "a side of the comparison is empty"));
    }
    let atom = |a: &str| -> Result<Atom, ConfigError> {
        let a = a.trim();
        if a == "rows" {
            Ok(Atom::Rows)
        } else {
            metric_index(a).map(Atom::Metric).ok_or_else(|| {
                cerr(
                    text,
                    format!(
                        "unknown metric {a:?}; expected a number, rows or one of {}",
                        metric_names()
                    ),
                )
            })
        }
    };
    let num = |n: &str| -> Option<f64> { n.trim().parse::<f64>().ok().filter(|x| x.is_finite()) };
    if let Some(x) = num(s) {
        return Ok(Term {
            k: x,
            atom: Atom::Number,
        });
    }
    if let Some((a, b)) = s.split_once('*') {
        let (k, name) = match (num(a), num(b)) {
            (Some(k), _) => (k, b),
            (None, Some(k)) => (k, a),
            (None, None) => {
                return Err(cerr(
                    text,
                    format!("{s:?}: expected K*TERM with K a number"),
                ))
            }
        };
        return Ok(Term {
            k,
            atom: atom(name)?,
        });
    }
    Ok(Term {
        k: 1.0,
        atom: atom(s)?,
    })
}

impl Constraint {
    /// `METRIC OP [K*]TERM [in P% of seeds]`.
    pub fn parse(text: &str) -> Result<Constraint, ConfigError> {
        let form = "expected METRIC OP [K*]TERM [in P% of seeds], e.g. \"ok>=rows in 95% of seeds\" or \"p95<=2*p50\"";
        let lower = text.to_ascii_lowercase();
        let (cmp, share) = match lower.find(" in ") {
            None => (lower.as_str(), None),
            Some(i) => {
                let tail = lower[i + 4..].trim();
                let p = tail
                    .strip_suffix("of seeds")
                    .map(str::trim)
                    .and_then(|t| t.strip_suffix('%'))
                    .ok_or_else(|| {
                        cerr(
                            text,
                            format!("the share must read \"in P% of seeds\"; {form}"),
                        )
                    })?;
                let p: f64 = p
                    .trim()
                    .parse()
                    .ok()
                    .filter(|p: &f64| *p > 0.0 && *p <= 100.0)
                    .ok_or_else(|| {
                        cerr(
                            text,
                            "the share P of \"in P% of seeds\" must be a number in (0, 100]",
                        )
                    })?;
                (&lower[..i], Some(p / 100.0))
            }
        };
        let ops = [
            ("<=", Op::Le),
            (">=", Op::Ge),
            ("==", Op::Eq),
            ("<", Op::Lt),
            (">", Op::Gt),
        ];
        let (pos, sym, op) = ops
            .iter()
            .filter_map(|(s, o)| cmp.find(s).map(|p| (p, *s, *o)))
            .min_by_key(|(p, s, _)| (*p, std::cmp::Reverse(s.len())))
            .ok_or_else(|| cerr(text, format!("no comparison (<=, >=, <, >, ==); {form}")))?;
        let lhs = parse_term(text, &cmp[..pos])?;
        let rhs = parse_term(text, &cmp[pos + sym.len()..])?;
        if !matches!(lhs.atom, Atom::Metric(_)) {
            return Err(cerr(
                text,
                format!("the left side must be a metric; {form}"),
            ));
        }
        Ok(Constraint {
            text: text.trim().to_string(),
            default: false,
            lhs,
            op,
            rhs,
            share,
        })
    }

    fn lhs_metric(&self) -> usize {
        match self.lhs.atom {
            Atom::Metric(m) => m,
            _ => unreachable!("checked at parse"),
        }
    }

    fn value(t: &Term, rows: f64, metric: impl Fn(usize) -> f64) -> f64 {
        match t.atom {
            Atom::Number => t.k,
            Atom::Rows => t.k * rows,
            Atom::Metric(m) => t.k * metric(m),
        }
    }

    /// Does it hold for these per-seed metrics, and how (for the evidence)?
    fn check(&self, ev: &Evidence, rows: f64) -> (bool, String) {
        match self.share {
            Some(share) => {
                let n = ev.per_seed.len();
                let held = ev
                    .per_seed
                    .iter()
                    .filter(|m| {
                        let a = Self::value(&self.lhs, rows, |i| m[i]);
                        let b = Self::value(&self.rhs, rows, |i| m[i]);
                        self.op.holds(a, b)
                    })
                    .count();
                let frac = held as f64 / n as f64;
                (
                    frac + 1e-9 >= share,
                    format!(
                        "holds in {held} of {n} seeds ({}%, needs {}%)",
                        fmt_num(frac * 100.0, 1),
                        fmt_num(share * 100.0, 1)
                    ),
                )
            }
            None => {
                let a = Self::value(&self.lhs, rows, |i| ev.spreads[i].median);
                let b = Self::value(&self.rhs, rows, |i| ev.spreads[i].median);
                (
                    self.op.holds(a, b),
                    format!("medians: {} vs {}", fmt_num(a, 3), fmt_num(b, 3)),
                )
            }
        }
    }
}

/// The user's constraints, plus each default whose metric they leave alone.
pub fn constraints(given: &[String]) -> Result<Vec<Constraint>, ConfigError> {
    let mut out: Vec<Constraint> = given
        .iter()
        .map(|c| Constraint::parse(c))
        .collect::<Result<_, _>>()?;
    for d in DEFAULT_CONSTRAINTS {
        let mut c = Constraint::parse(d).expect("the defaults parse");
        if !out.iter().any(|u| u.lhs_metric() == c.lhs_metric()) {
            c.default = true;
            out.push(c);
        }
    }
    Ok(out)
}

/// The objective: a metric's median, minimised (maximised for throughput and ok).
#[derive(Debug, Clone, Copy)]
struct Objective {
    metric: usize,
    maximise: bool,
}

fn objective(name: &str) -> Result<Objective, ConfigError> {
    let metric = metric_index(name.trim()).ok_or_else(|| {
        ConfigError::new(
            format!("--objective {name}"),
            "",
            format!("unknown metric; expected one of {}", metric_names()),
        )
    })?;
    let key = metric_keys().nth(metric).unwrap_or_default();
    Ok(Objective {
        metric,
        maximise: matches!(key, "throughput_rows_per_s" | "ok"),
    })
}

// ------------------------------------------------------------ configurations

/// One client configuration the search evaluates.
#[derive(Debug, Clone)]
pub struct Config {
    pub policy: &'static str,
    pub workers: u32,
    pub max_tokens: u64,
    /// The client policy with its (possibly refined) parameters.
    client: ClientPolicy,
    /// The AIMD window of `aimd` (None for pool policies).
    window: Option<AimdParams>,
}

fn fmt_num(x: f64, d: usize) -> String {
    let s = format!("{x:.d$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

impl Config {
    /// The policy's parameters, (name, value), as TOML keys.
    pub fn params(&self) -> Vec<(&'static str, f64)> {
        if let Some(w) = &self.window {
            return vec![
                ("initial_concurrency", w.initial),
                ("max_concurrency", w.max),
                ("increase", w.increase),
                ("decrease", w.decrease),
            ];
        }
        let ClientPolicy::Pool { retry, .. } = &self.client else {
            return vec![];
        };
        let mut v = match retry.backoff {
            Backoff::None => return vec![],
            Backoff::Constant { delay } => vec![("delay_s", delay)],
            Backoff::Exponential { base, cap, jitter } => {
                vec![("base_s", base), ("cap_s", cap), ("jitter_s", jitter)]
            }
            Backoff::FullJitter { base, cap }
            | Backoff::EqualJitter { base, cap }
            | Backoff::Decorrelated { base, cap } => vec![("base_s", base), ("cap_s", cap)],
        };
        v.push(("max_attempts", retry.max_attempts as f64));
        v
    }

    fn params_text(&self) -> String {
        self.params()
            .iter()
            .map(|(k, v)| format!("{k}={}", fmt_num(*v, 3)))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// A unique, readable label.
    pub fn label(&self) -> String {
        let p = self.params_text();
        let mut s = format!(
            "{} workers={} max_tokens={}",
            self.policy, self.workers, self.max_tokens
        );
        if !p.is_empty() {
            s.push_str(&format!(" ({p})"));
        }
        s
    }

    fn experiment(&self, suite: &HostedSuite) -> Experiment {
        let client = match &self.window {
            Some(w) => ClientKind::Managed(w.clone()),
            None => client_with(
                &self.client,
                self.workers,
                suite.base.sdk.clone(),
                &suite.base.managed,
            ),
        };
        Experiment {
            index: 0,
            name: self.label(),
            description: String::new(),
            rows: suite.base.rows,
            max_tokens: self.max_tokens,
            client,
        }
    }

    /// The configuration as an `[[experiment]]` of a hosted file.
    pub fn toml(&self, sdk_retries: bool) -> String {
        let mut s = format!(
            "[[experiment]]\nname = \"recommended\"\ndescription = \"qsim recommend: {}\"\n",
            self.label()
        );
        if let Some(w) = &self.window {
            s.push_str(&format!(
                "client = \"managed\"\nmax_tokens = {}\nmanaged = {{ initial_concurrency = {}, max_concurrency = {}, increase = {}, decrease = {} }}\n",
                self.max_tokens,
                fmt_num(w.initial, 3),
                fmt_num(w.max, 3),
                fmt_num(w.increase, 3),
                fmt_num(w.decrease, 3)
            ));
            return s;
        }
        s.push_str(&format!(
            "client = \"pool\"\nworkers = {}\nmax_tokens = {}\nsdk_retries = {sdk_retries}\n",
            self.workers, self.max_tokens
        ));
        let ClientPolicy::Pool { retry, shared } = &self.client else {
            return s;
        };
        let backoff = match retry.backoff {
            Backoff::None => "none",
            Backoff::Constant { .. } => "constant",
            Backoff::Exponential { .. } => "exponential",
            Backoff::FullJitter { .. } => "full_jitter",
            Backoff::EqualJitter { .. } => "equal_jitter",
            Backoff::Decorrelated { .. } => "decorrelated",
        };
        let mut fields = vec![format!("backoff = \"{backoff}\"")];
        for (k, v) in self.params() {
            fields.push(format!("{k} = {}", fmt_num(v, 3)));
        }
        if retry.backoff != Backoff::None {
            fields.push("retry_on = [\"429\", \"5xx\"]".into());
            fields.push(format!("honor_hint = {}", retry.honor_hint));
        }
        s.push_str(&format!("retry = {{ {} }}\n", fields.join(", ")));
        if shared.quota.is_some() {
            let (c, k, i) = presets::AWS_QUOTA;
            s.push_str(&format!(
                "retry_quota = {{ capacity = {c}, cost = {k}, success_increment = {i} }}\n"
            ));
        }
        if shared.throttle.is_some() {
            let (k, w) = presets::SRE_THROTTLE;
            s.push_str(&format!("throttle = {{ k = {k}, window_s = {w} }}\n"));
        }
        s
    }

    fn new(policy: &'static str, workers: u32, max_tokens: u64, base: &AimdParams) -> Config {
        let client = presets::preset(policy).expect("a listed preset");
        let window = (client == ClientPolicy::Aimd).then(|| presets::aimd_window(base, workers));
        Config {
            policy,
            workers,
            max_tokens,
            client,
            window,
        }
    }

    /// Every configuration one knob away (see the module docs).
    fn neighbours(&self) -> Vec<Config> {
        let mut out = Vec::new();
        let w = self.workers as i64;
        for d in [-4i64, -2, -1, 1, 2, 4] {
            if w + d >= 1 {
                let mut c = self.clone();
                c.workers = (w + d) as u32;
                if let Some(win) = &mut c.window {
                    *win = presets::aimd_window(win, c.workers);
                }
                out.push(c);
            }
        }
        for d in [-16i64, 16] {
            let mt = self.max_tokens as i64 + d;
            if mt >= 16 {
                let mut c = self.clone();
                c.max_tokens = mt as u64;
                out.push(c);
            }
        }
        if self.window.is_some() {
            let mut push = |f: &dyn Fn(&mut AimdParams)| {
                let mut c = self.clone();
                let w = c.window.as_mut().expect("aimd");
                f(w);
                w.initial = w.initial.clamp(w.min, w.max);
                w.decrease = w.decrease.clamp(0.1, 0.9);
                if c.window != self.window {
                    out.push(c);
                }
            };
            push(&|w| w.initial *= 2.0);
            push(&|w| w.initial = (w.initial / 2.0).max(1.0).round());
            push(&|w| w.increase *= 2.0);
            push(&|w| w.increase /= 2.0);
            push(&|w| w.decrease = round(w.decrease + 0.1, 3));
            push(&|w| w.decrease = round(w.decrease - 0.1, 3));
            return out;
        }
        let ClientPolicy::Pool { retry, .. } = &self.client else {
            return out;
        };
        if retry.backoff == Backoff::None {
            return out;
        }
        let mut push = |f: &dyn Fn(&mut RetryPolicy)| {
            let mut c = self.clone();
            if let ClientPolicy::Pool { retry, .. } = &mut c.client {
                f(retry);
            }
            if c.client != self.client {
                out.push(c);
            }
        };
        let scale = |r: &mut RetryPolicy, which: usize, k: f64| {
            let r3 = |x: &mut f64| *x = round((*x * k).clamp(0.001, 3600.0), 3);
            match &mut r.backoff {
                Backoff::Constant { delay } if which == 0 => r3(delay),
                Backoff::Exponential { base, cap, jitter } => match which {
                    0 => r3(base),
                    1 => r3(cap),
                    _ => r3(jitter),
                },
                Backoff::FullJitter { base, cap }
                | Backoff::EqualJitter { base, cap }
                | Backoff::Decorrelated { base, cap } => match which {
                    0 => r3(base),
                    1 => r3(cap),
                    _ => {}
                },
                _ => {}
            }
        };
        let constant = matches!(retry.backoff, Backoff::Constant { .. });
        for which in 0..3 {
            let (up, down) = if constant {
                (1.5, 1.0 / 1.5)
            } else {
                (2.0, 0.5)
            };
            push(&|r| scale(r, which, up));
            push(&|r| scale(r, which, down));
        }
        push(&|r| r.max_attempts += 2);
        push(&|r| r.max_attempts = r.max_attempts.saturating_sub(2).max(2));
        out
    }
}

// ---------------------------------------------------------------- evidence

/// A configuration's figures over the seeds.
#[derive(Debug, Clone)]
pub struct Evidence {
    /// Per seed, the metrics in [`qsim_sim::report::hosted::METRICS`] order.
    pub per_seed: Vec<Vec<f64>>,
    /// Per metric, the median and 90 % interval over seeds.
    pub spreads: Vec<Spread>,
}

fn one_run(suite: &HostedSuite, seed: u64) -> Vec<f64> {
    let mut r = Records::default();
    qsim_sim::report::hosted::records(&mut r, seed, &hosted::run_suite(suite, seed));
    let mut m = vec![0.0; qsim_sim::report::hosted::METRICS.len()];
    for rec in r.iter() {
        if let Some(i) = metric_keys().position(|k| k == rec.metric) {
            m[i] = rec.value;
        }
    }
    m
}

fn evidence(per_seed: Vec<Vec<f64>>) -> Evidence {
    let n = qsim_sim::report::hosted::METRICS.len();
    let spreads = (0..n)
        .map(|i| spread(&per_seed.iter().map(|m| m[i]).collect::<Vec<_>>()))
        .collect();
    Evidence { per_seed, spreads }
}

/// Run each suite on `seeds` seeds from `seed`, in parallel; results in order.
fn evaluate(suites: &[HostedSuite], seed: u64, seeds: u64) -> Vec<Evidence> {
    let jobs: Vec<(usize, u64)> = (0..suites.len())
        .flat_map(|i| (0..seeds).map(move |k| (i, k)))
        .collect();
    // the work budget's meter goes with every job to its thread
    let meter = qsim_sim::work::current();
    let runs: Vec<Vec<f64>> = jobs
        .par_iter()
        .map(|&(i, k)| {
            qsim_sim::work::enter(meter.clone(), || one_run(&suites[i], seed.wrapping_add(k)))
        })
        .collect();
    let mut it = runs.into_iter();
    suites
        .iter()
        .map(|_| evidence(it.by_ref().take(seeds as usize).collect()))
        .collect()
}

/// An evaluated configuration.
#[derive(Debug, Clone)]
pub struct Scored {
    pub config: Config,
    pub evidence: Evidence,
    /// Per constraint: holds, and how.
    pub checks: Vec<(bool, String)>,
}

impl Scored {
    pub fn feasible(&self) -> bool {
        self.checks.iter().all(|c| c.0)
    }
    fn median(&self, m: usize) -> f64 {
        self.evidence.spreads[m].median
    }
}

/// A point of the Pareto front (median elapsed vs median p95): plain data
/// for tables, JSON and plots.
#[derive(Debug, Clone, PartialEq)]
pub struct FrontPoint {
    pub label: String,
    pub elapsed_s: f64,
    pub p95_s: f64,
    /// Whether the configuration meets every constraint.
    pub meets_constraints: bool,
}

/// The result of a search.
pub struct Recommendation {
    pub file: String,
    pub seed: u64,
    pub seeds: u64,
    pub objective: String,
    pub constraints: Vec<Constraint>,
    /// Every configuration evaluated, in evaluation order.
    pub evaluated: Vec<Scored>,
    pub rounds: usize,
    pub grid_size: usize,
    /// Indices into `evaluated`: the winner, then the best of each other policy.
    pub winner: Option<usize>,
    pub runner_ups: Vec<usize>,
    /// The file's own experiments, each run alone on the same seeds.
    pub baselines: Vec<(String, Scored)>,
    /// Pareto-optimal configurations (median elapsed vs median p95) among
    /// those meeting every constraint that is not on elapsed or p95, by
    /// elapsed.
    pub front: Vec<FrontPoint>,
    /// The rows of the experiment (the `rows` term of constraints).
    pub rows: f64,
    pub sdk_retries: bool,
    obj: Objective,
}

fn single(suite: &HostedSuite, e: Experiment) -> HostedSuite {
    let mut s = suite.clone();
    s.experiments = vec![e];
    s
}

fn rank_key(s: &Scored, obj: Objective) -> f64 {
    let v = s.median(obj.metric);
    if obj.maximise {
        -v
    } else {
        v
    }
}

/// Total violation (for ranking while nothing is feasible): the number of
/// failed constraints first, then the objective.
fn violation(s: &Scored) -> usize {
    s.checks.iter().filter(|c| !c.0).count()
}

fn order(evaluated: &[Scored], obj: Objective) -> Vec<usize> {
    let mut ix: Vec<usize> = (0..evaluated.len()).collect();
    ix.sort_by(|&a, &b| {
        let (x, y) = (&evaluated[a], &evaluated[b]);
        violation(x)
            .cmp(&violation(y))
            .then(rank_key(x, obj).total_cmp(&rank_key(y, obj)))
            .then(x.median(P95).total_cmp(&y.median(P95)))
            .then(a.cmp(&b))
    });
    ix
}

/// The configurations of the grid stage, in evaluation order.
fn grid_configs(suite: &HostedSuite) -> Vec<Config> {
    let base = &suite.base;
    let mut workers: Vec<u32> = GRID_WORKERS.to_vec();
    workers.push(base.workers);
    workers.sort_unstable();
    workers.dedup();
    let mut mts: Vec<u64> = GRID_MAX_TOKENS_EIGHTHS
        .iter()
        .map(|e| (base.max_tokens * e / 8).max(1))
        .collect();
    mts.dedup();
    let mut grid = Vec::new();
    for p in PRESETS {
        for &w in &workers {
            for &mt in &mts {
                grid.push(Config::new(p.name, w, mt, &base.managed));
            }
        }
    }
    grid
}

/// The up-front work-budget estimate of the grid stage on `seeds` seeds,
/// leaning low like every up-front estimate (first tries only). The
/// run-time meter ([`qsim_sim::work`]) counts the retries and the refinement
/// (at most [`MAX_ROUNDS`] × [`REFINE_TOP`] × ~16 configurations near the
/// best, whose runs are no longer).
pub fn grid_cost(suite: &HostedSuite, seeds: u64) -> Cost {
    let mut c = Cost::default();
    for g in grid_configs(suite) {
        c.then(
            qsim_sim::experiment::budget::hosted_suite(&single(suite, g.experiment(suite)))
                .times(seeds as f64, "seeds"),
        );
    }
    c
}

/// Run the search.
pub fn search(
    suite: &HostedSuite,
    file: &str,
    obj_name: &str,
    cons: Vec<Constraint>,
    seed: u64,
    seeds: u64,
) -> Result<Recommendation, ConfigError> {
    let obj = objective(obj_name)?;
    let base = &suite.base;
    let rows = base.rows as f64;
    let score = |configs: Vec<Config>, ev: Vec<Evidence>| -> Vec<Scored> {
        configs
            .into_iter()
            .zip(ev)
            .map(|(config, evidence)| Scored {
                checks: cons.iter().map(|c| c.check(&evidence, rows)).collect(),
                config,
                evidence,
            })
            .collect()
    };
    let run = |configs: Vec<Config>| -> Vec<Scored> {
        let suites: Vec<HostedSuite> = configs
            .iter()
            .map(|c| single(suite, c.experiment(suite)))
            .collect();
        let ev = evaluate(&suites, seed, seeds);
        score(configs, ev)
    };

    // 1. the grid
    let grid = grid_configs(suite);
    let grid_size = grid.len();
    let mut evaluated = run(grid);
    let mut seen: std::collections::BTreeSet<String> =
        evaluated.iter().map(|s| s.config.label()).collect();

    // 2. local refinement
    let mut rounds = 0;
    let mut best = order(&evaluated, obj)[0];
    for _ in 0..MAX_ROUNDS {
        rounds += 1;
        let top: Vec<usize> = order(&evaluated, obj)
            .into_iter()
            .take(REFINE_TOP)
            .collect();
        let mut next = Vec::new();
        for i in top {
            for c in evaluated[i].config.neighbours() {
                if seen.insert(c.label()) {
                    next.push(c);
                }
            }
        }
        if next.is_empty() {
            break;
        }
        evaluated.extend(run(next));
        let b = order(&evaluated, obj)[0];
        if b == best {
            break;
        }
        best = b;
    }

    let ranked = order(&evaluated, obj);
    let winner = ranked.first().copied().filter(|&i| evaluated[i].feasible());
    let mut runner_ups = Vec::new();
    if let Some(w) = winner {
        let mut policies = vec![evaluated[w].config.policy];
        for &i in &ranked {
            let s = &evaluated[i];
            if s.feasible() && !policies.contains(&s.config.policy) {
                policies.push(s.config.policy);
                runner_ups.push(i);
            }
        }
    }

    // the file's own experiments, alone, on the same seeds
    let own: Vec<HostedSuite> = suite
        .experiments
        .iter()
        .map(|e| {
            single(
                suite,
                Experiment {
                    index: 0,
                    ..e.clone()
                },
            )
        })
        .collect();
    let ev = evaluate(&own, seed, seeds);
    let baselines = suite
        .experiments
        .iter()
        .zip(ev)
        .map(|(e, evidence)| {
            let workers = match &e.client {
                ClientKind::Pool { workers, .. } => *workers,
                ClientKind::Managed(p) => p.max as u32,
            };
            let config = Config {
                policy: "(file)",
                workers,
                max_tokens: e.max_tokens,
                client: ClientPolicy::Aimd,
                window: None,
            };
            let s = Scored {
                checks: cons.iter().map(|c| c.check(&evidence, rows)).collect(),
                config,
                evidence,
            };
            (e.name.clone(), s)
        })
        .collect();

    let front = pareto(&evaluated, &cons, rows);
    Ok(Recommendation {
        file: file.to_string(),
        seed,
        seeds,
        objective: metric_keys()
            .nth(obj.metric)
            .unwrap_or_default()
            .to_string()
            + if obj.maximise {
                " (median, maximised)"
            } else {
                " (median, minimised)"
            },
        constraints: cons,
        evaluated,
        rounds,
        grid_size,
        winner,
        runner_ups,
        baselines,
        front,
        rows,
        sdk_retries: base.sdk.is_some(),
        obj,
    })
}

/// The Pareto front of median elapsed vs median p95 among the
/// configurations meeting every constraint whose metric is neither.
fn pareto(evaluated: &[Scored], cons: &[Constraint], rows: f64) -> Vec<FrontPoint> {
    let axes = |c: &Constraint| {
        let m = c.lhs_metric();
        m == ELAPSED || m == P95
    };
    // (evaluation index, configuration): ties keep the earliest evaluated,
    // as the winner's ranking does
    let eligible: Vec<(usize, &Scored)> = evaluated
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            cons.iter()
                .filter(|c| !axes(c))
                .all(|c| c.check(&s.evidence, rows).0)
        })
        .collect();
    let dominated = |s: &Scored| {
        eligible.iter().any(|(_, o)| {
            let (e, p) = (o.median(ELAPSED), o.median(P95));
            e <= s.median(ELAPSED)
                && p <= s.median(P95)
                && (e < s.median(ELAPSED) || p < s.median(P95))
        })
    };
    let mut pts: Vec<(usize, &Scored)> = eligible
        .iter()
        .copied()
        .filter(|(_, s)| !dominated(s))
        .collect();
    pts.sort_by(|(i, a), (j, b)| {
        a.median(ELAPSED)
            .total_cmp(&b.median(ELAPSED))
            .then(a.median(P95).total_cmp(&b.median(P95)))
            .then(i.cmp(j))
    });
    pts.dedup_by(|(_, a), (_, b)| {
        a.median(ELAPSED) == b.median(ELAPSED) && a.median(P95) == b.median(P95)
    });
    pts.into_iter()
        .map(|(_, s)| FrontPoint {
            label: s.config.label(),
            elapsed_s: s.median(ELAPSED),
            p95_s: s.median(P95),
            meets_constraints: s.feasible(),
        })
        .collect()
}

// ---------------------------------------------------------------- reports

const SHOWN: &[(usize, &str, usize)] = &[
    (ELAPSED, "elapsed_s", 1),
    (OK, "ok", 0),
    (P50, "p50_s", 2),
    (P95, "p95_s", 2),
    (TRUNCATED, "truncated", 0),
    (HTTP_429, "http_429", 0),
];

fn cell(s: &Spread, d: usize) -> String {
    format!(
        "{} [{}–{}]",
        fmt_num_fixed(s.median, d),
        fmt_num_fixed(s.lo, d),
        fmt_num_fixed(s.hi, d)
    )
}

fn fmt_num_fixed(x: f64, d: usize) -> String {
    format!("{x:.d$}")
}

fn table_of(rows: &[(String, &Scored)]) -> String {
    let mut h = vec!["configuration".to_string()];
    h.extend(SHOWN.iter().map(|s| s.1.to_string()));
    h.push("meets".into());
    let mut t = Table::new(h);
    for (label, s) in rows {
        let mut r = vec![label.clone()];
        r.extend(
            SHOWN
                .iter()
                .map(|&(m, _, d)| cell(&s.evidence.spreads[m], d)),
        );
        let failed = s.checks.iter().filter(|c| !c.0).count();
        r.push(if failed == 0 {
            "yes".into()
        } else {
            format!("no ({failed} failed)")
        });
        t.row(r);
    }
    t.render()
}

impl Recommendation {
    fn runs(&self) -> u64 {
        (self.evaluated.len() + self.baselines.len()) as u64 * self.seeds
    }

    pub fn render_table(&self) -> String {
        let mut out = format!(
            "recommend for {}: {} seeds from {} per configuration, objective {}\n",
            self.file, self.seeds, self.seed, self.objective
        );
        out.push_str("constraints:\n");
        for c in &self.constraints {
            out.push_str(&format!(
                "  {}{}\n",
                c.text,
                if c.default { "  (default)" } else { "" }
            ));
        }
        out.push_str(&format!(
            "searched: a grid of {} configurations, then {} round(s) of local refinement: {} configurations, {} runs\n\n",
            self.grid_size,
            self.rounds,
            self.evaluated.len(),
            self.runs()
        ));
        if let Some(w) = self.winner {
            let s = &self.evaluated[w];
            out.push_str(&format!("winner: {}\n", s.config.label()));
            for (c, (_, how)) in self.constraints.iter().zip(&s.checks) {
                out.push_str(&format!("  {}: {how}\n", c.text));
            }
            out.push('\n');
            let mut rows = vec![(format!("winner: {}", s.config.label()), s)];
            for &i in &self.runner_ups {
                let r = &self.evaluated[i];
                rows.push((r.config.label(), r));
            }
            out.push_str("winner and the best configuration of each other policy (median [90% interval] over seeds):\n");
            out.push_str(&table_of(&rows));
        }
        out.push_str("\nthe file's own experiments, each alone on the same seeds:\n");
        let rows: Vec<(String, &Scored)> =
            self.baselines.iter().map(|(n, s)| (n.clone(), s)).collect();
        out.push_str(&table_of(&rows));
        out.push_str("\nPareto front, median elapsed vs median p95 (configurations meeting the other constraints):\n");
        let mut t = Table::new(["configuration", "elapsed_s", "p95_s", "meets all"]);
        for p in &self.front {
            t.row([
                p.label.clone(),
                fmt_num_fixed(p.elapsed_s, 1),
                fmt_num_fixed(p.p95_s, 2),
                if p.meets_constraints { "yes" } else { "no" }.to_string(),
            ]);
        }
        out.push_str(&t.render());
        if let Some(w) = self.winner {
            out.push_str("\nas an experiment:\n");
            out.push_str(&self.evaluated[w].config.toml(self.sdk_retries));
        }
        out
    }

    fn config_json(&self, s: &Scored, name: Option<&str>) -> Value {
        let mut metrics = serde_json::Map::new();
        for (i, key) in metric_keys().enumerate() {
            let sp = &s.evidence.spreads[i];
            metrics.insert(
                key.to_string(),
                json!({
                    "median": round(sp.median, 4),
                    "lo": round(sp.lo, 4),
                    "hi": round(sp.hi, 4),
                    "per_seed": s.evidence.per_seed.iter().map(|m| round(m[i], 4)).collect::<Vec<_>>(),
                }),
            );
        }
        let checks: Vec<Value> = self
            .constraints
            .iter()
            .zip(&s.checks)
            .map(|(c, (ok, how))| json!({"constraint": c.text, "holds": ok, "detail": how}))
            .collect();
        let mut v = json!({
            "meets_constraints": s.feasible(),
            "constraints": checks,
            "metrics": metrics,
        });
        match name {
            Some(n) => v["experiment"] = json!(n),
            None => {
                v["label"] = json!(s.config.label());
                v["policy"] = json!(s.config.policy);
                v["workers"] = json!(s.config.workers);
                v["max_tokens"] = json!(s.config.max_tokens);
                v["params"] = Value::Object(
                    s.config
                        .params()
                        .into_iter()
                        .map(|(k, x)| (k.to_string(), json!(round(x, 4))))
                        .collect(),
                );
                v["toml"] = json!(s.config.toml(self.sdk_retries));
            }
        }
        v
    }

    pub fn render_json(&self) -> Value {
        json!({
            "file": self.file,
            "seed": self.seed,
            "seeds": self.seeds,
            "objective": self.objective,
            "constraints": self.constraints.iter().map(|c| json!({"constraint": c.text, "default": c.default})).collect::<Vec<_>>(),
            "search": {
                "grid": self.grid_size,
                "refinement_rounds": self.rounds,
                "configurations": self.evaluated.len(),
                "runs": self.runs(),
            },
            "winner": self.winner.map(|w| self.config_json(&self.evaluated[w], None)),
            "runner_ups": self.runner_ups.iter().map(|&i| self.config_json(&self.evaluated[i], None)).collect::<Vec<_>>(),
            "baselines": self.baselines.iter().map(|(n, s)| self.config_json(s, Some(n))).collect::<Vec<_>>(),
            "pareto_front": self.front.iter().map(|p| json!({
                "label": p.label,
                "elapsed_s": round(p.elapsed_s, 4),
                "latency_p95_s": round(p.p95_s, 4),
                "meets_constraints": p.meets_constraints,
            })).collect::<Vec<_>>(),
        })
    }

    /// Why nothing qualifies: the closest configuration and what it fails.
    pub fn unmet(&self) -> String {
        // the fewest failed constraints, then the best objective
        let c = &self.evaluated[order(&self.evaluated, self.obj)[0]];
        let fails: Vec<String> = self
            .constraints
            .iter()
            .zip(&c.checks)
            .filter(|(_, (ok, _))| !ok)
            .map(|(k, (_, how))| format!("{} ({how})", k.text))
            .collect();
        format!(
            "{}: none of the {} configurations searched meets the constraints; the closest, {}, fails {}",
            self.file,
            self.evaluated.len(),
            c.config.label(),
            fails.join("; ")
        )
    }
}

/// `qsim recommend`.
pub fn run_cli(a: &RecommendArgs) -> Result<(), CliError> {
    let cons = constraints(&a.constraints)?;
    objective(&a.objective)?;
    if a.format == Format::Csv {
        return Err(CliError::Config(ConfigError::new(
            "--format csv",
            "",
            "qsim recommend writes a table or JSON",
        )));
    }
    if let Some(p) = &a.out {
        crate::output::check_target(p, a.force)?;
    }
    let targets = a.plots.targets(a.force);
    targets.check()?;
    let fname = a.file.display().to_string();
    let suite = match crate::cli::common::load_experiment(&a.file, &a.sets)? {
        ExperimentFile::Hosted(s) => s,
        _ => {
            return Err(CliError::Config(ConfigError::new(
                &fname,
                "kind",
                "qsim recommend searches a hosted experiment's client knobs: expected kind = \"hosted\"",
            )))
        }
    };
    grid_cost(&suite, a.seeds).check(&fname, &a.budget.budget())?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(a.threads.map_or(0, usize::from))
        .build()
        .map_err(|e| ConfigError::new("--threads", "", e.to_string()))?;
    let rec = pool.install(|| search(&suite, &fname, &a.objective, cons, a.seed, a.seeds))?;
    // the run-time work budget: a search it stopped decided nothing
    qsim_sim::work::check(&fname)?;
    if rec.winner.is_none() {
        return Err(CliError::Unmet(rec.unmet()));
    }
    let text = match a.format {
        Format::Json => json_text(&rec.render_json()),
        _ => rec.render_table(),
    };
    if targets.wanted() {
        let fig = pareto_figure(&rec);
        let intro = format!(
            "qsim recommend {}: {} configurations evaluated over {} seeds from seed {}",
            rec.file,
            rec.evaluated.len(),
            rec.seeds,
            rec.seed
        );
        crate::plot::write(
            &targets,
            "qsim recommend",
            &intro,
            Vec::new(),
            &[fig],
            Some(&rec.render_table()),
        )?;
    }
    emit(&text, a.out.as_deref(), a.force)
}

/// The Pareto scatter: every configuration that meets the constraints not on
/// its axes (median elapsed vs median p95), the front highlighted and
/// labelled, as in the table's "Pareto front".
fn pareto_figure(rec: &Recommendation) -> crate::plot::Fig {
    let points = rec
        .evaluated
        .iter()
        .filter(|s| {
            rec.constraints
                .iter()
                .filter(|c| {
                    let m = c.lhs_metric();
                    m != ELAPSED && m != P95
                })
                .all(|c| c.check(&s.evidence, rec.rows).0)
        })
        .map(|s| qsim_plot::ParetoPoint {
            label: s.config.label(),
            x: s.median(ELAPSED),
            y: s.median(P95),
        })
        .collect();
    crate::plot::Fig {
        name: "recommend-pareto".into(),
        caption: format!(
            "Configurations meeting the other constraints: median elapsed vs median p95 over {} seeds; the Pareto front highlighted",
            rec.seeds
        ),
        figure: qsim_plot::pareto(
            "qsim recommend: elapsed vs p95",
            "elapsed (s, median over seeds)",
            "latency p95 (s, median over seeds)",
            points,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_metric_positions_match_the_report() {
        for (i, key) in [
            (ELAPSED, "elapsed_s"),
            (OK, "ok"),
            (P50, "latency_p50_s"),
            (P95, "latency_p95_s"),
            (TRUNCATED, "truncated"),
            (HTTP_429, "http_429"),
        ] {
            assert_eq!(metric_keys().nth(i), Some(key));
        }
    }

    #[test]
    fn constraints_parse_and_refuse() {
        let c = Constraint::parse("ok>=200 in 95% of seeds").unwrap();
        assert_eq!(c.op, Op::Ge);
        assert_eq!(c.share, Some(0.95));
        assert_eq!(
            c.rhs,
            Term {
                k: 200.0,
                atom: Atom::Number
            }
        );
        let c = Constraint::parse("p95 <= 2*p50").unwrap();
        assert_eq!(c.lhs.atom, Atom::Metric(P95));
        assert_eq!(
            c.rhs,
            Term {
                k: 2.0,
                atom: Atom::Metric(P50)
            }
        );
        assert_eq!(c.share, None);
        let c = Constraint::parse("truncated<=0.01*rows").unwrap();
        assert_eq!(
            c.rhs,
            Term {
                k: 0.01,
                atom: Atom::Rows
            }
        );
        for bad in [
            "",
            "p95",
            "p99<=3",
            "200<=ok",
            "ok>=",
            "ok>=200 in 95 of seeds",
            "ok>=200 in 0% of seeds",
            "ok>=200 in 120% of seeds",
            "p95<=x*p50",
        ] {
            assert!(Constraint::parse(bad).is_err(), "{bad}");
        }
        // a given constraint replaces the default on its metric
        let all = constraints(&["p95<=3*p50".into()]).unwrap();
        assert_eq!(all.len(), 3);
        assert!(!all[0].default && all[1].default && all[2].default);
    }
}
