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
pub mod profile;
mod replica;
mod request;

pub use metrics::{ClusterMetrics, ReplicaMetrics, TimeAvg};
pub use profile::{load_profile, IterationModel, ServerProfile};
pub use request::{Completion, Request};

use crate::engine::rng::{component, stream, Rng};
use crate::time::{Nanos, NEVER};
use replica::Replica;
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
}

/// N replicas of one profile behind a router.
pub struct Cluster {
    profile: Arc<ServerProfile>,
    replicas: Vec<Replica>,
    router: RouterKind,
    rr: usize,
    rng: Rng,
    done: VecDeque<Completion>,
    metrics: ClusterMetrics,
    now: Nanos,
    /// Engine iterations finished by every replica (the work budget's count).
    iterations: u64,
    /// Requests waiting or running over every replica, kept as they change
    /// (drivers read it every step; a sum over thousands of replicas is slow).
    outstanding: usize,
}

impl Cluster {
    /// `replicas` copies of `profile` (at least one) behind `router`. The
    /// model is deterministic; `seed` only breaks routing ties at random.
    pub fn new(profile: Arc<ServerProfile>, replicas: u32, router: RouterKind, seed: u64) -> Self {
        let n = replicas.max(1);
        Cluster {
            replicas: (0..n).map(|i| Replica::new(i, profile.clone())).collect(),
            router,
            rr: 0,
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
            profile,
        }
    }

    pub fn profile(&self) -> &ServerProfile {
        &self.profile
    }

    pub fn replica_count(&self) -> u32 {
        self.replicas.len() as u32
    }

    fn pick(&mut self) -> usize {
        let n = self.replicas.len();
        if n == 1 {
            return 0;
        }
        let key = |r: &Replica| -> (u64, u64) {
            match self.router {
                RouterKind::RoundRobin => (0, 0),
                RouterKind::LeastOutstanding => (r.outstanding() as u64, 0),
                RouterKind::LeastKv => (r.blocks_in_use() as u64, r.outstanding() as u64),
            }
        };
        if self.router == RouterKind::RoundRobin {
            let i = self.rr % n;
            self.rr = (i + 1) % n;
            return i;
        }
        let best = self.replicas.iter().map(key).min().expect("replicas");
        let ties = self.replicas.iter().filter(|r| key(r) == best).count();
        let mut k = if ties > 1 {
            use rand::Rng as _;
            self.rng.gen_range(0..ties)
        } else {
            0
        };
        for (i, r) in self.replicas.iter().enumerate() {
            if key(r) == best {
                if k == 0 {
                    return i;
                }
                k -= 1;
            }
        }
        unreachable!("a replica has the minimum key")
    }

    /// A request arrives at `now` (a time before the cluster's clock is
    /// taken as the clock: time never runs backwards).
    pub fn submit(&mut self, now: Nanos, req: Request) {
        let now = now.max(self.now);
        self.handle_timeout(now);
        let i = self.pick();
        let r = &mut self.replicas[i];
        let before = r.outstanding();
        r.submit(now, req, &mut self.done, &mut self.metrics.replicas[i]);
        self.outstanding = self.outstanding + r.outstanding() - before;
    }

    /// The next internal deadline (the earliest iteration end or API ingress).
    pub fn poll_timeout(&self) -> Option<Nanos> {
        let t = self
            .replicas
            .iter()
            .map(Replica::deadline)
            .min()
            .unwrap_or(NEVER);
        (t != NEVER).then_some(t)
    }

    /// Advance every replica to `now`: finish iterations, start the next ones.
    pub fn handle_timeout(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        for (r, m) in self
            .replicas
            .iter_mut()
            .zip(self.metrics.replicas.iter_mut())
        {
            if r.deadline() <= now {
                let (before, out) = (m.iterations, r.outstanding());
                r.advance(now, &mut self.done, m);
                self.iterations += m.iterations - before;
                self.outstanding = self.outstanding + r.outstanding() - out;
            }
        }
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
