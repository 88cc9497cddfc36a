//! `qsim sweep` at scale: grid axes (lists, arithmetic and geometric
//! ranges), the grid's points × seeds run in parallel (rayon) with results
//! collected in grid order, a slice of the grid per shard (`--shard i/n`)
//! and `qsim merge` of the shards' records files.
//!
//! Determinism: every (point, seed) run is independent and its records are
//! concatenated in grid order then seed order, exactly as a serial run
//! appends them, so the output does not depend on the thread count or on
//! how the grid was sharded.

use crate::config::ConfigError;
use crate::experiment::ExperimentFile;
use crate::report::records::{to_csv, PointRecords, Records};
use rayon::prelude::*;
use std::io::IsTerminal;

/// Seeds run as one job (one records buffer): large enough that the
/// per-run bookkeeping vanishes, small enough to balance the threads.
const SEED_CHUNK: u64 = 64;

/// Largest grid accepted (points, before seeds).
pub const MAX_POINTS: usize = 1_000_000;

/// One dimension of the grid: a path and its values, in order.
pub type Axis = (String, Vec<String>);

fn vary_err(arg: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::new(format!("--vary {arg}"), "", reason)
}

/// `--vary PATH=V1,V2,..`, `PATH=A..B:xK` (geometric: A, A·K, A·K², … ≤ B)
/// or `PATH=A..B:+K` (arithmetic: A, A+K, … ≤ B). Integers stay integers
/// when A, B and K are all integers.
pub fn parse_vary(vary: &[String]) -> Result<Vec<Axis>, ConfigError> {
    let mut dims: Vec<Axis> = Vec::new();
    for v in vary {
        let (k, spec) = v
            .split_once('=')
            .ok_or_else(|| vary_err(v, "expected PATH=V1,V2,.. or PATH=A..B:xK or PATH=A..B:+K"))?;
        let k = k.trim();
        if k.is_empty() {
            return Err(vary_err(v, "empty path"));
        }
        let spec = spec.trim();
        let vals = if spec.contains("..") {
            range(spec).map_err(|r| vary_err(v, r))?
        } else {
            let vals: Vec<String> = spec.split(',').map(|x| x.trim().to_string()).collect();
            if vals.iter().any(|x| x.is_empty()) {
                return Err(vary_err(v, "empty value in the list"));
            }
            vals
        };
        let mut seen = std::collections::HashSet::with_capacity(vals.len());
        for x in &vals {
            if !seen.insert(x) {
                return Err(vary_err(v, format!("value {x} given twice")));
            }
        }
        if dims.iter().any(|(o, _)| o == k) {
            return Err(ConfigError::new(
                format!("--vary {k}"),
                "",
                "path varied twice; give all its values in one --vary",
            ));
        }
        dims.push((k.to_string(), vals));
    }
    let n = dims
        .iter()
        .try_fold(1usize, |acc, (_, v)| acc.checked_mul(v.len()))
        .filter(|&n| n <= MAX_POINTS);
    if n.is_none() {
        return Err(ConfigError::new(
            "--vary",
            "",
            format!("the grid has more than {MAX_POINTS} points"),
        ));
    }
    Ok(dims)
}

