//! Seeded random streams: one ChaCha8 stream per (seed, component).
//!
//! Components never share a stream, so adding draws in one component never
//! shifts the numbers another component sees.

use rand::SeedableRng;
pub use rand_chacha::ChaCha8Rng as Rng;

/// Well-known component ids. Stream ids are `(scope << 16) | component`, where
/// `scope` separates e.g. experiments or replicas inside one run.
pub mod component {
    pub const ENDPOINT: u64 = 1;
    pub const CLIENT: u64 = 2;
    pub const WORKLOAD: u64 = 3;
    pub const SERVER: u64 = 4;
    pub const LIMITER: u64 = 5;
    pub const ARRIVALS: u64 = 6;
    pub const ROUTER: u64 = 7;
    /// `qsim calibrate bench`'s prompt token ids (scope: the request's index).
    pub const PROMPT: u64 = 8;
    /// The gateway's weighted choices among upstreams (`hosted::routed`).
    pub const GATEWAY: u64 = 9;
}

/// A deterministic random stream for `(seed, scope, component)`.
pub fn stream(seed: u64, scope: u64, component: u64) -> Rng {
    let mut r = Rng::seed_from_u64(seed);
    r.set_stream((scope << 16) | component);
    r
}

/// A uniform draw in [0, 1).
#[inline]
pub fn unit(rng: &mut Rng) -> f64 {
    use rand::RngCore;
    // 53 random bits → [0,1)
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// The core's [`qsim_core::Uniform`] over a stream: the same draws as [`unit`].
#[inline]
pub fn draws(rng: &mut Rng) -> impl FnMut() -> f64 + '_ {
    move || unit(rng)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn streams_are_reproducible_and_distinct() {
        let a: Vec<f64> = {
            let mut r = stream(7, 0, component::CLIENT);
            (0..4).map(|_| unit(&mut r)).collect()
        };
        let b: Vec<f64> = {
            let mut r = stream(7, 0, component::CLIENT);
            (0..4).map(|_| unit(&mut r)).collect()
        };
        let c: Vec<f64> = {
            let mut r = stream(7, 0, component::ENDPOINT);
            (0..4).map(|_| unit(&mut r)).collect()
        };
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| (0.0..1.0).contains(x)));
    }
}
