//! One replica: a vLLM-style engine with iteration-level continuous batching
//! and a paged KV cache. Sans-IO: driven by `advance(now)`.
//!
//! The running batch is advanced lazily: a sequence that decodes one token
//! per iteration, iteration after iteration, is not touched per iteration.
//! Its state is kept as of the iteration it started decoding (`since`), and
//! the batch's sums (tokens, context lengths, attention pairs, KV blocks
//! needed: by context length modulo the block size) are kept as aggregates
//! that are exact integers. Completions come from a heap keyed by the
//! iteration at which each sequence produces its last token. Whenever an
//! iteration cannot give every running sequence its whole work (token
//! budget or KV blocks short: the order of the batch matters, preemption),
//! every sequence is made concrete and the iteration is scheduled one
//! sequence at a time, as before. The outputs are identical.

use super::metrics::ReplicaMetrics;
use super::prefix::PrefixCache;
use super::profile::{IterationModel, ServerProfile};
use super::request::{Completion, Request};
use crate::engine::stats::Pending;
use crate::time::{Nanos, NEVER};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
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
    /// Position in the running batch (admission order, newest largest).
    key: u64,
    /// Decoding lazily since iteration `since`: `computed`, `generated`,
    /// `blocks` and `last_token` are as of that iteration's start.
    lazy: bool,
    since: u64,
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
    /// The running batch, in slots (each sequence's `key` is its admission
    /// order, newest largest; the slots are not ordered).
    running: Slots,
    free_blocks: u32,
    /// End of the iteration in flight, NEVER when idle.
    iter_end: Nanos,
    iter_start: Nanos,
    iter_gpu: Nanos,
    next_key: u64,
    /// Index of the next iteration to start, and of the one in flight.
    next_iter: u64,
    cur_iter: u64,
    /// End of the last finished iteration.
    last_end: Nanos,
    /// Cells of requests finished since a request was last first scheduled
    /// (`IterationModel::finished_cells_held`; 0 otherwise): still in the
    /// KV buffer, so in every step's K.
    held_kv: u64,
    /// (key, slot) of the running sequences that are not lazy, keys ascending.
    eager: Vec<(u64, u32)>,
    /// Lazily decoding sequences: how many, the sum of (computed − since),
    /// and how many have (computed − since) ≡ r (mod block size), by r.
    lazy_n: u64,
    lazy_base: i64,
    lazy_mod: Vec<u64>,
    /// (iteration producing the last token, key, slot) of the lazy sequences.
    done_at: BinaryHeap<Reverse<(u64, u64, u32)>>,
    /// (key, slot) of the sequences finishing in this iteration.
    done: Vec<(u64, u32)>,
    /// Off only in tests: every sequence scheduled one at a time, every
    /// iteration (the reference the lazy batch is compared with).
    lazy_batch: bool,
    /// A lower bound of any iteration's duration ([`min_step`]).
    min_step: Nanos,
    /// The prefix cache, when the replica caches prefixes.
    pub(crate) prefix: Option<Box<PrefixCache>>,
    /// A prefix cache, or a request arrived with precomputed tokens: the
    /// scheduling functions run their general version (`X = true`); the
    /// plain one (`X = false`) is the model without either, instruction
    /// for instruction as before they existed.
    ext: bool,
}

/// A lower bound of any iteration's duration under `m`, in ns (≥ 1): the
/// GPU part of a roofline step is at least `gpu_fixed + mem_base` (every
/// other term is ≥ 0, f64 addition and rounding are monotone, and a step
/// takes at least its GPU part, synchronous or not); a measured decode
/// table (any order of step times) or a negative coefficient gives 1 ns.
pub(crate) fn min_step(m: &IterationModel) -> Nanos {
    let non_negative = [
        m.gpu_fixed_ns,
        m.mem_base_ns,
        m.mem_per_kv_token_ns,
        m.comp_per_token_ns,
        m.comp_per_attn_pair_ns,
        m.cpu_base_ns,
        m.cpu_per_seq_ns,
    ]
    .iter()
    .all(|&x| x >= 0.0);
    let x = m.gpu_fixed_ns + m.mem_base_ns;
    if !m.decode_step_ns.is_empty() || !non_negative || !x.is_finite() || x >= 1e18 {
        return 1;
    }
    // floor ≤ round: a bound of the rounded GPU part too
    (x.floor() as Nanos).max(1)
}