/// The values of a range `A..B:xK` or `A..B:+K`.
fn range(spec: &str) -> Result<Vec<String>, String> {
    let form =
        "malformed range: expected A..B:xK (geometric, K > 1) or A..B:+K (arithmetic, K > 0)";
    let (ab, step) = spec.split_once(':').ok_or(form)?;
    let (a, b) = ab.split_once("..").ok_or(form)?;
    let (a, b) = (a.trim(), b.trim());
    let (geometric, k) = if let Some(k) = step.trim().strip_prefix('x') {
        (true, k.trim())
    } else if let Some(k) = step.trim().strip_prefix('+') {
        (false, k.trim())
    } else {
        return Err(form.into());
    };
    let num = |s: &str| -> Result<f64, String> {
        match s.parse::<f64>() {
            Ok(x) if x.is_finite() => Ok(x),
            _ => Err(format!("{form}; {s:?} is not a number")),
        }
    };
    let (fa, fb, fk) = (num(a)?, num(b)?, num(k)?);
    if fa > fb {
        return Err(format!("empty range: {a} > {b}"));
    }
    if geometric && !(fk > 1.0 && fa > 0.0) {
        return Err("a geometric range needs A > 0 and a factor K > 1".into());
    }
    if !geometric && fk <= 0.0 {
        return Err("an arithmetic range needs a step K > 0".into());
    }
    let too_many = || format!("the range has more than {MAX_POINTS} values");
    let mut out = Vec::new();
    let ints = (a.parse::<i64>(), b.parse::<i64>(), k.parse::<i64>());
    if let (Ok(ia), Ok(ib), Ok(ik)) = ints {
        let mut x = ia;
        while x <= ib {
            if out.len() >= MAX_POINTS {
                return Err(too_many());
            }
            out.push(x.to_string());
            x = match if geometric {
                x.checked_mul(ik)
            } else {
                x.checked_add(ik)
            } {
                Some(y) => y,
                None => break,
            };
        }
        return Ok(out);
    }
    // decimals: each value computed from A (no accumulated error), printed
    // with 12 significant digits at most
    let tol = 1e-9 * fb.abs().max(fa.abs()).max(1.0);
    for i in 0.. {
        let x = if geometric {
            fa * fk.powi(i)
        } else {
            fa + fk * i as f64
        };
        if x > fb + tol {
            break;
        }
        if out.len() >= MAX_POINTS {
            return Err(too_many());
        }
        out.push(decimal(x));
    }
    Ok(out)
}

