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
use crate::hosted::{HostedEndpoint, Reply};
use crate::limiter::rates::Cost;
use crate::time::{Nanos, NEVER};
use crate::work::Tally;

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
            price: suite.profile.price,
            provisioned: suite.profile.provisioned,
            truncated: 0,
            retried: 0,
            max_attempts: 0,
            max_wait: 0,
            http_requests: 0,
            http_429: 0,
            sdk_retries: 0,
            local_rejects: 0,
            quota_denied: 0,
            limit_hits: suite
                .profile
                .limits
                .iter()
                .map(|l| (l.name.clone(), 0))
                .collect(),
            final_concurrency: None,
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
    let mut endpoint = HostedEndpoint::new(
        suite.profile.clone(),
        0,
        stream(seed, 0, component::ENDPOINT),
    );
    let mut t0: Nanos = 0;
    let mut out = Vec::with_capacity(suite.experiments.len());
    for e in &suite.experiments {
        let client_rng = stream(seed, 1 + e.index, component::CLIENT);
        endpoint.reseed(stream(seed, 1 + e.index, component::ENDPOINT));
        let r = run_one(suite, e, &mut endpoint, t0, seed, client_rng, observe);
        t0 = t0 + r.elapsed + suite.cooldown;
        out.push(r);
    }
    out
}

fn run_one(
    suite: &HostedSuite,
    e: &Experiment,
    endpoint: &mut HostedEndpoint,
    t0: Nanos,
    seed: u64,
    rng: Rng,
    observe: &mut dyn FnMut(&Attempt),
) -> HostedResult {
    match &e.client {
        ClientKind::Pool { .. } => run_pool(suite, e, endpoint, t0, seed, rng, observe),
        ClientKind::Managed(p) => run_managed(suite, e, endpoint, t0, seed, rng, p),
    }
}

/// One row being worked on: the row and its call state (the core's caller
/// state machine).
#[derive(Debug, Clone, Copy)]
struct Active {
    row: Row,
    call: Call,
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Send(u32),
    /// The reply to slot's attempt arrives (`out`: output tokens of a success).
    /// The reply to slot's attempt arrives (packed small: the queue moves
    /// every event several times).
    Reply {
        slot: u32,
        reply: Packed,
    },
}

/// A reply in 16 bytes: status 200 carries the output tokens, an error
/// status its retry hint (`NEVER`: none), status 0 a local rejection.
#[derive(Debug, Clone, Copy)]
struct Packed {
    status: u16,
    val: u64,
}

impl Packed {
    fn ok(out: u64) -> Self {
        Packed {
            status: 200,
            val: out,
        }
    }
    fn error(status: u16, hint: Option<Nanos>) -> Self {
        Packed {
            status,
            val: hint.unwrap_or(NEVER),
        }
    }
    const LOCAL_REJECT: Packed = Packed { status: 0, val: 0 };
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
    endpoint: &mut HostedEndpoint,
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
                    CallSend::Go => send(endpoint, &mut q, &mut res, e, w, &a.row, now),
                    CallSend::LocalReject => {
                        res.local_rejects += 1;
                        let reply = Packed::LOCAL_REJECT;
                        q.schedule(now, Ev::Reply { slot: w, reply });
                    }
                }
            }
            Ev::Reply { slot, reply } => {
                let (reply, out) = reply.unpack();
                let a = slots[slot as usize].as_mut().expect("active row");
                if reply == CallReply::Ok {
                    endpoint.complete(now, cost(e, &a.row), out);
                }
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
                            slots[slot as usize] = Some(Active { row, call });
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
    endpoint: &mut HostedEndpoint,
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
            send(endpoint, &mut q, &mut res, e, slot, &row, now);
            slots[slot as usize] = Some(Active { row, call });
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
        let (reply, out) = reply.unpack();
        let a = slots[slot as usize].take().expect("in flight");
        free.push(slot);
        let (status, hint) = match reply {
            CallReply::Ok => {
                endpoint.complete(now, cost(e, &a.row), out);
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
