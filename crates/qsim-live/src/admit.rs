//! One admission decision by the core's `decide`, in-process or on the
//! state shared in Redis, and a copy of the state in force (for the waiting
//! queues' predictions).

use crate::app::{App, Gen, Local, Store};
use crate::body::Settle;
use crate::store::FailMode;
use crate::sync::lock;
use qsim_core::limiter::admission::{decide, Decision, Limit, Request as LimRequest, State};
use qsim_core::time::{Nanos, NEVER};
use std::sync::Arc;
use std::time::Instant;

/// The result of one admission decision.
// a boxed `Settle` would cost an allocation per admitted request
#[allow(clippy::large_enum_variant)]
pub enum Outcome {
    /// Admitted (or forwarded unlimited, fail open: a guard without grant).
    Admit(Settle),
    Deny {
        limit: Limit,
        retry_at: Nanos,
        now: Nanos,
    },
    /// The shared state is unreachable.
    Unavailable(FailMode, String),
}

/// A decision taken at `now` under `gen`: an admission's settlement guard
/// (made at once: it settles the grant whatever happens next), or the denial.
fn outcome(
    app: &Arc<App>,
    gen: &Arc<Gen>,
    d: Decision,
    now: Nanos,
    arrived: Instant,
    id: u64,
) -> Outcome {
    match d {
        Decision::Admit(g) => {
            let mut s = Settle::new(app.clone(), gen.clone(), Some(g), arrived, id);
            s.decided = now;
            Outcome::Admit(s)
        }
        Decision::Deny { limit, retry_at } => Outcome::Deny {
            limit,
            retry_at,
            now,
        },
    }
}

/// One decision by the core's `decide`, in-process or on the shared state.
/// `gen`/`req`: the request's generation and consumer index in it.
pub async fn decide_once(
    app: &Arc<App>,
    gen: &Arc<Gen>,
    req: LimRequest,
    arrived: Instant,
    id: u64,
) -> Outcome {
    match &app.store {
        Store::Local(m) => {
            let mut l = lock(m);
            let now = app.now();
            let Local { gen: cur, state } = &mut *l;
            let req = if cur.id == gen.id {
                req
            } else {
                // reloaded since the request arrived: its consumer by name
                let name = &gen.names[req.consumer];
                match cur.names.iter().position(|n| n == name) {
                    Some(c) => LimRequest { consumer: c, ..req },
                    None => {
                        return Outcome::Deny {
                            limit: Limit::Capacity,
                            retry_at: NEVER,
                            now,
                        }
                    }
                }
            };
            let d = decide(&cur.params, state, now, &req);
            let cur = cur.clone();
            drop(l);
            outcome(app, &cur, d, now, arrived, id)
        }
        Store::Redis(r) => {
            // in its own task: a client leaving must neither cancel a batch
            // being committed for other requests too, nor lose a grant (the
            // guard made in the task settles it when dropped)
            let (a, g) = (app.clone(), gen.clone());
            let task = tokio::spawn(async move {
                let Store::Redis(r) = &a.store else {
                    return Err("internal: not a shared state".to_string());
                };
                let (d, now) = r.decide(&g.params, &|| a.now(), &req).await?;
                Ok(outcome(&a, &g, d, now, arrived, id))
            });
            match task.await {
                Ok(Ok(o)) => o,
                Ok(Err(e)) => Outcome::Unavailable(r.fail, e),
                Err(e) => Outcome::Unavailable(r.fail, format!("decision task failed: {e}")),
            }
        }
    }
}

/// A copy of the state in force, its generation and the time it is read at
/// (`None`: the shared state is unreachable).
pub async fn snapshot(app: &Arc<App>) -> Option<(Arc<Gen>, State, Nanos)> {
    match &app.store {
        Store::Local(m) => {
            let l = lock(m);
            Some((l.gen.clone(), l.state.clone(), app.now()))
        }
        Store::Redis(r) => {
            let g = app.current();
            let now = app.now();
            r.snapshot(&g.params, now).await.ok().map(|s| (g, s, now))
        }
    }
}
