//! `qsim fleet`'s search: the cheapest fleet for a workload and SLOs.
//!
//! A layout is one pool for every request, or two pools split by request
//! length at a threshold (total tokens; vllm-sr-sim's `--b-short`), routed
//! by length (each request to the pool of its length: pools never share a
//! request, so each is sized on its own traffic). For each pool of a
//! layout and each candidate profile (a GPU type), the fewest replicas that
//! meet every SLO is found by simulation: doubling from one replica, then
//! bisection, every run with the same seed (common random numbers), each
//! run of about `requests` requests of that pool (the first 10 % of the
//! time left out of the percentiles). A run whose TTFT or E2E misses are
//! already more than 1 % of the requests it will measure stops there (it
//! misses whatever follows). The pool takes the cheapest candidate; the
//! layout costs the sum; the cheapest layout is the answer, and the whole
//! fleet is run once more with every pool at its size for the predicted
//! percentiles. Each pool says why it needs its size: what misses one
//! replica fewer.

use super::run::{run_observed, FleetResult, Observer, RunOpts};
use super::workload::{Len, Requests, Source, Workload};
use super::{FleetCompletion, FleetSpec, PoolSpec};
use crate::config::ConfigError;
use crate::server::ServerProfile;
use crate::time::{to_secs, Nanos};
use qsim_core::route::Policy;
use std::collections::BTreeMap;
use std::sync::Arc;

/// A candidate profile (a GPU type): what a replica is and costs.
#[derive(Debug, Clone)]
pub struct Candidate {
    pub label: String,
    pub profile: Arc<ServerProfile>,
    /// US dollars per replica-hour.
    pub price: f64,
}

/// The targets: P99s at or under these.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Slo {
    pub ttft_p99: Option<Nanos>,
    pub itl_p99: Option<Nanos>,
    pub e2e_p99: Option<Nanos>,
}

impl Slo {
    pub fn any(&self) -> bool {
        self.ttft_p99.is_some() || self.itl_p99.is_some() || self.e2e_p99.is_some()
    }
}

/// How requests are split between pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// One pool for every request.
    Single,
    /// Requests of at most this many tokens (input + output) to a short
    /// pool, the rest to a long one.
    Split(u64),
}

impl Layout {
    pub fn label(&self) -> String {
        match self {
            Layout::Single => "one pool".into(),
            Layout::Split(b) => format!("split at {b} tokens"),
        }
    }

    /// The pools: (name, tokens above, tokens at most).
    pub fn pools(&self) -> Vec<(&'static str, Option<u64>, Option<u64>)> {
        match *self {
            Layout::Single => vec![("all", None, None)],
            Layout::Split(b) => vec![("short", None, Some(b)), ("long", Some(b), None)],
        }
    }
}

/// A question for [`optimize`].
#[derive(Debug, Clone)]
pub struct Query {
    pub workload: Workload,
    pub slo: Slo,
    pub candidates: Vec<Candidate>,
    pub layouts: Vec<Layout>,
    /// How each pool spreads requests over its replicas.
    pub replica_policy: Policy,
    /// Requests per pool per run (open-loop workloads).
    pub requests: u64,
    pub seed: u64,
    /// The most replicas a pool may have.
    pub max_replicas: u32,
}

/// One run of one pool at a size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Eval {
    pub replicas: u32,
    /// P99s in seconds (NaN: nothing measured).
    pub ttft_p99: f64,
    pub itl_p99: f64,
    pub e2e_p99: f64,
    /// Requests measured (after the warm-up), and rejected (never servable).
    pub measured: u64,
    pub rejected: u64,
    /// Stopped early: already missing.
    pub stopped: bool,
}

