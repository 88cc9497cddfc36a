//! `qsim recommend FILE`: search a hosted experiment's client knobs
//! (workers, max_tokens, the client policy and its parameters, the AIMD
//! window) for the configuration that is best on an objective under
//! constraints, with the evidence.
//!
//! The search (deterministic: the same inputs give the same output, whatever
//! the thread count):
//! 1. a grid: workers {4, 6, 8, 10, 12, 16, 24, 32, 48, 64} and the file's,
//!    max_tokens {1, 7/8, 3/4, 1/2} × the file's, every policy preset
//!    ([`crate::client::presets`]) that `--client` admits, at its preset
//!    parameters;
//! 2. when truncation binds (at the widest max_tokens evaluated, the best
//!    configuration under the other constraints fails a constraint on
//!    `truncated`), max_tokens widens above the
//!    file's: that configuration is probed at [`WIDEN_PROBES`] × the file's
//!    max_tokens (9/8 up to 4), and the grid's policies and workers run at
//!    the smallest probe where truncation holds (else the widest);
//! 3. local refinement, up to [`MAX_ROUNDS`] rounds: around the
//!    [`REFINE_TOP`] best configurations (the closest ones while none meets
//!    the constraints), every single-knob step: workers ±1, ±2, ±4;
//!    max_tokens ±16, and while truncation binds max_tokens ×
//!    [`WIDEN_MAX_TOKENS`] (5/4, 3/2, 2); each retry parameter (base, cap, jitter, delay) ×2 and ÷2
//!    (a constant delay ×1.5, ÷1.5), max_attempts ±2; the AIMD window's
//!    start ×2, ÷2, its increase ×2, ÷2 and its decrease factor ±0.1. A
//!    round that does not improve the best configuration ends the search.
//!
//! Configurations are ranked: those meeting every constraint first, by the
//! objective; the others by the number of constraints they fail, then by
//! how far they miss them ([`Check::gap`], relative, summed), then by the
//! objective. When none meets the constraints, the report shows the closest
//! configuration of each policy and names the binding constraint (the one
//! the closest configuration misses by most: when it fails one, the
//! constraint without which it would meet them all) and what to widen
//! ([`Binding`]).
//!
//! Every configuration runs the file's rows alone against the file's
//! endpoint on the same seeds (common random numbers), so differences
//! between configurations are not seed noise.

mod config;
mod constraint;
mod render;

use crate::client::presets::{ClientPolicy, PRESETS};
use crate::experiment::config::ClientKind;
pub use config::{Config, MAX_TOKENS_CEILING, WIDEN_MAX_TOKENS, WIDEN_PROBES};
pub use constraint::{constraints, Check, Constraint, Origin};
use constraint::{metric_keys, objective, Objective, ELAPSED, P95};
pub use constraint::{Evidence, DEFAULT_CONSTRAINTS, ZERO_FAILED};

use crate::budget::{Budget, Cost};
use crate::config::ConfigError;
use crate::experiment::config::Experiment;
use crate::experiment::{hosted, ExperimentFile, HostedSuite};
use crate::report::records::Records;
use crate::report::spread;
use rayon::prelude::*;
use std::path::PathBuf;

/// Rounds of local refinement at most.
pub const MAX_ROUNDS: usize = 4;
/// Configurations refined around in each round.
pub const REFINE_TOP: usize = 4;
/// The workers of the grid (plus the file's).
pub const GRID_WORKERS: &[u32] = &[4, 6, 8, 10, 12, 16, 24, 32, 48, 64];
/// The max_tokens of the grid, as fractions of the file's (eighths).
pub const GRID_MAX_TOKENS_EIGHTHS: &[u64] = &[8, 7, 6, 4];

/// Which clients the search considers (`--client`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClientChoice {
    /// Every preset: the thread-pool policies and the managed executor.
    #[default]
    Any,
    /// Thread pools only (every preset but `aimd`).
    Pool,
    /// The managed executor only (`aimd`).
    Managed,
}

