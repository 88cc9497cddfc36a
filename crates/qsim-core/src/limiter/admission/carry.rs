//! Carrying a limiter's state over to new parameters (a live policy reload).
//!
//! A bucket of the new parameters takes over the bucket of the same *role*
//! in the old ones — the unreserved pool, the deployment bucket of the
//! credit holders, a consumer's floor, a consumer's own `rpm` /
//! `tokens_per_hour` — matched by consumer name, not index. It keeps the
//! **deficit** of the old bucket in tokens (what was taken and not yet
//! refilled), so what was spent recently still counts: a bucket 30 tokens
//! short stays 30 tokens short of its new depth (never above full; a debt
//! stays a debt). A bucket with no counterpart (a new consumer, a new
//! limit, another semantics' layout) starts full, as a fresh limiter's
//! does. Concurrency leases follow their consumer by name (all of them,
//! even above a lowered limit: the slots are still occupied until those
//! requests complete); the litellm-priority window is kept when both sides
//! use it. Time is the old state's effective time at `now`.
//!
//! [`translate_grant`] maps a grant made under the old parameters to the
//! new ones (consumer and borrowed floor by name), so a request admitted
//! before the reload completes against the new state: it frees its lease
//! and gets its refund into the bucket of the same role.

use super::config::Semantics;
use super::decision::{Grant, Limit, Source};
use super::params::Params;
use super::state::State;
use crate::time::Nanos;

/// What a bucket is for, independent of its index.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    Pool,
    Shared,
    Floor(String),
    Own(String, Limit),
}

fn roles(p: &Params) -> Vec<Option<Role>> {
    let mut r = vec![None; p.buckets.len()];
    if let Some(i) = p.pool {
        r[i] = Some(Role::Pool);
    }
    if let Some(i) = p.shared {
        r[i] = Some(Role::Shared);
    }
    for (c, cs) in p.cfg.consumers.iter().enumerate() {
        if let Some(i) = p.floor[c] {
            r[i] = Some(Role::Floor(cs.name.clone()));
        }
        for o in &p.own[c] {
            r[o.slot] = Some(Role::Own(cs.name.clone(), o.kind));
        }
    }
    r
}

fn consumer_index(p: &Params, name: &str) -> Option<usize> {
    p.cfg.consumers.iter().position(|c| c.name == name)
}

/// The state for `new_p`, carried over from `old` (a state of `old_p`) at
/// `now` (see the module docs for the rule).
pub fn carry_over(old_p: &Params, old: &State, new_p: &Params, now: Nanos) -> State {
    let t = old.effective(now);
    let mut cur = old.clone();
    cur.advance(old_p, t);
    let old_roles = roles(old_p);
    let mut next = State::new(new_p, t);
    for (i, role) in roles(new_p).into_iter().enumerate() {
        let Some(role) = role else { continue };
        let Some(j) = old_roles.iter().position(|r| r.as_ref() == Some(&role)) else {
            continue;
        };
        let (ob, nb) = (&old_p.buckets[j], &new_p.buckets[i]);
        // deficit in token·ns of the old window → of the new window
        let deficit = ob.full_level() - cur.levels[j];
        let scaled = deficit * nb.window() as i128 / ob.window() as i128;
        next.levels[i] = (nb.full_level() - scaled).min(nb.full_level());
    }
    for (c, cs) in new_p.cfg.consumers.iter().enumerate() {
        let Some((ni, _)) = new_p.slots[c] else {
            continue;
        };
        if let Some((oi, _)) = consumer_index(old_p, &cs.name).and_then(|oc| old_p.slots[oc]) {
            next.leases[ni] = cur.leases[oi].iter().copied().filter(|&e| e > t).collect();
        }
    }
    if old_p.cfg.semantics == Semantics::LitellmPriority
        && new_p.cfg.semantics == Semantics::LitellmPriority
    {
        next.window = cur.window;
    }
    next
}

