//! Fleets: named pools of GPU server replicas (each pool one profile ×
//! replicas or an autoscaler, with a price and the models it serves), the
//! core's [`Router`] choosing a pool per request, each pool's own router
//! choosing a replica (issue 39).
//!
//! [`Fleet`] is a sans-IO component like [`Cluster`]: the driver calls
//! [`Fleet::submit`] on arrivals and drives its deadlines through
//! [`Timed`]; completions come out of [`Fleet::poll_completion`] tagged
//! with their pool. Which pools may take a request (the model it asks for,
//! its length against each pool's `max_tokens`) makes the other pools
//! *closed* to the router, so routing by model and by length threshold are
//! the policies `first` (pools in order) over the pools left open;
//! spillover, least-outstanding, least-KV and llm-d-style scorers choose
//! among the same open pools. A pool's load as the router sees it is per
//! ready replica, so pools of different sizes compare.
//!
//! - [`config`]: the fleet file (`[[pool]]`, `[route]`) → [`FleetSpec`];
//! - [`workload`]: the requests (distributions, a token-length CDF, a
//!   trace, Mooncake traces with block hashes, synthetic shared prefixes);
//! - [`run`]: the driver (one event queue) and its results;
//! - [`optimize`]: `qsim fleet`'s search for the cheapest fleet;
//! - [`command`], [`report`]: `qsim fleet`'s spec → outcome, and its
//!   text, JSON and tables.

pub mod command;
pub mod config;
pub mod optimize;
pub mod report;
pub mod run;
pub mod workload;

use crate::engine::rng::{component, stream, Rng};
use crate::engine::Timed;
use crate::server::{Cluster, Completion, Request, ServerProfile};
use crate::time::{Nanos, NEVER};
use qsim_core::autoscale::Params as AutoscaleParams;
use qsim_core::route::{Policy, Router, Targets};
use std::collections::VecDeque;
use std::sync::Arc;

/// Random-stream scope of the fleet's own router (pools' clusters use
/// their own seeds, see [`Fleet::new`]).
const FLEET_ROUTER_SCOPE: u64 = 0xF1EE7;

/// A validated pool.
#[derive(Debug, Clone)]
pub struct PoolSpec {
    pub name: String,
    pub profile: Arc<ServerProfile>,
    /// Where the profile came from (a file, or `MODEL@GPU×TP` derived).
    pub profile_label: String,
    /// Fixed replicas (the minimum under an autoscaler).
    pub replicas: u32,
    pub autoscale: Option<AutoscaleParams>,
    /// How the pool spreads its requests over its replicas.
    pub policy: Policy,
    /// Indices into [`FleetSpec::models`] of the models the pool serves.
    pub models: Vec<u16>,
    /// The longest request (input + output tokens) the pool takes; `None`:
    /// any (up to the profile's `max_model_len`).
    pub max_tokens: Option<u64>,
    /// Requests of this many tokens or fewer go elsewhere (the long pool
    /// of a length split); `None`: none.
    pub min_tokens: Option<u64>,
    /// US dollars per replica-hour.
    pub replica_hour_usd: f64,
    /// Replicas cache prefixes (when the workload carries block hashes).
    pub prefix_cache: bool,
    /// What the pool does: serve requests, or prefill for decode pools.
    pub role: Role,
}

/// A pool's part in prefill/decode disaggregation.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Role {
    /// Takes requests from the router and serves them whole.
    #[default]
    Serve,
    /// Closed to the router: runs the prompts of the decode pools that
    /// name it (each as a request of one output token).
    Prefill,
    /// Takes requests from the router; their prompts are prefilled on
    /// another pool and their KV sent over a link.
    Decode(PrefillLink),
}

/// A decode pool's prefill pool and the link between them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillLink {
    /// Index of the prefill pool.
    pub pool: u16,
    /// Bytes per second into each decode replica (one transfer at a time
    /// per replica, first come first served).
    pub bytes_per_s: f64,
    /// Prompts of which the decode replica would compute at most this many
    /// tokens (after its cached prefix) are prefilled there.
    pub local_max: u32,
}

