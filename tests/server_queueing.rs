//! The server model in a degenerate configuration (one sequence at a time,
//! one iteration per request, service time ∝ prompt length) is an M/G/1
//! queue: its mean waiting time must match Pollaczek–Khinchine.

use qsim::engine::{RawDist, Sampler};
use qsim::experiment::server::{run_scenario, Load, Scenario};
use qsim::server::{RouterKind, ServerProfile};
use qsim::time::secs;
use qsim::workload::{ArrivalProcess, Lengths, RawArrivals};
use std::sync::Arc;

/// 100 ns per prompt token, nothing else: a request of P tokens with one
/// output token is served in exactly P × 100 ns.
fn mg1_profile() -> Arc<ServerProfile> {
    let text = r#"
kind = "server"
name = "mg1"
[scheduler]
max_num_seqs = 1
max_batched_tokens = 1000000000
chunked_prefill = false
max_model_len = 100000000
[kv_cache]
block_size = 16
total_blocks = 10000000
kv_bytes_per_token = 0
[iteration]
hbm_bandwidth_tb_s = 1
peak_tflops = 1000
weights_gib = 0
active_params_b = 0.05
"#;
    let v = qsim::config::parse_toml("mg1", text).unwrap();
    Arc::new(ServerProfile::from_value("mg1", v).unwrap())
}

/// Mean waiting time (s) pooled over `seeds` runs of `duration_s` each.
fn mean_wait(input: RawDist, rate: f64, duration_s: f64, seeds: u64) -> f64 {
    let profile = mg1_profile();
    let sc = Scenario {
        index: 0,
        name: "mg1".into(),
        description: String::new(),
        load: Load::Open {
            rpm: rate * 60.0,
            process: ArrivalProcess::new(&RawArrivals::Poisson, rate).unwrap(),
        },
        lengths: Lengths {
            input: input.validate().unwrap(),
            output: Sampler::constant(1.0),
        },
        duration: secs(duration_s),
        replicas: 1,
        router: RouterKind::RoundRobin,
        drain: false,
        snapshots: vec![],
    };
    let (mut sum, mut n) = (0.0, 0u64);
    for seed in 1..=seeds {
        let r = run_scenario(profile.clone(), &sc, seed, 0);
        let q = &r.metrics.replicas[0].queue_delay;
        sum += q.sum_s();
        n += q.count();
    }
    sum / n as f64
}

#[test]
fn md1_mean_wait_matches_pollaczek_khinchine() {
    // S = 10,000 tokens × 100 ns = 1 ms, ρ = 0.6
    let (s, rho) = (1e-3, 0.6);
    let lambda = rho / s;
    let w = mean_wait(RawDist::Const { value: 10_000.0 }, lambda, 150.0, 16);
    let expect = rho * s / (2.0 * (1.0 - rho));
    let err = (w - expect).abs() / expect;
    println!(
        "M/D/1: simulated {w:.6e} s, P-K {expect:.6e} s, error {:.3} %",
        err * 100.0
    );
    assert!(err < 0.02, "M/D/1 mean wait {w} vs {expect} (error {err})");
}

#[test]
fn mm1_mean_wait_matches_pollaczek_khinchine() {
    // S ~ Exp(mean 10,000 tokens) × 100 ns = 1 ms mean, ρ = 0.5
    let (s, rho) = (1e-3, 0.5);
    let lambda = rho / s;
    let w = mean_wait(
        RawDist::Exp {
            mean: 10_000.0,
            max: None,
        },
        lambda,
        150.0,
        16,
    );
    let expect = rho * s / (1.0 - rho); // λE[S²]/(2(1−ρ)) with E[S²] = 2s²
    let err = (w - expect).abs() / expect;
    println!(
        "M/M/1: simulated {w:.6e} s, P-K {expect:.6e} s, error {:.3} %",
        err * 100.0
    );
    assert!(err < 0.02, "M/M/1 mean wait {w} vs {expect} (error {err})");
}
