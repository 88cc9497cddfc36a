//! The dispatch to the four reservation semantics: which capacity buckets a
//! configuration gets ([`Params::new`]) and the capacity rule a decision
//! asks ([`capacity`]). The semantics modules import the parameters and the
//! state, never this module, so the dispatch is one way.

use super::config::{LimiterConfig, Semantics};
use super::decision::Source;
use super::layout::{Layout, Sizing};
use super::params::Params;
use super::state::State;
use super::{litellm_priority, partitioned, rate_limit_only, strict_floors};
use crate::time::Nanos;

impl Params {
    /// Compile a configuration (checked with [`LimiterConfig::validate`]),
    /// with the [`DEFAULT_LEASE`](super::DEFAULT_LEASE).
    pub fn new(cfg: LimiterConfig) -> Result<Params, String> {
        cfg.validate()?;
        let n = cfg.consumers.len();
        let sizing = Sizing {
            c: cfg.capacity as u128,
            burst: cfg.burst_units() as u128,
        };
        let mut lay = Layout {
            floor: vec![None; n],
            ..Layout::default()
        };
        match cfg.semantics {
            Semantics::RateLimitOnly => rate_limit_only::layout(&cfg, &sizing, &mut lay)?,
            Semantics::StrictFloors => strict_floors::layout(&cfg, &sizing, &mut lay)?,
            Semantics::LitellmPriority => litellm_priority::layout(&cfg, &sizing, &mut lay)?,
            Semantics::Partitioned => partitioned::layout(&cfg, &sizing, &mut lay)?,
        }
        Params::assemble(cfg, lay)
    }

    /// The largest capacity need (units, as [`LimitSpec::admit_charge`]
    /// counts them) that consumer `c` is always admitted with, once the
    /// deployment has been idle long enough: a larger one can never pass
    /// the capacity check, whatever the wait, and [`decide`](super::decide)
    /// denies it with `NEVER`. 0 when the consumer has no capacity at all
    /// (an unreserved consumer under `partitioned` with everything
    /// reserved).
    ///
    /// When idle every bucket is full; `strict_floors::largest_need` says
    /// what a borrower must leave in `G`.
    ///
    /// [`LimitSpec::admit_charge`]: crate::limiter::rates::LimitSpec::admit_charge
    pub fn largest_need(&self, c: usize) -> u64 {
        let depth = |i: Option<usize>| i.map_or(0, |i| self.buckets[i].capacity());
        match self.cfg.semantics {
            Semantics::RateLimitOnly => depth(self.pool),
            Semantics::Partitioned if self.floor[c].is_none() => depth(self.pool),
            Semantics::StrictFloors | Semantics::Partitioned => {
                strict_floors::largest_need(self, c)
            }
            Semantics::LitellmPriority => self
                .floor
                .iter()
                .chain(std::iter::once(&self.pool))
                .map(|&i| depth(i))
                .max()
                .unwrap_or(0),
        }
    }
}

/// Earliest time ≥ `from` at which `need` units can come out of capacity
/// for consumer `c` under the semantics, and the source if that is `from`.
pub(super) fn capacity(
    p: &Params,
    s: &State,
    from: Nanos,
    c: usize,
    need: u64,
) -> (Option<Source>, Nanos) {
    match p.cfg.semantics {
        Semantics::RateLimitOnly => rate_limit_only::capacity(p, s, from, need),
        Semantics::StrictFloors => strict_floors::capacity(p, s, from, c, need),
        Semantics::LitellmPriority => litellm_priority::capacity(p, s, from, c, need),
        Semantics::Partitioned => partitioned::capacity(p, s, from, c, need),
    }
}
