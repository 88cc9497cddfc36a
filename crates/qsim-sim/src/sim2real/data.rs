//! The benchmark's data, embedded from `experiments/sim2real/` (see its
//! README for every source, commit and licence): the experiments (vLLM
//! settings and the load tool's workload), the models' and GPUs'
//! public figures, the measured actuals of the test and training sets, the
//! other simulators' published predictions, and qsim's fitted coefficients.

use crate::config::{parse_toml, ConfigError};
use serde::Deserialize;
use std::collections::BTreeMap;

pub const EXPERIMENTS: &str = include_str!("../../../../experiments/sim2real/experiments.toml");
pub const MODELS: &str = include_str!("../../../../experiments/sim2real/models.toml");
pub const GPUS: &str = include_str!("../../../../experiments/sim2real/gpus.toml");
pub const ACTUALS: &str = include_str!("../../../../experiments/sim2real/actuals.csv");
pub const PUBLISHED: &str = include_str!("../../../../experiments/sim2real/published.csv");
pub const COEFFICIENTS: &str = include_str!("../../../../experiments/sim2real/coefficients.toml");
pub const COEFFICIENTS_PATH: &str = "experiments/sim2real/coefficients.toml";

/// One stage of the load tool's constant-rate load.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Stage {
    pub rate: f64,
    pub duration_s: f64,
}

/// The load tool's shared-prefix workload (inference-perf `shared_prefix`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Workload {
    pub preset: String,
    pub num_groups: u32,
    pub prompts_per_group: u32,
    pub system_prompt_len: u32,
    pub question_len: u32,
    pub output_len: u32,
    #[serde(default)]
    pub multi_turn: bool,
    #[serde(default)]
    pub ignore_eos: bool,
    pub stages: Vec<Stage>,
}

/// One experiment (the data file carries more fields: sources, notes).
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Experiment {
    pub id: u64,
    pub folder: String,
    pub set: String,
    pub model: String,
    pub gpu: String,
    pub tp: u32,
    pub precision: String,
    pub max_num_batched_tokens: u32,
    pub max_num_seqs: u32,
    pub max_model_len: u32,
    pub gpu_memory_utilization: f64,
    #[serde(default)]
    pub cpu_offload: bool,
    #[serde(default)]
    pub prefix_caching: bool,
    pub workload: Workload,
}

#[derive(Debug, Deserialize)]
struct ExperimentsFile {
    experiments: Vec<Experiment>,
}

/// A model's public architecture figures.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Model {
    pub hf_id: String,
    pub layers: u32,
    pub hidden: u32,
    pub heads: u32,
    pub kv_heads: u32,
    pub head_dim: u32,
    #[serde(default)]
    pub experts: u32,
    #[serde(default)]
    pub active_experts: u32,
    pub bytes_per_param: f64,
    pub kv_bytes_per_token: f64,
    /// Every parameter (all experts).
    pub params_computed: f64,
    /// The parameters one token's matrix products use (active experts,
    /// without the embedding table).
    pub params_per_token_active: f64,
}

/// A GPU's public figures.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct Gpu {
    pub memory_bytes: f64,
    pub hbm_bandwidth_bytes_per_s: f64,
    pub bf16_dense_flops: f64,
    #[serde(default)]
    pub fp8_dense_flops: f64,
    pub tp_link_bandwidth_bytes_per_s: f64,
}

/// qsim's global coefficients: fitted once on the training experiments
/// (`qsim sim2real --fit`), the same for every model and GPU.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Coefficients {
    /// Fraction of the HBM bandwidth a step's weight reads reach.
    pub bandwidth_efficiency: f64,
    /// Fraction of the HBM bandwidth attention's KV reads reach (paged
    /// decode attention, its own kernel: see [`super::derive`]).
    pub kv_bandwidth_efficiency: f64,
    /// GPU time of every step besides its roofline (launches), ms.
    pub gpu_fixed_ms: f64,
    /// CPU time of a step (scheduling, inputs, sampling), ms, and per
    /// scheduled sequence, µs (hidden behind the GPU by async scheduling).
    pub cpu_overhead_ms: f64,
    pub cpu_per_seq_us: f64,
    /// The API server's time before the engine sees a request, ms.
    pub ingress_ms: f64,
    /// Tensor parallelism: the two all-reduces of every layer, their
    /// latency per step, µs per layer.
    pub tp_sync_us_per_layer: f64,
}

