//! An options file's open-loop workload (`[workload]`: arrivals at a rate
//! that may follow a daily cycle, each request a caller with its retry
//! policy) against a route of upstreams — one for the pure options, two or
//! more for the hybrids (provisioned units with pay-per-token spillover,
//! own replicas with hosted overflow). The gateway that chooses among
//! them is `qsim_core::gateway`, the code `qsim proxy` runs.
//!
//! **Upstreams.** A hosted one is a [`HostedEndpoint`] (its profile's
//! limits, provisioned units, 429s and latencies; an attempt as
//! [`hosted_attempt`] simulates it). A replicas one is a
//! [`Cluster`] of server replicas (fixed or autoscaled): a request sent
//! there is submitted to the cluster and answered when it leaves (no
//! timeout; a request the server can never run is a 400); its
//! `max_in_flight` is the route's spill threshold.
//!
//! **Requests.** Arrivals come from the workload's process (its rate the
//! peak, shaped by `load_shape`), lengths from its distributions (output
//! capped at `max_tokens`); each request is a core `Call` with the
//! workload's retry policy, its every attempt a gateway request. A request
//! that ends without a 200 has failed. E2E is from arrival to the final
//! answer (retries included); TTFT is recorded for answers from replicas
//! only (the hosted model has no first-token time per answer), so an
//! option with a hosted upstream reports none.
//!
//! **Costs** over the workload's duration (or until the last answer, if
//! later): pay-per-token, the tokens of the requests each upstream
//! answered × its prices; provisioned, units × hours × the unit-hour
//! price, used or not; replicas, the replica-hours holding a GPU × the
//! replica-hour price.

use crate::client::{Call, CallerPolicy, Next, PoolShared, Reply as CallReply, Send as CallSend};
use crate::engine::rng::{component, draws, stream};
use crate::engine::{DurationHist, EventQueue, Rng, Timed};
use crate::hosted::routed::{hosted_attempt, AttemptReply};
use crate::hosted::{HostedEndpoint, HostedProfile};
use crate::limiter::rates::Cost;
use crate::server::{Cluster, Request, RouterKind, ServerProfile};
use crate::time::{to_secs, Nanos, NEVER};
use crate::work::{Tally, UNITS_PER_REQUEST};
use crate::workload::{ArrivalProcess, Lengths, OpenLoop};
use qsim_core::autoscale::Params as AutoscaleParams;
use qsim_core::gateway::{Config, Gateway, Refused, Step, Ticket};
use rand::Rng as _;
use std::sync::Arc;

/// The open-loop workload.
#[derive(Debug, Clone)]
pub struct Workload {
    /// Requests per minute at factor 1 (the peak of a daily cycle).
    pub rpm: f64,
    pub duration: Nanos,
    pub process: ArrivalProcess,
    pub lengths: Lengths,
    pub max_tokens: u64,
    pub caller: CallerPolicy,
    pub shared: PoolShared,
}

/// One upstream of an option's route.
#[derive(Debug, Clone)]
pub enum Up {
    Hosted(Arc<HostedProfile>),
    Replicas {
        profile: Arc<ServerProfile>,
        replicas: u32,
        router: RouterKind,
        autoscale: Option<AutoscaleParams>,
    },
}

impl Up {
    /// "pay-per-token", "provisioned 15 units", "2 replicas", "autoscaled 1-4".
    pub fn describe(&self) -> String {
        match self {
            Up::Hosted(p) => match p.provisioned {
                Some(pr) if pr.units == 1 => "provisioned 1 unit".into(),
                Some(pr) => format!("provisioned {} units", pr.units),
                None => "pay-per-token".into(),
            },
            Up::Replicas {
                replicas: 1,
                autoscale: None,
                ..
            } => "1 replica".into(),
            Up::Replicas {
                replicas,
                autoscale: None,
                ..
            } => format!("{replicas} replicas"),
            Up::Replicas {
                autoscale: Some(a), ..
            } => format!("autoscaled {}-{}", a.min, a.max),
        }
    }
}

