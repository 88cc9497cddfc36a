//! The GPU inference server model (sans-IO, quinn-proto style).
//!
//! A [`Cluster`] is N replicas of one [`ServerProfile`] behind a router.
//! Each replica is a vLLM-style engine: a waiting queue, a running batch
//! bounded by `max_num_seqs` and `max_batched_tokens` (optionally with
//! chunked prefill), a paged KV cache with recompute preemption of the newest
//! request, and an iteration-time model (see [`profile`]).
//!
//! The driver calls [`Cluster::submit`] on arrivals, [`Cluster::handle_timeout`]
//! at [`Cluster::poll_timeout`], and drains [`Cluster::poll_completion`].
//! One deadline per replica (the end of its iteration in flight); no
//! per-token events. A request's state lives only while it is in the server.

pub mod metrics;
mod prefix;
pub mod profile;
mod replica;
mod request;

pub use metrics::{ClusterMetrics, ReplicaMetrics, TimeAvg};
pub use prefix::PrefixStats;
pub use profile::{load_profile, IterationModel, ServerProfile};
pub use request::{Completion, Request};

use crate::engine::rng::{component, stream, Rng};
use crate::time::{Nanos, NEVER};
use qsim_core::autoscale::{Autoscaler, Observation, Params as AutoscaleParams};
use qsim_core::route::{Policy, Router, Targets};
use replica::Replica;
#[cfg(test)]
pub(crate) use replica::{reference_batches, RUN_FINISHES};
use std::collections::VecDeque;
use std::sync::Arc;

/// How arrivals are spread over replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouterKind {
    RoundRobin,
    /// Fewest requests waiting + running (ties broken at random).
    LeastOutstanding,
    /// Fewest KV blocks in use (ties: fewest outstanding, then at random).
    LeastKv,
}

impl RouterKind {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "round_robin" => Some(RouterKind::RoundRobin),
            "least_outstanding" => Some(RouterKind::LeastOutstanding),
            "least_kv" => Some(RouterKind::LeastKv),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RouterKind::RoundRobin => "round_robin",
            RouterKind::LeastOutstanding => "least_outstanding",
            RouterKind::LeastKv => "least_kv",
        }
    }

    /// The core's routing policy this configuration names.
    pub fn policy(self) -> Policy {
        match self {
            RouterKind::RoundRobin => Policy::RoundRobin,
            RouterKind::LeastOutstanding => Policy::LeastOutstanding,
            RouterKind::LeastKv => Policy::LeastKv,
        }
    }
}

/// Where a replica slot is in its life (autoscaling; without it every
/// replica is `Ready` for the whole run).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    /// Cold-starting: holds a GPU, serves from the given time.
    Starting(Nanos),
    Ready,
    /// Being removed: no new requests; gone when empty.
    Draining,
    /// Free slot (reused by the next replica started).
    Gone,
}

/// A step in the replicas' lives, for timelines and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScaleEvent {
    pub at: Nanos,
    pub replica: u32,
    /// `start` (cold start begins), `ready`, `cancel` (a starting replica
    /// no longer wanted), `drain` (no new requests), `removed` (empty).
    pub what: &'static str,
}

/// The autoscaler and the replicas' lives, when the cluster autoscales.
struct Scaling {
    auto: Autoscaler,
    life: Vec<Life>,
    /// Earliest `Starting` time (NEVER if none).
    next_ready: Nanos,
    draining: u32,
    log: Vec<ScaleEvent>,
}

/// The replicas as the core's router sees them, every one ready; the
/// request's block hashes and prompt length for prefix matches.
struct AllReady<'a> {
    r: &'a [Replica],
    total: u64,
    hashes: &'a [u64],
    prompt: u32,
}

/// Replica `r`'s cached leading units of a request, and its full units.
#[inline]
fn prefix_hit(r: &Replica, hashes: &[u64], prompt: u32) -> (u64, u64) {
    match &r.prefix {
        Some(pc) if !hashes.is_empty() => pc.peek(hashes, prompt),
        _ => (0, 0),
    }
}