impl Eval {
    /// What misses the SLO, if anything.
    pub fn misses(&self, slo: &Slo) -> Option<&'static str> {
        let over = |v: f64, t: Option<Nanos>| {
            t.is_some_and(|t| {
                // NaN counts as over
                !matches!(
                    v.partial_cmp(&to_secs(t)),
                    Some(std::cmp::Ordering::Less | std::cmp::Ordering::Equal)
                )
            })
        };
        if self.rejected > 0 {
            Some("rejected requests (longer than the profile serves)")
        } else if self.stopped {
            Some(if slo.ttft_p99.is_some() {
                "TTFT P99"
            } else {
                "E2E P99"
            })
        } else if self.measured == 0 {
            Some("no request measured")
        } else if over(self.ttft_p99, slo.ttft_p99) {
            Some("TTFT P99")
        } else if over(self.itl_p99, slo.itl_p99) {
            Some("ITL P99")
        } else if over(self.e2e_p99, slo.e2e_p99) {
            Some("E2E P99")
        } else {
            None
        }
    }
}

/// A pool of a layout, sized.
#[derive(Debug, Clone)]
pub struct PoolAnswer {
    pub name: String,
    pub above: Option<u64>,
    pub at_most: Option<u64>,
    /// Its share of the requests.
    pub share: f64,
    /// The cheapest candidate meeting the SLO, its replicas and its run.
    pub choice: Option<(usize, Eval)>,
    /// That candidate one replica fewer (what misses).
    pub below: Option<Eval>,
    /// What the search found for each candidate.
    pub found: Vec<Found>,
    /// Every run, (candidate, eval), in the order run.
    pub runs: Vec<(usize, Eval)>,
}

impl PoolAnswer {
    pub fn replicas(&self) -> u32 {
        self.choice.map_or(0, |c| c.1.replicas)
    }
}

/// A layout, sized.
#[derive(Debug, Clone)]
pub struct LayoutAnswer {
    pub layout: Layout,
    pub pools: Vec<PoolAnswer>,
    /// US dollars per hour, if every pool found a size.
    pub cost_per_hour: Option<f64>,
}

impl LayoutAnswer {
    pub fn replicas(&self) -> u32 {
        self.pools.iter().map(PoolAnswer::replicas).sum()
    }
}

/// The answer: every layout, the cheapest, and the cheapest fleet run whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub layouts: Vec<LayoutAnswer>,
    pub best: Option<usize>,
    /// The best layout's fleet and its run.
    pub fleet: Option<(FleetSpec, FleetResult)>,
}

impl Answer {
    pub fn best(&self) -> Option<&LayoutAnswer> {
        self.best.map(|i| &self.layouts[i])
    }
}

/// Counts the misses a run measures; asks it to stop once they exceed
/// what the P99 allows.
struct Misses {
    warmup: Nanos,
    ttft: Option<Nanos>,
    e2e: Option<Nanos>,
    allowed: u64,
    missed: u64,
}

impl Observer for Misses {
    fn completed(&mut self, c: &FleetCompletion) {
        let c = &c.c;
        if c.arrival < self.warmup {
            return;
        }
        let miss = c.rejected
            || self.ttft.is_some_and(|t| c.first_token - c.arrival > t)
            || self.e2e.is_some_and(|t| c.finished - c.arrival > t);
        self.missed += miss as u64;
    }
    fn stop(&self) -> bool {
        self.missed > self.allowed
    }
}

/// The open-loop arrival rate of the workload (requests per second), if
/// it has one.
pub fn rate(w: &Workload) -> Option<f64> {
    match &w.source {
        Source::Open { process, .. } => Some(process.rate),
        _ => None,
    }
}

/// The share of the workload's requests with `above < total <= at_most`
/// tokens: from a CDF's buckets, else counted over 200,000 draws.
pub fn share(w: &Workload, above: Option<u64>, at_most: Option<u64>, seed: u64) -> f64 {
    if above.is_none() && at_most.is_none() {
        return 1.0;
    }
    if let Source::Open {
        len: Len::Cdf { cdf, .. },
        prefix: None,
        ..
    } = &w.source
    {
        let hi = at_most.map_or(1.0, |m| cdf.fraction_below(m as f64));
        let lo = above.map_or(0.0, |m| cdf.fraction_below(m as f64));
        return (hi - lo).max(0.0);
    }
    let Ok(mut r) = Requests::new(w, seed, crate::time::NEVER - 1, 200_000) else {
        return 1.0;
    };
    let (mut n, mut k) = (0u64, 0u64);
    while let Some(a) = r.pop() {
        let t = a.input as u64 + a.output as u64;
        n += 1;
        k += (above.is_none_or(|m| t > m) && at_most.is_none_or(|m| t <= m)) as u64;
    }
    if n == 0 {
        0.0
    } else {
        k as f64 / n as f64
    }
}

