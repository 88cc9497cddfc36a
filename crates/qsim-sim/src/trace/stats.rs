//! `qsim trace stats`: what a trace looks like, in one streaming pass, and
//! a synthetic workload fitted to it.
//!
//! Definitions (all over the replayed requests, i.e. after the window,
//! scale, compression and loops):
//! - duration: last arrival − first arrival; mean rate: requests / duration;
//! - peaks: the most requests in one window of 1 s, 10 s, 60 s, windows
//!   aligned to the first arrival (`[first + k·w, first + (k+1)·w)`);
//! - inter-arrival CV: population standard deviation / mean of the gaps
//!   between consecutive arrivals (ties are gaps of 0);
//! - index of dispersion at window w: variance / mean of the request counts
//!   of the whole aligned windows before the last arrival's (`⌊span / w⌋`
//!   of them; empty windows count; the last window is partial and left
//!   out); 0 for a constant rate, 1 for a Poisson process, far above 1 for
//!   bursty traffic; not a number with fewer than two whole windows;
//! - length percentiles: qsim's one quantile definition
//!   (`qsim_core::stats::quantile_by`, type 7) over the lengths kept as
//!   counts per distinct value (memory per distinct length, not per request).
//!
//! The fitted workload: the mean rate with gamma-distributed gaps of the
//! measured CV (a renewal process: it matches the rate and the gaps' CV,
//! not the trace's correlations across gaps, nor its daily shape), and
//! log-normal lengths through the trace's median and 95th percentile,
//! clamped to [1, the trace's maximum].

pub use super::{RateSeries, MAX_RATE_POINTS};
use super::{TraceSource, TraceSpec};
use crate::config::ConfigError;
use crate::engine::RawDist;
use crate::workload::RawArrivals;
use qsim_core::stats::quantile_by;
use std::collections::BTreeMap;

/// Windows of the peak rates (s).
pub const PEAK_WINDOWS_S: [u64; 3] = [1, 10, 60];
/// Windows of the index of dispersion (s).
pub const DISPERSION_WINDOWS_S: [u64; 4] = [1, 10, 60, 300];
/// Bins of the length histograms.
pub const HIST_BINS: usize = 60;
/// Percentiles reported of the lengths.
pub const PERCENTILES: [f64; 5] = [0.5, 0.9, 0.95, 0.99, 1.0];

/// Counts per distinct length.
#[derive(Default)]
struct Counts {
    dense: Vec<u64>,
    sparse: BTreeMap<u32, u64>,
    n: u64,
    sum: u128,
}

const DENSE: usize = 1 << 16;

impl Counts {
    #[inline]
    fn add(&mut self, v: u32) {
        if (v as usize) < DENSE {
            if self.dense.is_empty() {
                self.dense = vec![0; DENSE];
            }
            self.dense[v as usize] += 1;
        } else {
            *self.sparse.entry(v).or_default() += 1;
        }
        self.n += 1;
        self.sum += v as u128;
    }

    /// [`HIST_BINS`] equal bins from 0 to the largest value.
    fn histogram(&self) -> Vec<(f64, u64)> {
        let max = self
            .sparse
            .keys()
            .next_back()
            .copied()
            .or_else(|| self.dense.iter().rposition(|&k| k > 0).map(|v| v as u32))
            .unwrap_or(0) as f64;
        let w = (max / HIST_BINS as f64).max(1.0);
        let mut bins = vec![0u64; HIST_BINS];
        let mut put = |v: u32, k: u64| {
            let b = ((v as f64 / w) as usize).min(HIST_BINS - 1);
            bins[b] += k;
        };
        for (v, &k) in self.dense.iter().enumerate() {
            if k > 0 {
                put(v as u32, k);
            }
        }
        for (&v, &k) in &self.sparse {
            put(v, k);
        }
        bins.into_iter()
            .enumerate()
            .map(|(i, k)| (i as f64 * w, k))
            .collect()
    }

    fn summary(&self) -> LengthStats {
        // (value, cumulative count) ascending
        let mut cum = Vec::new();
        let mut c = 0u64;
        for (v, &k) in self.dense.iter().enumerate() {
            if k > 0 {
                c += k;
                cum.push((v as u32, c));
            }
        }
        for (&v, &k) in &self.sparse {
            c += k;
            cum.push((v, c));
        }
        let at = |i: usize| {
            let j = cum.partition_point(|&(_, c)| c <= i as u64);
            cum[j].0 as f64
        };
        LengthStats {
            percentiles: PERCENTILES
                .iter()
                .map(|&q| quantile_by(self.n as usize, q, at))
                .collect(),
            mean: if self.n == 0 {
                f64::NAN
            } else {
                self.sum as f64 / self.n as f64
            },
        }
    }
}

