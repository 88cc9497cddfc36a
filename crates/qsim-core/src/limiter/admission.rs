//! The consumer-aware admission limiter for a shared deployment: deployment
//! capacity with burst headroom, per-consumer rate limits (default policy plus
//! per-entity overrides), and quota reservations (floors) with an unreserved
//! pool, under a named reservation semantics.
//!
//! Sans-IO: the state is a plain serializable value ([`AdmissionLimiter`]);
//! [`AdmissionLimiter::decide`] and [`AdmissionLimiter::complete`] are pure
//! functions of (state, input, `now`). A live proxy can keep the value in
//! process or in a shared store; [`decide_pure`] is the `(state, request,
//! now) → (state, decision)` form. Built on [`TokenBucket`] and
//! [`RateLimits`]; the token accounting (reserve `max_tokens`, refund the
//! unused part on completion) is [`LimitSpec::admit_charge`] /
//! [`LimitSpec::settle`], the same rules the hosted-API model uses.
//!
//! # The rules (see docs/limiter.md)
//!
//! Capacity `C` units per minute (requests, or input + output tokens),
//! utilization threshold `θ`, burst headroom `B` units (default
//! `(1 − θ)·C`): the deployment admits at most `C`/min sustained plus a
//! burst of `B`. Every bucket's depth is its share of `B`, at least one
//! second of its own rate and at least one unit; refill windows are rounded
//! up, so no bucket refills faster than its nominal rate.
//!
//! A request is checked in this order; the first failing check names the
//! denial: `max_input_tokens`, `concurrent`, the consumer's own `rpm` and
//! `tokens_per_hour` buckets, then `capacity`. Capacity under each semantics:
//!
//! - `rate-limit-only`: one bucket (rate `C`, depth `B`); first come, first
//!   served. Reservations are not enforced.
//! - `strict-floors`: one deployment bucket `G` (rate `C`, depth
//!   `max(B, Σ d_i)`) plus, per reserved consumer, a *credit* bucket (rate
//!   `r_i·C`, depth `d_i` = [`CREDIT_SECONDS`] of that rate: credits
//!   guarantee the floor *rate*; the burst headroom is shared). Consumer `k`
//!   asking for `n` units is admitted at once if its own whole credits cover
//!   `n` (it spends `n` credits and `n` units of `G`). Otherwise (borrowing,
//!   or an unreserved consumer) it is admitted iff `G − n` still covers every
//!   other consumer's whole credits plus the one each is accruing, and `k`'s
//!   own unused whole credits plus its accruing one. This keeps the exact
//!   invariant `G ≥ Σ credits`, fractions included (`G` refills at least as
//!   fast as all credits together), so a consumer holding a credit always
//!   finds it in `G`: one that demands at least its floor gets
//!   `r_i·C·w − d_i` in any window `w`. Credits of an idle consumer stop at
//!   `d_i`, so its unused floor flows to everyone else (work-conserving); the
//!   unreserved pool is simply `G` beyond the credits.
//! - `litellm-priority`: `G` is *partitioned*: a floor bucket per reserved
//!   consumer (rate `r_i·C`, depth `r_i·B`) and the pool (the rest). Own
//!   floor bucket first, else the pool, else — only while the deployment is
//!   below saturation — any other floor bucket (the most idle first).
//!   Saturation is LiteLLM's: the units admitted in the current fixed 60 s
//!   window (opened by the first admission after the previous one expired)
//!   reach `θ·C`.
//!
//! - `partitioned`: strict-floors among the reserved consumers only — their
//!   credits and a bucket `G` of rate `Σ r_i·C` — and the pool (rate
//!   `(1 − Σ r_i)·C`) for the unreserved consumers only. Floors are
//!   guaranteed and idle floors are lent among reserved consumers; the
//!   reserved consumers' total never depends on the unreserved ones, at the
//!   price of an idle pool while no unreserved consumer sends.
//!
//! In every semantics each admitted unit comes out of a capacity bucket, so
//! over any window `w` the total admitted is at most `C·w + Σ depths`.
//!
//! A denial carries the earliest time at which the same request would pass
//! every check if nothing else happened (exact; for strict-floors found as
//! the least fixed point of `t ← earliest time G holds n + credits(t)`).
//! Denials for `concurrent` (freed by completions, not by time) and
//! `max_input_tokens` (never) carry [`NEVER`].

