//! The objective and the constraints of `qsim recommend`: metric names,
//! `METRIC OP [K*]TERM [in P% of seeds]` expressions and their checks.

use crate::config::ConfigError;
use crate::report::Spread;

/// The constraints that apply unless one on the same metric is given.
pub const DEFAULT_CONSTRAINTS: &[&str] = &[
    "ok>=rows in 95% of seeds",
    "p95<=2*p50",
    "truncated<=0.01*rows",
];

/// A configuration's figures over the seeds.
#[derive(Debug, Clone)]
pub struct Evidence {
    /// Per seed, the metrics in [`crate::report::hosted::METRICS`] order.
    pub per_seed: Vec<Vec<f64>>,
    /// Per metric, the median and 90 % interval over seeds.
    pub spreads: Vec<Spread>,
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
    pub default: bool,
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
            default: false,
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

    /// Does it hold for these per-seed metrics, and how (for the evidence)?
    pub(crate) fn check(&self, ev: &Evidence, rows: f64) -> (bool, String) {
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
        let all = constraints(&["p95<=3*p50".into()]).unwrap();
        assert_eq!(all.len(), 3);
        assert!(!all[0].default && all[1].default && all[2].default);
    }
}
