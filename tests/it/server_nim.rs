//! The gpt-oss-20b NIM profile against the shared-deployment article's measurements, using the
//! experiment file `experiments/nim-load.toml` unchanged.

use qsim_sim::experiment::server::{run_scenario, ServerSuite};
use qsim_sim::experiment::{load, ExperimentFile};
use qsim_sim::report::server::{values, METRICS};
use std::path::Path;

fn suite() -> ServerSuite {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("experiments/nim-load.toml");
    match load(&p, &[]).expect("nim-load.toml loads") {
        ExperimentFile::Server(s) => s,
        _ => panic!("nim-load.toml is a server experiment"),
    }
}

fn metric(v: &[f64], key: &str) -> f64 {
    v[METRICS
        .iter()
        .position(|m| m.0 == key)
        .expect("metric exists")]
}

fn within(name: &str, got: f64, want: f64, tol: f64, seed: u64) {
    let err = (got - want).abs() / want;
    println!(
        "{name}: {got:.4} vs {want} ({:+.1} %)",
        (got / want - 1.0) * 100.0
    );
    assert!(
        err <= tol,
        "seed {seed}: {name} = {got}, want {want} ± {:.0} %",
        tol * 100.0
    );
}

#[test]
fn gpt_oss_20b_at_1000_rpm_matches_the_seed() {
    let s = suite();
    let i = s
        .scenarios
        .iter()
        .position(|x| x.name == "capacity")
        .expect("capacity scenario");
    for seed in [1, 2, 3] {
        let r = run_scenario(
            s.profile.clone(),
            &s.scenarios[i],
            seed,
            s.scenarios[i].index,
        );
        let v = values(&r.metrics.total(r.until), r.until, 1);
        within("E2E p50 (s)", metric(&v, "e2e_p50_s"), 1.25, 0.10, seed);
        within("TTFT p50 (s)", metric(&v, "ttft_p50_s"), 0.035, 0.10, seed);
        within("ITL p50 (s)", metric(&v, "itl_p50_s"), 0.018, 0.10, seed);
        within("GPU utilization", metric(&v, "gpu_util"), 0.93, 0.10, seed);
        let kv = metric(&v, "kv_util_max");
        assert!(kv < 0.03, "seed {seed}: peak KV utilization {kv} >= 3 %");
        within(
            "input tokens/min",
            metric(&v, "input_tokens_per_min"),
            115_939.0,
            0.05,
            seed,
        );
        within(
            "output tokens/min",
            metric(&v, "output_tokens_per_min"),
            83_411.0,
            0.05,
            seed,
        );
        // Mean concurrency is NOT the article's 20: with 83 output tokens at an
        // 18 ms ITL, Little's law forces λ·E[E2E] ≈ 16.7/s × 1.55 s ≈ 26
        // (the article's own 83,411 output tokens/min × 18 ms also gives 25).
        // We check the model obeys Little's law instead.
        let little = metric(&v, "throughput_rps") * metric(&v, "e2e_mean_s");
        within(
            "concurrency vs Little's law",
            metric(&v, "concurrency_mean"),
            little,
            0.03,
            seed,
        );
    }
}

#[test]
fn twenty_thousand_rpm_without_limiter_grows_without_bound() {
    let s = suite();
    let i = s
        .scenarios
        .iter()
        .position(|x| x.name == "peak-20x")
        .expect("peak-20x scenario");
    let r = run_scenario(s.profile.clone(), &s.scenarios[i], 1, s.scenarios[i].index);
    let sn = &r.snapshots;
    assert_eq!(sn.len(), 3, "snapshots at 1, 5, 10 min");
    for x in sn {
        println!(
            "t={:>4.0}s waiting={:>6} running={} e2e_p50={:.1}s",
            x.t as f64 / 1e9,
            x.waiting,
            x.running,
            x.e2e_p50_s
        );
    }
    // roughly linear growth: ×5 from 1 to 5 min, ×2 from 5 to 10 min
    assert!(sn[1].waiting as f64 > 4.0 * sn[0].waiting as f64);
    assert!(sn[2].waiting as f64 > 1.8 * sn[1].waiting as f64);
    assert!(sn[1].e2e_p50_s > 3.0 * sn[0].e2e_p50_s);
    assert!(sn[2].e2e_p50_s > 1.5 * sn[1].e2e_p50_s);
    // the server still only serves its capacity
    assert!(sn[2].running <= s.profile.max_num_seqs as u64);
}

#[test]
fn runs_are_deterministic() {
    let s = suite();
    let a = run_scenario(s.profile.clone(), &s.scenarios[0], 7, 0);
    let b = run_scenario(s.profile.clone(), &s.scenarios[0], 7, 0);
    let va = values(&a.metrics.total(a.until), a.until, 1);
    let vb = values(&b.metrics.total(b.until), b.until, 1);
    assert_eq!(va, vb);
    let c = run_scenario(s.profile.clone(), &s.scenarios[0], 8, 0);
    assert_ne!(va, values(&c.metrics.total(c.until), c.until, 1));
}

#[test]
fn a_scenario_gives_the_same_result_alone() {
    let all = suite();
    let full = qsim_sim::experiment::server::run_suite(&all, 3);
    let mut one = suite();
    one.retain_only(&["mild".to_string()]).unwrap();
    let alone = qsim_sim::experiment::server::run_suite(&one, 3);
    let i = all.scenarios.iter().position(|x| x.name == "mild").unwrap();
    let v = |r: &qsim_sim::experiment::server::ServerResult| {
        values(&r.metrics.total(r.until), r.until, 1)
    };
    assert_eq!(v(&full[i]), v(&alone[0]));
    assert!(one.retain_only(&["nope".to_string()]).is_err());
}

/// The NIM profile's KV-cache size, derived from the numbers in its file
/// (not read back from the loader): vLLM's free memory `gpu_memory_gib ×
/// gpu_memory_utilization − weights − reserved`, in blocks of `block_size`
/// tokens of `kv_bytes_per_token` bytes, rounded down. (79.6 × 0.9 − 12.8 −
/// 4.0) GiB / (16 × 49,152 B) = 74,874.9 → 74,874 blocks.
#[test]
fn nim_kv_blocks_derive_from_the_profile_numbers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/gpt-oss-20b-h100-nim.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    let v: toml::Value = toml::from_str(&text).unwrap();
    let f = |t: &str, k: &str| -> f64 {
        let x = &v[t][k];
        x.as_float()
            .or_else(|| x.as_integer().map(|i| i as f64))
            .unwrap()
    };
    let free_bytes = (f("kv_cache", "gpu_memory_gib") * f("kv_cache", "gpu_memory_utilization")
        - f("iteration", "weights_gib")
        - f("kv_cache", "reserved_gib"))
        * (1u64 << 30) as f64;
    let block_bytes = f("kv_cache", "block_size") * f("kv_cache", "kv_bytes_per_token");
    let blocks = (free_bytes / block_bytes).floor() as u32;
    // 24 layers × 8 KV heads × 64 head dim × 2 (K and V) × 2 bytes (bf16)
    assert_eq!(
        f("kv_cache", "kv_bytes_per_token"),
        (24 * 8 * 64 * 2 * 2) as f64
    );
    let p = qsim_sim::server::load_profile(&path).unwrap();
    assert_eq!(p.total_blocks, blocks);
    assert_eq!(blocks, 74_874);
}