/// A route of upstreams (`core.upstreams[i]` is `ups[i]`).
#[derive(Debug, Clone)]
pub struct RouteSpec {
    pub ups: Vec<Up>,
    pub core: Config,
}

/// One upstream's share of a run.
#[derive(Debug, Clone, Default)]
pub struct UpRun {
    pub name: String,
    /// Attempts sent, answered 200 (the client's answer), 429s, failures.
    pub sent: u64,
    pub ok: u64,
    pub http_429: u64,
    pub failures: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Its cost (None: no price).
    pub cost: Option<f64>,
}

/// What one run measured.
#[derive(Debug, Clone)]
pub struct OpenRun {
    /// The workload's duration, or the last answer if later.
    pub elapsed: Nanos,
    pub requests: u64,
    pub ok: u64,
    pub failed: u64,
    /// 429s from upstreams, and the gateway's refusals.
    pub http_429: u64,
    pub refused: u64,
    pub e2e: DurationHist,
    /// Answers from replicas only.
    pub ttft: DurationHist,
    pub ups: Vec<UpRun>,
    /// The sum of the upstreams' costs (None if one has no price).
    pub cost: Option<f64>,
    /// The run stopped at the work budget.
    pub stopped: bool,
}

impl OpenRun {
    /// Requests answered by upstreams after the first (the spill).
    pub fn spilled(&self) -> u64 {
        self.ups.iter().skip(1).map(|u| u.ok).sum()
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    /// A request's caller sends (its first attempt, or a retry).
    Send(u32),
    /// An attempt at a hosted upstream comes back.
    Reply {
        slot: u32,
        up: u16,
        status: u16,
        val: u64,
    },
    /// The gateway refused: the caller's reply at once.
    Refusal { slot: u32, status: u16, hint: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Req {
    input: u64,
    natural: u64,
    call: Call,
    ticket: Option<Ticket>,
    arrived: Nanos,
    /// The generation of the slot (a cluster's completion names it).
    gen: u32,
}

/// The replicas upstreams as one timed component.
struct Clusters(Vec<(usize, Cluster)>);

impl Timed for Clusters {
    fn poll_timeout(&self) -> Option<Nanos> {
        self.0.iter().filter_map(|(_, c)| c.poll_timeout()).min()
    }
    fn handle_timeout(&mut self, now: Nanos) {
        for (_, c) in &mut self.0 {
            if c.poll_timeout().is_some_and(|t| t <= now) {
                c.handle_timeout(now);
            }
        }
    }
}

const REFUSED: u16 = 1;
const TIMEOUT: u16 = 2;

/// Run the workload against `route` with `seed`; `scope` separates the
/// random streams of the replicas (as `qsim options` runs each option
/// with its index).
pub fn run(w: &Workload, route: &RouteSpec, seed: u64, scope: u64) -> OpenRun {
    let mut gw = Gateway::new(route.core.clone(), 0).expect("checked when loaded");
    let groute = crate::hosted::routed::sim_route(&route.core);
    let mut eps: Vec<Option<HostedEndpoint>> = Vec::new();
    let mut clusters = Clusters(Vec::new());
    for (i, u) in route.ups.iter().enumerate() {
        match u {
            Up::Hosted(p) => eps.push(Some(HostedEndpoint::new(
                p.clone(),
                0,
                stream(seed, (i as u64) << 24, component::ENDPOINT),
            ))),
            Up::Replicas {
                profile,
                replicas,
                router,
                autoscale,
            } => {
                eps.push(None);
                let mut c = Cluster::new(
                    profile.clone(),
                    *replicas,
                    *router,
                    seed.wrapping_add((scope << 32) | ((i as u64) << 16)),
                );
                if let Some(a) = autoscale {
                    c = c.with_autoscaler(a.clone());
                }
                clusters.0.push((i, c));
            }
        }
    }
    let mut arrivals = OpenLoop::new(
        w.process.clone(),
        w.lengths.clone(),
        seed,
        0,
        0,
        w.duration,
        u64::MAX,
    );
    let mut client_rng = stream(seed, 0, component::CLIENT);
    let mut gw_rng = stream(seed, 0, component::GATEWAY);
    let mut shared = w.shared.clone();
    let mut q: EventQueue<Ev> = EventQueue::starting_at(0);
    let mut reqs: Vec<Option<Req>> = Vec::new();
    let mut gens: Vec<u32> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    let mut res = OpenRun {
        elapsed: w.duration,
        requests: 0,
        ok: 0,
        failed: 0,
        http_429: 0,
        refused: 0,
        e2e: DurationHist::new(),
        ttft: DurationHist::new(),
        ups: route
            .core
            .upstreams
            .iter()
            .map(|u| UpRun {
                name: u.name.clone(),
                ..UpRun::default()
            })
            .collect(),
        cost: None,
        stopped: false,
    };
    let mut tally = Tally::new();
    let mut attempts = 0u64;
    let work = |c: &Clusters, attempts: u64| {
        UNITS_PER_REQUEST * attempts + c.0.iter().map(|(_, c)| c.iterations()).sum::<u64>()
    };
    let cost_of = |r: &Req| Cost {
        input_tokens: r.input,
        max_tokens: w.max_tokens,
    };

    // send the attempt the gateway chose (or schedule its refusal)
    #[allow(clippy::too_many_arguments)]
    fn act(
        step: Step,
        now: Nanos,
        slot: u32,
        r: &Req,
        cost: Cost,
        max_tokens: u64,
        eps: &mut [Option<HostedEndpoint>],
        clusters: &mut Clusters,
        q: &mut EventQueue<Ev>,
        res: &mut OpenRun,
        attempts: &mut u64,
    ) {
        match step {
            Step::Send { upstream, deadline } => {
                *attempts += 1;
                res.ups[upstream].sent += 1;
                match &mut eps[upstream] {
                    Some(ep) => {
                        let a = hosted_attempt(ep, now, upstream, deadline, cost, r.natural);
                        let (status, val) = match a.reply {
                            AttemptReply::Ok { output } => (200, output),
                            AttemptReply::Status { status, hint } => {
                                (status, hint.unwrap_or(NEVER))
                            }
                            AttemptReply::Refused => (REFUSED, 0),
                            AttemptReply::Timeout => (TIMEOUT, 0),
                        };
                        if status == 429 {
                            res.http_429 += 1;
                        }
                        q.schedule(
                            a.at,
                            Ev::Reply {
                                slot,
                                up: upstream as u16,
                                status,
                                val,
                            },
                        );
                    }
                    None => {
                        let c = clusters
                            .0
                            .iter_mut()
                            .find(|(i, _)| *i == upstream)
                            .map(|(_, c)| c)
                            .expect("a replicas upstream has a cluster");
                        c.submit(
                            now,
                            Request {
                                id: (slot as u64) | ((r.gen as u64) << 32),
                                input_tokens: r.input.min(u32::MAX as u64) as u32,
                                output_tokens: r.natural.min(max_tokens).min(u32::MAX as u64)
                                    as u32,
                            },
                        );
                    }
                }
            }
            Step::Refuse { why, retry_at } => {
                res.refused += 1;
                let status = match why {
                    Refused::Limited => 429,
                    Refused::Unavailable => 503,
                };
                let hint = retry_at
                    .filter(|&t| t != NEVER)
                    .map_or(NEVER, |t| t.saturating_sub(now));
                q.schedule(now, Ev::Refusal { slot, status, hint });
            }
            Step::Answer => unreachable!("handled by the caller"),
        }
    }

    loop {
        if !tally.at(work(&clusters, attempts)) {
            res.stopped = true;
            break;
        }
        // the next arrival, unless an event or a cluster deadline comes first
        let next_event = q.next_time(&clusters);
        if arrivals
            .peek()
            .is_some_and(|t| next_event.is_none_or(|e| t < e))
        {
            let (t, input, output) = arrivals.pop().expect("peeked");
            let slot = free.pop().unwrap_or_else(|| {
                reqs.push(None);
                gens.push(0);
                (reqs.len() - 1) as u32
            });
            gens[slot as usize] += 1;
            reqs[slot as usize] = Some(Req {
                input: input as u64,
                natural: output as u64,
                call: Call::start(t),
                ticket: None,
                arrived: t,
                gen: gens[slot as usize],
            });
            res.requests += 1;
            q.schedule(t, Ev::Send(slot));
            continue;
        }
        let Some((now, ev)) = q.step(&mut clusters) else {
            break;
        };
        // replies from the replicas (in order of leaving)
        let mut done: Vec<(u32, u32, AttemptReply, Nanos)> = Vec::new();
        for (_, c) in &mut clusters.0 {
            while let Some(x) = c.poll_completion() {
                let slot = x.id as u32;
                let gen = (x.id >> 32) as u32;
                let reply = if x.rejected {
                    AttemptReply::Status {
                        status: 400,
                        hint: None,
                    }
                } else {
                    AttemptReply::Ok {
                        output: x.output_tokens as u64,
                    }
                };
                done.push((slot, gen, reply, x.first_token));
            }
        }
        let mut replies: Vec<(u32, usize, AttemptReply, Option<Nanos>)> = done
            .into_iter()
            .filter(|(slot, gen, ..)| {
                reqs.get(*slot as usize)
                    .and_then(|r| r.as_ref())
                    .is_some_and(|r| r.gen == *gen)
            })
            .map(|(slot, _, reply, first)| {
                let up = reqs[slot as usize]
                    .as_ref()
                    .and_then(|r| r.ticket)
                    .and_then(|t| t.upstream())
                    .expect("a request at a cluster has an attempt in progress");
                (slot, up, reply, Some(first))
            })
            .collect();
        let mut refusal = None;
        match ev {
            None => {}
            Some(Ev::Send(slot)) => {
                let r = reqs[slot as usize].as_mut().expect("live request");
                match r
                    .call
                    .on_send(now, &mut shared, &mut draws(&mut client_rng))
                {
                    CallSend::Go => {
                        let cost = cost_of(r);
                        let (t, step) =
                            gw.start(now, groute, cost, &mut |n: u64| gw_rng.gen_range(0..n));
                        r.ticket = Some(t);
                        let r = *r;
                        act(
                            step,
                            now,
                            slot,
                            &r,
                            cost,
                            w.max_tokens,
                            &mut eps,
                            &mut clusters,
                            &mut q,
                            &mut res,
                            &mut attempts,
                        );
                    }
                    CallSend::LocalReject => refusal = Some((slot, 0u16, NEVER)),
                }
            }
            Some(Ev::Reply {
                slot,
                up,
                status,
                val,
            }) => {
                let reply = match status {
                    200 => AttemptReply::Ok { output: val },
                    REFUSED => AttemptReply::Refused,
                    TIMEOUT => AttemptReply::Timeout,
                    s => AttemptReply::Status {
                        status: s,
                        hint: (val != NEVER).then_some(val),
                    },
                };
                replies.push((slot, up as usize, reply, None));
            }
            Some(Ev::Refusal { slot, status, hint }) => refusal = Some((slot, status, hint)),
        }
        for (slot, up, reply, ttft) in replies {
            let r = reqs[slot as usize].as_mut().expect("live request");
            let cost = cost_of(r);
            let mut t = r.ticket.expect("an attempt in progress");
            let g = reply.for_gateway();
            let step = gw.on_reply(now, &mut t, g, &mut |n: u64| gw_rng.gen_range(0..n));
            r.ticket = Some(t);
            if g.is_failure() {
                res.ups[up].failures += 1;
            }
            match step {
                Step::Answer => {
                    let (status, hint, out) = match reply {
                        AttemptReply::Ok { output } => {
                            if let Some(ep) = &mut eps[up] {
                                ep.complete(now, cost, output);
                            }
                            gw.finish(now, &mut t, output);
                            let u = &mut res.ups[up];
                            u.ok += 1;
                            u.input_tokens += r.input;
                            u.output_tokens += output;
                            if let Some(first) = ttft {
                                res.ttft.record(first.saturating_sub(r.arrived));
                            }
                            (200, None, output)
                        }
                        AttemptReply::Status { status, hint } => (status, hint, 0),
                        AttemptReply::Refused => (502, None, 0),
                        AttemptReply::Timeout => (504, None, 0),
                    };
                    let reply = if status == 200 {
                        CallReply::Ok
                    } else {
                        CallReply::Error { status, hint }
                    };
                    caller_reply(
                        slot,
                        reply,
                        out,
                        now,
                        w,
                        &mut reqs,
                        &mut free,
                        &mut shared,
                        &mut client_rng,
                        &mut q,
                        &mut res,
                    );
                }
                step => {
                    let r = *r;
                    act(
                        step,
                        now,
                        slot,
                        &r,
                        cost,
                        w.max_tokens,
                        &mut eps,
                        &mut clusters,
                        &mut q,
                        &mut res,
                        &mut attempts,
                    );
                }
            }
        }
        if let Some((slot, status, hint)) = refusal {
            let reply = if status == 0 {
                CallReply::LocalReject
            } else {
                CallReply::Error {
                    status,
                    hint: (hint != NEVER).then_some(hint),
                }
            };
            caller_reply(
                slot,
                reply,
                0,
                now,
                w,
                &mut reqs,
                &mut free,
                &mut shared,
                &mut client_rng,
                &mut q,
                &mut res,
            );
        }
    }
    tally.finish(work(&clusters, attempts));
    // costs over the run
    let until = res.elapsed;
    let hours = to_secs(until) / 3600.0;
    let mut total = Some(0.0);
    for (i, u) in route.ups.iter().enumerate() {
        let c = match u {
            Up::Hosted(p) => match (p.provisioned, p.price) {
                (Some(pr), _) => Some(pr.cost(hours)),
                (None, Some(pr)) => Some(
                    res.ups[i].input_tokens as f64 * pr.input_per_m_usd / 1e6
                        + res.ups[i].output_tokens as f64 * pr.output_per_m_usd / 1e6,
                ),
                (None, None) => None,
            },
            Up::Replicas { profile, .. } => {
                let c = &clusters.0.iter().find(|(k, _)| *k == i).expect("cluster").1;
                profile
                    .replica_hour_usd
                    .map(|p| c.gpu_replicas().area(until) as f64 / 3.6e12 * p)
            }
        };
        res.ups[i].cost = c;
        total = total.zip(c).map(|(a, b)| a + b);
    }
    res.cost = total;
    res
}

/// The caller of the request in `slot` got `reply` at `now`: retry later,
/// or the request ends (recorded, its slot freed).
#[allow(clippy::too_many_arguments)]
fn caller_reply(
    slot: u32,
    reply: CallReply,
    _out: u64,
    now: Nanos,
    w: &Workload,
    reqs: &mut [Option<Req>],
    free: &mut Vec<u32>,
    shared: &mut PoolShared,
    rng: &mut Rng,
    q: &mut EventQueue<Ev>,
    res: &mut OpenRun,
) {
    let r = reqs[slot as usize].as_mut().expect("live request");
    match r
        .call
        .on_reply(now, reply, &w.caller, shared, &mut draws(rng))
    {
        Next::SendAt { at, .. } => q.schedule(at, Ev::Send(slot)),
        Next::Done(o) => {
            res.e2e.record(now.saturating_sub(r.arrived));
            if o.status == 200 {
                res.ok += 1;
            } else {
                res.failed += 1;
            }
            res.elapsed = res.elapsed.max(now);
            reqs[slot as usize] = None;
            free.push(slot);
        }
    }
}
