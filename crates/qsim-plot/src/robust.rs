//! Robust axis bounds: a few outliers must not stretch an axis so far that
//! the rest of the data shrinks into a corner (one row of 4,800 s beside
//! rows of a minute). An axis whose values above their 99th percentile
//! would take more than half of it ends at that percentile instead; the
//! values beyond are drawn at the edge with a marker pointing outwards, and
//! the chart's caption says so ([`note`]). Plain numbers only: this module
//! names nothing of the crate root, so no module cycle.

/// The quantile an axis is cut at.
pub const QUANTILE: f64 = 0.99;

/// The `q` quantile of sorted values, linear between order statistics
/// (type 7, as `qsim_core::stats`); NaN when there are none.
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        1 => sorted[0],
        n => {
            let h = (n - 1) as f64 * q.clamp(0.0, 1.0);
            let i = h.floor() as usize;
            let j = (i + 1).min(n - 1);
            sorted[i] + (h - i as f64) * (sorted[j] - sorted[i])
        }
    }
}

/// Where to cut an axis that starts at `start` and shows `values` (as
/// drawn: log10 of them on a log axis): their [`QUANTILE`] if the values
/// above it would take more than half of the axis, i.e. `max − start >
/// 2 × (p99 − start)`; None if the axis can show them all. Non-finite
/// values are ignored.
pub fn cut(values: &[f64], start: f64) -> Option<f64> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
    if v.len() < 2 || !start.is_finite() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let max = v[v.len() - 1];
    let q = quantile(&v, QUANTILE);
    (q > start && max - start > 2.0 * (q - start)).then_some(q)
}

/// A cut axis as the caption states it: `x axis cut at the 99th percentile
/// (60): 3 points beyond, up to 4800, ▶ at the edge`.
pub fn note(axis: &str, at: &str, beyond: usize, max: &str, arrow: &str) -> String {
    let points = if beyond == 1 { "point" } else { "points" };
    format!(
        "{axis} axis cut at the 99th percentile ({at}): {beyond} {points} beyond, up to {max}, {arrow} at the edge"
    )
}