impl Targets for AllReady<'_> {
    #[inline]
    fn len(&self) -> usize {
        self.r.len()
    }
    #[inline]
    fn outstanding(&self, i: usize) -> u64 {
        self.r[i].outstanding() as u64
    }
    #[inline]
    fn waiting(&self, i: usize) -> u64 {
        self.r[i].waiting_len() as u64
    }
    #[inline]
    fn kv(&self, i: usize) -> (u64, u64) {
        (self.r[i].blocks_in_use() as u64, self.total)
    }
    fn prefix_hit(&self, i: usize) -> (u64, u64) {
        prefix_hit(&self.r[i], self.hashes, self.prompt)
    }
}

/// The replicas of an autoscaled cluster: only `Ready` ones take requests.
struct Serving<'a> {
    r: &'a [Replica],
    life: &'a [Life],
    total: u64,
    hashes: &'a [u64],
    prompt: u32,
}

impl Targets for Serving<'_> {
    #[inline]
    fn len(&self) -> usize {
        self.r.len()
    }
    #[inline]
    fn open(&self, i: usize) -> bool {
        self.life[i] == Life::Ready
    }
    #[inline]
    fn outstanding(&self, i: usize) -> u64 {
        self.r[i].outstanding() as u64
    }
    #[inline]
    fn waiting(&self, i: usize) -> u64 {
        self.r[i].waiting_len() as u64
    }
    #[inline]
    fn kv(&self, i: usize) -> (u64, u64) {
        (self.r[i].blocks_in_use() as u64, self.total)
    }
    fn prefix_hit(&self, i: usize) -> (u64, u64) {
        prefix_hit(&self.r[i], self.hashes, self.prompt)
    }
}

/// N replicas of one profile behind a router.
pub struct Cluster {
    profile: Arc<ServerProfile>,
    replicas: Vec<Replica>,
    /// The core's router over the replicas; ties are drawn from `rng`.
    router: Router,
    rng: Rng,
    done: VecDeque<Completion>,
    metrics: ClusterMetrics,
    now: Nanos,
    /// Engine iterations finished by every replica (the work budget's count).
    iterations: u64,
    /// Requests waiting or running over every replica, kept as they change
    /// (drivers read it every step; a sum over thousands of replicas is slow).
    outstanding: usize,
    /// Requests submitted (the autoscaler's request rate).
    arrivals: u64,
    /// Replicas holding a GPU (starting, ready or draining) and ready ones.
    gpus: TimeAvg,
    ready: TimeAvg,
    scaling: Option<Scaling>,
    /// The earliest of the replicas' deadlines, and each replica's, kept as
    /// they change (read only without autoscaling, whose replicas come and go).
    next_deadline: Nanos,
    deadlines: Vec<Nanos>,
    /// Replicas advanced only as far as routing needs (see
    /// [`advance_lazily`](Self::advance_lazily)): `deadlines` then holds
    /// each replica's [`Replica::leave_bound`].
    lazy: bool,
    /// Tokens per block hash when the replicas cache prefixes.
    prefix_unit: Option<u32>,
}

impl Cluster {
    /// `replicas` copies of `profile` (at least one) behind `router`. The
    /// model is deterministic; `seed` only breaks routing ties at random.
    pub fn new(profile: Arc<ServerProfile>, replicas: u32, router: RouterKind, seed: u64) -> Self {
        Self::with_policy(profile, replicas, router.policy(), seed)
    }