#[cfg(test)]
thread_local! {
    static REFERENCE: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// Steps finishing requests inside a decode run, then a decode step
    /// following in the same run (tests read it to see the case covered).
    pub(crate) static RUN_FINISHES: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Tests only: replicas built on this thread while `on` are the
/// sequence-by-sequence reference (`lazy_batch` off), e.g. a whole
/// cluster's, to compare a run with.
#[cfg(test)]
pub(crate) fn reference_batches(on: bool) {
    REFERENCE.with(|c| c.set(on));
}

#[inline]
fn reference() -> bool {
    #[cfg(test)]
    return REFERENCE.with(|c| c.get());
    #[cfg(not(test))]
    false
}

impl Replica {
    pub fn new(idx: u32, profile: Arc<ServerProfile>) -> Self {
        let total = profile.total_blocks;
        let bs = profile.block_size as usize;
        Replica {
            idx,
            running: Slots::default(),
            ingress: VecDeque::new(),
            waiting: VecDeque::new(),
            free_blocks: total,
            iter_end: NEVER,
            iter_start: 0,
            iter_gpu: 0,
            next_key: 0,
            next_iter: 0,
            cur_iter: 0,
            last_end: 0,
            held_kv: 0,
            eager: Vec::new(),
            lazy_n: 0,
            lazy_base: 0,
            lazy_mod: vec![0; bs],
            done_at: BinaryHeap::new(),
            done: Vec::new(),
            lazy_batch: !reference(),
            min_step: min_step(&profile.iteration),
            prefix: None,
            ext: false,
            profile,
        }
    }

    /// A replica caching prefixes in units of `unit` tokens (whole KV
    /// blocks).
    pub fn with_prefix_cache(mut self, unit: u32) -> Self {
        self.prefix = Some(Box::new(PrefixCache::new(unit, self.profile.block_size)));
        self.ext = true;
        self
    }

    /// Blocks `s` holds are given back (it leaves, or is preempted): the
    /// blocks now free, and the prompt tokens it had from the cache.
    #[inline]
    fn release<const X: bool>(&mut self, id: u64, blocks: u32, leaving: bool) -> (u32, u32) {
        match &mut self.prefix {
            Some(pc) if X => pc.release(id, blocks, leaving),
            _ => (blocks, 0),
        }
    }

    /// [`fit_cache`](Self::fit_cache) after a decode run's steps (they
    /// only take blocks).
    #[inline]
    fn fit_run(&mut self) {
        if self.ext {
            self.fit_cache::<true>();
        }
    }

    /// The evictable cached units fit in the free blocks again.
    #[inline]
    fn fit_cache<const X: bool>(&mut self) {
        if !X {
            return;
        }
        if let Some(pc) = &mut self.prefix {
            pc.fit(self.free_blocks);
        }
    }

    /// Running sequence `i` (eager, just produced a token at `t`, not done)
    /// decodes lazily from iteration `since`.
    #[inline(always)]
    fn make_lazy(&mut self, slot: u32, since: u64) {
        let bs = self.profile.block_size;
        let s = self.running.get_mut(slot);
        let r = residue(s.computed, since, bs);
        let last = since + (s.output - s.generated) as u64 - 1;
        let base = s.computed as i64 - since as i64;
        let key = s.key;
        s.lazy = true;
        s.since = since;
        self.lazy_mod[r] += 1;
        self.lazy_n += 1;
        self.lazy_base += base;
        self.done_at.push(Reverse((last, key, slot)));
    }

    /// Make a lazy sequence concrete as of the start of iteration `j`
    /// (`j − since` iterations decoded since), and unregister it.
    #[inline(always)]
    fn make_concrete(&mut self, slot: u32, j: u64) {
        let (bs, last_end) = (self.profile.block_size, self.last_end);
        let s = self.running.get_mut(slot);
        debug_assert!(s.lazy);
        let r = residue(s.computed, s.since, bs);
        let base = s.computed as i64 - s.since as i64;
        concrete(s, j, bs, last_end);
        self.lazy_mod[r] -= 1;
        self.lazy_n -= 1;
        self.lazy_base -= base;
    }

    /// Every running sequence concrete at the start of iteration `j`.
    fn concrete_all(&mut self, j: u64) {
        if self.lazy_n == 0 {
            return;
        }
        let (bs, last_end) = (self.profile.block_size, self.last_end);
        self.eager.clear();
        for (slot, s) in self.running.iter_mut() {
            if s.lazy {
                concrete(s, j, bs, last_end);
            }
            self.eager.push((s.key, slot));
        }
        self.eager.sort_unstable();
        self.lazy_n = 0;
        self.lazy_base = 0;
        self.lazy_mod.fill(0);
        self.done_at.clear();
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

    /// A time before which no request leaves the replica (so its
    /// [`outstanding`](Self::outstanding) count cannot change before it
    /// unless a request is submitted), ≤ any completion [`advance`] would
    /// give; NEVER when empty. A request finishes at the end of an
    /// iteration: the one in flight (`iter_end`) if an eager sequence is in
    /// it; for the lazy batch alone, the iteration of its first last token
    /// (the completion heap's head), each iteration after the one in flight
    /// taking at least `min_step`; a request waiting or in the API ingress
    /// runs in a later iteration at the earliest.
    pub fn leave_bound(&self) -> Nanos {
        let queued = !self.ingress.is_empty() || !self.waiting.is_empty();
        if self.iter_end == NEVER {
            // idle: a request past the ingress starts a step then
            return self
                .ingress
                .front()
                .map_or(NEVER, |x| x.0.saturating_add(self.min_step));
        }
        if !self.eager.is_empty() {
            return self.iter_end;
        }
        let mut steps = self
            .done_at
            .peek()
            .map_or(0, |Reverse((last, _, _))| last - self.cur_iter);
        if queued {
            steps = steps.min(1);
        }
        self.iter_end
            .saturating_add(steps.saturating_mul(self.min_step))
    }

    /// Output tokens each running sequence has produced by the end of the
    /// last finished iteration, as `f(id, generated)` in admission order.
    /// Read-only (a lazy sequence's count is derived, not made concrete):
    /// the real-time driver uses it to stream tokens as iterations end.
    pub fn progress(&self, f: &mut impl FnMut(u64, u32)) {
        // iterations finished so far: the one in flight is `cur_iter`
        let finished = if self.iter_end != NEVER {
            self.cur_iter
        } else {
            self.next_iter
        };
        let mut order: Vec<&Seq> = self.running.iter().map(|(_, s)| s).collect();
        order.sort_unstable_by_key(|s| s.key);
        for s in order {
            let g = if s.lazy {
                s.generated + finished.saturating_sub(s.since) as u32
            } else {
                s.generated
            };
            f(s.id, g);
        }
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
    #[cfg(test)]
    pub fn submit(
        &mut self,
        now: Nanos,
        r: Request,
        out: &mut VecDeque<Completion>,
        m: &mut ReplicaMetrics,
    ) {
        self.submit_with(now, r, &[], 0, out, m)
    }

    /// [`submit`](Self::submit) with the prompt's block `hashes` (for the
    /// prefix cache) and `precomputed` prompt tokens whose KV arrives with
    /// the request (a disaggregated decode: their blocks are taken at
    /// admission, nothing is computed for them).
    #[inline(always)]
    pub fn submit_with(
        &mut self,
        now: Nanos,
        r: Request,
        hashes: &[u64],
        precomputed: u32,
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
                cached_tokens: 0,
            });
            return;
        }
        if let Some(pc) = &mut self.prefix {
            pc.enter(r.id, hashes);
        }
        if precomputed > 0 {
            self.ext = true;
        }
        let s = Seq {
            id: r.id,
            arrival: now,
            first_token: NEVER,
            last_token: now,
            prompt: r.input_tokens,
            output: r.output_tokens,
            generated: 0,
            // below the prompt: one prompt token at least is computed here
            computed: precomputed.min(r.input_tokens - 1),
            blocks: 0,
            chunk: 0,
            scheduled_once: false,
            key: 0,
            lazy: false,
            since: 0,
        };
        if self.profile.ingress == 0 {
            self.waiting.push_back(s);
            if self.iter_end == NEVER {
                self.start(now, m, false);
            }
        } else {
            self.ingress.push_back((now + self.profile.ingress, s));
        }
        m.waiting.set(now, self.waiting_len() as u64);
    }

    /// Process everything up to and including `now`; returns the time of
    /// the last thing processed (0 if nothing was due).
    pub fn advance(
        &mut self,
        now: Nanos,
        out: &mut VecDeque<Completion>,
        m: &mut ReplicaMetrics,
    ) -> Nanos {
        let mut last = 0;
        loop {
            let ing = self.ingress.front().map_or(NEVER, |x| x.0);
            let end = self.iter_end;
            if end <= now && end <= ing {
                if end < ing && self.lazy_alone() {
                    last = self.decode_run(false, now, ing, out, m);
                    continue;
                }
                self.finish(end, out, m);
                self.drain_ingress(end);
                let ing = self.ingress.front().map_or(NEVER, |x| x.0);
                if end < ing && self.lazy_alone() {
                    // e.g. prompts ended: the lazy batch alone from here
                    last = self.decode_run(true, now, ing, out, m);
                    continue;
                }
                self.start(end, m, true);
                last = end;
            } else if ing <= now {
                self.drain_ingress(ing);
                if self.iter_end == NEVER {
                    self.start(ing, m, false);
                }
                last = ing;
            } else {
                break;
            }
        }
        last
    }

    /// KV blocks the lazy sequences take in iteration `j` (one token each):
    /// those whose context then crosses a block boundary, (computed −
    /// since) ≡ −j (mod block size).
    #[inline]
    fn lazy_need(&self, j: u64) -> u64 {
        let bs = self.profile.block_size as u64;
        // without a division for the usual power-of-two block
        let r = if bs.is_power_of_two() {
            (bs - (j & (bs - 1))) & (bs - 1)
        } else {
            (bs - j % bs) % bs
        };
        self.lazy_mod[r as usize]
    }

    /// The iteration in flight (ending at `iter_end` ≤ `now`, before `ing`,
    /// the next request past the API ingress) is the lazy batch's alone (no
    /// eager sequence): finish it and the decode steps of the lazy batch
    /// that follow, one after another while they end by `now` and before
    /// `ing`. A step in which lazy sequences produce their last token is
    /// finished by `finish_iteration` itself (their completions out, their
    /// KV blocks and, with `finished_cells_held`, their cells held); any
    /// other is finished here with the same updates. The next step is
    /// started here when it is a decode step of the lazy batch alone
    /// (nothing the next may admit, and room for every lazy sequence's
    /// token: budget and KV blocks), with the same updates, in the same
    /// arithmetic, as `start_iteration(t, m, true)` makes then; else by
    /// `start_iteration` itself, and the run ends (`drain_ingress` has
    /// nothing due before `ing`). `finished`: the step in flight has been
    /// finished already (`finish_iteration`, `drain_ingress` at its end,
    /// `last_end`), the next one only is to start. Returns the end of the
    /// last step finished.
    fn decode_run(
        &mut self,
        finished: bool,
        now: Nanos,
        ing: Nanos,
        out: &mut VecDeque<Completion>,
        m: &mut ReplicaMetrics,
    ) -> Nanos {
        let total_blocks = self.profile.total_blocks;
        let budget = self.profile.max_batched_tokens as u64;
        // with attention padded to the buffer, A is not read (K is): the
        // decode cost's K = A is then exact with held cells in K
        let pad = self.profile.iteration.attention_pad > 0;
        // the next step admits the waiting queue's head once it starts after
        // a step that started at or after this; without async scheduling
        // anything waiting may be admitted (the queue does not change here)
        let admit = match self.waiting.front() {
            None => NEVER,
            Some(_) if !self.profile.iteration.async_scheduling => 0,
            Some(s) => s.arrival.saturating_add(self.profile.ingress),
        };
        let mut n = self.lazy_n;
        let mut cost = self.profile.iteration.decode_cost(n);
        // the step in flight finishes a sequence once cur_iter reaches this
        let mut first_done = self.first_done();
        // the gauges the batch changes: set at a run's first step and after
        // a finish (setting an unchanged gauge changes nothing)
        let mut gauges = true;
        let mut sums = RunSums::default();
        // the steps' inter-token latencies, added by counter
        let mut itl = Pending::default();
        let mut t = if finished {
            self.last_end
        } else {
            self.iter_end
        };
        let mut skip_finish = finished;
        loop {
            #[cfg(test)]
            let mut finished_in_run = false;
            if skip_finish {
                skip_finish = false;
            } else if first_done <= self.cur_iter {
                m.itl.flush(&mut itl);
                self.fit_run();
                self.finish(t, out, m);
                n = self.lazy_n;
                if n == 0 {
                    sums.add_to(m);
                    self.start(t, m, true);
                    return t;
                }
                cost = self.profile.iteration.decode_cost(n);
                first_done = self.first_done();
                gauges = true;
                #[cfg(test)]
                {
                    finished_in_run = true;
                }
            } else {
                // finish_iteration: every lazy sequence produced a token
                // right after its previous one; none is done
                // (sums, added to the metrics' at the end: they commute
                // with finish_iteration's additions)
                let start = self.iter_start;
                sums.iterations += 1;
                sums.gpu += self.iter_gpu;
                sums.engine += t - start;
                sums.tokens += n;
                m.itl.record_n_pending(&mut itl, t - start, n);
            }
            // start_iteration: a decode step of the lazy batch alone?
            let j = self.next_iter;
            let need = self.lazy_need(j);
            if admit <= self.iter_start || n > budget || need > self.free_blocks as u64 {
                sums.add_to(m);
                m.itl.flush(&mut itl);
                self.last_end = t;
                self.iter_end = NEVER;
                self.fit_run();
                self.start(t, m, true);
                return t;
            }
            if gauges {
                m.running.set(t, self.running.len() as u64);
                m.waiting
                    .set(t, (self.ingress.len() + self.waiting.len()) as u64);
                gauges = false;
            }
            // one token for each lazy sequence after computed = base + j
            let ctx = (self.lazy_base + (n * (j + 1)) as i64) as u64;
            // (the prefix cache is fitted to the free blocks before anything
            // frees blocks or reads the cache: below, and when the run ends)
            self.free_blocks -= need as u32;
            m.kv_blocks.set(t, (total_blocks - self.free_blocks) as u64);
            self.cur_iter = j;
            self.next_iter = j + 1;
            #[cfg(test)]
            if finished_in_run {
                RUN_FINISHES.with(|c| c.set(c.get() + 1));
            }
            let (dur, gpu) = if self.held_kv == 0 {
                cost.duration(ctx)
            } else if pad {
                // finished requests' cells held in the buffer: in K
                cost.duration(ctx + self.held_kv)
            } else {
                self.profile
                    .iteration
                    .duration(0, n, ctx + self.held_kv, ctx, n, true)
            };
            debug_assert!(self.profile.iteration.finished_cells_held || self.held_kv == 0);
            self.iter_start = t;
            self.iter_end = t + dur;
            self.iter_gpu = gpu;
            let next = self.iter_end;
            if next > now || next >= ing {
                break;
            }
            t = next;
        }
        sums.add_to(m);
        m.itl.flush(&mut itl);
        self.last_end = t;
        self.fit_run();
        t
    }

    /// The batch is lazy sequences alone (a decode run may go on).
    #[inline]
    fn lazy_alone(&self) -> bool {
        self.lazy_n > 0 && self.eager.is_empty()
    }

    /// The iteration producing the first of the lazy batch's last tokens.
    #[inline]
    fn first_done(&self) -> u64 {
        self.done_at
            .peek()
            .map_or(u64::MAX, |Reverse((last, _, _))| *last)
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

    /// [`start_iteration`](Self::start_iteration), its general version
    /// when the replica needs it.
    #[inline]
    fn start(&mut self, t: Nanos, m: &mut ReplicaMetrics, follows_step: bool) {
        if self.ext {
            self.start_iteration::<true>(t, m, follows_step)
        } else {
            self.start_iteration::<false>(t, m, follows_step)
        }
    }

    /// [`finish_iteration`](Self::finish_iteration), its general version
    /// when the replica needs it.
    #[inline]
    fn finish(&mut self, t: Nanos, out: &mut VecDeque<Completion>, m: &mut ReplicaMetrics) {
        if self.ext {
            self.finish_iteration::<true>(t, out, m)
        } else {
            self.finish_iteration::<false>(t, out, m)
        }
    }

    fn preempt_newest<const X: bool>(&mut self, run: &mut Vec<Seq>, m: &mut ReplicaMetrics) {
        let mut v = run.pop().expect("running not empty");
        debug_assert!(!v.lazy);
        let k = self.eager.pop();
        debug_assert_eq!(k.map(|x| x.0), Some(v.key));
        self.free_blocks += self.release::<X>(v.id, v.blocks, false).0;
        v.blocks = 0;
        v.computed = 0;
        v.chunk = 0;
        m.preemptions += 1;
        self.waiting.push_front(v);
    }

    /// Schedule one iteration starting at `t` (or go idle); `follows_step`:
    /// `t` is the end of the previous iteration. With `async_scheduling` such
    /// a step was scheduled when the previous one started (vLLM schedules
    /// step N+1 while step N runs), so it admits only requests the engine
    /// had by then; its CPU part overlapped that step (`IterationModel::duration`).
    fn start_iteration<const X: bool>(
        &mut self,
        t: Nanos,
        m: &mut ReplicaMetrics,
        follows_step: bool,
    ) {
        let mut follows_step = follows_step && self.profile.iteration.async_scheduling;
        // requests that reached the engine after this moment wait a step
        let mut cutoff = if follows_step { self.iter_start } else { NEVER };
        let bs = self.profile.block_size;
        let mut budget = self.profile.max_batched_tokens;
        let (mut p, mut d, mut k, mut a, mut n) = (0u64, 0u64, 0u64, 0u64, 0u64);
        let mut preempted = false;
        let j = self.next_iter;
        if self.lazy_n > 0 {
            // can every running sequence have its whole work? then the
            // batch's order does not matter and the lazy ones stay lazy
            let lazy_need = self.lazy_need(j);
            let (mut tokens, mut blocks) = (self.lazy_n, lazy_need);
            for &(_, slot) in &self.eager {
                let s = self.running.get(slot);
                let pending = s.pending();
                tokens += pending as u64;
                blocks += ((s.computed + pending).div_ceil(bs) - s.blocks) as u64;
            }
            if tokens <= budget as u64 && blocks <= self.free_blocks as u64 {
                for e in 0..self.eager.len() {
                    let s = self.running.get_mut(self.eager[e].1);
                    let chunk = s.pending();
                    let need = (s.computed + chunk).div_ceil(bs) - s.blocks;
                    s.blocks += need;
                    s.chunk = chunk;
                    if chunk > 1 {
                        p += chunk as u64;
                    } else {
                        d += 1;
                    }
                    k += (s.computed + chunk) as u64;
                    a += IterationModel::attn_pairs(s.computed, chunk);
                    n += 1;
                    self.free_blocks -= need;
                    budget -= chunk;
                }
                // each lazy sequence: one token after computed = base + j
                let ctx = (self.lazy_base + (self.lazy_n * (j + 1)) as i64) as u64;
                self.free_blocks -= lazy_need as u32;
                budget -= self.lazy_n as u32;
                d += self.lazy_n;
                k += ctx;
                a += ctx;
                n += self.lazy_n;
            } else {
                self.concrete_all(j);
            }
        }
        // 1. the running batch, oldest first, one sequence at a time (all
        // are concrete)
        let mut run: Vec<Seq> = if self.lazy_n > 0 {
            Vec::new()
        } else {
            self.running.take_by_key()
        };
        let mut i = 0;
        while i < run.len() && budget > 0 {
            let s = &run[i];
            let pending = s.pending();
            let chunk = pending.min(budget);
            let need = (s.computed + chunk).div_ceil(bs) - s.blocks;
            let mut self_preempted = false;
            while self.free_blocks < need {
                let last = run.len() - 1;
                self.preempt_newest::<X>(&mut run, m);
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
            let s = &mut run[i];
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
        if !run.is_empty() {
            // every running sequence is eager here: keys ascending
            self.eager.clear();
            for s in run {
                let key = s.key;
                let slot = self.running.insert(s);
                self.eager.push((key, slot));
            }
        }
        // 2. admit from the waiting queue (not in a step that preempted)
        if !preempted {
            // a second pass only when nothing could run ahead (below)
            loop {
                let max = self.profile.max_num_seqs as usize;
                while self.running.len() < max {
                    let Some(s) = self.waiting.front() else { break };
                    if s.arrival.saturating_add(self.profile.ingress) > cutoff {
                        break;
                    }
                    // prompt tokens computed (found in the prefix cache, or
                    // arriving with the request), the KV blocks of the
                    // cached units (`have`) and the free blocks holding the
                    // evictable ones takes (`pin`)
                    let (hit, pin, computed, have) = if X {
                        admission_prefix(&self.prefix, s)
                    } else {
                        (0, 0, 0, 0)
                    };
                    let pending = s.prompt + s.generated - computed;
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
                    let need = (computed + chunk).div_ceil(bs) - have;
                    if need + pin > self.free_blocks {
                        break;
                    }
                    let mut s = self.waiting.pop_front().expect("front exists");
                    if X {
                        if let Some(pc) = &mut self.prefix {
                            pc.admit(s.id, s.prompt, hit);
                            self.free_blocks -= pin;
                        }
                    }
                    s.key = self.next_key;
                    self.next_key += 1;
                    let key = s.key;
                    self.free_blocks -= need;
                    s.computed = computed;
                    s.blocks = have + need;
                    s.chunk = chunk;
                    if !s.scheduled_once {
                        s.scheduled_once = true;
                        m.queue_delay.record(t - s.arrival);
                        // the engine clears the idle slots' cells when it
                        // starts a request
                        self.held_kv = 0;
                    }
                    budget = budget.saturating_sub(chunk);
                    if pending > 1 {
                        p += chunk as u64;
                    } else {
                        d += 1;
                    }
                    k += (computed + chunk) as u64;
                    a += IterationModel::attn_pairs(computed, chunk);
                    n += 1;
                    let slot = self.running.insert(s);
                    self.eager.push((key, slot));
                }
                if n == 0 && cutoff != NEVER && !self.waiting.is_empty() {
                    // nothing was scheduled ahead: the engine schedules now, from idle
                    cutoff = NEVER;
                    follows_step = false;
                    continue;
                }
                break;
            }
        }
        self.fit_cache::<X>();
        m.running.set(t, self.running.len() as u64);
        m.waiting
            .set(t, (self.ingress.len() + self.waiting.len()) as u64);
        m.kv_blocks
            .set(t, (self.profile.total_blocks - self.free_blocks) as u64);
        if n == 0 {
            self.iter_end = NEVER;
            return;
        }
        self.cur_iter = j;
        self.next_iter = j + 1;
        let (dur, gpu) =
            self.profile
                .iteration
                .duration(p, d, k + self.held_kv, a, n, follows_step);
        m.prefill_tokens += p;
        self.iter_start = t;
        self.iter_end = t + dur;
        self.iter_gpu = gpu;
    }

    fn finish_iteration<const X: bool>(
        &mut self,
        t: Nanos,
        out: &mut VecDeque<Completion>,
        m: &mut ReplicaMetrics,
    ) {
        let start = self.iter_start;
        let j = self.cur_iter;
        m.iterations += 1;
        m.gpu_busy_ns += self.iter_gpu as u128;
        m.engine_busy_ns += (t - start) as u128;
        // every lazy sequence produced a token right after its previous one
        let mut same_gap = self.lazy_n;
        m.output_tokens += self.lazy_n;
        let mut done = std::mem::take(&mut self.done);
        let mut e = 0;
        while e < self.eager.len() {
            let (key, slot) = self.eager[e];
            let s = self.running.get_mut(slot);
            if s.chunk == 0 {
                e += 1;
                continue;
            }
            s.computed += s.chunk;
            s.chunk = 0;
            let mut token = false;
            if s.computed == s.prompt + s.generated {
                token = true;
                s.generated += 1;
                m.output_tokens += 1;
                if s.first_token == NEVER {
                    s.first_token = t;
                    m.ttft.record(t - s.arrival);
                    if X {
                        if let Some(pc) = &mut self.prefix {
                            pc.register(s.id, s.prompt);
                        }
                    }
                } else if s.last_token == start {
                    same_gap += 1;
                } else {
                    m.itl.record(t - s.last_token);
                }
                s.last_token = t;
                if s.generated == s.output {
                    done.push((key, slot));
                    token = false;
                }
            }
            if token && self.lazy_batch {
                self.make_lazy(slot, j + 1);
                self.eager.remove(e);
            } else {
                e += 1;
            }
        }
        m.itl.record_n(t - start, same_gap);
        while let Some(&Reverse((last, key, slot))) = self.done_at.peek() {
            if last > j {
                break;
            }
            debug_assert_eq!(last, j);
            self.done_at.pop();
            self.make_concrete(slot, j + 1);
            let s = self.running.get_mut(slot);
            s.last_token = t;
            debug_assert_eq!(s.generated, s.output);
            done.push((key, slot));
        }
        if !done.is_empty() {
            done.sort_unstable();
            let mut freed = 0;
            for &(key, slot) in &done {
                let s = self.running.remove(slot);
                if let Ok(e) = self.eager.binary_search(&(key, slot)) {
                    self.eager.remove(e);
                }
                let (f, cached) = match &mut self.prefix {
                    Some(pc) if X => pc.release(s.id, s.blocks, true),
                    _ => (s.blocks, 0),
                };
                freed += f;
                if self.profile.iteration.finished_cells_held {
                    self.held_kv += s.computed as u64;
                }
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
                    replica: self.idx,
                    rejected: false,
                    cached_tokens: cached,
                });
            }
            self.free_blocks += freed;
            done.clear();
        }
        self.done = done;
        self.last_end = t;
        self.iter_end = NEVER;
    }
}

/// At the admission of `s` with a prefix cache or precomputed tokens:
/// (cached units, free blocks to pin them, tokens computed, blocks of the
/// cached units).
#[inline(never)]
fn admission_prefix(prefix: &Option<Box<PrefixCache>>, s: &Seq) -> (u32, u32, u32, u32) {
    let (hit, pin) = match prefix {
        Some(pc) if s.computed == 0 => pc.lookup(s.id, s.prompt),
        _ => (0, 0),
    };
    match prefix {
        Some(pc) if hit > 0 => (hit, pin, hit * pc.unit, hit * pc.unit_blocks),
        _ => (0, 0, s.computed, 0),
    }
}

/// A decode run's finished steps: their count, GPU-busy and engine-busy
/// nanoseconds, and output tokens (each below 2^64 over a run).
#[derive(Default)]
struct RunSums {
    iterations: u64,
    gpu: u64,
    engine: u64,
    tokens: u64,
}

impl RunSums {
    #[inline]
    fn add_to(&self, m: &mut ReplicaMetrics) {
        m.iterations += self.iterations;
        m.gpu_busy_ns += self.gpu as u128;
        m.engine_busy_ns += self.engine as u128;
        m.output_tokens += self.tokens;
    }
}

/// (computed − since) modulo the block size.
#[inline]
fn residue(computed: u32, since: u64, bs: u32) -> usize {
    (computed as i64 - since as i64).rem_euclid(bs as i64) as usize
}

/// The running batch's storage: O(1) access by slot, a freed slot reused
/// (at most `max_num_seqs` slots ever). Iteration is in slot order, not
/// admission order: callers that need the latter sort by `Seq::key`.
#[derive(Default)]
struct Slots {
    slots: Vec<Option<Seq>>,
    free: Vec<u32>,
}

impl Slots {
    #[inline]
    fn insert(&mut self, s: Seq) -> u32 {
        if let Some(i) = self.free.pop() {
            self.slots[i as usize] = Some(s);
            i
        } else {
            self.slots.push(Some(s));
            (self.slots.len() - 1) as u32
        }
    }

    /// Sequences held: every slot but the free ones.
    #[inline]
    fn len(&self) -> usize {
        self.slots.len() - self.free.len()
    }

    #[inline]
    fn get(&self, slot: u32) -> &Seq {
        self.slots[slot as usize].as_ref().expect("a running slot")
    }

    #[inline]
    fn get_mut(&mut self, slot: u32) -> &mut Seq {
        self.slots[slot as usize].as_mut().expect("a running slot")
    }

    #[inline]
    fn remove(&mut self, slot: u32) -> Seq {
        let s = self.slots[slot as usize].take().expect("a running slot");
        self.free.push(slot);
        s
    }

    fn iter(&self) -> impl Iterator<Item = (u32, &Seq)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.as_ref().map(|s| (i as u32, s)))
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = (u32, &mut Seq)> {
        self.slots
            .iter_mut()
            .enumerate()
            .filter_map(|(i, s)| s.as_mut().map(|s| (i as u32, s)))
    }

    /// Every sequence out, in admission order; the slots are emptied.
    fn take_by_key(&mut self) -> Vec<Seq> {
        let mut v: Vec<Seq> = self.slots.drain(..).flatten().collect();
        v.sort_unstable_by_key(|s| s.key);
        self.free.clear();
        v
    }
}

