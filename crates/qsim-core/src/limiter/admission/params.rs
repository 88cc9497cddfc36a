//! The immutable parameters: compiled once from a [`LimiterConfig`], shared
//! (`Arc`) by every replica and every decision. They say which buckets exist
//! (their capacity and refill window) and what each one means; the
//! [`State`](super::State) holds only their levels.

use super::config::{LimiterConfig, Semantics, Unit, BP_FULL};
use super::{litellm_priority, partitioned, rate_limit_only, strict_floors, Limit};
use crate::limiter::bucket::BucketSpec;
use crate::limiter::rates::{Counts, LimitSpec};
use crate::time::{Nanos, NS_PER_SEC};

pub(super) const MINUTE: Nanos = 60 * NS_PER_SEC;
const HOUR: Nanos = 3600 * NS_PER_SEC;

/// How long an admitted request holds a concurrency slot at most when its
/// completion never arrives (a crashed replica): 10 minutes, the OpenAI and
/// Anthropic SDKs' default request timeout, after which no client is still
/// waiting for the answer. Override with [`Params::with_lease`].
pub const DEFAULT_LEASE: Nanos = 600 * NS_PER_SEC;

/// One of a consumer's own limits (`rpm`, `tokens_per_hour`).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct OwnLimit {
    pub spec: LimitSpec,
    pub kind: Limit,
    /// Index of its bucket in the state's levels.
    pub slot: usize,
}

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

/// The limiter's immutable parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    pub(super) cfg: LimiterConfig,
    pub(super) lease: Nanos,
    /// How a request is charged against capacity.
    pub(super) deploy: LimitSpec,
    /// Every bucket, in the order of the state's levels: the capacity
    /// buckets of the layout, then the consumers' own limits.
    pub(super) buckets: Vec<BucketSpec>,
    pub(super) floor: Vec<Option<usize>>,
    pub(super) pool: Option<usize>,
    pub(super) shared: Option<usize>,
    pub(super) own: Vec<Vec<OwnLimit>>,
    /// Per consumer with a `concurrent` limit: its index in the state's
    /// lease lists, and the limit.
    pub(super) slots: Vec<Option<(usize, u32)>>,
    pub(super) n_slots: usize,
}

impl Params {
    /// Compile a configuration (checked with [`LimiterConfig::validate`]),
    /// with the [`DEFAULT_LEASE`].
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
        let deploy = LimitSpec {
            name: "capacity".into(),
            counts: match cfg.unit {
                Unit::Rpm => Counts::Requests,
                Unit::Tpm => Counts::Tokens,
            },
            limit: cfg.capacity,
            window: MINUTE,
            accounting: cfg.accounting,
        };
        let mut buckets = lay.buckets;
        let mut own = Vec::with_capacity(n);
        let mut slots = Vec::with_capacity(n);
        let mut n_slots = 0;
        for cs in &cfg.consumers {
            let mut mine = Vec::new();
            let mut push = |name: &str, counts, limit: u64, window, kind| -> Result<(), String> {
                let spec = LimitSpec {
                    name: name.into(),
                    counts,
                    limit: limit.max(1),
                    window,
                    accounting: cfg.accounting,
                };
                buckets.push(BucketSpec::new(spec.limit, spec.window)?);
                mine.push(OwnLimit {
                    spec,
                    kind,
                    slot: buckets.len() - 1,
                });
                Ok(())
            };
            if let Some(r) = cs.policy.rpm {
                push("rpm", Counts::Requests, r, MINUTE, Limit::Rpm)?;
            }
            if let Some(t) = cs.policy.tokens_per_hour {
                push(
                    "tokens_per_hour",
                    Counts::Tokens,
                    t,
                    HOUR,
                    Limit::TokensPerHour,
                )?;
            }
            own.push(mine);
            slots.push(cs.policy.concurrent.map(|m| {
                n_slots += 1;
                (n_slots - 1, m)
            }));
        }
        Ok(Params {
            cfg,
            lease: DEFAULT_LEASE,
            deploy,
            buckets,
            floor: lay.floor,
            pool: lay.pool,
            shared: lay.shared,
            own,
            slots,
            n_slots,
        })
    }

    /// The same parameters with another lease (> 0): how long an admitted
    /// request holds its concurrency slot if its completion never arrives.
    pub fn with_lease(mut self, lease: Nanos) -> Result<Params, String> {
        if lease == 0 {
            return Err("the lease must be > 0".into());
        }
        self.lease = lease;
        Ok(self)
    }

    pub fn config(&self) -> &LimiterConfig {
        &self.cfg
    }
    pub fn semantics(&self) -> Semantics {
        self.cfg.semantics
    }
    pub fn lease(&self) -> Nanos {
        self.lease
    }
    pub fn consumers(&self) -> usize {
        self.cfg.consumers.len()
    }
    /// Every bucket's spec, in the order of the state's levels.
    pub fn buckets(&self) -> &[BucketSpec] {
        &self.buckets
    }
    /// The buckets that bound admitted capacity: the deployment bucket (and
    /// the pool, if apart) under strict-floors / partitioned, else the
    /// floor buckets and the pool.
    pub fn capacity_slots(&self) -> Vec<usize> {
        match self.shared {
            Some(g) => std::iter::once(g).chain(self.pool).collect(),
            None => self
                .floor
                .iter()
                .flatten()
                .copied()
                .chain(self.pool)
                .collect(),
        }
    }
    /// Sum of the capacity buckets' depths: the most that can be admitted
    /// above `capacity × window` in any window.
    pub fn total_depth(&self) -> u64 {
        self.capacity_slots()
            .into_iter()
            .map(|i| self.buckets[i].capacity())
            .sum()
    }
    /// Floor bucket (or credit) depth of a consumer (0 without one).
    pub fn floor_depth(&self, consumer: usize) -> u64 {
        self.floor[consumer].map_or(0, |i| self.buckets[i].capacity())
    }
}
