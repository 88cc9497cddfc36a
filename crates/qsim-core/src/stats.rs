//! The one quantile definition every qsim report uses.
//!
//! `quantile(sorted, q)`: linear interpolation between the order statistics
//! of a sorted sample, at position `q × (n − 1)` (Hyndman and Fan's type 7,
//! numpy's and R's default, and Excel's PERCENTILE.INC): for `n = 4` the
//! median is the mean of the 2nd and 3rd values, the 5th percentile is
//! `v[0] + 0.15 (v[1] − v[0])`. Not nearest-rank: no reported figure is
//! forced onto an observed value. An empty sample has no quantile (`NaN`).

/// The `q`-quantile (`q` in `[0, 1]`) of `sorted` (ascending, no NaN), by
/// linear interpolation between order statistics (type 7).
pub fn quantile(sorted: &[f64], q: f64) -> f64 {
    quantile_by(sorted.len(), q, |i| sorted[i])
}

/// The same quantile of a sample of `n` values given by their order
/// statistics: `at(i)` is the `i`-th smallest (from 0). For samples kept as
/// counts per value (a trace's token lengths: memory per distinct value,
/// not per request), where `at` looks the rank up in the cumulative counts.
pub fn quantile_by(n: usize, q: f64, at: impl Fn(usize) -> f64) -> f64 {
    if n == 0 {
        return f64::NAN;
    }
    let x = q.clamp(0.0, 1.0) * (n - 1) as f64;
    let i = x.floor() as usize;
    let f = x - i as f64;
    if i + 1 < n {
        at(i) * (1.0 - f) + at(i + 1) * f
    } else {
        at(i)
    }
}

/// A copy of `values` sorted ascending ([`f64::total_cmp`]).
pub fn sorted(values: &[f64]) -> Vec<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_7_interpolates_between_order_statistics() {
        let v = [1.0, 2.0, 4.0, 8.0];
        assert_eq!(quantile(&v, 0.5), 3.0);
        assert_eq!(quantile(&v, 0.0), 1.0);
        assert_eq!(quantile(&v, 1.0), 8.0);
        assert!((quantile(&v, 0.05) - 1.15).abs() < 1e-12);
        assert!((quantile(&v, 0.95) - 7.4).abs() < 1e-12);
        assert_eq!(quantile(&[5.0], 0.9), 5.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
