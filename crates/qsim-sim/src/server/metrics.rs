//! Server metrics: streaming histograms, counters and time-weighted gauges.
//! Memory is constant in the number of requests.

use crate::engine::DurationHist;
use crate::time::Nanos;

/// A time-weighted gauge: the integral of a piecewise-constant value.
#[derive(Debug, Clone, Default)]
pub struct TimeAvg {
    last: Nanos,
    value: u64,
    /// ∫ value dt in value·ns.
    area: u128,
    pub max: u64,
}

impl TimeAvg {
    /// The value changes to `v` at time `now` (≥ the last change).
    #[inline]
    pub fn set(&mut self, now: Nanos, v: u64) {
        if v == self.value {
            // unchanged: the area to come is the same integer either way
            // (value × (t − last) splits exactly at `now`), and max ≥ value
            return;
        }
        if now > self.last {
            self.area += self.value as u128 * (now - self.last) as u128;
            self.last = now;
        }
        self.value = v;
        self.max = self.max.max(v);
    }

    #[inline]
    pub fn value(&self) -> u64 {
        self.value
    }

    /// ∫ value dt from 0 to `until` (the current value extends to `until`).
    pub fn area(&self, until: Nanos) -> u128 {
        self.area + self.value as u128 * until.saturating_sub(self.last) as u128
    }

    /// Time average over [0, until].
    pub fn mean(&self, until: Nanos) -> f64 {
        if until == 0 {
            0.0
        } else {
            self.area(until) as f64 / until as f64
        }
    }

    fn merge(&mut self, o: &TimeAvg, until: Nanos) {
        // merged gauges are read at `until` only
        self.area = self.area(until) + o.area(until);
        self.last = until;
        self.value += o.value;
        self.max += o.max;
    }
}

/// Metrics of one replica (or the sum over replicas).
#[derive(Debug, Clone, Default)]
pub struct ReplicaMetrics {
    /// Arrival → first token.
    pub ttft: DurationHist,
    /// Every gap between consecutive tokens of a request.
    pub itl: DurationHist,
    /// Per request: (finished − first token) / (output tokens − 1).
    pub tpot: DurationHist,
    /// Arrival → last token.
    pub e2e: DurationHist,
    /// Arrival → first scheduled in an iteration.
    pub queue_delay: DurationHist,
    pub submitted: u64,
    pub completed: u64,
    /// Requests that can never run (too long for the model or the KV cache).
    pub rejected: u64,
    pub preemptions: u64,
    pub iterations: u64,
    /// Input tokens of completed requests.
    pub input_tokens: u64,
    /// Output tokens generated (by completed and in-flight requests).
    pub output_tokens: u64,
    /// Prefill tokens computed, including recomputation after preemption.
    pub prefill_tokens: u64,
    /// GPU-busy nanoseconds (finished iterations).
    pub gpu_busy_ns: u128,
    /// Engine-busy nanoseconds (an iteration running, CPU or GPU part).
    pub engine_busy_ns: u128,
    /// Sequences in the running batch.
    pub running: TimeAvg,
    /// Requests waiting (including those not yet past the API ingress).
    pub waiting: TimeAvg,
    /// KV blocks in use.
    pub kv_blocks: TimeAvg,
    pub total_blocks: u64,
}

impl ReplicaMetrics {
    pub fn new(total_blocks: u32) -> Self {
        ReplicaMetrics {
            total_blocks: total_blocks as u64,
            ..Default::default()
        }
    }

    /// Fraction of [0, until] during which the GPU ran an iteration's kernels.
    pub fn gpu_util(&self, until: Nanos) -> f64 {
        if until == 0 {
            0.0
        } else {
            (self.gpu_busy_ns as f64 / until as f64).min(1.0)
        }
    }

    /// Fraction of [0, until] during which an iteration was running.
    pub fn engine_util(&self, until: Nanos) -> f64 {
        if until == 0 {
            0.0
        } else {
            (self.engine_busy_ns as f64 / until as f64).min(1.0)
        }
    }

    /// Time-averaged fraction of KV blocks in use over [0, until].
    pub fn kv_util(&self, until: Nanos) -> f64 {
        if self.total_blocks == 0 {
            0.0
        } else {
            self.kv_blocks.mean(until) / self.total_blocks as f64
        }
    }

    /// Peak fraction of KV blocks in use.
    pub fn kv_util_max(&self) -> f64 {
        if self.total_blocks == 0 {
            0.0
        } else {
            self.kv_blocks.max as f64 / self.total_blocks as f64
        }
    }

    /// Time-averaged requests in the server (waiting + running).
    pub fn concurrency_mean(&self, until: Nanos) -> f64 {
        self.running.mean(until) + self.waiting.mean(until)
    }

    /// Add `o` into `self`; time-weighted gauges are summed as of `until`
    /// (busy fractions and KV utilisation of a sum are averages over replicas).
    pub fn merge(&mut self, o: &ReplicaMetrics, until: Nanos) {
        self.ttft.merge(&o.ttft);
        self.itl.merge(&o.itl);
        self.tpot.merge(&o.tpot);
        self.e2e.merge(&o.e2e);
        self.queue_delay.merge(&o.queue_delay);
        self.submitted += o.submitted;
        self.completed += o.completed;
        self.rejected += o.rejected;
        self.preemptions += o.preemptions;
        self.iterations += o.iterations;
        self.input_tokens += o.input_tokens;
        self.output_tokens += o.output_tokens;
        self.prefill_tokens += o.prefill_tokens;
        self.gpu_busy_ns += o.gpu_busy_ns;
        self.engine_busy_ns += o.engine_busy_ns;
        self.running.merge(&o.running, until);
        self.waiting.merge(&o.waiting, until);
        self.kv_blocks.merge(&o.kv_blocks, until);
        self.total_blocks += o.total_blocks;
    }
}

/// Metrics of a cluster: one entry per replica; [`ClusterMetrics::total`]
/// sums them.
#[derive(Debug, Clone, Default)]
pub struct ClusterMetrics {
    pub replicas: Vec<ReplicaMetrics>,
}

impl ClusterMetrics {
    /// All replicas summed, gauges read at `until`: histograms merged,
    /// counters and busy times added, time-weighted gauges added (so
    /// `running.mean` is the cluster's mean batch total; `kv_util` of the sum
    /// is blocks in use over all blocks). Busy fractions of the sum must be
    /// divided by the replica count (see [`ClusterMetrics::gpu_util`]).
    pub fn total(&self, until: Nanos) -> ReplicaMetrics {
        let mut t = ReplicaMetrics::default();
        for r in &self.replicas {
            t.merge(r, until);
        }
        t
    }

    /// Mean GPU utilisation over replicas.
    pub fn gpu_util(&self, until: Nanos) -> f64 {
        if self.replicas.is_empty() {
            return 0.0;
        }
        self.replicas.iter().map(|r| r.gpu_util(until)).sum::<f64>() / self.replicas.len() as f64
    }
}