/// A grant made under `old_p`, as the new parameters see it: `None` when
/// its consumer is gone (its reservation is then never refunded and its
/// lease is gone with the consumer: conservative).
pub fn translate_grant(old_p: &Params, new_p: &Params, g: &Grant) -> Option<Grant> {
    let name = &old_p.cfg.consumers.get(g.consumer)?.name;
    let consumer = consumer_index(new_p, name)?;
    let source = match g.source {
        Source::Borrowed(j) => {
            let lender = &old_p.cfg.consumers.get(j)?.name;
            match consumer_index(new_p, lender) {
                Some(k) => Source::Borrowed(k),
                // the lender is gone: the refund goes to the pool, if any
                None => Source::Pool,
            }
        }
        s => s,
    };
    Some(Grant {
        consumer,
        source,
        ..*g
    })
}

#[cfg(test)]
mod tests {
    use super::super::{complete, decide, ConsumerPolicy, ConsumerSpec, LimiterConfig, Request};
    use super::*;
    use crate::time::NS_PER_SEC;

    fn cfg(capacity: u64, names: &[(&str, u32, Option<u32>)]) -> LimiterConfig {
        LimiterConfig {
            capacity,
            unit: super::super::Unit::Rpm,
            threshold: 1.0,
            burst: Some(0),
            semantics: Semantics::LitellmPriority,
            accounting: crate::limiter::rates::OutputAccounting::ReserveRefund,
            consumers: names
                .iter()
                .map(|&(n, bp, conc)| ConsumerSpec {
                    name: n.into(),
                    reserved_bp: bp,
                    policy: ConsumerPolicy {
                        concurrent: conc,
                        ..Default::default()
                    },
                })
                .collect(),
        }
    }

    #[test]
    fn an_unchanged_policy_carries_the_state_exactly() {
        let p = Params::new(cfg(600, &[("a", 5000, Some(2)), ("b", 0, None)])).unwrap();
        let mut s = State::new(&p, 0);
        let r = Request {
            consumer: 0,
            input_tokens: 1,
            max_tokens: 1,
        };
        let g = decide(&p, &mut s, 0, &r);
        assert!(g.is_admit());
        let c = carry_over(&p, &s, &p, 0);
        assert_eq!(c, s);
    }

    #[test]
    fn deficits_follow_roles_by_name_and_grants_complete_on_the_new_state() {
        // 60/min, a 50 % floor for "a": floors of depth ≥ 1 s of their rate
        let old = Params::new(cfg(60, &[("a", 5000, Some(1)), ("b", 0, None)])).unwrap();
        let mut s = State::new(&old, 0);
        let ra = Request {
            consumer: 0,
            input_tokens: 1,
            max_tokens: 1,
        };
        let Decision::Admit(g) = decide(&old, &mut s, 0, &ra) else {
            panic!("admitted")
        };
        // the new policy lists the consumers the other way round
        let new = Params::new(cfg(60, &[("b", 0, None), ("a", 5000, Some(1))])).unwrap();
        let c = carry_over(&old, &s, &new, 0);
        // a's slot is still taken, and its floor still short of the token
        let ra2 = Request { consumer: 1, ..ra };
        let mut c2 = c.clone();
        assert!(matches!(
            decide(&new, &mut c2, 0, &ra2),
            Decision::Deny {
                limit: Limit::Concurrent,
                ..
            }
        ));
        let g2 = translate_grant(&old, &new, &g).unwrap();
        assert_eq!(g2.consumer, 1);
        let mut c3 = c.clone();
        complete(&new, &mut c3, NS_PER_SEC, &g2, 1);
        assert!(decide(&new, &mut c3, NS_PER_SEC, &ra2).is_admit());
        // a consumer that is gone: no translation
        let only_b = Params::new(cfg(60, &[("b", 0, None)])).unwrap();
        assert!(translate_grant(&old, &only_b, &g).is_none());
        let c4 = carry_over(&old, &s, &only_b, 0);
        assert!(c4.check(&only_b).is_ok());
    }

    use super::super::Decision;
}