/// A validated fleet: its models, pools and the router between pools.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    pub models: Vec<String>,
    pub pools: Vec<PoolSpec>,
    pub route: Policy,
    /// Tokens per block hash of the workload (Mooncake: 512), when its
    /// requests carry hashes: pools with `prefix_cache` cache by them.
    pub prefix_unit: Option<u32>,
}

impl FleetSpec {
    /// Index of a model by name.
    pub fn model_index(&self, name: &str) -> Option<u16> {
        self.models.iter().position(|m| m == name).map(|i| i as u16)
    }
}

/// A completion and the pool it left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FleetCompletion {
    pub pool: u16,
    pub c: Completion,
}

pub(crate) struct Pool {
    pub(crate) cluster: Cluster,
    /// Bit `m` set: serves model `m` (at most 64 models); 0 for a pool
    /// without replicas (never chosen).
    models: u64,
    /// The pool takes requests of `min_tokens + 1 ..= max_tokens` tokens.
    min_tokens: u64,
    max_tokens: u64,
    /// The cluster's deadline as last read.
    deadline: Nanos,
    role: Role,
}

/// A disaggregated request between its prefill and its decode.
struct Remote {
    /// When it reached the fleet.
    arrival: Nanos,
    pool: u16,
    replica: u32,
    req: Request,
    hashes: Vec<u64>,
}

/// Counters of prefill/decode disaggregation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DisaggStats {
    /// Prompts prefilled on a prefill pool, and on the decode replica.
    pub remote: u64,
    pub local: u64,
    /// KV bytes sent, and the transfers' time (link queueing included).
    pub kv_bytes: f64,
    pub transfer_ns: u64,
    pub transfers: u64,
}

/// What the fleet's router sees of the pools for one request.
struct PoolView<'a> {
    pools: &'a [Pool],
    model: u16,
    tokens: u64,
    hashes: &'a [u64],
    prompt: u32,
}

impl Targets for PoolView<'_> {
    #[inline]
    fn len(&self) -> usize {
        self.pools.len()
    }
    #[inline]
    fn open(&self, i: usize) -> bool {
        let p = &self.pools[i];
        p.models >> self.model & 1 == 1 && self.tokens <= p.max_tokens && self.tokens > p.min_tokens
    }
    /// Outstanding requests per ready replica, in 1/1024ths.
    #[inline]
    fn outstanding(&self, i: usize) -> u64 {
        let c = &self.pools[i].cluster;
        c.outstanding() as u64 * 1024 / c.ready_now().max(1) as u64
    }
    /// Waiting requests per ready replica (rounded down).
    fn waiting(&self, i: usize) -> u64 {
        let c = &self.pools[i].cluster;
        c.waiting() as u64 / c.ready_now().max(1) as u64
    }
    fn kv(&self, i: usize) -> (u64, u64) {
        self.pools[i].cluster.kv_usage()
    }
    /// The best match of any of the pool's replicas.
    fn prefix_hit(&self, i: usize) -> (u64, u64) {
        self.pools[i]
            .cluster
            .best_prefix_hit(self.hashes, self.prompt)
    }
}

/// Pools behind a router.
pub struct Fleet {
    pub(crate) pools: Vec<Pool>,
    router: Router,
    rng: Rng,
    done: VecDeque<FleetCompletion>,
    next: Nanos,
    /// Requests no pool could take (a model or length no pool serves).
    unrouted: u64,
    /// No pool autoscales: pools run their deadlines up to a limit at once
    /// (an autoscaler's ticks look at every replica, one deadline at a time).
    fused: bool,
    /// Disaggregated requests by id, from their routing to their end
    /// (insert, get, remove by id only: never iterated, so its order cannot
    /// reach the output; transfers are ordered by `transfers` below).
    remote: std::collections::HashMap<u64, Remote>,
    /// KV transfers in flight: (done at, sequence, id), earliest first.
    transfers: std::collections::BinaryHeap<std::cmp::Reverse<(Nanos, u64, u64)>>,
    seq: u64,
    /// Per pool, per replica: when its incoming KV link is free.
    links: Vec<Vec<Nanos>>,
    /// Some pool is a decode pool.
    disagg: bool,
    prefix_unit: u32,
    stats: DisaggStats,
}

