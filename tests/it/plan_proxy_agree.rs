//! Issue 26, case 1: `qsim plan --capacity 1000 --burst 3 --reserve
//! 30,20,30 --emit-proxy-config p.toml` reported [ok] while the proxy
//! running `p.toml` refused the unreserved consumer `dev` forever ("retry in
//! 18446744073 s") with every reserved consumer idle.
//!
//! Over random plans (capacity, burst, shares, threshold, semantics, unit):
//! the config `--emit-proxy-config` writes loads back, through the proxy's
//! own loader and compiler, to the limiter the plan simulated; the proxy's
//! request mapping (`output_bound`) and its decisions on one request
//! sequence are the plan simulation's, decision by decision; and on an idle
//! deployment every consumer with a share or access to the pool is admitted
//! a typical request of the plan's workload, or else the plan itself says,
//! as an error, that it never can be.

use proptest::prelude::*;
use qsim_core::limiter::admission::{decide, Decision, Limiter, Request, Semantics, State};
use qsim_core::time::{NEVER, NS_PER_SEC};
use qsim_sim::plan::{build, PlanSpec};

const SEMANTICS: [&str; 4] = [
    "rate-limit-only",
    "strict-floors",
    "litellm-priority",
    "partitioned",
];

fn cases() -> u32 {
    std::env::var("QSIM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_500)
}

#[allow(clippy::too_many_arguments)]
pub(crate) fn spec(
    cap: u64,
    burst: Option<u64>,
    res: &[u32],
    th: u32,
    sem: usize,
    tpm: bool,
) -> PlanSpec {
    let total: u32 = res.iter().sum();
    let res: Vec<u32> = if total > 100 {
        res.iter().map(|r| r * 100 / total).collect()
    } else {
        res.to_vec()
    };
    PlanSpec {
        capacity: Some(if tpm { cap * 400 } else { cap }.to_string()),
        burst: burst.map(|b| if tpm { b * 400 } else { b }.to_string()),
        reserve: (!res.is_empty()).then(|| {
            res.iter()
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(",")
        }),
        threshold: Some(format!("{:.2}", th as f64 / 100.0)),
        semantics: Some(SEMANTICS[sem].into()),
        unit: Some(if tpm { "tpm" } else { "rpm" }.into()),
        model: Some("ideal".into()),
        ..Default::default()
    }
}

/// Random plans built and checked (a plan qsim refuses is not counted).
static CHECKED: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

#[test]
fn the_emitted_proxy_config_decides_as_the_plan_and_starves_no_one() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x26_0001),
        ..ProptestConfig::default()
    });
    let plans = (
        1u64..3000,
        prop::option::of(prop_oneof![0u64..8, 0u64..400]),
        prop::collection::vec(prop_oneof![Just(0u32), 1u32..60], 0..4),
        50u32..=100,
        0usize..4,
        any::<bool>(),
        any::<u64>(),
    );
    let r = runner.run(&plans, |(cap, burst, res, th, sem, tpm, seed)| {
        one_plan(cap, burst, &res, th, sem, tpm, seed)
    });
    if let Err(e) = r {
        panic!("{e}");
    }
    // at least 2,000 random plans, whatever share of them qsim refuses
    let n = CHECKED.load(std::sync::atomic::Ordering::Relaxed);
    assert!(
        n >= cases() * 4 / 5,
        "only {n} of {} random plans were valid",
        cases()
    );
}

