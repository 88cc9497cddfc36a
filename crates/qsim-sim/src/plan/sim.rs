//! The shared-deployment driver: consumers' arrival processes → admission
//! limiter → GPU server, in virtual time on one event queue.
//!
//! The server sits behind the [`Backend`] trait: the GPU server model
//! (`crate::server::Cluster`, issue 3) or [`IdealBackend`] (every admitted
//! request takes `ttft + output × itl`, no queueing; used where only the
//! limiter matters).
//!
//! Each consumer's requests under a load line are one client's calls, run
//! through the core's caller state machine ([`Call`]) the way the hosted
//! driver runs a pool: `on_send` before every attempt (the adaptive
//! throttle may reject it locally), and every reply — the limiter's 429,
//! a local rejection, the success at completion — through `on_reply` (the
//! SDK's hidden retries, the caller's own retry policy, the retry quota).
//! The throttle and quota state ([`PoolShared`]) is one per (load,
//! consumer), fresh for each run.

use super::config::{Arrival, Scenario, SharedFile, TraceTo};
use crate::client::trace::Attempt;
use crate::client::{Call, CallerPolicy, Layer, Next, PoolShared, Reply, Send as CallSend};
use crate::engine::rng::{component, draws, stream, unit};
use crate::engine::{DurationHist, EventQueue, Rng, Timed};
use crate::limiter::admission::{Decision, Grant, Limit, Limiter, LimiterConfig};
use crate::time::{Nanos, NEVER, NS_PER_MS, NS_PER_SEC};
use crate::trace::TraceSource;
use crate::work::{Tally, UNITS_PER_REQUEST};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

const MINUTE: Nanos = 60 * NS_PER_SEC;

/// A request finished by the server.
#[derive(Debug, Clone, Copy)]
pub struct Done {
    pub id: u64,
    pub arrival: Nanos,
    pub first_token: Nanos,
    pub finished: Nanos,
    pub output_tokens: u32,
}

/// The server behind the limiter (sans-IO, like the server model).
pub trait Backend: Timed {
    fn submit(&mut self, now: Nanos, id: u64, input_tokens: u32, output_tokens: u32);
    fn poll_completion(&mut self) -> Option<Done>;
    /// (GPU busy fraction, KV-cache utilization) averaged up to `now`, if modelled.
    fn utilization(&self, now: Nanos) -> (Option<f64>, Option<f64>);
    /// Requests inside the server (queued or running).
    fn outstanding(&self) -> usize;
    /// Engine iterations finished so far (the work budget's count; none
    /// for a server without an engine model).
    fn iterations(&self) -> u64 {
        0
    }
    /// Work units of one driver step besides its requests and iterations
    /// (a cluster's replica scan, [`crate::work::step_units`]).
    fn step_units(&self) -> u64 {
        0
    }
}

/// A server without queueing: TTFT and ITL constant.
pub struct IdealBackend {
    ttft: Nanos,
    itl: Nanos,
    heap: BinaryHeap<Reverse<(Nanos, u64, Nanos, u32)>>,
    done: Vec<Done>,
}

impl IdealBackend {
    /// The shared-deployment article's unloaded NIM figures: TTFT 35 ms, ITL 18 ms.
    pub fn seed_nim() -> Self {
        IdealBackend {
            ttft: 35 * NS_PER_MS,
            itl: 18 * NS_PER_MS,
            heap: BinaryHeap::new(),
            done: Vec::new(),
        }
    }
}

impl Timed for IdealBackend {
    fn poll_timeout(&self) -> Option<Nanos> {
        self.heap.peek().map(|r| r.0 .0)
    }
    fn handle_timeout(&mut self, now: Nanos) {
        while let Some(&Reverse((fin, id, arr, out))) = self.heap.peek() {
            if fin > now {
                break;
            }
            self.heap.pop();
            self.done.push(Done {
                id,
                arrival: arr,
                first_token: arr + self.ttft,
                finished: fin,
                output_tokens: out,
            });
        }
        self.done.reverse();
    }
}

impl Backend for IdealBackend {
    fn submit(&mut self, now: Nanos, id: u64, _input: u32, output: u32) {
        let fin = now + self.ttft + self.itl * output.saturating_sub(1) as u64;
        self.heap.push(Reverse((fin, id, now, output)));
    }
    fn poll_completion(&mut self) -> Option<Done> {
        self.done.pop()
    }
    fn utilization(&self, _now: Nanos) -> (Option<f64>, Option<f64>) {
        (None, None)
    }
    fn outstanding(&self) -> usize {
        self.heap.len()
    }
}