impl ClientChoice {
    /// Does the search consider the preset `name`?
    pub fn admits(self, name: &str) -> bool {
        match self {
            ClientChoice::Any => true,
            ClientChoice::Pool => name != "aimd",
            ClientChoice::Managed => name == "aimd",
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            ClientChoice::Any => "any",
            ClientChoice::Pool => "pool",
            ClientChoice::Managed => "managed",
        }
    }
}

/// What `qsim recommend` is asked: a plain spec (the command line and the
/// Python package map their arguments to it).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// A hosted experiment file (`builtin:NAME` for an embedded one).
    pub file: PathBuf,
    /// `--set PATH=VALUE` overrides, applied to the file first.
    pub sets: Vec<String>,
    /// The metric to optimise (a median over seeds).
    pub objective: String,
    /// Constraint expressions (each replaces the default on its metric).
    pub constraints: Vec<String>,
    /// Every row succeeds in every seed ([`ZERO_FAILED`]; replaces the
    /// default on `ok`).
    pub zero_failed: bool,
    /// Drop [`DEFAULT_CONSTRAINTS`].
    pub no_default_constraints: bool,
    /// Which clients to search.
    pub client: ClientChoice,
    pub seed: u64,
    pub seeds: u64,
    /// Threads (None: all cores); the result is the same whatever the number.
    pub threads: Option<usize>,
    pub budget: Budget,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            file: PathBuf::from("builtin:experiments/fmapi-pacing.toml"),
            sets: Vec::new(),
            objective: "elapsed".into(),
            constraints: Vec::new(),
            zero_failed: false,
            no_default_constraints: false,
            client: ClientChoice::Any,
            seed: 1,
            seeds: 20,
            threads: None,
            budget: Budget::default(),
        }
    }
}

/// Run the search a spec asks for: load the file, check the grid stage
/// against the work budget, search (on `threads` threads), and check the
/// run-time budget. A search that found no configuration meeting the
/// constraints is a result too (`winner` is None, `closest` and `binding`
/// say how close it came; [`Recommendation::unmet`] says it in a line).
///
/// ```no_run
/// use qsim_sim::recommend::{recommend, Spec};
/// let rec = recommend(&Spec { seeds: 5, ..Spec::default() }).unwrap();
/// println!("{}", rec.render_table());
/// ```
pub fn recommend(spec: &Spec) -> Result<Recommendation, ConfigError> {
    let cons = constraints(
        &spec.constraints,
        spec.zero_failed,
        spec.no_default_constraints,
    )?;
    objective(&spec.objective)?;
    let fname = spec.file.display().to_string();
    let suite = match crate::experiment::load_file(&spec.file, &spec.sets)? {
        ExperimentFile::Hosted(s) => s,
        _ => {
            return Err(ConfigError::new(
                &fname,
                "kind",
                "qsim recommend searches a hosted experiment's client knobs: expected kind = \"hosted\"",
            ))
        }
    };
    grid_cost(&suite, spec.client, spec.seeds).check(&fname, &spec.budget)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(spec.threads.unwrap_or(0))
        .build()
        .map_err(|e| ConfigError::new("--threads", "", e.to_string()))?;
    let rec = pool.install(|| {
        search(
            &suite,
            &fname,
            &spec.objective,
            cons,
            spec.client,
            spec.seed,
            spec.seeds,
        )
    })?;
    // the run-time work budget: a search it stopped decided nothing
    crate::work::check(&fname)?;
    Ok(Recommendation {
        defaults_dropped: spec.no_default_constraints,
        ..rec
    })
}

// ---------------------------------------------------------------- evidence

/// The prefix of the records counting 429s per endpoint limit.
const LIMIT_429: &str = "http_429_by_limit.";

/// One run's metrics ([`crate::report::hosted::METRICS`] order) and its
/// 429s per endpoint limit (limit name, count; in the profile's order).
pub(crate) type RunFigures = (Vec<f64>, Vec<(String, f64)>);

