//! Client-side throttles shared by all workers of one client (sans-IO).
//!
//! - [`RetryQuota`]: the AWS SDKs' "standard" retry mode quota: a bucket of
//!   500 retry permissions; a retry costs 5, a successful first attempt gives
//!   1 back and a successful retry gives its cost back. When the bucket cannot
//!   pay for a retry, the error is surfaced instead of retried.
//! - [`AdaptiveThrottle`]: Google SRE client-side adaptive throttling
//!   (*Site Reliability Engineering*, ch. 21): over the last `window` the
//!   client counts `requests` it attempted and `accepts` the backend did not
//!   reject for overload, and rejects a new request locally with probability
//!   `max(0, (requests − K·accepts) / (requests + 1))`.

use crate::time::Nanos;
use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq)]
pub struct RetryQuota {
    capacity: u32,
    cost: u32,
    success_increment: u32,
    level: u32,
}

impl RetryQuota {
    pub fn new(capacity: u32, cost: u32, success_increment: u32) -> Self {
        RetryQuota {
            capacity,
            cost,
            success_increment,
            level: capacity,
        }
    }

    /// AWS SDK standard mode: 500 permissions, 5 per retry, 1 back per success.
    pub fn aws_standard() -> Self {
        Self::new(500, 5, 1)
    }

    #[inline]
    pub fn level(&self) -> u32 {
        self.level
    }

    /// Take the permission for one retry; `false` if the quota cannot pay.
    #[inline]
    pub fn try_acquire(&mut self) -> bool {
        if self.level >= self.cost {
            self.level -= self.cost;
            true
        } else {
            false
        }
    }

    /// A call succeeded; `was_retry` if it took more than one attempt.
    #[inline]
    pub fn on_success(&mut self, was_retry: bool) {
        let back = if was_retry {
            self.cost
        } else {
            self.success_increment
        };
        self.level = (self.level + back).min(self.capacity);
    }
}

/// Google SRE adaptive throttling with counts kept in one-second slots, so
/// each operation is O(1) amortised and memory is bounded by the window.
#[derive(Debug, Clone, PartialEq)]
pub struct AdaptiveThrottle {
    k: f64,
    window: Nanos,
    slot: Nanos,
    /// (slot start, requests, accepts), oldest first.
    slots: VecDeque<(Nanos, u64, u64)>,
    requests: u64,
    accepts: u64,
}

impl AdaptiveThrottle {
    pub fn new(k: f64, window: Nanos) -> Self {
        AdaptiveThrottle {
            k,
            window: window.max(1),
            slot: (window / 120).max(1),
            slots: VecDeque::new(),
            requests: 0,
            accepts: 0,
        }
    }

    fn expire(&mut self, now: Nanos) {
        while let Some(&(t, r, a)) = self.slots.front() {
            if t + self.slot + self.window <= now {
                self.slots.pop_front();
                self.requests -= r;
                self.accepts -= a;
            } else {
                break;
            }
        }
    }

    /// The probability of rejecting a request locally at `now`.
    #[inline]
    pub fn reject_probability(&mut self, now: Nanos) -> f64 {
        self.expire(now);
        let r = self.requests as f64;
        ((r - self.k * self.accepts as f64) / (r + 1.0)).max(0.0)
    }

    /// Count one request at `now`; `accepted` if the backend did not reject
    /// it for overload (a local rejection is not accepted).
    #[inline]
    pub fn record(&mut self, now: Nanos, accepted: bool) {
        self.expire(now);
        let start = now - now % self.slot;
        match self.slots.back_mut() {
            Some(s) if s.0 == start => {
                s.1 += 1;
                s.2 += u64::from(accepted);
            }
            _ => self.slots.push_back((start, 1, u64::from(accepted))),
        }
        self.requests += 1;
        self.accepts += u64::from(accepted);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NS_PER_SEC;

    #[test]
    fn quota_drains_and_refills() {
        let mut q = RetryQuota::aws_standard();
        for _ in 0..100 {
            assert!(q.try_acquire());
        }
        assert!(!q.try_acquire(), "500 / 5 = 100 retries");
        q.on_success(true);
        assert!(q.try_acquire());
        for _ in 0..1000 {
            q.on_success(false);
        }
        assert_eq!(q.level(), 500, "capped");
    }

    #[test]
    fn sre_throttle_formula_and_window() {
        let mut t = AdaptiveThrottle::new(2.0, 120 * NS_PER_SEC);
        assert_eq!(t.reject_probability(0), 0.0);
        // 100 requests, 10 accepted: (100 - 20) / 101
        for i in 0..100 {
            t.record(i * NS_PER_SEC / 10, i < 10);
        }
        let p = t.reject_probability(10 * NS_PER_SEC);
        assert!((p - 80.0 / 101.0).abs() < 1e-12, "{p}");
        // all healthy: never rejects while accepts ≥ requests / K
        let mut h = AdaptiveThrottle::new(2.0, 120 * NS_PER_SEC);
        for i in 0..1000 {
            h.record(i * NS_PER_SEC / 100, true);
        }
        assert_eq!(h.reject_probability(10 * NS_PER_SEC), 0.0);
        // the window forgets: 3 minutes later the old counts are gone
        assert_eq!(t.reject_probability(200 * NS_PER_SEC), 0.0);
    }
}