impl Backend for crate::server::Cluster {
    fn submit(&mut self, now: Nanos, id: u64, input_tokens: u32, output_tokens: u32) {
        crate::server::Cluster::submit(
            self,
            now,
            crate::server::Request {
                id,
                input_tokens,
                output_tokens,
            },
        );
    }
    fn poll_completion(&mut self) -> Option<Done> {
        crate::server::Cluster::poll_completion(self).map(|c| Done {
            id: c.id,
            arrival: c.arrival,
            first_token: c.first_token,
            finished: c.finished,
            output_tokens: c.output_tokens,
        })
    }
    fn utilization(&self, now: Nanos) -> (Option<f64>, Option<f64>) {
        let m = self.metrics();
        let n = m.replicas.len().max(1) as f64;
        let kv = m.replicas.iter().map(|r| r.kv_util(now)).sum::<f64>() / n;
        (Some(m.gpu_util(now)), Some(kv))
    }
    fn outstanding(&self) -> usize {
        crate::server::Cluster::outstanding(self)
    }
    fn iterations(&self) -> u64 {
        crate::server::Cluster::iterations(self)
    }
    fn step_units(&self) -> u64 {
        crate::work::step_units(self.replica_count())
    }
}

/// Per-consumer outcome of one scenario.
#[derive(Debug, Clone)]
pub struct ConsumerOutcome {
    pub name: String,
    pub floor_rpm: f64,
    /// Attempts reaching the limiter (first tries and retries).
    pub offered: u64,
    pub admitted: u64,
    pub completed: u64,
    /// Denials by limit (indexed by `Limit::index`).
    pub denied: [u64; 5],
    /// Requests that ended denied after all retries.
    pub failed: u64,
    /// Retries the SDK's hidden layer sent (counted in `offered` when they
    /// reach the limiter).
    pub sdk_retries: u64,
    /// Attempts the callers' adaptive throttle rejected before they left
    /// (not offered to the limiter).
    pub local_rejects: u64,
    pub offered_per_min: Vec<u64>,
    pub admitted_per_min: Vec<u64>,
    /// In capacity units: requests, or in `tpm` the tokens charged at
    /// admission settled on completion (unused `max_tokens` refunded, or
    /// output added), attributed to the minute of admission.
    pub offered_units_per_min: Vec<u64>,
    pub admitted_units_per_min: Vec<u64>,
}

impl ConsumerOutcome {
    pub fn rejected(&self) -> u64 {
        self.denied.iter().sum()
    }
    /// Admitted share of attempts.
    pub fn success_rate(&self) -> f64 {
        if self.offered == 0 {
            1.0
        } else {
            self.admitted as f64 / self.offered as f64
        }
    }
}

/// Server-side metrics of one scenario run.
#[derive(Debug, Clone)]
pub struct ServerOutcome {
    pub e2e: DurationHist,
    pub ttft: DurationHist,
    pub itl: DurationHist,
    pub gpu_util: Option<f64>,
    pub kv_util: Option<f64>,
    pub concurrency_mean: f64,
    pub concurrency_max: usize,
    /// Requests still inside the server when the scenario ended.
    pub outstanding_end: usize,
    pub completed: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
}

#[derive(Debug, Clone)]
pub struct ScenarioOutcome {
    pub name: String,
    pub duration: Nanos,
    pub limited: bool,
    pub consumers: Vec<ConsumerOutcome>,
    /// Full minutes in which every second — and the last second before the
    /// minute — saw a capacity denial: the limiter was binding from start to
    /// end (the first minute, which starts with full buckets, never is).
    pub saturated: Vec<bool>,
    /// Deepest use of the burst headroom (units) and the total depth.
    pub burst_used: u64,
    pub burst_depth: u64,
    pub server: ServerOutcome,
}