/// One run's [`RunFigures`].
pub(crate) fn one_run(suite: &HostedSuite, seed: u64) -> RunFigures {
    let mut r = Records::default();
    crate::report::hosted::records(&mut r, seed, &hosted::run_suite(suite, seed));
    let mut m = vec![0.0; crate::report::hosted::METRICS.len()];
    let mut limits = Vec::new();
    for rec in r.iter() {
        if let Some(i) = metric_keys().position(|k| k == rec.metric) {
            m[i] = rec.value;
        } else if let Some(l) = rec.metric.strip_prefix(LIMIT_429) {
            limits.push((l.to_string(), rec.value));
        }
    }
    (m, limits)
}

pub(crate) fn evidence(per_seed: Vec<Vec<f64>>) -> Evidence {
    let n = crate::report::hosted::METRICS.len();
    let spreads = (0..n)
        .map(|i| spread(&per_seed.iter().map(|m| m[i]).collect::<Vec<_>>()))
        .collect();
    Evidence {
        per_seed,
        spreads,
        limit_429: Vec::new(),
    }
}

/// The median over seeds of each limit's 429s (the limits as the first
/// seed lists them).
fn limit_medians(per_seed: &[Vec<(String, f64)>]) -> Vec<(String, f64)> {
    let Some(first) = per_seed.first() else {
        return Vec::new();
    };
    first
        .iter()
        .map(|(name, _)| {
            let v: Vec<f64> = per_seed
                .iter()
                .map(|l| l.iter().find(|x| &x.0 == name).map_or(0.0, |x| x.1))
                .collect();
            (name.clone(), spread(&v).median)
        })
        .collect()
}

/// Run each suite on `seeds` seeds from `seed`, in parallel; results in order.
pub(crate) fn evaluate(suites: &[HostedSuite], seed: u64, seeds: u64) -> Vec<Evidence> {
    let jobs: Vec<(usize, u64)> = (0..suites.len())
        .flat_map(|i| (0..seeds).map(move |k| (i, k)))
        .collect();
    // the work budget's meter goes with every job to its thread
    let meter = crate::work::current();
    let runs: Vec<RunFigures> = jobs
        .par_iter()
        .map(|&(i, k)| {
            crate::work::enter(meter.clone(), || one_run(&suites[i], seed.wrapping_add(k)))
        })
        .collect();
    let mut it = runs.into_iter();
    suites
        .iter()
        .map(|_| {
            let (metrics, limits): (Vec<_>, Vec<_>) = it.by_ref().take(seeds as usize).unzip();
            let mut ev = evidence(metrics);
            ev.limit_429 = limit_medians(&limits);
            ev
        })
        .collect()
}

/// An evaluated configuration.
#[derive(Debug, Clone)]
pub struct Scored {
    pub config: Config,
    pub evidence: Evidence,
    /// Per constraint: holds, how, and by how much it misses.
    pub checks: Vec<Check>,
}

impl Scored {
    pub fn feasible(&self) -> bool {
        self.checks.iter().all(|c| c.holds)
    }
    /// The number of constraints it fails.
    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.holds).count()
    }
    /// How far it is from meeting every constraint: the misses summed (0
    /// when it meets them all).
    pub fn shortfall(&self) -> f64 {
        self.checks.iter().map(|c| c.gap).sum()
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

/// Why no configuration meets the constraints, and what to widen.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// Index into [`Recommendation::constraints`]: the constraint the
    /// closest configuration misses by most.
    pub constraint: usize,
    /// How the closest configuration misses it (its check, and for a
    /// seed-by-seed constraint the seed where it misses most).
    pub detail: String,
    /// The parameter to widen (a knob of the file or the endpoint, or the
    /// constraint's bound), in words with the flag that does it.
    pub widen: String,
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
    /// When truncation bound after the grid: the max_tokens the search
    /// widened to and the configurations it ran for it (probes and grid).
    pub widened: Option<(u64, usize)>,
    /// Indices into `evaluated`: the winner, then the best of each other policy.
    pub winner: Option<usize>,
    pub runner_ups: Vec<usize>,
    /// When no configuration meets the constraints: the closest
    /// configuration of each policy, closest first (indices into
    /// `evaluated`); empty when there is a winner.
    pub closest: Vec<usize>,
    /// When no configuration meets the constraints: the binding one.
    pub binding: Option<Binding>,
    /// When the winner is the managed executor (`aimd`): the best thread-pool
    /// configuration searched (the closest pool settings), if any was.
    pub pool_alternative: Option<usize>,
    /// Which clients were searched.
    pub client: ClientChoice,
    /// Whether `--no-default-constraints` dropped the defaults.
    pub defaults_dropped: bool,
    /// The file's own experiments, each run alone on the same seeds.
    pub baselines: Vec<(String, Scored)>,
    /// Pareto-optimal configurations (median elapsed vs median p95) among
    /// those meeting every constraint that is not on elapsed or p95, by
    /// elapsed.
    pub front: Vec<FrontPoint>,
    /// The rows of the experiment (the `rows` term of constraints).
    pub rows: f64,
    pub sdk_retries: bool,
    /// The file's SDK retry layer (None when `sdk_retries` is off).
    pub sdk: Option<crate::client::policy::SdkRetry>,
}

