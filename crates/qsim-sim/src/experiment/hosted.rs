//! The simulation driver for hosted-API experiments: the event loop that
//! moves clients and the endpoint through virtual time.

use super::config::{ClientKind, Experiment, HostedSuite};
use crate::client::managed::AimdParams;
use crate::client::trace::Attempt;
use crate::client::{
    Call, Layer, Managed, ManagedNext, Next, Outcome, Reply as CallReply, Send as CallSend,
};
use crate::engine::rng::{component, draws, stream};
use crate::engine::{DurationHist, EventQueue, NoDeadlines, Rng, Sampler, Timed};
use crate::hosted::routed::{
    Attempt as UpAttempt, AttemptReply, ClientReply, Next as GwNext, Upstreams,
};
use crate::hosted::{HostedEndpoint, Reply};
use crate::limiter::rates::Cost;
use crate::time::{Nanos, NEVER};
use crate::work::Tally;
use qsim_core::gateway::Ticket;

/// What one experiment measured (the article's `show()` plus more).
#[derive(Debug, Clone)]
pub struct HostedResult {
    pub name: String,
    pub client: &'static str,
    pub elapsed: Nanos,
    pub total: u64,
    pub ok: u64,
    /// Rows whose final outcome was a 429 surfaced to the caller.
    pub rejected_429: u64,
    /// Rows that failed with another status.
    pub failed_other: u64,
    /// Per-row latency: first send to final outcome, including all waits.
    pub latency: DurationHist,
    /// Total of the caller's own sleeps.
    pub own_wait: Nanos,
    pub output_tokens: u64,
    /// Input tokens of the rows that succeeded (what a pay-per-token
    /// endpoint bills, with their output tokens).
    pub input_tokens: u64,
    /// The endpoint's pay-per-token prices, if known.
    pub price: Option<crate::hosted::profile::TokenPrice>,
    /// The endpoint's provisioned units, if it is provisioned (billed per
    /// unit-hour over `elapsed`).
    pub provisioned: Option<crate::hosted::provisioned::Provisioned>,
    /// Successful rows cut short by max_tokens (finish_reason "length").
    pub truncated: u64,
    /// Rows that needed more than one caller-level attempt.
    pub retried: u64,
    pub max_attempts: u32,
    /// Longest own wait of one row.
    pub max_wait: Nanos,
    pub http_requests: u64,
    pub http_429: u64,
    pub sdk_retries: u64,
    /// Requests the client-side adaptive throttle rejected locally.
    pub local_rejects: u64,
    /// Retries the policy wanted but the retry quota could not pay for.
    pub quota_denied: u64,
    /// 429s by limit name (profile order).
    pub limit_hits: Vec<(String, u64)>,
    /// Managed executor only: final and minimum concurrency window, decreases.
    pub final_concurrency: Option<f64>,
    /// Several upstreams behind a route: what each did in this experiment.
    pub upstreams: Vec<UpstreamStats>,
    /// Requests the gateway refused (no upstream open): limited, unavailable.
    pub gateway_refused: [u64; 2],
    /// Several upstreams: the run's cost over all of them (pay-per-token
    /// tokens × prices, provisioned units × elapsed hours), if every one
    /// is priced.
    pub upstream_cost: Option<f64>,
}

/// One upstream's share of an experiment (several upstreams behind a route).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct UpstreamStats {
    pub name: String,
    /// Attempts sent to it, its 429s, its failures (5xx, timeouts, refused
    /// connections), the requests it answered 200, their tokens.
    pub sent: u64,
    pub http_429: u64,
    pub failures: u64,
    pub ok: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Cooldowns started and times its circuit opened.
    pub cooldowns: u64,
    pub opened: u64,
}