impl ScenarioOutcome {
    pub fn minutes(&self) -> usize {
        self.duration.div_ceil(MINUTE) as usize
    }
    pub fn admitted_in_minute(&self, m: usize) -> u64 {
        self.consumers.iter().map(|c| c.admitted_per_min[m]).sum()
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    /// Open-loop arrival for (load, consumer).
    Arrive { load: u32, consumer: u32 },
    /// Closed-loop worker sends a new request.
    Worker { load: u32, consumer: u32 },
    /// The next row of trace source `pos` of a trace load (one source per
    /// consumer it drives, or one for a trace naming its consumers).
    TraceRow { load: u32, pos: u32 },
    /// An attempt of request `req` reaches the limiter.
    Attempt { req: u32 },
    /// A 429 reaches the client: the limiter's (with its `retry_at`), or
    /// the client's own throttle's (`local`).
    Rejected {
        req: u32,
        local: bool,
        retry_at: Nanos,
    },
}

struct Req {
    consumer: u32,
    load: u32,
    /// The consumer's requests numbered in the order they started.
    row: u64,
    input: u32,
    natural: u32,
    /// The caller state machine: attempts and backoff (the core's `Call`).
    call: Call,
    grant: Option<Grant>,
    closed: bool,
    /// Minute of admission (for settling token units on completion).
    adm_min: u32,
}

fn exp_gap(rng: &mut Rng, rpm: f64) -> Nanos {
    let mean_s = 60.0 / rpm;
    crate::time::secs(-mean_s * (1.0 - unit(rng)).ln())
}

/// Key `k` of scenario `sc`'s random streams: scoped by its position in the
/// file, so running a subset (`--only`) does not change any scenario's draws.
fn scope(sc: &Scenario, k: u64) -> u64 {
    ((sc.index as u64) << 24) | k
}

/// The token lengths of `consumer`'s requests in scenario `sc` (`WORKLOAD`;
/// drawn with [`draw_lengths`]).
pub fn token_stream(seed: u64, sc: &Scenario, consumer: usize) -> Rng {
    stream(seed, scope(sc, consumer as u64), component::WORKLOAD)
}

/// The callers' draws of scenario `sc` (`CLIENT`: retry jitter and
/// throttle draws of every consumer, in event order).
pub fn client_stream(seed: u64, sc: &Scenario) -> Rng {
    stream(seed, scope(sc, 0), component::CLIENT)
}

/// One request's (input, natural output) tokens from its consumer's token
/// stream: each rounded, at least 1, the output capped at `max_tokens`.
pub fn draw_lengths(file: &SharedFile, rng: &mut Rng) -> (u32, u32) {
    let input = file.input_tokens.sample(rng).round().max(1.0) as u32;
    let natural =
        (file.output_tokens.sample(rng).round().max(1.0) as u64).min(file.max_tokens) as u32;
    (input, natural)
}

/// One candidate of an open-loop arrival stream: its time and whether the
/// thinning to the load's linear ramp keeps it (an arrival) or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub at: Nanos,
    pub accept: bool,
}

/// The open-loop arrivals of one consumer under one load line: the one rule
/// `qsim plan`'s event loop and `qsim load`'s compiled schedule both use.
///
/// The stream is `(seed, scope(1 + load·4096 + consumer), ARRIVALS)`:
/// Poisson candidates at the load's peak rate from its start, each kept
/// with probability `rate(t) / peak` (the linear ramp from `rpm` at the
/// start to `ramp_to_rpm` at the stop). The first candidate is drawn at
/// once and not held to the load's stop; every later one is, and the
/// stream ends at the first candidate at or after the stop. A caller stops
/// taking candidates at the scenario's end.
#[derive(Debug, Clone)]
pub struct OpenArrivals {
    rng: Rng,
    rpm: f64,
    ramp_to_rpm: f64,
    start: Nanos,
    stop: Nanos,
    next: Option<Nanos>,
}

impl OpenArrivals {
    /// The stream of load `load`'s consumer `consumer` in scenario `sc`;
    /// `None` for a closed-loop load or a zero rate.
    pub fn new(seed: u64, sc: &Scenario, load: usize, consumer: usize) -> Option<Self> {
        let l = &sc.loads[load];
        let Arrival::Open { rpm, ramp_to_rpm } = l.arrival else {
            return None;
        };
        let max = rpm.max(ramp_to_rpm);
        if max <= 0.0 {
            return None;
        }
        let key = scope(sc, 1 + (load as u64) * 4096 + consumer as u64);
        let mut rng = stream(seed, key, component::ARRIVALS);
        let first = l.start + exp_gap(&mut rng, max);
        Some(OpenArrivals {
            rng,
            rpm,
            ramp_to_rpm,
            start: l.start,
            stop: l.stop,
            next: Some(first),
        })
    }

    /// The time of the next candidate, if any.
    pub fn peek(&self) -> Option<Nanos> {
        self.next
    }
}

impl Iterator for OpenArrivals {
    type Item = Candidate;

