//! Benchmark (not a test): the full `qsim plan --capacity 1000 --reserve
//! 30,20,30` — six scenarios, 17 simulated minutes, limiter in front of the
//! gpt-oss-20b server model, plus the six "no limiter" counterfactual runs —
//! measured in CPU time and peak RSS (from /proc/self). Goal: < 1 s CPU.
//!
//! `cargo bench --bench plan`

use qsim_sim::plan::run::run_cli;
use qsim_sim::plan::PlanSpec;

fn cpu_seconds() -> f64 {
    // utime + stime in clock ticks (fields 14 and 15 of /proc/self/stat)
    let s = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let rest = s.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = 100.0; // USER_HZ on Linux
    let ut: f64 = f.get(11).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    let st: f64 = f.get(12).and_then(|x| x.parse().ok()).unwrap_or(0.0);
    (ut + st) / tick
}

fn peak_rss_mb() -> f64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|k| k.parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

fn main() {
    let base = PlanSpec {
        capacity: Some("1000".into()),
        reserve: Some("30,20,30".into()),
        seed: 1,
        ..PlanSpec::default()
    };
    for (label, args, reps) in [
        (
            "plan (6 scenarios + 6 no-limiter runs, server model)",
            base.clone(),
            5u32,
        ),
        (
            "plan --need A=250,B=150,C=250 --e2e-p95 4s (inverse search)",
            PlanSpec {
                need: Some("A=250,B=150,C=250".into()),
                e2e_p95: Some(4 * qsim_sim::time::NS_PER_SEC),
                ..base.clone()
            },
            2,
        ),
    ] {
        let t0 = cpu_seconds();
        let mut bytes = 0;
        for _ in 0..reps {
            bytes += run_cli(&args, true, &Default::default())
                .expect("plan runs")
                .len();
        }
        let cpu = (cpu_seconds() - t0) / reps as f64;
        println!("{label}: {cpu:.3} s CPU per run ({reps} runs, {bytes} bytes of JSON), peak RSS {:.1} MB", peak_rss_mb());
    }
}
