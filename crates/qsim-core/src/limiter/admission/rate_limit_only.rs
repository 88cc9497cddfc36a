//! `rate-limit-only`: one bucket (rate `C`, depth `B`), first come first
//! served. Reservations are reported but not enforced: under saturation each
//! consumer gets a share proportional to its demand.

use super::config::{LimiterConfig, BP_FULL};
use super::decision::Source;
use super::layout::{Layout, Sizing};
use super::params::Params;
use super::state::State;
use crate::time::Nanos;

pub(super) fn layout(_cfg: &LimiterConfig, s: &Sizing, lay: &mut Layout) -> Result<(), String> {
    lay.pool = Some(lay.add(s.bucket(s.depth(BP_FULL), BP_FULL)?));
    Ok(())
}

/// `need` units from the one bucket: now, or the earliest time ≥ `from`.
pub(super) fn capacity(p: &Params, s: &State, from: Nanos, need: u64) -> (Option<Source>, Nanos) {
    match p.pool {
        None => (None, crate::time::NEVER),
        Some(i) => {
            let t = s.earliest(p, i, from, need);
            if t <= from {
                (Some(Source::Pool), from)
            } else {
                (None, t)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{cfg, req};
    use super::super::*;
    use crate::time::NS_PER_SEC;

    #[test]
    fn burst_then_rate() {
        let mut l = Limiter::new(cfg(Semantics::RateLimitOnly, &[3000, 2000, 3000]), 0).unwrap();
        assert_eq!(l.params().total_depth(), 200);
        let mut ok = 0;
        loop {
            match l.decide(0, &req(3)) {
                Decision::Admit(_) => ok += 1,
                Decision::Deny { limit, retry_at } => {
                    assert_eq!(limit, Limit::Capacity);
                    assert_eq!(retry_at, 60 * NS_PER_SEC / 1000);
                    break;
                }
            }
        }
        assert_eq!(ok, 200);
    }
}
