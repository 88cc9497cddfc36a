//! `on_limit = "wait"`: hold an over-limit request until the limiter admits
//! it, instead of answering 429 — bounded by the consumer's `max_wait` and
//! by the request's own deadline (a header: the client's timeout).
//!
//! Every decision is the core's `decide` (through [`decide_once`], the same
//! call as for any request); nothing here re-implements a rule.
//!
//! **Order.** Waiting requests of one consumer form a FIFO queue: a request
//! joins it on its first denial, or on arrival when requests of its consumer
//! are already waiting (so a newcomer never takes the capacity a waiter is
//! about to get), and only the head of the queue decides: it sleeps until
//! the limiter's exact retry time (or until a completion frees capacity
//! sooner), decides again, and on admission hands the head to the next one.
//! So a consumer's waiting requests are admitted in the order they joined,
//! none is overtaken by a later request of the same consumer, and none is
//! starved by it. Across consumers there is no queue: the limiter's
//! semantics (floors, pool) arbitrate between a waiter deciding at its retry
//! time and other consumers' requests, exactly as between two arrivals.
//!
//! **Prediction and deadlines.** A request that would have to wait gets a
//! predicted admission time: with nobody of its consumer waiting, the
//! limiter's own `retry_at`; behind waiters, the time the core's `decide`
//! gives it on a copy of the state after admitting each waiter ahead at its
//! own earliest time (a projection that assumes no completion and no other
//! consumer's admission in between). If that time is beyond
//! `min(deadline − margin, arrival + max_wait)` the request is answered 429
//! at once with that exact retry time (`retry-after-ms`), instead of being
//! held until the client gives up. A waiter whose time slips (other
//! consumers took the capacity) is answered 429 as soon as its next retry
//! time is beyond its bound, and a waiter still queued at its bound is
//! answered 429 then: none is held past its deadline. A `concurrent` denial
//! has no predictable time (it ends with a completion): such a request
//! waits, woken by completions, up to its bound.

use crate::admit::{decide_once, snapshot, Outcome};
use crate::app::{App, Gen};
use crate::metrics::WaitLabel;
use crate::respond::wait_ms;
use qsim_core::limiter::admission::{decide, Decision, Limit, Request};
use qsim_core::time::{Nanos, NEVER};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often a head denied by `concurrent` looks again without a wake-up
/// (completions on other replicas sharing the state do not wake it).
const CONCURRENT_POLL: Nanos = 100_000_000;

/// A predicted admission time.
enum Pred {
    /// At this time, the last denial being by this limit.
    At(Nanos, Limit),
    /// Never by the passage of time alone.
    Never(Limit),
    /// Not predictable (a concurrency slot; the state unreachable).
    Unknown,
}

/// When `req` would be admitted behind the requests of its consumer queued
/// ahead of `ticket`: the core's `decide` on a copy of the state, each
/// request ahead admitted at its own earliest time, then this one.
async fn predict(app: &Arc<App>, name: &str, req: Request, ticket: Option<u64>) -> Pred {
    let ahead = app.waits.ahead(name, ticket);
    let Some((g, mut s, now)) = snapshot(app).await else {
        return Pred::Unknown;
    };
    let Some(c) = g.names.iter().position(|n| n == name) else {
        return Pred::Unknown;
    };
    let mut t = now;
    let mut last = Limit::Capacity;
    for r in ahead.iter().chain(std::iter::once(&req)) {
        let r = Request { consumer: c, ..*r };
        let mut tries = 0;
        loop {
            match decide(&g.params, &mut s, t, &r) {
                Decision::Admit(_) => break,
                Decision::Deny {
                    limit: Limit::Concurrent,
                    ..
                } => return Pred::Unknown,
                Decision::Deny { limit, retry_at } => {
                    last = limit;
                    if retry_at == NEVER {
                        return Pred::Never(limit);
                    }
                    t = t.max(retry_at);
                    tries += 1;
                    if tries > 64 {
                        return Pred::Unknown;
                    }
                }
            }
        }
    }
    Pred::At(t, last)
}