use super::bucket::TokenBucket;
use super::rates::{Cost, Counts, LimitSpec, OutputAccounting, RateLimits};
use crate::time::{Nanos, NEVER, NS_PER_SEC};
use serde::{Deserialize, Serialize};

const MINUTE: Nanos = 60 * NS_PER_SEC;
const HOUR: Nanos = 3600 * NS_PER_SEC;
/// strict-floors: how many seconds of its floor rate a consumer's credits keep.
pub const CREDIT_SECONDS: u128 = 5;
/// Reservations are kept in basis points (1/100 of a percent).
pub const BP_FULL: u32 = 10_000;

/// What deployment capacity counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Requests per minute.
    Rpm,
    /// Tokens (input + output) per minute.
    Tpm,
}

impl Unit {
    pub fn name(self) -> &'static str {
        match self {
            Unit::Rpm => "rpm",
            Unit::Tpm => "tpm",
        }
    }
    pub fn parse(s: &str) -> Option<Unit> {
        match s {
            "rpm" => Some(Unit::Rpm),
            "tpm" => Some(Unit::Tpm),
            _ => None,
        }
    }
}

/// Reservation semantics (selected by name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Semantics {
    RateLimitOnly,
    StrictFloors,
    LitellmPriority,
    Partitioned,
}

impl Semantics {
    pub const ALL: [Semantics; 4] = [
        Semantics::RateLimitOnly,
        Semantics::StrictFloors,
        Semantics::LitellmPriority,
        Semantics::Partitioned,
    ];
    pub const NAMES: &'static str = "rate-limit-only, strict-floors, litellm-priority, partitioned";

    pub fn name(self) -> &'static str {
        match self {
            Semantics::RateLimitOnly => "rate-limit-only",
            Semantics::StrictFloors => "strict-floors",
            Semantics::LitellmPriority => "litellm-priority",
            Semantics::Partitioned => "partitioned",
        }
    }
    pub fn parse(s: &str) -> Option<Semantics> {
        Semantics::ALL.into_iter().find(|x| x.name() == s)
    }
    /// One line on what the semantics guarantees.
    pub fn guarantee(self) -> &'static str {
        match self {
            Semantics::RateLimitOnly => "one ceiling, first come first served: no consumer has a floor",
            Semantics::StrictFloors => {
                "each floor is guaranteed (minus one bucket depth); idle floor capacity is lent out (work-conserving)"
            }
            Semantics::LitellmPriority => {
                "anyone may use idle capacity below the saturation threshold; above it, floor + pool only (floors hold only above the threshold)"
            }
            Semantics::Partitioned => {
                "each floor is guaranteed and lent only to other reserved consumers; the unreserved pool serves only unreserved consumers (idle when they are silent)"
            }
        }
    }
}

/// Per-consumer rate limits (the ceiling). `None` = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct ConsumerPolicy {
    pub rpm: Option<u64>,
    pub tokens_per_hour: Option<u64>,
    pub concurrent: Option<u32>,
    pub max_input_tokens: Option<u64>,
}

impl ConsumerPolicy {
    /// Fields set in `over` replace those of `self` (a per-entity override of
    /// the default policy).
    pub fn overridden_by(self, over: &ConsumerPolicy) -> ConsumerPolicy {
        ConsumerPolicy {
            rpm: over.rpm.or(self.rpm),
            tokens_per_hour: over.tokens_per_hour.or(self.tokens_per_hour),
            concurrent: over.concurrent.or(self.concurrent),
            max_input_tokens: over.max_input_tokens.or(self.max_input_tokens),
        }
    }
}

