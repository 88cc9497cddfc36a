//! Client retry policies: the caller's own backoff and the SDK's hidden
//! retry layer. Pure functions of (attempt, previous delay, hint, rng).

use crate::time::{secs, Nanos};
use crate::Uniform;

/// Which HTTP statuses a layer retries.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusSet {
    codes: Vec<u16>,
    any_4xx: bool,
    any_5xx: bool,
}

impl StatusSet {
    pub fn parse(items: &[String]) -> Result<Self, String> {
        let mut s = StatusSet::default();
        for it in items {
            match it.trim().to_ascii_lowercase().as_str() {
                "5xx" => s.any_5xx = true,
                "4xx" => s.any_4xx = true,
                other => {
                    let c: u16 = other
                        .parse()
                        .ok()
                        .filter(|c| (100..600).contains(c))
                        .ok_or_else(|| {
                            format!("{it:?} is not an HTTP status, \"4xx\" or \"5xx\"")
                        })?;
                    s.codes.push(c);
                }
            }
        }
        Ok(s)
    }

    /// The OpenAI Python SDK's set: 408, 409, 429 and every 5xx.
    pub fn openai_sdk() -> Self {
        StatusSet {
            codes: vec![408, 409, 429],
            any_4xx: false,
            any_5xx: true,
        }
    }

    #[inline]
    pub fn contains(&self, status: u16) -> bool {
        (self.any_5xx && (500..600).contains(&status))
            || (self.any_4xx && (400..500).contains(&status))
            || self.codes.contains(&status)
    }
}

/// How long to wait before the next attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Backoff {
    /// Never retry.
    None,
    /// A fixed delay.
    Constant { delay: f64 },
    /// `min(base·2^n, cap) + U[0, jitter)` — the article's policy (n = 0 for
    /// the first retry). A retry hint replaces the exponential term.
    Exponential { base: f64, cap: f64, jitter: f64 },
    /// AWS "full jitter": `U(0, min(cap, base·2^n))`.
    FullJitter { base: f64, cap: f64 },
    /// AWS "equal jitter": `v/2 + U(0, v/2)`, `v = min(cap, base·2^n)`.
    EqualJitter { base: f64, cap: f64 },
    /// AWS "decorrelated jitter": `min(cap, U(base, 3·prev))`, prev₀ = base.
    Decorrelated { base: f64, cap: f64 },
}

/// The caller's retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    pub backoff: Backoff,
    /// Total attempts including the first (1 = no retry).
    pub max_attempts: u32,
    pub retry_on: StatusSet,
    /// Use a retry hint (Retry-After, retry-after-ms, body retry_after) when present.
    pub honor_hint: bool,
}

impl RetryPolicy {
    pub fn none() -> Self {
        RetryPolicy {
            backoff: Backoff::None,
            max_attempts: 1,
            retry_on: StatusSet::default(),
            honor_hint: false,
        }
    }

    /// Should a failure with `status` on attempt number `attempt` (1-based)
    /// be retried?
    #[inline]
    pub fn should_retry(&self, attempt: u32, status: u16) -> bool {
        !matches!(self.backoff, Backoff::None)
            && attempt < self.max_attempts
            && self.retry_on.contains(status)
    }

    /// The delay after failed attempt number `attempt` (1-based), given the
    /// previous delay (decorrelated jitter) and the response's hint.
    pub fn delay(
        &self,
        attempt: u32,
        prev: Nanos,
        hint: Option<Nanos>,
        rng: &mut impl Uniform,
    ) -> Nanos {
        let n = attempt.saturating_sub(1).min(62) as i32;
        let hint = if self.honor_hint { hint } else { None };
        match self.backoff {
            Backoff::None => 0,
            Backoff::Constant { delay } => hint.unwrap_or(secs(delay)),
            Backoff::Exponential { base, cap, jitter } => {
                let core = hint.unwrap_or_else(|| secs((base * 2f64.powi(n)).min(cap)));
                core + secs(jitter * rng.unit())
            }
            Backoff::FullJitter { base, cap } => {
                hint.unwrap_or_else(|| secs(rng.unit() * (base * 2f64.powi(n)).min(cap)))
            }
            Backoff::EqualJitter { base, cap } => hint.unwrap_or_else(|| {
                let v = (base * 2f64.powi(n)).min(cap);
                secs(v / 2.0 + rng.unit() * v / 2.0)
            }),
            Backoff::Decorrelated { base, cap } => hint.unwrap_or_else(|| {
                let prev_s = if prev == 0 { base } else { prev as f64 / 1e9 };
                let hi = (3.0 * prev_s).max(base);
                secs((base + rng.unit() * (hi - base)).min(cap))
            }),
        }
    }
}

/// The SDK's built-in retry layer (OpenAI Python SDK defaults, checked
/// against openai 3.57 `_base_client.py` / `_constants.py`): up to
/// `max_retries` (2) retries of 408/409/429/5xx, delay
/// `min(0.5·2^n, 8) × (1 − 0.25·U)`; a retry-after hint with
/// `0 < v ≤ hint_max` (120 s) is obeyed exactly. A hint above `hint_max`
/// stops the SDK from retrying (current SDKs); older 1.x SDKs had a 60 s
/// ceiling and fell back to the exponential delay instead
/// (`hint_over_max_backoff = true`).
#[derive(Debug, Clone, PartialEq)]
pub struct SdkRetry {
    pub max_retries: u32,
    pub initial: f64,
    pub max_delay: f64,
    pub hint_max: f64,
    pub hint_over_max_backoff: bool,
    pub retry_on: StatusSet,
}

