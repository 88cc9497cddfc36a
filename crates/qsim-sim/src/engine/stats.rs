//! Streaming statistics: latency histograms whose memory does not grow with
//! the number of samples, and grows with the spread of the values only.

use crate::time::Nanos;

/// Microseconds: the histogram's unit.
const MAX_US: u64 = 1_000_000_000_000;
/// 2048 sub-buckets per bucket (3 significant digits: 2 × 10³ rounded up
/// to a power of two); a bucket past the first uses its upper half only.
const SUB_HALF_MAG: u32 = 10;
const SUB_HALF: usize = 1 << SUB_HALF_MAG;
const SUB_MASK: u64 = (2 << SUB_HALF_MAG) - 1;
/// `64 − log2(sub-bucket count)`: a value's bucket is this minus the leading
/// zeros of `value | SUB_MASK`.
const LZ_BASE: u32 = 64 - (SUB_HALF_MAG + 1);
/// Counters from 1 µs to [`MAX_US`]: 30 buckets, plus the first bucket's
/// lower half (hdrhistogram's `num_bins(buckets_to_cover(1e12))`).
const BINS: usize = 31 * SUB_HALF;
/// Counters per page (a power of two): 8 × 8 bytes. Small pages keep a
/// histogram of few, spread samples small (a page per sample at worst);
/// the directory costs 2 bytes per page.
const PAGE_MAG: u32 = 3;
const PAGE: usize = 1 << PAGE_MAG;
/// Pages of the whole range: 3,968.
const PAGES: usize = BINS / PAGE;

/// Bytes of one page of counters.
pub const HIST_PAGE_BYTES: usize = PAGE * 8;
/// Bytes of a histogram's page directory at its largest (every page).
pub const HIST_DIRECTORY_BYTES: usize = PAGES * 2;
/// Pages of a histogram whose samples span the whole range.
pub const HIST_MAX_PAGES: usize = PAGES;

/// A histogram of durations, recorded at microsecond resolution with 3
/// significant digits, from 1 µs to ~11.6 days (longer durations count as
/// 11.6 days, shorter as 1 µs; the mean and maximum are exact).
///
/// The buckets are exactly hdrhistogram's (`Histogram::<u64>::new_with_bounds
/// (1, 1e12, 3)`): a value's counter has the same index, and quantiles,
/// count and mean are the same numbers hdrhistogram gives (a property test,
/// tests/hist_props.rs, checks it). The counters are u64 and saturate (as
/// hdrhistogram's), kept in pages of 8 allocated when a value first falls
/// in them, found through a directory of page numbers that spans the pages
/// allocated. So memory follows what the histogram holds: an empty one has
/// no heap, one with a single sample 66 bytes, one whose values lie within
/// a factor of 2 (from 1 ms up: 1,024 counters) at most 129 pages (8.3 KB),
/// and one with values across the whole range 262 KB (hdrhistogram's full
/// array, 254 KB, and the directory). Recording is an index computation and
/// two array lookups; a new page (or a wider directory) is the cold path.
#[derive(Clone, Default)]
pub struct DurationHist {
    /// Per page of counters from page `base` up to the highest page
    /// allocated: 0 if absent, else its place in `pages` plus 1.
    dir: Vec<u16>,
    base: u16,
    pages: Vec<[u64; PAGE]>,
    total: u64,
    sum_ns: u128,
    max_ns: Nanos,
}

/// Samples of one [`DurationHist`] counter not yet added
/// ([`DurationHist::record_n_pending`]): the counter's values in µs,
/// `lo..hi`, and their count, sum and maximum.
#[derive(Debug, Default)]
pub struct Pending {
    lo: u64,
    hi: u64,
    index: usize,
    count: u64,
    sum_ns: u128,
    max_ns: Nanos,
}

impl std::fmt::Debug for DurationHist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DurationHist(n={})", self.count())
    }
}

/// The counter of `us` (1 ≤ us ≤ MAX_US): hdrhistogram's `index_for`.
#[inline]
fn index_of(us: u64) -> usize {
    let bucket = LZ_BASE - (us | SUB_MASK).leading_zeros();
    let sub = (us >> bucket) as usize;
    ((bucket as usize + 1) << SUB_HALF_MAG) + sub - SUB_HALF
}

