//! `strict-floors` (the default): one deployment bucket `G` (rate `C`, depth
//! `max(B, Σ d_i + k + h)` for `k` floors, where `h` is the unreserved
//! share's depth, at least one unit: beyond every credit and the one each
//! floor is accruing, which borrowers must leave in `G`, the pool still
//! holds `h`) plus, per reserved consumer, a *credit* bucket (rate
//! `r_i·C`, depth `d_i` = [`CREDIT_SECONDS`] of that rate: credits guarantee
//! the floor *rate*; the burst headroom is shared).
//!
//! Consumer `k` asking for `n` units is admitted at once if its own whole
//! credits cover `n` (it spends `n` credits and `n` units of `G`). Otherwise
//! (borrowing, or an unreserved consumer) it is admitted iff `G − n` still
//! covers every other consumer's whole credits plus the one each is
//! accruing, and `k`'s own unused whole credits plus its accruing one. This
//! keeps the exact invariant `G ≥ Σ credits`, fractions included (`G`
//! refills at least as fast as all credits together), so a consumer holding
//! a credit always finds it in `G`: one that demands at least its floor gets
//! `r_i·C·w − d_i` in any window `w`. Credits of an idle consumer stop at
//! `d_i`, so its unused floor flows to everyone else (work-conserving); the
//! unreserved pool is simply `G` beyond the credits.
//!
//! The retry time is the least fixed point of `t ← earliest time G holds
//! n + credits(t)` (exact). `partitioned` applies the same rule among the
//! reserved consumers, with `G` of rate `Σ r_i·C`.

use super::config::{LimiterConfig, BP_FULL};
use super::decision::Source;
use super::layout::{Layout, Sizing};
use super::params::Params;
use super::state::State;
use crate::time::{Nanos, NEVER};

/// How many seconds of its floor rate a consumer's credits keep.
pub const CREDIT_SECONDS: u128 = 5;

/// A credit bucket per reserved consumer; returns the sum of their depths.
pub(super) fn credits(cfg: &LimiterConfig, s: &Sizing, lay: &mut Layout) -> Result<u64, String> {
    let mut sum = 0;
    for (k, cs) in cfg.consumers.iter().enumerate() {
        if cs.reserved_bp > 0 {
            let d = ((s.c * cs.reserved_bp as u128 * CREDIT_SECONDS).div_ceil(BP_FULL as u128 * 60))
                .max(1) as u64;
            lay.floor[k] = Some(lay.add(s.bucket(d, cs.reserved_bp)?));
            sum += d;
        }
    }
    Ok(sum)
}

/// The deployment bucket `G` of the credit holders: rate `g_bp` of
/// capacity, at least as deep as all floor credits, plus one accruing
/// credit per floor, plus the depth of a `pool_bp` share (at least one
/// unit).
///
/// Without that headroom (`G` exactly `Σ d_i` deep, as a burst below `Σ d_i`
/// once made it) a borrower must find `need + Σ credits` in `G`, which an
/// idle deployment, every credit full, never holds: an unreserved consumer
/// was refused forever while all capacity sat idle. Under load the floors
/// claim their accruing credits too; without them in the depth, borrowing
/// needed `G` nearly full.
pub(super) fn deployment(
    s: &Sizing,
    lay: &mut Layout,
    g_bp: u32,
    sum_credits: u64,
    pool_bp: u32,
) -> Result<(), String> {
    let floors = lay.floor.iter().flatten().count() as u64;
    if g_bp > 0 {
        let beyond = sum_credits
            .saturating_add(floors)
            .saturating_add(s.depth(pool_bp));
        let d = s.depth(g_bp).max(beyond);
        lay.shared = Some(lay.add(s.bucket(d, g_bp)?));
    }
    Ok(())
}

pub(super) fn layout(cfg: &LimiterConfig, s: &Sizing, lay: &mut Layout) -> Result<(), String> {
    let sum = credits(cfg, s, lay)?;
    deployment(s, lay, BP_FULL, sum, BP_FULL - cfg.reserved_bp_total())
}