impl HostedResult {
    fn new(name: &str, client: &'static str, suite: &HostedSuite) -> Self {
        HostedResult {
            name: name.to_string(),
            client,
            elapsed: 0,
            total: 0,
            ok: 0,
            rejected_429: 0,
            failed_other: 0,
            latency: DurationHist::new(),
            own_wait: 0,
            output_tokens: 0,
            input_tokens: 0,
            // several upstreams: priced per upstream (`upstream_cost`)
            price: suite
                .routes
                .is_none()
                .then_some(suite.profile.price)
                .flatten(),
            provisioned: suite
                .routes
                .is_none()
                .then_some(suite.profile.provisioned)
                .flatten(),
            truncated: 0,
            retried: 0,
            max_attempts: 0,
            max_wait: 0,
            http_requests: 0,
            http_429: 0,
            sdk_retries: 0,
            local_rejects: 0,
            quota_denied: 0,
            limit_hits: suite.limit_names().into_iter().map(|n| (n, 0)).collect(),
            final_concurrency: None,
            upstreams: Vec::new(),
            gateway_refused: [0; 2],
            upstream_cost: None,
        }
    }

    pub fn throughput(&self) -> f64 {
        if self.elapsed == 0 {
            0.0
        } else {
            self.ok as f64 / (self.elapsed as f64 / 1e9)
        }
    }
}

/// The rows of the table: drawn in row order from the workload stream, so
/// row `i` has the same prompt and natural output length in every experiment
/// and every client (temperature 0: a retried prompt gives the same output).
struct Rows {
    next: u64,
    total: u64,
    rng: Rng,
    input: Sampler,
    output: Sampler,
}

#[derive(Debug, Clone, Copy)]
struct Row {
    /// Position in the table.
    index: u64,
    input: u64,
    natural: u64,
}

impl Rows {
    fn new(suite: &HostedSuite, total: u64, seed: u64) -> Self {
        Rows {
            next: 0,
            total,
            rng: stream(seed, 0, component::WORKLOAD),
            input: suite.input_tokens.clone(),
            output: suite.output_tokens.clone(),
        }
    }
    fn take(&mut self) -> Option<Row> {
        if self.next >= self.total {
            return None;
        }
        let index = self.next;
        self.next += 1;
        let input = self.input.sample(&mut self.rng).round().max(1.0) as u64;
        let natural = crate::hosted::natural_output(&self.output, &mut self.rng);
        Some(Row {
            index,
            input,
            natural,
        })
    }
}

/// Run every experiment of the suite in order on one endpoint whose buckets
/// carry over, with `cooldown` of idle time between experiments (so each
/// starts with buckets as refilled as the cool-down allows).
pub fn run_suite(suite: &HostedSuite, seed: u64) -> Vec<HostedResult> {
    run_suite_observed(suite, seed, &mut |_| {})
}

/// [`run_suite`], telling `observe` of every attempt of a pool client and
/// what its caller did with the reply (tests compare drivers with it).
pub fn run_suite_observed(
    suite: &HostedSuite,
    seed: u64,
    observe: &mut dyn FnMut(&Attempt),
) -> Vec<HostedResult> {
    let mut target = match &suite.routes {
        None => Target::One(Box::new(HostedEndpoint::new(
            suite.profile.clone(),
            0,
            stream(seed, 0, component::ENDPOINT),
        ))),
        Some(r) => Target::Routed(Box::new(Upstreams::new(r, 0, seed, 0))),
    };
    let mut t0: Nanos = 0;
    let mut out = Vec::with_capacity(suite.experiments.len());
    for e in &suite.experiments {
        let client_rng = stream(seed, 1 + e.index, component::CLIENT);
        match &mut target {
            Target::One(ep) => ep.reseed(stream(seed, 1 + e.index, component::ENDPOINT)),
            Target::Routed(u) => u.reseed(seed, 1 + e.index),
        }
        let before = target.snapshot();
        let mut r = run_one(suite, e, &mut target, t0, seed, client_rng, observe);
        target.account(suite, &before, &mut r);
        t0 = t0 + r.elapsed + suite.cooldown;
        out.push(r);
    }
    out
}

/// Where an experiment's HTTP requests go: the endpoint, or the gateway
/// and its upstreams (`[[upstream]]` and `[[route]]`), whose state carries
/// over between experiments as one endpoint's buckets do.
enum Target {
    One(Box<HostedEndpoint>),
    Routed(Box<Upstreams>),
}

/// The routed counts at an experiment's start.
type Snapshot = Vec<(qsim_core::gateway::Counts, crate::hosted::routed::Served)>;

impl Target {
    fn snapshot(&self) -> (Snapshot, [u64; 2]) {
        match self {
            Target::One(_) => (Vec::new(), [0; 2]),
            Target::Routed(u) => (
                (0..u.served.len())
                    .map(|i| (u.gw.upstream(i).counts, u.served[i]))
                    .collect(),
                u.refused,
            ),
        }
    }

