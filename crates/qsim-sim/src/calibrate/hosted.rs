//! `qsim calibrate hosted`: a hosted profile fitted to a `qsim replay`
//! attempt log (attempts.csv).
//!
//! What the fitter sees: per HTTP attempt its experiment, status, start,
//! TTFT (streamed replays), end and usage, plus the `max_tokens` the replay
//! sent (`--max-tokens`). Nothing else: no profile.
//!
//! **Quota.** One continuous token bucket (capacity C, refill r units/s,
//! full at each experiment's start: the replay's cool-down refills it) is
//! replayed along each experiment's observed events: at an attempt's start
//! the bucket admits iff its level covers the request's need (the charge
//! rules of `qsim_core::limiter::rates::LimitSpec`), the observed admissions
//! are charged, and at an admitted answer's end the accounting mode settles
//! (refund of `max_tokens − output`, nothing, or the output charged). The
//! loss of (C, r, mode) is the number of attempts whose observed status
//! (200 or 429) the bucket gets wrong. Candidate counters/modes: requests;
//! output tokens reserve_refund, reserve_no_refund, on_completion (input
//! tokens are not a candidate: a 429 carries no usage). The loss is
//! screened on a log grid, then on a finer grid; the mode with the
//! fewest is the binding one. Its (C, r) is then the maximum of a probit
//! likelihood (decisions near the bucket's edge flip with the client's
//! timing jitter) with a likelihood-ratio 95 % interval: see
//! [`fit_likelihood`].
//!
//! **Continuous bucket, core rules.** The charge and need at admission and
//! the settlement at completion are the core's own
//! (`LimitSpec::admit_charge`, `LimitSpec::settle`, through [`Mode::spec`]);
//! only the bucket's level is kept here, as an `f64` refilled at `r` per
//! second of the log's (fractional) seconds. The core's integer bucket
//! (`qsim_core::limiter::bucket`) holds whole units in integer nanoseconds
//! and admits iff `level >= need`; the continuous level differs from it by
//! less than one unit, far inside the decision noise σ the likelihood
//! fits, and a continuous level is what makes the likelihood smooth in
//! (C, r). A profile written from the fit is then simulated and served with
//! the core's integer bucket.
//!
//! **Latency.** Service time = TTFT + output × per-token time (the hosted
//! model), so per admitted streamed answer TTFT is observed and the
//! per-token time is (end − start − TTFT) / output. Each is fitted as a
//! lognormal by the mean and standard deviation of its logarithms (the
//! profile's `p50`/`p95` form); the 429's latency (end − start) likewise.
//! Intervals: 2.5–97.5 % percentiles of a bootstrap over the samples
//! (`--bootstrap` replicates, a seeded ChaCha stream: deterministic).

use crate::config::ConfigError;
use crate::engine::rng::{stream, unit, Rng};
use crate::hosted::HostedProfile;
use crate::limiter::rates::{Cost, Counts, LimitSpec, OutputAccounting};
use qsim_core::stats::quantile;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

/// What `qsim calibrate hosted` is asked (a plain spec).
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    /// The replay's attempt log (`qsim replay --out DIR` writes DIR/attempts.csv).
    pub log: PathBuf,
    /// The max_tokens the replay sent with every request.
    pub max_tokens: u64,
    /// How far (model seconds, either way) the endpoint's clock may be from
    /// the log's times.
    pub lag: f64,
    /// Bootstrap replicates for the latency intervals.
    pub bootstrap: u32,
    /// Seed of the bootstrap's resampling.
    pub seed: u64,
}

/// Read the log and fit the profile.
///
/// ```no_run
/// use qsim_sim::calibrate::hosted::{calibrate, Spec, DEFAULT_BOOTSTRAP};
/// let f = calibrate(&Spec {
///     log: "out/attempts.csv".into(),
///     max_tokens: 256,
///     lag: 0.1,
///     bootstrap: DEFAULT_BOOTSTRAP,
///     seed: 1,
/// })
/// .unwrap();
/// println!("{}", f.profile_toml("calibrated", "out/attempts.csv").unwrap());
/// ```
pub fn calibrate(spec: &Spec) -> Result<HostedFit, ConfigError> {
    let log = spec.log.display().to_string();
    if spec.max_tokens == 0 {
        return Err(ConfigError::new(
            "--max-tokens",
            "--max-tokens",
            "must be > 0",
        ));
    }
    if !(spec.lag >= 0.0 && spec.lag.is_finite()) {
        return Err(ConfigError::new(
            "--lag",
            "--lag",
            "must be a duration ≥ 0 in seconds",
        ));
    }
    let (obs, names, hint) = read_log(&spec.log)?;
    fit(
        obs,
        names,
        hint,
        spec.max_tokens,
        spec.lag,
        spec.bootstrap,
        spec.seed,
        &log,
    )
}

/// `--bootstrap`'s default. 1,000, not 200: with 200 the percentile
/// interval's own noise cost 0.8 point of the p50's coverage (93.7 % against
/// 94.5 %; see the test `intervals_cover_the_truth_95_percent_of_the_time`),
/// and a replicate costs ~200 additions per latency.
pub const DEFAULT_BOOTSTRAP: u32 = 1000;

/// One answered HTTP attempt.
#[derive(Debug, Clone)]
pub struct Obs {
    pub exp: usize,
    pub start: f64,
    pub end: f64,
    pub admitted: bool,
    pub ttft: Option<f64>,
    pub output: u64,
}

/// A quota model: what one admitted request is charged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Requests,
    ReserveRefund,
    ReserveNoRefund,
    OnCompletion,
}

