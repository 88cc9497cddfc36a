//! Server profiles (`models/*.toml` with `kind = "server"`): the scheduler
//! limits, the paged KV cache and the iteration-time model of one replica.
//!
//! Iteration time (see docs/ARCHITECTURE.md, "Server model"): a roofline per
//! iteration, the larger of the memory time and the compute time.
//!
//! ```text
//! mem  = weights_read / (hbm_bandwidth · bandwidth_efficiency)
//!        + K · kv_bytes_per_token / (hbm_bandwidth · kv_bandwidth_efficiency)
//! comp = (2 · active_params · (P + D) + attn_flops_per_pair · A) / (peak_flops · compute_efficiency)
//! gpu  = gpu_fixed + max(mem, comp)
//! gpu  = gpu_fixed + max(mem_weights, comp_tokens) + max(mem_kv, comp_attn)
//!                                        (`attention_separate`: the matrix
//!                                         products and attention as two
//!                                         rooflines, their kernels in turn)
//! cpu  = cpu_overhead + cpu_per_seq · (number of scheduled sequences)
//! t    = cpu + gpu                       (synchronous scheduling, the default)
//! t    = max(cpu, gpu)                   (`async_scheduling`, a step that
//!                                         follows a step in flight)
//! ```
//!
//! P = prefill tokens in the iteration, D = decode sequences, K = KV tokens
//! read by attention (the context length of every scheduled sequence), A =
//! (query token, context token) pairs attention computes (a chunk of m tokens
//! after c computed ones adds m·c + m(m+1)/2). The GPU overlaps streaming
//! bytes with arithmetic, so the two terms are not added. The CPU part of an
//! iteration (scheduling, input preparation, output processing) keeps the GPU
//! idle in a synchronous engine; GPU utilisation is `gpu / t` while the engine
//! is busy. An engine that schedules asynchronously (vLLM ≥ 0.14 by default)
//! prepares step N+1 on the CPU while step N runs on the GPU, so a step that
//! follows another step takes the larger of the two; the first step of a busy
//! period (the engine was idle: nothing was scheduled ahead) still takes
//! `cpu + gpu`.

use crate::config::{from_value, read_toml, ConfigError};
use crate::time::Nanos;
use serde::Deserialize;
use std::path::Path;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScheduler {
    max_num_seqs: i64,
    max_batched_tokens: i64,
    #[serde(default)]
    chunked_prefill: bool,
    max_model_len: i64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawKv {
    block_size: i64,
    /// Explicit number of blocks; if absent, derived from GPU memory.
    total_blocks: Option<i64>,
    kv_bytes_per_token: f64,
    gpu_memory_gib: Option<f64>,
    #[serde(default = "default_util")]
    gpu_memory_utilization: f64,
    /// Memory kept for activations, CUDA graphs, etc.
    #[serde(default)]
    reserved_gib: f64,
}

fn default_util() -> f64 {
    0.9
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIteration {
    hbm_bandwidth_tb_s: f64,
    peak_tflops: f64,
    weights_gib: f64,
    /// Bytes of weights read per iteration (MoE: all experts touched), default = weights_gib.
    weights_read_gib: Option<f64>,
    active_params_b: f64,
    /// Attention FLOPs per (query token, context token) pair:
    /// 4 · layers · query heads · head dim (QKᵀ and AV). 0 = not modelled.
    #[serde(default)]
    attn_flops_per_pair: f64,
    #[serde(default = "one")]
    bandwidth_efficiency: f64,
    /// Fraction of the HBM bandwidth attention's KV reads reach (paged
    /// decode attention, a kernel of its own); default: the weights'
    /// `bandwidth_efficiency`, the single efficiency of older profiles.
    kv_bandwidth_efficiency: Option<f64>,
    #[serde(default = "one")]
    compute_efficiency: f64,
    #[serde(default)]
    gpu_fixed_ms: f64,
    #[serde(default)]
    cpu_overhead_ms: f64,
    #[serde(default)]
    cpu_per_seq_us: f64,
    /// API-server latency before the engine sees a request (HTTP, tokeniser).
    #[serde(default)]
    ingress_ms: f64,
    /// The engine schedules step N+1 on the CPU while step N runs on the GPU.
    #[serde(default)]
    async_scheduling: bool,
    /// Tokens of every prompt served from the prefix cache (a workload
    /// whose prompts share a cached prefix): the requests' `input` lengths
    /// exclude them, but every scheduled sequence's attention still reads
    /// their KV and every query token attends over them. 0 = none.
    #[serde(default)]
    cached_prefix_tokens: i64,
    /// Measured step times (ms) of an engine whose step time is not a
    /// roofline (a CPU engine's matrix kernels): entry `b − 1` is the whole
    /// step, CPU included, with `b` sequences decoding one token each
    /// (the mean ITL of `b` concurrent requests with short prompts). When
    /// given, the decode part of a step is read from it (see
    /// [`IterationModel::duration`]). Empty = the roofline.
    #[serde(default)]
    decode_step_ms: Vec<f64>,
    /// The mean context (tokens) of each decoding sequence while
    /// `decode_step_ms` was measured. Given with the next two fields only.
    decode_step_context: Option<f64>,
    /// The same batch sizes' step times at a longer context,
    /// `decode_step_context_long`: a decode-only step's table entry is
    /// interpolated linearly in its sequences' mean context (see
    /// [`IterationModel::duration`]).
    #[serde(default)]
    decode_step_ms_long: Vec<f64>,
    decode_step_context_long: Option<f64>,
    /// What a query token attends over: `"sequence"` (its own context, the
    /// default: paged attention) or `"cache"` (every used cell of one
    /// shared KV buffer, other sequences' included, rounded up to
    /// `attention_pad_tokens`: llama.cpp with a unified KV buffer).
    #[serde(default)]
    attention_span: AttentionSpan,
    attention_pad_tokens: Option<i64>,
    /// Attention as a roofline of its own, added to the matrix products'
    /// (each layer runs its GEMMs and its attention kernel in turn, so a
    /// step's KV reads do not hide behind its prefill compute, nor its
    /// attention FLOPs behind the weights' reads): `gpu = gpu_fixed +
    /// max(weights_read time, token compute) + max(KV read time, attention
    /// compute)`. Default false: one roofline over the step's totals.
    #[serde(default)]
    attention_separate: bool,
    /// With `attention_span = "cache"`: a finished request's cells stay in
    /// the buffer, and in every step's attention, until the engine starts
    /// its next request (llama-server keeps an idle slot's KV and clears
    /// the idle slots when it launches a task: `cache_idle_slots`, on by
    /// default). Default false: freed when the request finishes.
    #[serde(default)]
    finished_cells_held: bool,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq)]
#[serde(rename_all = "lowercase")]
enum AttentionSpan {
    #[default]
    Sequence,
    Cache,
}

fn one() -> f64 {
    1.0
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerProfile {
    kind: String,
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    source: Option<String>,
    scheduler: RawScheduler,
    kv_cache: RawKv,
    iteration: RawIteration,
    /// Only `qsim serve` reads it (answer lengths).
    #[serde(default)]
    serve: Option<crate::serve_spec::RawServe>,
    /// What one replica costs (issue 25).
    #[serde(default)]
    price: Option<RawServerPrice>,
}

/// `[price]` of a server profile: one replica's GPUs per hour, and where
/// the figure comes from (a public price list and its date).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServerPrice {
    replica_hour_usd: f64,
    source: String,
}

/// The iteration-time model, with coefficients in nanoseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct IterationModel {
    /// Fixed GPU time per iteration not hidden by the roofline (launches), ns.
    pub gpu_fixed_ns: f64,
    /// Memory time of reading the weights once, ns.
    pub mem_base_ns: f64,
    /// Memory ns per KV token read by attention.
    pub mem_per_kv_token_ns: f64,
    /// Compute ns per token processed (prefill token or decode sequence).
    pub comp_per_token_ns: f64,
    /// Compute ns per attention (query token, context token) pair.
    pub comp_per_attn_pair_ns: f64,
    /// Cached prefix tokens every scheduled sequence's attention reads
    /// besides its own context.
    pub cached_prefix_tokens: u64,
    /// CPU (GPU idle) ns per iteration.
    pub cpu_base_ns: f64,
    /// CPU ns per scheduled sequence.
    pub cpu_per_seq_ns: f64,
    /// The CPU part of a step overlaps the previous step's GPU work.
    pub async_scheduling: bool,
    /// Measured whole-step ns with `b` decoding sequences at `b − 1`
    /// (`decode_step_ms`); empty: the roofline.
    pub decode_step_ns: Vec<f64>,
    /// With a second table at a longer context: entry `b − 1`'s growth in
    /// ns per context token of its sequences' mean context beyond
    /// `decode_step_ctx` (`decode_step_ms_long`); empty: no context
    /// dependence.
    pub decode_step_slope_ns: Vec<f64>,
    /// The mean context per sequence of `decode_step_ns`'s measurement.
    pub decode_step_ctx: f64,
    /// `attention_span = "cache"`: each of a step's tokens attends over
    /// the scheduled sequences' whole context (K) rounded up to this many
    /// tokens; 0 = over its own context (A pairs).
    pub attention_pad: u64,
    /// With `attention_pad > 0`: a finished request's cells count in K
    /// until the next request is first scheduled (llama-server's idle
    /// slots, cleared when it launches a task).
    pub finished_cells_held: bool,
    /// Attention as its own roofline, added to the matrix products'
    /// (`attention_separate`).
    pub attention_separate: bool,
}

