//! The fit: Nelder–Mead over the coefficients' logarithms (each a factor
//! of its base value), a weighted least squares of log ratios; then each
//! coefficient's profile likelihood, and the coefficients the data do not
//! pin down fixed at their base values (see the [module docs](super)).

use super::bench::{field_err, Bench, Means};
use super::coefs::Coefs;
use super::sim::{predict, predict_full};
use crate::config::ConfigError;
use crate::server::ServerProfile;
use serde::Serialize;
use std::sync::Arc;

/// Minimise `f` by Nelder–Mead (reflection 1, expansion 2, contraction ½,
/// shrink ½; Lagarias et al. 1998) from `x0` with initial steps `step`
/// along each axis, for at most `max_evals` evaluations or until the
/// simplex's values agree to `ftol` and its points to `xtol`.
/// Deterministic. Returns (best point, its value, evaluations).
pub fn nelder_mead(
    f: &mut dyn FnMut(&[f64]) -> f64,
    x0: &[f64],
    step: f64,
    max_evals: u32,
    ftol: f64,
    xtol: f64,
) -> (Vec<f64>, f64, u32) {
    let n = x0.len();
    let mut evals = 0u32;
    let mut eval = |x: &[f64], evals: &mut u32| {
        *evals += 1;
        let y = f(x);
        if y.is_nan() {
            f64::INFINITY
        } else {
            y
        }
    };
    if n == 0 {
        let y = eval(x0, &mut evals);
        return (Vec::new(), y, evals);
    }
    let mut pts: Vec<(Vec<f64>, f64)> = Vec::with_capacity(n + 1);
    let y0 = eval(x0, &mut evals);
    pts.push((x0.to_vec(), y0));
    for i in 0..n {
        let mut x = x0.to_vec();
        x[i] += step;
        let y = eval(&x, &mut evals);
        pts.push((x, y));
    }
    let comb = |a: &[f64], b: &[f64], t: f64| -> Vec<f64> {
        a.iter().zip(b).map(|(a, b)| a + t * (b - a)).collect()
    };
    while evals < max_evals {
        pts.sort_by(|a, b| a.1.total_cmp(&b.1));
        let (best, worst) = (pts[0].1, pts[n].1);
        let spread = pts
            .iter()
            .flat_map(|p| p.0.iter().zip(&pts[0].0).map(|(a, b)| (a - b).abs()))
            .fold(0.0f64, f64::max);
        if (worst - best).abs() <= ftol && spread <= xtol {
            break;
        }
        let mut c = vec![0.0; n];
        for p in &pts[..n] {
            for (ck, pk) in c.iter_mut().zip(&p.0) {
                *ck += pk / n as f64;
            }
        }
        let xr = comb(&c, &pts[n].0, -1.0);
        let yr = eval(&xr, &mut evals);
        if yr < pts[0].1 {
            let xe = comb(&c, &pts[n].0, -2.0);
            let ye = eval(&xe, &mut evals);
            pts[n] = if ye < yr { (xe, ye) } else { (xr, yr) };
        } else if yr < pts[n - 1].1 {
            pts[n] = (xr, yr);
        } else {
            let (xc, yc) = if yr < pts[n].1 {
                let xc = comb(&c, &xr, 0.5);
                let yc = eval(&xc, &mut evals);
                (xc, yc)
            } else {
                let xc = comb(&c, &pts[n].0, 0.5);
                let yc = eval(&xc, &mut evals);
                (xc, yc)
            };
            if yc < yr.min(pts[n].1) {
                pts[n] = (xc, yc);
            } else {
                let x0 = pts[0].0.clone();
                for p in pts.iter_mut().skip(1) {
                    let x = comb(&x0, &p.0, 0.5);
                    let y = eval(&x, &mut evals);
                    *p = (x, y);
                }
            }
        }
    }
    pts.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (x, y) = pts.swap_remove(0);
    (x, y, evals)
}

/// The smallest relative error a mean is trusted to: the client's and the
/// server's own overheads are not in the arrival noise.
pub const MIN_REL_ERR: f64 = 0.02;

