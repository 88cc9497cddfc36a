//! Bench binary (`cargo bench --bench sim`): how long one 200-row hosted
//! experiment takes to simulate, on one core. Speed is measured here, never
//! asserted in tests.

use qsim_sim::experiment;
use std::path::Path;
use std::time::Instant;

/// Process CPU time (user + system) in seconds, from /proc/self/stat.
fn cpu_seconds() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ is 100 on Linux
}

fn peak_rss_mb() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let file = root.join("experiments/fmapi-pacing.toml");
    let suite = experiment::load(&file, &[])
        .expect("experiment file")
        .into_hosted()
        .expect("a hosted suite");
    let n_exp = suite.experiments.len() as f64;
    // warm-up
    for s in 0..50 {
        std::hint::black_box(experiment::hosted::run_suite(&suite, s));
    }
    let iters = 2_000u64;
    let c0 = cpu_seconds();
    let t0 = Instant::now();
    let mut rows = 0u64;
    for s in 0..iters {
        let r = experiment::hosted::run_suite(&suite, 1_000 + s);
        rows += r.iter().map(|x| x.total).sum::<u64>();
    }
    let wall = t0.elapsed().as_secs_f64();
    let cpu = match (c0, cpu_seconds()) {
        (Some(a), Some(b)) => b - a,
        _ => f64::NAN,
    };
    let per_exp_us = wall / (iters as f64 * n_exp) * 1e6;
    println!("fmapi-pacing: {iters} suites x {n_exp} experiments ({rows} rows simulated)");
    println!(
        "  wall {wall:.3} s, CPU {cpu:.2} s; {per_exp_us:.1} us per 200-row experiment ({:.2} ms per suite)",
        wall / iters as f64 * 1e3
    );
    if let Some(m) = peak_rss_mb() {
        println!("  peak RSS {m:.1} MB");
    }
}
