//! One replica: a vLLM-style engine with iteration-level continuous batching
//! and a paged KV cache. Sans-IO: driven by `advance(now)`.

use super::metrics::ReplicaMetrics;
use super::profile::{IterationModel, ServerProfile};
use super::{Completion, Request};
use crate::time::{Nanos, NEVER};
use std::collections::VecDeque;
use std::sync::Arc;

/// A request while it is inside the replica (the only per-request state).
#[derive(Debug, Clone)]
pub(crate) struct Seq {
    id: u64,
    arrival: Nanos,
    first_token: Nanos,
    last_token: Nanos,
    prompt: u32,
    output: u32,
    generated: u32,
    /// Tokens whose KV is computed and held in `blocks`.
    computed: u32,
    blocks: u32,
    /// Tokens scheduled in the current iteration (0 = not scheduled).
    chunk: u32,
    scheduled_once: bool,
}

impl Seq {
    #[inline]
    fn pending(&self) -> u32 {
        self.prompt + self.generated - self.computed
    }
}

pub(crate) struct Replica {
    pub idx: u32,
    profile: Arc<ServerProfile>,
    /// Requests still in the API server: (time the engine sees them, seq).
    ingress: VecDeque<(Nanos, Seq)>,
    waiting: VecDeque<Seq>,
    /// The running batch in admission order (newest last).
    running: Vec<Seq>,
    free_blocks: u32,
    /// End of the iteration in flight, NEVER when idle.
    iter_end: Nanos,
    iter_start: Nanos,
    iter_gpu: Nanos,
}

impl Replica {
    pub fn new(idx: u32, profile: Arc<ServerProfile>) -> Self {
        let total = profile.total_blocks;
        Replica {
            idx,
            running: Vec::with_capacity(profile.max_num_seqs as usize),
            profile,
            ingress: VecDeque::new(),
            waiting: VecDeque::new(),
            free_blocks: total,
            iter_end: NEVER,
            iter_start: 0,
            iter_gpu: 0,
        }
    }

    #[inline]
    pub fn outstanding(&self) -> usize {
        self.ingress.len() + self.waiting.len() + self.running.len()
    }

    #[inline]
    pub fn blocks_in_use(&self) -> u32 {
        self.profile.total_blocks - self.free_blocks
    }

    #[inline]
    pub fn waiting_len(&self) -> usize {
        self.ingress.len() + self.waiting.len()
    }

    #[inline]
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// The next internal deadline.
    #[inline]
    pub fn deadline(&self) -> Nanos {
        let ing = self.ingress.front().map_or(NEVER, |x| x.0);
        ing.min(self.iter_end)
    }