/// The workload of a pool taking the requests of `above < total <=
/// at_most` tokens: from a CDF, only those (the CDF restricted to the
/// range, at the rate × the range's share: the same Poisson stream of the
/// pool's requests, thinned); else the whole workload (the pool's
/// requests among the others), and the share of it the pool sees then.
pub fn pool_workload(
    q: &Query,
    above: Option<u64>,
    at_most: Option<u64>,
    share: f64,
) -> (Workload, f64) {
    if let Source::Open {
        process,
        len: Len::Cdf { cdf, input_share },
        prefix: None,
    } = &q.workload.source
    {
        let c = |x: Option<u64>| x.map(|v| v.min(u32::MAX as u64) as u32);
        // thinning a Poisson stream by length gives a Poisson stream
        let poisson = process.kind == "poisson" && process.shape.is_none();
        if let (Some(r), true) = (cdf.restrict(c(above), c(at_most)), poisson && share > 0.0) {
            if let Ok(p) = crate::workload::ArrivalProcess::new(
                &crate::workload::RawArrivals::Poisson,
                process.rate * share,
            ) {
                let w = Workload {
                    source: Source::Open {
                        process: p,
                        len: Len::Cdf {
                            cdf: Arc::new(r),
                            input_share: *input_share,
                        },
                        prefix: None,
                    },
                    mix: q.workload.mix.clone(),
                };
                return (w, 1.0);
            }
        }
    }
    (q.workload.clone(), share)
}

/// The run options for a pool taking `share` of an open loop at `rate`:
/// about `requests` of its requests (10 % of the time warm-up).
fn run_opts_for(w: &Workload, requests: u64, share: f64) -> RunOpts {
    match rate(w) {
        Some(rate) => {
            let total = (requests as f64 / share.max(1e-6)).ceil().min(1e12);
            let secs = total / rate;
            RunOpts {
                warmup: crate::time::secs(secs * 0.1),
                max_requests: total as u64,
                ..RunOpts::new(crate::time::secs(secs))
            }
        }
        // a trace: all of it
        None => RunOpts::new(crate::time::NEVER - 1),
    }
}

/// The run options for the whole fleet.
fn run_opts(q: &Query, share: f64) -> RunOpts {
    match rate(&q.workload) {
        Some(rate) => {
            let total = (q.requests as f64 / share.max(1e-6)).ceil().min(1e12);
            let secs = total / rate;
            RunOpts {
                warmup: crate::time::secs(secs * 0.1),
                max_requests: total as u64,
                ..RunOpts::new(crate::time::secs(secs))
            }
        }
        // a trace: all of it
        None => RunOpts::new(crate::time::NEVER - 1),
    }
}

fn pool_spec(
    name: &str,
    c: &Candidate,
    n: u32,
    above: Option<u64>,
    at_most: Option<u64>,
    policy: &Policy,
) -> PoolSpec {
    PoolSpec {
        name: name.into(),
        profile: c.profile.clone(),
        profile_label: c.label.clone(),
        replicas: n,
        autoscale: None,
        policy: policy.clone(),
        models: vec![0],
        max_tokens: at_most,
        min_tokens: above,
        replica_hour_usd: c.price,
        prefix_cache: true,
        role: super::Role::Serve,
    }
}