    /// The next candidate; drawing its thinning and the gap to the one after.
    fn next(&mut self) -> Option<Candidate> {
        let t = self.next?;
        let max = self.rpm.max(self.ramp_to_rpm);
        let frac = (t - self.start) as f64 / (self.stop - self.start) as f64;
        let rate = self.rpm + (self.ramp_to_rpm - self.rpm) * frac;
        let accept = unit(&mut self.rng) * max < rate;
        let next = t + exp_gap(&mut self.rng, max);
        self.next = (next < self.stop).then_some(next);
        Some(Candidate { at: t, accept })
    }
}

/// One source of a trace load's rows.
pub struct TraceFeed {
    pub src: TraceSource,
    /// The consumer whose replay this is (a trace naming no consumers);
    /// `None`: each row names its own.
    pub each: Option<u32>,
}

/// The trace sources of trace load `load` of scenario `sc` (`None` for
/// another kind of load): one per consumer the load drives for a trace that
/// names none (each replays it whole), else one. Source `pos` draws the
/// trace's scale and shares from `(seed, scope(1 + load·4096 + pos), ARRIVALS)`,
/// the stream an open load's consumer would use.
pub fn trace_sources(
    file: &SharedFile,
    sc: &Scenario,
    load: usize,
    seed: u64,
) -> Option<Vec<TraceFeed>> {
    let Arrival::Trace { spec, to } = &sc.loads[load].arrival else {
        return None;
    };
    let each: Vec<Option<u32>> = match to {
        TraceTo::Each => file
            .resolve(&sc.loads[load].who)
            .into_iter()
            .map(|c| Some(c as u32))
            .collect(),
        TraceTo::Mapped(_) => vec![None],
    };
    Some(
        each.into_iter()
            .enumerate()
            .map(|(pos, each)| {
                let key = scope(sc, 1 + (load as u64) * 4096 + pos as u64);
                // the trace was read row by row when the file was loaded
                let src = TraceSource::open(spec, seed, key)
                    .unwrap_or_else(|e| panic!("the trace changed since it was checked: {e}"));
                TraceFeed { src, each }
            })
            .collect(),
    )
}

/// A trace row as the event loop takes it: time, consumer, (input, natural output).
pub type TraceRow = (Nanos, u32, (u32, u32));

/// The next request of `feed`, a source of trace load `load`, before the
/// load's stop: its time, consumer and (input, natural output) tokens, the
/// output capped at the file's `max_tokens` and each at least 1.
pub fn trace_row(
    file: &SharedFile,
    sc: &Scenario,
    load: usize,
    feed: &mut TraceFeed,
) -> Option<TraceRow> {
    let l = &sc.loads[load];
    let Arrival::Trace { to, .. } = &l.arrival else {
        return None;
    };
    let a = feed.src.pop()?;
    let at = l.start.saturating_add(a.at);
    if at >= l.stop {
        return None;
    }
    let consumer = match (feed.each, to) {
        (Some(c), _) => c,
        (None, TraceTo::Mapped(m)) => m[a.consumer as usize],
        (None, TraceTo::Each) => {
            unreachable!("a trace naming no consumers has one feed per consumer")
        }
    };
    let natural = (a.output.max(1) as u64).min(file.max_tokens) as u32;
    Some((at, consumer, (a.input.max(1), natural)))
}

/// One open-loop arrival of a scenario (a trace row carries its tokens).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArrivalAt {
    pub at: Nanos,
    pub consumer: u32,
    pub load: u32,
    /// A trace row's (input, natural output) tokens; `None`: drawn from the
    /// consumer's token stream.
    pub tokens: Option<(u32, u32)>,
}

/// Every open-loop arrival of scenario `si` before its end, in the order
/// the event loop takes them (time; equal times in load, then consumer
/// order, as the queue pops equal times in insertion order).
pub fn open_arrivals(file: &SharedFile, si: usize, seed: u64) -> Vec<ArrivalAt> {
    let sc = &file.scenarios[si];
    let mut out = Vec::new();
    for (li, l) in sc.loads.iter().enumerate() {
        for c in file.resolve(&l.who) {
            let Some(s) = OpenArrivals::new(seed, sc, li, c) else {
                continue;
            };
            out.extend(
                s.take_while(|k| k.at < sc.duration)
                    .filter(|k| k.accept)
                    .map(|k| ArrivalAt {
                        at: k.at,
                        consumer: c as u32,
                        load: li as u32,
                        tokens: None,
                    }),
            );
        }
        for mut feed in trace_sources(file, sc, li, seed).unwrap_or_default() {
            while let Some((at, consumer, tokens)) = trace_row(file, sc, li, &mut feed) {
                if at >= sc.duration {
                    break;
                }
                out.push(ArrivalAt {
                    at,
                    consumer,
                    load: li as u32,
                    tokens: Some(tokens),
                });
            }
        }
    }
    // a stable sort: equal times keep their (load, consumer) order
    out.sort_by_key(|a| a.at);
    out
}