impl Mode {
    pub const ALL: [Mode; 4] = [
        Mode::Requests,
        Mode::ReserveRefund,
        Mode::ReserveNoRefund,
        Mode::OnCompletion,
    ];
    pub fn counts(self) -> &'static str {
        match self {
            Mode::Requests => "requests",
            _ => "output_tokens",
        }
    }
    pub fn accounting(self) -> Option<&'static str> {
        match self {
            Mode::Requests => None,
            Mode::ReserveRefund => Some("reserve_refund"),
            Mode::ReserveNoRefund => Some("reserve_no_refund"),
            Mode::OnCompletion => Some("on_completion"),
        }
    }
    pub fn label(self) -> String {
        match self.accounting() {
            None => "requests".into(),
            Some(a) => format!("output_tokens {a}"),
        }
    }
    /// The mode as the core's limit (its counter and accounting; the size
    /// and window play no part in charges).
    pub fn spec(self) -> LimitSpec {
        let (counts, accounting) = match self {
            Mode::Requests => (Counts::Requests, OutputAccounting::default()),
            Mode::ReserveRefund => (Counts::OutputTokens, OutputAccounting::ReserveRefund),
            Mode::ReserveNoRefund => (Counts::OutputTokens, OutputAccounting::ReserveNoRefund),
            Mode::OnCompletion => (Counts::OutputTokens, OutputAccounting::OnCompletion),
        };
        LimitSpec {
            name: self.label(),
            counts,
            limit: 1,
            window: 1,
            accounting,
        }
    }
    /// (charge at admission, need to admit): `LimitSpec::admit_charge`.
    fn admit(self, max_tokens: u64) -> (f64, f64) {
        let (charge, need) = self.spec().admit_charge(Cost {
            input_tokens: 0,
            max_tokens,
        });
        (charge as f64, need as f64)
    }
    /// Net level change at completion (refund minus extra charge):
    /// `LimitSpec::settle`.
    fn settle(self, max_tokens: u64, output: u64) -> f64 {
        let (refund, extra) = self.spec().settle(
            Cost {
                input_tokens: 0,
                max_tokens,
            },
            output,
        );
        refund as f64 - extra as f64
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Arrive(u32),
    Complete(u32),
}

/// The observations as per-experiment event timelines.
pub struct Timeline {
    obs: Vec<Obs>,
    exps: Vec<Vec<(f64, Ev)>>,
    max_tokens: u64,
}

impl Timeline {
    /// `lag`: the server sees an attempt `lag` after its logged start and
    /// an answer's end `lag` before its logged end (either may be < 0).
    pub fn new(obs: Vec<Obs>, max_tokens: u64, lag: f64) -> Self {
        let n_exp = obs.iter().map(|o| o.exp + 1).max().unwrap_or(0);
        let mut exps: Vec<Vec<(f64, Ev)>> = vec![Vec::new(); n_exp];
        for (i, o) in obs.iter().enumerate() {
            exps[o.exp].push((o.start + lag, Ev::Arrive(i as u32)));
            if o.admitted {
                exps[o.exp].push((o.end - lag, Ev::Complete(i as u32)));
            }
        }
        for e in &mut exps {
            // Completions before arrivals at the same instant (a refund is
            // visible to the next decision), then by attempt order.
            e.sort_by(|a, b| {
                let k = |x: &(f64, Ev)| match x.1 {
                    Ev::Complete(i) => (0, i),
                    Ev::Arrive(i) => (1, i),
                };
                a.0.total_cmp(&b.0).then(k(a).cmp(&k(b)))
            });
        }
        Timeline {
            obs,
            exps,
            max_tokens,
        }
    }

    /// Replay the bucket (c, r, mode) over every experiment's timeline:
    /// `arrive(i, level, admitted?)` at each attempt, before the
    /// attempt's charge (an admitted attempt is charged, a completion
    /// refunded as the mode settles).
    fn replay(&self, c: f64, r: f64, mode: Mode, mut arrive: impl FnMut(u32, f64, bool)) {
        let (charge, _) = mode.admit(self.max_tokens);
        for evs in &self.exps {
            let Some(first) = evs.first() else { continue };
            let mut level = c;
            let mut last = first.0;
            for &(t, ev) in evs {
                level = (level + r * (t - last)).min(c);
                last = t;
                match ev {
                    Ev::Arrive(i) => {
                        let admitted = self.obs[i as usize].admitted;
                        arrive(i, level, admitted);
                        if admitted {
                            level -= charge;
                        }
                    }
                    Ev::Complete(i) => {
                        level += mode.settle(self.max_tokens, self.obs[i as usize].output);
                    }
                }
            }
        }
    }

    /// The attempts (indices) the bucket (c, r, mode) classifies wrongly.
    pub fn misses(&self, c: f64, r: f64, mode: Mode, out: &mut Vec<u32>) {
        out.clear();
        let (_, need) = mode.admit(self.max_tokens);
        self.replay(c, r, mode, |i, level, admitted| {
            if (level + 1e-9 >= need) != admitted {
                out.push(i);
            }
        });
    }

    /// The mean start time of the attempts (their experiment's clock).
    pub fn mean_arrival(&self) -> f64 {
        let n = self.obs.len().max(1) as f64;
        self.obs.iter().map(|o| o.start).sum::<f64>() / n
    }

    /// (level − need, admitted?) at every attempt, the level replayed as in
    /// [`misses`](Self::misses).
    pub fn margins(&self, c: f64, r: f64, mode: Mode, out: &mut Vec<(f64, bool)>) {
        out.clear();
        let (_, need) = mode.admit(self.max_tokens);
        self.replay(c, r, mode, |_, level, admitted| {
            out.push((level - need, admitted))
        });
    }