/// A lazy sequence as of the start of iteration `j` (`j − since` tokens
/// decoded since), given the end of the last finished iteration.
fn concrete(s: &mut Seq, j: u64, bs: u32, last_end: Nanos) {
    let steps = (j - s.since) as u32;
    if steps > 0 {
        s.computed += steps;
        s.generated += steps;
        s.blocks = s.computed.div_ceil(bs);
        s.last_token = last_end;
    }
    s.lazy = false;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::rng;
    use rand::Rng;
    use std::collections::BTreeMap;

    /// Drive one replica with `n` requests arriving every `gap` ns, lengths
    /// drawn from `seed`; returns the completions and the metrics' Debug.
    fn drive(
        prof: &Arc<ServerProfile>,
        lazy: bool,
        n: u64,
        gap: Nanos,
        seed: u64,
    ) -> (Vec<Completion>, String) {
        let mut r = Replica::new(0, prof.clone());
        r.lazy_batch = lazy;
        let mut m = ReplicaMetrics::new(prof.total_blocks);
        let mut out = VecDeque::new();
        let mut g = rng::stream(seed, 1, 2);
        let mut t = 0;
        for id in 0..n {
            t += gap;
            r.advance(t, &mut out, &mut m);
            let req = Request {
                id,
                input_tokens: g.gen_range(1..600),
                output_tokens: g.gen_range(1..400),
            };
            r.submit(t, req, &mut out, &mut m);
        }
        while r.deadline() != NEVER {
            let d = r.deadline();
            r.advance(d, &mut out, &mut m);
        }
        assert_eq!(r.outstanding(), 0, "every request answered (lazy {lazy})");
        assert_eq!(r.free_blocks, prof.total_blocks, "every KV block back");
        assert_eq!((r.lazy_n, r.lazy_base, r.eager.len()), (0, 0, 0));
        assert!(r.lazy_mod.iter().all(|&c| c == 0) && r.done_at.is_empty());
        let mut key = format!("{m:?}");
        // the histograms' contents (their Debug shows the count only)
        for h in [&m.ttft, &m.itl, &m.tpot, &m.e2e, &m.queue_delay] {
            let q: Vec<f64> = (0..=200).map(|i| h.quantile_s(i as f64 / 200.0)).collect();
            key += &format!(" {q:?} {} {}", h.sum_s(), h.max_s());
        }
        (out.into_iter().collect(), key)
    }

    /// `progress` (what `qsim serve` streams) reads the lazy batch as the
    /// sequence-by-sequence reference counts it, after every step: the same
    /// (id, generated) pairs, never decreasing, never above the output.
    #[test]
    fn progress_of_the_lazy_batch_equals_the_reference() {
        let base = crate::server::load_profile(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/llama-3.1-8b-h100-vllm.toml"
        )))
        .unwrap();
        for (blocks, budget) in [(100_000, 8192), (150, 8192), (100_000, 300)] {
            let mut p = base.clone();
            p.total_blocks = blocks;
            p.max_batched_tokens = budget;
            p.max_model_len = 1000;
            let p = Arc::new(p);
            let mut reps: Vec<Replica> = [true, false]
                .into_iter()
                .map(|lazy| {
                    let mut r = Replica::new(0, p.clone());
                    r.lazy_batch = lazy;
                    r
                })
                .collect();
            let mut ms: Vec<ReplicaMetrics> = (0..2)
                .map(|_| ReplicaMetrics::new(p.total_blocks))
                .collect();
            let mut outs = [VecDeque::new(), VecDeque::new()];
            let mut g = rng::stream(9, 1, 2);
            let mut seen: BTreeMap<u64, u32> = BTreeMap::new();
            let mut t = 0;
            let mut next_id = 0;
            let mut steps = 0;
            loop {
                let d = reps[0].deadline();
                assert_eq!(d, reps[1].deadline());
                let arrive = if next_id < 300 { t + 3_000_000 } else { NEVER };
                if d == NEVER && arrive == NEVER {
                    break;
                }
                t = d.min(arrive);
                for i in 0..2 {
                    reps[i].advance(t, &mut outs[i], &mut ms[i]);
                }
                if t == arrive {
                    let req = Request {
                        id: next_id,
                        input_tokens: g.gen_range(1..400),
                        output_tokens: g.gen_range(1..300),
                    };
                    next_id += 1;
                    for i in 0..2 {
                        reps[i].submit(t, req, &mut outs[i], &mut ms[i]);
                    }
                }
                let mut prog = [Vec::new(), Vec::new()];
                for i in 0..2 {
                    reps[i].progress(&mut |id, n| prog[i].push((id, n)));
                }
                assert_eq!(prog[0], prog[1], "at {t}");
                for &(id, n) in &prog[0] {
                    let old = seen.insert(id, n).unwrap_or(0);
                    assert!(n >= old, "{id}: {old} → {n}");
                    let s = reps[1].running.iter().find(|(_, s)| s.id == id).unwrap().1;
                    assert!(n <= s.output);
                }
                steps += 1;
            }
            assert_eq!(outs[0], outs[1]);
            assert_eq!(outs[0].len(), 300);
            assert!(steps > 600, "{steps} steps");
        }
    }

    /// The lazy batch gives exactly what scheduling every sequence every
    /// iteration gives: same completions in the same order, same metrics,
    /// with KV blocks short (preemptions), the token budget short, block
    /// sizes that do not divide the lengths, no chunked prefill, no ingress.
    #[test]
    fn lazy_batch_equals_sequence_by_sequence() {
        let base = crate::server::load_profile(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/gpt-oss-20b-h100-nim.toml"
        )))
        .unwrap();
        let mut preempting = 0;
        for (k, (blocks, bs, budget, chunked, ingress)) in [
            (100_000, 16, 8192, true, 8_500_000),
            (120, 16, 8192, true, 8_500_000),
            (1100, 1, 8192, true, 0),
            (200, 7, 300, true, 0),
            (150, 16, 1000, false, 2_000_000),
            (100_000, 5, 256, true, 0),
            (100_000, 16, 8192, true, 8_500_000),
            (120, 16, 300, true, 0),
            (100_000, 16, 8192, true, 2_000_000),
        ]
        .into_iter()
        .enumerate()
        {
            let mut p = base.clone();
            // the last three: asynchronous scheduling (the last: a request
            // reaching the engine mid-step waits while the lazy batch decodes)
            p.iteration.async_scheduling = k >= 6;
            p.total_blocks = blocks;
            p.block_size = bs;
            p.max_batched_tokens = budget;
            p.max_num_seqs = p.max_num_seqs.min(budget);
            p.chunked_prefill = chunked;
            p.ingress = ingress;
            p.max_model_len = 1000; // within every KV cache above
            let p = Arc::new(p);
            for gap in [2_000_000, 10_000_000, 40_000_000] {
                let (c1, m1) = drive(&p, true, 3000, gap, k as u64);
                let (c0, m0) = drive(&p, false, 3000, gap, k as u64);
                assert_eq!(c1.len(), 3000);
                assert!(c1 == c0, "profile {k}, gap {gap}: completions differ");
                assert!(m1 == m0, "profile {k}, gap {gap}: metrics differ");
                if !m1.contains("preemptions: 0,") {
                    preempting += 1;
                }
            }
        }
        assert!(preempting >= 3, "the cases exercise preemption");
    }

    /// Submit `reqs` ((arrival, input tokens, output tokens), by arrival)
    /// to a fresh replica of `p` and run it dry: the completions by id.
    fn run_dry(p: ServerProfile, reqs: &[(Nanos, u32, u32)]) -> Vec<Completion> {
        let mut r = Replica::new(0, Arc::new(p));
        let mut m = ReplicaMetrics::new(r.profile.total_blocks);
        let mut out = VecDeque::new();
        for (id, &(at, input_tokens, output_tokens)) in reqs.iter().enumerate() {
            r.advance(at, &mut out, &mut m);
            let req = Request {
                id: id as u64,
                input_tokens,
                output_tokens,
            };
            r.submit(at, req, &mut out, &mut m);
        }
        while r.deadline() != NEVER {
            let d = r.deadline();
            r.advance(d, &mut out, &mut m);
        }
        let mut c: Vec<_> = out.into_iter().collect();
        c.sort_by_key(|c| c.id);
        c
    }

    /// `finished_cells_held` (llama-server's idle slots): a finished
    /// request's cells count in every later step's K until a request is
    /// next first scheduled. A (400-token prompt, 2 tokens) and B (16, 20)
    /// arrive at once; the first step is A's prompt (it started at A's
    /// submission), the second B's prompt and A's last token, so A
    /// finishes with 401 cells and each of B's 19 steps alone after it
    /// costs `duration` at K + 401 instead of K (K = B's context, 17 to
    /// 35): B ends later by exactly that sum. C, arriving after both, clears the held cells when it is
    /// first scheduled: its whole run is the same with and without.
    #[test]
    fn finished_cells_count_in_k_until_the_next_request_starts() {
        let base = crate::server::load_profile(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/llama-cpp-tiny-cpu.toml"
        )))
        .unwrap();
        assert!(base.iteration.attention_pad > 0);
        let run = |held: bool| -> Vec<(Nanos, Nanos, Nanos)> {
            let mut p = base.clone();
            p.ingress = 0;
            p.iteration.finished_cells_held = held;
            let reqs = [
                (0, 400, 2),
                (0, 16, 20),
                (10 * crate::time::NS_PER_SEC, 64, 8),
            ];
            run_dry(p, &reqs)
                .iter()
                .map(|c| (c.arrival, c.first_token, c.finished))
                .collect()
        };
        let (on, off) = (run(true), run(false));
        let it = &base.iteration;
        let extra: Nanos = (17..=35u64)
            .map(|k| it.duration(0, 1, k + 401, 0, 1, true).0 - it.duration(0, 1, k, 0, 1, true).0)
            .sum();
        assert!(extra > 0, "401 held cells change K's padding");
        assert_eq!(on[0], off[0], "A is unchanged");
        assert_eq!(on[1].1, off[1].1, "B's first token is unchanged");
        assert_eq!(on[1].2, off[1].2 + extra, "B's steps after A finished");
        let rel = |c: (Nanos, Nanos, Nanos)| (c.1 - c.0, c.2 - c.0);
        assert_eq!(rel(on[2]), rel(off[2]), "C cleared the held cells");
    }

    /// Asynchronous scheduling: a step that follows another takes max(cpu,
    /// gpu) and admits only what had arrived when the previous step started
    /// (vLLM schedules step N+1 while step N runs); from idle it takes cpu +
    /// gpu and admits everything waiting.
    #[test]
    fn async_scheduling_overlaps_the_cpu_and_admits_a_step_later() {
        let base = crate::server::load_profile(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/gpt-oss-20b-h100-nim.toml"
        )))
        .unwrap();
        const MS: Nanos = 1_000_000;
        // every step: GPU 1 ms, CPU 0.4 ms
        let run = |asynchronous: bool, reqs: &[(Nanos, u32)]| -> Vec<(Nanos, Nanos)> {
            let mut p = base.clone();
            p.ingress = 0;
            p.iteration = IterationModel {
                gpu_fixed_ns: 0.0,
                mem_base_ns: 1e6,
                mem_per_kv_token_ns: 0.0,
                comp_per_token_ns: 0.0,
                comp_per_attn_pair_ns: 0.0,
                cached_prefix_tokens: 0,
                cpu_base_ns: 0.4e6,
                cpu_per_seq_ns: 0.0,
                async_scheduling: asynchronous,
                decode_step_ns: Vec::new(),
                decode_step_slope_ns: Vec::new(),
                decode_step_ctx: 0.0,
                attention_pad: 0,
                finished_cells_held: false,
                attention_separate: false,
            };
            let reqs: Vec<_> = reqs.iter().map(|&(at, output)| (at, 1, output)).collect();
            run_dry(p, &reqs)
                .iter()
                .map(|c| (c.first_token, c.finished))
                .collect()
        };
        let us = |ms: f64| (ms * MS as f64).round() as Nanos;
        // A at 0 (5 tokens), B at 1.9 ms (2 tokens)
        let reqs = [(0, 5), (us(1.9), 2)];
        // synchronous: every step 1.4 ms; B joins the step starting at 2.8
        assert_eq!(
            run(false, &reqs),
            vec![(us(1.4), us(7.0)), (us(4.2), us(5.6))]
        );
        // asynchronous: 1.4 ms from idle, then 1 ms; the step starting at 2.4
        // was scheduled at 1.4, before B: B joins the one starting at 3.4
        assert_eq!(
            run(true, &reqs),
            vec![(us(1.4), us(5.4)), (us(4.4), us(5.4))]
        );
        // A (2 tokens) ends at 2.4; C arrived at 2.0, after the last step was
        // scheduled: nothing runs ahead, so C's step starts from idle at 2.4
        let reqs = [(0, 2), (us(2.0), 1)];
        assert_eq!(
            run(true, &reqs),
            vec![(us(1.4), us(2.4)), (us(3.8), us(3.8))]
        );
    }

    /// Requests sharing prefixes: `groups` system prompts of `sys` units,
    /// then units of the request's own (hash = its id's), `unit` tokens each.
    fn shared_prefix_requests(
        seed: u64,
        n: u64,
        gap: Nanos,
        unit: u32,
        groups: u64,
    ) -> Vec<(Nanos, Request, Vec<u64>)> {
        let mut g = rng::stream(seed, 1, 2);
        (0..n)
            .map(|id| {
                let sys = g.gen_range(0..4u32);
                let own = g.gen_range(0..5u32);
                let tail = g.gen_range(1..unit);
                let group = g.gen_range(0..groups);
                let mut h: Vec<u64> = (0..sys).map(|k| (group << 8) | k as u64).collect();
                h.extend((0..own).map(|k| (1 << 40) | (id << 8) | k as u64));
                // the partial last unit's hash too (never cached)
                h.push((1 << 41) | id);
                let input = (sys + own) * unit + tail;
                let req = Request {
                    id,
                    input_tokens: input,
                    output_tokens: g.gen_range(1..200),
                };
                (id * gap, req, h)
            })
            .collect()
    }

    fn drive_prefixed(
        prof: &Arc<ServerProfile>,
        lazy: bool,
        unit: u32,
        reqs: &[(Nanos, Request, Vec<u64>)],
    ) -> (Vec<Completion>, String, u64) {
        let mut r = Replica::new(0, prof.clone()).with_prefix_cache(unit);
        r.lazy_batch = lazy;
        let mut m = ReplicaMetrics::new(prof.total_blocks);
        let mut out = VecDeque::new();
        let mut checks = 0;
        let check = |r: &Replica| {
            let pc = r.prefix.as_ref().unwrap();
            pc.check();
            assert!(
                pc.evictable_blocks() <= r.free_blocks as u64,
                "cache over free space"
            );
            assert!(r.free_blocks <= prof.total_blocks);
        };
        for (at, req, h) in reqs {
            r.advance(*at, &mut out, &mut m);
            check(&r);
            r.submit_with(*at, *req, h, 0, &mut out, &mut m);
            checks += 1;
        }
        while r.deadline() != NEVER {
            let d = r.deadline();
            r.advance(d, &mut out, &mut m);
            check(&r);
        }
        assert_eq!(r.outstanding(), 0);
        assert_eq!(r.free_blocks, prof.total_blocks, "every held block back");
        let pc = r.prefix.as_ref().unwrap();
        let key = format!("{m:?} {:?}", pc.stats);
        (out.into_iter().collect(), key, checks)
    }

    /// With prefix caching, the lazy batch still equals the reference,
    /// with KV short (preemption releases held units) and not; the cache's
    /// reference counts match the requests holding units after every step,
    /// the evictable units fit in the free blocks, every block comes back.
    #[test]
    fn prefix_cache_lazy_equals_reference_and_keeps_its_books() {
        let base = crate::server::load_profile(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/llama-3.1-8b-h100-vllm.toml"
        )))
        .unwrap();
        let mut preempting = 0;
        for (blocks, budget, unit, chunked) in [
            (100_000, 8192, 64, true),
            (300, 8192, 64, true),
            (260, 512, 32, true),
            (400, 2048, 16, false),
        ] {
            let mut p = base.clone();
            p.total_blocks = blocks;
            p.max_batched_tokens = budget;
            p.chunked_prefill = chunked;
            p.max_model_len = 8 * unit + 200;
            let p = Arc::new(p);
            for gap in [3_000_000, 20_000_000] {
                let reqs = shared_prefix_requests(blocks as u64, 1500, gap, unit, 5);
                let (c1, m1, _) = drive_prefixed(&p, true, unit, &reqs);
                let (c0, m0, _) = drive_prefixed(&p, false, unit, &reqs);
                assert_eq!(c1.len(), 1500);
                assert!(c1 == c0, "{blocks} {gap}: completions differ");
                assert!(m1 == m0, "{blocks} {gap}: metrics differ");
                assert!(c1.iter().any(|c| c.cached_tokens > 0));
                if !m1.contains("preemptions: 0,") {
                    preempting += 1;
                }
            }
        }
        assert!(preempting >= 2, "the cases exercise preemption");
    }

    /// Two requests with the same three leading units, the second long
    /// after the first: the second finds them (its prefill is three units
    /// shorter, its TTFT too); a third whose whole prompt is cached
    /// computes its last unit (one prompt token at least is computed).
    #[test]
    fn a_repeated_prefix_is_not_prefilled_again() {
        let mut p = crate::server::load_profile(std::path::Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../models/llama-3.1-8b-h100-vllm.toml"
        )))
        .unwrap();
        p.ingress = 0;
        let p = Arc::new(p);
        let unit = 512;
        let s = crate::time::NS_PER_SEC;
        let reqs = vec![
            (
                0,
                Request {
                    id: 0,
                    input_tokens: 3 * 512 + 100,
                    output_tokens: 5,
                },
                vec![1, 2, 3, 10],
            ),
            (
                10 * s,
                Request {
                    id: 1,
                    input_tokens: 3 * 512 + 100,
                    output_tokens: 5,
                },
                vec![1, 2, 3, 11],
            ),
            (
                20 * s,
                Request {
                    id: 2,
                    input_tokens: 3 * 512,
                    output_tokens: 5,
                },
                vec![1, 2, 3],
            ),
        ];
        let (c, key, _) = drive_prefixed(&p, true, unit, &reqs);
        let by = |id: u64| c.iter().find(|x| x.id == id).unwrap();
        assert_eq!(by(0).cached_tokens, 0);
        assert_eq!(by(1).cached_tokens, 3 * 512);
        assert_eq!(by(2).cached_tokens, 2 * 512, "the last unit is computed");
        let ttft = |id: u64| by(id).first_token - by(id).arrival;
        assert!(ttft(1) < ttft(0), "{} {}", ttft(1), ttft(0));
        // units offered: 3 + 3 + 3 full; found: 0 + 3 + 3; prefill 1636 +
        // 100 + 512 tokens
        assert!(
            key.contains("units: 9, hit_units: 6, saved_tokens: 2560"),
            "{key}"
        );
        assert!(key.contains("prefill_tokens: 2248,"), "{key}");
    }
}
