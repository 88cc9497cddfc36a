//! Reports: plain-text tables and JSON, and aggregation over seeds.

pub mod hosted;
pub mod server;
pub mod table;

/// Median and 90 % interval (5th and 95th percentiles, nearest rank) of a sample.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Spread {
    pub median: f64,
    pub lo: f64,
    pub hi: f64,
}

pub fn spread(values: &[f64]) -> Spread {
    assert!(!values.is_empty());
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let q = |p: f64| -> f64 {
        let n = v.len();
        // nearest-rank on 0..n-1 with linear interpolation
        let x = p * (n - 1) as f64;
        let i = x.floor() as usize;
        let f = x - i as f64;
        if i + 1 < n {
            v[i] * (1.0 - f) + v[i + 1] * f
        } else {
            v[i]
        }
    };
    Spread {
        median: q(0.5),
        lo: q(0.05),
        hi: q(0.95),
    }
}

/// Round to `d` decimals for stable, readable JSON.
pub fn round(x: f64, d: i32) -> f64 {
    let m = 10f64.powi(d);
    (x * m).round() / m
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn spread_of_range() {
        let v: Vec<f64> = (0..=100).map(|x| x as f64).collect();
        let s = spread(&v);
        assert_eq!(s.median, 50.0);
        assert_eq!(s.lo, 5.0);
        assert_eq!(s.hi, 95.0);
        assert_eq!(spread(&[3.0]).median, 3.0);
    }
}