/// Percentiles ([`PERCENTILES`]) and mean of a length.
#[derive(Debug, Clone, PartialEq)]
pub struct LengthStats {
    pub percentiles: Vec<f64>,
    pub mean: f64,
}

impl LengthStats {
    fn p(&self, q: f64) -> f64 {
        let i = PERCENTILES
            .iter()
            .position(|&x| x == q)
            .expect("a reported percentile");
        self.percentiles[i]
    }
    pub fn p50(&self) -> f64 {
        self.p(0.5)
    }
    pub fn p95(&self) -> f64 {
        self.p(0.95)
    }
    pub fn max(&self) -> f64 {
        self.p(1.0)
    }
}

/// Requests per aligned window.
struct Bins {
    w: u64,
    cur: u64,
    count: u64,
    peak: u64,
    peak_bin: u64,
    sum_sq: u128,
}

impl Bins {
    fn new(w_s: u64) -> Self {
        Bins {
            w: w_s * 1_000_000_000,
            cur: 0,
            count: 0,
            peak: 0,
            peak_bin: 0,
            sum_sq: 0,
        }
    }
    #[inline]
    fn add(&mut self, since_first: u64) {
        let b = since_first / self.w;
        if b != self.cur {
            self.close();
            self.cur = b;
        }
        self.count += 1;
    }
    fn close(&mut self) {
        self.peak_check();
        self.sum_sq += self.count as u128 * self.count as u128;
        self.count = 0;
    }
    fn peak_check(&mut self) {
        if self.count > self.peak {
            self.peak = self.count;
            self.peak_bin = self.cur;
        }
    }
    /// At the end: the last window (the one holding the last arrival) is
    /// partial — it ends after the last arrival — so it counts for the peak
    /// but not for the dispersion; its requests are returned.
    fn finish(&mut self) -> u64 {
        self.peak_check();
        std::mem::take(&mut self.count)
    }
    /// Index of dispersion over the `span / w` whole windows before the
    /// last, partial one (`n_full` requests in them; empty windows count);
    /// NaN with fewer than two whole windows (no variance to speak of).
    fn dispersion(&self, span: u64, n_full: u64) -> f64 {
        let k = span / self.w;
        if k < 2 || n_full == 0 {
            return f64::NAN;
        }
        let windows = k as f64;
        let mean = n_full as f64 / windows;
        let var = (self.sum_sq as f64 / windows - mean * mean).max(0.0);
        var / mean
    }
}

/// Peak requests in a window.
#[derive(Debug, Clone, PartialEq)]
pub struct Peak {
    pub window_s: u64,
    pub requests: u64,
    /// Start of the busiest window, seconds after the first arrival.
    pub start_s: u64,
}

/// What `qsim trace stats` reports.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceStats {
    pub file: String,
    pub requests: u64,
    /// Replay time of the first arrival (s).
    pub first_s: f64,
    pub duration_s: f64,
    pub mean_rate: f64,
    pub peaks: Vec<Peak>,
    pub gap_mean_s: f64,
    pub gap_cv: f64,
    /// (window s, index of dispersion).
    pub dispersion: Vec<(u64, f64)>,
    pub input: LengthStats,
    pub output: LengthStats,
    pub input_total: u64,
    pub output_total: u64,
    /// Requests per consumer (empty with one consumer).
    pub consumers: Vec<(String, u64)>,
    /// Requests per window of arrival after the first arrival (`--plot`):
    /// minutes, or longer windows when the trace lasts longer than
    /// [`MAX_RATE_POINTS`] minutes.
    pub rate: RateSeries,
    /// Length histograms (`--plot`): [`HIST_BINS`] equal bins from 0 to the
    /// maximum, each (bin start, requests).
    pub input_hist: Vec<(f64, u64)>,
    pub output_hist: Vec<(f64, u64)>,
    pub reordered: u64,
    pub skipped: u64,
}