/// hdrhistogram's `bucket_for`.
fn bucket_of(v: u64) -> u32 {
    LZ_BASE - (v | SUB_MASK).leading_zeros()
}

/// The lowest value counted at `index`: hdrhistogram's `value_for`.
fn value_of(index: usize) -> u64 {
    let mut bucket = (index >> SUB_HALF_MAG) as i64 - 1;
    let mut sub = (index & (SUB_HALF - 1)) + SUB_HALF;
    if bucket < 0 {
        sub -= SUB_HALF;
        bucket = 0;
    }
    (sub as u64) << bucket
}

impl DurationHist {
    pub fn new() -> Self {
        Self::default()
    }

    #[inline]
    fn to_us(d: Nanos) -> u64 {
        (d / 1_000).clamp(1, MAX_US)
    }

    /// The counter at `i`, its page allocated if need be.
    #[inline]
    fn counter(&mut self, i: usize) -> &mut u64 {
        let p = i >> PAGE_MAG;
        let slot = match self.dir.get(p.wrapping_sub(self.base as usize)) {
            Some(&s) if s != 0 => s,
            _ => self.new_page(p),
        };
        &mut self.pages[slot as usize - 1][i & (PAGE - 1)]
    }

    #[cold]
    #[inline(never)]
    fn new_page(&mut self, p: usize) -> u16 {
        let (base, len) = (self.base as usize, self.dir.len());
        if len == 0 {
            self.base = p as u16;
            self.dir = vec![0];
        } else if p < base || p >= base + len {
            // extend the directory to cover page p, by at least a quarter
            // (amortised: a histogram's values spreading page by page copy
            // its directory a few dozen times), within 0..PAGES
            let grow = (len / 4).max(1);
            let (lo, hi) = if p < base {
                (p.min(base.saturating_sub(grow)), base + len)
            } else {
                (base, (p + 1).max(base + len + grow).min(PAGES))
            };
            let mut d = Vec::with_capacity(hi - lo);
            d.resize(base - lo, 0);
            d.extend_from_slice(&self.dir);
            d.resize(hi - lo, 0);
            self.dir = d;
            self.base = lo as u16;
        }
        if self.pages.len() == self.pages.capacity() {
            // grow by a quarter (at least a page, never past PAGES): fewer
            // than a quarter of the pages unused, and no more than
            // hdrhistogram's full array when every page is used
            let n = self.pages.len();
            self.pages.reserve_exact((n / 4).max(1).min(PAGES - n));
        }
        self.pages.push([0; PAGE]);
        // at most PAGES pages: fits u16
        let slot = self.pages.len() as u16;
        self.dir[p - self.base as usize] = slot;
        slot
    }

    #[inline]
    pub fn record(&mut self, d: Nanos) {
        let c = self.counter(index_of(Self::to_us(d)));
        *c = c.saturating_add(1);
        self.total = self.total.saturating_add(1);
        self.sum_ns = self.sum_ns.saturating_add(d as u128);
        self.max_ns = self.max_ns.max(d);
    }

    /// Record `n` samples of the same duration `d`.
    #[inline]
    pub fn record_n(&mut self, d: Nanos, n: u64) {
        if n == 0 {
            return;
        }
        let c = self.counter(index_of(Self::to_us(d)));
        *c = c.saturating_add(n);
        self.total = self.total.saturating_add(n);
        // < 2^128: no overflow of the product
        self.sum_ns = self.sum_ns.saturating_add(d as u128 * n as u128);
        self.max_ns = self.max_ns.max(d);
    }

    /// [`record_n`](Self::record_n), the samples gathered in `p` while
    /// they fall in one counter (added when one falls in another, or by
    /// [`flush`](Self::flush)): the same histogram once flushed (saturating
    /// sums of non-negative terms and the maximum are associative). Flush
    /// before any other record of this histogram, so its pages are made in
    /// the same order.
    #[inline]
    pub fn record_n_pending(&mut self, p: &mut Pending, d: Nanos, n: u64) {
        if n == 0 {
            return;
        }
        let us = Self::to_us(d);
        if us < p.lo || us >= p.hi {
            self.flush(p);
            // the values of `us`'s counter: one bucket, one sub-bucket
            let b = bucket_of(us);
            p.lo = (us >> b) << b;
            p.hi = p.lo + (1 << b);
            p.index = index_of(us);
        }
        p.count = p.count.saturating_add(n);
        p.sum_ns = p.sum_ns.saturating_add(d as u128 * n as u128);
        p.max_ns = p.max_ns.max(d);
    }

