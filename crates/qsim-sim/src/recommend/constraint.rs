//! The objective and the constraints of `qsim recommend`: metric names,
//! `METRIC OP [K*]TERM [in P% of seeds]` expressions and their checks.

use crate::config::ConfigError;
use crate::report::Spread;

/// The constraints that apply unless one on the same metric is given (or
/// `--no-default-constraints` drops them).
pub const DEFAULT_CONSTRAINTS: &[&str] = &[
    "ok>=rows in 95% of seeds",
    "p95<=2*p50",
    "truncated<=0.01*rows",
];

/// `--zero-failed`: every row succeeds, in every seed.
pub const ZERO_FAILED: &str = "ok>=rows in 100% of seeds";

/// Where a constraint comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// `--constraint EXPR`.
    Given,
    /// One of [`DEFAULT_CONSTRAINTS`].
    Default,
    /// `--zero-failed` ([`ZERO_FAILED`]).
    ZeroFailed,
}

impl Origin {
    /// How the report marks it ("" for a given one).
    pub fn mark(self) -> &'static str {
        match self {
            Origin::Given => "",
            Origin::Default => "default",
            Origin::ZeroFailed => "--zero-failed",
        }
    }
}

/// One constraint's outcome for one configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    pub holds: bool,
    /// How: the medians compared, or in how many seeds it holds.
    pub detail: String,
    /// How far it misses, relative (0 when it holds, in (0, 1] for
    /// non-negative metrics): |lhs − rhs| / max(|lhs|, |rhs|), on the
    /// medians, or in the seed that must hold for the share to be met
    /// (the share-th smallest miss over seeds).
    pub gap: f64,
}

/// A configuration's figures over the seeds.
#[derive(Debug, Clone)]
pub struct Evidence {
    /// Per seed, the metrics in [`crate::report::hosted::METRICS`] order.
    pub per_seed: Vec<Vec<f64>>,
    /// Per metric, the median and 90 % interval over seeds.
    pub spreads: Vec<Spread>,
    /// The median over seeds of the 429s each endpoint limit returned
    /// (limit name, count), in the profile's order.
    pub limit_429: Vec<(String, f64)>,
}

