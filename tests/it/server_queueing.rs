//! The server model in a degenerate configuration (one sequence at a time,
//! one iteration per request, service time ∝ prompt length) is an M/G/1
//! queue: its mean waiting time must match Pollaczek–Khinchine.

use qsim_sim::engine::{RawDist, Sampler};
use qsim_sim::experiment::server::{run_scenario, Load, Scenario};
use qsim_sim::server::{RouterKind, ServerProfile};
use qsim_sim::time::secs;
use qsim_sim::workload::{ArrivalProcess, Lengths, RawArrivals};
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
    let v = qsim_sim::config::parse_toml("mg1", text).unwrap();
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
        autoscale: None,
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

/// Routers told apart (one sequence at a time, service ∝ prompt): A (10 ms)
/// and B (1 µs) arrive at 0 on two replicas, C (1 µs) at 1 ms, after B
/// finished. Round-robin sends C to A's replica (0), where it waits for A
/// (≈ 9 ms); least-outstanding and least-KV send it to the idle replica,
/// B's, where it starts at once.
#[test]
fn routers_differ_when_one_replica_is_busy() {
    use qsim_sim::server::{Cluster, Completion, Request};
    let run = |router: RouterKind| -> Vec<Completion> {
        let mut c = Cluster::new(mg1_profile(), 2, router, 7);
        let req = |id, input_tokens| Request {
            id,
            input_tokens,
            output_tokens: 1,
        };
        c.submit(0, req(0, 100_000));
        c.submit(0, req(1, 10));
        let mut t = 0;
        let mut arrived = false;
        let mut out = Vec::new();
        loop {
            while let Some(d) = c.poll_completion() {
                out.push(d);
            }
            let next = c.poll_timeout();
            if !arrived && next.is_none_or(|n| n > 1_000_000) {
                arrived = true;
                c.submit(1_000_000, req(2, 10));
                continue;
            }
            match next {
                Some(n) => {
                    t = n.max(t);
                    c.handle_timeout(t);
                }
                None => break,
            }
        }
        out.sort_by_key(|d| d.id);
        assert_eq!(out.len(), 3, "{router:?}");
        out
    };
    let wait = |d: &Completion| d.first_token - d.arrival;
    let rr = run(RouterKind::RoundRobin);
    assert_eq!((rr[0].replica, rr[1].replica, rr[2].replica), (0, 1, 0));
    assert!(
        wait(&rr[2]) >= 8_000_000,
        "round-robin: C waits for A: {rr:?}"
    );
    for router in [RouterKind::LeastOutstanding, RouterKind::LeastKv] {
        let o = run(router);
        assert_ne!(o[0].replica, o[1].replica, "{router:?}: A and B apart");
        assert_eq!(
            o[2].replica, o[1].replica,
            "{router:?}: C to the idle replica"
        );
        assert!(wait(&o[2]) < 100_000, "{router:?}: C starts at once: {o:?}");
        assert!(o[2].finished < rr[2].finished);
    }
}
