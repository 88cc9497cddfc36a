//! Reference models of the admission limiter, written for the tests from
//! docs/limiter.md and the configuration alone. Nothing here calls the
//! limiter's own sizing or accounting (`total_depth`, `floor_depth`,
//! `BucketSpec`, `LimitSpec::admit_charge`, …): each number a property is
//! bounded by is recomputed from the `LimiterConfig` fields with the rules as
//! the document states them.

use qsim_core::limiter::admission::{Limit, LimiterConfig, Semantics, Unit};
use qsim_core::limiter::rates::OutputAccounting;

/// The limiter's "never" (`u64::MAX` nanoseconds).
pub const NEVER: u64 = u64::MAX;
pub const SECOND: u64 = 1_000_000_000;
pub const MINUTE: u64 = 60 * SECOND;
pub const HOUR: u64 = 3600 * SECOND;
/// Reservations are basis points of capacity.
pub const ALL_BP: u128 = 10_000;
/// Seconds of its floor rate a strict-floors credit bucket holds (doc: "depth 5 s of that rate").
pub const CREDIT_SECS: u128 = 5;

/// A bucket as the document describes it: `depth` units, refilled at `depth`
/// units per `refill` nanoseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub depth: u64,
    pub refill: u64,
}

impl Shape {
    /// A capacity bucket of `bp` basis points of the configured rate and the
    /// given depth; the refill window is rounded up ("no bucket ever refills
    /// faster than its nominal rate").
    pub fn of_rate(cfg: &LimiterConfig, bp: u32, depth: u64) -> Shape {
        let per_minute_bp = cfg.capacity as u128 * bp as u128; // units·bp per minute
        let ns = (MINUTE as u128 * depth as u128 * ALL_BP).div_ceil(per_minute_bp);
        Shape {
            depth,
            refill: ns as u64,
        }
    }
}

/// The burst headroom `B`: `--burst`, else `(1 − θ)·C` rounded.
pub fn burst(cfg: &LimiterConfig) -> u64 {
    match cfg.burst {
        Some(b) => b,
        None => ((1.0 - cfg.threshold) * cfg.capacity as f64).round() as u64,
    }
}

/// A capacity bucket's depth for a share of `bp`: its share of the burst,
/// at least one second of its own rate, at least one unit.
pub fn share_depth(cfg: &LimiterConfig, bp: u32) -> u64 {
    let of_burst = burst(cfg) as u128 * bp as u128 / ALL_BP;
    let one_second = (cfg.capacity as u128 * bp as u128).div_ceil(ALL_BP * 60);
    of_burst.max(one_second).max(1) as u64
}

/// A strict-floors credit bucket's depth: 5 s of the floor rate, ≥ 1.
pub fn credit_depth(cfg: &LimiterConfig, bp: u32) -> u64 {
    ((cfg.capacity as u128 * bp as u128 * CREDIT_SECS).div_ceil(ALL_BP * 60)).max(1) as u64
}

/// The buckets of a configuration, per the document's table.
#[derive(Debug, Clone)]
pub struct Buckets {
    /// Per consumer: its credit bucket (strict-floors, partitioned) or its
    /// floor bucket (litellm-priority).
    pub floor: Vec<Option<Shape>>,
    /// The deployment bucket `G` (strict-floors; partitioned: of the
    /// reserved consumers).
    pub g: Option<Shape>,
    /// The pool (rate-limit-only: the one bucket; litellm-priority and
    /// partitioned: the unreserved share).
    pub pool: Option<Shape>,
}

pub fn reserved_bp(cfg: &LimiterConfig) -> u32 {
    cfg.consumers.iter().map(|c| c.reserved_bp).sum()
}

