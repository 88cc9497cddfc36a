//! The work budget: before anything is simulated, estimate what a run
//! costs — simulated requests (first tries and retries) plus server engine
//! iterations, over every seed, sweep point, scenario and counterfactual run,
//! and the peak memory — and refuse past a budget with exit 2, naming the
//! cost, its largest part and the flag that raises the budget.
//!
//! The work estimate leans low (an expected count, not a worst case): it
//! refuses at once inputs that are hopeless even so, and the run-time meter
//! ([`crate::work`]) is the guarantee — it counts the work the drivers
//! actually do and stops the run once it crosses the budget. Counted up
//! front: hosted rows at one attempt each (no retries); open loops at their
//! mean count (no spread); shared-scenario requests at one attempt each;
//! engine iterations with full batches (output tokens over `max_num_seqs`,
//! at most one per fastest step per replica); closed loops at the rate
//! their think time and the server's fastest step allow (their requests are
//! few: at most one per client per cycle).
//!
//! Memory is not counted at run time, so its estimate leans high: retries
//! at `max_attempts` each, open loops at their mean rate plus four standard
//! deviations of the count (which grows with `cv`), every open-loop request
//! of a scenario queued at once.

//!
//! This module holds the budget, the cost and the estimates shared by
//! experiments ([`crate::budget`]) and plans
//! ([`crate::plan::budget`]).

use crate::config::ConfigError;
use crate::engine::stats::{HIST_DIRECTORY_BYTES, HIST_MAX_PAGES, HIST_PAGE_BYTES};
use crate::engine::Sampler;
use crate::server::ServerProfile;
use crate::time::{show, to_secs};

/// Default of `--max-requests`: simulated requests plus engine iterations.
pub const DEFAULT_MAX_REQUESTS: u64 = 20_000_000;
/// Default of `--max-memory-mb`: estimated peak memory.
pub const DEFAULT_MAX_MEMORY_MB: u64 = 1024;

/// Work of one attempt against a hosted-API endpoint, in units of a server
/// request: a pool or executor event and a bucket check, no server model
/// (measured: `qsim run --seeds 1000` of the default file, 25 M attempts
/// at most, runs in under a second).
pub const HOSTED_ATTEMPT_WORK: f64 = 0.25;
/// Heap of `n` latency histograms holding `samples` samples between them,
/// in the worst case (see [`DurationHist`](crate::engine::DurationHist)):
/// each one that holds a sample has its page directory, and every sample
/// falls in a page of its own, up to every page of every histogram; the
/// pages' vector keeps fewer than a quarter of its pages unused.
pub fn hists_bytes(n: f64, samples: f64) -> f64 {
    let s = samples.max(0.0);
    n.min(s) * HIST_DIRECTORY_BYTES as f64
        + (n * HIST_MAX_PAGES as f64).min(1.25 * s) * HIST_PAGE_BYTES as f64
}
/// One server replica apart from its histograms: the replica's state, its
/// counters and gauges.
pub const REPLICA_FIXED_BYTES: f64 = 4096.0;

/// `reps` server replicas that serve `requests` requests and `tokens`
/// output tokens between them, worst case: four histograms with a sample
/// per request (TTFT, TPOT, E2E, queue delay), one with a sample per token
/// (ITL). 4 KB and 66 bytes per histogram with a sample; at most ~1.3 MB
/// per replica, when every histogram holds samples across its whole range
/// (1 µs to 11.6 days). Measured (nim-load.toml): 6 to 55 KB of
/// histograms per replica with 64 replicas, 60 to 255 KB with one.
pub fn replicas_bytes(reps: f64, requests: f64, tokens: f64) -> f64 {
    reps * REPLICA_FIXED_BYTES + 4.0 * hists_bytes(reps, requests) + hists_bytes(reps, tokens)
}
/// One request inside a server or the limiter's driver.
pub const IN_FLIGHT_BYTES: f64 = 160.0;
/// One tidy record kept for the spreads (seed, subject, metric, value).
pub const RECORD_BYTES: f64 = 128.0;
/// The process itself (binary, embedded files, allocator).
pub const BASE_BYTES: f64 = 16.0 * 1024.0 * 1024.0;
const MB: f64 = 1024.0 * 1024.0;