/// [`compute`] under the work budget: a trace whose rows are known from
/// its scan (a looped one) is counted before it is read again (a row is a
/// quarter of a simulated request); the reading itself is counted by the
/// run-time meter.
///
/// ```no_run
/// use qsim_sim::trace::{stats, RawTrace, TraceSpec};
/// let raw = RawTrace { file: "trace.csv".into(), ..Default::default() };
/// let spec = TraceSpec::from_raw("", "", std::path::Path::new(""), &raw, false).unwrap();
/// let st = stats::measure(&spec, 1, &Default::default()).unwrap();
/// print!("{}", qsim_sim::trace::render::table(&st, "azure"));
/// ```
pub fn measure(
    spec: &TraceSpec,
    seed: u64,
    budget: &crate::budget::Budget,
) -> Result<TraceStats, ConfigError> {
    if let Some((n, _)) = spec.expected() {
        let mut c = crate::budget::Cost::default();
        c.part("reading the trace", n * 0.25, 0.0);
        c.check(&spec.label(), budget)?;
    }
    compute(spec, seed)
}

/// Read the trace once and measure it.
pub fn compute(spec: &TraceSpec, seed: u64) -> Result<TraceStats, ConfigError> {
    let mut src = TraceSource::open(spec, seed, 0)?;
    // the run-time work budget: a row read is one unit (a quarter of a
    // simulated request, as a hosted-API attempt)
    let mut tally = crate::work::Tally::new();
    let mut first = None;
    let mut prev = 0u64;
    let (mut n, mut gap_mean, mut gap_m2) = (0u64, 0.0f64, 0.0f64);
    let mut peaks: Vec<Bins> = PEAK_WINDOWS_S.iter().map(|&w| Bins::new(w)).collect();
    let mut disp: Vec<Bins> = DISPERSION_WINDOWS_S.iter().map(|&w| Bins::new(w)).collect();
    let (mut inp, mut out) = (Counts::default(), Counts::default());
    let mut per: Vec<u64> = Vec::new();
    let mut rate = RateSeries::default();
    while let Some(a) = src.next()? {
        if !tally.at(n) {
            // over the budget: the command refuses (`work::check`)
            break;
        }
        let f = *first.get_or_insert(a.at);
        if n > 0 {
            // Welford over the gaps
            let g = (a.at - prev) as f64 * 1e-9;
            let k = n as f64;
            let d = g - gap_mean;
            gap_mean += d / k;
            gap_m2 += d * (g - gap_mean);
        }
        n += 1;
        prev = a.at;
        let since = a.at - f;
        for b in peaks.iter_mut().chain(disp.iter_mut()) {
            b.add(since);
        }
        rate.add(since);
        inp.add(a.input);
        out.add(a.output);
        let c = a.consumer as usize;
        if c >= per.len() {
            per.resize(c + 1, 0);
        }
        per[c] += 1;
    }
    tally.finish(n);
    crate::work::check(&spec.label())?;
    if n == 0 {
        return Err(ConfigError::new(
            spec.label(),
            "",
            if spec.from > 0 || spec.to.is_some() {
                "no requests in the window"
            } else {
                "no requests (a header only?)"
            },
        ));
    }
    let first = first.unwrap_or(0);
    let span = prev - first;
    let duration_s = span as f64 * 1e-9;
    for b in peaks.iter_mut() {
        b.finish();
    }
    let disp_full: Vec<u64> = disp.iter_mut().map(|b| n - b.finish()).collect();
    let gaps = (n - 1) as f64;
    let gap_sd = if n > 1 {
        (gap_m2 / gaps).sqrt()
    } else {
        f64::NAN
    };
    let names = src.consumer_names();
    let consumers = if names.len() > 1 || names.first().is_some_and(|n| !n.is_empty()) {
        names
            .into_iter()
            .enumerate()
            .map(|(i, nm)| (nm, per.get(i).copied().unwrap_or(0)))
            .collect()
    } else {
        Vec::new()
    };
    Ok(TraceStats {
        file: spec.label(),
        requests: n,
        first_s: first as f64 * 1e-9,
        duration_s,
        mean_rate: if span > 0 {
            n as f64 / duration_s
        } else {
            f64::NAN
        },
        peaks: peaks
            .iter()
            .map(|b| Peak {
                window_s: b.w / 1_000_000_000,
                requests: b.peak,
                start_s: b.peak_bin * (b.w / 1_000_000_000),
            })
            .collect(),
        gap_mean_s: if n > 1 { gap_mean } else { f64::NAN },
        gap_cv: if n > 1 && gap_mean > 0.0 {
            gap_sd / gap_mean
        } else {
            f64::NAN
        },
        dispersion: disp
            .iter()
            .zip(&disp_full)
            .map(|(b, &full)| (b.w / 1_000_000_000, b.dispersion(span, full)))
            .collect(),
        input: inp.summary(),
        output: out.summary(),
        rate,
        input_hist: inp.histogram(),
        output_hist: out.histogram(),
        input_total: inp.sum as u64,
        output_total: out.sum as u64,
        consumers,
        reordered: src.reordered(),
        skipped: src.skipped(),
    })
}