pub(crate) fn single(suite: &HostedSuite, e: Experiment) -> HostedSuite {
    let mut s = suite.clone();
    s.experiments = vec![e];
    s
}

pub(crate) fn rank_key(s: &Scored, obj: Objective) -> f64 {
    let v = s.median(obj.metric);
    if obj.maximise {
        -v
    } else {
        v
    }
}

/// The ranking: by the number of constraints failed (0 for every
/// configuration meeting them), then the shortfall (how far they miss),
/// then the objective, the median p95 and the evaluation order.
pub(crate) fn order(evaluated: &[Scored], obj: Objective) -> Vec<usize> {
    let mut ix: Vec<usize> = (0..evaluated.len()).collect();
    ix.sort_by(|&a, &b| {
        let (x, y) = (&evaluated[a], &evaluated[b]);
        x.failed()
            .cmp(&y.failed())
            .then(x.shortfall().total_cmp(&y.shortfall()))
            .then(rank_key(x, obj).total_cmp(&rank_key(y, obj)))
            .then(x.median(P95).total_cmp(&y.median(P95)))
            .then(a.cmp(&b))
    });
    ix
}

/// Does truncation bind? At the widest max_tokens evaluated, the best
/// configuration under the other constraints (the smallest shortfall on
/// them, then the objective) fails a constraint on `truncated`: its index.
pub(crate) fn truncation_binds(
    evaluated: &[Scored],
    cons: &[Constraint],
    obj: Objective,
) -> Option<usize> {
    let trunc = |k: usize| cons[k].lhs_metric() == constraint::TRUNCATED;
    if !(0..cons.len()).any(trunc) {
        return None;
    }
    let widest = evaluated.iter().map(|s| s.config.max_tokens).max()?;
    let others = |s: &Scored| -> f64 {
        (0..cons.len())
            .filter(|&k| !trunc(k))
            .map(|k| s.checks[k].gap)
            .sum()
    };
    let best = (0..evaluated.len())
        .filter(|&i| evaluated[i].config.max_tokens == widest)
        .min_by(|&a, &b| {
            let (x, y) = (&evaluated[a], &evaluated[b]);
            others(x)
                .total_cmp(&others(y))
                .then(rank_key(x, obj).total_cmp(&rank_key(y, obj)))
                .then(a.cmp(&b))
        })?;
    (0..cons.len())
        .any(|k| trunc(k) && !evaluated[best].checks[k].holds)
        .then_some(best)
}

/// The configurations of the grid stage, in evaluation order.
pub(crate) fn grid_configs(suite: &HostedSuite, client: ClientChoice) -> Vec<Config> {
    let mut mts: Vec<u64> = GRID_MAX_TOKENS_EIGHTHS
        .iter()
        .map(|e| (suite.base.max_tokens * e / 8).max(1))
        .collect();
    mts.dedup();
    grid_at(suite, client, &mts)
}

/// Every admitted preset × the grid's workers × `mts`.
fn grid_at(suite: &HostedSuite, client: ClientChoice, mts: &[u64]) -> Vec<Config> {
    let base = &suite.base;
    let mut workers: Vec<u32> = GRID_WORKERS.to_vec();
    workers.push(base.workers);
    workers.sort_unstable();
    workers.dedup();
    let mut grid = Vec::new();
    for p in PRESETS.iter().filter(|p| client.admits(p.name)) {
        for &w in &workers {
            for &mt in mts {
                grid.push(Config::new(p.name, w, mt, &base.managed));
            }
        }
    }
    grid
}