/// One consumer: a name, its reservation and its effective policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ConsumerSpec {
    pub name: String,
    /// Reservation in basis points of capacity (3000 = 30 %); 0 = none.
    pub reserved_bp: u32,
    pub policy: ConsumerPolicy,
}

/// The limiter's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimiterConfig {
    /// Units per minute.
    pub capacity: u64,
    pub unit: Unit,
    /// Utilization threshold in (0, 1].
    pub threshold: f64,
    /// Burst headroom in units; `None` = `(1 − threshold)·capacity`.
    pub burst: Option<u64>,
    pub semantics: Semantics,
    /// How output tokens count against token limits (deployment in `tpm`,
    /// and per-consumer tokens per hour).
    pub accounting: OutputAccounting,
    pub consumers: Vec<ConsumerSpec>,
}

impl LimiterConfig {
    pub fn burst_units(&self) -> u64 {
        self.burst.unwrap_or_else(|| {
            ((1.0 - self.threshold).max(0.0) * self.capacity as f64).round() as u64
        })
    }
    pub fn reserved_bp_total(&self) -> u32 {
        self.consumers.iter().map(|c| c.reserved_bp).sum()
    }
    /// Check the configuration (the CLI and files report these as exit 2).
    pub fn validate(&self) -> Result<(), String> {
        if self.capacity == 0 {
            return Err("capacity must be > 0".into());
        }
        if !(self.threshold > 0.0 && self.threshold <= 1.0) {
            return Err(format!(
                "threshold must be in (0, 1], got {}",
                self.threshold
            ));
        }
        if self.consumers.is_empty() {
            return Err("at least one consumer is needed".into());
        }
        let total = self.reserved_bp_total();
        if total > BP_FULL {
            return Err(format!(
                "reservations add up to {:.2} %, more than 100 %",
                total as f64 / 100.0
            ));
        }
        Ok(())
    }
}

/// Per-consumer limits that can deny, and the deployment's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Limit {
    MaxInputTokens,
    Concurrent,
    Rpm,
    TokensPerHour,
    Capacity,
}

impl Limit {
    pub const ALL: [Limit; 5] = [
        Limit::MaxInputTokens,
        Limit::Concurrent,
        Limit::Rpm,
        Limit::TokensPerHour,
        Limit::Capacity,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Limit::MaxInputTokens => "max_input_tokens",
            Limit::Concurrent => "concurrent",
            Limit::Rpm => "rpm",
            Limit::TokensPerHour => "tokens_per_hour",
            Limit::Capacity => "capacity",
        }
    }
    pub fn index(self) -> usize {
        self as usize
    }
}

/// One request as the limiter sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Index into the configuration's consumers.
    pub consumer: usize,
    pub input_tokens: u64,
    /// Declared `max_tokens` (reserved under reserve-refund accounting).
    pub max_tokens: u64,
}

impl Request {
    fn cost(&self) -> Cost {
        Cost {
            input_tokens: self.input_tokens,
            max_tokens: self.max_tokens,
        }
    }
}

/// Which capacity bucket an admitted request was charged to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    /// The consumer's own floor bucket.
    Own,
    /// The unreserved pool.
    Pool,
    /// Another consumer's floor bucket.
    Borrowed(usize),
    /// strict-floors: the deployment bucket, using `credit` units of the
    /// consumer's own floor credits (the rest is borrowed).
    Shared { credit: u64 },
}

/// What an admission returns; hand it back to [`AdmissionLimiter::complete`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub consumer: usize,
    pub source: Source,
    pub input_tokens: u64,
    pub max_tokens: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Decision {
    Admit(Grant),
    /// Denied by `limit`; the same request would pass at `retry_at`
    /// (`NEVER`: not by the passage of time alone).
    Deny {
        limit: Limit,
        retry_at: Nanos,
    },
}

impl Decision {
    pub fn is_admit(&self) -> bool {
        matches!(self, Decision::Admit(_))
    }
}

