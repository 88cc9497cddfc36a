//! The simulation driver for hosted-API experiments: the event loop that
//! moves clients and the endpoint through virtual time.

use super::config::{ClientKind, Experiment, HostedSuite};
use crate::client::managed::{AimdController, AimdParams};
use crate::engine::rng::{component, draws, stream, unit};
use crate::engine::{DurationHist, EventQueue, Rng, Sampler};
use crate::hosted::{HostedEndpoint, Reply};
use crate::limiter::rates::Cost;
use crate::time::{secs, Nanos};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

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
        self.next += 1;
        let input = self.input.sample(&mut self.rng).round().max(1.0) as u64;
        let natural = self.output.sample(&mut self.rng).round().max(1.0) as u64;
        Some(Row { input, natural })
    }
}

/// Run every experiment of the suite in order on one endpoint whose buckets
/// carry over, with `cooldown` of idle time between experiments (so each
/// starts with buckets as refilled as the cool-down allows).
pub fn run_suite(suite: &HostedSuite, seed: u64) -> Vec<HostedResult> {
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
        let r = run_one(suite, e, &mut endpoint, t0, seed, client_rng);
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
) -> HostedResult {
    match &e.client {
        ClientKind::Pool { .. } => run_pool(suite, e, endpoint, t0, seed, rng),
        ClientKind::Managed(p) => run_managed(suite, e, endpoint, t0, seed, rng, p),
    }
}

/// One row being worked on.
#[derive(Debug, Clone, Copy)]
struct Active {
    row: Row,
    first_send: Nanos,
    sent_at: Nanos,
    /// Caller-level attempt number (1-based).
    attempt: u32,
    /// SDK retries used within the current caller attempt.
    sdk_n: u32,
    own_wait: Nanos,
    prev_delay: Nanos,
}

