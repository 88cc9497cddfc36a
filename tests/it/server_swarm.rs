//! Seeded swarm tests: random profiles and workloads against the server
//! cluster, with invariants checked from outside the model after every step.
//! A failure names its seed; rerun one with `QSIM_SWARM_SEED=<seed>`.

use qsim_sim::engine::rng::{stream, unit, Rng};
use qsim_sim::server::{Cluster, Request, RouterKind, ServerProfile};
use qsim_sim::time::Nanos;
use std::collections::BTreeMap;
use std::sync::Arc;

fn pick(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + (unit(rng) * (hi - lo + 1) as f64) as u64
}

fn random_profile(rng: &mut Rng) -> ServerProfile {
    let block = [1, 4, 16, 32][pick(rng, 0, 3) as usize];
    let max_model_len = pick(rng, 8, 600);
    let min_blocks = max_model_len.div_ceil(block);
    // tight caches force preemption
    let total_blocks = pick(rng, min_blocks, min_blocks * 6);
    let seqs = pick(rng, 1, 48);
    let text = format!(
        r#"
kind = "server"
name = "swarm"
[scheduler]
max_num_seqs = {seqs}
max_batched_tokens = {}
chunked_prefill = {}
max_model_len = {max_model_len}
[kv_cache]
block_size = {block}
total_blocks = {total_blocks}
kv_bytes_per_token = 1000
[iteration]
hbm_bandwidth_tb_s = 1
peak_tflops = 100
weights_gib = {}
active_params_b = 1
cpu_overhead_ms = {}
ingress_ms = {}
"#,
        seqs + pick(rng, 0, 512),
        unit(rng) < 0.5,
        unit(rng) * 2.0,
        unit(rng),
        if unit(rng) < 0.5 {
            0.0
        } else {
            unit(rng) * 3.0
        },
    );
    let v = qsim_sim::config::parse_toml("swarm", &text).unwrap();
    ServerProfile::from_value("swarm", v).unwrap()
}

struct Outcome {
    preemptions: u64,
    rejected: u64,
}