    /// Why a request can never run on this profile, if it cannot.
    pub fn reject_reason(&self, r: &Request) -> Option<&'static str> {
        let p = &self.profile;
        if r.input_tokens == 0 {
            Some("empty prompt")
        } else if r.output_tokens == 0 {
            Some("no output tokens")
        } else if r.input_tokens as u64 + r.output_tokens as u64 > p.max_model_len as u64 {
            Some("longer than max_model_len")
        } else if !p.chunked_prefill && r.input_tokens > p.max_batched_tokens {
            Some("prompt longer than max_batched_tokens without chunked prefill")
        } else {
            None
        }
    }

    /// A request arrives at `now` (the caller has advanced the replica to `now`).
    pub fn submit(
        &mut self,
        now: Nanos,
        r: Request,
        out: &mut VecDeque<Completion>,
        m: &mut ReplicaMetrics,
    ) {
        m.submitted += 1;
        if self.reject_reason(&r).is_some() {
            m.rejected += 1;
            out.push_back(Completion {
                id: r.id,
                arrival: now,
                first_token: now,
                finished: now,
                output_tokens: 0,
                replica: self.idx,
                rejected: true,
            });
            return;
        }
        let s = Seq {
            id: r.id,
            arrival: now,
            first_token: NEVER,
            last_token: now,
            prompt: r.input_tokens,
            output: r.output_tokens,
            generated: 0,
            computed: 0,
            blocks: 0,
            chunk: 0,
            scheduled_once: false,
        };
        if self.profile.ingress == 0 {
            self.waiting.push_back(s);
            if self.iter_end == NEVER {
                self.start_iteration(now, m);
            }
        } else {
            self.ingress.push_back((now + self.profile.ingress, s));
        }
        m.waiting.set(now, self.waiting_len() as u64);
    }

    /// Process everything up to and including `now`.
    pub fn advance(&mut self, now: Nanos, out: &mut VecDeque<Completion>, m: &mut ReplicaMetrics) {
        loop {
            let ing = self.ingress.front().map_or(NEVER, |x| x.0);
            let end = self.iter_end;
            if end <= now && end <= ing {
                self.finish_iteration(end, out, m);
                self.drain_ingress(end);
                self.start_iteration(end, m);
            } else if ing <= now {
                self.drain_ingress(ing);
                if self.iter_end == NEVER {
                    self.start_iteration(ing, m);
                }
            } else {
                break;
            }
        }
    }

    fn drain_ingress(&mut self, t: Nanos) {
        while let Some((ready, _)) = self.ingress.front() {
            if *ready > t {
                break;
            }
            let (_, s) = self.ingress.pop_front().expect("front exists");
            self.waiting.push_back(s);
        }
    }

    fn preempt_newest(&mut self, m: &mut ReplicaMetrics) {
        let mut v = self.running.pop().expect("running not empty");
        self.free_blocks += v.blocks;
        v.blocks = 0;
        v.computed = 0;
        v.chunk = 0;
        m.preemptions += 1;
        self.waiting.push_front(v);
    }

    /// Schedule one iteration starting at `t` (or go idle).
    fn start_iteration(&mut self, t: Nanos, m: &mut ReplicaMetrics) {
        let bs = self.profile.block_size;
        let mut budget = self.profile.max_batched_tokens;
        let (mut p, mut d, mut k, mut a, mut n) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut preempted = false;
        let mut i = 0;
        // 1. the running batch, oldest first
        while i < self.running.len() && budget > 0 {
            let s = &self.running[i];
            let pending = s.pending();
            let chunk = pending.min(budget);
            let need = (s.computed + chunk).div_ceil(bs) - s.blocks;
            let mut self_preempted = false;
            while self.free_blocks < need {
                let last = self.running.len() - 1;
                self.preempt_newest(m);
                preempted = true;
                if last == i {
                    self_preempted = true;
                    break;
                }
            }
            if self_preempted {
                break;
            }
            self.free_blocks -= need;
            let s = &mut self.running[i];
            s.blocks += need;
            s.chunk = chunk;
            budget -= chunk;
            if pending > 1 {
                p += chunk as u64;
            } else {
                d += 1;
            }
            k += (s.computed + chunk) as u64;
            a += IterationModel::attn_pairs(s.computed, chunk);
            n += 1;
            i += 1;
        }
        // 2. admit from the waiting queue (not in a step that preempted)
        if !preempted {
            let max = self.profile.max_num_seqs as usize;
            while self.running.len() < max {
                let Some(s) = self.waiting.front() else { break };
                let pending = s.pending();
                let chunk = if self.profile.chunked_prefill {
                    if budget == 0 {
                        break;
                    }
                    pending.min(budget)
                } else if pending <= budget || n == 0 {
                    // a prefill is never split; alone it may exceed the budget
                    pending
                } else {
                    break;
                };
                let need = chunk.div_ceil(bs);
                if need > self.free_blocks {
                    break;
                }
                let mut s = self.waiting.pop_front().expect("front exists");
                self.free_blocks -= need;
                s.blocks = need;
                s.chunk = chunk;
                if !s.scheduled_once {
                    s.scheduled_once = true;
                    m.queue_delay.record(t - s.arrival);
                }
                budget = budget.saturating_sub(chunk);
                if pending > 1 {
                    p += chunk as u64;
                } else {
                    d += 1;
                }
                k += chunk as u64;
                a += IterationModel::attn_pairs(0, chunk);
                n += 1;
                self.running.push(s);
            }
        }
        m.running.set(t, self.running.len() as u64);
        m.waiting
            .set(t, (self.ingress.len() + self.waiting.len()) as u64);
        m.kv_blocks
            .set(t, (self.profile.total_blocks - self.free_blocks) as u64);
        if n == 0 {
            self.iter_end = NEVER;
            return;
        }
        let (dur, gpu) = self.profile.iteration.duration(p, d, k, a, n);
        m.prefill_tokens += p;
        self.iter_start = t;
        self.iter_end = t + dur;
        self.iter_gpu = gpu;
    }

    fn finish_iteration(
        &mut self,
        t: Nanos,
        out: &mut VecDeque<Completion>,
        m: &mut ReplicaMetrics,
    ) {
        let start = self.iter_start;
        m.iterations += 1;
        m.gpu_busy_ns += self.iter_gpu as u128;
        m.engine_busy_ns += (t - start) as u128;
        let mut same_gap = 0u64;
        let mut any_done = false;
        for s in self.running.iter_mut() {
            if s.chunk == 0 {
                continue;
            }
            s.computed += s.chunk;
            s.chunk = 0;
            if s.computed == s.prompt + s.generated {
                s.generated += 1;
                m.output_tokens += 1;
                if s.first_token == NEVER {
                    s.first_token = t;
                    m.ttft.record(t - s.arrival);
                } else if s.last_token == start {
                    same_gap += 1;
                } else {
                    m.itl.record(t - s.last_token);
                }
                s.last_token = t;
                if s.generated == s.output {
                    any_done = true;
                }
            }
        }
        m.itl.record_n(t - start, same_gap);
        if any_done {
            let idx = self.idx;
            let mut freed = 0;
            self.running.retain(|s| {
                if s.generated < s.output {
                    return true;
                }
                freed += s.blocks;
                m.completed += 1;
                m.input_tokens += s.prompt as u64;
                m.e2e.record(t - s.arrival);
                if s.output > 1 {
                    m.tpot.record((t - s.first_token) / (s.output as u64 - 1));
                }
                out.push_back(Completion {
                    id: s.id,
                    arrival: s.arrival,
                    first_token: s.first_token,
                    finished: t,
                    output_tokens: s.output,
                    replica: idx,
                    rejected: false,
                });
                false
            });
            self.free_blocks += freed;
        }
        self.iter_end = NEVER;
    }
}