/// Optional hooks into one scenario run (tests compare drivers with them).
#[derive(Default)]
pub struct Probe<'a> {
    /// Draw the callers' jitter and throttle draws from this stream instead
    /// of the scenario's [`client_stream`].
    pub client_rng: Option<Rng>,
    /// Hear of every attempt and what its caller did with the reply.
    pub observe: Option<&'a mut dyn FnMut(&Attempt)>,
}

/// The callers of a scenario: each load's layers, the state each
/// consumer's callers under a load share, and the stream of their draws.
struct Callers<'a> {
    policies: Vec<CallerPolicy>,
    /// Per load, per consumer.
    shared: Vec<Vec<PoolShared>>,
    rng: Rng,
    observe: Option<&'a mut dyn FnMut(&Attempt)>,
}

impl Callers<'_> {
    /// An attempt of `r` is about to leave at `now` (the throttle may say no).
    fn send(&mut self, r: &mut Req, now: Nanos) -> CallSend {
        let shared = &mut self.shared[r.load as usize][r.consumer as usize];
        r.call.on_send(now, shared, &mut draws(&mut self.rng))
    }

    /// The reply to `r`'s attempt reached its caller at `now`.
    fn reply(&mut self, r: &mut Req, now: Nanos, reply: Reply) -> Next {
        let (attempt, sdk_retry, sent) = (r.call.attempt(), r.call.sdk_retries(), r.call.sent_at());
        let policy = &self.policies[r.load as usize];
        let shared = &mut self.shared[r.load as usize][r.consumer as usize];
        let next = r
            .call
            .on_reply(now, reply, policy, shared, &mut draws(&mut self.rng));
        if let Some(o) = self.observe.as_mut() {
            o(&Attempt {
                consumer: r.consumer,
                row: r.row,
                attempt,
                sdk_retry,
                sent,
                replied: now,
                reply,
                next,
            });
        }
        next
    }
}

/// Run one scenario with the limiter (`Some`) or without one (`None`: the
/// "no limiter" counterfactual) in front of `backend`.
pub fn run_scenario(
    file: &SharedFile,
    si: usize,
    limiter: Option<&LimiterConfig>,
    backend: &mut dyn Backend,
    seed: u64,
) -> ScenarioOutcome {
    run_scenario_probed(file, si, limiter, backend, seed, Probe::default())
}