/// Σ over benchmarks and over mean TTFT (of the long and of the short
/// prompts, when the file has per-request TTFTs), ITL and E2E of
/// ln(sim / obs)².
/// Each term is divided by its variance (see [`predict_full`]; at least
/// [`MIN_REL_ERR`]²): a weighted least squares, so the means that one
/// benchmark's arrivals make noisy (TTFT near saturation) weigh less.
fn loss(pred: &[Means], obs: &[Means], var: &[[f64; 5]], reps: u32) -> f64 {
    pred.iter()
        .zip(obs)
        .zip(var)
        .map(|((p, o), v)| {
            let ttft = if o.ttft_long.is_finite() && o.ttft_short.is_finite() {
                vec![
                    (p.ttft_long, o.ttft_long, v[0]),
                    (p.ttft_short, o.ttft_short, v[1]),
                ]
            } else {
                vec![(p.ttft, o.ttft, v[2])]
            };
            ttft.into_iter()
                .chain([(p.itl, o.itl, v[3]), (p.e2e, o.e2e, v[4])])
                .map(|(s, m, v)| {
                    let r = (s / m).ln();
                    let v = if v.is_finite() {
                        v * (1.0 + 1.0 / reps as f64)
                    } else {
                        0.0
                    };
                    if r.is_finite() {
                        r * r / v.max(MIN_REL_ERR * MIN_REL_ERR)
                    } else {
                        1e12
                    }
                })
                .sum::<f64>()
        })
        .sum()
}

/// Independent observed means a benchmark gives the fit: mean TTFT, ITL
/// and E2E, and with per-request arrays the split of TTFT between long and
/// short prompts (one more: the two halves average to the mean TTFT).
pub fn data_points(b: &Bench) -> usize {
    3 + usize::from(b.observed.ttft_long.is_finite() && b.observed.ttft_short.is_finite())
}

/// Refuse to fit more coefficients than the benchmarks have independent
/// observed means: the fit would be underdetermined, any of a family of
/// values fitting as well, and the one reported an accident of the search.
pub fn check_determined(
    names: &[String],
    from_flag: bool,
    fit: &[Bench],
) -> Result<(), ConfigError> {
    let points: usize = fit.iter().map(data_points).sum();
    if names.len() <= points {
        return Ok(());
    }
    Err(field_err(
        "--fit",
        "",
        format!(
            "{} coefficients{} to fit to {points} independent observed means ({} benchmark file(s): mean TTFT, ITL and E2E each, and the long/short-prompt TTFT split where the file has per-request arrays): the fit is underdetermined; give benchmarks at more request rates, or fit fewer coefficients with --fit",
            names.len(),
            if from_flag { "" } else { " (the default --fit)" },
            fit.len()
        ),
    ))
}

/// The 95 % point of χ² with one degree of freedom: a coefficient's
/// profile interval is where the loss stays within this (times the
/// residual scale) of its minimum.
pub const CHI2_1_95: f64 = 3.841_458_820_694_124;

/// How far a profile is followed from the fitted value, as a factor either
/// way: a coefficient whose loss stays within the threshold that far is
/// not pinned down by the data.
pub const PROFILE_SPAN: f64 = 4.0;

/// Profile steps per side up to [`PROFILE_SPAN`] (×1.32 each); each crossing is then
/// bisected [`PROFILE_BISECT`] times and interpolated linearly.
const PROFILE_STEPS: u32 = 5;
const PROFILE_BISECT: u32 = 2;

/// The fit's inputs.
pub(crate) struct Problem {
    pub coefs: Coefs,
    pub fit: Vec<Bench>,
    pub holdout: Vec<Bench>,
    pub reps: u32,
    pub seed: u64,
}

/// One fitted coefficient set and what it predicts.
pub(crate) struct Solved {
    /// Log factors of the base values (0: the base value).
    pub x: Vec<f64>,
    pub loss: f64,
    pub evals: u32,
    pub var: Vec<[f64; 5]>,
}

/// The outcome of [`Problem::run`].
pub(crate) struct Outcome {
    pub solved: Solved,
    /// Per coefficient: fitted (true) or fixed at its base value.
    pub free: Vec<bool>,
    pub fixed_why: Vec<Option<String>>,
    pub intervals: Vec<Option<Interval>>,
    /// The threshold the intervals use (χ²₁ 95 % × the residual scale).
    pub threshold: f64,
    pub scale: f64,
    /// Coefficient sets within the threshold (the fit's and the profiles'):
    /// the held-out predictions' and the saturation's envelope.
    pub plausible: Vec<Vec<f64>>,
    pub warnings: Vec<String>,
}

impl Problem {
    pub fn n(&self) -> usize {
        self.coefs.names.len()
    }

    pub fn pool(&self) -> Vec<(u32, u32)> {
        self.fit
            .iter()
            .flat_map(|b| b.reqs.iter().copied())
            .collect()
    }

