//! A deterministic traffic driver for the admission limiter: per consumer,
//! Poisson arrivals, a greedy sender (asks again every tick until denied:
//! it always demands more than it gets), or silence; every admitted request
//! completes after a random service time (late settlement: streaming-like
//! completions long after admission) having produced a random number of
//! output tokens. Every decision and completion is reported to a checker.

use crate::Rng;
use qsim_core::limiter::admission::{Decision, Grant, Limiter, Request};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Demand {
    Silent,
    /// Poisson arrivals, requests per minute.
    Poisson(f64),
    /// Asks at every tick until denied.
    Greedy,
}

#[derive(Debug, Clone)]
pub struct Traffic {
    pub seed: u64,
    pub demand: Vec<Demand>,
    /// Greedy consumers' period (ns).
    pub tick: u64,
    /// Nothing happens at or after this time (ns).
    pub horizon: u64,
    /// Input tokens per request, inclusive range.
    pub input: (u64, u64),
    /// `max_tokens` per request, inclusive range.
    pub max_tokens: (u64, u64),
    /// Service time (admission to completion), inclusive range (ns).
    pub service: (u64, u64),
    /// Actual output as a fraction of `max_tokens`: uniform in `[0, this]`.
    pub output: f64,
    /// Hand the checker a copy of the limiter before each decision.
    pub keep_before: bool,
}

pub enum Event<'a> {
    Decided {
        now: u64,
        req: &'a Request,
        decision: &'a Decision,
        before: Option<&'a Limiter>,
        after: &'a Limiter,
    },
    Completed {
        now: u64,
        grant: &'a Grant,
        actual: u64,
        after: &'a Limiter,
    },
}

fn gap(rng: &mut Rng, per_minute: f64) -> u64 {
    let mean = 60e9 / per_minute;
    ((-(1.0 - rng.unit()).ln() * mean) as u64).max(1)
}

/// Run `traffic` through `lim`, reporting every event to `check`.
pub fn drive(
    lim: &mut Limiter,
    traffic: &Traffic,
    check: &mut dyn FnMut(Event) -> Result<(), String>,
) -> Result<(), String> {
    // one stream per consumer: a consumer's requests do not depend on the
    // others' traffic
    let n = traffic.demand.len();
    let mut rngs: Vec<Rng> = (0..n as u64)
        .map(|c| Rng::new(traffic.seed ^ c.wrapping_mul(0xA076_1D64_78BD_642F)))
        .collect();
    let mut arrival: Vec<u64> = traffic
        .demand
        .iter()
        .zip(rngs.iter_mut())
        .map(|(d, rng)| match d {
            Demand::Poisson(r) if *r > 0.0 => gap(rng, *r),
            _ => u64::MAX,
        })
        .collect();
    let greedy = traffic.demand.contains(&Demand::Greedy);
    let mut tick = if greedy { 0 } else { u64::MAX };
    let mut done: BinaryHeap<Reverse<(u64, u64)>> = BinaryHeap::new();
    let mut flight: BTreeMap<u64, (Grant, u64)> = BTreeMap::new();
    let mut seq = 0u64;
    let mut ask = |lim: &mut Limiter,
                   rng: &mut Rng,
                   now: u64,
                   c: usize,
                   done: &mut BinaryHeap<Reverse<(u64, u64)>>,
                   flight: &mut BTreeMap<u64, (Grant, u64)>,
                   check: &mut dyn FnMut(Event) -> Result<(), String>|
     -> Result<bool, String> {
        let req = Request {
            consumer: c,
            input_tokens: rng.between(traffic.input.0, traffic.input.1),
            max_tokens: rng.between(traffic.max_tokens.0, traffic.max_tokens.1),
        };
        let before = traffic.keep_before.then(|| lim.clone());
        let d = lim.decide(now, &req);
        check(Event::Decided {
            now,
            req: &req,
            decision: &d,
            before: before.as_ref(),
            after: lim,
        })?;
        if let Decision::Admit(g) = d {
            let at = now + rng.between(traffic.service.0, traffic.service.1);
            let actual = (rng.unit() * traffic.output * g.max_tokens as f64) as u64;
            done.push(Reverse((at, seq)));
            flight.insert(seq, (g, actual));
            seq += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    };
    loop {
        let next_done = done.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
        let next_arrival = arrival.iter().copied().min().unwrap_or(u64::MAX);
        let now = next_done.min(next_arrival).min(tick);
        if now >= traffic.horizon {
            return Ok(());
        }
        if next_done == now {
            let Reverse((_, k)) = done.pop().unwrap();
            let (g, actual) = flight.remove(&k).unwrap();
            lim.complete(now, &g, actual);
            check(Event::Completed {
                now,
                grant: &g,
                actual,
                after: lim,
            })?;
            continue;
        }
        if tick == now {
            for (c, rng) in rngs.iter_mut().enumerate() {
                if traffic.demand[c] == Demand::Greedy {
                    let mut k = 0;
                    while ask(lim, rng, now, c, &mut done, &mut flight, check)? {
                        k += 1;
                        if k > 100_000 {
                            return Err(format!("consumer {c} admitted without end at {now}"));
                        }
                    }
                }
            }
            tick += traffic.tick;
            continue;
        }
        let c = arrival.iter().position(|&t| t == now).unwrap();
        if let Demand::Poisson(r) = traffic.demand[c] {
            arrival[c] = now + gap(&mut rngs[c], r);
        }
        ask(lim, &mut rngs[c], now, c, &mut done, &mut flight, check)?;
    }
}
