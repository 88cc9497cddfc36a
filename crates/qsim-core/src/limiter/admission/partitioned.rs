//! `partitioned`: strict-floors among the reserved consumers only — their
//! credits and a deployment bucket `G` of rate `Σ r_i·C` — and the pool
//! (rate `(1 − Σ r_i)·C`, depth its share of the burst) for the unreserved
//! consumers only. Floors are guaranteed and idle floors are lent among
//! reserved consumers; the reserved consumers' total never depends on the
//! unreserved ones, at the price of an idle pool while no unreserved
//! consumer sends (and an unreserved consumer above the pool is denied even
//! when floors are idle).

use super::config::{LimiterConfig, BP_FULL};
use super::decision::Source;
use super::layout::{Layout, Sizing};
use super::params::Params;
use super::state::State;
use super::{rate_limit_only, strict_floors};
use crate::time::Nanos;

pub(super) fn layout(cfg: &LimiterConfig, s: &Sizing, lay: &mut Layout) -> Result<(), String> {
    let sum = strict_floors::credits(cfg, s, lay)?;
    let g_bp = cfg.reserved_bp_total();
    // the reserved consumers' headroom beyond their credits: one unit
    // (their own credits are their burst)
    strict_floors::deployment(s, lay, g_bp, sum, 0)?;
    let pool_bp = BP_FULL - g_bp;
    if pool_bp > 0 {
        lay.pool = Some(lay.add(s.bucket(s.depth(pool_bp), pool_bp)?));
    }
    Ok(())
}

/// Reserved consumers: strict-floors on `G`; unreserved ones: the pool only.
pub(super) fn capacity(
    p: &Params,
    s: &State,
    from: Nanos,
    c: usize,
    need: u64,
) -> (Option<Source>, Nanos) {
    if p.floor[c].is_none() {
        // the pool alone, first come first served, as in rate-limit-only
        rate_limit_only::capacity(p, s, from, need)
    } else {
        strict_floors::capacity(p, s, from, c, need)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cfg, req};
    use super::super::*;

    #[test]
    fn pool_only_for_unreserved_and_floors_only_for_reserved() {
        let mut l = Limiter::new(cfg(Semantics::Partitioned, &[3000, 2000, 3000]), 0).unwrap();
        // pool: 20 % of 1000/min, depth 20 % of the 200 burst = 40
        let mut dev = 0;
        while l.decide(0, &req(3)).is_admit() {
            dev += 1;
        }
        assert_eq!(dev, 40);
        // the reserved consumers still have all of G (depth 80 % of 200):
        // taking turns, they get all of it but the one accruing credit per
        // consumer that the borrowing rule keeps back
        let mut agents = 0;
        while l.decide(0, &req(agents % 3)).is_admit() {
            agents += 1;
        }
        assert_eq!(agents, 160 - 3);
        // and the pool is still empty for dev
        assert!(!l.decide(0, &req(3)).is_admit());
        assert_eq!(l.params().total_depth(), 200);
    }
}
