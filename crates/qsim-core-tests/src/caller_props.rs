//! The caller state machine checked per row against its policy: attempts
//! ≤ max, SDK retries ≤ its limit per attempt, every delay from its
//! formula (given the uniform draw it consumed), retry hints honoured or
//! ignored per `honor_hint`, the SDK's hint ceiling, the retry quota's
//! arithmetic (a reference quota), the adaptive throttle's probability (a
//! reference sliding window) and the managed executor's re-queue delays.

use crate::Rng;
use proptest::prelude::*;
use qsim_core::client::managed::AimdParams;
use qsim_core::client::{
    AdaptiveThrottle, Backoff, Call, CallerPolicy, Layer, Managed, ManagedNext, Next, PoolShared,
    Reply, RetryPolicy, RetryQuota, SdkRetry, Send, StatusSet,
};
use qsim_core::Uniform;

const S: f64 = 1e9;

/// A uniform source that remembers its draws.
struct Tape {
    rng: Rng,
    draws: Vec<f64>,
}

impl Uniform for Tape {
    fn unit(&mut self) -> f64 {
        let u = self.rng.unit();
        self.draws.push(u);
        u
    }
}

/// `|got − want| ≤ 2 ns + 1e-9 relative` (float rounding of seconds).
fn near(got: u64, want_s: f64) -> bool {
    let want = want_s * S;
    (got as f64 - want).abs() <= 2.0 + want.abs() * 1e-12
}

fn arb_backoff() -> impl Strategy<Value = Backoff> {
    (0usize..6, 0.01f64..2.0, 0.1f64..40.0, 0.0f64..1.5).prop_map(|(k, base, cap, j)| match k {
        0 => Backoff::None,
        1 => Backoff::Constant { delay: base },
        2 => Backoff::Exponential {
            base,
            cap,
            jitter: j,
        },
        3 => Backoff::FullJitter { base, cap },
        4 => Backoff::EqualJitter { base, cap },
        _ => Backoff::Decorrelated { base, cap },
    })
}

