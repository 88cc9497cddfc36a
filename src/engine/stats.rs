//! Streaming statistics: latency histograms whose memory does not grow with
//! the number of samples.

use crate::time::Nanos;
use hdrhistogram::Histogram;

/// A histogram of durations, recorded at microsecond resolution with 3
/// significant digits, from 1 µs to ~11.6 days. Counts are allocated up to
/// 100 s at first and grow on demand beyond (the buckets, hence every
/// quantile, are those of the full range): ~150 KB instead of ~250 KB, and
/// no reallocation for the latencies of ordinary runs.
#[derive(Clone)]
pub struct DurationHist {
    h: Histogram<u64>,
    sum_ns: u128,
    max_ns: Nanos,
}

impl Default for DurationHist {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for DurationHist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DurationHist(n={})", self.count())
    }
}

impl DurationHist {
    pub fn new() -> Self {
        DurationHist {
            h: {
                let mut h = Histogram::new_with_bounds(1, 100_000_000, 3).expect("valid bounds");
                h.auto(true);
                h
            },
            sum_ns: 0,
            max_ns: 0,
        }
    }

    #[inline]
    pub fn record(&mut self, d: Nanos) {
        let us = (d / 1_000).clamp(1, 1_000_000_000_000);
        // grows the counts on demand (auto-resize); saturate only if it cannot
        if self.h.record(us).is_err() {
            self.h.saturating_record(us);
        }
        self.sum_ns += d as u128;
        self.max_ns = self.max_ns.max(d);
    }

    /// Record `n` samples of the same duration `d`.
    #[inline]
    pub fn record_n(&mut self, d: Nanos, n: u64) {
        if n == 0 {
            return;
        }
        let us = (d / 1_000).clamp(1, 1_000_000_000_000);
        if self.h.record_n(us, n).is_err() {
            self.h.saturating_record_n(us, n);
        }
        self.sum_ns += d as u128 * n as u128;
        self.max_ns = self.max_ns.max(d);
    }

    pub fn count(&self) -> u64 {
        self.h.len()
    }

    /// Quantile in seconds (0 when empty).
    pub fn quantile_s(&self, q: f64) -> f64 {
        if self.h.is_empty() {
            return 0.0;
        }
        self.h.value_at_quantile(q) as f64 / 1e6
    }

    pub fn mean_s(&self) -> f64 {
        if self.h.is_empty() {
            0.0
        } else {
            self.sum_ns as f64 / self.h.len() as f64 / 1e9
        }
    }

    pub fn max_s(&self) -> f64 {
        self.max_ns as f64 / 1e9
    }

    pub fn sum_s(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    pub fn merge(&mut self, other: &DurationHist) {
        self.h.add(&other.h).expect("same bounds");
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn quantiles() {
        let mut h = DurationHist::new();
        for i in 1..=1000u64 {
            h.record(i * 1_000_000); // 1..1000 ms
        }
        assert!((h.quantile_s(0.5) - 0.5).abs() < 0.001);
        assert!((h.quantile_s(0.95) - 0.95).abs() < 0.001);
        assert!((h.mean_s() - 0.5005).abs() < 1e-9);
        assert_eq!(h.max_s(), 1.0);
    }
}