    /// The experiment's share of the upstreams' counts, and its cost.
    fn account(&self, suite: &HostedSuite, before: &(Snapshot, [u64; 2]), r: &mut HostedResult) {
        let (Target::Routed(u), Some(routes)) = (self, &suite.routes) else {
            return;
        };
        let hours = crate::time::to_secs(r.elapsed) / 3600.0;
        let mut cost = Some(0.0);
        for (i, (c0, s0)) in before.0.iter().enumerate() {
            let c = u.gw.upstream(i).counts;
            let s = u.served[i];
            let st = UpstreamStats {
                name: routes.core.upstreams[i].name.clone(),
                sent: c.sent - c0.sent,
                http_429: c.rate_limited - c0.rate_limited,
                failures: (c.server_error + c.timeout + c.refused)
                    - (c0.server_error + c0.timeout + c0.refused),
                ok: s.ok - s0.ok,
                input_tokens: s.input_tokens - s0.input_tokens,
                output_tokens: s.output_tokens - s0.output_tokens,
                cooldowns: c.cooldowns - c0.cooldowns,
                opened: c.opened - c0.opened,
            };
            let p = u.endpoint(i).profile();
            let this = match (p.provisioned, p.price) {
                (Some(pr), _) => Some(pr.cost(hours)),
                (None, Some(pr)) => Some(
                    st.input_tokens as f64 * pr.input_per_m_usd / 1e6
                        + st.output_tokens as f64 * pr.output_per_m_usd / 1e6,
                ),
                (None, None) => None,
            };
            cost = cost.zip(this).map(|(a, b)| a + b);
            r.upstreams.push(st);
        }
        r.gateway_refused = [u.refused[0] - before.1[0], u.refused[1] - before.1[1]];
        r.upstream_cost = cost;
    }

    /// Send the request for `row` at `now` (slot `slot`): its reply is an
    /// event at the time it arrives; the gateway's ticket, if routed.
    #[allow(clippy::too_many_arguments)]
    fn send(
        &mut self,
        q: &mut EventQueue<Ev>,
        res: &mut HostedResult,
        e: &Experiment,
        slot: u32,
        row: &Row,
        now: Nanos,
    ) -> Option<Ticket> {
        match self {
            Target::One(ep) => {
                send(ep, q, res, e, slot, row, now);
                None
            }
            Target::Routed(u) => {
                u.probes(now);
                let (t, next) = u.start(now, cost(e, row), row.natural);
                routed_next(u, q, res, slot, now, next);
                Some(t)
            }
        }
    }

    /// The reply event `p` for the row in `slot` arrived at `now`: what
    /// the caller sees (None: the gateway sent the request on; its reply is
    /// a new event).
    #[allow(clippy::too_many_arguments)]
    fn arrived(
        &mut self,
        q: &mut EventQueue<Ev>,
        res: &mut HostedResult,
        e: &Experiment,
        slot: u32,
        a: &mut Active,
        p: Packed,
        now: Nanos,
    ) -> Option<Packed> {
        match self {
            Target::One(ep) => {
                if p.status == 200 {
                    ep.complete(now, cost(e, &a.row), p.val);
                }
                Some(p)
            }
            Target::Routed(u) => {
                u.probes(now);
                if p.up == Packed::CLIENT {
                    return Some(p);
                }
                let attempt = UpAttempt {
                    at: now,
                    upstream: p.up as usize,
                    reply: p.attempt_reply(),
                    limit: None,
                };
                let t = a.ticket.as_mut().expect("a routed row has a ticket");
                let next = u.reply(t, attempt, cost(e, &a.row), a.row.natural);
                match next {
                    GwNext::Answer(c) => Some(Packed::client(c)),
                    again => {
                        routed_next(u, q, res, slot, now, again);
                        None
                    }
                }
            }
        }
    }
}

