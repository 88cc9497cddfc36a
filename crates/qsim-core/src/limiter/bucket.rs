//! A continuously refilling token bucket in exact integer arithmetic.
//!
//! A bucket of `capacity` tokens per `window` refills at `capacity / window`
//! tokens per nanosecond. The level is kept in *token-nanoseconds*
//! (`tokens × window`), so refill is `elapsed × capacity` and no rounding ever
//! happens. The level may go negative (debt) when a charge is forced after
//! the fact (e.g. output tokens counted on completion).

use crate::time::{Nanos, NEVER};
use serde::{Deserialize, Serialize};

/// The fixed part of a token bucket: `capacity` tokens per `window`. Its
/// methods work on a bare level (token·ns), so a limiter can keep the specs in
/// its immutable parameters and only the levels in its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BucketSpec {
    capacity: u64,
    window: Nanos,
}

impl BucketSpec {
    /// `capacity` and `window` must be > 0.
    pub fn new(capacity: u64, window: Nanos) -> Result<Self, String> {
        if capacity == 0 || window == 0 {
            return Err(format!(
                "a token bucket needs capacity > 0 and window > 0, got {capacity} per {window} ns"
            ));
        }
        Ok(BucketSpec { capacity, window })
    }
    /// Like [`new`](Self::new), with a zero capacity or window raised to 1.
    pub fn at_least_one(capacity: u64, window: Nanos) -> Self {
        BucketSpec {
            capacity: capacity.max(1),
            window: window.max(1),
        }
    }
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.capacity
    }
    #[inline]
    pub fn window(&self) -> Nanos {
        self.window
    }
    /// The level (token·ns) of a full bucket.
    #[inline]
    pub fn full_level(&self) -> i128 {
        self.capacity as i128 * self.window as i128
    }
    /// The level at `to` of a bucket that held `level` at `from` (refill,
    /// capped at capacity; `to ≤ from` changes nothing).
    #[inline]
    pub fn refill(&self, level: i128, from: Nanos, to: Nanos) -> i128 {
        if to > from {
            level
                .saturating_add(((to - from) as i128).saturating_mul(self.capacity as i128))
                .min(self.full_level())
        } else {
            level
        }
    }
    /// Whole tokens in `level` (negative while in debt).
    #[inline]
    pub fn whole(&self, level: i128) -> i64 {
        level.div_euclid(self.window as i128) as i64
    }
    /// Fraction of capacity in `level`, in [-inf, 1].
    #[inline]
    pub fn fraction(&self, level: i128) -> f64 {
        level as f64 / self.full_level() as f64
    }
    /// Earliest time ≥ `at` at which `n` tokens are available, given the
    /// `level` at `at`; `NEVER` if `n` exceeds the capacity.
    #[inline]
    pub fn earliest(&self, level: i128, at: Nanos, n: u64) -> Nanos {
        if n > self.capacity {
            return NEVER;
        }
        let need = (n as i128)
            .saturating_mul(self.window as i128)
            .saturating_sub(level);
        if need <= 0 {
            return at;
        }
        let dt = (need + self.capacity as i128 - 1) / self.capacity as i128;
        at.saturating_add(dt.min(u64::MAX as i128) as u64)
    }
    /// Take `n` tokens unconditionally (the level may go negative).
    #[inline]
    pub fn take(&self, level: &mut i128, n: u64) {
        // saturating: a forced charge of an absurd count (an upstream's
        // usage) is a deep debt, never a wrap to a full bucket
        *level = level.saturating_sub((n as i128).saturating_mul(self.window as i128));
    }
    /// Give back `n` tokens; the level never exceeds capacity.
    #[inline]
    pub fn refund(&self, level: &mut i128, n: u64) {
        *level = level
            .saturating_add((n as i128).saturating_mul(self.window as i128))
            .min(self.full_level());
    }
}

/// A [`BucketSpec`] with its own level and time (the provider limits keep
/// one per limit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenBucket {
    #[serde(flatten)]
    spec: BucketSpec,
    /// tokens × window; at most capacity × window.
    level: i128,
    /// Time up to which refill has been applied.
    last: Nanos,
}

impl TokenBucket {
    /// A full bucket at time `now`.
    pub fn full(spec: BucketSpec, now: Nanos) -> Self {
        TokenBucket {
            level: spec.full_level(),
            spec,
            last: now,
        }
    }

    #[inline]
    pub fn spec(&self) -> BucketSpec {
        self.spec
    }
    #[inline]
    pub fn capacity(&self) -> u64 {
        self.spec.capacity
    }
    #[inline]
    pub fn window(&self) -> Nanos {
        self.spec.window
    }

    /// Apply refill up to `now` (a `now` in the past is ignored).
    #[inline]
    pub fn advance(&mut self, now: Nanos) {
        if now > self.last {
            self.level = self.spec().refill(self.level, self.last, now);
            self.last = now;
        }
    }

    /// Whole tokens available at `now` (negative while in debt).
    #[inline]
    pub fn available(&self, now: Nanos) -> i64 {
        let s = self.spec();
        s.whole(s.refill(self.level, self.last, now))
    }

    /// Fraction of capacity available at `now`, in [-inf, 1].
    #[inline]
    pub fn fill_fraction(&self, now: Nanos) -> f64 {
        let s = self.spec();
        s.fraction(s.refill(self.level, self.last, now))
    }

    /// Earliest time at which `n` tokens are available, or `NEVER` if `n`
    /// exceeds the capacity. `now` itself if they are available already.
    #[inline]
    pub fn earliest(&self, now: Nanos, n: u64) -> Nanos {
        let s = self.spec();
        s.earliest(s.refill(self.level, self.last, now), now.max(self.last), n)
    }

    /// Can `n` tokens be taken at `now`? `Err(t)` gives the earliest time they can.
    #[inline]
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
    #[inline]
    pub fn try_take(&mut self, now: Nanos, n: u64) -> Result<(), Nanos> {
        self.check(now, n)?;
        self.force_take(now, n);
        Ok(())
    }

    /// Take `n` tokens unconditionally (the level may go negative).
    #[inline]
    pub fn force_take(&mut self, now: Nanos, n: u64) {
        self.advance(now);
        self.spec().take(&mut self.level, n);
    }

    /// Give back `n` tokens at `now`; the level never exceeds capacity.
    #[inline]
    pub fn refund(&mut self, now: Nanos, n: u64) {
        self.advance(now);
        self.spec().refund(&mut self.level, n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NS_PER_SEC;

    const MIN: Nanos = 60 * NS_PER_SEC;

    #[test]
    fn take_refill_refund() {
        let mut b = TokenBucket::full(BucketSpec::new(20_000, MIN).unwrap(), 0);
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
        let b = TokenBucket::full(BucketSpec::new(100, MIN).unwrap(), 0);
        assert_eq!(b.check(0, 101), Err(NEVER));
    }

    #[test]
    fn debt_then_recovery() {
        let mut b = TokenBucket::full(BucketSpec::new(60, MIN).unwrap(), 0);
        b.force_take(0, 120); // 60 in debt
        assert_eq!(b.available(0), -60);
        assert_eq!(b.earliest(0, 1), 61 * NS_PER_SEC);
    }

    #[test]
    fn zero_capacity_or_window_is_an_error() {
        assert!(BucketSpec::new(0, MIN).is_err());
        assert!(BucketSpec::new(10, 0).is_err());
    }
}
