//! The consumer-aware admission limiter for a shared deployment: deployment
//! capacity with burst headroom, per-consumer rate limits (default policy plus
//! per-entity overrides), and quota reservations (floors) with an unreserved
//! pool, under a named reservation semantics.
//!
//! # Parameters, state, rules
//!
//! - [`Params`] (`params.rs`): immutable, compiled once from a
//!   [`LimiterConfig`] and shared through an `Arc`: which buckets exist
//!   (capacity and refill window), what each means, the consumers' own
//!   limits, the concurrency limits and the lease.
//! - [`State`] (`state.rs`): a small plain value (`Clone + PartialEq +
//!   Serialize + Deserialize`): one clock, the bucket levels as of that
//!   clock, the leases of occupied concurrency slots and, for
//!   litellm-priority, the 60 s window. It can live in a shared store.
//! - [`decide`] / [`complete`]: free functions of `(params, state, now, …)`;
//!   the capacity rule of each semantics is its own module
//!   (`rate_limit_only.rs`, `strict_floors.rs`, `litellm_priority.rs`,
//!   `partitioned.rs`: layout and capacity check). [`Limiter`] bundles an
//!   `Arc<Params>` and a `State` for call sites that own both.
//!
//! Sans-IO: nothing here reads a clock. Built on [`BucketSpec`] and
//! [`LimitSpec`](crate::limiter::rates::LimitSpec); the token accounting
//! (reserve `max_tokens`, refund the unused part on completion) is
//! `LimitSpec::admit_charge` / `LimitSpec::settle`, the same rules the
//! hosted-API model uses.
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
//! A request is checked in this order at the effective time
//! `t = max(now, state.clock)`; the first failing check names the denial:
//! `max_input_tokens`, `concurrent` (unexpired leases), the consumer's own
//! `rpm` and `tokens_per_hour` buckets, then `capacity` under the
//! semantics. In every semantics each admitted unit comes out of a capacity
//! bucket, so over any window `w` the total admitted is at most
//! `C·w + Σ depths`.
//!
//! A denial changes nothing and carries the earliest time at which the same
//! request would pass every check if nothing else happened (exact):
//! `max_input_tokens` carries [`NEVER`]; `concurrent` the time the lease
//! that frees a slot expires (a completion may free it sooner), then the
//! other checks from there.
//!
//! # Shared state: clock skew and leases
//!
//! Replicas sharing one state each pass their own `now`. The state keeps the
//! latest time applied (`clock`); every decision and completion runs at
//! `max(now, clock)`, so a lagging clock never sees a bucket before its last
//! update (no negative refill, no spurious denial), and a leading clock
//! refills early by at most its lead. Each admission under a `concurrent`
//! limit takes a slot leased until `t + lease` (the grant carries
//! `lease_until`); a completion frees it, and if the completion never comes
//! the slot is free again when the lease expires. Tokens reserved by a
//! request whose completion never comes are never refunded (conservative).

//!
//! Modules (each imports only those below it): `config`, `decision` (the
//! request and the answer) and `layout` (bucket sizing) are leaves;
//! `params` and `state`; the four semantics (`rate_limit_only`,
//! `strict_floors`, `litellm_priority`, `partitioned`); `semantics`, which
//! dispatches to them (`Params::new`'s layout, the capacity rule); `carry`
//! (reloads); and this module, which decides and completes.

mod carry;
mod config;
mod decision;
mod layout;
mod litellm_priority;
mod params;
mod partitioned;
mod rate_limit_only;
mod semantics;
mod state;
mod strict_floors;

pub use carry::{carry_over, translate_grant};
pub use config::{ConsumerPolicy, ConsumerSpec, LimiterConfig, Semantics, Unit, BP_FULL};
pub use decision::{Decision, Grant, Limit, Request, Source};
pub use params::{Params, DEFAULT_LEASE};
pub use state::{State, Window};
pub use strict_floors::CREDIT_SECONDS;