    /// Units one experiment consumed, net, and its span (for the search box).
    fn consumption(&self, mode: Mode) -> (f64, f64) {
        let (charge, _) = mode.admit(self.max_tokens);
        let mut best = (0.0f64, 1.0f64);
        for evs in &self.exps {
            let (Some(a), Some(b)) = (evs.first(), evs.last()) else {
                continue;
            };
            let mut used = 0.0;
            for &(_, ev) in evs {
                match ev {
                    Ev::Arrive(i) if self.obs[i as usize].admitted => used += charge,
                    Ev::Complete(i) => {
                        used -= mode.settle(self.max_tokens, self.obs[i as usize].output)
                    }
                    _ => {}
                }
            }
            if used > best.0 {
                best = (used, (b.0 - a.0).max(1e-3));
            }
        }
        best
    }
}

/// A grid over (C, r): its points and the attempts each gets wrong.
struct Grid {
    pts: Vec<(f64, f64)>,
    misses: Vec<Vec<u32>>,
}

impl Grid {
    fn eval(tl: &Timeline, mode: Mode, cs: &[f64], rs: &[f64]) -> Grid {
        let mut pts = Vec::with_capacity(cs.len() * rs.len());
        let mut misses = Vec::with_capacity(cs.len() * rs.len());
        let mut buf = Vec::new();
        for &c in cs {
            for &r in rs {
                tl.misses(c, r, mode, &mut buf);
                buf.sort_unstable();
                pts.push((c, r));
                misses.push(buf.clone());
            }
        }
        Grid { pts, misses }
    }
    fn loss(&self) -> Vec<u64> {
        self.misses.iter().map(|m| m.len() as u64).collect()
    }
    /// The points not significantly worse than the first minimiser θ̂ by
    /// McNemar's test on the paired per-attempt outcomes: with b attempts
    /// misclassified only at θ and c only at θ̂, θ stays while
    /// b − c ≤ 1.96·√(b + c) (the two explain the same attempts equally
    /// well within sampling noise at the 5 % level).
    fn confidence_set(&self) -> Vec<(f64, f64)> {
        let loss = self.loss();
        let Some(best) = (0..loss.len()).min_by_key(|&i| (loss[i], i)) else {
            return Vec::new();
        };
        let m0 = &self.misses[best];
        self.pts
            .iter()
            .zip(&self.misses)
            .filter(|(_, m)| {
                let common = sorted_common(m, m0) as f64;
                let b = m.len() as f64 - common;
                let c = m0.len() as f64 - common;
                b - c <= 1.96 * (b + c).sqrt()
            })
            .map(|(p, _)| *p)
            .collect()
    }
    /// The minimising points.
    fn argmin(&self, loss: &[u64]) -> (u64, Vec<(f64, f64)>) {
        let min = loss.iter().copied().min().unwrap_or(0);
        let set = self
            .pts
            .iter()
            .zip(loss)
            .filter(|(_, &l)| l == min)
            .map(|(p, _)| *p)
            .collect();
        (min, set)
    }
}

/// Size of the intersection of two sorted lists.
fn sorted_common(a: &[u32], b: &[u32]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(&b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

fn log_space(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|k| lo * (hi / lo).powf(k as f64 / (n - 1) as f64))
        .collect()
}
fn lin_space(lo: f64, hi: f64, n: usize) -> Vec<f64> {
    (0..n)
        .map(|k| lo + (hi - lo) * k as f64 / (n - 1) as f64)
        .collect()
}
fn bounds(set: &[(f64, f64)]) -> ((f64, f64), (f64, f64)) {
    let f = |g: &dyn Fn(&(f64, f64)) -> f64| {
        set.iter()
            .map(g)
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(x), b.max(x))
            })
    };
    (f(&|p| p.0), f(&|p| p.1))
}
fn centroid(set: &[(f64, f64)]) -> (f64, f64) {
    let n = set.len().max(1) as f64;
    (
        set.iter().map(|p| p.0).sum::<f64>() / n,
        set.iter().map(|p| p.1).sum::<f64>() / n,
    )
}

const N: usize = 41;

/// The fitted bucket for one mode.
pub struct QuotaFit {
    pub mode: Mode,
    /// Attempts the bucket at the estimate classifies wrongly (level ≥ need).
    pub misclassified: u64,
    pub attempts: usize,
    pub capacity: f64,
    pub refill: f64,
    /// The decision noise (units of the bucket) at the estimate.
    pub sigma: f64,
    /// −log-likelihood at the estimate.
    pub nll: f64,
    pub capacity_ci: (f64, f64),
    pub refill_ci: (f64, f64),
    /// The box the likelihood is searched in: (C range, r range).
    search: ((f64, f64), (f64, f64)),
}

/// Screen one mode by the misclassification count: a log grid, then a
/// linear grid around its minimisers; the box of the McNemar set there is
/// where [`fit_likelihood`] searches.
pub fn fit_quota(tl: &Timeline, mode: Mode) -> QuotaFit {
    let (used, span) = tl.consumption(mode);
    let (_, need) = mode.admit(tl.max_tokens);
    let c_lo = need.max(1.0) * 0.5;
    let c_hi = (used * 1.5).max(c_lo * 4.0);
    let rate = (used / span).max(1e-3);
    let (r_lo, r_hi) = (rate / 50.0, rate * 5.0);
    let grid = Grid::eval(
        tl,
        mode,
        &log_space(c_lo, c_hi, N),
        &log_space(r_lo, r_hi, N),
    );
    let step = (
        (c_hi / c_lo).powf(1.0 / (N - 1) as f64),
        (r_hi / r_lo).powf(1.0 / (N - 1) as f64),
    );
    let ((c0, c1), (r0, r1)) = bounds(&grid.argmin(&grid.loss()).1);
    let grid = Grid::eval(
        tl,
        mode,
        &lin_space(
            (c0 / step.0.powi(2)).max(c_lo * 0.5),
            c1 * step.0.powi(2),
            N,
        ),
        &lin_space(r0 / step.1.powi(2), r1 * step.1.powi(2), N),
    );
    let (min, set) = grid.argmin(&grid.loss());
    let (capacity, refill) = centroid(&set);
    let search = bounds(&grid.confidence_set());
    QuotaFit {
        mode,
        misclassified: min,
        attempts: tl.obs.len(),
        capacity,
        refill,
        sigma: f64::NAN,
        nll: f64::NAN,
        capacity_ci: search.0,
        refill_ci: search.1,
        search,
    }
}