impl Fleet {
    /// The fleet of `spec`, seeded: pool `p`'s cluster gets
    /// `seed + (SCOPE << 32) + (p << 40)` (so a one-pool fleet draws as the
    /// server experiment's driver does for a scenario of index
    /// [`workload::SCOPE`]), the router between pools its own stream.
    pub fn new(spec: &FleetSpec, seed: u64) -> Self {
        assert!(spec.models.len() <= 64, "at most 64 models");
        let pools = spec
            .pools
            .iter()
            .enumerate()
            .map(|(p, ps)| {
                let mut c = Cluster::with_policy(
                    ps.profile.clone(),
                    ps.replicas,
                    ps.policy.clone(),
                    seed.wrapping_add(workload::SCOPE << 32)
                        .wrapping_add((p as u64) << 40),
                );
                if let Some(a) = &ps.autoscale {
                    c = c.with_autoscaler(a.clone());
                }
                if let (true, Some(u)) = (ps.prefix_cache, spec.prefix_unit) {
                    c = c.with_prefix_cache(u);
                }
                let closed = ps.replicas == 0 && ps.autoscale.is_none() || ps.role == Role::Prefill;
                Pool {
                    role: ps.role,
                    models: if closed {
                        0
                    } else {
                        ps.models.iter().fold(0u64, |m, &i| m | 1 << i)
                    },
                    min_tokens: ps.min_tokens.unwrap_or(0),
                    max_tokens: ps.max_tokens.unwrap_or(u64::MAX),
                    deadline: c.poll_timeout().unwrap_or(NEVER),
                    cluster: c,
                }
            })
            .collect();
        Fleet {
            pools,
            router: Router::new(spec.route.clone()),
            rng: stream(seed, FLEET_ROUTER_SCOPE, component::ROUTER),
            done: VecDeque::new(),
            next: NEVER,
            unrouted: 0,
            fused: spec
                .pools
                .iter()
                .all(|p| p.autoscale.is_none() && p.role == Role::Serve),
            remote: Default::default(),
            transfers: Default::default(),
            seq: 0,
            links: vec![Vec::new(); spec.pools.len()],
            disagg: spec.pools.iter().any(|p| matches!(p.role, Role::Decode(_))),
            prefix_unit: spec.prefix_unit.unwrap_or(0),
            stats: DisaggStats::default(),
        }
        .refreshed()
    }

    fn refreshed(mut self) -> Self {
        self.refresh();
        self
    }

    fn refresh(&mut self) {
        let t = self.transfers.peek().map_or(NEVER, |r| r.0 .0);
        self.next = self
            .pools
            .iter()
            .map(|p| p.deadline)
            .min()
            .unwrap_or(NEVER)
            .min(t);
    }

    /// Advance replicas only as routing needs (see
    /// [`Cluster::advance_lazily`]): when the router between pools reads
    /// nothing but outstanding counts, and for each pool whose own router
    /// does (and has no autoscaler). For open-loop drivers only; call
    /// [`settle`](Self::settle) before reading the replicas' state.
    pub fn advance_lazily(&mut self) {
        if !self.router.policy().reads_outstanding_only() || self.disagg {
            return;
        }
        for p in &mut self.pools {
            p.cluster.advance_lazily();
            p.deadline = p.cluster.poll_timeout().unwrap_or(NEVER);
        }
        self.refresh();
    }

    /// Every pool advanced to `now` (see [`Cluster::settle`]).
    pub fn settle(&mut self, now: Nanos) {
        for p in &mut self.pools {
            p.cluster.settle(now);
            p.deadline = p.cluster.poll_timeout().unwrap_or(NEVER);
        }
        self.refresh();
    }

    /// The pool the router picks for a request of `model` with `input`
    /// and `output` tokens and block `hashes`; `None`: no pool serves it.
    pub fn choose(&mut self, model: u16, input: u32, output: u32, hashes: &[u64]) -> Option<usize> {
        let rng = &mut self.rng;
        let mut below = |n: u64| {
            use rand::Rng as _;
            rng.gen_range(0..n as usize) as u64
        };
        self.router.pick(
            &PoolView {
                pools: &self.pools,
                model,
                tokens: input as u64 + output as u64,
                hashes,
                prompt: input,
            },
            &mut below,
        )
    }