    /// Add the samples gathered in `p` ([`record_n_pending`](Self::record_n_pending)).
    #[inline]
    pub fn flush(&mut self, p: &mut Pending) {
        if p.count == 0 {
            return;
        }
        let c = self.counter(p.index);
        *c = c.saturating_add(p.count);
        self.total = self.total.saturating_add(p.count);
        self.sum_ns = self.sum_ns.saturating_add(p.sum_ns);
        self.max_ns = self.max_ns.max(p.max_ns);
        p.count = 0;
        p.sum_ns = 0;
        p.max_ns = 0;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// Quantile in seconds (0 when empty): hdrhistogram's
    /// `value_at_quantile` (the highest value equivalent to the counter
    /// where the cumulative count reaches ⌈q·n⌉; the lowest for q = 0).
    pub fn quantile_s(&self, q: f64) -> f64 {
        if self.total == 0 {
            return 0.0;
        }
        self.quantile_us(q) as f64 / 1e6
    }

    fn quantile_us(&self, q: f64) -> u64 {
        let q = if q > 1.0 { 1.0 } else { q };
        let target = ((q * self.total as f64).ceil() as u64).max(1);
        let mut acc: u64 = 0;
        for (k, &slot) in self.dir.iter().enumerate() {
            if slot == 0 {
                continue;
            }
            let p = self.base as usize + k;
            let page = &self.pages[slot as usize - 1];
            let sum = page.iter().fold(0u64, |a, &c| a.saturating_add(c));
            if acc.saturating_add(sum) < target {
                acc = acc.saturating_add(sum);
                continue;
            }
            for (j, &c) in page.iter().enumerate() {
                acc = acc.saturating_add(c);
                if acc >= target {
                    let v = value_of((p << PAGE_MAG) + j);
                    return if q == 0.0 {
                        v
                    } else {
                        v + (1u64 << bucket_of(v)) - 1
                    };
                }
            }
        }
        0
    }

    pub fn mean_s(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.total as f64 / 1e9
        }
    }

    pub fn max_s(&self) -> f64 {
        self.max_ns as f64 / 1e9
    }

    pub fn sum_s(&self) -> f64 {
        self.sum_ns as f64 / 1e9
    }

