//! Counts of units (requests, tokens, bytes) that never wrap.
//!
//! Token counts reach the core from untrusted places: a request body's
//! `max_tokens` (any `u64`, times `n`), an upstream's `usage`, a trace's
//! columns. A sum of such counts in plain `u64` wraps in release builds
//! (`u64::MAX + 1 == 0`), and a wrapped charge would pass a limit it
//! cannot fit. [`Units`] saturates instead: every sum and product is at
//! most `u64::MAX`, which no bucket can hold, so an absurd count is denied
//! as too large, never admitted as small. The limiter's charges
//! ([`crate::limiter::rates::LimitSpec::admit_charge`]), settlements and
//! window counts are computed in it.

use serde::{Deserialize, Serialize};
use std::iter::Sum;
use std::ops::{Add, AddAssign, Mul, Sub, SubAssign};

/// A count whose arithmetic saturates (at `u64::MAX` above, at 0 below).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Units(pub u64);

impl Units {
    pub const ZERO: Units = Units(0);
    pub const MAX: Units = Units(u64::MAX);
    #[inline]
    pub const fn get(self) -> u64 {
        self.0
    }
    #[inline]
    pub fn max(self, o: Units) -> Units {
        Units(self.0.max(o.0))
    }
    #[inline]
    pub fn min(self, o: Units) -> Units {
        Units(self.0.min(o.0))
    }
}

impl From<u64> for Units {
    #[inline]
    fn from(v: u64) -> Self {
        Units(v)
    }
}

impl From<Units> for u64 {
    #[inline]
    fn from(v: Units) -> Self {
        v.0
    }
}

impl<T: Into<Units>> Add<T> for Units {
    type Output = Units;
    #[inline]
    fn add(self, o: T) -> Units {
        Units(self.0.saturating_add(o.into().0))
    }
}

impl<T: Into<Units>> AddAssign<T> for Units {
    #[inline]
    fn add_assign(&mut self, o: T) {
        *self = *self + o;
    }
}

impl<T: Into<Units>> Sub<T> for Units {
    type Output = Units;
    #[inline]
    fn sub(self, o: T) -> Units {
        Units(self.0.saturating_sub(o.into().0))
    }
}

impl<T: Into<Units>> SubAssign<T> for Units {
    #[inline]
    fn sub_assign(&mut self, o: T) {
        *self = *self - o;
    }
}

impl<T: Into<Units>> Mul<T> for Units {
    type Output = Units;
    #[inline]
    fn mul(self, o: T) -> Units {
        Units(self.0.saturating_mul(o.into().0))
    }
}

impl<T: Into<Units>> Sum<T> for Units {
    fn sum<I: Iterator<Item = T>>(it: I) -> Units {
        it.fold(Units::ZERO, |a, b| a + b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_and_products_saturate_never_wrap() {
        assert_eq!(Units(u64::MAX) + 1u64, Units::MAX);
        assert_eq!(Units(u64::MAX - 5) + Units(6), Units::MAX);
        assert_eq!(Units(3) - 5u64, Units::ZERO);
        assert_eq!(Units(u64::MAX / 2 + 1) * 2u64, Units::MAX);
        let s: Units = [u64::MAX, 1, 1].into_iter().sum();
        assert_eq!(s, Units::MAX);
        let mut u = Units(7);
        u += 3u64;
        u -= Units(20);
        assert_eq!(u, Units::ZERO);
    }
}
