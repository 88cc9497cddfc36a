//! The provider rate limits (`RateLimits`, `TokenBucket`) — the hosted-API
//! model's buckets — against reference buckets: random limits (requests,
//! input, output or all tokens per window, under each output accounting),
//! admissions, refunds and late charges at increasing times.

use crate::reference::{RefBucket, Shape};
use crate::Rng;
use proptest::prelude::*;
use qsim_core::limiter::bucket::{BucketSpec, TokenBucket};
use qsim_core::limiter::rates::{Cost, Counts, LimitSpec, OutputAccounting, RateLimits};

const COUNTS: [Counts; 4] = [
    Counts::Requests,
    Counts::InputTokens,
    Counts::OutputTokens,
    Counts::Tokens,
];
const ACC: [OutputAccounting; 3] = [
    OutputAccounting::ReserveRefund,
    OutputAccounting::ReserveNoRefund,
    OutputAccounting::OnCompletion,
];

/// What a limit charges at admission and must find available, from its
/// documented meaning: requests count 1; token limits count the input
/// and/or `max_tokens` (the output only on completion under on-completion
/// accounting, and then at least one must be available).
fn admit(counts: Counts, acc: OutputAccounting, c: Cost) -> (u64, u64) {
    let later = acc == OutputAccounting::OnCompletion;
    let out = if later { 0 } else { c.max_tokens };
    let charge = match counts {
        Counts::Requests => 1,
        Counts::InputTokens => c.input_tokens,
        Counts::OutputTokens => out,
        Counts::Tokens => c.input_tokens + out,
    };
    let counts_output = matches!(counts, Counts::OutputTokens | Counts::Tokens);
    (
        charge,
        if later && counts_output {
            charge.max(1)
        } else {
            charge
        },
    )
}

/// What a completion settles: `(refund, extra)`, output-counting limits only.
fn settle(counts: Counts, acc: OutputAccounting, c: Cost, actual: u64) -> (u64, u64) {
    if !matches!(counts, Counts::OutputTokens | Counts::Tokens) {
        return (0, 0);
    }
    match acc {
        OutputAccounting::ReserveRefund => (
            c.max_tokens.saturating_sub(actual),
            actual.saturating_sub(c.max_tokens),
        ),
        OutputAccounting::ReserveNoRefund => (0, actual.saturating_sub(c.max_tokens)),
        OutputAccounting::OnCompletion => (0, actual),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x4a7e), ..ProptestConfig::default() })]

    #[test]
    fn rate_limits_match_reference_buckets(
        specs in prop::collection::vec((0usize..4, 0u64..3000, 1u64..3600, 0usize..3), 1..4),
        seed in any::<u64>(), steps in 50usize..400, checked in any::<bool>(),
    ) {
        let acc = ACC[specs[0].3];
        let specs: Vec<LimitSpec> = specs
            .iter()
            .map(|&(k, limit, window_s, _)| LimitSpec {
                name: format!("l{k}"),
                counts: COUNTS[k],
                limit,
                window: window_s * 1_000_000_000,
                accounting: acc,
            })
            .collect();
        let zero = specs.iter().any(|s| s.limit == 0);
        let t0 = 5;
        // try_new refuses a zero limit; new makes it one unit
        prop_assert_eq!(RateLimits::try_new(specs.clone(), t0).is_err(), zero);
        let mut rl = if checked && !zero { RateLimits::try_new(specs.clone(), t0).unwrap() } else { RateLimits::new(specs.clone(), t0) };
        prop_assert_eq!(rl.specs(), &specs[..]);
        let mut refs: Vec<RefBucket> = specs
            .iter()
            .map(|s| RefBucket::full(Shape { depth: s.limit.max(1), refill: s.window }, t0))
            .collect();
        let mut rng = Rng::new(seed);
        let mut now = t0;
        let mut flight: Vec<(u64, Cost, u64)> = Vec::new();
        for _ in 0..steps {
            now += rng.between(0, 3_000_000_000);
            // completions due
            let mut k = 0;
            while k < flight.len() {
                if flight[k].0 <= now {
                    let (_, c, actual) = flight.swap_remove(k);
                    rl.settle(now, c, actual);
                    for (s, b) in specs.iter().zip(refs.iter_mut()) {
                        let (back, extra) = settle(s.counts, acc, c, actual);
                        b.sync(now);
                        b.give_back(back);
                        b.spend(extra);
                    }
                } else {
                    k += 1;
                }
            }
            let c = Cost { input_tokens: rng.between(0, 400), max_tokens: rng.between(0, 300) };
            let ready: Vec<u64> = specs.iter().zip(&refs).map(|(s, b)| b.ready(now, admit(s.counts, acc, c).1)).collect();
            let first = ready.iter().position(|&t| t > now);
            let got = rl.admit(now, c);
            match (got, first) {
                (Ok(()), None) => {
                    for (s, b) in specs.iter().zip(refs.iter_mut()) {
                        b.sync(now);
                        b.spend(admit(s.counts, acc, c).0);
                    }
                    let actual = rng.between(0, c.max_tokens + 20);
                    flight.push((now + rng.between(0, 30_000_000_000), c, actual));
                }
                (Err(d), Some(i)) => {
                    prop_assert_eq!(d.limit, i, "first failing limit");
                    prop_assert_eq!(d.retry_at, *ready.iter().max().unwrap(), "retry_at");
                }
                (got, want) => prop_assert!(false, "at {}: {:?}, reference first failing {:?}", now, got, want),
            }
            prop_assert_eq!(rl.buckets().len(), refs.len());
            for (b, r) in rl.buckets().iter().zip(&refs) {
                prop_assert_eq!(b.available(now), r.units(now));
                prop_assert_eq!(b.capacity(), r.shape.depth);
                prop_assert_eq!(b.window(), r.shape.refill);
                let n = rng.between(0, r.shape.depth + 1);
                prop_assert_eq!(b.earliest(now, n), r.ready(now, n));
                prop_assert_eq!(b.check(now, n).is_ok(), r.ready(now, n) <= now);
                let f = b.fill_fraction(now);
                prop_assert!((f - r.fraction(now)).abs() < 1e-9, "fill {} vs {}", f, r.fraction(now));
            }
        }
    }
}