impl IterationModel {
    /// (total duration, GPU-busy part) of one iteration, in ns: `prefill_tokens`
    /// P, `decode_seqs` D, `kv_tokens` K, `attn_pairs` A, `seqs` scheduled;
    /// `follows_step`: the step starts the moment the previous one ends (with
    /// `async_scheduling` its CPU part was done during that step), not from
    /// an idle engine.
    #[inline]
    pub fn duration(
        &self,
        prefill_tokens: u64,
        decode_seqs: u64,
        kv_tokens: u64,
        attn_pairs: u64,
        seqs: u64,
        follows_step: bool,
    ) -> (Nanos, Nanos) {
        let tokens = prefill_tokens + decode_seqs;
        let attn_pairs = attn_pairs + self.cached_prefix_tokens * tokens;
        let attn_pairs = if self.attention_pad > 0 {
            let used = kv_tokens + self.cached_prefix_tokens * seqs;
            tokens * used.div_ceil(self.attention_pad) * self.attention_pad
        } else {
            attn_pairs
        };
        if !self.decode_step_ns.is_empty() {
            return self.measured_duration(
                prefill_tokens,
                decode_seqs,
                kv_tokens,
                attn_pairs,
                seqs,
            );
        }
        let kv_tokens = kv_tokens + self.cached_prefix_tokens * seqs;
        let kv = self.mem_per_kv_token_ns * kv_tokens as f64;
        let (tok, attn) = (
            self.comp_per_token_ns * tokens as f64,
            self.comp_per_attn_pair_ns * attn_pairs as f64,
        );
        let gpu = if self.attention_separate {
            self.gpu_fixed_ns + self.mem_base_ns.max(tok) + kv.max(attn)
        } else {
            self.gpu_fixed_ns + (self.mem_base_ns + kv).max(tok + attn)
        };
        let cpu = self.cpu_base_ns + self.cpu_per_seq_ns * seqs as f64;
        let gpu = round_ns(gpu);
        let cpu = round_ns(cpu);
        let total = if self.async_scheduling && follows_step {
            gpu.max(cpu)
        } else {
            gpu + cpu
        };
        (total.max(1), gpu)
    }

    /// A step with a measured decode table: the table's step for the `D`
    /// decoding sequences (beyond the table, its last entry scaled by
    /// `D / len`; with none decoding, `cpu_base_ns`, the fixed cost of a
    /// step) plus the prompt tokens' compute, `comp_per_token_ns · P`, the
    /// attention pairs' compute and, per prefilling sequence,
    /// `cpu_per_seq_ns` (the output projection and the sampler for its
    /// first token). A CPU engine computes a step's batch serially on its
    /// cores, so the prompt tokens' work adds to the decoding sequences'
    /// (llama.cpp with a unified KV buffer runs a step of up to n_ubatch
    /// tokens as one graph: the weights' fixed cost, in the table, is paid
    /// once and every prompt token adds its layers' compute). Nothing
    /// overlaps with the next step, so the busy part is the whole step.
    /// Attention over the contexts of the table's own measurement is
    /// charged again by the per-pair term (small for short contexts: stated
    /// where a table is used).
    fn measured_duration(
        &self,
        prefill: u64,
        decode: u64,
        kv_tokens: u64,
        pairs: u64,
        seqs: u64,
    ) -> (Nanos, Nanos) {
        let t = &self.decode_step_ns;
        let slope = &self.decode_step_slope_ns;
        // a decode-only step's entry at its sequences' mean context (K =
        // their contexts' sum), never below the short table's
        let longer = |k: usize| match slope.get(k) {
            Some(s) if prefill == 0 => {
                s * (kv_tokens as f64 / decode as f64 - self.decode_step_ctx).max(0.0)
            }
            _ => 0.0,
        };
        let fixed = match decode as usize {
            0 => self.cpu_base_ns,
            d if d <= t.len() => t[d - 1] + longer(d - 1),
            d => (t[t.len() - 1] + longer(t.len() - 1)) * d as f64 / t.len() as f64,
        };
        // with a context-dependent table, a decode-only step's attention is
        // in the table
        let attn = if slope.is_empty() || prefill > 0 {
            self.comp_per_attn_pair_ns * pairs as f64
        } else {
            0.0
        };
        let total = fixed
            + self.comp_per_token_ns * prefill as f64
            + attn
            + self.cpu_per_seq_ns * seqs.saturating_sub(decode) as f64;
        let total = round_ns(total).max(1);
        (total, total)
    }

