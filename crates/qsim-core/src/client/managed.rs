//! The managed batch executor (modelled on Databricks `ai_query`): the
//! engine, not the caller, decides concurrency, retries and pacing, and a
//! 429 is never surfaced to the caller.
//!
//! Algorithm (documented in README and docs/ARCHITECTURE.md):
//! - concurrency is an AIMD window `cwnd` in [min, max], starting at `initial`;
//! - every success adds `increase / cwnd` (≈ +increase per window of successes);
//! - a throttle (429) multiplies `cwnd` by `decrease`, at most once per
//!   congestion epoch: only a request *sent after* the last decrease can
//!   trigger the next one (as TCP reduces once per round trip);
//! - a throttled row goes back to the front of the queue and becomes eligible
//!   again after `hint` if the response carries one, else after
//!   `min(base·2^(n−1), cap) × U[0.5, 1)` for its n-th throttle;
//! - a row is an error row (failOnError => false) only after `max_attempts`.

use crate::time::Nanos;

#[derive(Debug, Clone, PartialEq)]
pub struct AimdParams {
    pub initial: f64,
    pub min: f64,
    pub max: f64,
    pub increase: f64,
    pub decrease: f64,
    pub retry_base_s: f64,
    pub retry_cap_s: f64,
    pub max_attempts: u32,
}

impl Default for AimdParams {
    fn default() -> Self {
        AimdParams {
            initial: 8.0,
            min: 1.0,
            max: 64.0,
            increase: 1.0,
            decrease: 0.5,
            retry_base_s: 1.0,
            retry_cap_s: 30.0,
            max_attempts: 100,
        }
    }
}

/// The adaptive concurrency window. Sans-IO: times are passed in.
#[derive(Debug, Clone, PartialEq)]
pub struct AimdController {
    p: AimdParams,
    cwnd: f64,
    last_decrease: Option<Nanos>,
    decreases: u64,
}

impl AimdController {
    pub fn new(p: AimdParams) -> Self {
        let cwnd = p.initial.clamp(p.min, p.max);
        AimdController {
            p,
            cwnd,
            last_decrease: None,
            decreases: 0,
        }
    }

    pub fn params(&self) -> &AimdParams {
        &self.p
    }

    /// How many requests may be in flight now.
    #[inline]
    pub fn limit(&self) -> usize {
        self.cwnd.floor().max(1.0) as usize
    }

    pub fn window(&self) -> f64 {
        self.cwnd
    }

    pub fn decreases(&self) -> u64 {
        self.decreases
    }

    #[inline]
    pub fn on_success(&mut self) {
        self.cwnd = (self.cwnd + self.p.increase / self.cwnd).min(self.p.max);
    }

    /// A request sent at `sent_at` was throttled at `now`.
    #[inline]
    pub fn on_throttle(&mut self, now: Nanos, sent_at: Nanos) {
        if self.last_decrease.is_none_or(|t| sent_at >= t) {
            self.cwnd = (self.cwnd * self.p.decrease).max(self.p.min);
            self.last_decrease = Some(now);
            self.decreases += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aimd_once_per_epoch() {
        let mut c = AimdController::new(AimdParams::default());
        assert_eq!(c.limit(), 8);
        for _ in 0..8 {
            c.on_success();
        }
        assert!(c.window() > 8.9 && c.window() < 9.1);
        c.on_throttle(100, 50);
        let w = c.window();
        // a request sent before the decrease does not decrease again
        c.on_throttle(120, 60);
        assert_eq!(c.window(), w);
        c.on_throttle(200, 150);
        assert!((c.window() - w / 2.0).abs() < 1e-9);
        assert_eq!(c.decreases(), 2);
    }
}
