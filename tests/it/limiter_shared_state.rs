//! Two proxy replicas sharing ONE limiter state, as they will through Redis:
//! every decision and completion reads the state (here: JSON text, the
//! store), applies `decide` / `complete` with the replica's own clock, and
//! writes it back. Each replica's clock is off true time by up to ±50 ms,
//! and one replica crashes, so the completions of the requests it admitted
//! never arrive.
//!
//! The rules under test (docs/limiter.md, "Shared state across replicas"):
//! decisions run at `max(now, state.clock)`; concurrency slots are leased
//! and a lost completion's slot is free again when its lease expires.

use qsim_sim::engine::rng::{stream, unit, Rng};
use qsim_sim::limiter::admission::{
    complete, decide, ConsumerPolicy, ConsumerSpec, Decision, Grant, LimiterConfig, Params,
    Request, Semantics, State, Unit,
};
use qsim_sim::limiter::rates::OutputAccounting;
use qsim_sim::time::{Nanos, NS_PER_MS, NS_PER_SEC};
use std::sync::Arc;

const MIN: Nanos = 60 * NS_PER_SEC;
/// True time starts here, so a clock 50 ms behind is still ≥ 0.
const T0: Nanos = 10 * NS_PER_SEC;
const SKEW: i64 = 50 * NS_PER_MS as i64;

const CAPACITY: u64 = 1000; // requests per minute
const THRESHOLD: f64 = 0.8;
/// The burst headroom the configuration implies: (1 − θ)·C = 200 requests.
/// With these reservations every semantics splits exactly this depth among
/// its capacity buckets (each share's part of the burst is more than one
/// second of its rate), so it is the bucket depth of the bound.
const DEPTH: u64 = 200;

fn config(semantics: Semantics, capacity: u64, concurrent: Option<u32>) -> LimiterConfig {
    let mk = |name: &str, bp: u32| ConsumerSpec {
        name: name.into(),
        reserved_bp: bp,
        policy: ConsumerPolicy {
            concurrent,
            ..ConsumerPolicy::default()
        },
    };
    LimiterConfig {
        capacity,
        unit: Unit::Rpm,
        threshold: THRESHOLD,
        burst: None,
        semantics,
        accounting: OutputAccounting::ReserveRefund,
        consumers: vec![mk("A", 3000), mk("B", 2000), mk("C", 3000), mk("dev", 0)],
    }
}

/// The shared store: the state as the text a key-value store would hold.
struct Store {
    text: String,
}

impl Store {
    fn new(s: &State) -> Store {
        Store {
            text: serde_json::to_string(s).unwrap(),
        }
    }
    fn read(&self) -> State {
        serde_json::from_str(&self.text).unwrap()
    }
    fn write(&mut self, s: &State) {
        self.text = serde_json::to_string(s).unwrap();
    }
}

struct Replica {
    /// Clock offset from true time (ns).
    offset: i64,
    /// The replica crashes at this true time: it takes no more requests and
    /// the completions of the requests it admitted never arrive.
    crash_at: Nanos,
}

impl Replica {
    fn clock(&self, t: Nanos) -> Nanos {
        (t as i64 + self.offset) as Nanos
    }
}

struct Admitted {
    /// True time of the admission.
    t: Nanos,
    consumer: usize,
    replica: usize,
    done_at: Nanos,
    grant: Grant,
}

#[derive(Default)]
struct Outcome {
    admitted: Vec<Admitted>,
    offered: u64,
    denied: u64,
    /// Decisions taken by a replica whose clock was behind the state's clock.
    lagging: u64,
    lagging_denied: u64,
    /// (true time, consumer, live in flight after the admission) for every
    /// admission of a consumer with a concurrency limit.
    live_after: Vec<(Nanos, usize, u32)>,
    lost: Vec<Grant>,
}