    /// The constant part of [`IterationModel::duration`] for a run of
    /// decode steps of `n` sequences alone (P = 0, D = n = `seqs`, K = A =
    /// the batch's context), each step following the previous one.
    pub fn decode_cost(&self, n: u64) -> DecodeCost<'_> {
        let cpu = round_ns(self.cpu_base_ns + self.cpu_per_seq_ns * n as f64);
        DecodeCost {
            m: self,
            n,
            cached: self.cached_prefix_tokens * n,
            comp_tokens: self.comp_per_token_ns * n as f64,
            cpu,
        }
    }

    /// Attention pairs of a chunk of `chunk` tokens after `computed` ones.
    #[inline]
    pub fn attn_pairs(computed: u32, chunk: u32) -> u64 {
        let (c, m) = (computed as u64, chunk as u64);
        m * c + m * (m + 1) / 2
    }
}

/// [`IterationModel::decode_cost`]: the duration of a decode step of `n`
/// sequences with the terms that do not depend on the context computed
/// once; [`DecodeCost::duration`] is `duration(0, n, ctx, ctx, n, true)`,
/// the same operations on the same values (`decode_cost_is_the_duration`).
pub struct DecodeCost<'a> {
    m: &'a IterationModel,
    n: u64,
    cached: u64,
    comp_tokens: f64,
    cpu: Nanos,
}

impl DecodeCost<'_> {
    #[inline]
    pub fn duration(&self, ctx: u64) -> (Nanos, Nanos) {
        let m = self.m;
        if !m.decode_step_ns.is_empty() || m.attention_pad > 0 {
            return m.duration(0, self.n, ctx, ctx, self.n, true);
        }
        // K = A = ctx + cached·n; below 2^63, so i64 converts the same
        let x = (ctx + self.cached) as i64 as f64;
        let (kv, attn) = (m.mem_per_kv_token_ns * x, m.comp_per_attn_pair_ns * x);
        let gpu = round_ns(if m.attention_separate {
            m.gpu_fixed_ns + m.mem_base_ns.max(self.comp_tokens) + kv.max(attn)
        } else {
            m.gpu_fixed_ns + (m.mem_base_ns + kv).max(self.comp_tokens + attn)
        });
        let total = if m.async_scheduling {
            gpu.max(self.cpu)
        } else {
            gpu + self.cpu
        };
        (total.max(1), gpu)
    }
}

/// `x.round() as Nanos`, without the libm call for the usual case: for
/// 0 ≤ x < 2^52 the truncation `r` is exact, so is `x − r` (Sterbenz), and
/// rounding half away from zero adds 1 when that is ≥ 0.5. Anything else
/// (negative, huge, NaN) takes `round` itself.
#[inline]
fn round_ns(x: f64) -> Nanos {
    if (0.0..4_503_599_627_370_496.0).contains(&x) {
        // through i64: the same values (x < 2^52), one instruction each way
        let r = x as i64;
        (r + (x - r as f64 >= 0.5) as i64) as Nanos
    } else {
        x.round() as Nanos
    }
}

/// A validated server profile (one replica).
#[derive(Debug, Clone, PartialEq)]
pub struct ServerProfile {
    pub name: String,
    pub description: String,
    pub source: String,
    pub max_num_seqs: u32,
    pub max_batched_tokens: u32,
    pub chunked_prefill: bool,
    /// Longest prompt + output a request may have.
    pub max_model_len: u32,
    pub block_size: u32,
    pub total_blocks: u32,
    pub kv_bytes_per_token: f64,
    pub iteration: IterationModel,
    pub ingress: Nanos,
    /// `[serve]`: how `qsim serve` sizes answers (the simulation takes
    /// lengths from the experiment file instead).
    pub serve: crate::serve_spec::ServeSpec,
    /// GiB of weights (a cold start loads them).
    pub weights_gib: f64,
    /// Dollars per replica-hour (`[price]`), if known, and its source.
    pub replica_hour_usd: Option<f64>,
    pub price_source: String,
}

fn pos_int(file: &str, field: &str, v: i64, max: i64) -> Result<u32, ConfigError> {
    if v <= 0 || v > max {
        Err(ConfigError::new(
            file,
            field,
            format!("must be in 1..={max}, got {v}"),
        ))
    } else {
        Ok(v as u32)
    }
}

fn num(
    file: &str,
    field: &str,
    v: f64,
    lo: f64,
    hi: f64,
    lo_open: bool,
) -> Result<f64, ConfigError> {
    let ok = v.is_finite() && v <= hi && if lo_open { v > lo } else { v >= lo };
    if ok {
        Ok(v)
    } else {
        let l = if lo_open { "(" } else { "[" };
        Err(ConfigError::new(
            file,
            field,
            format!("must be in {l}{lo}, {hi}], got {v}"),
        ))
    }
}

const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