/// The work and memory budget of `run`, `sweep` and `plan` (their flags
/// `--max-requests`, `--max-memory-mb`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Refuse a run that simulates more than N requests (first tries and
    /// retries; a hosted-API attempt counts 1/4) plus server engine
    /// iterations, over all seeds, points and scenarios: refused at once if
    /// the estimate is over, else stopped when the count crosses N.
    pub max_requests: u64,
    /// Refuse a run whose estimated peak memory exceeds MB megabytes.
    pub max_memory_mb: u64,
}

impl Default for Budget {
    fn default() -> Self {
        Budget {
            max_requests: DEFAULT_MAX_REQUESTS,
            max_memory_mb: DEFAULT_MAX_MEMORY_MB,
        }
    }
}

/// What a run would cost.
#[derive(Debug, Clone, Default)]
pub struct Cost {
    /// Simulated requests plus engine iterations.
    pub work: f64,
    /// Peak memory of the largest single simulation (freed afterwards).
    pub peak_bytes: f64,
    /// Memory kept to the end (records of every seed and point).
    pub kept_bytes: f64,
    /// The largest part of the work, for the message.
    pub largest: Option<(String, f64)>,
    /// The largest part of the memory, for the message.
    pub largest_mem: Option<(String, f64)>,
}

fn bigger(slot: &mut Option<(String, f64)>, what: &str, v: f64) {
    if slot.as_ref().is_none_or(|(_, x)| v > *x) {
        *slot = Some((what.to_string(), v));
    }
}

impl Cost {
    /// A part of the run: `work` units, and `peak_bytes` while it runs.
    pub fn part(&mut self, what: &str, work: f64, peak_bytes: f64) {
        self.work += work;
        bigger(&mut self.largest, what, work);
        if peak_bytes > self.peak_bytes {
            self.peak_bytes = peak_bytes;
        }
        bigger(&mut self.largest_mem, what, peak_bytes);
    }

    /// Memory kept until the end of the run.
    pub fn keep(&mut self, bytes: f64) {
        self.kept_bytes += bytes;
    }

    /// The same run `k` times (seeds): work and kept memory scale, the peak
    /// does not; the largest part names the repetition.
    pub fn times(mut self, k: f64, label: &str) -> Cost {
        if k != 1.0 {
            self.work *= k;
            self.kept_bytes *= k;
            if let Some((w, v)) = &mut self.largest {
                *w = format!("{w} x {} {label}", show(k));
                *v *= k;
            }
        }
        self
    }

    /// Another run after this one: work and kept memory add, peaks do not.
    pub fn then(&mut self, o: Cost) {
        self.work += o.work;
        self.kept_bytes += o.kept_bytes;
        if let Some((w, v)) = o.largest {
            bigger(&mut self.largest, &w, v);
        }
        if let Some((w, v)) = o.largest_mem {
            bigger(&mut self.largest_mem, &w, v);
        }
        self.peak_bytes = self.peak_bytes.max(o.peak_bytes);
    }

    pub fn memory_bytes(&self) -> f64 {
        BASE_BYTES + self.peak_bytes + self.kept_bytes
    }