    /// A request for `model` with block `hashes` arrives at `now`: the
    /// router picks a pool and the pool a replica. Returns (pool, replica),
    /// or `None` when no pool serves the request (it is counted as
    /// unrouted and answered nowhere).
    pub fn submit(
        &mut self,
        now: Nanos,
        req: Request,
        model: u16,
        hashes: &[u64],
    ) -> Option<(usize, u32)> {
        let Some(p) = self.choose(model, req.input_tokens, req.output_tokens, hashes) else {
            self.unrouted += 1;
            return None;
        };
        let Role::Decode(link) = self.pools[p].role else {
            let r = self.pools[p].cluster.submit_hashed(now, req, hashes, 0);
            self.after(p);
            return Some((p, r));
        };
        // decode first: the replica, then where the prompt is computed
        let c = &mut self.pools[p].cluster;
        let r = c.choose(now, hashes, req.input_tokens);
        let cached = c.replica_prefix_hit(r, hashes, req.input_tokens).0 * self.prefix_unit as u64;
        let cached = cached.min(u32::MAX as u64) as u32;
        if !qsim_core::route::remote_prefill(req.input_tokens, cached, link.local_max) {
            self.stats.local += 1;
            c.submit_on(now, r, req, hashes, 0);
            self.after(p);
            return Some((p, r));
        }
        self.stats.remote += 1;
        self.remote.insert(
            req.id,
            Remote {
                arrival: now,
                pool: p as u16,
                replica: r,
                req,
                hashes: hashes.to_vec(),
            },
        );
        let pf = link.pool as usize;
        let prefill = Request {
            output_tokens: 1,
            ..req
        };
        self.pools[pf]
            .cluster
            .submit_hashed(now, prefill, hashes, 0);
        self.after(pf);
        Some((p, r))
    }

    /// Prefills that finished: their KV onto the decode replica's link
    /// (a prompt the prefill pool rejected leaves as the decode pool's
    /// rejection).
    fn prefilled(&mut self, pf: usize, c: Completion) {
        let Some(x) = self.remote.get(&c.id) else {
            unreachable!("a prefill pool runs only disaggregated requests");
        };
        let d = x.pool as usize;
        if c.rejected {
            let x = self.remote.remove(&c.id).expect("present");
            self.done.push_back(FleetCompletion {
                pool: d as u16,
                c: Completion {
                    arrival: x.arrival,
                    replica: x.replica,
                    ..c
                },
            });
            return;
        }
        let Role::Decode(link) = self.pools[d].role else {
            unreachable!("a disaggregated request's pool decodes");
        };
        debug_assert_eq!(link.pool as usize, pf);
        let bytes = x.req.input_tokens as f64 * self.pools[d].cluster.profile().kv_bytes_per_token;
        let dur = ((bytes / link.bytes_per_s * 1e9).ceil() as Nanos).max(1);
        let links = &mut self.links[d];
        let r = x.replica as usize;
        if links.len() <= r {
            links.resize(r + 1, 0);
        }
        let start = links[r].max(c.finished);
        let end = start + dur;
        links[r] = end;
        self.stats.kv_bytes += bytes;
        self.stats.transfer_ns += end - c.finished;
        self.stats.transfers += 1;
        self.seq += 1;
        self.transfers
            .push(std::cmp::Reverse((end, self.seq, c.id)));
    }

    /// KV transfers done by `now`: their requests onto their decode
    /// replicas, the prompt's KV there already.
    fn transferred(&mut self, now: Nanos) {
        while let Some(&std::cmp::Reverse((t, _, id))) = self.transfers.peek() {
            if t > now {
                break;
            }
            self.transfers.pop();
            let x = self.remote.get(&id).expect("a transfer's request");
            let (p, r, req) = (x.pool as usize, x.replica, x.req);
            let hashes = std::mem::take(&mut self.remote.get_mut(&id).expect("present").hashes);
            self.pools[p]
                .cluster
                .submit_on(t, r, req, &hashes, req.input_tokens);
            self.after(p);
        }
    }

    /// Prefill/decode counters.
    pub fn disagg_stats(&self) -> DisaggStats {
        self.stats
    }