use crate::limiter::bucket::BucketSpec;
use crate::limiter::rates::Cost;
use crate::time::{Nanos, NEVER};
use semantics::capacity;
use std::sync::Arc;

/// Why a request can never be admitted, whatever the wait (the denial
/// [`decide`] gives it carries `NEVER`): the limit, what the request needs
/// of it and the most it can ever hold for this consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeverFits {
    pub limit: Limit,
    pub need: u64,
    pub largest: u64,
}

impl Params {
    /// `Some` iff no wait can admit `req`: its input is over
    /// `max_input_tokens`, or its charge is over the depth of one of the
    /// consumer's own buckets, or its capacity need is over
    /// [`Params::largest_need`]. Exactly the requests [`decide`] denies with
    /// `NEVER` (a property test holds the two together).
    pub fn never_fits(&self, req: &Request) -> Option<NeverFits> {
        let c = req.consumer;
        if let Some(m) = self.cfg.consumers[c].policy.max_input_tokens {
            if req.input_tokens > m {
                return Some(NeverFits {
                    limit: Limit::MaxInputTokens,
                    need: req.input_tokens,
                    largest: m,
                });
            }
        }
        let cost = req.cost();
        for o in &self.own[c] {
            let (_, need) = o.spec.admit_charge(cost);
            let largest = self.buckets[o.slot].capacity();
            if need > largest {
                return Some(NeverFits {
                    limit: o.kind,
                    need,
                    largest,
                });
            }
        }
        let (_, need) = self.deploy.admit_charge(cost);
        let largest = self.largest_need(c);
        (need > largest).then_some(NeverFits {
            limit: Limit::Capacity,
            need,
            largest,
        })
    }
}

/// An admission worked out on a read-only state, applied by [`apply`].
struct Admission {
    t: Nanos,
    grant: Grant,
    cost: Cost,
    charge: u64,
}

/// The consumer's own limits at `x`: `Err((first failing, earliest time all pass))`.
fn own_limits(p: &Params, s: &State, c: usize, x: Nanos, cost: Cost) -> Result<(), (Limit, Nanos)> {
    let mut denied = None;
    let mut retry_at = x;
    for o in &p.own[c] {
        let (_, need) = o.spec.admit_charge(cost);
        let e = s.earliest(p, o.slot, x, need);
        if e > x && denied.is_none() {
            denied = Some(o.kind);
        }
        retry_at = retry_at.max(e);
    }
    match denied {
        Some(k) => Err((k, retry_at)),
        None => Ok(()),
    }
}

/// Earliest time ≥ `x` at which the consumer's own limits and then capacity
/// pass (own limits only get easier with time).
fn retry_from(p: &Params, s: &State, c: usize, x: Nanos, cost: Cost, need: u64) -> Nanos {
    if x == NEVER {
        return NEVER;
    }
    let x = match own_limits(p, s, c, x, cost) {
        Ok(()) => x,
        Err((_, NEVER)) => return NEVER,
        Err((_, r)) => r,
    };
    capacity(p, s, x, c, need).1
}