    /// [`new`](Self::new) with any of the core's routing policies over the
    /// replicas (the fleet's pools: scorers, spillover).
    pub fn with_policy(
        profile: Arc<ServerProfile>,
        replicas: u32,
        policy: Policy,
        seed: u64,
    ) -> Self {
        let n = replicas.max(1);
        Cluster {
            replicas: (0..n).map(|i| Replica::new(i, profile.clone())).collect(),
            router: Router::new(policy),
            rng: stream(seed, 0, component::ROUTER),
            done: VecDeque::new(),
            metrics: ClusterMetrics {
                replicas: (0..n)
                    .map(|_| ReplicaMetrics::new(profile.total_blocks))
                    .collect(),
            },
            now: 0,
            iterations: 0,
            outstanding: 0,
            arrivals: 0,
            gpus: {
                let mut g = TimeAvg::default();
                g.set(0, n as u64);
                g
            },
            ready: {
                let mut g = TimeAvg::default();
                g.set(0, n as u64);
                g
            },
            scaling: None,
            next_deadline: NEVER,
            deadlines: vec![NEVER; n as usize],
            lazy: false,
            prefix_unit: None,
            profile,
        }
    }

    /// Every replica (and every replica started later) caches prefixes in
    /// units of `unit` tokens, a multiple of the profile's block size.
    pub fn with_prefix_cache(mut self, unit: u32) -> Self {
        assert!(unit > 0 && unit.is_multiple_of(self.profile.block_size));
        self.prefix_unit = Some(unit);
        for r in &mut self.replicas {
            *r = Replica::new(r.idx, self.profile.clone()).with_prefix_cache(unit);
        }
        self
    }

    fn new_replica(&self, i: u32) -> Replica {
        let r = Replica::new(i, self.profile.clone());
        match self.prefix_unit {
            Some(u) => r.with_prefix_cache(u),
            None => r,
        }
    }

    /// Autoscale from time 0 with `p` (already checked): the cluster starts
    /// with `p.min` replicas ready, whatever it was built with.
    pub fn with_autoscaler(mut self, p: AutoscaleParams) -> Self {
        let n = p.min.max(1);
        self.replicas = (0..n).map(|i| self.new_replica(i)).collect();
        self.metrics.replicas = (0..n)
            .map(|_| ReplicaMetrics::new(self.profile.total_blocks))
            .collect();
        self.gpus = TimeAvg::default();
        self.gpus.set(0, n as u64);
        self.ready = TimeAvg::default();
        self.ready.set(0, n as u64);
        self.scaling = Some(Scaling {
            auto: Autoscaler::new(p, 0),
            life: vec![Life::Ready; n as usize],
            next_ready: NEVER,
            draining: 0,
            log: Vec::new(),
        });
        self
    }

    /// Advance a replica only when a request may leave it by the time
    /// asked (its [`Replica::leave_bound`]), or when one is submitted to it,
    /// instead of at every deadline: the router (least outstanding, round
    /// robin) sees the same counts, because a replica's outstanding count
    /// changes only when a request leaves it or is submitted. Replicas do
    /// not interact between submissions, so each runs the same iterations,
    /// later and in longer runs; the completions of a
    /// [`handle_through`](Self::handle_through) up to `limit` are the same
    /// (none is due before its replica's bound) in the same order. For an
    /// open-loop driver only (nothing but submissions in between), and
    /// only without autoscaling and with a router that reads outstanding
    /// counts alone (`Policy::reads_outstanding_only`; not `least_kv`: KV
    /// blocks change every step); else nothing changes. A replica's other state (metrics, queues, KV) may
    /// then lag behind: [`settle`](Self::settle) brings every replica to a
    /// time before it is read.
    pub fn advance_lazily(&mut self) {
        if self.scaling.is_some() || !self.router.policy().reads_outstanding_only() || self.lazy {
            return;
        }
        self.lazy = true;
        self.refresh_deadlines();
    }

    /// Every replica's entry in `deadlines` and their minimum, afresh.
    fn refresh_deadlines(&mut self) {
        self.deadlines.resize(self.replicas.len(), NEVER);
        let mut next = NEVER;
        for (r, d) in self.replicas.iter().zip(self.deadlines.iter_mut()) {
            *d = if self.lazy {
                r.leave_bound()
            } else {
                r.deadline()
            };
            next = next.min(*d);
        }
        self.next_deadline = next;
    }