pub(crate) fn fmt_num(x: f64, d: usize) -> String {
    let s = format!("{x:.d$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

// ---------------------------------------------------------------- metrics

/// The metrics of one run, in the order of [`crate::report::hosted::METRICS`].
pub(crate) fn metric_keys() -> impl Iterator<Item = &'static str> {
    crate::report::hosted::METRICS.iter().map(|m| m.0)
}

/// A metric's index by its key or short name.
pub(crate) fn metric_index(name: &str) -> Option<usize> {
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

pub(crate) fn metric_names() -> String {
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

pub(crate) const fn idx(key: &str) -> usize {
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
pub(crate) const ELAPSED: usize = idx("elapsed_s");
pub(crate) const OK: usize = idx("ok");
pub(crate) const P50: usize = idx("latency_p50_s");
pub(crate) const P95: usize = idx("latency_p95_s");
pub(crate) const TRUNCATED: usize = idx("truncated");
pub(crate) const HTTP_429: usize = idx("http_429");

// ------------------------------------------------------------ constraints

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Atom {
    Number,
    Rows,
    Metric(usize),
}

/// `k × atom` (a bare number is `k` with [`Atom::Number`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Term {
    k: f64,
    atom: Atom,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Le,
    Ge,
    Lt,
    Gt,
    Eq,
}

impl Op {
    pub(crate) fn holds(self, a: f64, b: f64) -> bool {
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
    pub origin: Origin,
    lhs: Term,
    op: Op,
    rhs: Term,
    /// Seed by seed in at least this share of the seeds; None: on medians.
    share: Option<f64>,
}

pub(crate) fn cerr(text: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(format!("--constraint {text:?}"), "", reason)
}

pub(crate) fn parse_term(text: &str, s: &str) -> Result<Term, ConfigError> {
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
            origin: Origin::Given,
            lhs,
            op,
            rhs,
            share,
        })
    }

    pub(crate) fn lhs_metric(&self) -> usize {
        match self.lhs.atom {
            Atom::Metric(m) => m,
            _ => unreachable!("checked at parse"),
        }
    }

    pub(crate) fn value(t: &Term, rows: f64, metric: impl Fn(usize) -> f64) -> f64 {
        match t.atom {
            Atom::Number => t.k,
            Atom::Rows => t.k * rows,
            Atom::Metric(m) => t.k * metric(m),
        }
    }

    /// The key of the metric on the left (`ok`, `truncated`, `elapsed_s`, …).
    pub fn metric(&self) -> &'static str {
        metric_keys().nth(self.lhs_metric()).unwrap_or_default()
    }

    /// Both sides for one seed's metrics.
    fn sides(&self, rows: f64, m: &[f64]) -> (f64, f64) {
        (
            Self::value(&self.lhs, rows, |i| m[i]),
            Self::value(&self.rhs, rows, |i| m[i]),
        )
    }

    /// The relative miss of `a OP b`: 0 when it holds, else
    /// |a − b| / max(|a|, |b|) (at least 1e-12: a strict comparison of
    /// equals misses too).
    fn miss(&self, a: f64, b: f64) -> f64 {
        if self.op.holds(a, b) {
            return 0.0;
        }
        let scale = a.abs().max(b.abs());
        if scale == 0.0 {
            return 1.0;
        }
        ((a - b).abs() / scale).max(1e-12)
    }

    /// Does it hold for these per-seed metrics, how (for the evidence), and
    /// by how much does it miss?
    pub(crate) fn check(&self, ev: &Evidence, rows: f64) -> Check {
        match self.share {
            Some(share) => {
                let n = ev.per_seed.len();
                let mut misses: Vec<f64> = ev
                    .per_seed
                    .iter()
                    .map(|m| {
                        let (a, b) = self.sides(rows, m);
                        self.miss(a, b)
                    })
                    .collect();
                let held = misses.iter().filter(|&&x| x == 0.0).count();
                let frac = held as f64 / n as f64;
                misses.sort_by(f64::total_cmp);
                // the seeds that must hold: ceil(share × n), at least one
                let need = ((share * n as f64) - 1e-9).ceil().max(1.0) as usize;
                let holds = frac + 1e-9 >= share;
                Check {
                    holds,
                    detail: format!(
                        "holds in {held} of {n} seeds ({}%, needs {}%)",
                        fmt_num(frac * 100.0, 1),
                        fmt_num(share * 100.0, 1)
                    ),
                    gap: if holds { 0.0 } else { misses[need.min(n) - 1] },
                }
            }
            None => {
                let a = Self::value(&self.lhs, rows, |i| ev.spreads[i].median);
                let b = Self::value(&self.rhs, rows, |i| ev.spreads[i].median);
                let holds = self.op.holds(a, b);
                Check {
                    holds,
                    detail: format!("medians: {} vs {}", fmt_num(a, 3), fmt_num(b, 3)),
                    gap: if holds { 0.0 } else { self.miss(a, b) },
                }
            }
        }
    }

    /// The seed where it misses most: (seed index, lhs, rhs), for a
    /// constraint checked seed by seed that misses somewhere.
    pub(crate) fn worst_seed(&self, ev: &Evidence, rows: f64) -> Option<(usize, f64, f64)> {
        self.share?;
        ev.per_seed
            .iter()
            .enumerate()
            .map(|(k, m)| {
                let (a, b) = self.sides(rows, m);
                (k, a, b, self.miss(a, b))
            })
            .filter(|x| x.3 > 0.0)
            .max_by(|x, y| x.3.total_cmp(&y.3).then(y.0.cmp(&x.0)))
            .map(|(k, a, b, _)| (k, a, b))
    }
}

