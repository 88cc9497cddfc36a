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