    pub fn predict_all(
        &self,
        p: &Arc<ServerProfile>,
        benches: &[Bench],
        offset: u64,
    ) -> Vec<Means> {
        benches
            .iter()
            .enumerate()
            .map(|(i, b)| predict(p, b, offset + i as u64, self.reps, self.seed))
            .collect()
    }

    fn variances(&self, p: &Arc<ServerProfile>) -> Vec<[f64; 5]> {
        self.fit
            .iter()
            .enumerate()
            .map(|(i, b)| predict_full(p, b, i as u64, self.reps, self.seed).1)
            .collect()
    }

    pub fn to_values(&self, x: &[f64]) -> Vec<f64> {
        x.iter()
            .zip(&self.coefs.start)
            .map(|(x, s)| s * x.exp())
            .collect()
    }

    pub fn profile_at(&self, x: &[f64]) -> Result<Arc<ServerProfile>, ConfigError> {
        Ok(Arc::new(self.coefs.profile(&self.to_values(x))?))
    }

    fn loss_at(&self, x: &[f64], obs: &[Means], var: &[[f64; 5]]) -> f64 {
        match self.coefs.profile(&self.to_values(x)) {
            Ok(p) => loss(
                &self.predict_all(&Arc::new(p), &self.fit, 0),
                obs,
                var,
                self.reps,
            ),
            Err(_) => f64::INFINITY,
        }
    }

    /// Nelder–Mead over the `free` entries of `x0` (the others stay).
    fn solve(
        &self,
        obs: &[Means],
        var: &[[f64; 5]],
        x0: &[f64],
        free: &[bool],
        step: f64,
        max_evals: u32,
    ) -> (Vec<f64>, f64, u32) {
        let idx: Vec<usize> = (0..x0.len()).filter(|&i| free[i]).collect();
        let full = |y: &[f64]| {
            let mut x = x0.to_vec();
            for (k, &i) in idx.iter().enumerate() {
                x[i] = y[k];
            }
            x
        };
        let mut f = |y: &[f64]| self.loss_at(&full(y), obs, var);
        let y0: Vec<f64> = idx.iter().map(|&i| x0[i]).collect();
        let (y, l, e) = nelder_mead(&mut f, &y0, step, max_evals, 1e-7, 1e-4);
        (full(&y), l, e)
    }

    /// The fit of the `free` coefficients (the others at their base
    /// values): weights from the base profile, then again from the first
    /// fit, which is refined with them.
    fn fit_free(&self, free: &[bool], max_evals: u32) -> Result<Solved, ConfigError> {
        let obs: Vec<Means> = self.fit.iter().map(|b| b.observed).collect();
        let zero = vec![0.0; self.n()];
        let var0 = self.variances(&self.profile_at(&zero)?);
        let (x1, _, e1) = self.solve(&obs, &var0, &zero, free, 0.2, max_evals);
        let var = self.variances(&self.profile_at(&x1)?);
        let (x, loss, e2) = self.solve(&obs, &var, &x1, free, 0.05, max_evals);
        Ok(Solved {
            x,
            loss,
            evals: e1 + e2,
            var,
        })
    }