/// The user's constraints, then [`ZERO_FAILED`] if `zero_failed`, then
/// (unless `no_defaults`) each default whose metric they leave alone.
pub fn constraints(
    given: &[String],
    zero_failed: bool,
    no_defaults: bool,
) -> Result<Vec<Constraint>, ConfigError> {
    let mut out: Vec<Constraint> = given
        .iter()
        .map(|c| Constraint::parse(c))
        .collect::<Result<_, _>>()?;
    if zero_failed {
        let mut c = Constraint::parse(ZERO_FAILED).expect("--zero-failed parses");
        c.origin = Origin::ZeroFailed;
        out.push(c);
    }
    if !no_defaults {
        for d in DEFAULT_CONSTRAINTS {
            let mut c = Constraint::parse(d).expect("the defaults parse");
            if !out.iter().any(|u| u.lhs_metric() == c.lhs_metric()) {
                c.origin = Origin::Default;
                out.push(c);
            }
        }
    }
    Ok(out)
}

/// The objective: a metric's median, minimised (maximised for throughput and ok).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Objective {
    pub(crate) metric: usize,
    pub(crate) maximise: bool,
}

pub(crate) fn objective(name: &str) -> Result<Objective, ConfigError> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    pub(crate) fn shown_metric_positions_match_the_report() {
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
    pub(crate) fn constraints_parse_and_refuse() {
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
        let all = constraints(&["p95<=3*p50".into()], false, false).unwrap();
        assert_eq!(all.len(), 3);
        let origins: Vec<Origin> = all.iter().map(|c| c.origin).collect();
        assert_eq!(origins, [Origin::Given, Origin::Default, Origin::Default]);
        // --zero-failed replaces the default on ok; --no-default-constraints
        // drops the defaults
        let all = constraints(&[], true, false).unwrap();
        assert_eq!(all[0].text, ZERO_FAILED);
        assert_eq!(all[0].origin, Origin::ZeroFailed);
        assert_eq!(all.len(), 3);
        assert!(all.iter().all(|c| c.text != DEFAULT_CONSTRAINTS[0]));
        assert!(constraints(&[], false, true).unwrap().is_empty());
        let all = constraints(&["elapsed<=60".into()], true, true).unwrap();
        let texts: Vec<&str> = all.iter().map(|c| c.text.as_str()).collect();
        assert_eq!(texts, ["elapsed<=60", ZERO_FAILED]);
    }

    fn ev(per_seed: Vec<Vec<f64>>) -> Evidence {
        crate::recommend::evidence(per_seed)
    }

    fn seed_with(ok: f64, truncated: f64) -> Vec<f64> {
        let mut m = vec![0.0; metric_keys().count()];
        m[OK] = ok;
        m[TRUNCATED] = truncated;
        m
    }

    #[test]
    fn a_miss_measures_how_far_not_how_many() {
        // 100 rows; ok >= rows in 100% of seeds
        let c = Constraint::parse(ZERO_FAILED).unwrap();
        let one_lost = ev(vec![seed_with(100.0, 0.0), seed_with(99.0, 0.0)]);
        let most_lost = ev(vec![seed_with(100.0, 0.0), seed_with(3.0, 0.0)]);
        let (a, b) = (c.check(&one_lost, 100.0), c.check(&most_lost, 100.0));
        assert!(!a.holds && !b.holds);
        assert!((a.gap - 0.01).abs() < 1e-12, "{}", a.gap);
        assert!((b.gap - 0.97).abs() < 1e-12, "{}", b.gap);
        // in 50% of seeds: the better seed is the one that must hold
        let c = Constraint::parse("ok>=rows in 50% of seeds").unwrap();
        assert!(c.check(&most_lost, 100.0).holds);
        assert_eq!(c.check(&most_lost, 100.0).gap, 0.0);
        // on the medians: truncated 60 vs 1 allowed misses by 59/60
        let c = Constraint::parse("truncated<=0.01*rows").unwrap();
        let t = ev(vec![seed_with(100.0, 60.0)]);
        let k = c.check(&t, 100.0);
        assert!(!k.holds && (k.gap - 59.0 / 60.0).abs() < 1e-12);
        // the worst seed of a seed-by-seed constraint
        let c = Constraint::parse(ZERO_FAILED).unwrap();
        assert_eq!(c.worst_seed(&most_lost, 100.0), Some((1, 3.0, 100.0)));
        assert_eq!(c.worst_seed(&ev(vec![seed_with(100.0, 0.0)]), 100.0), None);
    }
}