    /// Advance every replica to `now` (everything due by then run), as the
    /// step-by-step run has it at `now`; nothing to do unless
    /// [`advance_lazily`](Self::advance_lazily). Call it before reading the
    /// replicas' state after `handle_through` (nothing leaves a replica
    /// here: its bound is after `now`).
    pub fn settle(&mut self, now: Nanos) {
        if !self.lazy {
            return;
        }
        let now = now.min(NEVER - 1);
        let done = self.done.len();
        for (r, m) in self
            .replicas
            .iter_mut()
            .zip(self.metrics.replicas.iter_mut())
        {
            if r.deadline() <= now {
                let (before, out) = (m.iterations, r.outstanding());
                r.advance(now, &mut self.done, m);
                self.iterations += m.iterations - before;
                debug_assert_eq!(r.outstanding(), out);
            }
        }
        debug_assert_eq!(self.done.len(), done, "nothing leaves before its bound");
        self.now = self.now.max(now);
        self.refresh_deadlines();
    }

    /// The replicas' lives so far (empty without autoscaling).
    pub fn scale_log(&self) -> &[ScaleEvent] {
        self.scaling.as_ref().map_or(&[], |s| &s.log)
    }

    /// Replicas holding a GPU over time (starting, ready or draining):
    /// `area(until)` is GPU-nanoseconds.
    pub fn gpu_replicas(&self) -> &TimeAvg {
        &self.gpus
    }

    /// Replicas ready to serve over time.
    pub fn ready_replicas(&self) -> &TimeAvg {
        &self.ready
    }

    /// The autoscaler's work at `now`: replicas whose cold start ended
    /// serve, empty draining replicas go, and at its ticks it samples the
    /// cluster and its decisions are carried out.
    fn scale(&mut self, now: Nanos) {
        let Some(sc) = self.scaling.as_mut() else {
            return;
        };
        if sc.next_ready <= now {
            let mut next = NEVER;
            for (i, l) in sc.life.iter_mut().enumerate() {
                if let Life::Starting(at) = *l {
                    if at <= now {
                        *l = Life::Ready;
                        sc.log.push(ScaleEvent {
                            at,
                            replica: i as u32,
                            what: "ready",
                        });
                        self.ready.set(at, self.ready.value() + 1);
                    } else {
                        next = next.min(at);
                    }
                }
            }
            sc.next_ready = next;
        }
        if sc.draining > 0 {
            self.remove_empty(now);
        }
        loop {
            let sc = self.scaling.as_mut().expect("scaling");
            let tick = sc.auto.poll_timeout();
            if tick > now {
                break;
            }
            let mut obs = Observation {
                arrivals: self.arrivals,
                ..Default::default()
            };
            for (i, r) in self.replicas.iter().enumerate() {
                if matches!(sc.life[i], Life::Ready | Life::Draining) {
                    obs.waiting += r.waiting_len() as f64;
                    obs.outstanding += r.outstanding() as f64;
                    obs.kv_use += r.blocks_in_use() as f64 / self.profile.total_blocks as f64;
                }
            }
            let Some(d) = sc.auto.on_tick(tick, &obs) else {
                continue;
            };
            if d.to > d.from {
                for _ in d.from..d.to {
                    let i = match sc.life.iter().position(|l| *l == Life::Gone) {
                        Some(i) => i,
                        None => {
                            sc.life.push(Life::Gone);
                            let r = match self.prefix_unit {
                                Some(u) => {
                                    Replica::new(self.replicas.len() as u32, self.profile.clone())
                                        .with_prefix_cache(u)
                                }
                                None => {
                                    Replica::new(self.replicas.len() as u32, self.profile.clone())
                                }
                            };
                            self.replicas.push(r);
                            self.metrics
                                .replicas
                                .push(ReplicaMetrics::new(self.profile.total_blocks));
                            sc.life.len() - 1
                        }
                    };
                    self.replicas[i] = match self.prefix_unit {
                        Some(u) => {
                            Replica::new(i as u32, self.profile.clone()).with_prefix_cache(u)
                        }
                        None => Replica::new(i as u32, self.profile.clone()),
                    };
                    sc.life[i] = Life::Starting(d.ready_at);
                    sc.next_ready = sc.next_ready.min(d.ready_at);
                    sc.log.push(ScaleEvent {
                        at: d.at,
                        replica: i as u32,
                        what: "start",
                    });
                    self.gpus.set(d.at, self.gpus.value() + 1);
                }
            } else {
                for _ in d.to..d.from {
                    // a replica still starting goes first (the latest to be
                    // ready), else the ready replica with the fewest requests
                    // (ties: the highest slot)
                    let starting = (0..sc.life.len())
                        .filter_map(|i| match sc.life[i] {
                            Life::Starting(at) => Some((at, i)),
                            _ => None,
                        })
                        .max();
                    if let Some((_, i)) = starting {
                        sc.life[i] = Life::Gone;
                        sc.log.push(ScaleEvent {
                            at: d.at,
                            replica: i as u32,
                            what: "cancel",
                        });
                        self.gpus.set(d.at, self.gpus.value() - 1);
                        continue;
                    }
                    let i = (0..sc.life.len())
                        .filter(|&i| sc.life[i] == Life::Ready)
                        .min_by_key(|&i| (self.replicas[i].outstanding(), std::cmp::Reverse(i)))
                        .expect("a ready replica to drain");
                    sc.life[i] = Life::Draining;
                    sc.draining += 1;
                    sc.log.push(ScaleEvent {
                        at: d.at,
                        replica: i as u32,
                        what: "drain",
                    });
                    self.ready.set(d.at, self.ready.value() - 1);
                }
                let sc = self.scaling.as_mut().expect("scaling");
                sc.next_ready = sc
                    .life
                    .iter()
                    .filter_map(|l| match l {
                        Life::Starting(at) => Some(*at),
                        _ => None,
                    })
                    .min()
                    .unwrap_or(NEVER);
                self.remove_empty(now);
            }
        }
    }