/// Poisson arrivals at `rpm[c]` per consumer from `T0` for `horizon`; each
/// request goes to a random live replica; service takes `service` ± 50 %.
fn run(
    params: &Arc<Params>,
    replicas: &[Replica],
    rpm: &[f64],
    service: Nanos,
    horizon: Nanos,
    seed: u64,
) -> Outcome {
    let n = rpm.len();
    let mut rng: Rng = stream(seed, 0, 7);
    let mut store = Store::new(&State::new(params, T0 - SKEW as Nanos));
    let gap = |r: &mut Rng, rpm: f64| ((-(1.0 - unit(r)).ln() * MIN as f64 / rpm) as Nanos).max(1);
    let mut next: Vec<Nanos> = rpm.iter().map(|&x| T0 + gap(&mut rng, x)).collect();
    let mut out = Outcome::default();
    // indices into out.admitted of requests in flight
    let mut flight: Vec<usize> = Vec::new();
    let mut last_clock = 0;
    loop {
        let (c, t_arr) = (0..n).map(|c| (c, next[c])).min_by_key(|x| x.1).unwrap();
        let t_done = flight
            .iter()
            .map(|&k| out.admitted[k].done_at)
            .min()
            .unwrap_or(Nanos::MAX);
        let t = t_arr.min(t_done);
        if t >= T0 + horizon {
            break;
        }
        if t_done <= t_arr {
            let pos = flight
                .iter()
                .position(|&k| out.admitted[k].done_at == t_done)
                .unwrap();
            let a = &out.admitted[flight.swap_remove(pos)];
            let r = &replicas[a.replica];
            if t >= r.crash_at {
                out.lost.push(a.grant);
                continue;
            }
            let mut s = store.read();
            complete(params, &mut s, r.clock(t), &a.grant, a.grant.max_tokens / 2);
            assert!(s.clock() >= last_clock, "the state's clock went back");
            last_clock = s.clock();
            store.write(&s);
            continue;
        }
        next[c] = t + gap(&mut rng, rpm[c]);
        let live: Vec<usize> = (0..replicas.len())
            .filter(|&i| t < replicas[i].crash_at)
            .collect();
        let ri = live[((unit(&mut rng) * live.len() as f64) as usize).min(live.len() - 1)];
        let r = &replicas[ri];
        let now = r.clock(t);
        let req = Request {
            consumer: c,
            input_tokens: 100,
            max_tokens: 200,
        };
        let mut s = store.read();
        let before = store.text.clone();
        let lagging = now < s.clock();
        out.offered += 1;
        out.lagging += lagging as u64;
        match decide(params, &mut s, now, &req) {
            Decision::Admit(grant) => {
                assert!(s.clock() >= last_clock, "the state's clock went back");
                last_clock = s.clock();
                store.write(&s);
                let svc = service / 2 + (unit(&mut rng) * service as f64) as Nanos;
                out.admitted.push(Admitted {
                    t,
                    consumer: c,
                    replica: ri,
                    done_at: t + svc,
                    grant,
                });
                flight.push(out.admitted.len() - 1);
                if params.config().consumers[c].policy.concurrent.is_some() {
                    let live_now = flight
                        .iter()
                        .filter(|&&k| out.admitted[k].consumer == c)
                        .filter(|&&k| replicas[out.admitted[k].replica].crash_at > t)
                        .count() as u32;
                    out.live_after.push((t, c, live_now));
                }
            }
            Decision::Deny { .. } => {
                store.write(&s);
                assert_eq!(store.text, before, "a denial changed the shared state");
                out.denied += 1;
                out.lagging_denied += lagging as u64;
            }
        }
    }
    out
}

/// Clock offsets of the two replicas (ns): the worst spread, either way
/// round, one exact clock, and an uneven pair.
const OFFSETS: [[i64; 2]; 4] = [
    [SKEW, -SKEW],
    [-SKEW, SKEW],
    [0, -SKEW],
    [-37 * NS_PER_MS as i64, 12 * NS_PER_MS as i64],
];

fn replicas(off: [i64; 2], crash_at: Nanos) -> Vec<Replica> {
    vec![
        Replica {
            offset: off[0],
            crash_at: Nanos::MAX,
        },
        Replica {
            offset: off[1],
            crash_at,
        },
    ]
}