/// The limiter state: a plain value (`Clone + Serialize + Deserialize`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AdmissionLimiter {
    cfg: LimiterConfig,
    /// How a request is charged against capacity.
    deploy: LimitSpec,
    /// Per consumer with a reservation: its floor bucket (litellm-priority)
    /// or its floor *credits* (strict-floors); `None` otherwise and under
    /// rate-limit-only.
    floors: Vec<Option<TokenBucket>>,
    /// The unreserved pool (litellm-priority) or the one bucket (rate-limit-only).
    pool: Option<TokenBucket>,
    /// strict-floors: the one deployment bucket.
    shared: Option<TokenBucket>,
    /// Per-consumer rpm / tokens-per-hour buckets.
    limits: Vec<RateLimits>,
    limit_kinds: Vec<Vec<Limit>>,
    in_flight: Vec<u32>,
    /// LiteLLM fixed window: start and units admitted in it.
    window_start: Option<Nanos>,
    window_units: u64,
}

/// A bucket with rate `rate_num / rate_den` units per minute and depth
/// `depth`, full at `now`. The window is rounded *up* so the real rate never
/// exceeds the nominal one.
fn sub_bucket(depth: u64, rate_num: u128, rate_den: u128, now: Nanos) -> TokenBucket {
    let w = (MINUTE as u128 * depth as u128 * rate_den).div_ceil(rate_num);
    TokenBucket::full(depth, w.min(u64::MAX as u128 - 1) as u64, now)
}

impl AdmissionLimiter {
    /// A limiter with every bucket full at `now`. The configuration must
    /// pass [`LimiterConfig::validate`].
    pub fn new(cfg: LimiterConfig, now: Nanos) -> Self {
        cfg.validate().expect("validated limiter config");
        let n = cfg.consumers.len();
        let c = cfg.capacity as u128;
        let burst = cfg.burst_units() as u128;
        let share = |bp: u32| -> u128 { bp as u128 };
        // Depth: the share of the burst, but at least one second of the
        // bucket's own rate and at least one unit.
        let depth = |bp: u32| -> u64 {
            let d = burst * share(bp) / BP_FULL as u128;
            let one_sec = (c * share(bp)).div_ceil(BP_FULL as u128 * 60);
            d.max(one_sec).max(1) as u64
        };
        let partitioned = cfg.semantics == Semantics::LitellmPriority;
        let hard = cfg.semantics == Semantics::Partitioned;
        let credits = matches!(
            cfg.semantics,
            Semantics::StrictFloors | Semantics::Partitioned
        );
        let mut floors = Vec::with_capacity(n);
        for cs in &cfg.consumers {
            if (partitioned || credits) && cs.reserved_bp > 0 {
                let d = if credits {
                    // credits guarantee the floor *rate*; they keep only
                    // CREDIT_SECONDS of it, the burst is shared
                    ((c * share(cs.reserved_bp) * CREDIT_SECONDS).div_ceil(BP_FULL as u128 * 60))
                        .max(1) as u64
                } else {
                    depth(cs.reserved_bp)
                };
                floors.push(Some(sub_bucket(
                    d,
                    c * share(cs.reserved_bp),
                    BP_FULL as u128,
                    now,
                )));
            } else {
                floors.push(None);
            }
        }
        let (pool, shared) = if credits {
            // one bucket for the credit holders, at least as deep as all
            // floor credits: the whole deployment (strict-floors), or only
            // the reserved share with the pool apart (partitioned)
            let sum_d: u64 = floors.iter().flatten().map(|b| b.capacity()).sum();
            let g_bp = if hard {
                cfg.reserved_bp_total()
            } else {
                BP_FULL
            };
            let g = (g_bp > 0).then(|| {
                let d = depth(g_bp).max(sum_d);
                sub_bucket(d, c * g_bp as u128, BP_FULL as u128, now)
            });
            let pool_bp = BP_FULL - g_bp;
            let pool = (hard && pool_bp > 0)
                .then(|| sub_bucket(depth(pool_bp), c * pool_bp as u128, BP_FULL as u128, now));
            (pool, g)
        } else {
            let pool_bp = if partitioned {
                BP_FULL - cfg.reserved_bp_total()
            } else {
                BP_FULL
            };
            let pool = (pool_bp > 0)
                .then(|| sub_bucket(depth(pool_bp), c * pool_bp as u128, BP_FULL as u128, now));
            (pool, None)
        };
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
        let mut limits = Vec::with_capacity(n);
        let mut limit_kinds = Vec::with_capacity(n);
        for cs in &cfg.consumers {
            let mut specs = Vec::new();
            let mut kinds = Vec::new();
            if let Some(r) = cs.policy.rpm {
                specs.push(LimitSpec {
                    name: "rpm".into(),
                    counts: Counts::Requests,
                    limit: r.max(1),
                    window: MINUTE,
                    accounting: cfg.accounting,
                });
                kinds.push(Limit::Rpm);
            }
            if let Some(t) = cs.policy.tokens_per_hour {
                specs.push(LimitSpec {
                    name: "tokens_per_hour".into(),
                    counts: Counts::Tokens,
                    limit: t.max(1),
                    window: HOUR,
                    accounting: cfg.accounting,
                });
                kinds.push(Limit::TokensPerHour);
            }
            limits.push(RateLimits::new(specs, now));
            limit_kinds.push(kinds);
        }
        AdmissionLimiter {
            in_flight: vec![0; n],
            cfg,
            deploy,
            floors,
            pool,
            shared,
            limits,
            limit_kinds,
            window_start: None,
            window_units: 0,
        }
    }