/// log Φ(x), the standard normal's log CDF.
fn log_phi(x: f64) -> f64 {
    if x < -30.0 {
        return -0.5 * x * x - (-x).ln() - 0.918_938_533_204_672_8;
    }
    // erfc by Numerical Recipes' Chebyshev fit (relative error < 1.2e-7).
    let z = (-x / std::f64::consts::SQRT_2).abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -z * z - 1.265_512_23
        + t * (1.000_023_68
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_98
                                + t * (1.488_515_87 + t * (-0.822_152_23 + t * 0.170_872_77))))))));
    let erfc_z = t * poly.exp();
    let erfc = if x <= 0.0 { erfc_z } else { 2.0 - erfc_z };
    (0.5 * erfc).ln()
}

/// The probit model's −log-likelihood of the decisions given the margins
/// (level − need at each attempt, admitted?) and the noise σ.
/// A fraction `eps` of decisions are outliers (a coin flip): the attempts
/// no threshold explains (a connection held back, a refund seen late).
fn nll(margins: &[(f64, bool)], sigma: f64, eps: f64) -> f64 {
    margins
        .iter()
        .map(|&(m, ok)| {
            let p = log_phi(if ok { m } else { -m } / sigma).exp();
            -(0.5 * eps + (1.0 - eps) * p).ln()
        })
        .sum()
}

/// −log-likelihood minimised over σ (golden section on log σ).
fn profile_sigma(margins: &[(f64, bool)], lo: f64, hi: f64, eps: f64) -> (f64, f64) {
    let g = 0.618_033_988_749_894_9;
    let (mut a, mut b) = (lo.ln(), hi.ln());
    let f = |x: f64| nll(margins, x.exp(), eps);
    let (mut x1, mut x2) = (b - g * (b - a), a + g * (b - a));
    let (mut f1, mut f2) = (f(x1), f(x2));
    for _ in 0..18 {
        if f1 < f2 {
            b = x2;
            x2 = x1;
            f2 = f1;
            x1 = b - g * (b - a);
            f1 = f(x1);
        } else {
            a = x1;
            x1 = x2;
            f1 = f2;
            x2 = a + g * (b - a);
            f2 = f(x2);
        }
    }
    if f1 < f2 {
        (f1, x1.exp())
    } else {
        (f2, x2.exp())
    }
}

/// The maximum-likelihood bucket for the screened mode, and its interval.
///
/// Observed times are the client's, so decisions near the bucket's edge
/// flip with delivery jitter. Model: an attempt is admitted with
/// probability Φ((level − need)/σ), the level replayed as in
/// [`Timeline::misses`]; σ (the decision noise in bucket units) is profiled
/// out. The 95 % interval of C and of r is the range, on the finest grid,
/// of the likelihood-ratio confidence region
/// {(C, r): 2·(ℓ̂ − ℓ_profile(C, r)) ≤ 5.99} (χ² with 2 degrees of freedom,
/// so the projection on each axis is conservative). Two passes: over the
/// screening's McNemar box, then over the region's box widened by a step.
pub fn fit_likelihood(tl: &Timeline, fit: &mut QuotaFit) {
    let (_, need) = fit.mode.admit(tl.max_tokens);
    let (s_lo, s_hi) = (need.max(1.0) * 1e-3, need.max(1.0) * 10.0);
    let mut boxed = fit.search;
    // The outlier rate: the share of attempts the screening's best
    // threshold rule leaves unexplained (at least 0.1 %).
    let eps = (fit.misclassified as f64 / fit.attempts.max(1) as f64).clamp(1e-3, 0.5);
    let mut margins = Vec::new();
    for _ in 0..2 {
        let widen = |(a, b): (f64, f64)| {
            let w = (b - a).max(a.abs() * 0.01);
            ((a - w * 0.25).max(a * 0.5), b + w * 0.25)
        };
        let (cr, rr) = (widen(boxed.0), widen(boxed.1));
        let cs = lin_space(cr.0, cr.1, N);
        let rs = lin_space(rr.0, rr.1, N);
        let mut pts = Vec::with_capacity(N * N);
        for &c in &cs {
            for &r in &rs {
                tl.margins(c, r, fit.mode, &mut margins);
                let (l, s) = profile_sigma(&margins, s_lo, s_hi, eps);
                pts.push((c, r, l, s));
            }
        }
        let best = pts
            .iter()
            .copied()
            .min_by(|a, b| a.2.total_cmp(&b.2))
            .unwrap_or((fit.capacity, fit.refill, f64::NAN, f64::NAN));
        let region: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| 2.0 * (p.2 - best.2) <= 5.991)
            .map(|p| (p.0, p.1))
            .collect();
        boxed = bounds(&region);
        fit.capacity = best.0;
        fit.refill = best.1;
        fit.nll = best.2;
        fit.sigma = best.3;
        // At the grid's resolution: one step beyond the region each side.
        let (dc, dr) = (cs[1] - cs[0], rs[1] - rs[0]);
        fit.capacity_ci = (boxed.0 .0 - dc, boxed.0 .1 + dc);
        fit.refill_ci = (boxed.1 .0 - dr, boxed.1 .1 + dr);
    }
    // The level at time t is ≈ C + r·t − (known), so C and r trade along a
    // thin valley a (C, r) grid undersamples: the interval comes from a last
    // grid over (L = C + r·t̄, r) around the estimate, t̄ the mean attempt time.
    let tbar = tl.mean_arrival();
    let l_hat = fit.capacity + fit.refill * tbar;
    let hw = (20.0 * fit.sigma).max(0.002 * l_hat);
    let ls = lin_space(l_hat - hw, l_hat + hw, N);
    let rs = lin_space(fit.refill * 0.97, fit.refill * 1.03, N);
    let mut pts = Vec::with_capacity(N * N);
    for &l in &ls {
        for &r in &rs {
            tl.margins((l - r * tbar).max(1e-9), r, fit.mode, &mut margins);
            let (nll, s) = profile_sigma(&margins, s_lo, s_hi, eps);
            pts.push((l, r, nll, s));
        }
    }
    if let Some(best) = pts.iter().copied().min_by(|a, b| a.2.total_cmp(&b.2)) {
        if best.2 < fit.nll {
            fit.capacity = best.0 - best.1 * tbar;
            fit.refill = best.1;
            fit.nll = best.2;
            fit.sigma = best.3;
        }
        let (dl, dr) = (ls[1] - ls[0], rs[1] - rs[0]);
        let cvals: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| 2.0 * (p.2 - fit.nll) <= 5.991)
            .flat_map(|p| {
                [(-1.0, -1.0), (-1.0, 1.0), (1.0, -1.0), (1.0, 1.0)]
                    .map(|(a, b)| ((p.0 + a * dl) - (p.1 + b * dr) * tbar, p.1 + b * dr))
            })
            .collect();
        if !cvals.is_empty() {
            let (c, r) = bounds(&cvals);
            fit.capacity_ci = (fit.capacity_ci.0.min(c.0), fit.capacity_ci.1.max(c.1));
            fit.refill_ci = (fit.refill_ci.0.min(r.0), fit.refill_ci.1.max(r.1));
        }
    }
    let mut m = Vec::new();
    tl.misses(fit.capacity, fit.refill, fit.mode, &mut m);
    fit.misclassified = m.len() as u64;
}