/// Schedule a routed request's next event: an attempt's reply, or the
/// client's answer (a gateway refusal) at once.
fn routed_next(
    u: &Upstreams,
    q: &mut EventQueue<Ev>,
    res: &mut HostedResult,
    slot: u32,
    now: Nanos,
    next: GwNext,
) {
    match next {
        GwNext::Again(a) => {
            res.http_requests += 1;
            if let (AttemptReply::Status { status: 429, .. }, Some(limit)) = (a.reply, a.limit) {
                res.http_429 += 1;
                let name = format!(
                    "{}.{}",
                    u.gw.config().upstreams[a.upstream].name,
                    u.endpoint(a.upstream).profile().limits[limit].name
                );
                if let Some(h) = res.limit_hits.iter_mut().find(|(n, _)| *n == name) {
                    h.1 += 1;
                }
            }
            q.schedule(
                a.at,
                Ev::Reply {
                    slot,
                    reply: Packed::attempt(&a),
                },
            );
        }
        // the gateway's refusal, at once
        GwNext::Answer(c) => q.schedule(
            now,
            Ev::Reply {
                slot,
                reply: Packed::client(c),
            },
        ),
    }
}

fn run_one(
    suite: &HostedSuite,
    e: &Experiment,
    target: &mut Target,
    t0: Nanos,
    seed: u64,
    rng: Rng,
    observe: &mut dyn FnMut(&Attempt),
) -> HostedResult {
    match &e.client {
        ClientKind::Pool { .. } => run_pool(suite, e, target, t0, seed, rng, observe),
        ClientKind::Managed(p) => run_managed(suite, e, target, t0, seed, rng, p),
    }
}

/// One row being worked on: the row, its call state (the core's caller
/// state machine) and, routed, its gateway ticket.
#[derive(Debug, Clone, Copy)]
struct Active {
    row: Row,
    call: Call,
    ticket: Option<Ticket>,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Send(u32),
    /// The reply to slot's attempt arrives (packed small: the queue moves
    /// every event several times).
    Reply {
        slot: u32,
        reply: Packed,
    },
}

/// A reply in 16 bytes. For the caller (`up == CLIENT`): status 200
/// carries the output tokens, an error status its retry hint (`NEVER`:
/// none), status 0 a local rejection. An upstream's attempt (routed: `up`
/// is the upstream): 200 and its output, an error status and its hint,
/// `REFUSED` or `TIMEOUT`.
#[derive(Debug, Clone, Copy)]
struct Packed {
    status: u16,
    up: u16,
    val: u64,
}

impl Packed {
    const CLIENT: u16 = u16::MAX;
    const REFUSED: u16 = 1;
    const TIMEOUT: u16 = 2;
    fn ok(out: u64) -> Self {
        Packed {
            status: 200,
            up: Self::CLIENT,
            val: out,
        }
    }
    fn error(status: u16, hint: Option<Nanos>) -> Self {
        Packed {
            status,
            up: Self::CLIENT,
            val: hint.unwrap_or(NEVER),
        }
    }
    const LOCAL_REJECT: Packed = Packed {
        status: 0,
        up: Self::CLIENT,
        val: 0,
    };
    fn client(c: ClientReply) -> Self {
        match c.status {
            200 => Packed::ok(c.output),
            s => Packed::error(s, c.hint),
        }
    }
    fn attempt(a: &UpAttempt) -> Self {
        let (status, val) = match a.reply {
            AttemptReply::Ok { output } => (200, output),
            AttemptReply::Status { status, hint } => (status, hint.unwrap_or(NEVER)),
            AttemptReply::Refused => (Self::REFUSED, 0),
            AttemptReply::Timeout => (Self::TIMEOUT, 0),
        };
        Packed {
            status,
            up: a.upstream as u16,
            val,
        }
    }
    fn attempt_reply(self) -> AttemptReply {
        match self.status {
            200 => AttemptReply::Ok { output: self.val },
            Self::REFUSED => AttemptReply::Refused,
            Self::TIMEOUT => AttemptReply::Timeout,
            status => AttemptReply::Status {
                status,
                hint: (self.val != NEVER).then_some(self.val),
            },
        }
    }
    /// The reply as the caller sees it, and the output tokens of a success.
    fn unpack(self) -> (CallReply, u64) {
        match self.status {
            200 => (CallReply::Ok, self.val),
            0 => (CallReply::LocalReject, 0),
            status => {
                let hint = (self.val != NEVER).then_some(self.val);
                (CallReply::Error { status, hint }, 0)
            }
        }
    }
}