    /// Refuse (exit 2, one line) if the cost exceeds the budget.
    pub fn check(&self, source: &str, b: &Budget) -> Result<(), ConfigError> {
        if self.work.is_nan() || self.work > b.max_requests as f64 {
            let part = self
                .largest
                .as_ref()
                .map(|(w, v)| format!(" (largest part: {w}, about {})", count(*v)))
                .unwrap_or_default();
            return Err(ConfigError::new(
                source,
                "",
                format!(
                    "work budget: this run would simulate about {} requests and engine iterations at the least (first tries only; a hosted-API attempt counts 1/4){part}, over the budget of {}; raise it with --max-requests N, or shorten the run",
                    count(self.work),
                    count(b.max_requests as f64)
                ),
            ));
        }
        let mem = self.memory_bytes();
        if mem.is_nan() || mem > b.max_memory_mb as f64 * MB {
            let part = self
                .largest_mem
                .as_ref()
                .filter(|(_, v)| *v >= self.kept_bytes)
                .map(|(w, v)| format!(" (largest part: {w}, about {:.0} MB)", v / MB))
                .unwrap_or_else(|| {
                    format!(
                        " (largest part: records kept for the spreads, about {:.0} MB)",
                        self.kept_bytes / MB
                    )
                });
            return Err(ConfigError::new(
                source,
                "",
                format!(
                    "memory budget: this run would need about {} MB{part}, over the budget of {} MB; raise it with --max-memory-mb MB, or make the run smaller",
                    count(mem / MB),
                    b.max_memory_mb
                ),
            ));
        }
        Ok(())
    }
}

/// A count for a message: `12,345,678` or `3.4e12`.
pub fn count(v: f64) -> String {
    if !v.is_finite() || v >= 1e15 {
        return show(v);
    }
    let s = format!("{:.0}", v.max(0.0));
    let mut out = String::new();
    for (i, ch) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(ch);
    }
    out
}

/// Requests of an open loop at `rate` per second for `secs` seconds with an
/// inter-arrival coefficient of variation `cv`: the mean count plus four
/// standard deviations (a renewal process's count has variance `cv²·n`).
pub fn open_requests(rate: f64, secs: f64, cv: f64) -> f64 {
    let n = rate * secs;
    n + 4.0 * cv * n.sqrt()
}

/// The fastest engine step of a profile (a batch of one decode), seconds.
pub fn min_step_s(p: &ServerProfile) -> f64 {
    to_secs(p.iteration.duration(0, 1, 1, 1, 1, true).0).max(1e-9)
}

/// Seconds per request of one replica kept full by `clients` closed-loop
/// clients (leaning short, so the request count leans high only as far as
/// the real batch is smaller): the batch is the clients, at most
/// `max_num_seqs` and what the KV cache holds at half-finished answers;
/// each step decodes the batch and prefills the prompts of the requests
/// that replace the finished ones (batch / `mean_out` a step), over contexts
/// of prompt + half the answer; a request takes `mean_out` such steps for
/// `batch` requests.
pub(crate) fn full_batch_cycle_s(
    p: &ServerProfile,
    clients: f64,
    mean_in: f64,
    mean_out: f64,
) -> f64 {
    let ctx = mean_in + mean_out / 2.0;
    let kv_fit = (p.total_blocks as f64 * p.block_size as f64 / ctx).max(1.0);
    let b = clients.min(p.max_num_seqs as f64).min(kv_fit).max(1.0);
    let prefill = (b * mean_in / mean_out).min(p.max_batched_tokens as f64);
    let kv = b * ctx;
    let pairs = b * ctx + prefill * mean_in / 2.0;
    let (t, _) = p.iteration.duration(
        prefill as u64,
        b as u64,
        kv as u64,
        pairs as u64,
        b as u64,
        true,
    );
    let step = to_secs(t).max(min_step_s(p));
    step * mean_out / b
}

/// Engine iterations of `replicas` replicas serving `requests` requests
/// with a mean of `mean_out` output tokens for `secs` seconds, leaning low:
/// full batches (`max_num_seqs` tokens an iteration), and at most one per
/// fastest step per replica.
pub fn iterations(
    p: &ServerProfile,
    replicas: f64,
    secs: f64,
    requests: f64,
    mean_out: f64,
) -> f64 {
    (replicas * secs / min_step_s(p)).min(requests * mean_out.max(1.0) / p.max_num_seqs as f64)
}

pub fn mean_tokens(s: &Sampler) -> f64 {
    let m = s.mean();
    if m.is_finite() {
        m.clamp(1.0, u32::MAX as f64 / 4.0)
    } else {
        1.0
    }
}