    /// Draining replicas with nothing left are removed at `now`.
    fn remove_empty(&mut self, now: Nanos) {
        let sc = self.scaling.as_mut().expect("scaling");
        for (i, l) in sc.life.iter_mut().enumerate() {
            if *l == Life::Draining && self.replicas[i].outstanding() == 0 {
                *l = Life::Gone;
                sc.draining -= 1;
                sc.log.push(ScaleEvent {
                    at: now,
                    replica: i as u32,
                    what: "removed",
                });
                self.gpus.set(now, self.gpus.value() - 1);
            }
        }
    }

    pub fn profile(&self) -> &ServerProfile {
        &self.profile
    }

    pub fn replica_count(&self) -> u32 {
        self.replicas.len() as u32
    }

    /// The replica the core's router picks (ties drawn from the ROUTER
    /// stream, `gen_range(0..n)`, only when the router asks).
    fn pick(&mut self, hashes: &[u64], prompt: u32) -> usize {
        if self.replicas.len() == 1 {
            return 0;
        }
        // every slot ready (or no autoscaler): no replica is closed
        let life = self
            .scaling
            .as_ref()
            .filter(|s| self.ready.value() as usize != s.life.len())
            .map(|s| &s.life[..]);
        let rng = &mut self.rng;
        let mut below = |n: u64| {
            use rand::Rng as _;
            rng.gen_range(0..n as usize) as u64
        };
        let total = self.profile.total_blocks as u64;
        let i = match life {
            None => self.router.pick(
                &AllReady {
                    r: &self.replicas,
                    total,
                    hashes,
                    prompt,
                },
                &mut below,
            ),
            Some(life) => self.router.pick(
                &Serving {
                    r: &self.replicas,
                    life,
                    total,
                    hashes,
                    prompt,
                },
                &mut below,
            ),
        };
        i.expect("a ready replica")
    }