/// Run one pool of `n` replicas of candidate `c` on its part of the
/// workload.
pub fn evaluate(
    q: &Query,
    c: &Candidate,
    n: u32,
    above: Option<u64>,
    at_most: Option<u64>,
    share: f64,
) -> Result<Eval, ConfigError> {
    let spec = FleetSpec {
        models: vec!["*".into()],
        pools: vec![pool_spec("pool", c, n, above, at_most, &q.replica_policy)],
        route: Policy::First,
        prefix_unit: q.workload.prefix_unit(),
    };
    let (w, share) = pool_workload(q, above, at_most, share);
    let opts = run_opts_for(&w, q.requests, share);
    let expected = match rate(&q.workload) {
        Some(_) => (q.requests as f64 * 0.9) as u64,
        None => u64::MAX / 200,
    };
    let mut obs = Misses {
        warmup: opts.warmup,
        ttft: q.slo.ttft_p99,
        e2e: q.slo.e2e_p99,
        allowed: if q.slo.ttft_p99.is_some() || q.slo.e2e_p99.is_some() {
            expected / 100
        } else {
            u64::MAX
        },
        missed: 0,
    };
    let r = run_observed(&spec, &w, opts, q.seed, &mut obs)?;
    let p = &r.pools[0];
    let q99 = |h: &crate::engine::DurationHist| {
        if h.count() == 0 {
            f64::NAN
        } else {
            h.quantile_s(0.99)
        }
    };
    Ok(Eval {
        replicas: n,
        ttft_p99: q99(&p.lat.ttft),
        itl_p99: q99(&p.metrics.itl),
        e2e_p99: q99(&p.lat.e2e),
        measured: p.lat.completed,
        rejected: p.lat.rejected,
        stopped: obs.stop(),
    })
}

/// What the search found for one candidate of one pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found {
    /// The fewest replicas meeting the SLO.
    Exact(u32),
    /// Meets at `hi`, misses at `lo`; not narrowed further: even `lo + 1`
    /// replicas would cost more than the pool's choice.
    Between(u32, u32),
    /// Misses up to this many replicas, and more would cost more than
    /// another candidate's.
    Over(u32),
    /// Never meets: it rejects requests (too long for it), or misses at
    /// the most replicas allowed.
    Never,
}

/// Size one pool of a layout over every candidate: doubling from one
/// replica for each (stopping once it would cost more than a size that
/// already meets), then bisection for those that can still be cheapest,
/// cheapest bound first.
fn size_pool(
    q: &Query,
    name: &str,
    above: Option<u64>,
    at_most: Option<u64>,
) -> Result<PoolAnswer, ConfigError> {
    let share = share(&q.workload, above, at_most, q.seed);
    let nc = q.candidates.len();
    let mut runs: Vec<BTreeMap<u32, Eval>> = vec![BTreeMap::new(); nc];
    let mut found = vec![Found::Never; nc];
    let mut all = Vec::new();
    let mut eval =
        |k: usize, n: u32, runs: &mut Vec<BTreeMap<u32, Eval>>| -> Result<Eval, ConfigError> {
            let e = evaluate(q, &q.candidates[k], n, above, at_most, share)?;
            runs[k].insert(n, e);
            all.push((k, e));
            Ok(e)
        };
    if share > 0.0 {
        // doubling, under the cheapest cost known to meet
        let mut bound = f64::INFINITY;
        #[allow(clippy::needless_range_loop)] // k indexes the candidates and what was found
        for k in 0..nc {
            let price = q.candidates[k].price;
            let (mut lo, mut hi) = (0u32, 1u32);
            loop {
                if hi as f64 * price >= bound && lo > 0 {
                    // `hi` would cost as much as a known fleet; `lo` misses
                    found[k] = Found::Over(lo);
                    break;
                }
                let e = eval(k, hi, &mut runs)?;
                if e.misses(&q.slo).is_none() {
                    found[k] = Found::Between(lo, hi);
                    bound = bound.min(hi as f64 * price);
                    break;
                }
                if e.rejected > 0 || hi >= q.max_replicas {
                    found[k] = Found::Never;
                    break;
                }
                lo = hi;
                hi = (hi * 2).min(q.max_replicas);
            }
        }
        // bisection, the cheapest possible first
        let mut order: Vec<usize> = (0..nc)
            .filter(|&k| matches!(found[k], Found::Between(..)))
            .collect();
        let least = |k: usize| match found[k] {
            Found::Between(lo, _) => (lo + 1) as f64 * q.candidates[k].price,
            _ => f64::INFINITY,
        };
        order.sort_by(|&a, &b| least(a).total_cmp(&least(b)).then(a.cmp(&b)));
        let mut best = f64::INFINITY;
        for k in order {
            let Found::Between(mut lo, mut hi) = found[k] else {
                continue;
            };
            let price = q.candidates[k].price;
            while hi - lo > 1 && (lo + 1) as f64 * price < best {
                let mid = lo + (hi - lo) / 2;
                if eval(k, mid, &mut runs)?.misses(&q.slo).is_none() {
                    hi = mid;
                } else {
                    lo = mid;
                }
            }
            found[k] = if hi - lo == 1 {
                best = best.min(hi as f64 * price);
                Found::Exact(hi)
            } else {
                Found::Between(lo, hi)
            };
        }
    }
    let exact = |k: usize| match found[k] {
        Found::Exact(n) => Some(n),
        _ => None,
    };
    let best = (0..nc)
        .filter_map(|k| exact(k).map(|n| (k, n, n as f64 * q.candidates[k].price)))
        .min_by(|a, b| a.2.total_cmp(&b.2).then(a.0.cmp(&b.0)));
    let choice = best.and_then(|(k, n, _)| runs[k].get(&n).map(|e| (k, *e)));
    let below = best.and_then(|(k, n, _)| n.checked_sub(1).and_then(|m| runs[k].get(&m).copied()));
    Ok(PoolAnswer {
        name: name.into(),
        above,
        at_most,
        share,
        choice,
        below,
        found,
        runs: all,
    })
}

