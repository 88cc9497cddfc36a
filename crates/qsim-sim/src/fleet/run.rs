//! The fleet driver: one event queue, the workload's arrivals, the
//! [`Fleet`] as the component with deadlines (the engine's event-loop
//! contract). Results per pool and over the fleet; memory is the requests
//! in flight (no per-request storage after a request leaves).

use super::workload::{Arrival, Requests, Workload};
use super::{Fleet, FleetCompletion, FleetSpec};
use crate::config::ConfigError;
use crate::engine::{DurationHist, EventQueue};
use crate::server::{PrefixStats, ReplicaMetrics, Request};
use crate::time::{Nanos, NEVER};
use crate::work::{step_units, Tally, UNITS_PER_REQUEST};

/// What a run does besides the fleet and workload.
#[derive(Debug, Clone, Copy)]
pub struct RunOpts {
    /// Arrivals stop at this time.
    pub duration: Nanos,
    /// After the last arrival, run until every request left.
    pub drain: bool,
    /// Requests arriving before this are left out of the percentiles.
    pub warmup: Nanos,
    /// At most this many requests.
    pub max_requests: u64,
    /// Advance replicas only as routing needs (off in tests, as the
    /// reference it is compared with).
    pub lazy: bool,
}

impl RunOpts {
    pub fn new(duration: Nanos) -> Self {
        RunOpts {
            duration,
            drain: true,
            warmup: 0,
            max_requests: u64::MAX,
            lazy: true,
        }
    }
}

/// Watches a run from outside (checkers, per-request tables); watching
/// changes nothing.
pub trait Observer {
    /// A request arrived (with its block hashes) and went to (pool,
    /// replica) (`None`: no pool serves it).
    fn routed(&mut self, _id: u64, _a: &Arrival, _hashes: &[u64], _to: Option<(usize, u32)>) {}
    /// A request left the fleet.
    fn completed(&mut self, _c: &FleetCompletion) {}
    /// Called after every step with the fleet as it is then (only when
    /// [`Observer::steps`] is true).
    fn step(&mut self, _now: Nanos, _fleet: &Fleet) {}
    fn steps(&self) -> bool {
        false
    }
    /// The run may stop now (e.g. an evaluation already lost); asked
    /// every 256 steps.
    fn stop(&self) -> bool {
        false
    }
}

/// Watches nothing.
pub struct Nobody;
impl Observer for Nobody {}

/// Latencies of the requests that arrived after the warm-up.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    pub ttft: DurationHist,
    pub e2e: DurationHist,
    /// Per request: (finished − first token) / (output − 1).
    pub tpot: DurationHist,
    pub completed: u64,
    pub rejected: u64,
}

impl Latencies {
    fn record(&mut self, c: &crate::server::Completion) {
        if c.rejected {
            self.rejected += 1;
            return;
        }
        self.completed += 1;
        self.ttft.record(c.first_token - c.arrival);
        self.e2e.record(c.finished - c.arrival);
        if c.output_tokens > 1 {
            self.tpot
                .record((c.finished - c.first_token) / (c.output_tokens as u64 - 1));
        }
    }

    fn merge(&mut self, o: &Latencies) {
        self.ttft.merge(&o.ttft);
        self.e2e.merge(&o.e2e);
        self.tpot.merge(&o.tpot);
        self.completed += o.completed;
        self.rejected += o.rejected;
    }
}

/// One pool's results.
#[derive(Debug, Clone)]
pub struct PoolResult {
    pub name: String,
    /// Requests routed to the pool.
    pub routed: u64,
    pub lat: Latencies,
    /// The replicas' metrics summed (ITL: every token gap of the run).
    pub metrics: ReplicaMetrics,
    /// Replica-nanoseconds holding a GPU, and the most replicas at once.
    pub replica_ns: u128,
    pub replicas_max: u64,
    pub cost_usd: f64,
    /// Requests still inside at the end.
    pub unfinished: u64,
    /// The replicas' prefix caches, summed.
    pub prefix: PrefixStats,
}

/// A run's results.
#[derive(Debug, Clone)]
pub struct FleetResult {
    /// The time the results are read at.
    pub until: Nanos,
    pub pools: Vec<PoolResult>,
    /// Over every pool.
    pub lat: Latencies,
    /// Requests no pool served.
    pub unrouted: u64,
    pub arrivals: u64,
    pub cost_usd: f64,
    /// Prefill/decode disaggregation's counters (zeros without).
    pub disagg: super::DisaggStats,
}

