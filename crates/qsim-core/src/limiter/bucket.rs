//! A continuously refilling token bucket in exact integer arithmetic.
//!
//! A bucket of `capacity` tokens per `window` refills at `capacity / window`
//! tokens per nanosecond. The level is kept in *token-nanoseconds*
//! (`tokens × window`), so refill is `elapsed × capacity` and no rounding ever
//! happens. The level may go negative (debt) when a charge is forced after
//! the fact (e.g. output tokens counted on completion).

use crate::time::{Nanos, NEVER};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBucket {
    capacity: u64,
    window: Nanos,
    /// tokens × window; at most capacity × window.
    level: i128,
    /// Time up to which refill has been applied.
    last: Nanos,
}

impl TokenBucket {
    /// A full bucket at time `now`. `capacity` and `window` must be > 0.
    pub fn full(capacity: u64, window: Nanos, now: Nanos) -> Self {
        assert!(
            capacity > 0 && window > 0,
            "bucket needs capacity and window"
        );
        TokenBucket {
            capacity,
            window,
            level: capacity as i128 * window as i128,
            last: now,
        }
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    pub fn window(&self) -> Nanos {
        self.window
    }

    #[inline]
    fn max_level(&self) -> i128 {
        self.capacity as i128 * self.window as i128
    }

    /// Apply refill up to `now` (a `now` in the past is ignored).
    #[inline]
    pub fn advance(&mut self, now: Nanos) {
        if now > self.last {
            let dt = (now - self.last) as i128;
            self.level = (self.level + dt * self.capacity as i128).min(self.max_level());
            self.last = now;
        }
    }

    /// Whole tokens available at `now` (negative while in debt).
    pub fn available(&self, now: Nanos) -> i64 {
        let mut b = self.clone();
        b.advance(now);
        b.level.div_euclid(self.window as i128) as i64
    }

    /// Fraction of capacity available at `now`, in [-inf, 1].
    pub fn fill_fraction(&self, now: Nanos) -> f64 {
        let mut b = self.clone();
        b.advance(now);
        b.level as f64 / self.max_level() as f64
    }

    /// Earliest time at which `n` tokens are available, or `NEVER` if `n`
    /// exceeds the capacity. `now` itself if they are available already.
    pub fn earliest(&self, now: Nanos, n: u64) -> Nanos {
        if n > self.capacity {
            return NEVER;
        }
        let mut b = self.clone();
        b.advance(now);
        let need = n as i128 * self.window as i128 - b.level;
        if need <= 0 {
            return now.max(b.last);
        }
        let dt = (need + self.capacity as i128 - 1) / self.capacity as i128;
        b.last.saturating_add(dt.min(u64::MAX as i128) as u64)
    }

    /// Can `n` tokens be taken at `now`? `Err(t)` gives the earliest time they can.
    pub fn check(&self, now: Nanos, n: u64) -> Result<(), Nanos> {
        let t = self.earliest(now, n);
        if t <= now {
            Ok(())
        } else {
            Err(t)
        }
    }

    /// Take `n` tokens if available; otherwise leave the bucket unchanged and
    /// return the earliest time a retry could pass.
    pub fn try_take(&mut self, now: Nanos, n: u64) -> Result<(), Nanos> {
        self.check(now, n)?;
        self.force_take(now, n);
        Ok(())
    }

    /// Take `n` tokens unconditionally (the level may go negative).
    #[inline]
    pub fn force_take(&mut self, now: Nanos, n: u64) {
        self.advance(now);
        self.level -= n as i128 * self.window as i128;
    }

    /// Give back `n` tokens at `now`; the level never exceeds capacity.
    #[inline]
    pub fn refund(&mut self, now: Nanos, n: u64) {
        self.advance(now);
        self.level = (self.level + n as i128 * self.window as i128).min(self.max_level());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NS_PER_SEC;

    const MIN: Nanos = 60 * NS_PER_SEC;

    #[test]
    fn take_refill_refund() {
        let mut b = TokenBucket::full(20_000, MIN, 0);
        assert_eq!(b.available(0), 20_000);
        for _ in 0..78 {
            b.try_take(0, 256).unwrap();
        }
        assert_eq!(b.available(0), 20_000 - 78 * 256);
        // 32 left, 256 needed: 224 tokens at 1/3 token per ms = 672 ms.
        let t = b.try_take(0, 256).unwrap_err();
        assert_eq!(t, 672 * 1_000_000);
        assert!(b.try_take(t - 1, 256).is_err());
        assert!(b.try_take(t, 256).is_ok());
        b.refund(t, 1_000_000);
        assert_eq!(b.available(t), 20_000, "refund capped at capacity");
    }

    #[test]
    fn over_capacity_is_never() {
        let b = TokenBucket::full(100, MIN, 0);
        assert_eq!(b.check(0, 101), Err(NEVER));
    }

    #[test]
    fn debt_then_recovery() {
        let mut b = TokenBucket::full(60, MIN, 0);
        b.force_take(0, 120); // 60 in debt
        assert_eq!(b.available(0), -60);
        assert_eq!(b.earliest(0, 1), 61 * NS_PER_SEC);
    }
}