/// (a) The shared limit holds within one bucket depth: over any window of
/// true time `w` between two admissions, admitted ≤ C·(w + spread)/60 s +
/// depth, where `spread` is the difference between the two clocks (a clock
/// ahead refills the shared buckets early by its lead; the effective times
/// of two admissions are at most `w + spread` apart). Overloaded 4×, with
/// replica 1 crashing after 70 s (its completions lost; in RPM no refund is
/// due, so losing them changes nothing here).
#[test]
fn shared_limit_holds_within_one_bucket_depth() {
    for sem in Semantics::ALL {
        let params = Arc::new(Params::new(config(sem, CAPACITY, None)).unwrap());
        for (k, off) in OFFSETS.iter().enumerate() {
            let reps = replicas(*off, T0 + 70 * NS_PER_SEC);
            let rpm = [1000.0; 4];
            let horizon = 2 * MIN;
            let o = run(&params, &reps, &rpm, 2 * NS_PER_SEC, horizon, 11 + k as u64);
            let spread = (off[0] - off[1]).unsigned_abs() as u128;
            let a = &o.admitted;
            // the whole run: from the state's creation (buckets full, at
            // T0 − 50 ms) to the last admission's effective time (≤ its
            // true time + 50 ms)
            let elapsed = (a.last().unwrap().t - T0) as u128 + 2 * SKEW as u128;
            let total_bound = (CAPACITY as u128 * elapsed).div_ceil(MIN as u128) + DEPTH as u128;
            assert!(
                a.len() as u128 <= total_bound,
                "{sem:?} {off:?}: {} admitted > {total_bound}",
                a.len()
            );
            // the limit binds: far more was offered than the bound
            assert!(
                o.offered as u128 > 2 * total_bound,
                "{sem:?}: not overloaded"
            );
            // and it is not far below the bound either (the limiter is not
            // simply denying everything)
            assert!(
                a.len() as u128 >= total_bound * 95 / 100,
                "{sem:?} {off:?}: only {} admitted of {total_bound}",
                a.len()
            );
            // every window between two admissions
            for i in 0..a.len() {
                for j in i..a.len() {
                    let w = (a[j].t - a[i].t) as u128;
                    let units = (j - i + 1) as u128;
                    let bound =
                        (CAPACITY as u128 * (w + spread)).div_ceil(MIN as u128) + DEPTH as u128;
                    assert!(
                        units <= bound,
                        "{sem:?} {off:?}: {units} admitted in [{}, {}] > {bound}",
                        a[i].t,
                        a[j].t
                    );
                }
            }
        }
    }
}

/// (b) A replica whose clock is behind the state's clock decides at the
/// state's clock: with capacity free (30 % load, well inside every floor,
/// the pool and the burst) nobody is denied, although a large share of the
/// decisions come from a replica behind the last write. (Capacity 60,000
/// RPM, so that requests arrive ~3 ms apart, well inside the clock spread.)
#[test]
fn a_lagging_replica_is_not_denied_while_capacity_is_free() {
    for sem in Semantics::ALL {
        let params = Arc::new(Params::new(config(sem, 60_000, None)).unwrap());
        for (k, off) in OFFSETS.iter().enumerate() {
            let reps = replicas(*off, Nanos::MAX);
            let rpm = [5400.0, 3600.0, 5400.0, 3600.0];
            let o = run(&params, &reps, &rpm, NS_PER_SEC, 3 * MIN, 21 + k as u64);
            assert!(
                o.lagging > o.offered / 10,
                "{sem:?} {off:?}: only {} of {} decisions from a lagging clock",
                o.lagging,
                o.offered
            );
            assert_eq!(
                o.denied, 0,
                "{sem:?} {off:?}: {} denials ({} of them to a lagging clock) with capacity free",
                o.denied, o.lagging_denied
            );
        }
    }
}