    pub fn config(&self) -> &LimiterConfig {
        &self.cfg
    }
    pub fn in_flight(&self, consumer: usize) -> u32 {
        self.in_flight[consumer]
    }
    /// The buckets that bound admitted capacity: the deployment bucket
    /// (strict-floors), else floors (per consumer, if any) then the pool.
    pub fn capacity_buckets(&self) -> Vec<&TokenBucket> {
        match &self.shared {
            Some(g) => std::iter::once(g).chain(self.pool.iter()).collect(),
            None => self
                .floors
                .iter()
                .flatten()
                .chain(self.pool.iter())
                .collect(),
        }
    }
    /// Every bucket the limiter holds (capacity, floor credits, per-consumer limits).
    pub fn all_buckets(&self) -> Vec<&TokenBucket> {
        let mut v: Vec<&TokenBucket> = self
            .floors
            .iter()
            .flatten()
            .chain(self.pool.iter())
            .chain(self.shared.iter())
            .collect();
        for l in &self.limits {
            v.extend(l.buckets());
        }
        v
    }
    /// Sum of the capacity buckets' depths: the most that can be admitted
    /// above `capacity × window` in any window.
    pub fn total_depth(&self) -> u64 {
        self.capacity_buckets().iter().map(|b| b.capacity()).sum()
    }
    /// Units of burst headroom left at `now` (sum of capacity bucket levels, ≥ 0 each).
    pub fn headroom(&self, now: Nanos) -> u64 {
        self.capacity_buckets()
            .iter()
            .map(|b| b.available(now).max(0) as u64)
            .sum()
    }
    /// Floor bucket depth of a consumer (0 without one).
    pub fn floor_depth(&self, consumer: usize) -> u64 {
        self.floors[consumer].as_ref().map_or(0, |b| b.capacity())
    }

    fn window_units_at(&self, now: Nanos) -> u64 {
        match self.window_start {
            Some(s) if now < s.saturating_add(MINUTE) => self.window_units,
            _ => 0,
        }
    }

    /// LiteLLM saturation: units admitted in the current window ≥ θ·C.
    pub fn saturated(&self, now: Nanos) -> bool {
        self.window_units_at(now) as f64 >= self.cfg.threshold * self.cfg.capacity as f64
    }