pub fn buckets(cfg: &LimiterConfig) -> Buckets {
    let n = cfg.consumers.len();
    let reserved = reserved_bp(cfg);
    let unreserved = ALL_BP as u32 - reserved;
    let credits = |cfg: &LimiterConfig| -> Vec<Option<Shape>> {
        cfg.consumers
            .iter()
            .map(|c| {
                (c.reserved_bp > 0)
                    .then(|| Shape::of_rate(cfg, c.reserved_bp, credit_depth(cfg, c.reserved_bp)))
            })
            .collect()
    };
    let credit_sum = |f: &[Option<Shape>]| f.iter().flatten().map(|s| s.depth).sum::<u64>();
    match cfg.semantics {
        Semantics::RateLimitOnly => Buckets {
            floor: vec![None; n],
            g: None,
            pool: Some(Shape::of_rate(cfg, 10_000, share_depth(cfg, 10_000))),
        },
        Semantics::StrictFloors => {
            let floor = credits(cfg);
            // at least every credit, one accruing per floor and the
            // unreserved share's depth (≥ 1)
            let k = floor.iter().flatten().count() as u64;
            let d =
                share_depth(cfg, 10_000).max(credit_sum(&floor) + k + share_depth(cfg, unreserved));
            Buckets {
                g: Some(Shape::of_rate(cfg, 10_000, d)),
                floor,
                pool: None,
            }
        }
        Semantics::Partitioned => {
            let floor = credits(cfg);
            let g = (reserved > 0).then(|| {
                Shape::of_rate(
                    cfg,
                    reserved,
                    share_depth(cfg, reserved)
                        .max(credit_sum(&floor) + floor.iter().flatten().count() as u64 + 1),
                )
            });
            let pool = (unreserved > 0)
                .then(|| Shape::of_rate(cfg, unreserved, share_depth(cfg, unreserved)));
            Buckets { floor, g, pool }
        }
        Semantics::LitellmPriority => Buckets {
            floor: cfg
                .consumers
                .iter()
                .map(|c| {
                    (c.reserved_bp > 0).then(|| {
                        Shape::of_rate(cfg, c.reserved_bp, share_depth(cfg, c.reserved_bp))
                    })
                })
                .collect(),
            g: None,
            pool: (unreserved > 0)
                .then(|| Shape::of_rate(cfg, unreserved, share_depth(cfg, unreserved))),
        },
    }
}

impl Buckets {
    /// The buckets admitted work is paid from (credits are not: under
    /// strict-floors and partitioned every credited unit is also paid from `G`).
    pub fn capacity(&self, semantics: Semantics) -> Vec<Shape> {
        let mut v: Vec<Shape> = Vec::new();
        if semantics == Semantics::LitellmPriority {
            v.extend(self.floor.iter().flatten());
        }
        v.extend(self.g);
        v.extend(self.pool);
        v
    }
}

/// Units a request is charged at admission, and the units that must be
/// available for it (doc: token limits count `input + max_tokens`, or only
/// the input when output is counted on completion, and then at least one).
pub fn charge(tokens: bool, acc: OutputAccounting, input: u64, max: u64) -> (u64, u64) {
    if !tokens {
        return (1, 1);
    }
    if acc == OutputAccounting::OnCompletion {
        (input, input.max(1))
    } else {
        (input + max, input + max)
    }
}

/// What a completion settles: `(refund, extra charge)`.
pub fn settlement(tokens: bool, acc: OutputAccounting, max: u64, actual: u64) -> (u64, u64) {
    match (tokens, acc) {
        (false, _) => (0, 0),
        (true, OutputAccounting::ReserveRefund) => {
            (max - max.min(actual), actual.saturating_sub(max))
        }
        (true, OutputAccounting::ReserveNoRefund) => (0, actual.saturating_sub(max)),
        (true, OutputAccounting::OnCompletion) => (0, actual),
    }
}

pub fn tpm(cfg: &LimiterConfig) -> bool {
    cfg.unit == Unit::Tpm
}

/// One bucket's level, kept as a count of "refill nanoseconds" (a unit is
/// `refill` of them; `depth` of them accrue per nanosecond).
#[derive(Debug, Clone)]
pub struct RefBucket {
    pub shape: Shape,
    stock: i128,
    seen: u64,
}

impl RefBucket {
    pub fn full(shape: Shape, now: u64) -> RefBucket {
        RefBucket {
            shape,
            stock: shape.depth as i128 * shape.refill as i128,
            seen: now,
        }
    }
    fn cap(&self) -> i128 {
        self.shape.depth as i128 * self.shape.refill as i128
    }
    fn stock_at(&self, t: u64) -> i128 {
        let grown = t.saturating_sub(self.seen) as i128 * self.shape.depth as i128;
        (self.stock + grown).min(self.cap())
    }
    pub fn sync(&mut self, t: u64) {
        if t > self.seen {
            self.stock = self.stock_at(t);
            self.seen = t;
        }
    }
    /// Whole units at `t`.
    pub fn units(&self, t: u64) -> i64 {
        self.stock_at(t).div_euclid(self.shape.refill as i128) as i64
    }
    /// The first instant `≥ t` at which `n` whole units are there.
    pub fn ready(&self, t: u64, n: u64) -> u64 {
        if n > self.shape.depth {
            return NEVER;
        }
        let missing = n as i128 * self.shape.refill as i128 - self.stock_at(t);
        if missing <= 0 {
            t
        } else {
            let d = self.shape.depth as i128;
            t + ((missing + d - 1) / d) as u64
        }
    }
    /// Fraction of the depth held at `t`.
    pub fn fraction(&self, t: u64) -> f64 {
        self.stock_at(t) as f64 / self.cap() as f64
    }
    pub fn spend(&mut self, n: u64) {
        self.stock -= n as i128 * self.shape.refill as i128;
    }
    pub fn give_back(&mut self, n: u64) {
        self.stock = (self.stock + n as i128 * self.shape.refill as i128).min(self.cap());
    }
}