/// The same with the state written 50 ms ahead by one replica and read by
/// the other 50 ms behind, at one instant: the lagging replica is admitted,
/// and sees exactly the tokens the leading one left.
#[test]
fn a_write_from_a_leading_clock_does_not_deny_a_lagging_one() {
    for sem in Semantics::ALL {
        let params = Params::new(config(sem, CAPACITY, None)).unwrap();
        let t = T0 + 30 * NS_PER_SEC;
        let mut s = State::new(&params, T0);
        let req = |c| Request {
            consumer: c,
            input_tokens: 10,
            max_tokens: 10,
        };
        assert!(decide(&params, &mut s, t + SKEW as Nanos, &req(3)).is_admit());
        let ahead = s.clone();
        match decide(&params, &mut s, t - SKEW as Nanos, &req(3)) {
            Decision::Admit(g) => {
                // effective time: the state's clock, never before it
                assert_eq!(g.lease_until, t + SKEW as Nanos + params.lease())
            }
            d => panic!("{sem:?}: lagging replica denied: {d:?}"),
        }
        // deciding at the lagging clock is the same as deciding at the state's clock
        let mut same = ahead.clone();
        decide(&params, &mut same, t + SKEW as Nanos, &req(3));
        assert_eq!(same, s, "{sem:?}");
    }
}

/// (c) Concurrency slots of lost completions are reclaimed after the lease.
/// Every consumer may have 4 requests in flight and asks for ~15; replica 1
/// crashes at 40 s, so the requests it admitted never complete. Until their
/// leases expire those slots stay taken (live requests ≤ 4 − lost); once
/// they expire (at most lease + clock spread after the admission) every
/// consumer runs 4 live requests again. At no time does any consumer have
/// more than 4 live requests.
#[test]
fn lost_completions_free_their_slots_when_the_lease_expires() {
    const LIMIT: u32 = 4;
    let lease = 5 * NS_PER_SEC;
    let crash = T0 + 40 * NS_PER_SEC;
    let service = 1500 * NS_PER_MS;
    let max_service = service / 2 + service;
    for sem in Semantics::ALL {
        let params = Arc::new(
            Params::new(config(sem, CAPACITY, Some(LIMIT)))
                .unwrap()
                .with_lease(lease)
                .unwrap(),
        );
        let mut checked = 0;
        for (k, off) in OFFSETS.iter().enumerate() {
            let reps = replicas(*off, crash);
            let rpm = [600.0; 4];
            let o = run(
                &params,
                &reps,
                &rpm,
                service,
                90 * NS_PER_SEC,
                31 + k as u64,
            );
            assert!(!o.lost.is_empty(), "{sem:?} {off:?}: nothing lost");
            let spread = (off[0] - off[1]).unsigned_abs();
            // the last lease of a lost request expires (in true time) by:
            let reclaimed = crash + lease + spread;
            for c in 0..4 {
                let lost = o.lost.iter().filter(|g| g.consumer == c).count() as u32;
                let live: Vec<&(Nanos, usize, u32)> =
                    o.live_after.iter().filter(|x| x.1 == c).collect();
                assert!(
                    live.iter().all(|x| x.2 <= LIMIT),
                    "{sem:?}: more than {LIMIT} live"
                );
                if lost == 0 {
                    continue;
                }
                // between the crash and the first expiry of a lost lease the
                // lost slots stay taken: a lost request was admitted at most
                // `max_service` before the crash, at an effective time at most
                // 50 ms behind true time, and an effective time reaches its
                // expiry no earlier than 50 ms before true time does
                let first_expiry = crash + lease - max_service - 2 * SKEW as Nanos;
                let before: Vec<_> = live
                    .iter()
                    .filter(|x| x.0 >= crash && x.0 < first_expiry)
                    .collect();
                checked += before.len();
                assert!(
                    before.iter().all(|x| x.2 + lost <= LIMIT),
                    "{sem:?} {off:?}: consumer {c} ran {:?} live with {lost} slots lost",
                    before.iter().map(|x| x.2).max()
                );
                // after they expire, the consumer uses all its slots again
                assert!(
                    live.iter().any(|x| x.0 >= reclaimed && x.2 == LIMIT),
                    "{sem:?} {off:?}: consumer {c} never back at {LIMIT} live after the leases expired"
                );
            }
        }
        assert!(
            checked > 0,
            "{sem:?}: no admission while lost slots were held"
        );
    }
}
