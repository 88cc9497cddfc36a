//! The one clock of every real-time driver here (the proxy and its drift
//! shadow, `qsim serve`, `qsim load`, `qsim replay`): model time in integer
//! nanoseconds, and its conversions to and from real time.
//!
//! Model time is `(base + real elapsed since start) × scale`: `scale` is the
//! time scale (model seconds per real second; 1 is real time, and then the
//! exact integer path), `base` the model time at start in real nanoseconds
//! (0, except for a proxy whose limiter state is shared: the wall clock
//! since the shared epoch). Every conversion back to real time rounds *up*,
//! so that sleeping until [`Clock::instant_at`]`(t)` wakes at a `now()` of
//! at least `t` (a waiter woken a nanosecond early would decide again and be
//! told the same retry time).

use qsim_core::time::{Nanos, NEVER};
use std::time::{Duration, Instant};

/// Real durations beyond this (~31.7 years) are clamped: far-away model
/// times (`NEVER`) stay representable as instants; callers bound their
/// waits anyway.
const MAX_REAL_NS: u64 = 1_000_000_000_000_000_000;

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    start: Instant,
    /// The model time at `start`, in real nanoseconds.
    base: Nanos,
    /// Model time runs this many times faster than real time (1: real).
    scale: f64,
}

impl Clock {
    /// A clock starting now at model time `base × scale`.
    pub fn new(base: Nanos, scale: f64) -> Clock {
        Clock {
            start: Instant::now(),
            base,
            scale,
        }
    }

    /// The time scale (model seconds per real second).
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Real time since the start.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// Model `now`: monotonic nanoseconds (below `NEVER`).
    pub fn now(&self) -> Nanos {
        let real = self.base as u128 + self.start.elapsed().as_nanos();
        let t = if self.scale == 1.0 {
            real
        } else {
            (real as f64 * self.scale) as u128
        };
        t.min(NEVER as u128 - 1) as Nanos
    }

    /// A model duration in real time (rounded up to the nanosecond).
    pub fn real(&self, d: Nanos) -> Duration {
        Duration::from_nanos(self.real_ns(d))
    }

    /// A real duration (in nanoseconds) in model time.
    pub fn model(&self, real: Nanos) -> Nanos {
        if self.scale == 1.0 {
            real
        } else {
            (real as f64 * self.scale) as Nanos
        }
    }

    /// The instant at which model time reaches `t` (rounded up).
    pub fn at(&self, t: Nanos) -> Instant {
        let real_t = self.real_ns(t);
        self.start + Duration::from_nanos(real_t.saturating_sub(self.base).min(MAX_REAL_NS))
    }

    /// [`Clock::at`] as a tokio instant (for `sleep_until`).
    pub fn instant_at(&self, t: Nanos) -> tokio::time::Instant {
        tokio::time::Instant::from_std(self.at(t))
    }

    fn real_ns(&self, d: Nanos) -> u64 {
        if self.scale == 1.0 {
            d.min(MAX_REAL_NS)
        } else {
            (d as f64 / self.scale).ceil().min(MAX_REAL_NS as f64) as u64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waking_at_an_instant_reaches_its_model_time() {
        for scale in [1.0, 3.0, 7.5, 0.25] {
            let c = Clock::new(0, scale);
            for t in [1, 999, 1_000_001, 3_333_333_333] {
                let real = c.at(t).duration_since(c.start).as_nanos() as f64;
                assert!(real * scale >= t as f64, "scale {scale}, t {t}");
                assert!((real - 1.0) * scale < t as f64, "scale {scale}, t {t}");
            }
        }
    }

    #[test]
    fn far_times_are_clamped_not_overflowed() {
        let c = Clock::new(0, 2.0);
        assert!(c.at(NEVER) >= c.at(NEVER / 4));
        let _ = c.instant_at(NEVER);
        assert_eq!(
            Clock::new(0, 1.0).real(NEVER),
            Duration::from_nanos(MAX_REAL_NS)
        );
    }

    #[test]
    fn durations_both_ways() {
        let c = Clock::new(0, 10.0);
        assert_eq!(c.real(25), Duration::from_nanos(3));
        assert_eq!(c.model(3), 30);
        let one = Clock::new(0, 1.0);
        assert_eq!(one.real(25), Duration::from_nanos(25));
        assert_eq!(one.model(25), 25);
    }
}
