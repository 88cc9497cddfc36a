//! The open-loop driver with the cluster's replicas advanced only as
//! routing needs (`Cluster::advance_lazily`) gives exactly what it gives
//! with every replica advanced at every deadline.

use super::*;
use crate::server::Completion;

fn profile(name: &str) -> ServerProfile {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../models")
        .join(name);
    load_profile(&p).unwrap()
}

/// The run's completions (in the order observed) and everything it
/// reports: the result's Debug and each histogram's quantiles, per replica.
fn run(p: &Arc<ServerProfile>, s: &Scenario, lazy: bool) -> (Vec<Completion>, String) {
    let mut seen = Vec::new();
    let (r, _) = run_observed(p.clone(), s, 7, 0, None, &mut |c| seen.push(*c), lazy);
    let mut key = format!("{r:?}");
    for m in &r.metrics.replicas {
        for h in [&m.ttft, &m.itl, &m.tpot, &m.e2e, &m.queue_delay] {
            let q: Vec<f64> = (0..=100).map(|i| h.quantile_s(i as f64 / 100.0)).collect();
            key += &format!(" {q:?} {} {}", h.sum_s(), h.max_s());
        }
    }
    (seen, key)
}

#[test]
fn replicas_advanced_as_routing_needs_give_the_same_run() {
    let dir = std::env::temp_dir().join(format!("qsim-lazy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // a trace whose rows arrive three at a time (scale 3: copies together)
    let mut text = String::from("t,i,o\n");
    for k in 0..700u64 {
        text += &format!(
            "{}.{:03},{},{}\n",
            k / 20,
            k % 20 * 50,
            20 + k * 131 % 900,
            1 + k * 7 % 120
        );
    }
    let file = dir.join("t.csv");
    std::fs::write(&file, text).unwrap();
    let raw = RawTrace {
        file: file.display().to_string(),
        format: Some("csv".into()),
        time_column: Some("t".into()),
        input_column: Some("i".into()),
        output_column: Some("o".into()),
        scale: Some(3.0),
        ..Default::default()
    };
    let trace =
        Arc::new(TraceSpec::from_raw("t.toml", "trace.", Path::new(""), &raw, true).unwrap());
    let vllm = profile("llama-3.1-8b-h100-vllm.toml");
    // KV for few requests (preemption), a short queue of sequences, no ingress
    let mut tight = vllm.clone();
    tight.total_blocks = 300;
    tight.max_num_seqs = 24;
    tight.ingress = 0;
    let profiles = [
        vllm,
        tight,
        profile("gpt-oss-20b-h100-nim.toml"),
        profile("llama-cpp-tiny-cpu.toml"),
    ];
    let lengths = Lengths {
        input: RawDist::Uniform {
            min: 1.0,
            max: 1500.0,
        }
        .validate()
        .unwrap(),
        output: RawDist::Exp {
            mean: 60.0,
            max: Some(400.0),
        }
        .validate()
        .unwrap(),
    };
    let mut runs = 0;
    let mut preempted = false;
    for (k, p) in profiles.into_iter().enumerate() {
        let p = Arc::new(p);
        // rates from light to past saturation (per replica: the CPU engine
        // is ~1000× slower)
        let scale = if k == 3 { 0.01 } else { 1.0 };
        for (rps, cv) in [(30.0, 1.0), (120.0, 3.0), (400.0, 1.0)] {
            for router in [
                RouterKind::LeastOutstanding,
                RouterKind::RoundRobin,
                RouterKind::LeastKv,
            ] {
                for drain in [true, false] {
                    let process =
                        ArrivalProcess::new(&RawArrivals::Gamma { cv }, rps * scale).unwrap();
                    let load = if rps == 400.0 && k == 0 {
                        Load::Trace(trace.clone())
                    } else {
                        Load::Open {
                            rpm: rps * scale * 60.0,
                            process,
                        }
                    };
                    let secs_run = if k == 3 { 300.0 } else { 6.0 };
                    let s = Scenario {
                        index: 0,
                        name: "lazy".into(),
                        description: String::new(),
                        load,
                        lengths: lengths.clone(),
                        duration: secs(secs_run),
                        replicas: 3,
                        router,
                        drain,
                        snapshots: vec![
                            secs(secs_run / 3.0),
                            secs(secs_run / 3.0) + 1,
                            secs(secs_run * 0.9),
                        ],
                        autoscale: None,
                    };
                    let (c1, k1) = run(&p, &s, true);
                    let (c0, k0) = run(&p, &s, false);
                    assert!(
                        c1.len() > 50,
                        "profile {k}, {rps}/s: {} completions",
                        c1.len()
                    );
                    assert!(
                        c1 == c0,
                        "profile {k}, {rps}/s, {router:?}, drain {drain}: completions differ"
                    );
                    assert!(
                        k1 == k0,
                        "profile {k}, {rps}/s, {router:?}, drain {drain}: results differ"
                    );
                    preempted |= !k1.contains("preemptions: 0,");
                    runs += 1;
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(preempted, "some runs preempt");
    assert_eq!(runs, 72);
}

/// Decode runs that finish requests inside them (and go on) give exactly
/// the sequence-by-sequence reference's run: every replica scheduling
/// every sequence one at a time, every iteration, advanced at every
/// deadline. Several replicas; preemption (KV for few requests), chunked
/// prefill (a short token budget), asynchronous scheduling and not,
/// finished requests' cells held (llama.cpp).
#[test]
fn decode_runs_through_finishes_give_the_reference_run() {
    let vllm = profile("llama-3.1-8b-h100-vllm.toml");
    assert!(vllm.iteration.async_scheduling && vllm.chunked_prefill);
    let mut tight = vllm.clone();
    tight.total_blocks = 300;
    tight.max_num_seqs = 24;
    tight.ingress = 0;
    let mut sync_budget = vllm.clone();
    sync_budget.iteration.async_scheduling = false;
    sync_budget.max_batched_tokens = 256;
    sync_budget.max_num_seqs = 64;
    let mut held_pad0 = vllm.clone();
    held_pad0.iteration.finished_cells_held = true;
    let cpu = profile("llama-cpp-tiny-cpu.toml");
    assert!(cpu.iteration.finished_cells_held);
    let profiles = [
        vllm,
        tight,
        sync_budget,
        held_pad0,
        profile("gpt-oss-20b-h100-nim.toml"),
        cpu,
    ];
    let lengths = Lengths {
        input: RawDist::Uniform {
            min: 1.0,
            max: 1200.0,
        }
        .validate()
        .unwrap(),
        output: RawDist::Exp {
            mean: 40.0,
            max: Some(300.0),
        }
        .validate()
        .unwrap(),
    };
    let mut preempted = false;
    for (k, p) in profiles.into_iter().enumerate() {
        let p = Arc::new(p);
        let cpu = k == 5;
        let scale = if cpu { 0.01 } else { 1.0 };
        let mut finishes = 0;
        for (rps, cv) in [(20.0, 1.0), (150.0, 2.0), (500.0, 1.0)] {
            let s = Scenario {
                index: 0,
                name: "runs".into(),
                description: String::new(),
                load: Load::Open {
                    rpm: rps * scale * 60.0,
                    process: ArrivalProcess::new(&RawArrivals::Gamma { cv }, rps * scale).unwrap(),
                },
                lengths: lengths.clone(),
                duration: secs(if cpu { 300.0 } else { 5.0 }),
                replicas: 4,
                router: RouterKind::LeastOutstanding,
                drain: true,
                snapshots: vec![],
                autoscale: None,
            };
            crate::server::RUN_FINISHES.with(|c| c.set(0));
            let (c1, k1) = run(&p, &s, true);
            finishes += crate::server::RUN_FINISHES.with(|c| c.get());
            crate::server::reference_batches(true);
            let (c0, k0) = run(&p, &s, false);
            crate::server::reference_batches(false);
            assert!(c1.len() > 50, "profile {k}, {rps}/s: {}", c1.len());
            assert!(c1 == c0, "profile {k}, {rps}/s: completions differ");
            assert!(k1 == k0, "profile {k}, {rps}/s: results differ");
            preempted |= !k1.contains("preemptions: 0,");
        }
        assert!(finishes > 0, "profile {k}: no run went through a finish");
    }
    assert!(preempted, "some runs preempt");
}
