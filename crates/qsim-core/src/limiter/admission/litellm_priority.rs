//! `litellm-priority` (LiteLLM's `priority_reservation`): the deployment is
//! *partitioned* into a floor bucket per reserved consumer (rate `r_i·C`,
//! depth `r_i·B`) and the pool (the rest). Own floor bucket first, else the
//! pool, else — only while the deployment is below saturation — any other
//! floor bucket (the most idle first, ties to the lowest index). Saturation
//! is LiteLLM's: the units admitted in the current fixed 60 s window (opened
//! by the first admission after the previous one expired) reach `θ·C`. The
//! window is the only extra state of this semantics.
//!
//! Floors hold only above saturation; an idle consumer's floor is wasted
//! above it (not work-conserving).

use super::config::{LimiterConfig, BP_FULL};
use super::decision::Source;
use super::layout::{Layout, Sizing, MINUTE};
use super::params::Params;
use super::state::{State, Window};
use crate::time::{Nanos, NEVER};
use crate::units::Units;

pub(super) fn layout(cfg: &LimiterConfig, s: &Sizing, lay: &mut Layout) -> Result<(), String> {
    for (k, cs) in cfg.consumers.iter().enumerate() {
        if cs.reserved_bp > 0 {
            lay.floor[k] = Some(lay.add(s.bucket(s.depth(cs.reserved_bp), cs.reserved_bp)?));
        }
    }
    let pool_bp = BP_FULL - cfg.reserved_bp_total();
    if pool_bp > 0 {
        lay.pool = Some(lay.add(s.bucket(s.depth(pool_bp), pool_bp)?));
    }
    Ok(())
}

/// LiteLLM saturation: units admitted in the current window ≥ θ·C.
pub(super) fn saturated(p: &Params, s: &State, t: Nanos) -> bool {
    s.window_units(t) as f64 >= p.cfg.threshold * p.cfg.capacity as f64
}

/// Count an admission of `charge` units at `t` in the window.
pub(super) fn on_admit(s: &mut State, t: Nanos, charge: u64) {
    let w = match s.window {
        Some(w) if t < w.start.saturating_add(MINUTE) => w,
        _ => Window { start: t, units: 0 },
    };
    s.window = Some(Window {
        start: w.start,
        units: (Units(w.units) + charge.max(1)).get(),
    });
}

/// Own floor, else pool, else (below saturation) the most idle other floor.
pub(super) fn capacity(
    p: &Params,
    s: &State,
    now: Nanos,
    c: usize,
    need: u64,
) -> (Option<Source>, Nanos) {
    let mut best = NEVER;
    if let Some(i) = p.floor[c] {
        let t = s.earliest(p, i, now, need);
        if t <= now {
            return (Some(Source::Own), now);
        }
        best = best.min(t);
    }
    if let Some(i) = p.pool {
        let t = s.earliest(p, i, now, need);
        if t <= now {
            return (Some(Source::Pool), now);
        }
        best = best.min(t);
    }
    // borrow any floor bucket, only below saturation
    let gate = if saturated(p, s, now) {
        s.window.map_or(now, |w| w.start.saturating_add(MINUTE))
    } else {
        now
    };
    let mut pick: Option<(usize, f64)> = None;
    for (j, b) in p.floor.iter().enumerate() {
        let Some(i) = *b else { continue };
        if j == c {
            continue;
        }
        let t = s.earliest(p, i, now, need).max(gate);
        if t <= now {
            let f = s.fill(p, i, now);
            if pick.is_none_or(|(_, pf)| f > pf) {
                pick = Some((j, f));
            }
        } else {
            best = best.min(t);
        }
    }
    match pick {
        Some((j, _)) => (Some(Source::Borrowed(j)), now),
        None => (None, best),
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cfg, req};
    use super::super::*;
    use super::MINUTE;

    #[test]
    fn litellm_borrows_only_below_saturation() {
        let mut c = cfg(Semantics::LitellmPriority, &[3000, 2000, 3000]);
        c.burst = Some(1000);
        c.threshold = 0.1; // saturated after 100 admitted units
        let mut l = Limiter::new(c, 0).unwrap();
        let mut dev = 0;
        while l.decide(0, &req(3)).is_admit() {
            dev += 1;
        }
        // pool (200) first, then borrowing would be allowed only below 100 units
        assert_eq!(dev, 200);
        assert!(l.saturated(0));
        match l.decide(0, &req(3)) {
            Decision::Deny { retry_at, .. } => assert!(retry_at > 0 && retry_at <= MINUTE),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn own_floor_then_pool_then_the_most_idle_floor() {
        let mut l = Limiter::new(cfg(Semantics::LitellmPriority, &[3000, 2000, 3000]), 0).unwrap();
        let sources: Vec<Source> = (0..101)
            .filter_map(|_| match l.decide(0, &req(0)) {
                Decision::Admit(g) => Some(g.source),
                Decision::Deny { .. } => None,
            })
            .collect();
        // floor depth 30 % of the 200 burst, pool 20 %
        assert!(sources[..60].iter().all(|s| *s == Source::Own));
        assert!(sources[60..100].iter().all(|s| *s == Source::Pool));
        // below saturation (100 < 800 units): floors 1 and 2 are both full,
        // the tie goes to the lowest index
        assert_eq!(sources[100], Source::Borrowed(1));
    }
}