fn count(app: &App, gen: &Gen, consumer: usize, outcome: &'static str) {
    app.metrics
        .waits
        .get_or_create(&WaitLabel {
            consumer: gen.labels[consumer].clone(),
            outcome,
        })
        .inc();
}

/// Admission of a request of a waiting consumer: admitted at once, after a
/// wait, or refused (429) at once / when its bound is reached.
pub async fn admit(
    app: &Arc<App>,
    gen: &Arc<Gen>,
    req: Request,
    arrived: Instant,
    id: u64,
    max_wait: Duration,
    deadline: Option<Duration>,
) -> Outcome {
    let t0 = app.now();
    let margin = gen.cfg.deadline_margin;
    let (hold, why) = match deadline {
        Some(d) if d.saturating_sub(margin) < max_wait => {
            (d.saturating_sub(margin), "refused_deadline")
        }
        _ => (max_wait, "refused_max_wait"),
    };
    let bound = t0.saturating_add(hold.as_nanos().min(NEVER as u128 / 2) as Nanos);
    let name = gen.names[req.consumer].clone();
    let refuse = |limit, retry_at, now, outcome| {
        count(app, gen, req.consumer, outcome);
        tracing::debug!(id, consumer = %name, outcome, hold_ms = hold.as_millis() as u64,
            retry_in_ms = wait_ms(retry_at, now), "not held");
        Outcome::Deny {
            limit,
            retry_at,
            now,
        }
    };
    if !app.waits.has(&name) {
        match decide_once(app, gen, req, arrived, id).await {
            Outcome::Deny {
                limit,
                retry_at,
                now,
            } if retry_at != NEVER => {
                if limit != Limit::Concurrent && retry_at > bound {
                    return refuse(limit, retry_at, now, why);
                }
            }
            o => return o,
        }
    } else {
        match predict(app, &name, req, None).await {
            Pred::At(t, limit) if t > bound => return refuse(limit, t, app.now(), why),
            Pred::Never(limit) => {
                return Outcome::Deny {
                    limit,
                    retry_at: NEVER,
                    now: app.now(),
                }
            }
            _ => {}
        }
    }
    let ticket = app.waits.join(&name, req, &app.metrics.waiting);
    loop {
        if ticket.is_head() {
            match decide_once(app, gen, req, arrived, id).await {
                Outcome::Admit(s) => {
                    count(app, gen, req.consumer, "admitted");
                    let waited = arrived.elapsed();
                    app.metrics.wait_seconds.observe(waited.as_secs_f64());
                    tracing::info!(id, consumer = %name, waited_ms = waited.as_millis() as u64, "admitted after waiting");
                    return Outcome::Admit(s);
                }
                Outcome::Deny {
                    limit,
                    retry_at,
                    now,
                } => {
                    if retry_at == NEVER || now >= bound {
                        return refuse(limit, retry_at, now, "expired");
                    }
                    let until = if limit == Limit::Concurrent {
                        bound.min(now.saturating_add(CONCURRENT_POLL))
                    } else if retry_at > bound {
                        return refuse(limit, retry_at, now, why);
                    } else {
                        retry_at
                    };
                    tokio::select! {
                        _ = tokio::time::sleep_until(app.clock.instant_at(until)) => {}
                        _ = ticket.wake.notified() => {}
                    }
                }
                o @ Outcome::Unavailable(..) => {
                    count(app, gen, req.consumer, "unavailable");
                    return o;
                }
            }
        } else {
            tokio::select! {
                _ = ticket.wake.notified() => {}
                _ = tokio::time::sleep_until(app.clock.instant_at(bound)) => {
                    if ticket.is_head() {
                        continue; // one last decision
                    }
                    let now = app.now();
                    let (limit, retry_at) = match predict(app, &name, req, Some(ticket.ticket)).await {
                        Pred::At(t, l) => (l, t),
                        Pred::Never(l) => (l, NEVER),
                        Pred::Unknown => (Limit::Concurrent, NEVER),
                    };
                    return refuse(limit, retry_at, now, "expired");
                }
            }
        }
    }
}