/// A consumer's own limit in the reference.
#[derive(Debug, Clone)]
struct Own {
    limit: Limit,
    tokens: bool,
    bucket: RefBucket,
}

/// What the reference decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefDecision {
    Admit { lease_until: u64 },
    Deny { limit: Limit, retry_at: u64 },
}

/// The whole limiter for the consumers that draw on a single capacity
/// bucket that nobody else changes: every consumer under rate-limit-only
/// (reservations are not enforced), every consumer under any semantics
/// without reservations, and the unreserved consumers under partitioned
/// (the pool is theirs alone). `None` for consumers it does not model.
/// It models the consumer's own limits (`max_input_tokens`, `concurrent`
/// with leases, `rpm`, `tokens_per_hour`) in the documented order, exact
/// retry times, refunds, late settlement and debt.
#[derive(Debug, Clone)]
pub struct SingleBucket {
    cfg: LimiterConfig,
    lease: u64,
    clock: u64,
    cap: Vec<Option<usize>>,
    pools: Vec<RefBucket>,
    own: Vec<Vec<Own>>,
    leases: Vec<Vec<u64>>,
}

impl SingleBucket {
    pub fn new(cfg: &LimiterConfig, lease: u64, now: u64) -> SingleBucket {
        let b = buckets(cfg);
        let mut pools = Vec::new();
        let no_reservations = reserved_bp(cfg) == 0;
        let cap: Vec<Option<usize>> = cfg
            .consumers
            .iter()
            .map(|c| {
                let shape = match cfg.semantics {
                    Semantics::RateLimitOnly => b.pool,
                    Semantics::Partitioned if c.reserved_bp == 0 => b.pool,
                    Semantics::StrictFloors if no_reservations => b.g,
                    Semantics::LitellmPriority if no_reservations => b.pool,
                    _ => None,
                }?;
                if pools.is_empty() {
                    pools.push(RefBucket::full(shape, now));
                }
                Some(0)
            })
            .collect();
        let own = cfg
            .consumers
            .iter()
            .map(|c| {
                let mut v = Vec::new();
                if let Some(r) = c.policy.rpm {
                    let s = Shape {
                        depth: r.max(1),
                        refill: MINUTE,
                    };
                    v.push(Own {
                        limit: Limit::Rpm,
                        tokens: false,
                        bucket: RefBucket::full(s, now),
                    });
                }
                if let Some(t) = c.policy.tokens_per_hour {
                    let s = Shape {
                        depth: t.max(1),
                        refill: HOUR,
                    };
                    v.push(Own {
                        limit: Limit::TokensPerHour,
                        tokens: true,
                        bucket: RefBucket::full(s, now),
                    });
                }
                v
            })
            .collect();
        SingleBucket {
            cfg: cfg.clone(),
            lease,
            clock: now,
            cap,
            pools,
            own,
            leases: vec![Vec::new(); cfg.consumers.len()],
        }
    }

    pub fn models(&self, consumer: usize) -> bool {
        self.cap[consumer].is_some()
    }

    /// The reference's capacity bucket (for bounds on it).
    pub fn pool(&self) -> Option<Shape> {
        self.pools.first().map(|b| b.shape)
    }

    fn live(&self, c: usize, t: u64) -> Vec<u64> {
        let mut v: Vec<u64> = self.leases[c].iter().copied().filter(|&e| e > t).collect();
        v.sort_unstable();
        v
    }

