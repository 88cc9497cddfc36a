//! The state: a small plain value (`Clone + PartialEq + Serialize +
//! Deserialize`) that a live proxy can keep in a shared store (Redis) and
//! update with compare-and-set: one clock, the bucket levels, the leases of
//! the occupied concurrency slots and, for litellm-priority, the window.

use super::layout::MINUTE;
use super::params::Params;
use crate::time::Nanos;
use serde::{Deserialize, Serialize};

/// LiteLLM's fixed window: opened by the first admission after the
/// previous one expired; `units` admitted in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Window {
    pub start: Nanos,
    pub units: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct State {
    /// The latest time applied to the state. Every level below is as of
    /// this time, and a decision at `now` is taken at the *effective time*
    /// `max(now, clock)`: a replica whose clock lags never sees a bucket
    /// "before" its last update.
    pub(super) clock: Nanos,
    /// Bucket levels in token·ns (tokens × the bucket's window) as of
    /// `clock`, in the order of [`Params::buckets`].
    pub(super) levels: Vec<i128>,
    /// Per consumer with a `concurrent` limit: the expiry times of its
    /// occupied slots' leases, ascending. At most `concurrent` entries;
    /// entries at or before the effective time are free slots (dropped at
    /// the next admission or completion).
    pub(super) leases: Vec<Vec<Nanos>>,
    /// litellm-priority only.
    pub(super) window: Option<Window>,
}

impl State {
    /// Every bucket full at `now`, no slot occupied.
    pub fn new(p: &Params, now: Nanos) -> State {
        State {
            clock: now,
            levels: p.buckets.iter().map(|b| b.full_level()).collect(),
            leases: vec![Vec::new(); p.n_slots],
            window: None,
        }
    }

    /// Check that a state (e.g. read back from a store) fits `p`.
    pub fn check(&self, p: &Params) -> Result<(), String> {
        if self.levels.len() != p.buckets.len() {
            return Err(format!(
                "state has {} bucket levels, the parameters {}",
                self.levels.len(),
                p.buckets.len()
            ));
        }
        if self.leases.len() != p.n_slots {
            return Err(format!(
                "state has {} lease lists, the parameters {}",
                self.leases.len(),
                p.n_slots
            ));
        }
        for (lv, b) in self.levels.iter().zip(&p.buckets) {
            if *lv > b.full_level() {
                return Err("a bucket level exceeds its capacity".into());
            }
        }
        for &(i, m) in p.slots.iter().flatten() {
            if self.leases[i].len() > m as usize {
                return Err("more leases than the concurrency limit".into());
            }
        }
        Ok(())
    }

    /// The latest time applied (see the `clock` field).
    pub fn clock(&self) -> Nanos {
        self.clock
    }

    /// The effective time of an event at `now`: never before the state's clock.
    #[inline]
    pub fn effective(&self, now: Nanos) -> Nanos {
        now.max(self.clock)
    }

    /// Whole tokens of bucket `i` at `t` (≥ clock).
    #[inline]
    pub(super) fn available(&self, p: &Params, i: usize, t: Nanos) -> i64 {
        let b = &p.buckets[i];
        b.whole(b.refill(self.levels[i], self.clock, t))
    }
    /// Earliest time ≥ `t` (≥ clock) at which bucket `i` holds `n` tokens.
    #[inline]
    pub(super) fn earliest(&self, p: &Params, i: usize, t: Nanos, n: u64) -> Nanos {
        let b = &p.buckets[i];
        b.earliest(b.refill(self.levels[i], self.clock, t), t, n)
    }
    /// Fraction of bucket `i` filled at `t` (≥ clock).
    pub(super) fn fill(&self, p: &Params, i: usize, t: Nanos) -> f64 {
        let b = &p.buckets[i];
        b.fraction(b.refill(self.levels[i], self.clock, t))
    }

    /// Bring every level to `t` (≥ clock) and set the clock.
    pub(super) fn advance(&mut self, p: &Params, t: Nanos) {
        if t > self.clock {
            for (lv, b) in self.levels.iter_mut().zip(&p.buckets) {
                *lv = b.refill(*lv, self.clock, t);
            }
            self.clock = t;
        }
    }
    pub(super) fn take(&mut self, p: &Params, i: usize, n: u64) {
        if n > 0 {
            p.buckets[i].take(&mut self.levels[i], n);
        }
    }
    pub(super) fn refund(&mut self, p: &Params, i: usize, n: u64) {
        if n > 0 {
            p.buckets[i].refund(&mut self.levels[i], n);
        }
    }

    /// Occupied slots of lease list `i` at `t`.
    pub(super) fn active(&self, i: usize, t: Nanos) -> usize {
        self.leases[i].iter().filter(|&&e| e > t).count()
    }
    /// Earliest time ≥ `t` at which fewer than `m` slots of list `i` are
    /// occupied (leases expiring).
    pub(super) fn slot_free_at(&self, i: usize, t: Nanos, m: u32) -> Nanos {
        let live: Vec<Nanos> = self.leases[i].iter().copied().filter(|&e| e > t).collect();
        if live.len() < m as usize {
            return t;
        }
        // `live` is ascending: once the (len − m)-th lease expires, m − 1 remain
        live[live.len() - m as usize]
    }
    /// Drop the expired leases of list `i` and add one expiring at `until`.
    pub(super) fn lease(&mut self, i: usize, t: Nanos, until: Nanos) {
        let l = &mut self.leases[i];
        l.retain(|&e| e > t);
        let at = l.partition_point(|&e| e <= until);
        l.insert(at, until);
    }
    /// Release the slot of a grant whose lease expires at `until` (nothing
    /// if it has expired and been dropped already), and drop expired leases.
    pub(super) fn release(&mut self, i: usize, t: Nanos, until: Nanos) {
        let l = &mut self.leases[i];
        if let Some(k) = l.iter().position(|&e| e == until) {
            l.remove(k);
        }
        l.retain(|&e| e > t);
    }

    /// litellm-priority: units admitted in the window current at `t`.
    pub(super) fn window_units(&self, t: Nanos) -> u64 {
        match self.window {
            Some(w) if t < w.start.saturating_add(MINUTE) => w.units,
            _ => 0,
        }
    }
}