fn cost(e: &Experiment, row: &Row) -> Cost {
    Cost {
        input_tokens: row.input,
        max_tokens: e.max_tokens,
    }
}

/// Send an HTTP request for the row in `slot` at `now`; its reply is an
/// event at the time the endpoint answers.
fn send(
    endpoint: &mut HostedEndpoint,
    q: &mut EventQueue<Ev>,
    res: &mut HostedResult,
    e: &Experiment,
    slot: u32,
    row: &Row,
    now: Nanos,
) {
    res.http_requests += 1;
    let (at, reply) = match endpoint.call(now, cost(e, row), row.natural) {
        Reply::Ok {
            done_at,
            output_tokens,
            ..
        } => (done_at, Packed::ok(output_tokens)),
        Reply::RateLimited { at, limit, hint } => {
            res.http_429 += 1;
            res.limit_hits[limit].1 += 1;
            (at, Packed::error(429, hint))
        }
        Reply::ServerError { at } => (at, Packed::error(500, None)),
    };
    q.schedule(at, Ev::Reply { slot, reply });
}

fn finish_row(res: &mut HostedResult, row: &Row, o: &Outcome, out: u64) {
    res.total += 1;
    res.latency.record(o.latency);
    res.own_wait += o.own_wait;
    res.max_wait = res.max_wait.max(o.own_wait);
    res.max_attempts = res.max_attempts.max(o.attempts);
    if o.attempts > 1 {
        res.retried += 1;
    }
    if o.quota_denied {
        res.quota_denied += 1;
    }
    match o.status {
        200 => {
            res.ok += 1;
            res.output_tokens += out;
            res.input_tokens += row.input;
            if out < row.natural {
                res.truncated += 1;
            }
        }
        429 => res.rejected_429 += 1,
        _ => res.failed_other += 1,
    }
}

fn run_pool(
    suite: &HostedSuite,
    e: &Experiment,
    target: &mut Target,
    t0: Nanos,
    seed: u64,
    mut rng: Rng,
    observe: &mut dyn FnMut(&Attempt),
) -> HostedResult {
    let ClientKind::Pool {
        workers,
        caller,
        shared,
    } = &e.client
    else {
        unreachable!("run_pool runs pool clients")
    };
    // shared by all workers of this client, fresh for each experiment
    let mut shared = shared.clone();
    let mut res = HostedResult::new(&e.name, "pool", suite);
    let mut rows = Rows::new(suite, e.rows, seed);
    let mut q = EventQueue::starting_at(t0);
    let mut slots: Vec<Option<Active>> = vec![None; *workers as usize];
    // ThreadPoolExecutor.map submits every row up front; idle threads pick
    // them up in order, all at t0.
    for (w, s) in slots.iter_mut().enumerate() {
        if let Some(row) = rows.take() {
            *s = Some(Active {
                row,
                call: Call::start(t0),
                ticket: None,
            });
            q.schedule(t0, Ev::Send(w as u32));
        }
    }
    let mut last = t0;
    // the run-time work budget: an attempt (sent or rejected locally) is a unit
    let mut tally = Tally::new();
    // the engine's contract with no component deadlines: events in (time, FIFO) order
    while let Some((now, Some(ev))) = q.step(&mut NoDeadlines) {
        if !tally.at(res.http_requests + res.local_rejects) {
            break;
        }
        match ev {
            Ev::Send(w) => {
                let a = slots[w as usize].as_mut().expect("active row");
                match a.call.on_send(now, &mut shared, &mut draws(&mut rng)) {
                    CallSend::Go => {
                        a.ticket = target.send(&mut q, &mut res, e, w, &a.row, now);
                    }
                    CallSend::LocalReject => {
                        res.local_rejects += 1;
                        let reply = Packed::LOCAL_REJECT;
                        q.schedule(now, Ev::Reply { slot: w, reply });
                    }
                }
            }
            Ev::Reply { slot, reply } => {
                let a = slots[slot as usize].as_mut().expect("active row");
                let Some(reply) = target.arrived(&mut q, &mut res, e, slot, a, reply, now) else {
                    continue;
                };
                let (reply, out) = reply.unpack();
                let before = a.call;
                let next = a
                    .call
                    .on_reply(now, reply, caller, &mut shared, &mut draws(&mut rng));
                observe(&Attempt {
                    consumer: 0,
                    row: a.row.index,
                    attempt: before.attempt(),
                    sdk_retry: before.sdk_retries(),
                    sent: before.sent_at(),
                    replied: now,
                    reply,
                    next,
                });
                match next {
                    Next::SendAt { at, layer } => {
                        if layer == Layer::Sdk {
                            res.sdk_retries += 1;
                        }
                        q.schedule(at, Ev::Send(slot));
                    }
                    Next::Done(o) => {
                        let a = slots[slot as usize].take().expect("active row");
                        finish_row(&mut res, &a.row, &o, out);
                        last = now;
                        if let Some(row) = rows.take() {
                            let call = Call::start(now);
                            slots[slot as usize] = Some(Active {
                                row,
                                call,
                                ticket: None,
                            });
                            q.schedule(now, Ev::Send(slot));
                        }
                    }
                }
            }
        }
    }
    tally.finish(res.http_requests + res.local_rejects);
    res.elapsed = last - t0;
    res
}