/// Resample counts for `n` items.
fn resample(rng: &mut Rng, n: usize, w: &mut Vec<u32>) {
    w.clear();
    w.resize(n, 0);
    for _ in 0..n {
        let i = ((unit(rng) * n as f64) as usize).min(n - 1);
        w[i] += 1;
    }
}

/// A lognormal fitted by its log-moments, as the profile's p50/p95.
#[derive(Debug, Clone, Copy)]
pub struct LogNormalFit {
    pub n: usize,
    pub p50: f64,
    pub p95: f64,
    pub p50_ci: (f64, f64),
    pub p95_ci: (f64, f64),
}

const Z95: f64 = 1.644_853_626_951_472_2;

fn lognormal_quantiles(logs: &[f64], w: Option<&[u32]>) -> (f64, f64) {
    let (mut s, mut s2, mut n) = (0.0, 0.0, 0.0);
    for (i, &x) in logs.iter().enumerate() {
        let k = w.map_or(1.0, |w| w[i] as f64);
        s += k * x;
        s2 += k * x * x;
        n += k;
    }
    let mu = s / n;
    let var = if n > 1.0 {
        ((s2 - n * mu * mu) / (n - 1.0)).max(0.0)
    } else {
        0.0
    };
    (mu.exp(), (mu + Z95 * var.sqrt()).exp())
}

pub fn fit_lognormal(xs: &[f64], b: u32, rng: &mut Rng) -> Option<LogNormalFit> {
    let logs: Vec<f64> = xs.iter().filter(|x| **x > 0.0).map(|x| x.ln()).collect();
    if logs.len() < 2 {
        return None;
    }
    let (p50, p95) = lognormal_quantiles(&logs, None);
    let (mut a, mut c) = (Vec::new(), Vec::new());
    let mut w = Vec::new();
    for _ in 0..b {
        resample(rng, logs.len(), &mut w);
        let (x, y) = lognormal_quantiles(&logs, Some(&w));
        a.push(x);
        c.push(y);
    }
    let ci = |v: &mut Vec<f64>, x: f64| {
        if v.is_empty() {
            (x, x)
        } else {
            {
                v.sort_by(f64::total_cmp);
                (quantile(v, 0.025), quantile(v, 0.975))
            }
        }
    };
    Some(LogNormalFit {
        n: logs.len(),
        p50,
        p95,
        p50_ci: ci(&mut a, p50),
        p95_ci: ci(&mut c, p95),
    })
}

/// Everything `calibrate hosted` reports.
pub struct HostedFit {
    pub quota: QuotaFit,
    pub candidates: Vec<(Mode, u64)>,
    pub ttft: LogNormalFit,
    pub tpot: LogNormalFit,
    pub reject: Option<LogNormalFit>,
    pub admitted: usize,
    pub rejected: usize,
    pub experiments: Vec<String>,
    pub hint_seen: bool,
}