    /// Pool `p` changed: its deadline and completions.
    fn after(&mut self, p: usize) {
        let pool = &mut self.pools[p];
        pool.deadline = pool.cluster.poll_timeout().unwrap_or(NEVER);
        // a request no replica could ever run comes back at once
        let mut back = Vec::new();
        while let Some(c) = pool.cluster.poll_completion() {
            back.push(c);
        }
        for c in back {
            self.emit(p, c);
        }
        let pool = &self.pools[p];
        if pool.deadline < self.next {
            self.next = pool.deadline;
        } else {
            self.refresh();
        }
    }

    /// Drain the completions of the pools that produced some,
    /// interleaved by finishing time (then pool) as a step-by-step run
    /// over the pools gives them.
    fn collect(&mut self) {
        let mark = self.done.len();
        let mut from = usize::MAX;
        let mut mixed = false;
        for p in 0..self.pools.len() {
            let before = self.done.len();
            if self.disagg {
                while let Some(c) = self.pools[p].cluster.poll_completion() {
                    self.emit(p, c);
                }
            } else {
                let pool = &mut self.pools[p];
                while let Some(c) = pool.cluster.poll_completion() {
                    self.done.push_back(FleetCompletion { pool: p as u16, c });
                }
            }
            if self.done.len() > before {
                mixed |= from != usize::MAX;
                from = p;
            }
        }
        if mixed {
            self.done.make_contiguous()[mark..].sort_by_key(|f| (f.c.finished, f.pool));
        }
    }

    /// A completion out of pool `p`: a prefill goes on to its transfer; a
    /// disaggregated decode leaves with the time it reached the fleet.
    fn emit(&mut self, p: usize, mut c: Completion) {
        match self.pools[p].role {
            Role::Serve => {}
            Role::Prefill => return self.prefilled(p, c),
            Role::Decode(_) => {
                if let Some(x) = self.remote.remove(&c.id) {
                    c.arrival = x.arrival;
                }
            }
        }
        self.done.push_back(FleetCompletion { pool: p as u16, c });
    }

    /// The next completion, in order of leaving.
    pub fn poll_completion(&mut self) -> Option<FleetCompletion> {
        self.done.pop_front()
    }

    /// Requests no pool served.
    pub fn unrouted(&self) -> u64 {
        self.unrouted
    }

    pub fn pool_count(&self) -> usize {
        self.pools.len()
    }

    /// Pool `p`'s cluster (read-only).
    pub fn cluster(&self, p: usize) -> &Cluster {
        &self.pools[p].cluster
    }

    /// Requests waiting or running in every pool, or their KV in transfer.
    pub fn outstanding(&self) -> usize {
        self.pools
            .iter()
            .map(|p| p.cluster.outstanding())
            .sum::<usize>()
            + self.transfers.len()
    }

    /// Engine iterations of every pool.
    pub fn iterations(&self) -> u64 {
        self.pools.iter().map(|p| p.cluster.iterations()).sum()
    }

    /// Replicas over every pool (for the work meter's scan units).
    pub fn replica_count(&self) -> u32 {
        self.pools.iter().map(|p| p.cluster.replica_count()).sum()
    }
}

impl Timed for Fleet {
    fn poll_timeout(&self) -> Option<Nanos> {
        (self.next != NEVER).then_some(self.next)
    }

    fn handle_timeout(&mut self, now: Nanos) {
        for p in &mut self.pools {
            if p.deadline <= now {
                p.cluster.handle_timeout(now);
                p.deadline = p.cluster.poll_timeout().unwrap_or(NEVER);
            }
        }
        self.collect();
        if self.disagg {
            self.transferred(now);
        }
        self.refresh();
    }

    /// Pools do not interact between the driver's events (an open loop):
    /// each runs its own deadlines up to `limit` in one go, unless a pool
    /// autoscales.
    fn handle_through(&mut self, next: Nanos, limit: Nanos) -> Nanos {
        if !self.fused {
            self.handle_timeout(next);
            return next;
        }
        let mut last = next;
        for p in &mut self.pools {
            if p.deadline <= limit {
                last = last.max(p.cluster.handle_through(p.deadline, limit));
                p.deadline = p.cluster.poll_timeout().unwrap_or(NEVER);
            }
        }
        self.collect();
        self.refresh();
        last
    }
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
