//! Several hosted upstreams behind one route: the simulation's side of the
//! gateway (`qsim_core::gateway`, the code `qsim proxy` drives too).
//!
//! [`Upstreams`] holds the gateway, one [`HostedEndpoint`] per upstream
//! (its profile's limits, 429 shape and latencies; the endpoint's own
//! random stream), the upstreams' outages (`down = [[from_s, to_s]]`) and
//! the gateway's draw stream. A request goes through [`Upstreams::start`]
//! and, each time an attempt's reply comes back, [`Upstreams::reply`]:
//! the gateway says whether to send it to another upstream (the driver
//! schedules the new attempt's reply) or what the client sees.
//!
//! **An attempt, simulated.** An upstream in an outage refuses the
//! connection at once (`Refused`, status 0). Otherwise its endpoint is
//! called: an admitted request whose first token would come after the
//! attempt's deadline is a `Timeout` at the deadline (the endpoint's
//! tokens are settled then: the upstream stops when the client hangs
//! up); else a success when its answer ends (the gateway hears of the
//! success and its end at once); a 429 or a 5xx when the endpoint
//! delivers it. Probes (an upstream with `probe_interval_s`) are answered
//! by the outages alone: healthy when not down. The driver runs due
//! probes ([`Upstreams::probes`]) before each event, at their own times.
//!
//! **What the client sees.** The answering attempt's reply (a refused
//! connection is a 502, a timeout a 504, as the proxy answers); a gateway
//! refusal is a 429 (`limited`: the upstreams are at their own limits or
//! cooling down after 429s) or a 503 (`unavailable`), with a retry hint
//! `retry_at − now` when the gateway knows one. Upstreams are chosen from
//! the route for every model (`"*"`), else the first route.

use super::{HostedEndpoint, Reply};
use crate::engine::rng::{component, stream};
use crate::engine::Rng;
use crate::limiter::rates::Cost;
use crate::plan::routes::Routes;
use crate::time::{Nanos, NEVER};
use qsim_core::gateway::{Config, Gateway, Refused, Reply as GwReply, Step, Ticket, ANY_MODEL};
use qsim_core::route::Below;
use rand::Rng as _;

/// An attempt's reply, when it arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attempt {
    pub at: Nanos,
    pub upstream: usize,
    pub reply: AttemptReply,
    /// A 429: which of the upstream's limits (profile order).
    pub limit: Option<usize>,
}

/// What one upstream answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptReply {
    /// 200 with the answer's output tokens (at the answer's end).
    Ok { output: u64 },
    /// An HTTP error status (429 with its hint, 5xx).
    Status { status: u16, hint: Option<Nanos> },
    /// No connection.
    Refused,
    /// No first token by the deadline.
    Timeout,
}

impl AttemptReply {
    /// The reply as the gateway takes it.
    pub fn for_gateway(self) -> GwReply {
        match self {
            AttemptReply::Ok { .. } => GwReply::Ok,
            AttemptReply::Status { status, hint } => GwReply::from_status(status, hint),
            AttemptReply::Refused => GwReply::Refused,
            AttemptReply::Timeout => GwReply::Timeout,
        }
    }
}

/// What the driver does after the gateway heard a reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// The request was sent to another upstream: schedule this reply.
    Again(Attempt),
    /// The client's reply.
    Answer(ClientReply),
}

/// What the client sees: a status (0: no connection), the retry hint
/// (errors) and the output tokens (200).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientReply {
    pub status: u16,
    pub hint: Option<Nanos>,
    pub output: u64,
    /// The answering upstream (None: the gateway refused).
    pub upstream: Option<usize>,
}

/// Per upstream: what it served (for costs and reports).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Requests it answered 200 (the client's answer).
    pub ok: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// The gateway and its simulated upstreams.
pub struct Upstreams {
    pub gw: Gateway,
    eps: Vec<HostedEndpoint>,
    down: Vec<Vec<(Nanos, Nanos)>>,
    rng: Rng,
    route: usize,
    pub served: Vec<Served>,
    /// Requests the gateway refused, by why (limited, unavailable).
    pub refused: [u64; 2],
}

/// The route a simulation uses: `"*"`, else the first.
pub fn sim_route(cfg: &Config) -> usize {
    cfg.routes
        .iter()
        .position(|r| r.model == ANY_MODEL)
        .unwrap_or(0)
}

impl Upstreams {
    /// `routes` (simulated: every upstream has a profile) at time `t0`,
    /// random streams of `(seed, scope)`.
    pub fn new(routes: &Routes, t0: Nanos, seed: u64, scope: u64) -> Upstreams {
        let gw =
            Gateway::new(routes.core.clone(), t0).expect("routes are checked when they are loaded");
        let eps = routes
            .extra
            .iter()
            .enumerate()
            .map(|(i, x)| {
                let p = x
                    .profile
                    .clone()
                    .expect("a simulated upstream has a profile");
                HostedEndpoint::new(p, t0, endpoint_stream(seed, scope, i))
            })
            .collect();
        let n = routes.extra.len();
        Upstreams {
            route: sim_route(&routes.core),
            gw,
            eps,
            down: routes.extra.iter().map(|x| x.down.clone()).collect(),
            rng: stream(seed, scope, component::GATEWAY),
            served: vec![Served::default(); n],
            refused: [0; 2],
        }
    }

    /// Each experiment of a suite draws from its own streams while the
    /// upstreams' state carries over.
    pub fn reseed(&mut self, seed: u64, scope: u64) {
        for (i, e) in self.eps.iter_mut().enumerate() {
            e.reseed(endpoint_stream(seed, scope, i));
        }
        self.rng = stream(seed, scope, component::GATEWAY);
    }

    pub fn endpoint(&self, u: usize) -> &HostedEndpoint {
        &self.eps[u]
    }