    /// Whole floor credits of consumer `j` at `t` (0 without a floor).
    fn credit(&self, j: usize, t: Nanos) -> u64 {
        self.floors[j]
            .as_ref()
            .map_or(0, |b| b.available(t).max(0) as u64)
    }

    /// strict-floors: the credits the deployment bucket must keep after
    /// consumer `c` takes `need` units at `t` (all floor credits, minus the
    /// part of `c`'s own credits this request uses), and that part.
    ///
    /// Credits count with the one still accruing: it is already protected, so borrowers cannot take the capacity
    /// it will need the moment it becomes whole. This keeps the exact
    /// invariant `G ≥ Σ credits` (fractions included), so a request paid
    /// entirely with its own whole credits only needs its units in `G`.
    fn keep(&self, c: usize, need: u64, t: Nanos) -> (u64, u64) {
        // whole credits plus the one accruing (monotone in t, unlike a
        // plain ceiling, which dips at the instants a credit is whole)
        let ceil = |j: usize| {
            self.floors[j].as_ref().map_or(0, |b| {
                let a = b.available(t);
                if a >= b.capacity() as i64 {
                    b.capacity()
                } else {
                    (a + 1).max(0) as u64
                }
            })
        };
        let m = self.credit(c, t).min(need);
        if m == need {
            // fully paid with own credits: `G ≥ Σ credits` (exact) already
            // backs them, so only the units themselves must be in G
            return (0, m);
        }
        // the others' credits (with the one accruing), and the consumer's
        // own credits this request does not use, with its accruing one too
        // (so a borrowing agent and an unreserved consumer compete on equal
        // terms; counted even when its bucket is full, so that the
        // requirement never drops as time passes)
        let others: u64 = (0..self.floors.len()).filter(|&j| j != c).map(ceil).sum();
        let own = self.floors[c]
            .as_ref()
            .map_or(0, |_| self.credit(c, t) + 1 - m);
        (others + own, m)
    }