#[allow(clippy::type_complexity)]
fn arb_policy() -> impl Strategy<Value = (CallerPolicy, Option<(u32, u32, u32)>, Vec<&'static str>)>
{
    (
        arb_backoff(),
        1u32..9,
        prop::sample::subsequence(vec!["429", "503", "5xx", "408", "4xx"], 0..3),
        any::<bool>(),
        prop::option::of((
            0u32..4,
            0.05f64..2.0,
            0.5f64..10.0,
            1.0f64..120.0,
            any::<bool>(),
        )),
        prop::option::of((0u32..40, 1u32..8, 0u32..3)),
    )
        .prop_map(|(backoff, max_attempts, on, honor_hint, sdk, quota)| {
            let names: Vec<String> = on.iter().map(|s| s.to_string()).collect();
            (
                CallerPolicy {
                    retry: RetryPolicy {
                        backoff,
                        max_attempts,
                        retry_on: StatusSet::parse(&names).unwrap(),
                        honor_hint,
                    },
                    sdk: sdk.map(
                        |(max_retries, initial, max_delay, hint_max, over)| SdkRetry {
                            max_retries,
                            initial,
                            max_delay,
                            hint_max,
                            hint_over_max_backoff: over,
                            retry_on: StatusSet::openai_sdk(),
                        },
                    ),
                },
                quota,
                on,
            )
        })
}

/// The statuses the policy's `retry_on` lists (reference reading).
fn listed(on: &[&str], status: u16) -> bool {
    on.iter().any(|s| match *s {
        "5xx" => (500..600).contains(&status),
        "4xx" => (400..500).contains(&status),
        c => c.parse::<u16>() == Ok(status),
    })
}

/// A reference retry quota: `capacity` tokens, a retry costs `cost`, a
/// success gives back `cost` if it was a retry else `increment`, capped.
#[derive(Debug, Clone, Copy)]
struct RefQuota {
    capacity: u32,
    cost: u32,
    increment: u32,
    level: u32,
}

/// The draw-aware delay of the caller's own policy for its `n`-th attempt
/// (1-based) having slept `prev` before: `(lo, hi)` in seconds, and the
/// exact value given the draw `u` (None if the formula draws nothing).
fn own_delay(b: &Backoff, n: u32, prev: f64, hint: Option<f64>, u: Option<f64>) -> Option<f64> {
    let expo = |base: f64, cap: f64| (base * 2f64.powi(n as i32 - 1)).min(cap);
    Some(match *b {
        Backoff::None => return None,
        Backoff::Constant { delay } => hint.unwrap_or(delay),
        Backoff::Exponential { base, cap, jitter } => hint.unwrap_or(expo(base, cap)) + jitter * u?,
        Backoff::FullJitter { base, cap } => match hint {
            Some(h) => h,
            None => u? * expo(base, cap),
        },
        Backoff::EqualJitter { base, cap } => match hint {
            Some(h) => h,
            None => expo(base, cap) * (1.0 + u?) / 2.0,
        },
        Backoff::Decorrelated { base, cap } => match hint {
            Some(h) => h,
            None => {
                let from = if prev == 0.0 { base } else { prev };
                let top = (from * 3.0).max(base);
                (base + (top - base) * u?).min(cap)
            }
        },
    })
}

#[derive(Debug, Clone, Copy)]
enum Answer {
    Ok,
    Err(u16, Option<u64>),
}

fn arb_answers() -> impl Strategy<Value = Vec<Answer>> {
    prop::collection::vec(
        (
            0usize..10,
            prop::sample::select(vec![429u16, 503, 500, 400, 408]),
            prop::option::of(prop_oneof![Just(0u64), 0u64..150_000]),
        )
            .prop_map(|(k, status, hint_ms)| {
                if k == 0 {
                    Answer::Ok
                } else {
                    Answer::Err(status, hint_ms.map(|ms| ms * 1_000_000))
                }
            }),
        1..60,
    )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0xca11), ..ProptestConfig::default() })]

    /// Each row, step by step, against its policy.
    #[test]
    fn every_row_follows_its_policy(
        (policy, quota, on) in arb_policy(),
        answers in arb_answers(), seed in any::<u64>(), rows in 1usize..6,
    ) {
        let mut shared = PoolShared { quota: quota.map(|(c, k, i)| RetryQuota::new(c, k, i)), throttle: None };
        let mut rq = quota.map(|(capacity, cost, increment)| RefQuota { capacity, cost, increment, level: capacity });
        let mut tape = Tape { rng: Rng::new(seed), draws: Vec::new() };
        let mut next_answer = answers.iter().cycle();
        let mut now = 1_000u64;
        for _ in 0..rows {
            let first = now;
            let mut call = Call::start(now);
            let mut attempt = 1u32;
            let mut sdk_used = 0u32;
            let mut own_wait = 0u64;
            let mut prev = 0.0f64;
            // each caller attempt is at most 1 + the SDK's retries HTTP requests
            let sdk_max = policy.sdk.as_ref().map_or(0, |s| s.max_retries);
            let mut budget = policy.retry.max_attempts.max(1) * (1 + sdk_max);
            loop {
                prop_assert!(budget > 0, "more HTTP requests than attempts × (1 + SDK retries)");
                budget -= 1;
                prop_assert_eq!(call.on_send(now, &mut shared, &mut tape), Send::Go);
                let ans = *next_answer.next().unwrap();
                let reply = match ans { Answer::Ok => Reply::Ok, Answer::Err(s, h) => Reply::Error { status: s, hint: h } };
                tape.draws.clear();
                let next = call.on_reply(now, reply, &policy, &mut shared, &mut tape);
                let u = tape.draws.first().copied();
                prop_assert!(tape.draws.len() <= 1, "at most one draw per reply");
                match (ans, next) {
                    (Answer::Ok, Next::Done(o)) => {
                        prop_assert_eq!((o.status, o.attempts, o.own_wait, o.latency, o.quota_denied), (200, attempt, own_wait, now - first, false));
                        if let Some(q) = rq.as_mut() {
                            q.level = (q.level + if attempt > 1 { q.cost } else { q.increment }).min(q.capacity);
                        }
                        break;
                    }
                    (Answer::Ok, n) => prop_assert!(false, "a success went on: {:?}", n),
                    (Answer::Err(status, hint), next) => {
                        let sdk_ok = policy.sdk.as_ref().is_some_and(|s| sdk_used < s.max_retries
                            && matches!(status, 408 | 409 | 429 | 500..=599)
                            && (s.hint_over_max_backoff || hint.is_none_or(|h| h as f64 <= s.hint_max * S)));
                        let wants = policy.retry.backoff != Backoff::None && attempt < policy.retry.max_attempts && listed(&on, status);
                        let can_pay = rq.is_none_or(|q| q.level >= q.cost);
                        match next {
                            Next::SendAt { at, layer: Layer::Sdk } => {
                                prop_assert!(sdk_ok, "SDK retry {} of {:?} for {}", sdk_used + 1, policy.sdk, status);
                                let s = policy.sdk.as_ref().unwrap();
                                let d = at - now;
                                match hint.filter(|&h| h > 0 && h as f64 <= s.hint_max * S) {
                                    Some(h) => prop_assert_eq!(d, h, "the SDK sleeps the hint"),
                                    None => {
                                        let v = (s.initial * 2f64.powi(sdk_used as i32)).min(s.max_delay);
                                        prop_assert!(near(d, v * (1.0 - 0.25 * u.unwrap())), "SDK delay {} for {} (draw {:?})", d, v, u);
                                        prop_assert!(d as f64 >= 0.75 * v * S - 2.0 && d as f64 <= v * S + 2.0);
                                    }
                                }
                                sdk_used += 1;
                                prop_assert_eq!((call.sdk_retries(), call.attempt()), (sdk_used, attempt));
                                now = at;
                            }
                            Next::SendAt { at, layer: Layer::Own } => {
                                prop_assert!(!sdk_ok && wants && can_pay, "own retry: sdk {} wants {} pay {}", sdk_ok, wants, can_pay);
                                let h = if policy.retry.honor_hint { hint.map(|h| h as f64 / S) } else { None };
                                let want = own_delay(&policy.retry.backoff, attempt, prev, h, u);
                                let d = at - now;
                                prop_assert!(want.is_some_and(|w| near(d, w)), "attempt {}: slept {} ns, formula {:?} ({:?}, hint {:?}, draw {:?})", attempt, d, want, policy.retry.backoff, h, u);
                                if let Some(q) = rq.as_mut() { q.level -= q.cost; }
                                prev = d as f64 / S;
                                own_wait += d;
                                attempt += 1;
                                sdk_used = 0;
                                prop_assert!(attempt <= policy.retry.max_attempts);
                                prop_assert_eq!((call.attempt(), call.sdk_retries(), call.own_wait()), (attempt, 0, own_wait));
                                now = at;
                            }
                            Next::Done(o) => {
                                prop_assert!(!(sdk_ok || wants && can_pay));
                                prop_assert_eq!((o.status, o.attempts, o.own_wait, o.latency, o.quota_denied),
                                    (status, attempt, own_wait, now - first, wants && !can_pay));
                                prop_assert!(o.attempts <= policy.retry.max_attempts.max(1));
                                break;
                            }
                        }
                        if let Some(s) = policy.sdk.as_ref() { prop_assert!(call.sdk_retries() <= s.max_retries); }
                    }
                }
                if let (Some(q), Some(real)) = (rq, shared.quota.as_ref()) {
                    prop_assert_eq!(q.level, real.level(), "quota level");
                }
            }
            now += 1_000_000;
        }
    }

    /// The managed executor: a row fails until `max_attempts`, each
    /// re-queue after the hint or `min(base·2^(n−1), cap)·U[0.5, 1)`; the
    /// window stays within [min, max]; in-flight rows are counted.
    #[test]
    fn managed_rows_requeue_by_formula_until_max_attempts(
        max_attempts in 1u32..10, base in 0.05f64..3.0, cap in 0.5f64..60.0, decrease in 0.1f64..0.9,
        answers in arb_answers(), seed in any::<u64>(),
    ) {
        let p = AimdParams { max_attempts, retry_base_s: base, retry_cap_s: cap, decrease, ..AimdParams::default() };
        let mut m: Managed<u32> = Managed::new(p.clone());
        let mut tape = Tape { rng: Rng::new(seed), draws: Vec::new() };
        let mut now = 0u64;
        let mut call = Call::start(now);
        let mut attempt = 1;
        let mut next_answer = answers.iter().cycle();
        loop {
            prop_assert!(m.has_room());
            m.on_send(now, &mut call);
            prop_assert_eq!(m.inflight(), 1);
            now += 1_000_000;
            match *next_answer.next().unwrap() {
                Answer::Ok => {
                    let o = m.on_success(now, &call);
                    prop_assert_eq!((o.status, o.attempts, o.latency), (200, attempt, now));
                    break;
                }
                Answer::Err(status, hint) => {
                    tape.draws.clear();
                    match m.on_failure(now, call, 0, status, hint, &mut tape) {
                        ManagedNext::Done(o) => {
                            prop_assert_eq!(attempt, max_attempts);
                            prop_assert_eq!((o.status, o.attempts, o.latency), (status, attempt, now));
                            break;
                        }
                        ManagedNext::EligibleAt(at) => {
                            prop_assert!(attempt < max_attempts);
                            let d = at - now;
                            match hint {
                                Some(h) => prop_assert_eq!(d, h),
                                None => {
                                    let v = (base * 2f64.powi(attempt as i32 - 1)).min(cap);
                                    let u = tape.draws[0];
                                    prop_assert!(near(d, v * (0.5 + 0.5 * u)), "{} vs {} (u {})", d, v, u);
                                }
                            }
                            prop_assert_eq!(m.poll_timeout(), Some(at));
                            prop_assert!(m.take_eligible(at - 1).is_none());
                            let (c, _) = m.take_eligible(at).unwrap();
                            prop_assert_eq!(m.poll_timeout(), None);
                            call = c;
                            attempt += 1;
                            prop_assert_eq!(call.attempt(), attempt);
                            now = at;
                        }
                    }
                }
            }
            prop_assert!(m.window() >= p.min && m.window() <= p.max);
            prop_assert_eq!(m.inflight(), 0);
        }
    }

    /// The adaptive throttle's rejection probability against a reference
    /// sliding window: records older than the window (by 1/120-window
    /// slots) drop out; p = max(0, (requests − K·accepts) / (requests + 1)).
    #[test]
    fn throttle_probability_matches_a_sliding_window(
        k in 1.0f64..3.0, window_s in 1u64..200, steps in prop::collection::vec((0u64..5_000, any::<bool>()), 1..200),
    ) {
        let window = window_s * 1_000_000_000;
        let slot = window / 120;
        let mut t = AdaptiveThrottle::new(k, window);
        let mut log: Vec<(u64, bool)> = Vec::new();
        let mut now = 0u64;
        for (dt_ms, ok) in steps {
            now += dt_ms * 1_000_000;
            let live: Vec<&(u64, bool)> = log.iter().filter(|(at, _)| at - at % slot + slot + window > now).collect();
            let r = live.len() as f64;
            let a = live.iter().filter(|x| x.1).count() as f64;
            let want = ((r - k * a) / (r + 1.0)).max(0.0);
            let got = t.reject_probability(now);
            prop_assert!((got - want).abs() < 1e-12, "p {} vs {}", got, want);
            t.record(now, ok);
            log.push((now, ok));
        }
    }
}