    /// A request arrives at `now` (a time before the cluster's clock is
    /// taken as the clock: time never runs backwards).
    pub fn submit(&mut self, now: Nanos, req: Request) {
        let now = now.max(self.now);
        self.handle_timeout(now);
        let i = self.pick(&[], req.input_tokens);
        self.submit_at(now, i, req, &[], 0);
    }

    /// [`submit`](Self::submit) with the prompt's block `hashes` (prefix
    /// caches and prefix-aware routing read them) and `precomputed` prompt
    /// tokens whose KV comes with the request (a disaggregated decode).
    /// Returns the replica it went to.
    pub fn submit_hashed(
        &mut self,
        now: Nanos,
        req: Request,
        hashes: &[u64],
        precomputed: u32,
    ) -> u32 {
        let now = now.max(self.now);
        self.handle_timeout(now);
        let i = self.pick(hashes, req.input_tokens);
        self.submit_at(now, i, req, hashes, precomputed);
        i as u32
    }

    /// The replica the router would pick now for a request (its block
    /// hashes, its prompt length): decode-first routing chooses the decode
    /// replica before the prefill runs. The router's state moves on (a
    /// round-robin position, a draw) as if the request were submitted.
    pub fn choose(&mut self, now: Nanos, hashes: &[u64], prompt: u32) -> u32 {
        let now = now.max(self.now);
        self.handle_timeout(now);
        self.pick(hashes, prompt) as u32
    }

    /// Submit to replica `i` (chosen by [`choose`](Self::choose); a replica
    /// no longer taking requests: the router picks again).
    pub fn submit_on(
        &mut self,
        now: Nanos,
        i: u32,
        req: Request,
        hashes: &[u64],
        precomputed: u32,
    ) {
        let now = now.max(self.now);
        self.handle_timeout(now);
        let i = i as usize;
        let ok = i < self.replicas.len()
            && self
                .scaling
                .as_ref()
                .is_none_or(|s| s.life[i] == Life::Ready);
        let i = if ok {
            i
        } else {
            self.pick(hashes, req.input_tokens)
        };
        self.submit_at(now, i, req, hashes, precomputed);
    }

    #[inline(always)]
    fn submit_at(&mut self, now: Nanos, i: usize, req: Request, hashes: &[u64], precomputed: u32) {
        self.arrivals += 1;
        let r = &mut self.replicas[i];
        let m = &mut self.metrics.replicas[i];
        if self.lazy && r.deadline() <= now {
            // as far as the step-by-step run has it (nothing leaves: its
            // bound is after `now`, or handle_timeout had advanced it)
            let (before, done) = (m.iterations, self.done.len());
            r.advance(now, &mut self.done, m);
            self.iterations += m.iterations - before;
            debug_assert_eq!(self.done.len(), done);
        }
        let before = r.outstanding();
        r.submit_with(now, req, hashes, precomputed, &mut self.done, m);
        self.outstanding = self.outstanding + r.outstanding() - before;
        if self.lazy {
            // the bound may move either way (the replica was advanced)
            let (old, new) = (self.deadlines[i], r.leave_bound());
            self.deadlines[i] = new;
            if new <= self.next_deadline {
                self.next_deadline = new;
            } else if old == self.next_deadline {
                self.next_deadline = self.deadlines.iter().copied().min().unwrap_or(NEVER);
            }
        } else if self.scaling.is_none() {
            // a submission only brings a replica's deadline forward
            self.deadlines[i] = r.deadline();
            self.next_deadline = self.next_deadline.min(self.deadlines[i]);
        }
    }

