//! The proxy's one clock: the core's `now` and its conversion back to a
//! tokio instant (for waiting until a limiter's retry time). Everything that
//! reads time for the limiter goes through here. With a time scale X ≠ 1
//! (compressed time for tests against `qsim load --time-scale X`), the
//! core's time is (base + real elapsed) × X; at X = 1 the exact integer path.

use qsim_core::time::{Nanos, NEVER};
use std::time::{Duration, Instant};

#[derive(Clone, Copy)]
pub struct Clock {
    start: Instant,
    /// The core's time at `start` (0 in-process; the shared epoch's offset
    /// with a shared state).
    base: Nanos,
    /// Virtual time runs this many times faster than real time (1: real).
    scale: f64,
}

impl Clock {
    pub fn new(base: Nanos, scale: f64) -> Clock {
        Clock {
            start: Instant::now(),
            base,
            scale,
        }
    }

    /// The core's `now`: monotonic nanoseconds.
    pub fn now(&self) -> Nanos {
        let real = self.base as u128 + self.start.elapsed().as_nanos();
        let t = if self.scale == 1.0 {
            real
        } else {
            (real as f64 * self.scale) as u128
        };
        t.min(NEVER as u128 - 1) as Nanos
    }

    /// The tokio instant at which the core's time reaches `t`.
    pub fn instant_at(&self, t: Nanos) -> tokio::time::Instant {
        let real_t = if self.scale == 1.0 {
            t
        } else {
            (t as f64 / self.scale) as u64
        };
        let since = real_t.saturating_sub(self.base);
        // clamp far-away times (NEVER) to a day: callers bound waits anyway
        let since = Duration::from_nanos(since.min(86_400 * 1_000_000_000 + self.elapsed_ns()));
        tokio::time::Instant::from_std(self.start + since)
    }

    fn elapsed_ns(&self) -> u64 {
        self.start.elapsed().as_nanos().min(u64::MAX as u128) as u64
    }
}