/// Everything the benchmark reads.
#[derive(Debug, Clone)]
pub struct Data {
    pub experiments: Vec<Experiment>,
    pub models: BTreeMap<String, Model>,
    pub gpus: BTreeMap<String, Gpu>,
    /// (set, exp_id, stage (-1: the whole run), metric) → measured ms.
    pub actuals: BTreeMap<(String, u64, i64, String), f64>,
    /// (simulator, exp_id, stage, metric) → (predicted ms, its absolute %
    /// error as the study recorded it) on the test set. The study scored
    /// LLMServingSim against an older version of the measurements, so its
    /// errors are its own records', not recomputed from `actuals`.
    pub published: BTreeMap<(String, u64, i64, String), (f64, f64)>,
}

#[derive(Deserialize)]
struct ActualRow {
    set: String,
    exp_id: u64,
    stage_index: i64,
    metric: String,
    actual_ms: f64,
}

#[derive(Deserialize)]
struct PublishedRow {
    simulator: String,
    set: String,
    exp_id: u64,
    stage_index: i64,
    metric: String,
    predicted_ms: f64,
    ape_pct: f64,
}

/// The rows of an embedded CSV file (columns by header name; others ignored).
fn csv_rows<T: serde::de::DeserializeOwned>(name: &str, text: &str) -> Result<Vec<T>, ConfigError> {
    csv::Reader::from_reader(text.as_bytes())
        .deserialize()
        .enumerate()
        .map(|(i, r)| {
            r.map_err(|e| ConfigError::new(name, format!("line {}", i + 2), e.to_string()))
        })
        .collect()
}

impl Data {
    /// The embedded data.
    pub fn embedded() -> Result<Data, ConfigError> {
        let ex: ExperimentsFile = crate::config::from_value(
            "experiments/sim2real/experiments.toml",
            parse_toml("experiments/sim2real/experiments.toml", EXPERIMENTS)?,
        )?;
        let models: BTreeMap<String, Model> = crate::config::from_value(
            "experiments/sim2real/models.toml",
            parse_toml("experiments/sim2real/models.toml", MODELS)?,
        )?;
        let gpus: BTreeMap<String, Gpu> = crate::config::from_value(
            "experiments/sim2real/gpus.toml",
            parse_toml("experiments/sim2real/gpus.toml", GPUS)?,
        )?;
        let actuals = csv_rows::<ActualRow>("experiments/sim2real/actuals.csv", ACTUALS)?
            .into_iter()
            .map(|r| ((r.set, r.exp_id, r.stage_index, r.metric), r.actual_ms))
            .collect();
        let published = csv_rows::<PublishedRow>("experiments/sim2real/published.csv", PUBLISHED)?
            .into_iter()
            .filter(|r| r.set == "test")
            .map(|r| {
                (
                    (r.simulator, r.exp_id, r.stage_index, r.metric),
                    (r.predicted_ms, r.ape_pct),
                )
            })
            .collect();
        for e in &ex.experiments {
            for (what, key, ok) in [
                ("model", &e.model, models.contains_key(&e.model)),
                ("gpu", &e.gpu, gpus.contains_key(&e.gpu)),
            ] {
                if !ok {
                    return Err(ConfigError::new(
                        "experiments/sim2real/experiments.toml",
                        format!("experiments.{}.{what}", e.id),
                        format!("no {what} {key:?}"),
                    ));
                }
            }
        }
        Ok(Data {
            experiments: ex.experiments,
            models,
            gpus,
            actuals,
            published,
        })
    }
}

/// Coefficients from a file of the shipped file's form (`qsim sim2real
/// --coefficients FILE`: another fit's result, to compare).
pub fn read_coefficients(path: &std::path::Path) -> Result<Coefficients, ConfigError> {
    let file = path.display().to_string();
    crate::config::from_value(&file, crate::config::read_toml(path)?)
}

/// The shipped coefficients.
pub fn shipped_coefficients() -> Result<Coefficients, ConfigError> {
    crate::config::from_value(
        COEFFICIENTS_PATH,
        parse_toml(COEFFICIENTS_PATH, COEFFICIENTS)?,
    )
}