/// A throttle that rejects locally: the reply is a 429 without a hint that
/// the throttle records once (at send), and the caller's policy then sees it.
#[test]
fn local_rejection_is_a_hintless_429_recorded_once() {
    let mut t = AdaptiveThrottle::new(1.0, 60_000_000_000);
    for i in 0..50 {
        t.record(i, false);
    }
    let policy = CallerPolicy {
        retry: RetryPolicy {
            backoff: Backoff::Constant { delay: 2.0 },
            max_attempts: 2,
            retry_on: StatusSet::parse(&["429".into()]).unwrap(),
            honor_hint: true,
        },
        sdk: None,
    };
    let mut shared = PoolShared {
        quota: None,
        throttle: Some(t),
    };
    let mut zero = || 0.0;
    let mut call = Call::start(100);
    assert_eq!(call.on_send(100, &mut shared, &mut zero), Send::LocalReject);
    let p_after_send = shared.throttle.as_mut().unwrap().reject_probability(100);
    // 51 requests, 0 accepts: 51 / 52
    assert!((p_after_send - 51.0 / 52.0).abs() < 1e-12);
    match call.on_reply(100, Reply::LocalReject, &policy, &mut shared, &mut zero) {
        Next::SendAt {
            at,
            layer: Layer::Own,
        } => assert_eq!(at, 100 + 2_000_000_000),
        n => panic!("{n:?}"),
    }
    let p = shared.throttle.as_mut().unwrap().reject_probability(100);
    assert_eq!(p, p_after_send, "recorded once");
}

