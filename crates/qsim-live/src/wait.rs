//! `on_limit = "wait"`: hold an over-limit request until the limiter admits
//! it, instead of answering 429 — bounded by the consumer's `max_wait` and
//! by the request's own deadline (a header: the client's timeout).
//!
//! Every decision is the core's `decide` (through [`decide_once`], the same
//! call as for any request), and what follows from it (join, sleep until
//! when, refuse with which outcome) is the core's waiting component
//! (`qsim_core::limiter::wait`: `Waiter`, `predict`, the FIFO `Queues`),
//! the very rules `qsim whatif` replays; this driver only sleeps (tokio) and
//! wakes (a `Notify` per waiter). Nothing here re-implements a rule.
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
use qsim_core::limiter::admission::{Decision, Request};
use qsim_core::limiter::wait::{self, Bound, Next, Pred, Refusal, Waiter};
use qsim_core::time::{Nanos, NEVER};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// When `req` would be admitted behind the requests of its consumer queued
/// ahead of `ticket`: the core's [`wait::predict`] on a copy of the state in
/// force (unknown when the shared state is unreachable).
async fn predict(app: &Arc<App>, name: &str, req: Request, ticket: Option<u64>) -> Pred {
    let ahead = app.waits.ahead(name, ticket);
    let Some((g, s, now)) = snapshot(app).await else {
        return Pred::Unknown;
    };
    let Some(c) = g.names.iter().position(|n| n == name) else {
        return Pred::Unknown;
    };
    wait::predict(&g.params, s, now, c, &ahead, &req)
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

/// A request held in its consumer's queue: counted `abandoned` when
/// dropped while `left` (its client disconnected: hyper dropped the
/// handler's future).
struct Held<'a> {
    app: &'a App,
    gen: &'a Gen,
    consumer: usize,
    left: bool,
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if self.left {
            count(self.app, self.gen, self.consumer, "abandoned");
        }
    }
}

/// A duration in ns, capped (a bound far beyond any run).
fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(NEVER as u128 / 2) as Nanos
}

/// A denial as the core's decision.
fn denial(limit: qsim_core::limiter::admission::Limit, retry_at: Nanos) -> Decision {
    Decision::Deny { limit, retry_at }
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
    let w = Waiter::new(Bound::new(
        t0,
        nanos(max_wait),
        deadline.map(nanos),
        nanos(margin),
    ));
    let bound = w.bound.at;
    let name = gen.names[req.consumer].clone();
    let refuse = |r: Refusal, now: Nanos| {
        if let Some(o) = r.outcome {
            count(app, gen, req.consumer, o.name());
            tracing::debug!(id, consumer = %name, outcome = o.name(),
                hold_ms = w.bound.hold / 1_000_000,
                retry_in_ms = wait_ms(r.retry_at, now), "not held");
        }
        Outcome::Deny {
            limit: r.limit,
            retry_at: r.retry_at,
            now,
        }
    };
    if !app.waits.has(&name) {
        match decide_once(app, gen, req, arrived, id).await {
            Outcome::Deny {
                limit,
                retry_at,
                now,
            } => {
                if let Next::Refuse(r) = w.arrived(&denial(limit, retry_at)) {
                    return refuse(r, now);
                }
            }
            o => return o,
        }
    } else if let Next::Refuse(r) = w.predicted(predict(app, &name, req, None).await) {
        return refuse(r, app.now());
    }
    let ticket = app.waits.join(&name, req, &app.metrics.waiting);
    // counts the request `abandoned` if its client leaves while it is held
    // (the connection closed: this future dropped)
    let mut held = Held {
        app,
        gen,
        consumer: req.consumer,
        left: true,
    };
    let out = 'held: loop {
        if ticket.is_head() {
            match decide_once(app, gen, req, arrived, id).await {
                Outcome::Admit(s) => {
                    count(app, gen, req.consumer, wait::Outcome::Admitted.name());
                    let waited = arrived.elapsed();
                    app.metrics.wait_seconds.observe(waited.as_secs_f64());
                    tracing::info!(id, consumer = %name, waited_ms = waited.as_millis() as u64, "admitted after waiting");
                    break 'held Outcome::Admit(s);
                }
                Outcome::Deny {
                    limit,
                    retry_at,
                    now,
                } => {
                    let until = match w.decided(now, &denial(limit, retry_at)) {
                        Next::Sleep(until) => until,
                        Next::Refuse(r) => break 'held refuse(r, now),
                        Next::Admit | Next::Join => {
                            unreachable!("a denial neither admits nor joins")
                        }
                    };
                    tokio::select! {
                        _ = tokio::time::sleep_until(app.clock.instant_at(until)) => {}
                        _ = ticket.wake.notified() => {}
                    }
                }
                o @ Outcome::Unavailable(..) => {
                    count(app, gen, req.consumer, wait::Outcome::Unavailable.name());
                    break 'held o;
                }
            }
        } else {
            tokio::select! {
                _ = ticket.wake.notified() => {}
                _ = tokio::time::sleep_until(app.clock.instant_at(bound)) => {
                    if ticket.is_head() {
                        continue 'held; // one last decision
                    }
                    let now = app.now();
                    let p = predict(app, &name, req, Some(ticket.ticket)).await;
                    break 'held refuse(w.expired(p), now);
                }
            }
        }
    };
    held.left = false;
    out
}
