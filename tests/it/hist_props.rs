//! The paged latency histogram (`qsim_sim::engine::DurationHist`) against the
//! hdrhistogram it replaces, configured as it was (1 µs to 100 s, 3
//! significant digits, auto-resize, values clamped to 1 µs .. 1e12 µs):
//! count, every quantile, mean, sum and maximum are the same numbers, after
//! records, repeated records and merges, for values from 0 ns to u64::MAX.

use hdrhistogram::Histogram;
use proptest::prelude::*;
use qsim_sim::engine::DurationHist;

/// The histogram as it was before the paged one (src/engine/stats.rs at
/// commit 3c6a616).
#[derive(Clone)]
struct Reference {
    h: Histogram<u64>,
    sum_ns: u128,
    max_ns: u64,
}

impl Reference {
    fn new() -> Self {
        let mut h = Histogram::new_with_bounds(1, 100_000_000, 3).unwrap();
        h.auto(true);
        Reference {
            h,
            sum_ns: 0,
            max_ns: 0,
        }
    }
    fn record_n(&mut self, d: u64, n: u64) {
        if n == 0 {
            return;
        }
        let us = (d / 1_000).clamp(1, 1_000_000_000_000);
        self.h.record_n(us, n).unwrap();
        self.sum_ns += d as u128 * n as u128;
        self.max_ns = self.max_ns.max(d);
    }
    fn quantile_s(&self, q: f64) -> f64 {
        if self.h.is_empty() {
            0.0
        } else {
            self.h.value_at_quantile(q) as f64 / 1e6
        }
    }
    fn mean_s(&self) -> f64 {
        if self.h.is_empty() {
            0.0
        } else {
            self.sum_ns as f64 / self.h.len() as f64 / 1e9
        }
    }
    fn merge(&mut self, o: &Reference) {
        self.h.add(&o.h).unwrap();
        self.sum_ns += o.sum_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
    }
}

const FIXED_Q: [f64; 12] = [
    0.0, 1e-9, 0.01, 0.25, 0.5, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0, 1.5,
];

fn same(d: &DurationHist, r: &Reference, qs: &[f64]) -> Result<(), TestCaseError> {
    prop_assert_eq!(d.count(), r.h.len());
    for &q in FIXED_Q.iter().chain(qs) {
        prop_assert_eq!(
            d.quantile_s(q).to_bits(),
            r.quantile_s(q).to_bits(),
            "q = {}",
            q
        );
    }
    prop_assert_eq!(d.mean_s().to_bits(), r.mean_s().to_bits());
    prop_assert_eq!(d.sum_s().to_bits(), (r.sum_ns as f64 / 1e9).to_bits());
    prop_assert_eq!(d.max_s().to_bits(), (r.max_ns as f64 / 1e9).to_bits());
    Ok(())
}

/// A duration in ns: mostly latencies (µs to minutes), some tiny, some huge
/// (past the 1e12 µs clamp, up to u64::MAX).
fn duration() -> impl Strategy<Value = u64> {
    prop_oneof![
        4 => 1_000u64..100_000_000_000,
        2 => 5_000_000u64..50_000_000, // one ms-range cluster
        1 => 0u64..5_000,
        1 => 100_000_000_000u64..2_000_000_000_000_000_000,
        1 => any::<u64>(),
        1 => Just(u64::MAX),
        1 => (0u32..64).prop_map(|s| 1u64 << s),
    ]
}

/// (duration, times): mostly single records, some repeated.
fn samples(max: usize) -> impl Strategy<Value = Vec<(u64, u64)>> {
    prop::collection::vec(
        (
            duration(),
            prop_oneof![6 => Just(1u64), 2 => 0u64..5, 1 => 0u64..1_000_000],
        ),
        0..max,
    )
}

fn build(s: &[(u64, u64)]) -> (DurationHist, Reference) {
    let mut d = DurationHist::new();
    let mut r = Reference::new();
    for &(v, n) in s {
        if n == 1 {
            d.record(v);
        } else {
            d.record_n(v, n);
        }
        r.record_n(v, n);
    }
    (d, r)
}

/// Deterministic by default (the test command runs the same cases every
/// time); QSIM_PROPTEST_SEED=<u64> explores others, QSIM_PROPTEST_CASES=<n>
/// runs more of them.
fn config(cases: u32) -> ProptestConfig {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    ProptestConfig {
        cases: env("QSIM_PROPTEST_CASES").map_or(cases, |c| c as u32),
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(
            env("QSIM_PROPTEST_SEED").unwrap_or(0x5eed_0008),
        ),
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config(2000))]

    #[test]
    fn same_numbers_as_hdrhistogram(
        s in samples(400),
        qs in prop::collection::vec(0.0f64..=1.0, 0..16),
    ) {
        let (d, r) = build(&s);
        same(&d, &r, &qs)?;
    }
}

proptest! {
    // fewer cases: each merges up to five histograms and compares after each
    #![proptest_config(config(400))]

    #[test]
    fn merges_give_the_same_numbers(
        parts in prop::collection::vec(samples(100), 1..6),
        qs in prop::collection::vec(0.0f64..=1.0, 0..8),
    ) {
        let mut d = DurationHist::new();
        let mut r = Reference::new();
        for p in &parts {
            let (dp, rp) = build(p);
            d.merge(&dp);
            r.merge(&rp);
            same(&d, &r, &qs)?;
        }
        // merging into a histogram that already holds samples, and a clone
        let (mut d2, mut r2) = build(&parts[0]);
        d2.merge(&d.clone());
        r2.merge(&r.clone());
        same(&d2, &r2, &qs)?;
    }
}

/// Every counter of the range, one sample each: the same quantile at every
/// rank (the full walk of both histograms).
#[test]
fn every_counter_once() {
    let mut d = DurationHist::new();
    let mut r = Reference::new();
    let mut us = 1u64;
    let mut n = 0u64;
    while us <= 1_000_000_000_000 {
        d.record(us * 1_000);
        r.record_n(us * 1_000, 1);
        n += 1;
        // the next counter: one unit of this value's resolution on
        let bucket = 53 - (us | 2047).leading_zeros();
        us += 1 << bucket;
    }
    // indices 1 (1 µs) to 31,558 (the counter of 1e12 µs)
    assert_eq!(n, 31_558);
    for k in 0..=n {
        let q = k as f64 / n as f64;
        assert_eq!(
            d.quantile_s(q).to_bits(),
            r.quantile_s(q).to_bits(),
            "rank {k}"
        );
    }
}