/// [`run_scenario`] with the hooks of `probe`.
pub fn run_scenario_probed(
    file: &SharedFile,
    si: usize,
    limiter: Option<&LimiterConfig>,
    backend: &mut dyn Backend,
    seed: u64,
    probe: Probe<'_>,
) -> ScenarioOutcome {
    let sc: &Scenario = &file.scenarios[si];
    let cfg = limiter.unwrap_or(&file.limiter);
    let n = cfg.consumers.len();
    let minutes = sc.duration.div_ceil(MINUTE) as usize;
    let seconds = sc.duration.div_ceil(NS_PER_SEC) as usize;
    // the configuration was validated when the file or flags were read
    let mut lim = limiter.map(|c| Limiter::new(c.clone(), 0).expect("validated limiter config"));
    let deploy = cfg.deploy_spec();
    let mut tok_rng: Vec<Rng> = (0..n).map(|c| token_stream(seed, sc, c)).collect();
    let mut arr_rng: Vec<Vec<Option<OpenArrivals>>> = Vec::new();
    let mut q: EventQueue<Ev> = EventQueue::with_capacity(1024);
    let targets: Vec<Vec<usize>> = sc.loads.iter().map(|l| file.resolve(&l.who)).collect();
    // per trace load, its sources and the row each has read ahead
    let mut traces: Vec<Vec<(TraceFeed, Option<TraceRow>)>> = Vec::new();
    for li in 0..sc.loads.len() {
        let mut v = Vec::new();
        for (pos, mut feed) in trace_sources(file, sc, li, seed)
            .unwrap_or_default()
            .into_iter()
            .enumerate()
        {
            let row = trace_row(file, sc, li, &mut feed);
            if let Some((at, ..)) = row {
                q.schedule(
                    at,
                    Ev::TraceRow {
                        load: li as u32,
                        pos: pos as u32,
                    },
                );
            }
            v.push((feed, row));
        }
        traces.push(v);
    }
    for (li, l) in sc.loads.iter().enumerate() {
        let mut rs = Vec::new();
        for &c in &targets[li] {
            let (load, consumer) = (li as u32, c as u32);
            let r = OpenArrivals::new(seed, sc, li, c);
            if let Some(t) = r.as_ref().and_then(OpenArrivals::peek) {
                q.schedule(t, Ev::Arrive { load, consumer });
            }
            if let Arrival::Closed { workers, .. } = l.arrival {
                for _ in 0..workers {
                    q.schedule(l.start, Ev::Worker { load, consumer });
                }
            }
            rs.push(r);
        }
        arr_rng.push(rs);
    }
    let mut out: Vec<ConsumerOutcome> = cfg
        .consumers
        .iter()
        .map(|c| ConsumerOutcome {
            name: c.name.clone(),
            floor_rpm: cfg.capacity as f64 * c.reserved_bp as f64 / 10_000.0,
            offered: 0,
            admitted: 0,
            completed: 0,
            denied: [0; 5],
            failed: 0,
            sdk_retries: 0,
            local_rejects: 0,
            offered_per_min: vec![0; minutes],
            admitted_per_min: vec![0; minutes],
            offered_units_per_min: vec![0; minutes],
            admitted_units_per_min: vec![0; minutes],
        })
        .collect();
    let mut cap_denied_sec = vec![false; seconds];
    let depth = lim.as_ref().map_or(0, |l| l.params().total_depth());
    let mut burst_used = 0u64;
    // requests in flight only: a slot is freed when its request ends
    let mut reqs = Slab::default();
    let mut rows = vec![0u64; n];
    let mut callers = Callers {
        policies: sc.loads.iter().map(|l| l.caller.clone()).collect(),
        shared: sc.loads.iter().map(|l| vec![l.shared.clone(); n]).collect(),
        rng: probe.client_rng.unwrap_or_else(|| client_stream(seed, sc)),
        observe: probe.observe,
    };
    let mut server = ServerOutcome {
        e2e: DurationHist::new(),
        ttft: DurationHist::new(),
        itl: DurationHist::new(),
        gpu_util: None,
        kv_util: None,
        concurrency_mean: 0.0,
        concurrency_max: 0,
        outstanding_end: 0,
        completed: 0,
        input_tokens: 0,
        output_tokens: 0,
    };
    let mut conc_integral: u128 = 0;
    let mut last_t: Nanos = 0;
    let end = sc.duration;

    let pos_of = |li: usize, c: usize| targets[li].iter().position(|&x| x == c).expect("target");

    // the engine's event-loop contract: the backend's deadline first at
    // equal times, then this driver's events FIFO; completions drained after
    // every step
    // the run-time work budget: an attempt or an engine iteration is one
    // (plus the replica scan of every step)
    let mut tally = Tally::new();
    let mut attempts = 0u64;
    let scan = backend.step_units();
    let mut steps = 0u64;
    let work = |b: &dyn Backend, attempts: u64, steps: u64| {
        UNITS_PER_REQUEST * (attempts + b.iterations()) + scan * steps
    };
    loop {
        if !tally.at(work(backend, attempts, steps)) {
            break;
        }
        steps += 1;
        let outstanding = backend.outstanding();
        let Some((now, ev)) = q.step_while(backend, |t| t < end) else {
            break;
        };
        conc_integral += outstanding as u128 * (now - last_t) as u128;
        last_t = now;
        match ev {
            None => {}
            Some(ev) => match ev {
                Ev::Arrive { load, consumer } => {
                    let p = pos_of(load as usize, consumer as usize);
                    let s = arr_rng[load as usize][p]
                        .as_mut()
                        .expect("open-loop stream");
                    let k = s.next().expect("the scheduled candidate");
                    debug_assert_eq!(k.at, now);
                    if let Some(next) = s.peek() {
                        q.schedule(next, Ev::Arrive { load, consumer });
                    }
                    if k.accept {
                        let id = new_req(
                            &mut reqs,
                            file,
                            (&mut tok_rng[consumer as usize], &mut rows),
                            (consumer, load),
                            false,
                            now,
                        );
                        q.schedule(now, Ev::Attempt { req: id });
                    }
                }
                Ev::TraceRow { load, pos } => {
                    let (li, p) = (load as usize, pos as usize);
                    let (feed, ahead) = &mut traces[li][p];
                    let (at, consumer, tokens) = ahead.take().expect("the scheduled row");
                    debug_assert_eq!(at, now);
                    *ahead = trace_row(file, sc, li, feed);
                    if let Some((next, ..)) = *ahead {
                        q.schedule(next, Ev::TraceRow { load, pos });
                    }
                    let id = insert_req(&mut reqs, &mut rows, (consumer, load), tokens, false, now);
                    q.schedule(now, Ev::Attempt { req: id });
                }
                Ev::Worker { load, consumer } => {
                    if now < sc.loads[load as usize].stop {
                        let id = new_req(
                            &mut reqs,
                            file,
                            (&mut tok_rng[consumer as usize], &mut rows),
                            (consumer, load),
                            true,
                            now,
                        );
                        q.schedule(now, Ev::Attempt { req: id });
                    }
                }
                Ev::Attempt { req } => {
                    attempts += 1;
                    let r = reqs.get_mut(req);
                    let c = r.consumer as usize;
                    if callers.send(r, now) == CallSend::LocalReject {
                        // the throttle's 429 reaches the caller at once
                        out[c].local_rejects += 1;
                        let (local, retry_at) = (true, NEVER);
                        q.schedule(
                            now,
                            Ev::Rejected {
                                req,
                                local,
                                retry_at,
                            },
                        );
                    } else {
                        let m = (now / MINUTE) as usize;
                        out[c].offered += 1;
                        out[c].offered_per_min[m] += 1;
                        let lreq = crate::limiter::admission::Request {
                            consumer: c,
                            input_tokens: r.input as u64,
                            max_tokens: file.max_tokens,
                        };
                        let units = deploy.admit_charge(lreq.cost()).0;
                        out[c].offered_units_per_min[m] += units;
                        let decision = match lim.as_mut() {
                            Some(l) => l.decide(now, &lreq),
                            None => Decision::Admit(Grant {
                                consumer: c,
                                source: crate::limiter::admission::Source::Pool,
                                input_tokens: r.input as u64,
                                max_tokens: file.max_tokens,
                                lease_until: NEVER,
                            }),
                        };
                        match decision {
                            Decision::Admit(g) => {
                                r.grant = Some(g);
                                r.adm_min = m as u32;
                                out[c].admitted += 1;
                                out[c].admitted_per_min[m] += 1;
                                out[c].admitted_units_per_min[m] += units;
                                if let Some(l) = lim.as_ref() {
                                    burst_used =
                                        burst_used.max(depth.saturating_sub(l.headroom(now)));
                                }
                                server.input_tokens += r.input as u64;
                                backend.submit(now, req as u64, r.input, r.natural);
                            }
                            Decision::Deny { limit, retry_at } => {
                                out[c].denied[limit.index()] += 1;
                                if limit == Limit::Capacity {
                                    cap_denied_sec[(now / NS_PER_SEC) as usize] = true;
                                }
                                q.schedule(
                                    now + file.reject_latency,
                                    Ev::Rejected {
                                        req,
                                        local: false,
                                        retry_at,
                                    },
                                );
                            }
                        }
                    }
                }
                Ev::Rejected {
                    req,
                    local,
                    retry_at,
                } => {
                    let r = reqs.get_mut(req);
                    let reply = if local {
                        Reply::LocalReject
                    } else {
                        let hint = (retry_at != NEVER).then(|| retry_at.saturating_sub(now));
                        Reply::Error { status: 429, hint }
                    };
                    match callers.reply(r, now, reply) {
                        Next::SendAt { at, layer } => {
                            if layer == Layer::Sdk {
                                out[r.consumer as usize].sdk_retries += 1;
                            }
                            q.schedule(at, Ev::Attempt { req })
                        }
                        Next::Done(_) => {
                            let r = reqs.free(req);
                            out[r.consumer as usize].failed += 1;
                            next_worker(&mut q, sc, &r, now);
                        }
                    }
                }
            },
        }
        // completions
        while let Some(d) = backend.poll_completion() {
            let mut r = reqs.free(d.id as u32);
            // the success reaches the caller (its throttle and quota count it)
            let done = callers.reply(&mut r, now, Reply::Ok);
            debug_assert!(matches!(done, Next::Done(_)));
            let c = r.consumer as usize;
            out[c].completed += 1;
            if let Some(g) = r.grant.as_ref() {
                // settle the admission minute's units as the limiter does
                // (the core's rule: refund unused max_tokens, charge output
                // counted on completion or above the reservation)
                let cost = crate::limiter::admission::Request {
                    consumer: c,
                    input_tokens: g.input_tokens,
                    max_tokens: g.max_tokens,
                }
                .cost();
                let (refund, extra) = deploy.settle(cost, d.output_tokens as u64);
                let u = &mut out[c].admitted_units_per_min[r.adm_min as usize];
                *u = u.saturating_sub(refund) + extra;
            }
            server.completed += 1;
            server.output_tokens += d.output_tokens as u64;
            server.e2e.record(d.finished - d.arrival);
            server.ttft.record(d.first_token - d.arrival);
            if d.output_tokens > 1 {
                server
                    .itl
                    .record((d.finished - d.first_token) / (d.output_tokens as u64 - 1));
            }
            if let (Some(l), Some(g)) = (lim.as_mut(), r.grant.as_ref()) {
                l.complete(now, g, d.output_tokens as u64);
            }
            next_worker(&mut q, sc, &r, now);
        }
        server.concurrency_max = server.concurrency_max.max(backend.outstanding());
    }
    tally.finish(work(backend, attempts, steps));
    conc_integral += backend.outstanding() as u128 * (end.saturating_sub(last_t)) as u128;
    server.concurrency_mean = conc_integral as f64 / end as f64;
    server.outstanding_end = backend.outstanding();
    let (g, k) = backend.utilization(end);
    server.gpu_util = g;
    server.kv_util = k;
    let full_minutes = (sc.duration / MINUTE) as usize;
    let saturated = (0..full_minutes)
        .map(|m| m > 0 && cap_denied_sec[m * 60 - 1..(m + 1) * 60].iter().all(|&x| x))
        .collect();
    ScenarioOutcome {
        name: sc.name.clone(),
        duration: sc.duration,
        limited: limiter.is_some(),
        consumers: out,
        saturated,
        burst_used,
        burst_depth: depth,
        server,
    }
}