/// Read attempts.csv into observations (status 200 / 429 only).
pub fn read_log(path: &std::path::Path) -> Result<(Vec<Obs>, Vec<String>, bool), ConfigError> {
    let file = path.display().to_string();
    let err = |field: &str, reason: String| ConfigError::new(&file, field, reason);
    let bytes = crate::input::load_data(path).map_err(|e| err("", e))?;
    let mut rd = csv::Reader::from_reader(bytes.as_slice());
    let headers = rd
        .headers()
        .map_err(|e| err("--log", e.to_string()))?
        .clone();
    let col = |name: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            err(
                name,
                "missing column (a `qsim replay` attempts.csv?)".into(),
            )
        })
    };
    let (ce, cs, cst, ct, cend, cout, chint) = (
        col("experiment")?,
        col("status")?,
        col("start_s")?,
        col("ttft_s")?,
        col("end_s")?,
        col("output_tokens")?,
        col("retry_hint_s")?,
    );
    let mut names: Vec<String> = Vec::new();
    let mut obs = Vec::new();
    let mut hint_seen = false;
    for (k, rec) in rd.records().enumerate() {
        let line = k + 2;
        let rec = rec.map_err(|e| err(&format!("line {line}"), e.to_string()))?;
        let f = |c: usize| rec.get(c).unwrap_or("").trim();
        let num = |c: usize, name: &str| -> Result<Option<f64>, ConfigError> {
            let s = f(c);
            if s.is_empty() {
                return Ok(None);
            }
            s.parse::<f64>()
                .ok()
                .filter(|x| x.is_finite())
                .map(Some)
                .ok_or_else(|| {
                    err(
                        &format!("line {line}.{name}"),
                        format!("not a number: {s:?}"),
                    )
                })
        };
        let status = num(cs, "status")?;
        let admitted = match status.map(|s| s as u32) {
            Some(200) => true,
            Some(429) => false,
            _ => continue,
        };
        if !f(chint).is_empty() {
            hint_seen = true;
        }
        let start = num(cst, "start_s")?
            .ok_or_else(|| err(&format!("line {line}.start_s"), "missing".into()))?;
        let end = num(cend, "end_s")?
            .ok_or_else(|| err(&format!("line {line}.end_s"), "missing".into()))?;
        let output = num(cout, "output_tokens")?;
        if admitted && output.is_none() {
            return Err(err(
                &format!("line {line}.output_tokens"),
                "missing for an admitted (200) attempt".into(),
            ));
        }
        let name = f(ce).to_string();
        let exp = match names.iter().position(|n| *n == name) {
            Some(i) => i,
            None => {
                names.push(name);
                names.len() - 1
            }
        };
        obs.push(Obs {
            exp,
            start,
            end,
            admitted,
            ttft: num(ct, "ttft_s")?,
            output: output.unwrap_or(0.0) as u64,
        });
    }
    Ok((obs, names, hint_seen))
}

/// The whole fit (the quota's candidates, the binding one's likelihood, the
/// latencies) from the log's observations.
#[allow(clippy::too_many_arguments)]
pub fn fit(
    obs: Vec<Obs>,
    experiments: Vec<String>,
    hint_seen: bool,
    max_tokens: u64,
    lag: f64,
    bootstrap: u32,
    seed: u64,
    file: &str,
) -> Result<HostedFit, ConfigError> {
    let admitted = obs.iter().filter(|o| o.admitted).count();
    let rejected = obs.len() - admitted;
    if admitted == 0 {
        return Err(ConfigError::new(
            file,
            "status",
            "no admitted (200) attempt to fit",
        ));
    }
    let ttfts: Vec<f64> = obs
        .iter()
        .filter(|o| o.admitted)
        .filter_map(|o| o.ttft)
        .collect();
    let tpots: Vec<f64> = obs
        .iter()
        .filter(|o| o.admitted && o.output > 0)
        .filter_map(|o| o.ttft.map(|t| (o.end - o.start - t) / o.output as f64))
        .collect();
    let rejects: Vec<f64> = obs
        .iter()
        .filter(|o| !o.admitted)
        .map(|o| o.end - o.start)
        .collect();
    let tl = Timeline::new(obs.clone(), max_tokens, 0.0);
    // Every candidate is screened and then fitted by likelihood; the
    // candidates compare by the attempts they misclassify at their fitted
    // (capacity, refill). The screening grid's minimum alone is coarse:
    // in a round-trip log the true mode's was 104 against 110 for two
    // others (and once 121 against 108, the wrong pick), where the fits
    // give 14 against 115-120.
    let mut fits: Vec<QuotaFit> = Mode::ALL
        .iter()
        .map(|&m| {
            // fit_likelihood leaves the misses at its estimate
            let mut f = fit_quota(&tl, m);
            fit_likelihood(&tl, &mut f);
            f
        })
        .collect();
    let candidates = fits.iter().map(|f| (f.mode, f.misclassified)).collect();
    // Fewest misclassified; ties keep Mode::ALL's order.
    let best = (0..fits.len())
        .min_by_key(|&i| (fits[i].misclassified, i))
        .unwrap_or(0);
    let mut quota = fits.swap_remove(best);
    if lag > 0.0 {
        // The same fit with the server's clock `lag` behind and ahead of the
        // client's; the interval covers all three.
        let uni = |a: (f64, f64), b: (f64, f64)| (a.0.min(b.0), a.1.max(b.1));
        for l in [lag, -lag] {
            let tl2 = Timeline::new(obs.clone(), max_tokens, l);
            let mut q2 = fit_quota(&tl2, quota.mode);
            fit_likelihood(&tl2, &mut q2);
            if std::env::var_os("QSIM_CAL_DEBUG").is_some() {
                eprintln!(
                    "lag {l}: C {} {:?} r {} {:?} sigma {} miss {}",
                    q2.capacity,
                    q2.capacity_ci,
                    q2.refill,
                    q2.refill_ci,
                    q2.sigma,
                    q2.misclassified
                );
            }
            quota.capacity_ci = uni(quota.capacity_ci, q2.capacity_ci);
            quota.refill_ci = uni(quota.refill_ci, q2.refill_ci);
        }
        let mut m = Vec::new();
        tl.misses(quota.capacity, quota.refill, quota.mode, &mut m);
        quota.misclassified = m.len() as u64;
    }
    let mut rng = stream(seed, 0, 0x_ca1b);
    let need = |v: Option<LogNormalFit>, field: &str| {
        v.ok_or_else(|| {
            ConfigError::new(
                file,
                field,
                "fewer than 2 admitted attempts with a TTFT (replay with --stream)",
            )
        })
    };
    let ttft = need(fit_lognormal(&ttfts, bootstrap, &mut rng), "ttft_s")?;
    let tpot = need(fit_lognormal(&tpots, bootstrap, &mut rng), "tpot_s")?;
    let reject = fit_lognormal(&rejects, bootstrap, &mut rng);
    Ok(HostedFit {
        quota,
        candidates,
        ttft,
        tpot,
        reject,
        admitted,
        rejected,
        experiments,
        hint_seen,
    })
}