/// The managed executor's re-queued rows are its deadlines: at each
/// eligibility time the driver dispatches again (only while the window has
/// room; a full window waits for a reply, which is an event).
impl<T> Timed for Managed<T> {
    fn poll_timeout(&self) -> Option<Nanos> {
        Managed::poll_timeout(self).filter(|_| self.has_room())
    }
    fn handle_timeout(&mut self, _now: Nanos) {}
}

fn run_managed(
    suite: &HostedSuite,
    e: &Experiment,
    target: &mut Target,
    t0: Nanos,
    seed: u64,
    mut rng: Rng,
    p: &AimdParams,
) -> HostedResult {
    let mut res = HostedResult::new(&e.name, "managed", suite);
    let mut rows = Rows::new(suite, e.rows, seed);
    let mut exec: Managed<Row> = Managed::new(p.clone());
    let mut q = EventQueue::starting_at(t0);
    // in-flight rows live in slots; free slot indices are reused
    let mut slots: Vec<Option<Active>> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    let mut last = t0;
    let mut now = t0;
    // the run-time work budget: an attempt is a unit
    let mut tally = Tally::new();
    loop {
        if !tally.at(res.http_requests) {
            break;
        }
        // dispatch while the window allows: eligible retries first, then new rows
        while exec.has_room() {
            let (mut call, row) = match exec.take_eligible(now) {
                Some(x) => x,
                None => match rows.take() {
                    Some(row) => (Call::start(now), row),
                    None => break,
                },
            };
            let slot = free.pop().unwrap_or_else(|| {
                slots.push(None);
                (slots.len() - 1) as u32
            });
            exec.on_send(now, &mut call);
            let ticket = target.send(&mut q, &mut res, e, slot, &row, now);
            slots[slot as usize] = Some(Active { row, call, ticket });
        }
        // the engine's contract: re-queued rows' eligibility (the executor's
        // deadline) first at equal times, then replies in order
        let Some((t, ev)) = q.step(&mut exec) else {
            break;
        };
        now = t;
        let Some(Ev::Reply { slot, reply }) = ev else {
            continue;
        };
        let a = slots[slot as usize].as_mut().expect("in flight");
        let Some(reply) = target.arrived(&mut q, &mut res, e, slot, a, reply, now) else {
            continue;
        };
        let (reply, out) = reply.unpack();
        let a = slots[slot as usize].take().expect("in flight");
        free.push(slot);
        let (status, hint) = match reply {
            CallReply::Ok => {
                let o = exec.on_success(now, &a.call);
                finish_row(&mut res, &a.row, &o, out);
                last = now;
                continue;
            }
            CallReply::Error { status, hint } => (status, hint),
            CallReply::LocalReject => unreachable!("a managed executor has no throttle"),
        };
        match exec.on_failure(now, a.call, a.row, status, hint, &mut draws(&mut rng)) {
            ManagedNext::Done(o) => {
                finish_row(&mut res, &a.row, &o, 0);
                last = now;
            }
            ManagedNext::EligibleAt(_) => {}
        }
    }
    tally.finish(res.http_requests);
    res.final_concurrency = Some(exec.window());
    res.elapsed = last - t0;
    res
}