impl Default for SdkRetry {
    fn default() -> Self {
        SdkRetry {
            max_retries: 2,
            initial: 0.5,
            max_delay: 8.0,
            hint_max: 120.0,
            hint_over_max_backoff: false,
            retry_on: StatusSet::openai_sdk(),
        }
    }
}

impl SdkRetry {
    /// Does the SDK retry a failure with `status` and `hint`, having used `used` retries?
    #[inline]
    pub fn should_retry(&self, used: u32, status: u16, hint: Option<Nanos>) -> bool {
        used < self.max_retries
            && self.retry_on.contains(status)
            && (self.hint_over_max_backoff || hint.is_none_or(|h| h <= secs(self.hint_max)))
    }

    /// Delay before SDK retry number `n` (0-based).
    pub fn delay(&self, n: u32, hint: Option<Nanos>, rng: &mut impl Uniform) -> Nanos {
        if let Some(h) = hint {
            if h > 0 && h <= secs(self.hint_max) {
                return h;
            }
        }
        let d = (self.initial * 2f64.powi(n.min(62) as i32)).min(self.max_delay);
        secs(d * (1.0 - 0.25 * rng.unit()))
    }
}

/// A retry policy as written in an experiment file.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::NS_PER_SEC;

    fn pol(b: Backoff) -> RetryPolicy {
        RetryPolicy {
            backoff: b,
            max_attempts: 8,
            retry_on: StatusSet::parse(&["429".into(), "5xx".into()]).unwrap(),
            honor_hint: true,
        }
    }

    #[test]
    fn article_exponential() {
        let p = pol(Backoff::Exponential {
            base: 1.0,
            cap: 32.0,
            jitter: 1.0,
        });
        let mut r = crate::test_rng(1);
        for (attempt, lo) in [(1, 1.0), (2, 2.0), (3, 4.0), (6, 32.0), (7, 32.0)] {
            let d = p.delay(attempt, 0, None, &mut r) as f64 / 1e9;
            assert!(d >= lo && d < lo + 1.0, "attempt {attempt}: {d}");
        }
        // a hint replaces the exponential term, jitter stays
        let d = p.delay(5, 0, Some(3 * NS_PER_SEC), &mut r) as f64 / 1e9;
        assert!((3.0..4.0).contains(&d));
        assert!(p.should_retry(7, 429));
        assert!(!p.should_retry(8, 429));
        assert!(!p.should_retry(1, 400));
        assert!(p.should_retry(1, 503));
    }

    #[test]
    fn jitter_families_stay_in_range() {
        let mut r = crate::test_rng(2);
        for _ in 0..1000 {
            let d = pol(Backoff::FullJitter {
                base: 1.0,
                cap: 10.0,
            })
            .delay(4, 0, None, &mut r);
            assert!(d <= 8 * NS_PER_SEC);
            let d = pol(Backoff::EqualJitter {
                base: 1.0,
                cap: 10.0,
            })
            .delay(5, 0, None, &mut r);
            assert!((5 * NS_PER_SEC..=10 * NS_PER_SEC).contains(&d));
            let d = pol(Backoff::Decorrelated {
                base: 1.0,
                cap: 10.0,
            })
            .delay(3, 2 * NS_PER_SEC, None, &mut r);
            assert!((NS_PER_SEC..=6 * NS_PER_SEC).contains(&d));
        }
    }

    #[test]
    fn sdk_defaults() {
        let s = SdkRetry::default();
        let mut r = crate::test_rng(3);
        for _ in 0..100 {
            let d0 = s.delay(0, None, &mut r) as f64 / 1e9;
            let d1 = s.delay(1, None, &mut r) as f64 / 1e9;
            let d9 = s.delay(9, None, &mut r) as f64 / 1e9;
            assert!((0.375..=0.5).contains(&d0));
            assert!((0.75..=1.0).contains(&d1));
            assert!((6.0..=8.0).contains(&d9));
        }
        assert_eq!(s.delay(0, Some(2 * NS_PER_SEC), &mut r), 2 * NS_PER_SEC);
        assert_eq!(s.delay(0, Some(90 * NS_PER_SEC), &mut r), 90 * NS_PER_SEC);
        // a hint above the SDK's ceiling: current SDKs give up, old ones back off
        assert!(s.should_retry(0, 429, Some(120 * NS_PER_SEC)));
        assert!(!s.should_retry(0, 429, Some(121 * NS_PER_SEC)));
        assert!(!s.should_retry(2, 429, None));
        let old = SdkRetry {
            hint_max: 60.0,
            hint_over_max_backoff: true,
            ..SdkRetry::default()
        };
        assert!(old.should_retry(0, 429, Some(90 * NS_PER_SEC)));
        assert!(old.delay(0, Some(90 * NS_PER_SEC), &mut r) <= NS_PER_SEC / 2);
        assert!(s.retry_on.contains(429) && s.retry_on.contains(502) && !s.retry_on.contains(400));
    }
}
