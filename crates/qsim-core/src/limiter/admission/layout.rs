//! Bucket sizing shared by the semantics' layouts: which capacity buckets
//! exist ([`Layout`]) and their depths and windows ([`Sizing`]).

use super::config::BP_FULL;
use crate::limiter::bucket::BucketSpec;
use crate::time::{Nanos, NS_PER_SEC};

pub(super) const MINUTE: Nanos = 60 * NS_PER_SEC;

/// Which capacity buckets exist, filled in by the semantics' `layout`.
#[derive(Debug, Clone, PartialEq, Default)]
pub(super) struct Layout {
    pub buckets: Vec<BucketSpec>,
    /// Per consumer: its floor bucket (litellm-priority) or its floor
    /// credits (strict-floors, partitioned).
    pub floor: Vec<Option<usize>>,
    /// The unreserved pool (litellm-priority, partitioned) or the one
    /// bucket (rate-limit-only).
    pub pool: Option<usize>,
    /// strict-floors / partitioned: the deployment bucket `G` of the credit
    /// holders.
    pub shared: Option<usize>,
}

impl Layout {
    pub fn add(&mut self, b: BucketSpec) -> usize {
        self.buckets.push(b);
        self.buckets.len() - 1
    }
}

/// Capacity arithmetic shared by the layouts.
pub(super) struct Sizing {
    /// Units per minute.
    pub c: u128,
    pub burst: u128,
}

impl Sizing {
    /// A bucket's depth for a share of `bp` basis points: its share of the
    /// burst, but at least one second of its own rate and at least one unit.
    pub fn depth(&self, bp: u32) -> u64 {
        let d = self.burst * bp as u128 / BP_FULL as u128;
        let one_sec = (self.c * bp as u128).div_ceil(BP_FULL as u128 * 60);
        d.max(one_sec).max(1) as u64
    }
    /// A bucket with rate `bp` basis points of capacity and depth `depth`.
    /// The window is rounded *up* so the real rate never exceeds the
    /// nominal one.
    pub fn bucket(&self, depth: u64, bp: u32) -> Result<BucketSpec, String> {
        let num = self.c * bp as u128;
        if num == 0 {
            return Err("a capacity bucket needs a rate > 0".into());
        }
        let w = (MINUTE as u128 * depth as u128 * BP_FULL as u128).div_ceil(num);
        BucketSpec::new(depth, w.min(u64::MAX as u128 - 1) as u64)
    }
}