/// The largest need consumer `c` is ever admitted with (see
/// [`Params::largest_need`]): when idle every credit is full; a request its
/// own credits cover needs only its units in `G`, a borrower must leave in
/// `G` every other consumer's credits and its own accruing one ([`keep`]).
pub(super) fn largest_need(p: &Params, c: usize) -> u64 {
    let depth = |i: Option<usize>| i.map_or(0, |i| p.buckets[i].capacity());
    let own = depth(p.floor[c]);
    let credits: u64 = p.floor.iter().map(|&i| depth(i)).sum();
    let keep = credits - own + u64::from(own > 0);
    own.max(depth(p.shared).saturating_sub(keep))
}

/// Whole floor credits of consumer `j` at `t` (0 without a floor).
fn credit(p: &Params, s: &State, j: usize, t: Nanos) -> u64 {
    p.floor[j].map_or(0, |i| s.available(p, i, t).max(0) as u64)
}

/// The credits `G` must keep after consumer `c` takes `need` units at `t`
/// (all floor credits, minus the part of `c`'s own credits this request
/// uses), and that part.
///
/// Credits count with the one still accruing: it is already protected, so
/// borrowers cannot take the capacity it will need the moment it becomes
/// whole. This keeps the exact invariant `G ≥ Σ credits` (fractions
/// included), so a request paid entirely with its own whole credits only
/// needs its units in `G`.
fn keep(p: &Params, s: &State, c: usize, need: u64, t: Nanos) -> (u64, u64) {
    // whole credits plus the one accruing (monotone in t, unlike a plain
    // ceiling, which dips at the instants a credit is whole)
    let ceil = |j: usize| {
        p.floor[j].map_or(0, |i| {
            let a = s.available(p, i, t);
            let cap = p.buckets[i].capacity();
            if a >= cap as i64 {
                cap
            } else {
                (a + 1).max(0) as u64
            }
        })
    };
    let m = credit(p, s, c, t).min(need);
    if m == need {
        // fully paid with own credits: `G ≥ Σ credits` (exact) already
        // backs them, so only the units themselves must be in G
        return (0, m);
    }
    // the others' credits (with the one accruing), and the consumer's own
    // credits this request does not use, with its accruing one too (so a
    // borrowing agent and an unreserved consumer compete on equal terms;
    // counted even when its bucket is full, so that the requirement never
    // drops as time passes)
    let others: u64 = (0..p.floor.len()).filter(|&j| j != c).map(ceil).sum();
    let own = p.floor[c].map_or(0, |_| credit(p, s, c, t) + 1 - m);
    (others + own, m)
}