/// `v` to 4 significant digits, as TOML accepts it.
fn sig(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let d = (3 - v.abs().log10().floor() as i32).max(0) as usize;
    let s = format!("{v:.d$}");
    let s = if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    };
    if s.contains('.') {
        s
    } else {
        format!("{s}.0")
    }
}

/// `v` rounded as [`sig`] prints it.
fn rounded(v: f64) -> f64 {
    sig(v).parse().unwrap_or(v)
}

fn length_raw(l: &LengthStats) -> RawDist {
    let (p50, p95, max) = (l.p50(), l.p95(), l.max());
    if p50 < 1.0 || p95 <= p50 {
        RawDist::Const {
            value: rounded(p50.max(1.0)),
        }
    } else {
        RawDist::Lognormal {
            p50: rounded(p50),
            p95: rounded(p95),
            min: Some(1.0),
            max: Some(rounded(max)),
        }
    }
}

fn dist_toml(d: &RawDist) -> String {
    match d {
        RawDist::Lognormal {
            p50,
            p95,
            min: Some(lo),
            max: Some(hi),
        } => format!(
            "{{ dist = \"lognormal\", p50 = {}, p95 = {}, min = {}, max = {} }}",
            sig(*p50),
            sig(*p95),
            sig(*lo),
            sig(*hi)
        ),
        RawDist::Const { value } => format!("{{ dist = \"const\", value = {} }}", sig(*value)),
        other => unreachable!("a fitted length is const or lognormal: {other:?}"),
    }
}

/// A synthetic workload fitted to a trace.
#[derive(Debug, Clone, PartialEq)]
pub struct Fitted {
    pub rpm: f64,
    pub arrivals: RawArrivals,
    pub input: RawDist,
    pub output: RawDist,
}

impl TraceStats {
    /// The fitted workload (none for fewer than two arrivals, or all at
    /// one instant). Its numbers are rounded to 4 significant digits, as
    /// printed, so the printed workload and the one qsim plans with are
    /// the same.
    pub fn fitted(&self) -> Option<Fitted> {
        if !(self.mean_rate.is_finite() && self.mean_rate > 0.0) {
            return None;
        }
        let cv = self.gap_cv;
        let arrivals = if !cv.is_finite() || cv < 1e-3 {
            RawArrivals::Constant
        } else {
            RawArrivals::Gamma {
                cv: rounded(cv.min(crate::engine::dist::MAX_CV)),
            }
        };
        Some(Fitted {
            rpm: rounded(self.mean_rate * 60.0),
            arrivals,
            input: length_raw(&self.input),
            output: length_raw(&self.output),
        })
    }

    /// The fitted workload's fields (`rpm`, `arrivals`, `input_tokens`,
    /// `output_tokens`), one `key = value` per line, as a server
    /// experiment's scenario takes them.
    pub fn fitted_fields(&self) -> Option<String> {
        let f = self.fitted()?;
        let arrivals = match f.arrivals {
            RawArrivals::Gamma { cv } => format!("{{ process = \"gamma\", cv = {} }}", sig(cv)),
            RawArrivals::Constant => "{ process = \"constant\" }".into(),
            RawArrivals::Poisson => "{ process = \"poisson\" }".into(),
        };
        Some(format!(
            "rpm = {}\narrivals = {arrivals}\ninput_tokens = {}\noutput_tokens = {}\n",
            sig(f.rpm),
            dist_toml(&f.input),
            dist_toml(&f.output)
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_give_the_quantiles_of_the_sorted_sample() {
        let vals = [5u32, 1, 70_000, 3, 3, 9, 100_000, 2, 5];
        let mut c = Counts::default();
        for &v in &vals {
            c.add(v);
        }
        let s = c.summary();
        let sorted = qsim_core::stats::sorted(&vals.map(|v| v as f64));
        for (i, &q) in PERCENTILES.iter().enumerate() {
            assert_eq!(
                s.percentiles[i],
                qsim_core::stats::quantile(&sorted, q),
                "{q}"
            );
        }
        assert_eq!(sig(154.04), "154.0");
        assert_eq!(sig(10.6251), "10.63");
        assert_eq!(sig(2000.0), "2000.0");
        assert_eq!(sig(0.012345), "0.01235");
    }
}