/// Find the cheapest fleet.
pub fn optimize(q: &Query) -> Result<Answer, ConfigError> {
    let mut layouts = Vec::new();
    // a pool range shared by layouts (the single pool) is sized once
    let mut sized: BTreeMap<(Option<u64>, Option<u64>), PoolAnswer> = BTreeMap::new();
    for &l in &q.layouts {
        let mut pools = Vec::new();
        for (name, above, at_most) in l.pools() {
            let p = match sized.get(&(above, at_most)) {
                Some(p) => p.clone(),
                None => {
                    let p = size_pool(q, name, above, at_most)?;
                    sized.insert((above, at_most), p.clone());
                    p
                }
            };
            pools.push(PoolAnswer {
                name: name.into(),
                ..p
            });
        }
        let cost = pools
            .iter()
            .map(|p| {
                p.choice
                    .map(|(k, e)| e.replicas as f64 * q.candidates[k].price)
                    .or((p.share == 0.0).then_some(0.0))
            })
            .sum::<Option<f64>>();
        layouts.push(LayoutAnswer {
            layout: l,
            pools,
            cost_per_hour: cost,
        });
    }
    let best = layouts
        .iter()
        .enumerate()
        .filter_map(|(i, l)| l.cost_per_hour.map(|c| (i, c)))
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(i, _)| i);
    let fleet = match best {
        None => None,
        Some(i) => {
            let spec = fleet_of(q, &layouts[i]);
            let opts = run_opts(q, 1.0);
            let r = super::run::run(&spec, &q.workload, opts, q.seed)?;
            Some((spec, r))
        }
    };
    Ok(Answer {
        layouts,
        best,
        fleet,
    })
}

/// The fleet of a sized layout (its pools at their sizes, routed by length).
pub fn fleet_of(q: &Query, l: &LayoutAnswer) -> FleetSpec {
    FleetSpec {
        models: vec!["*".into()],
        pools: l
            .pools
            .iter()
            .filter_map(|p| {
                p.choice.map(|(k, e)| {
                    pool_spec(
                        &p.name,
                        &q.candidates[k],
                        e.replicas,
                        p.above,
                        p.at_most,
                        &q.replica_policy,
                    )
                })
            })
            .collect(),
        route: Policy::First,
        prefix_unit: q.workload.prefix_unit(),
    }
}