    /// Decide for consumer `c` (must be modelled) at `now`; applies an admission.
    pub fn decide(&mut self, now: u64, c: usize, input: u64, max: u64) -> RefDecision {
        let t = now.max(self.clock);
        let pol = self.cfg.consumers[c].policy;
        if pol.max_input_tokens.is_some_and(|m| input > m) {
            return RefDecision::Deny {
                limit: Limit::MaxInputTokens,
                retry_at: NEVER,
            };
        }
        let acc = self.cfg.accounting;
        // the earliest time each check passes, in the documented order
        let mut checks: Vec<(Limit, u64)> = Vec::new();
        if let Some(m) = pol.concurrent {
            let live = self.live(c, t);
            let free = if live.len() < m as usize {
                t
            } else {
                live[live.len() - m as usize]
            };
            checks.push((Limit::Concurrent, free));
        }
        for o in &self.own[c] {
            let (_, need) = charge(o.tokens, acc, input, max);
            checks.push((o.limit, o.bucket.ready(t, need)));
        }
        let pool = &self.pools[self.cap[c].expect("modelled consumer")];
        let (_, need) = charge(tpm(&self.cfg), acc, input, max);
        checks.push((Limit::Capacity, pool.ready(t, need)));
        if let Some(&(limit, _)) = checks.iter().find(|(_, at)| *at > t) {
            let retry_at = checks.iter().map(|x| x.1).max().unwrap_or(t);
            return RefDecision::Deny { limit, retry_at };
        }
        // admit: every bucket to t, then charge
        self.clock = t;
        for o in &mut self.own[c] {
            o.bucket.sync(t);
            o.bucket.spend(charge(o.tokens, acc, input, max).0);
        }
        let tokens = tpm(&self.cfg);
        let pool = &mut self.pools[0];
        pool.sync(t);
        pool.spend(charge(tokens, acc, input, max).0);
        let until = t.saturating_add(self.lease);
        if pol.concurrent.is_some() {
            self.leases[c].retain(|&e| e > t);
            self.leases[c].push(until);
        }
        RefDecision::Admit { lease_until: until }
    }

    /// A modelled consumer's request admitted with `lease_until` completed.
    pub fn complete(
        &mut self,
        now: u64,
        c: usize,
        lease_until: u64,
        input: u64,
        max: u64,
        actual: u64,
    ) {
        let _ = input;
        let t = now.max(self.clock);
        self.clock = t;
        if let Some(k) = self.leases[c].iter().position(|&e| e == lease_until) {
            self.leases[c].swap_remove(k);
        }
        self.leases[c].retain(|&e| e > t);
        let acc = self.cfg.accounting;
        for o in &mut self.own[c] {
            let (back, extra) = settlement(o.tokens, acc, max, actual);
            o.bucket.sync(t);
            o.bucket.give_back(back);
            o.bucket.spend(extra);
        }
        let (back, extra) = settlement(tpm(&self.cfg), acc, max, actual);
        let pool = &mut self.pools[0];
        pool.sync(t);
        pool.give_back(back);
        pool.spend(extra);
    }

    /// Advance the reference's clock for an event of a consumer it does not
    /// model (its buckets are untouched; only the effective time moves).
    pub fn observe(&mut self, now: u64) {
        self.clock = self.clock.max(now);
    }

    /// Whole units in the capacity bucket at `t`.
    pub fn pool_units(&self, t: u64) -> i64 {
        self.pools[0].units(t)
    }
}

/// LiteLLM's fixed window as the document states it: opened by the first
/// admission after the previous one expired, 60 s long; counts units
/// admitted (at least one per admission).
#[derive(Debug, Clone, Default)]
pub struct LitellmWindow {
    start: Option<u64>,
    units: u64,
}

impl LitellmWindow {
    pub fn units_at(&self, t: u64) -> u64 {
        match self.start {
            Some(s) if t < s + MINUTE => self.units,
            _ => 0,
        }
    }
    pub fn admitted(&mut self, t: u64, units: u64) {
        let open = matches!(self.start, Some(s) if t < s + MINUTE);
        if !open {
            self.start = Some(t);
            self.units = 0;
        }
        self.units += units.max(1);
    }
}

/// Where an admission is paid from, in the reference's terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Paid {
    /// strict-floors / partitioned: `G`, `credits` of them the consumer's own.
    G {
        credits: u64,
    },
    Own,
    Pool,
    Borrowed(usize),
}

/// The capacity rule of every semantics as docs/limiter.md states it, on
/// reference buckets (consumers without limits of their own): whether a
/// request is admitted now and from where. It follows the limiter's
/// admissions and settlements (applied to the bucket each was paid from).
#[derive(Debug, Clone)]
pub struct Capacity {
    cfg: LimiterConfig,
    floor: Vec<Option<RefBucket>>,
    g: Option<RefBucket>,
    pool: Option<RefBucket>,
    window: LitellmWindow,
}