/// Earliest time ≥ `from` at which `need` units can come out of `G` for
/// consumer `c`, and the source if that is `from` itself.
pub(super) fn capacity(
    p: &Params,
    s: &State,
    from: Nanos,
    c: usize,
    need: u64,
) -> (Option<Source>, Nanos) {
    let Some(g) = p.shared else {
        return (None, NEVER);
    };
    // admit iff G − need ≥ Σ credits − own credits used. Both sides only
    // grow with time (until G is full), so iterate to the least fixed point:
    // t ← earliest time G holds need + keep(t).
    let mut t = from;
    for _ in 0..10_000 {
        let (keep, m) = keep(p, s, c, need, t);
        let te = s.earliest(p, g, t, need.saturating_add(keep));
        if te <= t {
            return if t == from {
                (Some(Source::Shared { credit: m }), from)
            } else {
                (None, t)
            };
        }
        // the consumer's own credits may cover the request before `te` (or
        // when `G` can never hold `need + keep`); then only the units
        // themselves must be in G
        let own = p.floor[c].map_or(NEVER, |i| s.earliest(p, i, t, need));
        t = if own > t { te.min(own) } else { te };
        if t == NEVER {
            return (None, NEVER);
        }
    }
    (None, t)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cfg, req};
    use super::super::*;
    use crate::time::NS_PER_SEC;

    #[test]
    fn strict_floor_credits_are_kept_for_their_owner() {
        let mut l = Limiter::new(cfg(Semantics::StrictFloors, &[3000, 2000, 3000]), 0).unwrap();
        assert_eq!(l.params().total_depth(), 200);
        // dev may take only what is not covered by the full credits
        // (5 s of 300, 200 and 300 per minute: 25 + 17 + 25)
        let mut dev = 0;
        while l.decide(0, &req(3)).is_admit() {
            dev += 1;
        }
        assert_eq!(dev, 200 - 67);
        // each owner still finds all of its credits
        let mut a = 0;
        while l.decide(0, &req(0)).is_admit() {
            a += 1;
        }
        assert_eq!(a, 25);
        // after a minute of idleness the credits are capped at their depth
        // and the rest of the refill is open to anyone
        let t = 60 * NS_PER_SEC;
        let mut dev = 0;
        while l.decide(t, &req(3)).is_admit() {
            dev += 1;
        }
        assert_eq!(dev, 200 - 67);
        match l.decide(t, &req(3)) {
            Decision::Deny { limit, retry_at } => {
                assert_eq!(limit, Limit::Capacity);
                let mut c = l.clone();
                assert!(c.decide(retry_at, &req(3)).is_admit());
                let mut c = l.clone();
                assert!(!c.decide(retry_at - 1, &req(3)).is_admit());
            }
            d => panic!("{d:?}"),
        }
    }

    /// Regression (found by the property `denials_change_nothing_and_retry_times_are_exact`):
    /// partitioned, 40 RPM, one consumer reserving 1 %: its credit is one
    /// unit deep. `G` was too (it can never hold the request plus the
    /// accruing credit); now it holds the credit, the accruing one and one
    /// more (3), so a second request borrows at once. The third's retry time
    /// is when its own credit is whole again (one unit per 150 s at
    /// 0.4 RPM), not `NEVER`.
    #[test]
    fn a_consumer_whose_credits_fill_g_is_told_when_to_retry() {
        let mut c = cfg(Semantics::Partitioned, &[100]);
        c.capacity = 40;
        let mut l = Limiter::new(c, 0).unwrap();
        assert_eq!(
            l.params().buckets()[l.params().capacity_slots()[0]].capacity(),
            3
        );
        assert!(l.decide(0, &req(0)).is_admit());
        assert!(l.decide(0, &req(0)).is_admit());
        match l.decide(0, &req(0)) {
            Decision::Deny { limit, retry_at } => {
                assert_eq!(limit, Limit::Capacity);
                assert_eq!(retry_at, 150 * NS_PER_SEC);
                assert!(l.clone().decide(retry_at, &req(0)).is_admit());
                assert!(!l.clone().decide(retry_at - 1, &req(0)).is_admit());
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn deny_leaves_state_unchanged_and_refund_is_capped() {
        let mut c = cfg(Semantics::StrictFloors, &[5000]);
        c.unit = Unit::Tpm;
        c.capacity = 10_000;
        c.consumers[0].policy.concurrent = Some(2);
        let mut l = Limiter::new(c, 0).unwrap();
        let g1 = match l.decide(0, &req(0)) {
            Decision::Admit(g) => g,
            d => panic!("{d:?}"),
        };
        assert!(l.decide(0, &req(0)).is_admit());
        let before = l.clone();
        // both slots held until their leases expire
        assert_eq!(
            l.decide(0, &req(0)),
            Decision::Deny {
                limit: Limit::Concurrent,
                retry_at: DEFAULT_LEASE,
            }
        );
        assert_eq!(l, before);
        let minute = 60 * NS_PER_SEC;
        l.complete(minute, &g1, 10);
        for (avail, cap) in l.bucket_levels(minute) {
            assert!(avail <= cap as i64);
        }
    }
}