impl Active {
    fn new(row: Row, now: Nanos) -> Self {
        Active {
            row,
            first_send: now,
            sent_at: now,
            attempt: 1,
            sdk_n: 0,
            own_wait: 0,
            prev_delay: 0,
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Send(u32),
    Done {
        slot: u32,
        out: u64,
    },
    Fail {
        slot: u32,
        status: u16,
        hint: Option<Nanos>,
        /// Rejected by the client's own throttle, not by the endpoint.
        local: bool,
    },
    /// Managed executor: time to look at the queue again.
    Wake,
}

fn cost(e: &Experiment, row: &Row) -> Cost {
    Cost {
        input_tokens: row.input,
        max_tokens: e.max_tokens,
    }
}

/// Send an HTTP request for the row in `slot` at `now`.
fn send(
    endpoint: &mut HostedEndpoint,
    q: &mut EventQueue<Ev>,
    res: &mut HostedResult,
    e: &Experiment,
    slot: u32,
    a: &mut Active,
    now: Nanos,
) {
    a.sent_at = now;
    res.http_requests += 1;
    match endpoint.call(now, cost(e, &a.row), a.row.natural) {
        Reply::Ok {
            done_at,
            output_tokens,
            ..
        } => q.schedule(
            done_at,
            Ev::Done {
                slot,
                out: output_tokens,
            },
        ),
        Reply::RateLimited { at, limit, hint } => {
            res.http_429 += 1;
            res.limit_hits[limit].1 += 1;
            q.schedule(
                at,
                Ev::Fail {
                    slot,
                    status: 429,
                    hint,
                    local: false,
                },
            )
        }
        Reply::ServerError { at } => q.schedule(
            at,
            Ev::Fail {
                slot,
                status: 500,
                hint: None,
                local: false,
            },
        ),
    }
}

fn finish_row(res: &mut HostedResult, a: &Active, now: Nanos, status: u16, out: u64) {
    res.total += 1;
    res.latency.record(now - a.first_send);
    res.own_wait += a.own_wait;
    res.max_wait = res.max_wait.max(a.own_wait);
    res.max_attempts = res.max_attempts.max(a.attempt);
    if a.attempt > 1 {
        res.retried += 1;
    }
    match status {
        200 => {
            res.ok += 1;
            res.output_tokens += out;
            if out < a.row.natural {
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
) -> HostedResult {
    let ClientKind::Pool {
        workers,
        retry,
        sdk,
        quota,
        throttle,
    } = &e.client
    else {
        unreachable!("run_pool runs pool clients")
    };
    let (workers, sdk) = (*workers, sdk.as_ref());
    // shared by all workers of this client, fresh for each experiment
    let mut quota = quota.clone();
    let mut throttle = throttle.clone();
    let mut res = HostedResult::new(&e.name, "pool", suite);
    let mut rows = Rows::new(suite, e.rows, seed);
    let mut q = EventQueue::starting_at(t0);
    let mut slots: Vec<Option<Active>> = vec![None; workers as usize];
    // ThreadPoolExecutor.map submits every row up front; idle threads pick
    // them up in order, all at t0.
    for (w, s) in slots.iter_mut().enumerate() {
        if let Some(row) = rows.take() {
            *s = Some(Active::new(row, t0));
            q.schedule(t0, Ev::Send(w as u32));
        }
    }
    let mut last = t0;
    while let Some((now, ev)) = q.pop() {
        match ev {
            Ev::Send(w) => {
                if let Some(t) = throttle.as_mut() {
                    if unit(&mut rng) < t.reject_probability(now) {
                        t.record(now, false);
                        res.local_rejects += 1;
                        let fail = Ev::Fail {
                            slot: w,
                            status: 429,
                            hint: None,
                            local: true,
                        };
                        q.schedule(now, fail);
                        continue;
                    }
                }
                let a = slots[w as usize].as_mut().expect("active row");
                send(endpoint, &mut q, &mut res, e, w, a, now);
            }
            Ev::Done { slot, out } => {
                let a = slots[slot as usize].take().expect("active row");
                endpoint.complete(now, cost(e, &a.row), out);
                if let Some(t) = throttle.as_mut() {
                    t.record(now, true);
                }
                if let Some(qt) = quota.as_mut() {
                    qt.on_success(a.attempt > 1);
                }
                finish_row(&mut res, &a, now, 200, out);
                last = now;
                next_row(&mut rows, &mut slots, &mut q, slot, now);
            }
            Ev::Fail {
                slot,
                status,
                hint,
                local,
            } => {
                if !local {
                    if let Some(t) = throttle.as_mut() {
                        // a backend overload rejection is not an accept
                        t.record(now, status != 429);
                    }
                }
                let a = slots[slot as usize].as_mut().expect("active row");
                // 1) the SDK's hidden layer
                if let Some(s) = sdk {
                    if s.should_retry(a.sdk_n, status, hint) {
                        let d = s.delay(a.sdk_n, hint, &mut draws(&mut rng));
                        a.sdk_n += 1;
                        res.sdk_retries += 1;
                        q.schedule(now + d, Ev::Send(slot));
                        continue;
                    }
                }
                // 2) the caller's own policy sees the exception; a retry
                //    quota, if any, must pay for the retry
                let wants = retry.should_retry(a.attempt, status);
                let paid = wants && quota.as_mut().is_none_or(|qt| qt.try_acquire());
                if wants && !paid {
                    res.quota_denied += 1;
                }
                if paid {
                    let d = retry.delay(a.attempt, a.prev_delay, hint, &mut draws(&mut rng));
                    a.prev_delay = d;
                    a.own_wait += d;
                    a.attempt += 1;
                    a.sdk_n = 0;
                    q.schedule(now + d, Ev::Send(slot));
                    continue;
                }
                let a = slots[slot as usize].take().expect("active row");
                finish_row(&mut res, &a, now, status, 0);
                last = now;
                next_row(&mut rows, &mut slots, &mut q, slot, now);
            }
            Ev::Wake => unreachable!("pool schedules no wake-ups"),
        }
    }
    res.elapsed = last - t0;
    res
}

fn next_row(
    rows: &mut Rows,
    slots: &mut [Option<Active>],
    q: &mut EventQueue<Ev>,
    slot: u32,
    now: Nanos,
) {
    if let Some(row) = rows.take() {
        slots[slot as usize] = Some(Active::new(row, now));
        q.schedule(now, Ev::Send(slot));
    }
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
    let mut ctl = AimdController::new(p.clone());
    let mut q = EventQueue::starting_at(t0);
    // in-flight rows live in slots; free slot indices are reused
    let mut slots: Vec<Option<Active>> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    let mut inflight = 0usize;
    // throttled rows waiting to be eligible again: (eligible_at, seq)
    let mut waiting: BinaryHeap<Reverse<(Nanos, u64)>> = BinaryHeap::new();
    let mut parked: std::collections::BTreeMap<u64, Active> = std::collections::BTreeMap::new();
    let mut seq = 0u64;
    let mut last = t0;
    q.schedule(t0, Ev::Wake);
    while let Some((now, ev)) = q.pop() {
        match ev {
            Ev::Wake | Ev::Send(_) => {}
            Ev::Done { slot, out } => {
                let a = slots[slot as usize].take().expect("in flight");
                free.push(slot);
                inflight -= 1;
                endpoint.complete(now, cost(e, &a.row), out);
                ctl.on_success();
                finish_row(&mut res, &a, now, 200, out);
                last = now;
            }
            Ev::Fail {
                slot, status, hint, ..
            } => {
                let mut a = slots[slot as usize].take().expect("in flight");
                free.push(slot);
                inflight -= 1;
                if status == 429 {
                    ctl.on_throttle(now, a.sent_at);
                }
                if a.attempt >= p.max_attempts {
                    finish_row(&mut res, &a, now, status, 0);
                    last = now;
                } else {
                    let d = hint.unwrap_or_else(|| {
                        let n = (a.attempt - 1).min(62) as i32;
                        let base = (p.retry_base_s * 2f64.powi(n)).min(p.retry_cap_s);
                        secs(base * (0.5 + 0.5 * unit(&mut rng)))
                    });
                    a.attempt += 1;
                    waiting.push(Reverse((now + d, seq)));
                    parked.insert(seq, a);
                    seq += 1;
                    q.schedule(now + d, Ev::Wake);
                }
            }
        }
        // dispatch while the window allows: eligible retries first, then new rows
        while inflight < ctl.limit() {
            let mut a = match waiting.peek() {
                Some(Reverse((t, s))) if *t <= now => {
                    let s = *s;
                    waiting.pop();
                    parked.remove(&s).expect("parked row")
                }
                _ => match rows.take() {
                    Some(row) => Active::new(row, now),
                    None => break,
                },
            };
            let slot = free.pop().unwrap_or_else(|| {
                slots.push(None);
                (slots.len() - 1) as u32
            });
            inflight += 1;
            send(endpoint, &mut q, &mut res, e, slot, &mut a, now);
            slots[slot as usize] = Some(a);
        }
    }
    res.final_concurrency = Some(ctl.window());
    res.elapsed = last - t0;
    res
}