/// Decide on a read-only state: the admission to apply, or the denial.
fn evaluate(p: &Params, s: &State, now: Nanos, req: &Request) -> Result<Admission, Decision> {
    let t = s.effective(now);
    let c = req.consumer;
    let pol = p.cfg.consumers[c].policy;
    let deny = |limit, retry_at| Decision::Deny { limit, retry_at };
    if let Some(m) = pol.max_input_tokens {
        if req.input_tokens > m {
            return Err(deny(Limit::MaxInputTokens, NEVER));
        }
    }
    let cost = req.cost();
    let (charge, need) = p.deploy.admit_charge(cost);
    if let Some((i, m)) = p.slots[c] {
        let free = s.slot_free_at(i, t, m);
        if free > t {
            return Err(deny(
                Limit::Concurrent,
                retry_from(p, s, c, free, cost, need),
            ));
        }
    }
    let own = own_limits(p, s, c, t, cost);
    let (src, cap_t) = capacity(p, s, t, c, need);
    match (own, src) {
        (Ok(()), Some(source)) => Ok(Admission {
            t,
            grant: Grant {
                consumer: c,
                source,
                input_tokens: req.input_tokens,
                max_tokens: req.max_tokens,
                lease_until: t.saturating_add(p.lease),
            },
            cost,
            charge,
        }),
        (Err((limit, r)), _) => {
            // the earliest time capacity also passes, from the time the
            // consumer's own limits pass (those only get easier)
            let retry_at = if r == NEVER {
                NEVER
            } else if r <= cap_t {
                cap_t
            } else {
                capacity(p, s, r, c, need).1
            };
            Err(deny(limit, retry_at))
        }
        (Ok(()), None) => Err(deny(Limit::Capacity, cap_t)),
    }
}

/// Commit an admission: bring the state to its time, charge the consumer's
/// own limits and the capacity bucket(s) of its source, take the lease.
fn apply(p: &Params, s: &mut State, a: &Admission) {
    let t = a.t;
    let c = a.grant.consumer;
    s.advance(p, t);
    for o in &p.own[c] {
        let (charge, _) = o.spec.admit_charge(a.cost);
        s.take(p, o.slot, charge);
    }
    let bucket = |src: Source| match src {
        Source::Own => p.floor[c],
        Source::Pool => p.pool,
        Source::Borrowed(j) => p.floor[j],
        Source::Shared { .. } => p.shared,
    };
    if let Some(i) = bucket(a.grant.source) {
        s.take(p, i, a.charge);
    }
    if let Source::Shared { credit } = a.grant.source {
        // strict-floors / partitioned: the part paid with own credits
        if let Some(i) = p.floor[c] {
            s.take(p, i, credit.min(a.charge));
        }
    }
    if let Some((i, _)) = p.slots[c] {
        s.lease(i, t, a.grant.lease_until);
    }
    if p.cfg.semantics == Semantics::LitellmPriority {
        litellm_priority::on_admit(s, t, a.charge);
    }
}

/// Decide one request at `now` (effective time `max(now, state.clock)`).
/// An admission updates `state`; a denial leaves it bit-for-bit unchanged.
pub fn decide(p: &Params, s: &mut State, now: Nanos, req: &Request) -> Decision {
    match evaluate(p, s, now, req) {
        Ok(a) => {
            apply(p, s, &a);
            Decision::Admit(a.grant)
        }
        Err(d) => d,
    }
}

/// The pure form: `(params, state, request, now) → (decision, new state)`;
/// the new state is `None` when unchanged (every denial). Only an admission
/// copies the state (the small value, never the parameters).
pub fn decide_pure(p: &Params, s: &State, now: Nanos, req: &Request) -> (Decision, Option<State>) {
    match evaluate(p, s, now, req) {
        Ok(a) => {
            let mut next = s.clone();
            apply(p, &mut next, &a);
            (Decision::Admit(a.grant), Some(next))
        }
        Err(d) => (d, None),
    }
}

/// An admitted request finished at `now` (effective time
/// `max(now, state.clock)`) having produced `actual_output` tokens: release
/// its concurrency slot if its lease still holds it, and settle token
/// accounting (refund unused `max_tokens` to the bucket it was charged to,
/// capped at capacity; or charge output counted on completion). A
/// completion after the lease expired still settles its tokens.
pub fn complete(p: &Params, s: &mut State, now: Nanos, grant: &Grant, actual_output: u64) {
    let t = s.effective(now);
    let c = grant.consumer;
    s.advance(p, t);
    if let Some((i, _)) = p.slots[c] {
        s.release(i, t, grant.lease_until);
    }
    let cost = Cost {
        input_tokens: grant.input_tokens,
        max_tokens: grant.max_tokens,
    };
    for o in &p.own[c] {
        let (refund, extra) = o.spec.settle(cost, actual_output);
        s.refund(p, o.slot, refund);
        s.take(p, o.slot, extra);
    }
    let (refund, extra) = p.deploy.settle(cost, actual_output);
    let b = match grant.source {
        Source::Own => p.floor[c],
        Source::Pool => p.pool,
        Source::Borrowed(j) => p.floor[j],
        Source::Shared { .. } => p.shared,
    };
    if let Some(i) = b {
        s.refund(p, i, refund);
        s.take(p, i, extra);
    }
}

