//! `qsim recommend FILE`: search a hosted experiment's client knobs
//! (workers, max_tokens, the client policy and its parameters, the AIMD
//! window) for the configuration that is best on an objective under
//! constraints, with the evidence.
//!
//! The search (deterministic: the same inputs give the same output, whatever
//! the thread count):
//! 1. a grid: workers {4, 6, 8, 10, 12, 16, 24, 32, 48, 64} and the file's,
//!    max_tokens {1, 7/8, 3/4, 1/2} × the file's, every policy preset
//!    ([`crate::client::presets`]) at its preset parameters;
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

mod config;
mod constraint;
mod render;

use crate::client::presets::{ClientPolicy, PRESETS};
use crate::experiment::config::ClientKind;
pub use config::Config;
pub use constraint::{constraints, Constraint};
use constraint::{metric_keys, objective, Objective, ELAPSED, P95};
pub use constraint::{Evidence, DEFAULT_CONSTRAINTS};

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
/// constraints is a result too (`winner` is None; [`Recommendation::unmet`]
/// says why).
///
/// ```no_run
/// use qsim_sim::recommend::{recommend, Spec};
/// let rec = recommend(&Spec { seeds: 5, ..Spec::default() }).unwrap();
/// println!("{}", rec.render_table());
/// ```
pub fn recommend(spec: &Spec) -> Result<Recommendation, ConfigError> {
    let cons = constraints(&spec.constraints)?;
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
    grid_cost(&suite, spec.seeds).check(&fname, &spec.budget)?;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(spec.threads.unwrap_or(0))
        .build()
        .map_err(|e| ConfigError::new("--threads", "", e.to_string()))?;
    let rec =
        pool.install(|| search(&suite, &fname, &spec.objective, cons, spec.seed, spec.seeds))?;
    // the run-time work budget: a search it stopped decided nothing
    crate::work::check(&fname)?;
    Ok(rec)
}

// ---------------------------------------------------------------- evidence

pub(crate) fn one_run(suite: &HostedSuite, seed: u64) -> Vec<f64> {
    let mut r = Records::default();
    crate::report::hosted::records(&mut r, seed, &hosted::run_suite(suite, seed));
    let mut m = vec![0.0; crate::report::hosted::METRICS.len()];
    for rec in r.iter() {
        if let Some(i) = metric_keys().position(|k| k == rec.metric) {
            m[i] = rec.value;
        }
    }
    m
}

pub(crate) fn evidence(per_seed: Vec<Vec<f64>>) -> Evidence {
    let n = crate::report::hosted::METRICS.len();
    let spreads = (0..n)
        .map(|i| spread(&per_seed.iter().map(|m| m[i]).collect::<Vec<_>>()))
        .collect();
    Evidence { per_seed, spreads }
}

/// Run each suite on `seeds` seeds from `seed`, in parallel; results in order.
pub(crate) fn evaluate(suites: &[HostedSuite], seed: u64, seeds: u64) -> Vec<Evidence> {
    let jobs: Vec<(usize, u64)> = (0..suites.len())
        .flat_map(|i| (0..seeds).map(move |k| (i, k)))
        .collect();
    // the work budget's meter goes with every job to its thread
    let meter = crate::work::current();
    let runs: Vec<Vec<f64>> = jobs
        .par_iter()
        .map(|&(i, k)| {
            crate::work::enter(meter.clone(), || one_run(&suites[i], seed.wrapping_add(k)))
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

/// Total violation (for ranking while nothing is feasible): the number of
/// failed constraints first, then the objective.
pub(crate) fn violation(s: &Scored) -> usize {
    s.checks.iter().filter(|c| !c.0).count()
}

pub(crate) fn order(evaluated: &[Scored], obj: Objective) -> Vec<usize> {
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
pub(crate) fn grid_configs(suite: &HostedSuite) -> Vec<Config> {
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
/// run-time meter ([`crate::work`]) counts the retries and the refinement
/// (at most [`MAX_ROUNDS`] × [`REFINE_TOP`] × ~16 configurations near the
/// best, whose runs are no longer).
pub fn grid_cost(suite: &HostedSuite, seeds: u64) -> Cost {
    let mut c = Cost::default();
    for g in grid_configs(suite) {
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
                .all(|c| c.check(&s.evidence, self.rows).0)
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