fn short(x: f64) -> String {
    if x.abs() >= 100.0 {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.3}")
    } else {
        format!("{x:.5}")
    }
}

impl HostedFit {
    /// The fitted profile as TOML (with the fit's error and intervals as
    /// comments), checked by the profile loader before it is returned.
    pub fn profile_toml(&self, name: &str, log: &str) -> Result<String, ConfigError> {
        let q = &self.quota;
        let limit = q.capacity.round().max(1.0);
        let window = limit / q.refill;
        let mut s = String::new();
        let _ = writeln!(s, "# Fitted by `qsim calibrate hosted` from {log}:");
        let _ = writeln!(
            s,
            "# {} attempts ({} admitted, {} rejected) in {}.",
            q.attempts,
            self.admitted,
            self.rejected,
            self.experiments.join(", ")
        );
        let _ = writeln!(s, "kind = \"hosted\"");
        let _ = writeln!(s, "name = {:?}", name);
        let _ = writeln!(
            s,
            "description = \"fitted to a replay: {} limit {} per {:.1} s\"",
            q.mode.label(),
            limit,
            window
        );
        let _ = writeln!(
            s,
            "source = {:?}",
            format!("qsim calibrate hosted --log {log}")
        );
        let _ = writeln!(s);
        let _ = writeln!(
            s,
            "# Binding limit: {} (misclassified {} of {} attempts).",
            q.mode.label(),
            q.misclassified,
            q.attempts
        );
        let _ = writeln!(
            s,
            "# capacity {} (95 % CI {}–{}), refill {}/s (95 % CI {}–{}).",
            short(q.capacity),
            short(q.capacity_ci.0),
            short(q.capacity_ci.1),
            short(q.refill),
            short(q.refill_ci.0),
            short(q.refill_ci.1)
        );
        let _ = writeln!(
            s,
            "# Other candidates (misclassified attempts at their own fit):"
        );
        for (m, l) in &self.candidates {
            let _ = writeln!(s, "#   {}: {l}", m.label());
        }
        let _ = writeln!(s, "[[limits]]");
        let _ = writeln!(
            s,
            "name = {:?}",
            if q.mode == Mode::Requests {
                "requests"
            } else {
                "output tokens"
            }
        );
        let _ = writeln!(s, "counts = {:?}", q.mode.counts());
        let _ = writeln!(s, "limit = {limit}");
        let _ = writeln!(s, "window_s = {window:.6}");
        if let Some(a) = q.mode.accounting() {
            let _ = writeln!(s, "accounting = {a:?}");
        }
        let _ = writeln!(s);
        let _ = writeln!(s, "[rejection]");
        let _ = writeln!(
            s,
            "# {} (the log only says whether a hint was sent, not its shape).",
            if self.hint_seen {
                "the replay saw retry hints"
            } else {
                "no retry hint seen"
            }
        );
        let _ = writeln!(
            s,
            "hint = {:?}",
            if self.hint_seen {
                "retry_after_header"
            } else {
                "none"
            }
        );
        let rej = self.reject.unwrap_or(LogNormalFit {
            n: 0,
            p50: 0.01,
            p95: 0.02,
            p50_ci: (0.01, 0.01),
            p95_ci: (0.02, 0.02),
        });
        if self.reject.is_none() {
            let _ = writeln!(s, "# no 429 observed: a placeholder latency");
        }
        dist_line(&mut s, "latency", &rej);
        let _ = writeln!(s);
        let _ = writeln!(s, "[latency]");
        dist_line(&mut s, "ttft", &self.ttft);
        dist_line(&mut s, "tpot", &self.tpot);
        let v: toml::Value = toml::from_str(&s)
            .map_err(|e| ConfigError::new("fitted profile", "toml", e.to_string()))?;
        HostedProfile::from_value("fitted profile", v)?;
        Ok(s)
    }