impl ServerProfile {
    /// Parse and validate a profile; `file` names it in errors.
    pub fn from_value(file: &str, v: toml::Value) -> Result<Self, ConfigError> {
        let raw: RawServerProfile = from_value(file, v)?;
        crate::config::expect_kind(file, &raw.kind, "server", "a server profile")?;
        let s = &raw.scheduler;
        let max_num_seqs = pos_int(file, "scheduler.max_num_seqs", s.max_num_seqs, 1 << 20)?;
        let max_batched_tokens = pos_int(
            file,
            "scheduler.max_batched_tokens",
            s.max_batched_tokens,
            1 << 30,
        )?;
        if max_batched_tokens < max_num_seqs {
            return Err(ConfigError::new(
                file,
                "scheduler.max_batched_tokens",
                format!("must be >= max_num_seqs ({max_num_seqs}), got {max_batched_tokens}"),
            ));
        }
        let max_model_len = pos_int(file, "scheduler.max_model_len", s.max_model_len, 1 << 30)?;
        let k = &raw.kv_cache;
        let block_size = pos_int(file, "kv_cache.block_size", k.block_size, 1 << 16)?;
        let kv_bytes = num(
            file,
            "kv_cache.kv_bytes_per_token",
            k.kv_bytes_per_token,
            0.0,
            1e12,
            false,
        )?;
        let it = &raw.iteration;
        let weights_gib = num(
            file,
            "iteration.weights_gib",
            it.weights_gib,
            0.0,
            1e6,
            false,
        )?;
        let total_blocks = match k.total_blocks {
            Some(b) => pos_int(file, "kv_cache.total_blocks", b, u32::MAX as i64 / 2)?,
            None => {
                let mem = k.gpu_memory_gib.ok_or_else(|| {
                    ConfigError::new(
                        file,
                        "kv_cache.gpu_memory_gib",
                        "needed to derive the number of KV blocks when `total_blocks` is absent",
                    )
                })?;
                let mem = num(file, "kv_cache.gpu_memory_gib", mem, 0.0, 1e6, true)?;
                let util = num(
                    file,
                    "kv_cache.gpu_memory_utilization",
                    k.gpu_memory_utilization,
                    0.0,
                    1.0,
                    true,
                )?;
                let res = num(
                    file,
                    "kv_cache.reserved_gib",
                    k.reserved_gib,
                    0.0,
                    1e6,
                    false,
                )?;
                if kv_bytes <= 0.0 {
                    return Err(ConfigError::new(
                        file,
                        "kv_cache.kv_bytes_per_token",
                        "must be > 0 to derive the number of KV blocks",
                    ));
                }
                let free = (mem * util - weights_gib - res) * GIB;
                let blocks = (free / (kv_bytes * block_size as f64)).floor();
                if blocks < 1.0 {
                    return Err(ConfigError::new(
                        file,
                        "kv_cache",
                        format!(
                            "no memory left for the KV cache: {mem} GiB × {util} − weights {weights_gib} GiB − reserved {res} GiB"
                        ),
                    ));
                }
                blocks.min((u32::MAX / 2) as f64) as u32
            }
        };
        if (max_model_len as u64).div_ceil(block_size as u64) > total_blocks as u64 {
            return Err(ConfigError::new(
                file,
                "scheduler.max_model_len",
                format!(
                    "a request of max_model_len {max_model_len} tokens needs more than the {total_blocks} KV blocks of {block_size} tokens"
                ),
            ));
        }
        let bw = num(
            file,
            "iteration.hbm_bandwidth_tb_s",
            it.hbm_bandwidth_tb_s,
            0.0,
            1e6,
            true,
        )? * 1e12;
        let peak = num(
            file,
            "iteration.peak_tflops",
            it.peak_tflops,
            0.0,
            1e9,
            true,
        )? * 1e12;
        let wread = match it.weights_read_gib {
            Some(w) => num(file, "iteration.weights_read_gib", w, 0.0, 1e6, false)?,
            None => weights_gib,
        } * GIB;
        let active = num(
            file,
            "iteration.active_params_b",
            it.active_params_b,
            0.0,
            1e6,
            false,
        )? * 1e9;
        let be = num(
            file,
            "iteration.bandwidth_efficiency",
            it.bandwidth_efficiency,
            0.0,
            1.0,
            true,
        )?;
        let kve = match it.kv_bandwidth_efficiency {
            Some(v) => num(file, "iteration.kv_bandwidth_efficiency", v, 0.0, 1.0, true)?,
            None => be,
        };
        let ce = num(
            file,
            "iteration.compute_efficiency",
            it.compute_efficiency,
            0.0,
            1.0,
            true,
        )?;
        let ms = |name: &str, v: f64| num(file, &format!("iteration.{name}"), v, 0.0, 1e7, false);
        let gpu_fixed = ms("gpu_fixed_ms", it.gpu_fixed_ms)? * 1e6;
        let cpu = ms("cpu_overhead_ms", it.cpu_overhead_ms)? * 1e6;
        let cpu_seq = ms("cpu_per_seq_us", it.cpu_per_seq_us)? * 1e3;
        let ingress = ms("ingress_ms", it.ingress_ms)? * 1e6;
        let attn = num(
            file,
            "iteration.attn_flops_per_pair",
            it.attn_flops_per_pair,
            0.0,
            1e12,
            false,
        )?;
        let cached_prefix = if (0..=1 << 30).contains(&it.cached_prefix_tokens) {
            it.cached_prefix_tokens as u64
        } else {
            return Err(ConfigError::new(
                file,
                "iteration.cached_prefix_tokens",
                format!("must be in 0..=2^30, got {}", it.cached_prefix_tokens),
            ));
        };
        let eff_bw = bw * be;
        let eff_flops = peak * ce;
        let mut iteration = IterationModel {
            gpu_fixed_ns: gpu_fixed,
            mem_base_ns: wread / eff_bw * 1e9,
            mem_per_kv_token_ns: kv_bytes / (bw * kve) * 1e9,
            comp_per_token_ns: 2.0 * active / eff_flops * 1e9,
            comp_per_attn_pair_ns: attn / eff_flops * 1e9,
            cached_prefix_tokens: cached_prefix,
            cpu_base_ns: cpu,
            cpu_per_seq_ns: cpu_seq,
            async_scheduling: it.async_scheduling,
            decode_step_ns: decode_table(file, "iteration.decode_step_ms", &it.decode_step_ms)?,
            decode_step_slope_ns: Vec::new(),
            decode_step_ctx: 0.0,
            attention_pad: match (it.attention_span, it.attention_pad_tokens) {
                (AttentionSpan::Sequence, None) => 0,
                (AttentionSpan::Cache, pad) => {
                    let pad = pad.unwrap_or(1);
                    if !(1..=1 << 20).contains(&pad) {
                        return Err(ConfigError::new(
                            file,
                            "iteration.attention_pad_tokens",
                            format!("must be in 1..=1048576, got {pad}"),
                        ));
                    }
                    pad as u64
                }
                (AttentionSpan::Sequence, Some(_)) => {
                    return Err(ConfigError::new(
                        file,
                        "iteration.attention_pad_tokens",
                        "applies only with attention_span = \"cache\"",
                    ))
                }
            },
            finished_cells_held: it.finished_cells_held,
            attention_separate: it.attention_separate,
        };
        if iteration.finished_cells_held && iteration.attention_pad == 0 {
            return Err(ConfigError::new(
                file,
                "iteration.finished_cells_held",
                "applies only with attention_span = \"cache\"",
            ));
        }
        if let Some((ctx, slope)) = decode_context(file, it, &iteration.decode_step_ns)? {
            iteration.decode_step_ctx = ctx;
            iteration.decode_step_slope_ns = slope;
        }
        if iteration.duration(0, 1, 1, 1, 1, false).0 == 0 {
            return Err(ConfigError::new(
                file,
                "iteration",
                "iteration time is zero",
            ));
        }
        Ok(ServerProfile {
            name: raw.name,
            description: raw.description.unwrap_or_default(),
            source: raw.source.unwrap_or_default(),
            max_num_seqs,
            max_batched_tokens,
            chunked_prefill: s.chunked_prefill,
            max_model_len,
            block_size,
            total_blocks,
            kv_bytes_per_token: kv_bytes,
            iteration,
            ingress: ingress.round() as Nanos,
            serve: crate::serve_spec::ServeSpec::from_raw(file, raw.serve.as_ref())?,
            weights_gib,
            replica_hour_usd: match &raw.price {
                Some(p) => Some(num(
                    file,
                    "price.replica_hour_usd",
                    p.replica_hour_usd,
                    0.0,
                    1e6,
                    false,
                )?),
                None => None,
            },
            price_source: raw.price.map(|p| p.source).unwrap_or_default(),
        })
    }

    /// KV blocks a request of `tokens` context tokens occupies.
    #[inline]
    pub fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.block_size)
    }
}

/// A decode table (`field`): at most 1,024 steps of > 0 and at most a
/// minute each; ns.
fn decode_table(file: &str, field: &str, ms: &[f64]) -> Result<Vec<f64>, ConfigError> {
    if ms.len() > 1024 {
        return Err(ConfigError::new(
            file,
            field,
            format!(
                "at most 1024 entries (one per batch size), got {}",
                ms.len()
            ),
        ));
    }
    ms.iter()
        .enumerate()
        .map(|(k, &x)| {
            if x.is_finite() && x > 0.0 && x <= 60_000.0 {
                Ok(x * 1e6)
            } else {
                Err(ConfigError::new(
                    file,
                    format!("{field}.{k}"),
                    format!("must be a step time in ms, > 0 and at most 60000, got {x}"),
                ))
            }
        })
        .collect()
}