    /// One side (`dir` ±1) of coefficient `k`'s profile likelihood: the
    /// loss minimised over the other free coefficients with `k` held at
    /// the fitted value moved by steps of [`PROFILE_SPAN`]^(1/[`PROFILE_STEPS`]),
    /// until it exceeds `lhat + delta`. Returns the end (log factor), how
    /// it ended, the evaluations, and the points within the threshold.
    #[allow(clippy::too_many_arguments)]
    fn profile_side(
        &self,
        obs: &[Means],
        s: &Solved,
        free: &[bool],
        k: usize,
        dir: f64,
        delta: f64,
        plausible: &mut Vec<Vec<f64>>,
    ) -> (f64, End, u32) {
        let mut others = free.to_vec();
        others[k] = false;
        // warm-started from the previous point, a small move: a short search
        let budget = 20 + 15 * others.iter().filter(|&&f| f).count() as u32;
        let mut evals = 0u32;
        let at = |t: f64, from: &[f64], evals: &mut u32| -> (Vec<f64>, f64) {
            let mut x0 = from.to_vec();
            x0[k] = s.x[k] + t;
            if others.iter().any(|&f| f) {
                let (x, l, e) = self.solve(obs, &s.var, &x0, &others, 0.05, budget);
                *evals += e;
                (x, l)
            } else {
                *evals += 1;
                let l = self.loss_at(&x0, obs, &s.var);
                (x0, l)
            }
        };
        let limit = s.loss + delta;
        let h = PROFILE_SPAN.ln() / PROFILE_STEPS as f64;
        let (mut a, mut la, mut xa) = (0.0, s.loss, s.x.clone());
        for j in 1..=PROFILE_STEPS {
            let t = dir * h * j as f64;
            let (x, l) = at(t, &xa, &mut evals);
            if l <= limit {
                plausible.push(x.clone());
                (a, la, xa) = (t, l, x);
                continue;
            }
            // the crossing is between a and t: bisect, then interpolate
            let (mut b, mut lb) = (t, l);
            for _ in 0..PROFILE_BISECT {
                let m = 0.5 * (a + b);
                let (x, l) = at(m, &xa, &mut evals);
                if l <= limit {
                    plausible.push(x.clone());
                    (a, la, xa) = (m, l, x);
                } else {
                    (b, lb) = (m, l);
                }
            }
            return if lb.is_finite() {
                let end = a + (b - a) * ((limit - la) / (lb - la)).clamp(0.0, 1.0);
                (end, End::Crossed, evals)
            } else {
                (a, End::Bound, evals)
            };
        }
        (a, End::Open, evals)
    }

    /// Fit, then each free coefficient's 95 % profile interval; under
    /// [`Unidentified::Fix`], a coefficient whose interval stays open
    /// within [`PROFILE_SPAN`] is fixed at its base value (the widest
    /// first) and the rest fitted again, until every fitted one is pinned
    /// down. `intervals` false: the fit alone.
    pub fn run(
        &self,
        max_evals: u32,
        intervals: bool,
        policy: Unidentified,
    ) -> Result<Outcome, ConfigError> {
        let n = self.n();
        let obs: Vec<Means> = self.fit.iter().map(|b| b.observed).collect();
        let points: usize = self.fit.iter().map(data_points).sum();
        let mut free = vec![true; n];
        let mut fixed_why: Vec<Option<String>> = vec![None; n];
        let mut warnings = Vec::new();
        let mut extra_evals = 0u32;
        loop {
            let mut s = self.fit_free(&free, max_evals)?;
            s.evals += extra_evals;
            let p = free.iter().filter(|&&f| f).count();
            let dof = points.saturating_sub(p);
            let scale = if dof > 0 {
                (s.loss / dof as f64).max(1.0)
            } else {
                1.0
            };
            let delta = CHI2_1_95 * scale;
            let mut out = Outcome {
                solved: s,
                free: free.clone(),
                fixed_why: fixed_why.clone(),
                intervals: vec![None; n],
                threshold: delta,
                scale,
                plausible: Vec::new(),
                warnings: warnings.clone(),
            };
            if !intervals || p == 0 {
                return Ok(out);
            }
            if dof == 0 {
                out.warnings.push(format!(
                    "{p} coefficient(s) fitted to {points} observed means: no residual degree of freedom, so the intervals assume the means' weights are right"
                ));
            }
            let mut plausible = vec![out.solved.x.clone()];
            let mut evals = 0u32;
            for k in (0..n).filter(|&k| free[k]) {
                let mut ends = [(0.0, End::Open); 2];
                for (side, dir) in [-1.0, 1.0].into_iter().enumerate() {
                    let (t, end, e) =
                        self.profile_side(&obs, &out.solved, &free, k, dir, delta, &mut plausible);
                    evals += e;
                    ends[side] = (t, end);
                }
                let v = |t: f64| self.coefs.start[k] * (out.solved.x[k] + t).exp();
                out.intervals[k] = Some(Interval {
                    lo: v(ends[0].0),
                    hi: v(ends[1].0),
                    lo_end: ends[0].1,
                    hi_end: ends[1].1,
                });
            }
            out.solved.evals += evals;
            out.plausible = plausible;
            // the least pinned down first: open sides, then the widest
            let open = (0..n)
                .filter_map(|k| out.intervals[k].map(|iv| (k, iv)))
                .filter(|(_, iv)| !iv.pinned())
                .max_by(|a, b| {
                    let w = |iv: &Interval| {
                        (iv.lo_end == End::Open) as u8 + (iv.hi_end == End::Open) as u8
                    };
                    (w(&a.1), (a.1.hi / a.1.lo).ln())
                        .partial_cmp(&(w(&b.1), (b.1.hi / b.1.lo).ln()))
                        .unwrap_or(std::cmp::Ordering::Equal)
                        .then(b.0.cmp(&a.0))
                });
            let Some((k, iv)) = open else {
                return Ok(out);
            };
            let name = &self.coefs.names[k];
            let why = format!(
                "not pinned down by these benchmarks: the loss stays within {:.3} of its minimum from {} to {} ({} at the fitted {})",
                delta,
                iv.lo_text(),
                iv.hi_text(),
                "its 95 % profile interval",
                num(self.to_values(&out.solved.x)[k]),
            );
            match policy {
                Unidentified::Refuse => {
                    return Err(field_err(
                        "--fit",
                        name,
                        format!(
                            "{why}; leave it out of --fit (it keeps its base value) or give benchmarks that tell it apart"
                        ),
                    ))
                }
                Unidentified::Warn => {
                    for k in (0..n).filter(|&k| out.intervals[k].is_some_and(|iv| !iv.pinned())) {
                        let iv = out.intervals[k].expect("filtered");
                        out.warnings.push(format!(
                            "{}: not pinned down by these benchmarks (95 % profile interval {}–{}); its fitted value is one of many that fit as well",
                            self.coefs.names[k],
                            iv.lo_text(),
                            iv.hi_text()
                        ));
                    }
                    return Ok(out);
                }
                Unidentified::Fix => {
                    free[k] = false;
                    fixed_why[k] = Some(why.clone());
                    warnings.push(format!(
                        "{name}: fixed at its base value {} and the rest fitted again: {why}",
                        num(self.coefs.start[k])
                    ));
                    extra_evals = out.solved.evals;
                }
            }
        }
    }
}