/// A closure is a `Uniform` that hands over exactly what it returns (the
/// simulator passes its ChaCha streams this way): a full-jitter delay with
/// the draw 0.5 is half the exponential term, 0.25 a quarter.
#[test]
fn a_closure_is_a_uniform_source() {
    let p = RetryPolicy {
        backoff: Backoff::FullJitter {
            base: 2.0,
            cap: 60.0,
        },
        max_attempts: 5,
        retry_on: StatusSet::parse(&["429".into()]).unwrap(),
        honor_hint: false,
    };
    let mut half = || 0.5;
    assert_eq!(p.delay(3, 0, None, &mut half), 4_000_000_000);
    let mut quarter = || 0.25;
    assert_eq!(p.delay(1, 0, None, &mut quarter), 500_000_000);
    assert_eq!(Uniform::unit(&mut quarter), 0.25);
}

fn retry_503(max_attempts: u32) -> CallerPolicy {
    CallerPolicy {
        retry: RetryPolicy {
            backoff: Backoff::Constant { delay: 1.0 },
            max_attempts,
            retry_on: StatusSet::parse(&["503".into()]).unwrap(),
            honor_hint: false,
        },
        sdk: None,
    }
}

/// The retry quota's arithmetic through the caller: a retry costs `cost`;
/// a success refunds `cost` if the row was retried, else `increment`;
/// never above capacity (capacity 10, cost 4, increment 1).
#[test]
fn quota_refunds_a_retried_success_its_cost_and_a_first_success_the_increment() {
    let p = retry_503(5);
    let mut shared = PoolShared {
        quota: Some(RetryQuota::new(10, 4, 1)),
        throttle: None,
    };
    let mut zero = || 0.0;
    let err = Reply::Error {
        status: 503,
        hint: None,
    };
    let level = |s: &PoolShared| s.quota.as_ref().unwrap().level();
    // row 1: two retries (10 → 6 → 2), then a third refused (2 < 4)
    let mut a = Call::start(0);
    assert!(matches!(
        a.on_reply(0, err, &p, &mut shared, &mut zero),
        Next::SendAt { .. }
    ));
    assert!(matches!(
        a.on_reply(0, err, &p, &mut shared, &mut zero),
        Next::SendAt { .. }
    ));
    assert_eq!(level(&shared), 2);
    match a.on_reply(0, err, &p, &mut shared, &mut zero) {
        Next::Done(o) => assert!(o.quota_denied && o.attempts == 3),
        n => panic!("{n:?}"),
    }
    // row 2 succeeds at once: + increment
    let mut b = Call::start(0);
    assert!(matches!(
        b.on_reply(0, Reply::Ok, &p, &mut shared, &mut zero),
        Next::Done(_)
    ));
    assert_eq!(level(&shared), 3);
    // another first-attempt success (+1), then a row that succeeds after a
    // paid retry gets its cost back
    Call::start(0).on_reply(0, Reply::Ok, &p, &mut shared, &mut zero);
    assert_eq!(level(&shared), 4);
    let mut c = Call::start(0);
    assert!(matches!(
        c.on_reply(0, err, &p, &mut shared, &mut zero),
        Next::SendAt { .. }
    ));
    assert_eq!(level(&shared), 0);
    assert!(matches!(
        c.on_reply(0, Reply::Ok, &p, &mut shared, &mut zero),
        Next::Done(_)
    ));
    assert_eq!(level(&shared), 4);
}

