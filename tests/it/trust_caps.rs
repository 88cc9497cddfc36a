//! Issue 41, case 1: a proxy emitted for a TPM plan answered 200 to
//! `"max_tokens": 18446744073709551615` (and …614, …611): the charge
//! `input + max_tokens` wrapped to a few tokens. Counts are now summed in
//! saturating units (`qsim_core::units::Units`), by type.
//!
//! Property: for random plans (unit, capacity, burst, shares, semantics),
//! random per-consumer token limits and random request bodies whose output
//! caps (`max_tokens`, `max_completion_tokens`, `max_output_tokens`) and
//! multipliers (`n`, `best_of`) range over all of `u64`, the proxy's own
//! request mapping (`output_bound`) and its limiter never admit a request
//! whose true charge — computed here in `u128` from the documented rule
//! (`input + largest cap × largest multiplier` under reservation) — is more
//! than every capacity bucket of the configuration holds together
//! (`qsim_core_tests::reference::buckets`), or more than the consumer's
//! `tokens_per_hour`.

use proptest::prelude::*;
use qsim_core::limiter::admission::{Decision, Limiter, Request, Unit};
use qsim_core::limiter::rates::OutputAccounting;
use qsim_core_tests::reference;
use qsim_sim::plan::build;

const CAPS: [&str; 3] = ["max_tokens", "max_completion_tokens", "max_output_tokens"];
const MULTS: [&str; 2] = ["n", "best_of"];

fn cases() -> u32 {
    std::env::var("QSIM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3_000)
}

/// A `u64` biased to the places where sums wrap: near `u64::MAX`, near
/// `2^63`, around a capacity, small, anywhere.
fn wide() -> impl Strategy<Value = u64> {
    prop_oneof![
        (0u64..=64).prop_map(|k| u64::MAX - k),
        (0u64..=8).prop_map(|k| (1u64 << 63) - 4 + k),
        1u64..2_000_000,
        1u64..64,
        any::<u64>(),
    ]
}

/// A field: absent, `null`, or a value.
fn field() -> impl Strategy<Value = Option<Option<u64>>> {
    prop_oneof![
        2 => Just(None),
        1 => Just(Some(None)),
        4 => wide().prop_map(|v| Some(Some(v))),
    ]
}

#[test]
fn no_output_cap_admits_what_the_limit_cannot_hold() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x41_0001),
        ..ProptestConfig::default()
    });
    let plans = (
        1u64..3000,
        prop::option::of(0u64..400),
        prop::collection::vec(prop_oneof![Just(0u32), 1u32..60], 0..4),
        0usize..4,
        any::<bool>(),
        prop::option::of(wide()),
    );
    let bodies = (
        prop::collection::vec(field(), 3),
        prop::collection::vec(field(), 2),
        wide(),
        0usize..4,
        1u64..5000,
    );
    let admitted = std::sync::atomic::AtomicU32::new(0);
    let r = runner.run(
        &(plans, bodies),
        |((cap, burst, res, sem, tpm, tph), (caps, mults, input, who, default))| {
            let spec = crate::plan_proxy_agree::spec(cap, burst, &res, 80, sem, tpm);
            let Ok((f, _)) = build(&spec) else {
                return Ok(());
            };
            let mut cfg = f.limiter.clone();
            let c = who % cfg.consumers.len();
            cfg.consumers[c].policy.tokens_per_hour = tph.map(|t| t.max(1));
            let Ok(mut lim) = Limiter::new(cfg.clone(), 0) else {
                return Ok(());
            };
            let mut body = serde_json::Map::new();
            for (name, v) in CAPS.iter().zip(&caps).chain(MULTS.iter().zip(&mults)) {
                match v {
                    None => {}
                    Some(None) => {
                        body.insert((*name).into(), serde_json::Value::Null);
                    }
                    Some(Some(x)) => {
                        body.insert((*name).into(), (*x).into());
                    }
                }
            }
            let body = serde_json::Value::Object(body);
            // the proxy's own mapping: a cap of 0 is a 400 (nothing forwarded)
            let Ok(max_tokens) = qsim_live::output_bound(&body, default) else {
                return Ok(());
            };
            let input = input % 1_000_000_000_000;
            let req = Request {
                consumer: c,
                input_tokens: input,
                max_tokens,
            };
            let Decision::Admit(_) = lim.decide(0, &req) else {
                return Ok(());
            };
            admitted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // the true charge, from the documented rule, in u128
            let stated = |v: &Option<Option<u64>>| v.flatten().map(u128::from);
            let out = caps
                .iter()
                .filter_map(stated)
                .max()
                .unwrap_or(default as u128)
                * mults.iter().filter_map(stated).max().unwrap_or(1).max(1);
            let reserve = cfg.accounting != OutputAccounting::OnCompletion;
            let tokens = input as u128 + if reserve { out } else { 0 };
            if cfg.unit == Unit::Tpm {
                let b = reference::buckets(&cfg);
                let all: u128 = b
                    .capacity(cfg.semantics)
                    .iter()
                    .chain(b.floor.iter().flatten())
                    .map(|s| s.depth as u128)
                    .sum();
                prop_assert!(
                    tokens <= all,
                    "admitted {} tokens, buckets hold {} in all: {}",
                    tokens,
                    all,
                    body
                );
            }
            if let Some(t) = cfg.consumers[c].policy.tokens_per_hour {
                prop_assert!(
                    tokens <= t as u128,
                    "admitted {} tokens against tokens_per_hour {}: {}",
                    tokens,
                    t,
                    body
                );
            }
            Ok(())
        },
    );
    if let Err(e) = r {
        panic!("{e}");
    }
    // the property is not vacuous: many random requests were admitted
    let n = admitted.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n >= cases() / 10, "only {n} admitted of {}", cases());
}