/// A lone token bucket: take, refuse with the exact time, refill, refund
/// capped, spec round trip, invalid specs refused.
#[test]
fn token_bucket_against_the_reference() {
    assert!(BucketSpec::new(0, 10).is_err());
    assert!(BucketSpec::new(10, 0).is_err());
    let one = BucketSpec::at_least_one(0, 0);
    assert_eq!((one.capacity(), one.window()), (1, 1));
    let spec = BucketSpec::new(10, 1_000).unwrap();
    let mut b = TokenBucket::full(spec, 100);
    assert_eq!(b.spec(), spec);
    let mut r = RefBucket::full(
        Shape {
            depth: 10,
            refill: 1_000,
        },
        100,
    );
    let mut rng = Rng::new(3);
    let mut now = 100;
    for _ in 0..2_000 {
        now += rng.between(0, 150);
        let n = rng.between(0, 11);
        let want = r.ready(now, n);
        match b.try_take(now, n) {
            Ok(()) => {
                assert!(want <= now);
                r.sync(now);
                r.spend(n);
            }
            Err(t) => assert_eq!(t, want),
        }
        if rng.between(0, 9) == 0 {
            let k = rng.between(0, 12);
            b.refund(now, k);
            r.sync(now);
            r.give_back(k);
        }
        if rng.between(0, 19) == 0 {
            b.force_take(now, 3);
            r.sync(now);
            r.spend(3);
        }
        b.advance(now);
        assert_eq!(b.available(now), r.units(now));
        assert_eq!(b.available(now + 333), r.units(now + 333));
    }
}

/// A request that charges nothing to a limit needs nothing from it, except
/// output counted on completion, which needs one unit available.
#[test]
fn a_zero_charge_needs_no_units_unless_output_comes_later() {
    let spec = |counts, accounting| LimitSpec {
        name: "l".into(),
        counts,
        limit: 10,
        window: 60_000_000_000,
        accounting,
    };
    let empty = Cost {
        input_tokens: 0,
        max_tokens: 0,
    };
    let ten = Cost {
        input_tokens: 10,
        max_tokens: 10,
    };
    for counts in [Counts::InputTokens, Counts::OutputTokens, Counts::Tokens] {
        for acc in ACC {
            let s = spec(counts, acc);
            assert_eq!(
                s.admit_charge(empty),
                admit(counts, acc, empty),
                "{counts:?} {acc:?}"
            );
            let mut rl = RateLimits::new(vec![s], 0);
            // drain it to exactly zero
            let later = acc == OutputAccounting::OnCompletion;
            if counts == Counts::OutputTokens {
                rl.commit(
                    0,
                    Cost {
                        input_tokens: 0,
                        max_tokens: 10,
                    },
                );
                if later {
                    rl.settle(0, empty, 10);
                }
            } else {
                rl.commit(
                    0,
                    Cost {
                        input_tokens: 10,
                        max_tokens: 0,
                    },
                );
            }
            assert_eq!(rl.buckets()[0].available(0), 0, "{counts:?} {acc:?}");
            let later = later && counts != Counts::InputTokens;
            assert_eq!(rl.check(0, empty).is_err(), later, "{counts:?} {acc:?}");
            assert!(rl.check(0, ten).is_err());
        }
    }
}