impl Capacity {
    pub fn new(cfg: &LimiterConfig, now: u64) -> Capacity {
        let b = buckets(cfg);
        let full = |s: Option<Shape>| s.map(|s| RefBucket::full(s, now));
        Capacity {
            cfg: cfg.clone(),
            floor: b.floor.iter().map(|s| full(*s)).collect(),
            g: full(b.g),
            pool: full(b.pool),
            window: LitellmWindow::default(),
        }
    }

    fn has(b: &Option<RefBucket>, t: u64, n: u64) -> bool {
        b.as_ref().is_some_and(|b| b.units(t) >= n as i64)
    }

    /// The credits `G` keeps back for consumer `j` other than the one asking:
    /// its whole credits and the one it is accruing, at most its depth.
    fn kept_for(&self, j: usize, t: u64) -> u64 {
        match &self.floor[j] {
            None => 0,
            Some(b) => {
                let whole = b.units(t).max(0) as u64;
                (whole + 1).min(b.shape.depth)
            }
        }
    }

    /// The decision of the capacity rule alone for consumer `c` needing `n` at `t`.
    pub fn source(&self, t: u64, c: usize, n: u64) -> Option<Paid> {
        let reserved = self.cfg.consumers[c].reserved_bp > 0;
        match self.cfg.semantics {
            Semantics::RateLimitOnly => Capacity::has(&self.pool, t, n).then_some(Paid::Pool),
            Semantics::Partitioned if !reserved => {
                Capacity::has(&self.pool, t, n).then_some(Paid::Pool)
            }
            Semantics::StrictFloors | Semantics::Partitioned => {
                let own = self.floor[c]
                    .as_ref()
                    .map_or(0, |b| b.units(t).max(0) as u64);
                let g = self.g.as_ref()?.units(t);
                if own >= n && reserved {
                    // paid by its own credits: G always backs them
                    return (g >= n as i64).then_some(Paid::G { credits: n });
                }
                let others: u64 = (0..self.floor.len())
                    .filter(|&j| j != c)
                    .map(|j| self.kept_for(j, t))
                    .sum();
                // its own credits this request leaves, and the one accruing
                let mine = if reserved { own + 1 - own.min(n) } else { 0 };
                (g >= (n + others + mine) as i64).then_some(Paid::G {
                    credits: own.min(n),
                })
            }
            Semantics::LitellmPriority => {
                if reserved && Capacity::has(&self.floor[c], t, n) {
                    return Some(Paid::Own);
                }
                if Capacity::has(&self.pool, t, n) {
                    return Some(Paid::Pool);
                }
                let saturated =
                    self.window.units_at(t) as f64 >= self.cfg.threshold * self.cfg.capacity as f64;
                if saturated {
                    return None;
                }
                // the most idle other floor that holds the units; ties to the lowest index
                let mut best: Option<(usize, f64)> = None;
                for (j, b) in self.floor.iter().enumerate() {
                    let Some(b) = b else { continue };
                    if j == c || b.units(t) < n as i64 {
                        continue;
                    }
                    let f = b.fraction(t);
                    if best.is_none() || f > best.unwrap().1 {
                        best = Some((j, f));
                    }
                }
                best.map(|(j, _)| Paid::Borrowed(j))
            }
        }
    }

    fn bucket(&mut self, c: usize, paid: Paid) -> Option<&mut RefBucket> {
        match paid {
            Paid::G { .. } => self.g.as_mut(),
            Paid::Own => self.floor[c].as_mut(),
            Paid::Pool => self.pool.as_mut(),
            Paid::Borrowed(j) => self.floor[j].as_mut(),
        }
    }

    /// An admission of `charge` units for `c` at `t`, paid as `paid`.
    pub fn admitted(&mut self, t: u64, c: usize, paid: Paid, charge: u64) {
        if let Some(b) = self.bucket(c, paid) {
            b.sync(t);
            b.spend(charge);
        }
        if let Paid::G { credits } = paid {
            if let Some(f) = self.floor[c].as_mut() {
                f.sync(t);
                f.spend(credits.min(charge));
            }
        }
        if self.cfg.semantics == Semantics::LitellmPriority {
            self.window.admitted(t, charge);
        }
    }

    /// A settlement at `t` of a request of `c` paid as `paid`.
    pub fn settled(&mut self, t: u64, c: usize, paid: Paid, refund: u64, extra: u64) {
        if let Some(b) = self.bucket(c, paid) {
            b.sync(t);
            b.give_back(refund);
            b.spend(extra);
        }
    }
}