/// Parameters and state together, for call sites that own both (the
/// simulator, a single-process proxy). `Clone` copies the state and shares
/// the parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Limiter {
    params: Arc<Params>,
    state: State,
}

impl Limiter {
    /// Compile `cfg` (default lease) with every bucket full at `now`.
    pub fn new(cfg: LimiterConfig, now: Nanos) -> Result<Limiter, String> {
        Ok(Limiter::with_params(Arc::new(Params::new(cfg)?), now))
    }
    /// A fresh state for shared parameters.
    pub fn with_params(params: Arc<Params>, now: Nanos) -> Limiter {
        let state = State::new(&params, now);
        Limiter { params, state }
    }
    /// Parameters and a state from elsewhere (checked to fit).
    pub fn from_parts(params: Arc<Params>, state: State) -> Result<Limiter, String> {
        state.check(&params)?;
        Ok(Limiter { params, state })
    }
    pub fn decide(&mut self, now: Nanos, req: &Request) -> Decision {
        decide(&self.params, &mut self.state, now, req)
    }
    pub fn complete(&mut self, now: Nanos, grant: &Grant, actual_output: u64) {
        complete(&self.params, &mut self.state, now, grant, actual_output)
    }
    pub fn params(&self) -> &Arc<Params> {
        &self.params
    }
    pub fn state(&self) -> &State {
        &self.state
    }
    pub fn into_state(self) -> State {
        self.state
    }
    pub fn config(&self) -> &LimiterConfig {
        &self.params.cfg
    }
    /// Occupied concurrency slots of `consumer` at `now` (`None` without a
    /// `concurrent` limit: then nothing is tracked).
    pub fn in_flight(&self, consumer: usize, now: Nanos) -> Option<u32> {
        self.params.slots[consumer]
            .map(|(i, _)| self.state.active(i, self.state.effective(now)) as u32)
    }
    /// Units of burst headroom left at `now` (sum of capacity bucket levels, ≥ 0 each).
    pub fn headroom(&self, now: Nanos) -> u64 {
        let t = self.state.effective(now);
        self.params
            .capacity_slots()
            .into_iter()
            .map(|i| self.state.available(&self.params, i, t).max(0) as u64)
            .sum()
    }
    /// litellm-priority: units admitted in the current window ≥ θ·C
    /// (always false under the other semantics, which keep no window).
    pub fn saturated(&self, now: Nanos) -> bool {
        litellm_priority::saturated(&self.params, &self.state, self.state.effective(now))
    }
    /// Every bucket (capacity, floor credits, per-consumer limits): whole
    /// tokens available at `now` and capacity.
    pub fn bucket_levels(&self, now: Nanos) -> Vec<(i64, u64)> {
        let t = self.state.effective(now);
        self.params
            .buckets
            .iter()
            .enumerate()
            .map(|(i, b): (usize, &BucketSpec)| {
                (self.state.available(&self.params, i, t), b.capacity())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::rates::OutputAccounting;
    use crate::time::NS_PER_SEC;

    pub(crate) fn cfg(sem: Semantics, reserve: &[u32]) -> LimiterConfig {
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

    pub(crate) fn req(c: usize) -> Request {
        Request {
            consumer: c,
            input_tokens: 100,
            max_tokens: 256,
        }
    }

    #[test]
    fn invalid_configs_are_errors_not_panics() {
        let mut c = cfg(Semantics::StrictFloors, &[6000, 6000]);
        assert!(Limiter::new(c.clone(), 0).is_err());
        c.consumers[0].reserved_bp = 1000;
        c.capacity = 0;
        assert!(Params::new(c.clone()).is_err());
        c.capacity = 1000;
        assert!(Params::new(c.clone()).unwrap().with_lease(0).is_err());
        let p = Arc::new(Params::new(c).unwrap());
        let other = Params::new(cfg(Semantics::RateLimitOnly, &[])).unwrap();
        assert!(Limiter::from_parts(p.clone(), State::new(&other, 0)).is_err());
        assert!(Limiter::from_parts(p.clone(), State::new(&p, 0)).is_ok());
    }

    #[test]
    fn a_lagging_clock_decides_at_the_state_clock() {
        for sem in Semantics::ALL {
            let mut l = Limiter::new(cfg(sem, &[3000, 2000, 3000]), 0).unwrap();
            let t = 10 * NS_PER_SEC;
            assert!(l.decide(t, &req(3)).is_admit());
            // 50 ms behind the last update, capacity free: admitted, and the
            // state's clock does not move back
            assert!(l.decide(t - 50_000_000, &req(3)).is_admit(), "{sem:?}");
            assert_eq!(l.state().clock(), t);
        }
    }

    #[test]
    fn a_lost_completion_frees_its_slot_when_the_lease_expires() {
        let mut c = cfg(Semantics::StrictFloors, &[3000]);
        c.consumers[1].policy.concurrent = Some(1);
        let p = Arc::new(Params::new(c).unwrap().with_lease(30 * NS_PER_SEC).unwrap());
        let mut l = Limiter::with_params(p, 0);
        let lost = match l.decide(0, &req(1)) {
            Decision::Admit(g) => g,
            d => panic!("{d:?}"),
        };
        assert_eq!(lost.lease_until, 30 * NS_PER_SEC);
        assert_eq!(l.in_flight(1, 0), Some(1));
        let before = l.clone();
        assert_eq!(
            l.decide(NS_PER_SEC, &req(1)),
            Decision::Deny {
                limit: Limit::Concurrent,
                retry_at: 30 * NS_PER_SEC
            }
        );
        assert_eq!(l, before);
        assert!(!l.decide(30 * NS_PER_SEC - 1, &req(1)).is_admit());
        // a lease expiring at t no longer holds its slot at t
        assert_eq!(l.in_flight(1, 30 * NS_PER_SEC - 1), Some(1));
        assert_eq!(l.in_flight(1, 30 * NS_PER_SEC), Some(0));
        let next = match l.decide(30 * NS_PER_SEC, &req(1)) {
            Decision::Admit(g) => g,
            d => panic!("{d:?}"),
        };
        // the lost request's completion arrives late: it must not free the
        // slot now held by `next`
        l.complete(31 * NS_PER_SEC, &lost, 10);
        assert_eq!(l.in_flight(1, 31 * NS_PER_SEC), Some(1));
        assert!(!l.decide(31 * NS_PER_SEC, &req(1)).is_admit());
        l.complete(32 * NS_PER_SEC, &next, 10);
        assert_eq!(l.in_flight(1, 32 * NS_PER_SEC), Some(0));
        assert!(l.state().leases.iter().all(|v| v.is_empty()));
    }

    #[test]
    fn pure_form_copies_only_on_admission() {
        let p = Params::new(cfg(Semantics::StrictFloors, &[3000])).unwrap();
        let mut s = State::new(&p, 0);
        let mut n = 0;
        loop {
            let (d, next) = decide_pure(&p, &s, 0, &req(1));
            match (d, next) {
                (Decision::Admit(_), Some(next)) => {
                    s = next;
                    n += 1;
                }
                (Decision::Deny { .. }, None) => break,
                other => panic!("{other:?}"),
            }
        }
        assert!(n > 0);
    }
}