/// How one side of a profile interval ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum End {
    /// The loss crossed the threshold there.
    Crossed,
    /// The profile's loader refuses values beyond (an efficiency above 1):
    /// the data allow the coefficient up to its bound.
    Bound,
    /// Still within the threshold at [`PROFILE_SPAN`] from the fit: not
    /// pinned down on this side.
    Open,
}

/// What to do with a coefficient the benchmarks do not pin down (its 95 %
/// profile interval open on a side within a factor [`PROFILE_SPAN`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Unidentified {
    /// Fix it at its base value and fit the others again (stated in the
    /// result).
    #[default]
    Fix,
    /// Keep the fitted value and add a warning.
    Warn,
    /// Fail, naming the coefficient.
    Refuse,
}

/// A 95 % profile interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Interval {
    pub lo: f64,
    pub hi: f64,
    pub lo_end: End,
    pub hi_end: End,
}

impl Interval {
    /// Closed on both sides within [`PROFILE_SPAN`].
    pub fn pinned(&self) -> bool {
        self.lo_end != End::Open && self.hi_end != End::Open
    }
    pub(crate) fn lo_text(&self) -> String {
        match self.lo_end {
            End::Open => format!("below {}", num(self.lo)),
            _ => num(self.lo),
        }
    }
    pub(crate) fn hi_text(&self) -> String {
        match self.hi_end {
            End::Open => format!("above {}", num(self.hi)),
            End::Bound => format!("{} (its bound)", num(self.hi)),
            End::Crossed => num(self.hi),
        }
    }
}

/// A number as the reports print it (4 significant figures or so).
pub fn num(x: f64) -> String {
    if !x.is_finite() {
        "–".into()
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else if x.abs() >= 1.0 {
        format!("{x:.3}")
    } else {
        format!("{x:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nelder_mead_finds_a_quadratic_minimum() {
        let mut f =
            |x: &[f64]| (x[0] - 1.0).powi(2) + 3.0 * (x[1] + 0.5).powi(2) + 0.5 * x[0] * x[1];
        let (x, y, _) = nelder_mead(&mut f, &[0.0, 0.0], 0.3, 500, 1e-12, 1e-8);
        // ∇ = 0: 2(x−1) + 0.5y = 0, 6(y+0.5) + 0.5x = 0
        let det = 2.0 * 6.0 - 0.25;
        let xs = (2.0 * 6.0 + 0.5 * 3.0) / det;
        let ys = (2.0 * -3.0 - 0.5 * 2.0) / det;
        assert!(
            (x[0] - xs).abs() < 1e-3 && (x[1] - ys).abs() < 1e-3,
            "{x:?} vs {xs} {ys}"
        );
        assert!(y.is_finite());
    }
}