/// The up-front work-budget estimate of the grid stage on `seeds` seeds,
/// leaning low like every up-front estimate (first tries only). The
/// run-time meter ([`crate::work`]) counts the retries and the refinement
/// (at most [`MAX_ROUNDS`] × [`REFINE_TOP`] × ~16 configurations near the
/// best, whose runs are no longer).
pub fn grid_cost(suite: &HostedSuite, client: ClientChoice, seeds: u64) -> Cost {
    let mut c = Cost::default();
    for g in grid_configs(suite, client) {
        c.then(
            crate::experiment::budget::hosted_suite(&single(suite, g.experiment(suite)))
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
    client: ClientChoice,
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

    let truncation_fails = |s: &Scored| {
        cons.iter()
            .zip(&s.checks)
            .any(|(c, k)| c.lhs_metric() == constraint::TRUNCATED && !k.holds)
    };

    // 1. the grid
    let grid = grid_configs(suite, client);
    let grid_size = grid.len();
    let mut evaluated = run(grid);
    let mut seen: std::collections::BTreeSet<String> =
        evaluated.iter().map(|s| s.config.label()).collect();

    // 2. truncation binds after the grid: probe the configuration it binds
    // at wider max_tokens, then run the grid's policies and workers at the
    // smallest probe where truncation holds (else the widest)
    let mut widened = None;
    if let Some(best) = truncation_binds(&evaluated, &cons, obj) {
        let probes: Vec<Config> = WIDEN_PROBES
            .iter()
            .map(|&(num, den)| (base.max_tokens * num / den).min(MAX_TOKENS_CEILING))
            .filter(|&mt| mt > base.max_tokens)
            .map(|mt| Config {
                max_tokens: mt,
                ..evaluated[best].config.clone()
            })
            .filter(|c| seen.insert(c.label()))
            .collect();
        let n_probes = probes.len();
        let probed = run(probes);
        let mt = probed
            .iter()
            .find(|s| !truncation_fails(s))
            .or(probed.last())
            .map(|s| s.config.max_tokens);
        evaluated.extend(probed);
        if let Some(mt) = mt {
            let grid: Vec<Config> = grid_at(suite, client, &[mt])
                .into_iter()
                .filter(|c| seen.insert(c.label()))
                .collect();
            let n = n_probes + grid.len();
            evaluated.extend(run(grid));
            widened = Some((mt, n));
        }
    }

    // 3. local refinement
    let mut rounds = 0;
    let mut best = order(&evaluated, obj)[0];
    for _ in 0..MAX_ROUNDS {
        rounds += 1;
        let top: Vec<usize> = order(&evaluated, obj)
            .into_iter()
            .take(REFINE_TOP)
            .collect();
        let widen = truncation_binds(&evaluated, &cons, obj).is_some();
        let mut next = Vec::new();
        for i in top {
            for c in evaluated[i].config.neighbours(widen) {
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
    // the best of each policy, in rank order
    let mut per_policy: Vec<usize> = Vec::new();
    for &i in &ranked {
        let p = evaluated[i].config.policy;
        if !per_policy.iter().any(|&j| evaluated[j].config.policy == p) {
            per_policy.push(i);
        }
    }
    let (runner_ups, closest) = match winner {
        Some(_) => (
            per_policy
                .iter()
                .copied()
                .skip(1)
                .filter(|&i| evaluated[i].feasible())
                .collect(),
            Vec::new(),
        ),
        None => (Vec::new(), per_policy),
    };
    let pool_alternative = winner
        .filter(|&w| evaluated[w].config.is_managed())
        .and_then(|_| {
            ranked
                .iter()
                .copied()
                .find(|&i| !evaluated[i].config.is_managed())
        });

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
    let binding = closest
        .first()
        .map(|&c| binding(&evaluated, c, &cons, rows, suite, seed));
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
        widened,
        winner,
        runner_ups,
        closest,
        binding,
        pool_alternative,
        client,
        defaults_dropped: false,
        baselines,
        front,
        rows,
        sdk_retries: base.sdk.is_some(),
        sdk: base.sdk.clone(),
    })
}

/// The binding constraint of the closest configuration `c` (the one it
/// misses by most) and what to widen.
fn binding(
    evaluated: &[Scored],
    c: usize,
    cons: &[Constraint],
    rows: f64,
    suite: &HostedSuite,
    seed: u64,
) -> Binding {
    let s = &evaluated[c];
    let k = (0..cons.len())
        .filter(|&k| !s.checks[k].holds)
        .max_by(|&a, &b| s.checks[a].gap.total_cmp(&s.checks[b].gap).then(b.cmp(&a)))
        .unwrap_or(0);
    let con = &cons[k];
    let mut detail = s.checks[k].detail.clone();
    if let Some((k, a, b)) = con.worst_seed(&s.evidence, rows) {
        detail.push_str(&format!(
            "; in its worst seed ({}) {} is {} against {}",
            seed.wrapping_add(k as u64),
            con.metric(),
            constraint::fmt_num(a, 3),
            constraint::fmt_num(b, 3)
        ));
    }
    // the endpoint limit behind most of its 429s, if it saw any
    let limit = s
        .evidence
        .limit_429
        .iter()
        .filter(|l| l.1 > 0.0)
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|l| l.0.clone());
    let raise_limit = |what: &str| {
        match &limit {
        Some(l) => format!(
            "the endpoint's {l} limit (behind most of its 429s; --set endpoint.limits.{l}.limit=N) or {what}"
        ),
        None => what.to_string(),
    }
    };
    let max_mt = evaluated
        .iter()
        .map(|e| e.config.max_tokens)
        .max()
        .unwrap_or(0);
    let max_att = evaluated
        .iter()
        .filter_map(|e| {
            e.config
                .params()
                .into_iter()
                .find(|p| p.0 == "max_attempts")
                .map(|p| p.1 as u64)
        })
        .max()
        .unwrap_or(1);
    let widen = match con.metric() {
        "truncated" => format!(
            "max_tokens: rows are cut at max_tokens; the search tried up to {max_mt} (the file's {}; --set max_tokens=N starts it higher), or the constraint's bound",
            suite.base.max_tokens
        ),
        "ok" | "rejected_429" | "failed_other" => raise_limit(&format!(
            "the constraint's share of seeds; rows fail when their attempts run out (the search tried up to {max_att} attempts a row)"
        )),
        "elapsed_s" | "throughput_rows_per_s" | "own_wait_s" | "max_wait_s" => {
            raise_limit("the constraint's bound")
        }
        _ => format!(
            "the constraint's bound{}",
            if con.origin == Origin::Default {
                " (a default: replace it with a constraint on the same metric, or drop the defaults with --no-default-constraints)"
            } else {
                ""
            }
        ),
    };
    Binding {
        constraint: k,
        detail,
        widen,
    }
}

/// The Pareto front of median elapsed vs median p95 among the
/// configurations meeting every constraint whose metric is neither.
pub(crate) fn pareto(evaluated: &[Scored], cons: &[Constraint], rows: f64) -> Vec<FrontPoint> {
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
                .all(|c| c.check(&s.evidence, rows).holds)
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

impl Recommendation {
    /// The configurations the Pareto figure shows: those meeting every
    /// constraint not on its axes (elapsed, p95).
    pub fn pareto_candidates(&self) -> impl Iterator<Item = &Scored> + '_ {
        self.evaluated.iter().filter(move |s| {
            self.constraints
                .iter()
                .filter(|c| {
                    let m = c.lhs_metric();
                    m != ELAPSED && m != P95
                })
                .all(|c| c.check(&s.evidence, self.rows).holds)
        })
    }
}

impl Scored {
    /// Median elapsed seconds over the seeds.
    pub fn median_elapsed(&self) -> f64 {
        self.median(ELAPSED)
    }
    /// Median p95 latency (s) over the seeds.
    pub fn median_p95(&self) -> f64 {
        self.median(P95)
    }
}
