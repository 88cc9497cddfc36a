//! Seeded swarm runs of the hosted-API simulation (VOPR style): random
//! suites, invariants checked from outside the system under test. A failure
//! prints the seed that reproduces it.

use qsim_sim::engine::rng::{stream, unit};
use qsim_sim::experiment::{self, hosted::run_suite};
use std::path::PathBuf;

fn pick<'a>(r: &mut qsim_sim::engine::Rng, xs: &[&'a str]) -> &'a str {
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

/// Per row, against the experiment's policy: attempts within
/// `max_attempts`; every row sends at least once; the SDK layer retries at
/// most its `max_retries` per caller attempt (bounds from the config).
fn check_attempts(
    ctx: &str,
    e: &experiment::config::Experiment,
    r: &experiment::hosted::HostedResult,
) {
    match &e.client {
        experiment::config::ClientKind::Pool { caller, .. } => {
            let max = caller.retry.max_attempts.max(1);
            assert!(
                r.max_attempts <= max,
                "{ctx}: {} attempts > {max}",
                r.max_attempts
            );
            let sdk_max = caller.sdk.as_ref().map_or(0, |s| s.max_retries) as u64;
            let sends = r.http_requests + r.local_rejects;
            assert!(sends >= r.total, "{ctx}: a row that never sent");
            assert!(
                r.sdk_retries * (1 + sdk_max) <= sdk_max * sends,
                "{ctx}: {} SDK retries in {sends} sends",
                r.sdk_retries
            );
            assert!(
                sends <= r.total * max as u64 * (1 + sdk_max),
                "{ctx}: {sends} sends for {} rows",
                r.total
            );
        }
        experiment::config::ClientKind::Managed(p) => {
            assert!(r.max_attempts <= p.max_attempts, "{ctx}: managed attempts");
            assert!(
                r.http_requests <= r.total * p.max_attempts as u64,
                "{ctx}: sends"
            );
        }
    }
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
            check_attempts(&ctx, e, r);
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

/// Hosted profiles with each retry-hint shape: `Retry-After` (whole
/// seconds, Anthropic), `retry-after-ms` (Azure OpenAI) and a body
/// `retry_after` (the Databricks profile with its hint switched on, ms
/// precision). The own-retry client sleeps a constant 333.7 ms, the SDK
/// layer off, so every own wait is either a hint (honor_hint: a whole
/// number of the shape's unit) or 333.7 ms (hints ignored); per row,
/// attempts stay within max_attempts; with the SDK layer on, at most its
/// retries per caller attempt.
#[test]
fn hint_shapes_honoured_or_ignored_per_policy() {
    use qsim_sim::experiment::config::ClientKind;
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().unwrap();
    let body = dir.path().join("databricks-body-hint.toml");
    let text =
        std::fs::read_to_string(root.join("models/databricks-claude-haiku-4-5.toml")).unwrap();
    assert!(text.contains("hint = \"none\""));
    std::fs::write(
        &body,
        text.replace("hint = \"none\"", "hint = \"body_retry_after\""),
    )
    .unwrap();
    let shapes = [
        (
            root.join("models/anthropic-claude-haiku-example-tier.toml"),
            1_000_000_000u64,
        ),
        (
            root.join("models/azure-openai-gpt-4o-30k-tpm.toml"),
            1_000_000,
        ),
        (body, 1_000_000),
    ];
    let delay: u64 = 333_700_000;
    let mut retried = [0u64; 2];
    for (profile, unit_ns) in &shapes {
        for seed in 0..8u64 {
            let mut r = stream(seed, 97, 0);
            let honor = seed % 2 == 0;
            let sdk = seed % 4 == 1;
            let sets = vec![
                format!("endpoint={}", profile.display()),
                format!("rows={}", 20 + (unit(&mut r) * 150.0) as u64),
                format!("workers={}", 4 + (unit(&mut r) * 60.0) as u64),
                format!("max_tokens={}", 64 + (unit(&mut r) * 300.0) as u64),
                "cooldown_s=0".to_string(),
                format!("sdk_retries={sdk}"),
                "experiment.1.retry.backoff=constant".to_string(),
                "experiment.1.retry.delay_s=0.3337".to_string(),
                format!("experiment.1.retry.honor_hint={honor}"),
                format!("experiment.1.retry.max_attempts={}", 2 + seed % 5),
            ];
            let file = root.join("experiments/fmapi-pacing.toml");
            let suite = experiment::load(&file, &sets)
                .unwrap_or_else(|e| panic!("{sets:?}: {e}"))
                .into_hosted()
                .unwrap();
            assert_eq!(suite.profile.server_error_rate, 0.0, "every error a 429");
            let results = run_suite(&suite, seed);
            for (e, res) in suite.experiments.iter().zip(&results) {
                let ctx = format!("seed {seed} {} {}", profile.display(), e.name);
                check_attempts(&ctx, e, res);
                match &e.client {
                    ClientKind::Pool { caller, .. } => {
                        if e.name == "exp2-backoff" && !sdk {
                            assert_eq!(caller.retry.honor_hint, honor);
                            if honor {
                                assert_eq!(
                                    res.own_wait % unit_ns,
                                    0,
                                    "{ctx}: a wait that is not a hint"
                                );
                            } else {
                                assert_eq!(
                                    res.own_wait % delay,
                                    0,
                                    "{ctx}: a wait other than the constant"
                                );
                            }
                            if res.retried > 0 {
                                retried[honor as usize] += res.retried;
                            }
                        }
                    }
                    ClientKind::Managed(_) => {}
                }
            }
        }
    }
    assert!(
        retried[0] > 0 && retried[1] > 0,
        "both paths ran: {retried:?}"
    );
}