#[allow(clippy::too_many_arguments)]
fn one_plan(
    cap: u64,
    burst: Option<u64>,
    res: &[u32],
    th: u32,
    sem: usize,
    tpm: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    {
        let Ok((f, _)) = build(&spec(cap, burst, res, th, sem, tpm)) else {
            // a plan qsim refuses (exit 2) emits nothing
            return Ok(());
        };
        CHECKED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // the config as `--emit-proxy-config` writes it, keys filled in
        let text = qsim::commands::proxy::emit_config(&f.limiter, "property")
            .replace("[\"key-", "[\"secret-");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("proxy.toml");
        std::fs::write(&path, &text).unwrap();
        let cfg = qsim::commands::proxy::load(&qsim::commands::proxy::ProxyArgs {
            config: path,
            ..Default::default()
        })
        .map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(&cfg.limiter, &f.limiter);
        let proxy = std::sync::Arc::new(qsim_live::compile_limiter(&cfg).unwrap());
        let mut proxy_state = State::new(&proxy, 0);
        // the plan's simulation: `Limiter::new` on its limiter config
        let mut plan = Limiter::new(f.limiter.clone(), 0).unwrap();
        prop_assert_eq!(plan.params().as_ref(), proxy.as_ref());

        // one request sequence: the plan's requests (its max_tokens, inputs
        // around its mean), as bodies the proxy reads
        let n = f.limiter.consumers.len();
        let mean_input = f.input_tokens.mean().max(1.0).round() as u64;
        let body = serde_json::json!({"max_tokens": f.max_tokens, "n": 1});
        let max_tokens = qsim_live::output_bound(&body, 1).unwrap();
        prop_assert_eq!(max_tokens, f.max_tokens);
        let mut x = seed | 1;
        let mut next = || {
            // xorshift: the sequence is the property's, not the plan's
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut now = 0;
        let mut open = Vec::new();
        for _ in 0..200 {
            now += next() % (2 * NS_PER_SEC);
            let req = Request {
                consumer: (next() % n as u64) as usize,
                input_tokens: mean_input / 2 + next() % (mean_input + 1),
                max_tokens,
            };
            let a = plan.decide(now, &req);
            let b = decide(&proxy, &mut proxy_state, now, &req);
            prop_assert_eq!(a, b, "at {} for {:?}", now, req);
            if let Decision::Deny {
                retry_at: NEVER, ..
            } = a
            {
                let explained = proxy.never_fits(&req).is_some();
                prop_assert!(explained, "NEVER for a request that fits: {:?}", req);
            }
            if let Decision::Admit(g) = a {
                open.push(g);
            }
            if next() % 3 == 0 && !open.is_empty() {
                let g = open.swap_remove((next() % open.len() as u64) as usize);
                let out = next() % (max_tokens + 1);
                plan.complete(now, &g, out);
                qsim_core::limiter::admission::complete(&proxy, &mut proxy_state, now, &g, out);
            }
            prop_assert_eq!(plan.state(), &proxy_state);
        }
        for g in open.drain(..) {
            plan.complete(now, &g, 0);
        }

        // idle for an hour: every consumer with a share or access to the
        // pool is admitted a typical request, or the plan says it never is
        let findings = qsim_sim::plan::findings::static_findings(&f, None);
        let idle = now + 3600 * NS_PER_SEC;
        let all_reserved = f.limiter.reserved_bp_total() == 10_000;
        for c in 0..n {
            let cs = &f.limiter.consumers[c];
            let access = cs.reserved_bp > 0
                || !(all_reserved && f.limiter.semantics == Semantics::Partitioned);
            let req = Request {
                consumer: c,
                input_tokens: mean_input,
                max_tokens,
            };
            let d = plan.clone().decide(idle, &req);
            if !access {
                continue;
            }
            match proxy.never_fits(&req) {
                None => prop_assert!(
                    d.is_admit(),
                    "{} refused on an idle deployment: {:?}\n{}",
                    cs.name,
                    d,
                    text
                ),
                Some(nf) => {
                    let never = matches!(
                        d,
                        Decision::Deny {
                            retry_at: NEVER,
                            ..
                        }
                    );
                    prop_assert!(never, "{:?}", d);
                    let said = findings.iter().any(|x| {
                        x.level == qsim_sim::plan::findings::Level::Error
                            && x.message.contains(&format!("{} ({})", cs.name, nf.largest))
                    });
                    prop_assert!(
                        said,
                        "{} can never be admitted ({:?}) and the plan does not say so",
                        cs.name,
                        nf
                    );
                }
            }
        }
    }
    Ok(())
}

/// The issue's own case: the plan with a burst of 3 sizes a limiter under
/// which the idle `dev` is admitted, and told to retry soon, not in 584
/// years.
#[test]
fn the_issues_plan_admits_dev_when_idle() {
    let f = build(&PlanSpec {
        capacity: Some("1000".into()),
        burst: Some("3".into()),
        reserve: Some("30,20,30".into()),
        model: Some("ideal".into()),
        ..Default::default()
    })
    .unwrap()
    .0;
    let mut l = Limiter::new(f.limiter.clone(), 0).unwrap();
    let dev = f
        .limiter
        .consumers
        .iter()
        .position(|c| c.name == "dev")
        .unwrap();
    let req = Request {
        consumer: dev,
        input_tokens: 100,
        max_tokens: 256,
    };
    let mut admitted = 0;
    while l.decide(0, &req).is_admit() {
        admitted += 1;
    }
    // beyond the full credits (67) and the one each of the three floors
    // accrues, the pool: one second of the unreserved 20 % (4 of 200/min)
    assert_eq!(admitted, 3 + 4);
    match l.decide(0, &req) {
        Decision::Deny { retry_at, .. } => assert!(retry_at < 60 * NS_PER_SEC, "{retry_at}"),
        d => panic!("{d:?}"),
    }
}
