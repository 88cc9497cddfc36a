//! Tests of qsim's I/O-free core, kept in their own crate: the core's
//! dependency tree stays serde only, and a mutant of the core (see
//! `scripts/mutants.sh`) rebuilds only the core and this crate.
//!
//! - [`reference`]: reference models written from docs/limiter.md and the
//!   configuration alone (bucket sizes, charges, the single-bucket limiter,
//!   LiteLLM's window);
//! - [`traffic`]: a deterministic traffic driver for the limiter (Poisson
//!   and greedy consumers, late settlement);
//! - the property tests (`limiter_props`, `caller_props`, `rates_props`,
//!   `gateway_props`), test-only.

pub mod reference;
pub mod traffic;

#[cfg(test)]
mod caller_props;
#[cfg(test)]
mod gateway_props;
#[cfg(test)]
mod limiter_props;
#[cfg(test)]
mod rates_props;

/// SplitMix64: the tests' own deterministic generator.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x6a09_e667_f3bc_c908)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[0, 1)`.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }
}