    /// The next internal deadline (the earliest iteration end or API ingress).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let t = match &self.scaling {
            None => self.next_deadline,
            Some(sc) => self
                .replicas
                .iter()
                .map(Replica::deadline)
                .min()
                .unwrap_or(NEVER)
                .min(sc.next_ready)
                .min(sc.auto.poll_timeout()),
        };
        debug_assert!(
            self.scaling.is_some()
                || t == self
                    .replicas
                    .iter()
                    .map(|r| if self.lazy {
                        r.leave_bound()
                    } else {
                        r.deadline()
                    })
                    .min()
                    .unwrap_or(NEVER)
        );
        (t != NEVER).then_some(t)
    }

    /// Advance every replica to `now`: finish iterations, start the next ones.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        if self.scaling.is_none() && now < self.next_deadline {
            // nothing due (and no autoscaler to run)
            return;
        }
        if self.lazy {
            // the replicas a request may leave by `now`
            self.handle_through(self.next_deadline, now);
            return;
        }
        let mut next = NEVER;
        self.deadlines.resize(self.replicas.len(), NEVER);
        for ((r, m), d) in self
            .replicas
            .iter_mut()
            .zip(self.metrics.replicas.iter_mut())
            .zip(self.deadlines.iter_mut())
        {
            if r.deadline() <= now {
                let (before, out) = (m.iterations, r.outstanding());
                r.advance(now, &mut self.done, m);
                self.iterations += m.iterations - before;
                self.outstanding = self.outstanding + r.outstanding() - out;
            }
            *d = r.deadline();
            next = next.min(*d);
        }
        self.next_deadline = next;
        self.scale(now);
    }

    /// Every deadline from `next` (the earliest, see
    /// [`poll_timeout`](Self::poll_timeout)) up to `limit`, exactly as
    /// [`handle_timeout`](Self::handle_timeout) at each in time order would
    /// run them: between two arrivals the replicas do not interact, so each
    /// runs its own iterations up to `limit` in one go (no round trip per
    /// iteration through the driver), and the completions of the replicas
    /// are put back in the order the step-by-step run gives (by finishing
    /// time, then replica). Returns the time of the last deadline run. An
    /// autoscaled cluster (its ticks look at every replica) runs `next` only.
    pub fn handle_through(&mut self, next: Nanos, limit: Nanos) -> Nanos {
        if self.scaling.is_some() {
            self.handle_timeout(next);
            return next;
        }
        // a replica's `advance` takes a time before NEVER
        let limit = limit.min(NEVER - 1);
        let mark = self.done.len();
        let mut last = next;
        let mut from = u32::MAX;
        let mut mixed = false;
        let mut earliest = NEVER;
        let lazy = self.lazy;
        for ((r, m), d) in self
            .replicas
            .iter_mut()
            .zip(self.metrics.replicas.iter_mut())
            .zip(self.deadlines.iter_mut())
        {
            debug_assert_eq!(*d, if lazy { r.leave_bound() } else { r.deadline() });
            if *d > limit {
                earliest = earliest.min(*d);
            } else {
                let (before, out, done) = (m.iterations, r.outstanding(), self.done.len());
                last = last.max(r.advance(limit, &mut self.done, m));
                self.iterations += m.iterations - before;
                self.outstanding = self.outstanding + r.outstanding() - out;
                if self.done.len() > done {
                    mixed |= from != u32::MAX;
                    from = r.idx;
                }
                *d = if lazy { r.leave_bound() } else { r.deadline() };
                earliest = earliest.min(*d);
            }
        }
        self.next_deadline = earliest;
        if mixed {
            // each replica's completions are in order of finishing: a
            // stable sort by (finished, replica) interleaves them as the
            // step-by-step run does
            self.done.make_contiguous()[mark..].sort_by_key(|c| (c.finished, c.replica));
        }
        self.now = self.now.max(last);
        last
    }

    /// Engine iterations finished so far, over every replica.
    pub fn iterations(&self) -> u64 {
        self.iterations
    }

    /// The next request that left the server, in order of leaving.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.done.pop_front()
    }

    /// Metrics per replica, live (time-weighted gauges are read with an
    /// explicit `until`, normally the end of the run).
    pub fn metrics(&self) -> &ClusterMetrics {
        &self.metrics
    }

    /// Requests waiting or running, over all replicas.
    pub fn outstanding(&self) -> usize {
        debug_assert_eq!(
            self.outstanding,
            self.replicas
                .iter()
                .map(Replica::outstanding)
                .sum::<usize>()
        );
        self.outstanding
    }

    /// Outstanding requests of replica `i`.
    pub fn replica_outstanding(&self, i: u32) -> usize {
        self.replicas[i as usize].outstanding()
    }

    /// Requests waiting (not yet admitted to the batch), over all replicas.
    pub fn waiting(&self) -> usize {
        self.replicas.iter().map(Replica::waiting_len).sum()
    }

    /// Sequences in running batches, over all replicas.
    pub fn running(&self) -> usize {
        self.replicas.iter().map(Replica::running_len).sum()
    }

    /// Replicas taking requests now (all of them without an autoscaler).
    #[inline]
    pub fn ready_now(&self) -> u32 {
        self.ready.value() as u32
    }

    /// KV blocks in use over the replicas taking requests, and their
    /// capacity.
    pub fn kv_usage(&self) -> (u64, u64) {
        let mut used = 0u64;
        let mut n = 0u64;
        for (i, r) in self.replicas.iter().enumerate() {
            if self
                .scaling
                .as_ref()
                .is_none_or(|s| s.life[i] == Life::Ready)
            {
                used += r.blocks_in_use() as u64;
                n += 1;
            }
        }
        (used, n * self.profile.total_blocks as u64)
    }

    /// The most leading full units of a request (`hashes`, `prompt`
    /// tokens) any replica taking requests has cached, and its full units.
    pub fn best_prefix_hit(&self, hashes: &[u64], prompt: u32) -> (u64, u64) {
        let mut best = (0, 0);
        for (i, r) in self.replicas.iter().enumerate() {
            if self
                .scaling
                .as_ref()
                .is_none_or(|s| s.life[i] == Life::Ready)
            {
                let h = prefix_hit(r, hashes, prompt);
                if h.0 > best.0 || best.1 == 0 {
                    best = h;
                }
            }
        }
        best
    }

    /// The leading full units of a request (`hashes`, `prompt` tokens)
    /// replica `i` has cached, and its full units.
    pub fn replica_prefix_hit(&self, i: u32, hashes: &[u64], prompt: u32) -> (u64, u64) {
        self.replicas
            .get(i as usize)
            .map_or((0, 0), |r| prefix_hit(r, hashes, prompt))
    }

    /// Prefix-cache counters summed over the replicas (zero without).
    pub fn prefix_stats(&self) -> PrefixStats {
        let mut t = PrefixStats::default();
        for r in &self.replicas {
            if let Some(pc) = &r.prefix {
                t.units += pc.stats.units;
                t.hit_units += pc.stats.hit_units;
                t.saved_tokens += pc.stats.saved_tokens;
            }
        }
        t
    }

    /// Replica `i`'s prefix cache: units cached (held or evictable) and the
    /// KV blocks of the evictable ones (in free space); zeros without.
    pub fn prefix_cached(&self, i: u32) -> (u32, u64) {
        self.replicas[i as usize]
            .prefix
            .as_ref()
            .map_or((0, 0), |pc| (pc.cached_units(), pc.evictable_blocks()))
    }

    /// KV blocks in use on replica `i`.
    pub fn kv_blocks_in_use(&self, i: u32) -> u32 {
        self.replicas[i as usize].blocks_in_use()
    }

    /// Output tokens produced so far by every request in a running batch,
    /// as `f(id, generated)` (replica by replica). Read-only: it changes
    /// nothing the simulation sees; `qsim serve` streams tokens with it.
    pub fn progress(&self, mut f: impl FnMut(u64, u32)) {
        for r in &self.replicas {
            r.progress(&mut f);
        }
    }

    /// Why a request could never run on this profile (it would come back at
    /// once as a rejected completion), if it could not.
    pub fn reject_reason(&self, req: &Request) -> Option<&'static str> {
        self.replicas[0].reject_reason(req)
    }

    /// The time of the last `handle_timeout`/`submit`.
    pub fn now(&self) -> Nanos {
        self.now
    }
}
