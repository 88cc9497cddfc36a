//! One experiment of the study, as its load tool ran it: inference-perf's
//! constant-rate load (`load.type = constant`) in stages back to back on one
//! server, modelled as requests `1/rate` apart (an approximation: its
//! `ConstantLoadTimer` draws exponential gaps and rescales them to fill the
//! stage; modelled so, the training loss rose from 2.942 to 3.094, so the
//! evenly spaced arrivals stay, see docs/fidelity.md), every request a shared-prefix prompt
//! (system prompt + question) answered with exactly `output_len` tokens
//! (`ignore_eos`); the metrics of each stage over the requests that arrived
//! in it, and of the whole run, as the study computes them (ITL = (mean E2E −
//! mean TTFT) / (output − 1)).
//!
//! Checked against inference-perf at the commit the study ran (e8e0aa9):
//! TTFT is the first streamed chunk's time, E2E the response's end, both
//! from the request's send; every request is one turn (its `SharedPrefix`
//! config has no multi-turn option, so the workloads' `multi_turn = true`
//! is ignored: pydantic drops unknown fields). The study's ITL divides by
//! inference-perf's mean output count, which re-tokenizes the answer text
//! (`CustomTokenizer.count_tokens`, with a BOS); qsim divides by the tokens
//! generated (`output_len`): where the two differ (Llama-3.1-8B's text
//! re-tokenizes ~4 % shorter) the measured ITL is larger by their ratio,
//! which qsim cannot know before the run.

use super::data::{Coefficients, Data, Experiment};
use super::derive;
use crate::config::ConfigError;
use crate::engine::{DurationHist, Sampler};
use crate::experiment::server::{run_scenario_observed, Load, Scenario};
use crate::server::RouterKind;
use crate::time::{try_secs, Nanos};
use crate::workload::rate::{RateShape, RawShape};
use crate::workload::{ArrivalProcess, Lengths, RawArrivals};
use std::sync::Arc;

/// The metrics the study reports, in its names.
pub const METRICS: [&str; 7] = [
    "e2e_mean",
    "ttft_mean",
    "itl_mean",
    "e2e_p90",
    "e2e_p99",
    "ttft_p90",
    "ttft_p99",
];

/// Predicted figures of one stage (`stage` -1: the whole run), in ms, in
/// the order of [`METRICS`].
#[derive(Debug, Clone, PartialEq)]
pub struct StagePrediction {
    pub stage: i64,
    pub requests: u64,
    pub values: [f64; 7],
}

struct Acc {
    e2e: DurationHist,
    ttft: DurationHist,
}

impl Acc {
    fn new() -> Self {
        Acc {
            e2e: DurationHist::new(),
            ttft: DurationHist::new(),
        }
    }
    fn prediction(&self, stage: i64, output: u32) -> StagePrediction {
        let ms = |s: f64| s * 1e3;
        let (e2e, ttft) = (ms(self.e2e.mean_s()), ms(self.ttft.mean_s()));
        let itl = if output > 1 {
            (e2e - ttft) / (output - 1) as f64
        } else {
            0.0
        };
        StagePrediction {
            stage,
            requests: self.e2e.count(),
            values: [
                e2e,
                ttft,
                itl,
                ms(self.e2e.quantile_s(0.9)),
                ms(self.e2e.quantile_s(0.99)),
                ms(self.ttft.quantile_s(0.9)),
                ms(self.ttft.quantile_s(0.99)),
            ],
        }
    }
}

/// The prompt tokens a request's prefill computes: its question and the
/// system prompt's tail that fills no whole block. The cached prefix still
/// costs every step the request is in: its attention reads the prefix's KV
/// and every query token attends over it (the profile's
/// `cached_prefix_tokens`).
pub fn prefill_tokens(e: &Experiment) -> u32 {
    let w = &e.workload;
    w.system_prompt_len + w.question_len - derive::cached_prefix_tokens(e)
}

/// The experiment's load as a server scenario: constant arrivals at the
/// first stage's rate, the later stages as per-minute factors of it.
pub fn scenario(e: &Experiment) -> Result<Scenario, ConfigError> {
    let w = &e.workload;
    let at = |f: &str| format!("experiments.{}.workload.{f}", e.id);
    let src = "experiments/sim2real/experiments.toml";
    let first = w
        .stages
        .first()
        .ok_or_else(|| ConfigError::new(src, at("stages"), "no stage"))?;
    let mut factors = Vec::new();
    for (i, s) in w.stages.iter().enumerate() {
        let minutes = s.duration_s / 60.0;
        if !(s.rate > 0.0 && minutes >= 1.0 && minutes.fract() == 0.0) {
            return Err(ConfigError::new(
                src,
                at(&format!("stages.{i}")),
                "a stage needs a rate > 0 and whole minutes",
            ));
        }
        factors.extend(std::iter::repeat_n(s.rate / first.rate, minutes as usize));
    }
    let shape = RateShape::new(&RawShape::PerMinute {
        factors: factors.clone(),
    })
    .map_err(|r| ConfigError::new(src, at("stages"), r))?;
    let process = ArrivalProcess::new(&RawArrivals::Constant, first.rate)
        .map_err(|r| ConfigError::new(src, at("stages.0.rate"), r))?
        .with_shape(shape);
    let duration = try_secs(factors.len() as f64 * 60.0)
        .map_err(|r| ConfigError::new(src, at("stages"), r.to_string()))?;
    Ok(Scenario {
        index: 0,
        name: e.folder.clone(),
        description: String::new(),
        load: Load::Open {
            rpm: first.rate * 60.0,
            process,
        },
        lengths: Lengths {
            input: Sampler::constant(prefill_tokens(e) as f64),
            output: Sampler::constant(w.output_len as f64),
        },
        duration,
        replicas: 1,
        router: RouterKind::RoundRobin,
        drain: true,
        snapshots: Vec::new(),
        autoscale: None,
    })
}

/// Run experiment `e` with coefficients `c`: one prediction per stage and
/// one for the whole run (stage -1), and the engine iterations it took.
pub fn run(
    data: &Data,
    e: &Experiment,
    c: &Coefficients,
    seed: u64,
) -> Result<(Vec<StagePrediction>, u64), ConfigError> {
    let profile = derive::profile(e, &data.models[&e.model], &data.gpus[&e.gpu], c)?;
    let sc = scenario(e)?;
    let ends: Vec<Nanos> = e
        .workload
        .stages
        .iter()
        .scan(0.0, |t, s| {
            *t += s.duration_s;
            Some(crate::time::secs(*t))
        })
        .collect();
    let mut stages: Vec<Acc> = ends.iter().map(|_| Acc::new()).collect();
    let mut all = Acc::new();
    let (res, _) = run_scenario_observed(Arc::new(profile), &sc, seed, 0, None, &mut |d| {
        if d.rejected {
            return;
        }
        let k = ends
            .partition_point(|&end| end <= d.arrival)
            .min(ends.len() - 1);
        for a in [&mut stages[k], &mut all] {
            a.e2e.record(d.finished - d.arrival);
            a.ttft.record(d.first_token - d.arrival);
        }
    });
    let out = e.workload.output_len;
    let mut p: Vec<StagePrediction> = stages
        .iter()
        .enumerate()
        .map(|(k, a)| a.prediction(k as i64, out))
        .collect();
    p.push(all.prediction(-1, out));
    let iterations = res.metrics.replicas.iter().map(|r| r.iterations).sum();
    Ok((p, iterations))
}