fn decimal(x: f64) -> String {
    let digits = (11 - x.abs().log10().floor() as i32).clamp(0, 15) as usize;
    let s = format!("{x:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// The Cartesian product of the dimensions, first dimension outermost.
pub fn grid(dims: &[Axis]) -> Vec<Vec<(String, String)>> {
    let mut out: Vec<Vec<(String, String)>> = vec![vec![]];
    for (k, vals) in dims {
        out = out
            .into_iter()
            .flat_map(|p| {
                vals.iter().map(move |v| {
                    let mut q = p.clone();
                    q.push((k.clone(), v.clone()));
                    q
                })
            })
            .collect();
    }
    out
}

/// A slice of the grid: shard `index` of `count` runs the points whose
/// grid index is `index` modulo `count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shard {
    pub index: usize,
    pub count: usize,
}

impl Shard {
    /// `I/N` with 0 ≤ I < N.
    pub fn parse(s: &str) -> Result<Shard, ConfigError> {
        let bad = |r: &str| ConfigError::new(format!("--shard {s}"), "", r.to_string());
        let form = "expected I/N: shard I (counted from 0) of N, 0 <= I < N";
        let (i, n) = s.split_once('/').ok_or_else(|| bad(form))?;
        let (Ok(index), Ok(count)) = (i.trim().parse::<usize>(), n.trim().parse::<usize>()) else {
            return Err(bad(form));
        };
        if count == 0 || index >= count {
            return Err(bad(form));
        }
        Ok(Shard { index, count })
    }

    pub fn owns(&self, point: usize) -> bool {
        point % self.count == self.index
    }
}

/// Run `seeds` seeds from `seed` of each of `points` (indices into `efs`),
/// in parallel on `threads` threads (None: all cores), with a progress bar
/// on stderr when it is a terminal. The records come back in the order of
/// `points`, each point's seeds in order: the same as a serial run.
pub fn run_points(
    efs: &[ExperimentFile],
    points: &[usize],
    seed: u64,
    seeds: u64,
    threads: Option<usize>,
) -> Result<Vec<Records>, ConfigError> {
    // a job is a run of up to SEED_CHUNK consecutive seeds of one point,
    // its records in one Records (names interned once per chunk, not per
    // run); a point's chunks concatenated in order are its serial records
    let chunk = SEED_CHUNK.min(seeds.max(1));
    let jobs: Vec<(usize, u64, u64)> = points
        .iter()
        .flat_map(|&p| {
            (0..seeds)
                .step_by(chunk as usize)
                .map(move |k| (p, k, chunk.min(seeds - k)))
        })
        .collect();
    let bar = progress(points.len() as u64 * seeds);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .build()
        .map_err(|e| ConfigError::new("--threads", "", e.to_string()))?;
    // the work budget's meter goes with every job to its thread
    let meter = crate::work::current();
    let per_job: Vec<Records> = pool.install(|| {
        jobs.par_iter()
            .map(|&(p, k, n)| {
                let r =
                    crate::work::enter(meter.clone(), || efs[p].records(seed.wrapping_add(k), n));
                bar.inc(n);
                r
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    bar.finish_and_clear();
    let per_point = seeds.div_ceil(chunk) as usize;
    let mut runs = per_job.into_iter();
    Ok(points
        .iter()
        .map(|_| {
            let mut chunks = runs.by_ref().take(per_point);
            let mut r = chunks.next().unwrap_or_default();
            for one in chunks {
                r.extend_from(&one);
            }
            r
        })
        .collect())
}

fn progress(len: u64) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::with_draw_target(
        Some(len),
        indicatif::ProgressDrawTarget::stderr(),
    );
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{bar:40} {pos}/{len} runs  {elapsed} elapsed  ETA {eta}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// The CSV records split into records (a quoted field may hold a newline),
/// each with its line end.
fn csv_records(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut quoted = false;
    for (i, c) in text.char_indices() {
        match c {
            '"' => quoted = !quoted,
            '\n' if !quoted => {
                out.push(&text[start..=i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// A shard's records: the unsharded CSV with two leading columns, `point`
/// (the grid index) and `points` (the grid's size), so that `qsim merge`
/// restores the grid order. `axes` names the swept paths.
pub fn shard_csv(axes: &[String], total: usize, points: &[(usize, PointRecords)]) -> String {
    let header = to_csv(&[PointRecords {
        params: axes.iter().map(|k| (k.clone(), String::new())).collect(),
        records: Records::default(),
    }]);
    let mut out = format!("point,points,{header}");
    for (idx, p) in points {
        let text = to_csv(std::slice::from_ref(p));
        for rec in csv_records(&text).into_iter().skip(1) {
            out.push_str(&format!("{idx},{total},{rec}"));
        }
    }
    out
}

/// Merge shard files (name, text) into the CSV a single-machine run writes:
/// every point of the grid exactly once, in grid order.
pub fn merge(files: &[(String, String)]) -> Result<String, ConfigError> {
    let mut header: Option<(&str, &str)> = None;
    let mut total: Option<(usize, &str)> = None;
    // point → (file, its records without the two leading columns)
    let mut points: std::collections::BTreeMap<usize, (&str, Vec<&str>)> = Default::default();
    for (name, text) in files {
        let bad = |r: String| ConfigError::new(name.as_str(), "", r);
        let recs = csv_records(text);
        let Some(h) = recs.first().and_then(|h| h.strip_prefix("point,points,")) else {
            return Err(bad(
                "not a shard's records file (expected a header starting point,points,: \
                 the output of qsim sweep --shard I/N --format csv)"
                    .into(),
            ));
        };
        match header {
            Some((other, hn)) if other != h => {
                return Err(bad(format!(
                    "its columns differ from those of {hn}: shards of different sweeps"
                )))
            }
            _ => header = Some((h, name)),
        }
        for (line, rec) in recs.iter().enumerate().skip(1) {
            let mut f = rec.splitn(3, ',');
            let (Some(p), Some(n), Some(rest)) = (f.next(), f.next(), f.next()) else {
                return Err(bad(format!("record {}: too few columns", line + 1)));
            };
            let (Ok(p), Ok(n)) = (p.parse::<usize>(), n.parse::<usize>()) else {
                return Err(bad(format!(
                    "record {}: point and points must be whole numbers",
                    line + 1
                )));
            };
            match total {
                Some((t, tn)) if t != n => {
                    return Err(bad(format!(
                        "a grid of {n} points, but {tn} has {t}: shards of different sweeps"
                    )))
                }
                _ => total = Some((n, name)),
            }
            if p >= n {
                return Err(bad(format!("record {}: point {p} of {n}", line + 1)));
            }
            let slot = points.entry(p).or_insert((name.as_str(), Vec::new()));
            if slot.0 != name.as_str() {
                return Err(bad(format!(
                    "point {p} is also in {}: a shard given twice, or overlapping shards",
                    slot.0
                )));
            }
            slot.1.push(rest);
        }
    }
    let Some((header, _)) = header else {
        return Err(ConfigError::new("qsim merge", "", "no files given"));
    };
    let n = total.map_or(0, |(n, _)| n);
    if let Some(missing) = (0..n).find(|p| !points.contains_key(p)) {
        return Err(ConfigError::new(
            "qsim merge",
            "",
            format!(
                "point {missing} of the grid's {n} is in none of the files: a shard is missing"
            ),
        ));
    }
    let mut out = header.to_string();
    for (_, recs) in points.values() {
        for r in recs {
            out.push_str(r);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(spec: &str) -> Result<Vec<String>, ConfigError> {
        parse_vary(&[format!("p={spec}")]).map(|mut d| d.remove(0).1)
    }

    #[test]
    fn ranges_and_lists() {
        assert_eq!(vals("8..128:x2").unwrap(), ["8", "16", "32", "64", "128"]);
        assert_eq!(vals("8..100:x2").unwrap(), ["8", "16", "32", "64"]);
        assert_eq!(vals("8..64:+8").unwrap().len(), 8);
        assert_eq!(
            vals("0.1..0.5:+0.1").unwrap(),
            ["0.1", "0.2", "0.3", "0.4", "0.5"]
        );
        assert_eq!(vals("1..4:x1.5").unwrap(), ["1", "1.5", "2.25", "3.375"]);
        assert_eq!(vals("a, b ,c").unwrap(), ["a", "b", "c"]);
        for bad in [
            "",
            "8,,16",
            "8..",
            "8..64",
            "8..64:*2",
            "64..8:+8",
            "8..64:x1",
            "0..8:x2",
            "8..64:+0",
            "a..b:+1",
            "8..64:+-1",
        ] {
            assert!(vals(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn shards_parse_and_partition() {
        assert_eq!(Shard::parse("1/3").unwrap(), Shard { index: 1, count: 3 });
        for bad in ["3/3", "1/0", "1", "-1/2", "a/b", "1/2/3"] {
            assert!(Shard::parse(bad).is_err(), "{bad}");
        }
        let shards: Vec<Shard> = (0..3).map(|i| Shard { index: i, count: 3 }).collect();
        for p in 0..10 {
            assert_eq!(shards.iter().filter(|s| s.owns(p)).count(), 1);
        }
    }

    #[test]
    fn merge_restores_grid_order_and_refuses_gaps_and_overlaps() {
        let point = |v: &str, seed: u64| {
            let mut r = Records::default();
            r.push(seed, "a,b", "m", 1.5);
            PointRecords {
                params: vec![("w".into(), v.into())],
                records: r,
            }
        };
        let axes = vec!["w".to_string()];
        let whole = to_csv(&[point("8", 1), point("16", 1), point("32", 1)]);
        let s0 = shard_csv(&axes, 3, &[(0, point("8", 1)), (2, point("32", 1))]);
        let s1 = shard_csv(&axes, 3, &[(1, point("16", 1))]);
        let f = |n: &str, t: &str| (n.to_string(), t.to_string());
        assert_eq!(merge(&[f("1", &s1), f("0", &s0)]).unwrap(), whole);
        assert!(merge(&[f("0", &s0)])
            .unwrap_err()
            .to_string()
            .contains("point 1"));
        assert!(merge(&[f("0", &s0), f("0b", &s0), f("1", &s1)])
            .unwrap_err()
            .to_string()
            .contains("also in"));
        assert!(merge(&[f("x", &whole)]).is_err());
    }
}
