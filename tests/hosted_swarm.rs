//! Seeded swarm runs of the hosted-API simulation (VOPR style): random
//! suites, invariants checked from outside the system under test. A failure
//! prints the seed that reproduces it.

use qsim::engine::rng::{stream, unit};
use qsim::experiment::{self, hosted::run_suite};
use std::path::PathBuf;

fn pick<'a>(r: &mut qsim::engine::Rng, xs: &[&'a str]) -> &'a str {
    xs[(unit(r) * xs.len() as f64) as usize % xs.len()]
}

/// A random suite as `--set` overrides of the shipped experiment file.
fn random_sets(seed: u64) -> Vec<String> {
    let mut r = stream(seed, 99, 0);
    let mut sets = vec![
        format!("rows={}", 1 + (unit(&mut r) * 400.0) as u64),
        format!("workers={}", 1 + (unit(&mut r) * 150.0) as u64),
        format!("max_tokens={}", 16 + (unit(&mut r) * 400.0) as u64),
        format!("cooldown_s={}", (unit(&mut r) * 90.0) as u64),
        format!("sdk_retries={}", unit(&mut r) < 0.5),
    ];
    let backoff = pick(
        &mut r,
        &[
            "none",
            "constant",
            "exponential",
            "full_jitter",
            "equal_jitter",
            "decorrelated",
        ],
    );
    sets.push(format!("experiment.1.retry.backoff={backoff}"));
    sets.push(format!(
        "experiment.1.retry.max_attempts={}",
        1 + (unit(&mut r) * 10.0) as u64
    ));
    sets.push(format!(
        "experiment.2.managed.initial_concurrency={}",
        1 + (unit(&mut r) * 60.0) as u64
    ));
    sets
}

/// Random top-level knobs for the policy comparison file (retry quotas,
/// adaptive throttling, every backoff family).
fn random_top_sets(seed: u64) -> Vec<String> {
    random_sets(seed).into_iter().take(5).collect()
}

#[test]
fn swarm_invariants() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let cases = (0..150u64)
        .map(|s| {
            (
                root.join("experiments/fmapi-pacing.toml"),
                s,
                random_sets(s),
            )
        })
        .chain((150..200u64).map(|s| {
            (
                root.join("experiments/fmapi-policies.toml"),
                s,
                random_top_sets(s),
            )
        }));
    for (file, seed, sets) in cases {
        let suite = experiment::load(&file, &sets)
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"))
            .into_hosted()
            .unwrap();
        let otpm = suite
            .profile
            .limits
            .iter()
            .find(|l| l.name == "OTPM")
            .expect("OTPM limit")
            .clone();
        let results = run_suite(&suite, seed);
        let again = run_suite(&suite, seed);
        for (e, (r, r2)) in suite.experiments.iter().zip(results.iter().zip(&again)) {
            let ctx = format!("seed {seed} sets {sets:?} experiment {}", e.name);
            // every row ends exactly once
            assert_eq!(r.total, e.rows, "{ctx}: rows ended");
            assert_eq!(
                r.ok + r.rejected_429 + r.failed_other,
                r.total,
                "{ctx}: outcomes"
            );
            assert_eq!(r.latency.count(), r.total, "{ctx}: latencies");
            // nobody produces more than max_tokens
            assert!(r.output_tokens <= r.ok * e.max_tokens, "{ctx}: output cap");
            // a 429 costs at least one HTTP request
            assert!(
                r.http_requests >= r.total && r.http_429 <= r.http_requests,
                "{ctx}: http counts"
            );
            // quota: the OTPM bucket can hand out at most its capacity plus refill
            let refill = otpm.limit as f64 * r.elapsed as f64 / otpm.window as f64;
            assert!(
                r.output_tokens as f64 <= otpm.limit as f64 + refill + 1.0,
                "{ctx}: {} output tokens > {} + {refill:.0}",
                r.output_tokens,
                otpm.limit
            );
            if e.max_tokens > otpm.limit {
                assert_eq!(
                    r.ok, 0,
                    "{ctx}: a reservation above capacity can never pass"
                );
            }
            // waits are the caller's own, bounded per row by the longest wait
            assert!(r.own_wait <= r.max_wait * r.total.max(1), "{ctx}: waits");
            // determinism
            assert_eq!(
                format!("{r:?}"),
                format!("{r2:?}"),
                "{ctx}: not deterministic"
            );
        }
    }
}
