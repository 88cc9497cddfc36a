//! qsim's I/O-free core.
//!
//! Everything here is a sans-IO state machine: it is handed `now`
//! ([`time::Nanos`], integer nanoseconds) and returns decisions and the time
//! of its next deadline. It never reads a clock, spawns a task, does I/O or
//! owns a random generator: random draws come in through [`Uniform`]. The
//! simulator drives it in virtual time; the live tokio code drives the same
//! code in real time.
//!
//! - [`time`]: `Nanos`, conversions, `NEVER`;
//! - [`units`]: counts (requests, tokens) whose sums saturate, never wrap;
//! - [`autoscale`]: the autoscaler (replicas between a minimum and a maximum
//!   from a windowed metric, cold start, scale-down delay);
//! - [`stats`]: the one quantile definition (linear, type 7);
//! - [`limiter`]: token buckets, provider rate limits, the admission limiter;
//! - [`client`]: retry policies, the SDK's hidden retry layer, client-side
//!   throttles, the managed executor's AIMD window and the caller state
//!   machine that combines them;
//! - [`route`]: which target (replica, pool, upstream) takes a request:
//!   first open, round robin, weighted, least outstanding, least KV,
//!   spillover thresholds, llm-d-style scorers;
//! - [`model`]: the sans-IO model interface (`Backend`: a simulated endpoint
//!   answering generation requests in model time), which `qsim serve` and
//!   the proxy's drift shadow drive and the root crate implements.

pub mod autoscale;
pub mod client;
pub mod limiter;
pub mod model;
pub mod route;
pub mod stats;
pub mod time;
pub mod units;

/// A source of uniform draws in `[0, 1)`, supplied by the driver (the
/// simulator's seeded ChaCha streams, or the live client's generator).
pub trait Uniform {
    fn unit(&mut self) -> f64;
}

impl<F: FnMut() -> f64> Uniform for F {
    #[inline]
    fn unit(&mut self) -> f64 {
        self()
    }
}

/// A small deterministic generator for the core's own tests (SplitMix64).
#[cfg(test)]
pub(crate) fn test_rng(seed: u64) -> impl FnMut() -> f64 {
    let mut s = seed;
    move || {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}