impl FleetResult {
    /// Prefix caches over the fleet.
    pub fn prefix(&self) -> PrefixStats {
        let mut t = PrefixStats::default();
        for p in &self.pools {
            t.units += p.prefix.units;
            t.hit_units += p.prefix.hit_units;
            t.saved_tokens += p.prefix.saved_tokens;
        }
        t
    }

    /// Every token gap of the run over the fleet (ITL).
    pub fn itl(&self) -> DurationHist {
        let mut h = DurationHist::new();
        for p in &self.pools {
            h.merge(&p.metrics.itl);
        }
        h
    }
}

#[derive(Debug, Clone, Copy)]
enum Ev {
    Arrival,
}

/// Run `fleet` under `workload` with `seed`.
pub fn run(
    fleet: &FleetSpec,
    workload: &Workload,
    opts: RunOpts,
    seed: u64,
) -> Result<FleetResult, ConfigError> {
    run_observed(fleet, workload, opts, seed, &mut Nobody)
}

/// [`run`], handing what happens to `obs`.
pub fn run_observed(
    spec: &FleetSpec,
    workload: &Workload,
    opts: RunOpts,
    seed: u64,
    obs: &mut dyn Observer,
) -> Result<FleetResult, ConfigError> {
    let mut fleet = Fleet::new(spec, seed);
    let mut src = Requests::new(workload, seed, opts.duration, opts.max_requests)?;
    let mut q: EventQueue<Ev> = EventQueue::new();
    if let Some(t) = src.peek() {
        q.schedule(t, Ev::Arrival);
    }
    if opts.lazy {
        fleet.advance_lazily();
    }
    let npools = spec.pools.len();
    let mut lat: Vec<Latencies> = vec![Latencies::default(); npools];
    let mut routed = vec![0u64; npools];
    let mut next_id = 0u64;
    let mut last = 0;
    let mut tally = Tally::new();
    let scan = step_units(fleet.replica_count());
    let mut steps = 0u64;
    let work = |f: &Fleet, sent: u64, steps: u64| {
        UNITS_PER_REQUEST * (sent + f.iterations()) + scan * steps
    };
    let end = opts.duration;
    let watch = obs.steps();
    loop {
        if !tally.at(work(&fleet, next_id, steps)) || (steps & 255 == 0 && obs.stop()) {
            break;
        }
        steps += 1;
        let draining = opts.drain && fleet.outstanding() > 0;
        let go = |t| t <= end || draining;
        let step = q.step_through(&mut fleet, go, if opts.drain { NEVER } else { end });
        let Some((now, ev)) = step else {
            break;
        };
        if let Some(Ev::Arrival) = ev {
            let a = src.pop().expect("peeked arrival");
            let id = next_id;
            next_id += 1;
            let to = fleet.submit(
                a.at,
                Request {
                    id,
                    input_tokens: a.input,
                    output_tokens: a.output,
                },
                a.model,
                src.hashes(),
            );
            if let Some((p, _)) = to {
                routed[p] += 1;
            }
            obs.routed(id, &a, src.hashes(), to);
            if let Some(t) = src.peek() {
                q.schedule(t, Ev::Arrival);
            }
        }
        last = now;
        while let Some(c) = fleet.poll_completion() {
            obs.completed(&c);
            if c.c.arrival >= opts.warmup {
                lat[c.pool as usize].record(&c.c);
            }
        }
        if watch {
            obs.step(now, &fleet);
        }
    }
    tally.finish(work(&fleet, next_id, steps));
    let until = if opts.drain { last.max(end) } else { end };
    fleet.settle(until);
    let mut total = Latencies::default();
    let mut pools = Vec::with_capacity(npools);
    let mut cost = 0.0;
    for (p, ps) in spec.pools.iter().enumerate() {
        let c = fleet.cluster(p);
        let closed = ps.replicas == 0 && ps.autoscale.is_none();
        let replica_ns = if closed {
            0
        } else {
            c.gpu_replicas().area(until)
        };
        let usd = replica_ns as f64 / 3.6e12 * ps.replica_hour_usd;
        cost += usd;
        total.merge(&lat[p]);
        pools.push(PoolResult {
            name: ps.name.clone(),
            routed: routed[p],
            lat: std::mem::take(&mut lat[p]),
            metrics: c.metrics().total(until),
            replica_ns,
            replicas_max: if closed { 0 } else { c.gpu_replicas().max },
            cost_usd: usd,
            unfinished: c.outstanding() as u64,
            prefix: c.prefix_stats(),
        });
    }
    Ok(FleetResult {
        until,
        pools,
        lat: total,
        unrouted: fleet.unrouted(),
        arrivals: next_id,
        cost_usd: cost,
        disagg: fleet.disagg_stats(),
    })
}
