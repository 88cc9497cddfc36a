//! Virtual time: integer nanoseconds since the start of a simulation.
//!
//! The cores never read a clock; they are handed `now: Nanos`.

/// Nanoseconds since the simulation (or proxy) epoch.
pub type Nanos = u64;

pub const NS_PER_SEC: u64 = 1_000_000_000;
pub const NS_PER_MS: u64 = 1_000_000;
/// A time that never comes (used for "never admissible").
pub const NEVER: Nanos = u64::MAX;

/// Seconds (f64) to nanoseconds, rounded to the nearest nanosecond and clamped at 0.
#[inline]
pub fn secs(s: f64) -> Nanos {
    if s <= 0.0 || s.is_nan() {
        0
    } else if s >= (u64::MAX / NS_PER_SEC) as f64 {
        NEVER
    } else {
        (s * NS_PER_SEC as f64).round() as Nanos
    }
}

/// Nanoseconds to seconds.
#[inline]
pub fn to_secs(n: Nanos) -> f64 {
    n as f64 / NS_PER_SEC as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn round_trip() {
        assert_eq!(secs(1.5), 1_500_000_000);
        assert_eq!(secs(-1.0), 0);
        assert_eq!(to_secs(250_000_000), 0.25);
        assert_eq!(secs(1e30), NEVER);
    }
}