/// The adaptive throttle through the caller: a 429 from the backend is a
/// rejection, any other reply an accept; a fresh throttle never rejects,
/// even on a draw of 0; the send time is kept.
#[test]
fn throttle_counts_backend_429s_as_rejections_and_other_replies_as_accepts() {
    let p = retry_503(1);
    let window = 60_000_000_000;
    let mut shared = PoolShared {
        quota: None,
        throttle: Some(AdaptiveThrottle::new(2.0, window)),
    };
    let mut zero = || 0.0;
    let mut call = Call::start(5);
    assert_eq!(call.on_send(7, &mut shared, &mut zero), Send::Go);
    assert_eq!(call.sent_at(), 7);
    for _ in 0..4 {
        let r = Reply::Error {
            status: 429,
            hint: None,
        };
        Call::start(10).on_reply(10, r, &p, &mut shared, &mut zero);
    }
    // 4 requests, 0 accepts: 4 / 5
    let pr = shared.throttle.as_mut().unwrap().reject_probability(10);
    assert!((pr - 0.8).abs() < 1e-12, "{pr}");
    for _ in 0..2 {
        let r = Reply::Error {
            status: 503,
            hint: None,
        };
        Call::start(10).on_reply(10, r, &p, &mut shared, &mut zero);
    }
    // 6 requests, 2 accepts: (6 − 4) / 7
    let pr = shared.throttle.as_mut().unwrap().reject_probability(10);
    assert!((pr - 2.0 / 7.0).abs() < 1e-12, "{pr}");
}