    fn is_down(&self, u: usize, t: Nanos) -> bool {
        self.down[u].iter().any(|&(a, b)| a <= t && t < b)
    }

    /// Answer every probe due up to `until`, each at its own time.
    pub fn probes(&mut self, until: Nanos) {
        while let Some(t) = self.gw.poll_timeout().filter(|&t| t <= until) {
            while let Some(u) = self.gw.due_probe(t) {
                let ok = !self.is_down(u, t);
                self.gw.on_probe(t, u, ok);
            }
        }
    }

    fn attempt(
        &mut self,
        now: Nanos,
        u: usize,
        deadline: Nanos,
        cost: Cost,
        natural: u64,
    ) -> Attempt {
        if self.is_down(u, now) {
            return Attempt {
                at: now,
                upstream: u,
                reply: AttemptReply::Refused,
                limit: None,
            };
        }
        hosted_attempt(&mut self.eps[u], now, u, deadline, cost, natural)
    }

    fn step(&mut self, now: Nanos, step: Step, cost: Cost, natural: u64) -> Next {
        match step {
            Step::Send { upstream, deadline } => {
                Next::Again(self.attempt(now, upstream, deadline, cost, natural))
            }
            Step::Refuse { why, retry_at } => {
                self.refused[(why == Refused::Unavailable) as usize] += 1;
                Next::Answer(ClientReply {
                    status: match why {
                        Refused::Limited => 429,
                        Refused::Unavailable => 503,
                    },
                    hint: retry_at
                        .filter(|&t| t != NEVER)
                        .map(|t| t.saturating_sub(now)),
                    output: 0,
                    upstream: None,
                })
            }
            Step::Answer => unreachable!("a request's first step is a send or a refusal"),
        }
    }

    /// A request of `cost` (natural output `natural`) arrives at `now`:
    /// its ticket and its first attempt (or the gateway's refusal).
    pub fn start(&mut self, now: Nanos, cost: Cost, natural: u64) -> (Ticket, Next) {
        let mut rng = std::mem::replace(&mut self.rng, stream(0, 0, 0));
        let r = self.start_with(now, cost, natural, &mut |n: u64| rng.gen_range(0..n));
        self.rng = rng;
        r
    }

    /// [`start`](Self::start) with the driver's own draws.
    pub fn start_with<B: Below + ?Sized>(
        &mut self,
        now: Nanos,
        cost: Cost,
        natural: u64,
        below: &mut B,
    ) -> (Ticket, Next) {
        let (t, step) = self.gw.start(now, self.route, cost, below);
        (t, self.step(now, step, cost, natural))
    }

    /// Attempt `a` of the request `t` came back (at `a.at`).
    pub fn reply(&mut self, t: &mut Ticket, a: Attempt, cost: Cost, natural: u64) -> Next {
        let mut rng = std::mem::replace(&mut self.rng, stream(0, 0, 0));
        let r = self.reply_with(t, a, cost, natural, &mut |n: u64| rng.gen_range(0..n));
        self.rng = rng;
        r
    }

    /// [`reply`](Self::reply) with the driver's own draws.
    pub fn reply_with<B: Below + ?Sized>(
        &mut self,
        t: &mut Ticket,
        a: Attempt,
        cost: Cost,
        natural: u64,
        below: &mut B,
    ) -> Next {
        let now = a.at;
        let u = a.upstream;
        let gw_reply = a.reply.for_gateway();
        let step = self.gw.on_reply(now, t, gw_reply, below);
        match step {
            Step::Answer => {
                let (status, hint, output) = match a.reply {
                    AttemptReply::Ok { output } => {
                        self.eps[u].complete(now, cost, output);
                        self.gw.finish(now, t, output);
                        let s = &mut self.served[u];
                        s.ok += 1;
                        s.input_tokens += cost.input_tokens;
                        s.output_tokens += output;
                        (200, None, output)
                    }
                    AttemptReply::Status { status, hint } => (status, hint, 0),
                    AttemptReply::Refused => (502, None, 0),
                    AttemptReply::Timeout => (504, None, 0),
                };
                Next::Answer(ClientReply {
                    status,
                    hint,
                    output,
                    upstream: Some(u),
                })
            }
            s => self.step(now, s, cost, natural),
        }
    }
}

/// One attempt at upstream `u` (a hosted endpoint) at `now` with the
/// attempt's `deadline`: see the module's "An attempt, simulated".
pub fn hosted_attempt(
    ep: &mut HostedEndpoint,
    now: Nanos,
    u: usize,
    deadline: Nanos,
    cost: Cost,
    natural: u64,
) -> Attempt {
    let mut limit = None;
    let (at, reply) = match ep.call(now, cost, natural) {
        Reply::Ok {
            done_at,
            output_tokens,
            ttft,
        } => {
            if now.saturating_add(ttft) > deadline {
                // the client hangs up: the upstream stops, nothing produced
                ep.complete(deadline, cost, 0);
                (deadline, AttemptReply::Timeout)
            } else {
                (
                    done_at,
                    AttemptReply::Ok {
                        output: output_tokens,
                    },
                )
            }
        }
        Reply::RateLimited { at, hint, limit: l } => {
            limit = Some(l);
            (at, AttemptReply::Status { status: 429, hint })
        }
        Reply::ServerError { at } => (
            at,
            AttemptReply::Status {
                status: 500,
                hint: None,
            },
        ),
    };
    Attempt {
        at,
        upstream: u,
        reply,
        limit,
    }
}

fn endpoint_stream(seed: u64, scope: u64, upstream: usize) -> Rng {
    // upstream 0 draws from the single endpoint's stream: a route of one
    // upstream is the endpoint alone
    stream(seed, scope + ((upstream as u64) << 24), component::ENDPOINT)
}
