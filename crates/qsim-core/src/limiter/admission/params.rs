//! The immutable parameters: compiled once from a [`LimiterConfig`], shared
//! (`Arc`) by every replica and every decision. They say which buckets exist
//! (their capacity and refill window) and what each one means; the
//! [`State`](super::State) holds only their levels.

use super::config::{LimiterConfig, Semantics};
use super::decision::Limit;
use super::layout::{Layout, MINUTE};
use crate::limiter::bucket::BucketSpec;
use crate::limiter::rates::{Counts, LimitSpec};
use crate::time::{Nanos, NS_PER_SEC};

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
    /// The parameters of a validated configuration whose capacity buckets
    /// the semantics laid out (`Params::new`, in `semantics.rs`, dispatches
    /// the layout): the consumers' own limits are added after them.
    pub(super) fn assemble(cfg: LimiterConfig, lay: Layout) -> Result<Params, String> {
        let n = cfg.consumers.len();
        let deploy = cfg.deploy_spec();
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