fn run_one(seed: u64) -> Outcome {
    let mut rng = stream(seed, 99, 1);
    let profile = Arc::new(random_profile(&mut rng));
    let replicas = pick(&mut rng, 1, 4) as u32;
    let router = [
        RouterKind::RoundRobin,
        RouterKind::LeastOutstanding,
        RouterKind::LeastKv,
    ][pick(&mut rng, 0, 2) as usize];
    let mut c = Cluster::new(profile.clone(), replicas, router, seed);
    let n = pick(&mut rng, 1, 400);
    let mean_gap = unit(&mut rng) * 20e6; // up to 20 ms between arrivals
    let mut t: Nanos = 0;
    // id → (requested output tokens, ended?)
    let mut reqs: BTreeMap<u64, (u32, bool)> = BTreeMap::new();
    let mut blocks_bound: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut gen, mut requested, mut rejected, mut rejected_tokens) = (0u64, 0u64, 0u64, 0u64);
    let mut next = 0u64;
    let total_blocks = profile.total_blocks;
    let gap = |rng: &mut Rng| (-(1.0 - unit(rng)).ln() * mean_gap) as Nanos;
    let mut ta = gap(&mut rng);
    let drain = |c: &mut Cluster,
                 reqs: &mut BTreeMap<u64, (u32, bool)>,
                 gen: &mut u64,
                 rejected: &mut (u64, u64)| {
        while let Some(d) = c.poll_completion() {
            let e = reqs
                .get_mut(&d.id)
                .unwrap_or_else(|| panic!("seed {seed}: unknown id {}", d.id));
            assert!(!e.1, "seed {seed}: request {} ended twice", d.id);
            e.1 = true;
            assert!(d.replica < c.replica_count(), "seed {seed}: bad replica");
            assert!(
                d.arrival <= d.first_token && d.first_token <= d.finished,
                "seed {seed}: time order {d:?}"
            );
            if d.rejected {
                assert_eq!(d.output_tokens, 0, "seed {seed}");
                rejected.0 += 1;
                rejected.1 += e.0 as u64;
            } else {
                assert_eq!(
                    d.output_tokens, e.0,
                    "seed {seed}: request {} got {} of {} tokens",
                    d.id, d.output_tokens, e.0
                );
                *gen += d.output_tokens as u64;
            }
        }
    };
    while next < n || c.outstanding() > 0 {
        let arrival = if next < n { ta } else { Nanos::MAX };
        match c.poll_timeout() {
            Some(tc) if tc <= arrival => {
                t = tc;
                c.handle_timeout(tc);
            }
            None if next >= n => panic!(
                "seed {seed}: {} requests stuck with no deadline",
                c.outstanding()
            ),
            _ => {
                t = arrival;
                // mostly valid requests, some empty or too long (rejected)
                let mml = profile.max_model_len as u64;
                let input = pick(&mut rng, 0, mml * 3 / 5) as u32;
                let output = pick(&mut rng, 0, (mml * 3 / 5).min(300)) as u32;
                reqs.insert(next, (output, false));
                // the most KV blocks this request can ever hold (prompt +
                // every output token), from its own lengths
                let most = (input as u64 + output as u64).div_ceil(profile.block_size as u64);
                blocks_bound.insert(next, most);
                requested += output as u64;
                c.submit(
                    t,
                    Request {
                        id: next,
                        input_tokens: input,
                        output_tokens: output,
                    },
                );
                next += 1;
                ta = t + gap(&mut rng);
            }
        }
        {
            let mut r = (rejected, rejected_tokens);
            drain(&mut c, &mut reqs, &mut gen, &mut r);
            (rejected, rejected_tokens) = r;
        }
        // KV blocks: within the profile's cache on every replica, and in all
        // no more than the requests not yet ended can hold (a block kept
        // after its request ended would show here)
        let live: u64 = reqs
            .iter()
            .filter(|(_, e)| !e.1)
            .map(|(id, _)| blocks_bound[id])
            .sum();
        let mut used_total = 0u64;
        for i in 0..c.replica_count() {
            let used = c.kv_blocks_in_use(i);
            used_total += used as u64;
            assert!(
                used <= total_blocks,
                "seed {seed}: replica {i} uses {used} > {total_blocks} KV blocks"
            );
        }
        assert!(
            used_total <= live,
            "seed {seed}: {used_total} KV blocks in use, the live requests need at most {live}"
        );
        assert_eq!(
            c.outstanding(),
            reqs.values().filter(|e| !e.1).count(),
            "seed {seed}: outstanding count differs from requests not yet ended"
        );
    }
    {
        let mut r = (rejected, rejected_tokens);
        drain(&mut c, &mut reqs, &mut gen, &mut r);
        (rejected, rejected_tokens) = r;
    }
    assert!(
        reqs.values().all(|e| e.1),
        "seed {seed}: a request never ended"
    );
    let m = c.metrics().total(t);
    // tokens generated = tokens requested by the requests that were not rejected
    assert_eq!(
        gen,
        requested - rejected_tokens,
        "seed {seed}: tokens generated != tokens requested minus rejected"
    );
    assert_eq!(
        m.output_tokens, gen,
        "seed {seed}: tokens generated {} != tokens delivered {gen}",
        m.output_tokens
    );
    assert_eq!(
        m.completed + m.rejected,
        n,
        "seed {seed}: completed + rejected != submitted"
    );
    assert_eq!(m.rejected, rejected, "seed {seed}");
    for r in &c.metrics().replicas {
        assert!(
            r.kv_blocks.max <= total_blocks as u64,
            "seed {seed}: peak KV blocks over capacity"
        );
    }
    Outcome {
        preemptions: m.preemptions,
        rejected,
    }
}

#[test]
fn swarm_invariants() {
    if let Ok(s) = std::env::var("QSIM_SWARM_SEED") {
        run_one(s.parse().expect("QSIM_SWARM_SEED must be an integer"));
        return;
    }
    let (mut pre, mut rej) = (0, 0);
    for seed in 0..300u64 {
        let o = run_one(seed);
        pre += o.preemptions;
        rej += o.rejected;
    }
    // the swarm must actually exercise preemption and rejection
    assert!(pre > 0, "no preemption in the swarm");
    assert!(rej > 0, "no rejection in the swarm");
    println!("swarm: {pre} preemptions, {rej} rejections over 300 seeds");
}