/// `iteration.decode_step_context`, `decode_step_ms_long` and
/// `decode_step_context_long`, all three or none: (the short table's
/// context, each entry's ns per context token) against `short`, the
/// parsed `decode_step_ms`.
fn decode_context(
    file: &str,
    it: &RawIteration,
    short: &[f64],
) -> Result<Option<(f64, Vec<f64>)>, ConfigError> {
    let (c0, c1, long) = match (
        it.decode_step_context,
        it.decode_step_context_long,
        it.decode_step_ms_long.is_empty(),
    ) {
        (None, None, true) => return Ok(None),
        (Some(c0), Some(c1), false) => (c0, c1, &it.decode_step_ms_long),
        _ => {
            return Err(ConfigError::new(
                file,
                "iteration.decode_step_ms_long",
                "decode_step_context, decode_step_ms_long and decode_step_context_long go \
                 together (all three or none)",
            ))
        }
    };
    let c0 = num(file, "iteration.decode_step_context", c0, 0.0, 1e7, true)?;
    let c1 = num(
        file,
        "iteration.decode_step_context_long",
        c1,
        0.0,
        1e7,
        true,
    )?;
    if c1 <= c0 {
        return Err(ConfigError::new(
            file,
            "iteration.decode_step_context_long",
            format!("must be above decode_step_context ({c0}), got {c1}"),
        ));
    }
    let long = decode_table(file, "iteration.decode_step_ms_long", long)?;
    if long.len() != short.len() {
        return Err(ConfigError::new(
            file,
            "iteration.decode_step_ms_long",
            format!(
                "needs one entry per decode_step_ms entry ({}), got {}",
                short.len(),
                long.len()
            ),
        ));
    }
    Ok(Some((
        c0,
        short
            .iter()
            .zip(&long)
            .map(|(a, b)| (b - a) / (c1 - c0))
            .collect(),
    )))
}