    pub fn table(&self, log: &str) -> String {
        let q = &self.quota;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "calibrate hosted: {log}: {} attempts ({} admitted, {} rejected) in {}",
            q.attempts,
            self.admitted,
            self.rejected,
            self.experiments.join(", ")
        );
        let _ = writeln!(
            s,
            "\n{:<32} {:>13}",
            "quota model (at its fit)", "misclassified"
        );
        for (m, l) in &self.candidates {
            let mark = if *m == q.mode { "  <- binding" } else { "" };
            let _ = writeln!(s, "{:<32} {l:>13}{mark}", m.label());
        }
        let _ = writeln!(
            s,
            "\n{:<14} {:>10} {:>21}",
            "parameter", "fit", "95% interval"
        );
        let row = |s: &mut String, n: &str, x: f64, ci: (f64, f64)| {
            let _ = writeln!(
                s,
                "{n:<14} {:>10} {:>21}",
                short(x),
                format!("{}–{}", short(ci.0), short(ci.1)),
            );
        };
        row(&mut s, "capacity", q.capacity, q.capacity_ci);
        row(&mut s, "refill/s", q.refill, q.refill_ci);
        let _ = writeln!(
            s,
            "window_s       {:>10}\ndecision noise {:>10} (σ, bucket units)",
            short(q.capacity.round().max(1.0) / q.refill),
            short(q.sigma)
        );
        let _ = writeln!(
            s,
            "\n{:<14} {:>5} {:>10} {:>21} {:>10} {:>21}",
            "latency (s)", "n", "p50", "95% interval", "p95", "95% interval"
        );
        let lat = |s: &mut String, n: &str, f: &LogNormalFit| {
            let _ = writeln!(
                s,
                "{n:<14} {:>5} {:>10} {:>21} {:>10} {:>21}",
                f.n,
                short(f.p50),
                format!("{}–{}", short(f.p50_ci.0), short(f.p50_ci.1)),
                short(f.p95),
                format!("{}–{}", short(f.p95_ci.0), short(f.p95_ci.1))
            );
        };
        lat(&mut s, "ttft", &self.ttft);
        lat(&mut s, "tpot", &self.tpot);
        if let Some(r) = &self.reject {
            lat(&mut s, "429 latency", r);
        }
        s
    }

    pub fn json(&self) -> serde_json::Value {
        let q = &self.quota;
        let ln = |f: &LogNormalFit| {
            serde_json::json!({"n": f.n, "p50": f.p50, "p50_ci": [f.p50_ci.0, f.p50_ci.1],
                "p95": f.p95, "p95_ci": [f.p95_ci.0, f.p95_ci.1]})
        };
        let cands: BTreeMap<String, u64> = self
            .candidates
            .iter()
            .map(|(m, l)| (m.label(), *l))
            .collect();
        serde_json::json!({
            "attempts": q.attempts,
            "admitted": self.admitted,
            "rejected": self.rejected,
            "experiments": self.experiments,
            "quota": {
                "counts": q.mode.counts(),
                "accounting": q.mode.accounting(),
                "misclassified": q.misclassified,
                "candidates": cands,
                "capacity": q.capacity,
                "capacity_ci": [q.capacity_ci.0, q.capacity_ci.1],
                "sigma": q.sigma,
                "neg_log_likelihood": q.nll,
                "refill_per_s": q.refill,
                "refill_ci": [q.refill_ci.0, q.refill_ci.1],
            },
            "ttft_s": ln(&self.ttft),
            "tpot_s": ln(&self.tpot),
            "reject_latency_s": self.reject.as_ref().map(ln),
        })
    }
}

fn dist_line(s: &mut String, key: &str, f: &LogNormalFit) {
    // p95 must exceed p50 for the profile's lognormal.
    let p95 = f.p95.max(f.p50 * 1.000_001);
    let _ = writeln!(
        s,
        "{key} = {{ dist = \"lognormal\", p50 = {:.6e}, p95 = {:.6e} }}  # n {}, p50 95 % CI {:.4e}–{:.4e}, p95 95 % CI {:.4e}–{:.4e}",
        f.p50, p95, f.n, f.p50_ci.0, f.p50_ci.1, f.p95_ci.0, f.p95_ci.1
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::dist::std_normal;

    /// The intervals' coverage, measured: 4,000 samples of 200 draws (the
    /// round trip's admitted answers) from a lognormal with a known median
    /// and p95 (the spread of its per-token times), each fitted with the
    /// command's default 1,000 bootstrap replicates. A right 95 % interval
    /// holds the truth in 95 % of samples. A percentile bootstrap leans a
    /// little under: over 10,000 samples of another seed, 94.5 % for the
    /// p50 and 93.7 % for the p95 (with 200 replicates, the old default,
    /// 93.7 % and 93.2 % over 20,000). One binomial standard deviation is
    /// 0.36 point at 4,000 samples, so the bands below hold a right
    /// interval at any seed and fail one that is too narrow (a bootstrap
    /// that resamples too few, a 90 % interval) or off centre. Seeded: the
    /// same count every run.
    #[test]
    fn intervals_cover_the_truth_95_percent_of_the_time() {
        let (median, sigma, n, reps) = (0.0104f64, 0.295, 200, 4000);
        let p95 = median * (Z95 * sigma).exp();
        let mut draw = stream(7, 0, 0xc0de);
        let mut boot = stream(7, 0, 0xb007);
        let (mut p50_in, mut p95_in) = (0, 0);
        for _ in 0..reps {
            let xs: Vec<f64> = (0..n)
                .map(|_| median * (sigma * std_normal(&mut draw)).exp())
                .collect();
            let f = fit_lognormal(&xs, DEFAULT_BOOTSTRAP, &mut boot).unwrap();
            assert_eq!(f.n, n);
            p50_in += usize::from(f.p50_ci.0 <= median && median <= f.p50_ci.1);
            p95_in += usize::from(f.p95_ci.0 <= p95 && p95 <= f.p95_ci.1);
        }
        let (c50, c95) = (p50_in as f64 / reps as f64, p95_in as f64 / reps as f64);
        eprintln!("coverage: p50 {c50:.4}, p95 {c95:.4}");
        assert!((0.93..=0.965).contains(&c50), "p50 covered {c50}");
        assert!((0.92..=0.965).contains(&c95), "p95 covered {c95}");
    }
}