    /// Earliest time ≥ `from` at which `need` units can come out of capacity
    /// for consumer `c`, and the source if that is `from` itself.
    fn capacity_source(&self, from: Nanos, c: usize, need: u64) -> (Option<Source>, Nanos) {
        // partitioned: an unreserved consumer draws on the pool only
        if self.cfg.semantics == Semantics::Partitioned && self.floors[c].is_none() {
            return match &self.pool {
                None => (None, NEVER),
                Some(p) => {
                    let t = p.earliest(from, need);
                    if t <= from {
                        (Some(Source::Pool), from)
                    } else {
                        (None, t)
                    }
                }
            };
        }
        if let Some(g) = &self.shared {
            // admit iff G − need ≥ Σ credits − own credits used. Both sides
            // only grow with time (until G is full), so iterate to the least
            // fixed point: t ← earliest time G holds need + keep(t).
            let mut t = from;
            for _ in 0..10_000 {
                let (keep, m) = self.keep(c, need, t);
                let te = g.earliest(t, need.saturating_add(keep));
                if te == NEVER {
                    return (None, NEVER);
                }
                if te <= t {
                    return if t == from {
                        (Some(Source::Shared { credit: m }), from)
                    } else {
                        (None, t)
                    };
                }
                // the consumer's own credits may cover the request before
                // `te`; then only the units themselves must be in G
                let own = self.floors[c]
                    .as_ref()
                    .map_or(NEVER, |b| b.earliest(t, need));
                t = if own > t { te.min(own) } else { te };
            }
            return (None, t);
        }
        let now = from;
        let mut best = NEVER;
        // own, then pool
        if let Some(b) = &self.floors[c] {
            let t = b.earliest(now, need);
            if t <= now {
                return (Some(Source::Own), now);
            }
            best = best.min(t);
        }
        if let Some(b) = &self.pool {
            let t = b.earliest(now, need);
            if t <= now {
                return (Some(Source::Pool), now);
            }
            best = best.min(t);
        }
        if self.cfg.semantics == Semantics::RateLimitOnly {
            return (None, best);
        }
        // litellm-priority: borrow any floor bucket, only below saturation
        let gate = if self.saturated(now) {
            self.window_start.map_or(now, |s| s.saturating_add(MINUTE))
        } else {
            now
        };
        // the most idle lender first (highest fill), ties → lowest index
        let mut pick: Option<(usize, f64)> = None;
        for (j, b) in self.floors.iter().enumerate() {
            let Some(b) = b else { continue };
            if j == c {
                continue;
            }
            let t = b.earliest(now, need).max(gate);
            if t <= now {
                let f = b.fill_fraction(now);
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

    /// Decide one request at `now`. A denial leaves the state unchanged.
    pub fn decide(&mut self, now: Nanos, req: &Request) -> Decision {
        let c = req.consumer;
        let pol = self.cfg.consumers[c].policy;
        if let Some(m) = pol.max_input_tokens {
            if req.input_tokens > m {
                return Decision::Deny {
                    limit: Limit::MaxInputTokens,
                    retry_at: NEVER,
                };
            }
        }
        if let Some(m) = pol.concurrent {
            if self.in_flight[c] >= m {
                return Decision::Deny {
                    limit: Limit::Concurrent,
                    retry_at: NEVER,
                };
            }
        }
        let cost = req.cost();
        let own = self.limits[c].check(now, cost).err();
        let (charge, need) = self.deploy.admit_charge(cost);
        let (src, cap_t) = self.capacity_source(now, c, need);
        match (own, src) {
            (None, Some(src)) => {
                self.limits[c].commit(now, cost);
                match src {
                    Source::Shared { credit } => {
                        let g = self.shared.as_mut().expect("strict-floors bucket");
                        if charge > 0 {
                            g.force_take(now, charge);
                        }
                        let used = credit.min(charge);
                        if used > 0 {
                            self.floors[c]
                                .as_mut()
                                .expect("credits")
                                .force_take(now, used);
                        }
                    }
                    _ => {
                        let b = match src {
                            Source::Own => self.floors[c].as_mut(),
                            Source::Pool => self.pool.as_mut(),
                            Source::Borrowed(j) => self.floors[j].as_mut(),
                            Source::Shared { .. } => None,
                        }
                        .expect("source bucket exists");
                        if charge > 0 {
                            b.force_take(now, charge);
                        }
                    }
                }
                self.in_flight[c] += 1;
                if self
                    .window_start
                    .is_none_or(|s| now >= s.saturating_add(MINUTE))
                {
                    self.window_start = Some(now);
                    self.window_units = 0;
                }
                self.window_units += charge.max(1);
                Decision::Admit(Grant {
                    consumer: c,
                    source: src,
                    input_tokens: req.input_tokens,
                    max_tokens: req.max_tokens,
                })
            }
            (Some(d), _) => {
                // the earliest time capacity also passes, from the time the
                // consumer's own limits pass (those only get easier)
                let retry_at = if d.retry_at == NEVER {
                    NEVER
                } else if d.retry_at <= cap_t {
                    cap_t
                } else {
                    self.capacity_source(d.retry_at, c, need).1
                };
                Decision::Deny {
                    limit: self.limit_kinds[c][d.limit],
                    retry_at,
                }
            }
            (None, None) => Decision::Deny {
                limit: Limit::Capacity,
                retry_at: cap_t,
            },
        }
    }

    /// An admitted request finished at `now` having produced
    /// `actual_output` tokens: release its concurrency slot and settle token
    /// accounting (refund unused `max_tokens` to the bucket it was charged
    /// to, capped at capacity; or charge output counted on completion).
    pub fn complete(&mut self, now: Nanos, grant: &Grant, actual_output: u64) {
        let c = grant.consumer;
        self.in_flight[c] = self.in_flight[c].saturating_sub(1);
        let cost = Cost {
            input_tokens: grant.input_tokens,
            max_tokens: grant.max_tokens,
        };
        self.limits[c].settle(now, cost, actual_output);
        let (refund, extra) = self.deploy.settle(cost, actual_output);
        let b = match grant.source {
            Source::Own => self.floors[c].as_mut(),
            Source::Pool => self.pool.as_mut(),
            Source::Borrowed(j) => self.floors[j].as_mut(),
            Source::Shared { .. } => self.shared.as_mut(),
        };
        if let Some(b) = b {
            if refund > 0 {
                b.refund(now, refund);
            }
            if extra > 0 {
                b.force_take(now, extra);
            }
        }
    }
}

/// The pure form: `(state, request, now) → (state, decision)`.
pub fn decide_pure(
    state: &AdmissionLimiter,
    now: Nanos,
    req: &Request,
) -> (AdmissionLimiter, Decision) {
    let mut s = state.clone();
    let d = s.decide(now, req);
    (s, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(sem: Semantics, reserve: &[u32]) -> LimiterConfig {
        let mut consumers: Vec<ConsumerSpec> = reserve
            .iter()
            .enumerate()
            .map(|(i, &bp)| ConsumerSpec {
                name: format!("c{i}"),
                reserved_bp: bp,
                policy: ConsumerPolicy::default(),
            })
            .collect();
        consumers.push(ConsumerSpec {
            name: "dev".into(),
            reserved_bp: 0,
            policy: ConsumerPolicy::default(),
        });
        LimiterConfig {
            capacity: 1000,
            unit: Unit::Rpm,
            threshold: 0.8,
            burst: None,
            semantics: sem,
            accounting: OutputAccounting::ReserveRefund,
            consumers,
        }
    }

    fn req(c: usize) -> Request {
        Request {
            consumer: c,
            input_tokens: 100,
            max_tokens: 256,
        }
    }

    #[test]
    fn burst_then_rate() {
        let mut l = AdmissionLimiter::new(cfg(Semantics::RateLimitOnly, &[3000, 2000, 3000]), 0);
        assert_eq!(l.total_depth(), 200);
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

    #[test]
    fn strict_floor_credits_are_kept_for_their_owner() {
        let mut l = AdmissionLimiter::new(cfg(Semantics::StrictFloors, &[3000, 2000, 3000]), 0);
        assert_eq!(l.total_depth(), 200);
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

    #[test]
    fn litellm_borrows_only_below_saturation() {
        let mut c = cfg(Semantics::LitellmPriority, &[3000, 2000, 3000]);
        c.burst = Some(1000);
        c.threshold = 0.1; // saturated after 100 admitted units
        let mut l = AdmissionLimiter::new(c, 0);
        let mut dev = 0;
        while l.decide(0, &req(3)).is_admit() {
            dev += 1;
        }
        // pool (200) first, then borrowing would be allowed only below 100 units
        assert_eq!(dev, 200);
        match l.decide(0, &req(3)) {
            Decision::Deny { retry_at, .. } => assert!(retry_at > 0 && retry_at <= MINUTE),
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn deny_leaves_state_unchanged_and_refund_is_capped() {
        let mut c = cfg(Semantics::StrictFloors, &[5000]);
        c.unit = Unit::Tpm;
        c.capacity = 10_000;
        c.consumers[0].policy.concurrent = Some(2);
        let mut l = AdmissionLimiter::new(c, 0);
        let g1 = match l.decide(0, &req(0)) {
            Decision::Admit(g) => g,
            d => panic!("{d:?}"),
        };
        assert!(l.decide(0, &req(0)).is_admit());
        let before = l.clone();
        assert_eq!(
            l.decide(0, &req(0)),
            Decision::Deny {
                limit: Limit::Concurrent,
                retry_at: NEVER
            }
        );
        assert_eq!(l, before);
        l.complete(MINUTE, &g1, 10);
        for b in l.all_buckets() {
            assert!(b.available(MINUTE) <= b.capacity() as i64);
        }
    }
}