/// A closed-loop request ended (completed, or failed after its retries):
/// its worker sends the next one after its think time.
fn next_worker(q: &mut EventQueue<Ev>, sc: &Scenario, r: &Req, now: Nanos) {
    if let Arrival::Closed { think, .. } = sc.loads[r.load as usize].arrival {
        if r.closed {
            let (load, consumer) = (r.load, r.consumer);
            q.schedule(now + think, Ev::Worker { load, consumer });
        }
    }
}

/// The requests in flight, in reusable slots: memory is bounded by what is
/// in flight, not by how many requests a scenario has seen.
#[derive(Default)]
struct Slab {
    slots: Vec<Option<Req>>,
    free: Vec<u32>,
}

impl Slab {
    fn insert(&mut self, r: Req) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = Some(r);
                i
            }
            None => {
                self.slots.push(Some(r));
                (self.slots.len() - 1) as u32
            }
        }
    }
    fn get_mut(&mut self, i: u32) -> &mut Req {
        self.slots[i as usize].as_mut().expect("request in flight")
    }
    fn free(&mut self, i: u32) -> Req {
        let r = self.slots[i as usize].take().expect("request in flight");
        self.free.push(i);
        r
    }
}

fn new_req(
    reqs: &mut Slab,
    file: &SharedFile,
    (rng, rows): (&mut Rng, &mut [u64]),
    (consumer, load): (u32, u32),
    closed: bool,
    now: Nanos,
) -> u32 {
    let lengths = draw_lengths(file, rng);
    insert_req(reqs, rows, (consumer, load), lengths, closed, now)
}

/// A new request of `consumer` with (input, natural output) tokens `lengths`,
/// numbered in its consumer's order.
fn insert_req(
    reqs: &mut Slab,
    rows: &mut [u64],
    (consumer, load): (u32, u32),
    (input, natural): (u32, u32),
    closed: bool,
    now: Nanos,
) -> u32 {
    let row = rows[consumer as usize];
    rows[consumer as usize] += 1;
    reqs.insert(Req {
        consumer,
        load,
        row,
        input,
        natural,
        call: Call::start(now),
        grant: None,
        closed,
        adm_min: 0,
    })
}