    pub fn merge(&mut self, other: &DurationHist) {
        for (k, &slot) in other.dir.iter().enumerate() {
            if slot == 0 {
                continue;
            }
            let src = &other.pages[slot as usize - 1];
            let base = (other.base as usize + k) << PAGE_MAG;
            for (j, &c) in src.iter().enumerate() {
                if c != 0 {
                    let d = self.counter(base + j);
                    *d = d.saturating_add(c);
                }
            }
        }
        self.total = self.total.saturating_add(other.total);
        self.sum_ns = self.sum_ns.saturating_add(other.sum_ns);
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    /// Heap bytes held (directory and pages, including unused capacity).
    pub fn heap_bytes(&self) -> usize {
        self.dir.capacity() * 2 + self.pages.capacity() * HIST_PAGE_BYTES
    }

    /// Pages of counters allocated.
    pub fn pages(&self) -> usize {
        self.pages.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples recorded through `Pending` (flushed) give the histogram
    /// `record_n` gives: every counter, count, sum, maximum and page order.
    #[test]
    fn pending_records_equal_record_n() {
        let (mut a, mut b) = (DurationHist::new(), DurationHist::new());
        let mut p = Pending::default();
        let mut x: u64 = 12345;
        let mut d: Nanos = 500;
        for k in 0..20_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            // mostly slowly growing (a decode run's steps), now and then a jump
            d = match (x >> 60) % 8 {
                0 => (x >> 20) % 40_000_000_000,
                1 => d / 3,
                _ => d + (x >> 40) % 3_000,
            };
            let n = (x >> 33) % 50 * ((k % 7 != 0) as u64);
            a.record_n(d, n);
            b.record_n_pending(&mut p, d, n);
            if k % 1000 == 999 {
                b.flush(&mut p);
                a.record(d / 2);
                b.record(d / 2);
            }
        }
        b.flush(&mut p);
        assert_eq!((a.total, a.sum_ns, a.max_ns), (b.total, b.sum_ns, b.max_ns));
        assert_eq!((&a.dir, a.base, &a.pages), (&b.dir, b.base, &b.pages));
        assert!(a.pages.len() > 10);
    }
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

    #[test]
    fn layout_matches_hdrhistogram() {
        let h = hdrhistogram::Histogram::<u64>::new_with_bounds(1, MAX_US, 3).unwrap();
        assert_eq!(h.distinct_values(), BINS);
        assert_eq!(BINS % PAGE, 0);
        assert!(PAGES < u16::MAX as usize);
        assert!(index_of(MAX_US) < BINS);
        assert_eq!(index_of(1), 1);
    }

    #[test]
    fn empty_holds_no_heap_and_memory_follows_the_spread() {
        let h = DurationHist::new();
        assert_eq!(h.heap_bytes(), 0);
        assert_eq!(h.quantile_s(0.5), 0.0);
        let mut h = DurationHist::new();
        h.record(7_000_000);
        assert_eq!(h.heap_bytes(), 2 + HIST_PAGE_BYTES);
        let mut h = DurationHist::new();
        // every µs from 16.384 to 32.767 ms: one bucket, 1024 counters
        for us in 16_384..32_768u64 {
            h.record(us * 1_000);
        }
        assert_eq!(h.pages(), 1024 / PAGE);
        // 10 to 20 ms: across two buckets, 17 pages
        let mut g = DurationHist::new();
        for i in 0..1_000_000u64 {
            g.record(10_000_000 + i * 10);
        }
        assert_eq!(g.pages(), 1024 / PAGE + 1);
        assert!(h.heap_bytes() <= HIST_DIRECTORY_BYTES + 2 * 1024 * 8);
        // every bucket: all pages a value can reach (index 1 up), no more
        let mut h = DurationHist::new();
        let mut v = 1u64;
        while v <= MAX_US {
            h.record(v * 1_000);
            v += (v >> 11).max(1);
        }
        h.record(u64::MAX);
        assert_eq!(h.pages(), index_of(MAX_US) / PAGE + 1);
        assert!(h.pages() <= HIST_MAX_PAGES);
        assert!(h.heap_bytes() <= HIST_DIRECTORY_BYTES + HIST_MAX_PAGES * HIST_PAGE_BYTES);
        // the same values downwards: the directory grows towards 0
        let mut g = DurationHist::new();
        let mut v = MAX_US;
        while v >= 1 {
            g.record(v * 1_000);
            v -= (v >> 11).max(1);
        }
        assert_eq!(g.pages(), h.pages());
        assert!(g.heap_bytes() <= HIST_DIRECTORY_BYTES + HIST_MAX_PAGES * HIST_PAGE_BYTES);
    }

    #[test]
    fn counts_saturate_instead_of_wrapping() {
        let mut h = DurationHist::new();
        h.record_n(u64::MAX, u64::MAX);
        h.record_n(u64::MAX, u64::MAX);
        h.record(5_000);
        let mut g = h.clone();
        g.merge(&h);
        for x in [&h, &g] {
            assert_eq!(x.count(), u64::MAX);
            assert_eq!(x.max_s(), u64::MAX as f64 / 1e9);
            // the top counter: 999,653,638,144 to 1,000,190,509,055 µs
            let top = value_of(index_of(MAX_US));
            assert!(top <= MAX_US && MAX_US < top + (1 << bucket_of(top)));
            assert_eq!(
                x.quantile_s(1.0),
                (top + (1 << bucket_of(top)) - 1) as f64 / 1e6
            );
            assert_eq!(x.quantile_s(0.0), 0.000005);
        }
    }
}