/// The managed executor's window and queue with several rows: the window
/// bounds the rows in flight, a success frees a slot and widens the
/// window, only a 429 narrows it, rows failing at the same instant are all
/// re-queued.
#[test]
fn managed_window_bounds_rows_in_flight_and_only_429_narrows_it() {
    let p = AimdParams {
        initial: 2.0,
        min: 1.0,
        max: 10.0,
        increase: 1.0,
        decrease: 0.5,
        retry_base_s: 1.0,
        retry_cap_s: 4.0,
        max_attempts: 3,
    };
    let ctl = qsim_core::client::AimdController::new(p.clone());
    assert_eq!(ctl.params(), &p);
    let mut m: Managed<u32> = Managed::new(p);
    let mut half = || 0.5;
    let (mut a, mut b) = (Call::start(0), Call::start(0));
    assert!(m.has_room());
    m.on_send(0, &mut a);
    assert!(m.has_room());
    m.on_send(0, &mut b);
    assert!(!m.has_room(), "window 2: two rows in flight");
    let o = m.on_success(10, &a);
    assert_eq!((o.status, o.attempts, o.latency), (200, 1, 10));
    assert_eq!(m.inflight(), 1);
    assert_eq!(m.window(), 2.5, "+ increase / window");
    // a 503 re-queues without narrowing
    assert_eq!(
        m.on_failure(20, b, 2, 503, None, &mut half),
        ManagedNext::EligibleAt(20 + 750_000_000)
    );
    assert_eq!(m.window(), 2.5);
    assert_eq!(m.inflight(), 0);
    // two rows throttled at the same instant: both parked, window halved once
    let (mut c, mut d) = (Call::start(30), Call::start(30));
    m.on_send(30, &mut c);
    m.on_send(30, &mut d);
    m.on_failure(40, c, 3, 429, Some(5), &mut half);
    m.on_failure(40, d, 4, 429, Some(5), &mut half);
    assert_eq!(m.window(), 1.25);
    let (_, r1) = m.take_eligible(750_000_020).unwrap();
    let (_, r2) = m.take_eligible(750_000_020).unwrap();
    let (_, r3) = m.take_eligible(750_000_020).unwrap();
    let mut rows = vec![r1, r2, r3];
    rows.sort();
    assert_eq!(rows, [2, 3, 4]);
    assert!(m.take_eligible(u64::MAX).is_none());
}

/// A zero hint is no hint for the SDK layer: it sleeps its own backoff
/// (`min(0.5·2^n, 8)·(1 − 0.25·U)`), not zero.
#[test]
fn sdk_treats_a_zero_hint_as_none() {
    let s = SdkRetry::default();
    let mut half = || 0.5;
    assert_eq!(s.delay(0, Some(0), &mut half), 437_500_000);
    assert_eq!(s.delay(1, Some(1), &mut half), 1);
}