/// Read and validate a server profile file.
pub fn load_profile(path: &Path) -> Result<ServerProfile, ConfigError> {
    let v = read_toml(path)?;
    ServerProfile::from_value(&path.display().to_string(), v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn models() -> std::path::PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models")
    }

    /// The decode run's precomputed step time is `duration`'s, bit for bit,
    /// on every server profile (roofline, async or not, a measured table),
    /// with and without cached prefix tokens.
    #[test]
    fn decode_cost_is_the_duration() {
        let mut checked = 0;
        for e in std::fs::read_dir(models()).unwrap() {
            let Ok(p) = load_profile(&e.unwrap().path()) else {
                continue; // an endpoint profile
            };
            let t = || vec![3e6, 4.5e6, 4.2e6, 7e6];
            let slope = || vec![1e3, 2e3, 3.5e3, 4e3];
            for (cached, asynchronous, table, slope, pad) in [
                (0, false, vec![], vec![], 0),
                (0, true, vec![], vec![], 0),
                (700, false, vec![], vec![], 0),
                (700, true, vec![], vec![], 0),
                (0, true, vec![], vec![], 256),
                (700, false, vec![], vec![], 16),
                (0, false, t(), vec![], 0),
                (700, true, t(), vec![], 0),
                (0, false, t(), slope(), 0),
                (0, false, t(), slope(), 256),
            ] {
                for separate in [false, true] {
                    let mut m = p.iteration.clone();
                    m.attention_separate = separate;
                    m.cached_prefix_tokens = cached;
                    m.async_scheduling = asynchronous;
                    m.decode_step_ns = table.clone();
                    m.decode_step_slope_ns = slope.clone();
                    m.decode_step_ctx = 40.0;
                    m.attention_pad = pad;
                    for n in [1u64, 2, 3, 7, 64, 255, 1000] {
                        let c = m.decode_cost(n);
                        for ctx in [n, n * 17 + 5, n * 1000 + 3, n * 100_000 + 11] {
                            let want = m.duration(0, n, ctx, ctx, n, true);
                            assert_eq!(c.duration(ctx), want, "{} n {n} ctx {ctx}", p.name);
                            checked += 1;
                        }
                    }
                }
            }
        }
        assert!(checked >= 5 * 10 * 7 * 4 * 2, "{checked}");
    }

    /// `kv_bandwidth_efficiency` sets the KV reads' own fraction of the
    /// bandwidth; absent, they read at the weights' `bandwidth_efficiency`
    /// (every shipped profile: unchanged).
    #[test]
    fn kv_reads_have_their_own_bandwidth_efficiency() {
        let text = std::fs::read_to_string(models().join("llama-3.1-8b-h100-vllm.toml")).unwrap();
        let load = |t: &str| {
            let v = crate::config::parse_toml("m.toml", t).unwrap();
            ServerProfile::from_value("m.toml", v)
        };
        let base = load(&text).unwrap().iteration;
        let edit = "bandwidth_efficiency = 0.74";
        assert!(text.contains(edit));
        let same = load(&text.replace(edit, &format!("{edit}\nkv_bandwidth_efficiency = 0.74")))
            .unwrap()
            .iteration;
        assert_eq!(same, base);
        let half = load(&text.replace(edit, &format!("{edit}\nkv_bandwidth_efficiency = 0.37")))
            .unwrap()
            .iteration;
        assert_eq!(half.mem_base_ns, base.mem_base_ns);
        assert!((half.mem_per_kv_token_ns / base.mem_per_kv_token_ns - 2.0).abs() < 1e-12);
        for bad in ["0.0", "1.5"] {
            let e = load(&text.replace(edit, &format!("{edit}\nkv_bandwidth_efficiency = {bad}")))
                .unwrap_err();
            assert_eq!(e.field, "iteration.kv_bandwidth_efficiency");
        }
    }

    #[test]
    fn llama_8b_is_derived_from_the_roofline() {
        let p = load_profile(&models().join("llama-3.1-8b-h100-vllm.toml")).unwrap();
        // (79.6 × 0.9 − 14.96 − 4) GiB / (16 × 128 KiB)
        assert_eq!(p.total_blocks, 26_972);
        let it = &p.iteration;
        // weights 14.96 GiB at 0.74 × 3.35 TB/s = 6.480 ms
        assert!(
            (it.mem_base_ns / 1e6 - 6.480).abs() < 0.001,
            "{}",
            it.mem_base_ns
        );
        // one KV token: 128 KiB at 2.479 TB/s = 52.9 ns
        assert!((it.mem_per_kv_token_ns - 52.9).abs() < 0.1);
        // one token: 2 × 8.03e9 / (0.83 × 989 TFLOPs) = 19.56 µs
        assert!((it.comp_per_token_ns - 19_565.0).abs() < 10.0);
        // one attention pair: 524,288 FLOPs / 820.9 TFLOPs = 0.639 ns
        assert!((it.comp_per_attn_pair_ns - 0.6387).abs() < 0.001);
        // batch-1 decode is memory-bound: 0.2 fixed + 6.480 ms weights (+ KV)
        let (_, gpu) = it.duration(0, 1, 0, 1, 1, false);
        assert!((gpu as f64 / 1e6 - 6.680).abs() < 0.001, "{gpu}");
        // a 8192-token prefill is compute-bound: 8192 × 19.56 µs + attention
        let a = IterationModel::attn_pairs(0, 8192);
        assert_eq!(a, 8192 * 8193 / 2);
        let (_, gpu) = it.duration(8192, 0, 8192, a, 1, false);
        let want = 0.2e6 + 8192.0 * it.comp_per_token_ns + a as f64 * it.comp_per_attn_pair_ns;
        assert!((gpu as f64 - want).abs() < 1.0, "{gpu} vs {want}");
    }

    /// `attention_separate`: the matrix products' roofline and
    /// attention's, added; off (every shipped profile), one roofline over
    /// the totals, as before.
    #[test]
    fn attention_as_its_own_roofline_adds_to_the_matrix_products() {
        let p = load_profile(&models().join("llama-3.1-8b-h100-vllm.toml")).unwrap();
        assert!(!p.iteration.attention_separate);
        let mut m = p.iteration.clone();
        m.async_scheduling = false;
        m.cpu_base_ns = 0.0;
        m.cpu_per_seq_ns = 0.0;
        // a 2,000-token prefill chunk (compute-bound GEMMs) beside 40
        // decodes at 2,000 tokens of context (memory-bound attention)
        let (pf, d) = (2000u64, 40u64);
        let (k, a) = (d * 2000 + pf, d * 2000 + pf * (pf + 1) / 2);
        let one = m.duration(pf, d, k, a, d + 1, true).0 as f64;
        m.attention_separate = true;
        let two = m.duration(pf, d, k, a, d + 1, true).0 as f64;
        let tok = m.comp_per_token_ns * (pf + d) as f64;
        let kv = m.mem_per_kv_token_ns * k as f64;
        let attn = m.comp_per_attn_pair_ns * a as f64;
        assert!(tok > m.mem_base_ns && kv > attn);
        let want = m.gpu_fixed_ns + tok + kv.max(attn);
        assert!((two - want).abs() <= 1.0, "{two} vs {want}");
        assert!(two > one, "the KV reads no longer hide behind the prefill");
        let text = std::fs::read_to_string(models().join("llama-3.1-8b-h100-vllm.toml")).unwrap();
        let v: toml::Value = toml::from_str(&text.replacen(
            "[iteration]",
            "[iteration]\nattention_separate = true",
            1,
        ))
        .unwrap();
        assert!(
            ServerProfile::from_value("p.toml", v)
                .unwrap()
                .iteration
                .attention_separate
        );
    }

    #[test]
    fn the_roofline_takes_the_larger_term_not_the_sum() {
        let m = IterationModel {
            gpu_fixed_ns: 100.0,
            mem_base_ns: 1_000.0,
            mem_per_kv_token_ns: 1.0,
            comp_per_token_ns: 10.0,
            comp_per_attn_pair_ns: 0.5,
            cached_prefix_tokens: 0,
            cpu_base_ns: 7.0,
            cpu_per_seq_ns: 3.0,
            async_scheduling: false,
            decode_step_ns: Vec::new(),
            decode_step_slope_ns: Vec::new(),
            decode_step_ctx: 0.0,
            attention_pad: 0,
            finished_cells_held: false,
            attention_separate: false,
        };
        // memory-bound: mem 1000 + 200 = 1200 > comp 10 × 20 + 0.5 × 40 = 220
        assert_eq!(
            m.duration(0, 20, 200, 40, 20, false),
            (100 + 1200 + 7 + 60, 1300)
        );
        // compute-bound: comp 10 × 300 + 0.5 × 1000 = 3500 > mem 1000 + 300
        assert_eq!(
            m.duration(300, 0, 300, 1000, 1, false),
            (100 + 3500 + 10, 3600)
        );
        // synchronous scheduling: a step that follows another still adds its CPU
        assert_eq!(
            m.duration(300, 0, 300, 1000, 1, true),
            (100 + 3500 + 10, 3600)
        );
        // a chunk of 3 tokens after 2 computed attends over 3 + 4 + 5 tokens
        assert_eq!(IterationModel::attn_pairs(2, 3), 12);
        assert_eq!(IterationModel::attn_pairs(10, 1), 11);
    }

    #[test]
    fn a_cached_prefix_is_read_and_attended_by_every_scheduled_sequence() {
        let base = IterationModel {
            gpu_fixed_ns: 0.0,
            mem_base_ns: 1_000.0,
            mem_per_kv_token_ns: 1.0,
            comp_per_token_ns: 1.0,
            comp_per_attn_pair_ns: 1.0,
            cached_prefix_tokens: 0,
            cpu_base_ns: 0.0,
            cpu_per_seq_ns: 0.0,
            async_scheduling: false,
            decode_step_ns: Vec::new(),
            decode_step_slope_ns: Vec::new(),
            decode_step_ctx: 0.0,
            attention_pad: 0,
            finished_cells_held: false,
            attention_separate: false,
        };
        let m = IterationModel {
            cached_prefix_tokens: 96,
            ..base.clone()
        };
        // a decode batch of 20 (memory-bound): 20 × 96 more KV tokens
        assert_eq!(
            m.duration(0, 20, 200, 220, 20, false),
            base.duration(0, 20, 200 + 20 * 96, 220, 20, false)
        );
        // a 500-token chunk and 3 decodes (compute-bound): 503 × 96 more pairs
        let a = IterationModel::attn_pairs(0, 500) + 30;
        assert_eq!(
            m.duration(500, 3, 530, a, 4, false),
            base.duration(500, 3, 530 + 4 * 96, a + 503 * 96, 4, false)
        );
        assert!(m.duration(500, 3, 530, a, 4, false).0 > base.duration(500, 3, 530, a, 4, false).0);
        let e = err(
            "attn_flops_per_pair = 524288",
            "attn_flops_per_pair = 524288\ncached_prefix_tokens = -1",
        );
        assert_eq!(e.field, "iteration.cached_prefix_tokens");
    }

    #[test]
    fn async_scheduling_hides_the_cpu_behind_the_previous_step() {
        let m = IterationModel {
            gpu_fixed_ns: 100.0,
            mem_base_ns: 1_000.0,
            mem_per_kv_token_ns: 1.0,
            comp_per_token_ns: 10.0,
            comp_per_attn_pair_ns: 0.5,
            cached_prefix_tokens: 0,
            cpu_base_ns: 600.0,
            cpu_per_seq_ns: 30.0,
            async_scheduling: true,
            decode_step_ns: Vec::new(),
            decode_step_slope_ns: Vec::new(),
            decode_step_ctx: 0.0,
            attention_pad: 0,
            finished_cells_held: false,
            attention_separate: false,
        };
        // gpu 100 + 1000 + 200 = 1300 > cpu 600 + 30 × 20 = 1200: GPU-bound
        assert_eq!(m.duration(0, 20, 200, 40, 20, true), (1300, 1300));
        // cpu 600 + 30 × 40 = 1800 > gpu 100 + 1000 + 400 = 1500: CPU-bound
        assert_eq!(m.duration(0, 40, 400, 80, 40, true), (1800, 1500));
        // the first step of a busy period: nothing was scheduled ahead
        assert_eq!(m.duration(0, 40, 400, 80, 40, false), (1800 + 1500, 1500));
    }

    /// The small step-time model of the decode-table and attention tests
    /// (no table yet).
    fn table_model() -> IterationModel {
        IterationModel {
            gpu_fixed_ns: 100.0,
            mem_base_ns: 1_000.0,
            mem_per_kv_token_ns: 1.0,
            comp_per_token_ns: 10.0,
            comp_per_attn_pair_ns: 0.5,
            cached_prefix_tokens: 0,
            cpu_base_ns: 600.0,
            cpu_per_seq_ns: 30.0,
            async_scheduling: false,
            decode_step_ns: Vec::new(),
            decode_step_slope_ns: Vec::new(),
            decode_step_ctx: 0.0,
            attention_pad: 0,
            finished_cells_held: false,
            attention_separate: false,
        }
    }

    /// A measured decode table replaces the roofline's decode part: the
    /// table's step for the decoding sequences (scaled beyond it), plus the
    /// prompt tokens' and the attention pairs' compute, plus the
    /// prefilling sequences' CPU; a prefill-only step pays the CPU base.
    #[test]
    fn a_measured_decode_table_sets_the_decode_step() {
        let m = IterationModel {
            decode_step_ns: vec![900.0, 1_000.0, 3_000.0, 2_000.0],
            ..table_model()
        };
        // 3 decoding: the third entry (not monotone: as measured), + 0.5 × 40
        assert_eq!(m.duration(0, 3, 300, 40, 3, false), (3_000 + 20, 3_020));
        // 4 decoding + a 100-token prompt chunk: the table's 2000 + 100 × 10
        // + 0.5 × 60 + 30 for the prefilling sequence
        assert_eq!(m.duration(100, 4, 500, 60, 5, true), (3_060, 3_060));
        // 4 decoding + a 300-token chunk: 2000 + 3000 + 30
        assert_eq!(m.duration(300, 4, 700, 0, 5, false), (5_030, 5_030));
        // 8 decoding: the last entry × 8 / 4
        assert_eq!(m.duration(0, 8, 800, 0, 8, false), (4_000, 4_000));
        // a prompt alone: CPU base + 50 × 10 + 30
        assert_eq!(m.duration(50, 0, 50, 0, 1, false), (1_130, 1_130));
    }

    /// A second table at a longer context: a decode-only step's entry is
    /// interpolated linearly in its sequences' mean context (pairs / D),
    /// extrapolated beyond the long table, never below the short one, with
    /// no attention term on top; a step that carries prompt tokens reads
    /// the short table.
    #[test]
    fn a_long_context_table_scales_decode_only_steps() {
        let m = IterationModel {
            decode_step_ns: vec![900.0, 1_000.0],
            // entries 900 → 1900 and 1000 → 5000 from context 50 to 450
            decode_step_slope_ns: vec![2.5, 10.0],
            decode_step_ctx: 50.0,
            ..table_model()
        };
        // 2 decoding at a mean context of 250: 1000 + 10 × 200, no attention
        assert_eq!(m.duration(0, 2, 500, 500, 2, false), (3_000, 3_000));
        // at 650 (beyond the long table): extrapolated, 1000 + 10 × 600
        assert_eq!(m.duration(0, 2, 1300, 1300, 2, false), (7_000, 7_000));
        // at 20 (below the short table): the short entry
        assert_eq!(m.duration(0, 1, 20, 20, 1, false), (900, 900));
        // 4 decoding (beyond the table) at 250: (1000 + 2000) × 4 / 2
        assert_eq!(m.duration(0, 4, 1000, 1000, 4, false), (6_000, 6_000));
        // a prompt chunk of 100 with 2 decoding: the short entry + 100 × 10
        // + 0.5 × 600 pairs + 30
        assert_eq!(m.duration(100, 2, 600, 600, 3, false), (2_330, 2_330));
        let text = std::fs::read_to_string(models().join("llama-cpp-tiny-cpu.toml")).unwrap();
        let with = |t: &str| {
            let v: toml::Value =
                toml::from_str(&text.replacen("[iteration]", &format!("[iteration]\n{t}"), 1))
                    .unwrap();
            ServerProfile::from_value("p.toml", v)
        };
        let ok = with("decode_step_ms = [9.0, 12.0]\ndecode_step_context = 48\ndecode_step_ms_long = [11.0, 20.0]\ndecode_step_context_long = 448").unwrap();
        assert_eq!(ok.iteration.decode_step_slope_ns, vec![5_000.0, 20_000.0]);
        assert_eq!(ok.iteration.decode_step_ctx, 48.0);
        for (t, field, why) in [
            (
                "decode_step_ms = [9.0]\ndecode_step_ms_long = [11.0]\ndecode_step_context_long = 448",
                "iteration.decode_step_ms_long",
                "all three or none",
            ),
            (
                "decode_step_ms = [9.0]\ndecode_step_context = 48",
                "iteration.decode_step_ms_long",
                "all three or none",
            ),
            (
                "decode_step_ms = [9.0, 12.0]\ndecode_step_context = 48\ndecode_step_ms_long = [11.0]\ndecode_step_context_long = 448",
                "iteration.decode_step_ms_long",
                "one entry per decode_step_ms entry (2), got 1",
            ),
            (
                "decode_step_ms = [9.0]\ndecode_step_context = 48\ndecode_step_ms_long = [11.0]\ndecode_step_context_long = 48",
                "iteration.decode_step_context_long",
                "must be above decode_step_context",
            ),
            (
                "decode_step_ms = [9.0]\ndecode_step_context = 48\ndecode_step_ms_long = [-1.0]\ndecode_step_context_long = 448",
                "iteration.decode_step_ms_long.0",
                "step time in ms",
            ),
        ] {
            let e = with(t).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(why), "{t}: {e}");
        }
    }

    /// `attention_span = "cache"`: every token of a step attends over the
    /// scheduled sequences' whole context (K) rounded up to the pad, not
    /// over its own (A); in the roofline and on top of a one-context table.
    #[test]
    fn attention_over_the_cache_counts_every_token_against_every_used_cell() {
        let mut m = IterationModel {
            gpu_fixed_ns: 0.0,
            mem_base_ns: 0.0,
            mem_per_kv_token_ns: 0.0,
            attention_pad: 256,
            finished_cells_held: false,
            attention_separate: false,
            ..table_model()
        };
        // 100 prompt tokens + 2 decodes over 600 used cells (→ 768): 102 ×
        // 768 pairs × 0.5 + 102 × 10 + CPU 600 + 3 × 30, whatever A is
        let want = 102 * 768 / 2 + 1_020 + 690;
        assert_eq!(m.duration(100, 2, 600, 5_150, 3, false).0, want);
        assert_eq!(m.duration(100, 2, 600, 1, 3, false).0, want);
        // 768 used cells exactly: no rounding up
        assert_eq!(m.duration(0, 1, 768, 1, 1, false).0, 384 + 10 + 630);
        // on a one-context table: the table's entry + 4 × 512 × 0.5
        m.decode_step_ns = vec![900.0, 1_000.0, 1_100.0, 1_200.0];
        assert_eq!(m.duration(0, 4, 300, 300, 4, false).0, 1_200 + 1_024);
        // without: the sequences' own pairs
        m.attention_pad = 0;
        assert_eq!(m.duration(0, 4, 300, 300, 4, false).0, 1_200 + 150);
        let text = std::fs::read_to_string(models().join("llama-cpp-tiny-cpu.toml")).unwrap();
        let without = text
            .replace("attention_span = \"cache\"\n", "")
            .replace("attention_pad_tokens = 256\n", "")
            .replace("finished_cells_held = true\n", "");
        assert_ne!(without, text);
        let load = |t: &str| ServerProfile::from_value("p.toml", toml::from_str(t).unwrap());
        assert_eq!(load(&text).unwrap().iteration.attention_pad, 256);
        assert_eq!(load(&without).unwrap().iteration.attention_pad, 0);
        assert!(load(&text).unwrap().iteration.finished_cells_held);
        assert!(!load(&without).unwrap().iteration.finished_cells_held);
        for (t, want) in [
            (
                without.replacen("[iteration]", "[iteration]\nattention_pad_tokens = 16", 1),
                "iteration.attention_pad_tokens: applies only with attention_span = \"cache\"",
            ),
            (
                without.replacen("[iteration]", "[iteration]\nfinished_cells_held = true", 1),
                "iteration.finished_cells_held: applies only with attention_span = \"cache\"",
            ),
            (
                text.replace("attention_pad_tokens = 256", "attention_pad_tokens = 0"),
                "iteration.attention_pad_tokens: must be in 1..=1048576, got 0",
            ),
            (
                text.replace("attention_span = \"cache\"", "attention_span = \"paged\""),
                "attention_span",
            ),
        ] {
            let e = load(&t).unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }

    #[test]
    fn a_bad_decode_table_is_refused_naming_the_entry() {
        let text = std::fs::read_to_string(models().join("llama-cpp-tiny-cpu.toml")).unwrap();
        let with = |t: &str| {
            let v: toml::Value = toml::from_str(&text.replacen(
                "[iteration]",
                &format!("[iteration]\ndecode_step_ms = {t}"),
                1,
            ))
            .unwrap();
            ServerProfile::from_value("p.toml", v)
        };
        let ok = with("[9.5, 12.0]").unwrap();
        assert_eq!(ok.iteration.decode_step_ns, vec![9.5e6, 12e6]);
        for (t, field) in [
            ("[9.5, -1.0]", "iteration.decode_step_ms.1"),
            ("[0.0]", "iteration.decode_step_ms.0"),
            ("[1e9]", "iteration.decode_step_ms.0"),
        ] {
            let e = with(t).unwrap_err().to_string();
            assert!(
                e.contains(field) && e.contains("step time in ms"),
                "{t}: {e}"
            );
        }
        let long = format!("[{}]", vec!["1.0"; 1025].join(","));
        let e = with(&long).unwrap_err().to_string();
        assert!(e.contains("at most 1024 entries"), "{e}");
    }

    #[test]
    fn gpt_oss_profile_loads() {
        let p = load_profile(&models().join("gpt-oss-20b-h100-nim.toml")).unwrap();
        assert_eq!(p.total_blocks, 74_874);
        assert_eq!(p.ingress, 8_500_000);
    }

    fn err(edit: &str, with: &str) -> ConfigError {
        let text = std::fs::read_to_string(models().join("llama-3.1-8b-h100-vllm.toml")).unwrap();
        assert!(text.contains(edit), "{edit}");
        let text = text.replace(edit, with);
        let v = crate::config::parse_toml("m.toml", &text).unwrap();
        ServerProfile::from_value("m.toml", v).unwrap_err()
    }

    /// The rounding of iteration times is `f64::round` exactly: halves,
    /// the float just below a half, integers, the edges of the fast path,
    /// and a million random values of every magnitude.
    #[test]
    fn round_ns_is_f64_round() {
        use rand::Rng as _;
        let half_below = f64::from_bits(0.5f64.to_bits() - 1);
        let mut xs = vec![
            0.0,
            -0.0,
            0.5,
            half_below,
            1.5,
            2.5,
            1e6 + 0.5,
            1e6 + 0.49999999,
            4_503_599_627_370_495.5,
            4_503_599_627_370_496.0,
            9.1e15,
            -0.4,
            -2.5,
            f64::NAN,
            f64::INFINITY,
            1e30,
        ];
        let mut g = crate::engine::rng::stream(3, 1, 2);
        for _ in 0..1_000_000 {
            let e = g.gen_range(-3..17);
            xs.push(g.gen::<f64>() * 10f64.powi(e));
            xs.push((g.gen_range(0..1u64 << 40) as f64) + 0.5);
        }
        for x in xs {
            assert_eq!(round_ns(x), x.round() as Nanos, "{x:e}");
        }
    }

    #[test]
    fn bad_profiles_name_the_field() {
        let e = err("kind = \"server\"", "kind = \"hosted\"");
        assert_eq!((e.source.as_str(), e.field.as_str()), ("m.toml", "kind"));
        let e = err("max_batched_tokens = 8192", "max_batched_tokens = 100");
        assert_eq!(e.field, "scheduler.max_batched_tokens");
        let e = err("block_size = 16", "block_size = 16\nblocks = 3");
        assert!(e.field.starts_with("kv_cache"), "{e}");
        let e = err("gpu_memory_gib = 79.6", "");
        assert_eq!(e.field, "kv_cache.gpu_memory_gib");
        let e = err("gpu_memory_gib = 79.6", "gpu_memory_gib = 16");
        assert_eq!(e.field, "kv_cache");
        let e = err("bandwidth_efficiency = 0.74", "bandwidth_efficiency = 1.5");
        assert_eq!(e.field, "iteration.bandwidth_efficiency");
        let e = err("max_model_len = 131072", "max_model_len = 100000000");
        assert_eq!(e.field, "scheduler.max_model_len");
        let e = err("max_num_seqs = 256", "max_num_seqs = -1");
        assert_eq!(e.field, "scheduler.max_num_seqs");
        let e = err("attn_flops_per_pair = 524288", "attn_flops_per_pair = -1");
        assert_eq!(e.field, "iteration.attn_flops_per_pair");
        let e = err("max_num_seqs = 256", "max_num_seqs = -1");
        assert_eq!(e.field, "scheduler.max_num_seqs");
        let e = err("async_scheduling = true", "async_scheduling = 1");
        assert!(e.field.starts_with("iteration"), "{e}");
    }
}
