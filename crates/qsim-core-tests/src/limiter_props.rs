//! Properties of the admission limiter, each bounded by numbers computed
//! from the configuration alone (`reference`), over random configurations
//! in requests and in tokens, with refunds, late settlement and debt.

use crate::reference::{
    buckets, charge, credit_depth, reserved_bp, settlement, share_depth, tpm, Capacity,
    LitellmWindow, Paid, RefDecision, Shape, SingleBucket, MINUTE, NEVER, SECOND,
};
use crate::traffic::{drive, Demand, Event, Traffic};
use proptest::prelude::*;
use qsim_core::limiter::admission::{
    decide_pure, ConsumerPolicy, ConsumerSpec, Decision, Limit, Limiter, LimiterConfig, Params,
    Request, Semantics, Source, State, Unit,
};
use qsim_core::limiter::rates::OutputAccounting;
use std::sync::Arc;

const ACCOUNTING: [OutputAccounting; 3] = [
    OutputAccounting::ReserveRefund,
    OutputAccounting::ReserveNoRefund,
    OutputAccounting::OnCompletion,
];

/// Requests as the traffic draws them: input 20..=320, max_tokens 16..=256.
const INPUT: (u64, u64) = (20, 320);
const MAX_TOKENS: (u64, u64) = (16, 256);
/// The largest request in tokens.
const N_MAX_TOKENS: u64 = INPUT.1 + MAX_TOKENS.1;

fn consumer(name: &str, bp: u32, policy: ConsumerPolicy) -> ConsumerSpec {
    ConsumerSpec {
        name: name.into(),
        reserved_bp: bp,
        policy,
    }
}

/// A random configuration: `cap` is capacity in requests per minute (×400
/// in tokens), reservations in basis points (scaled to ≤ 100 %), the last
/// consumer unreserved with optional limits of its own.
#[allow(clippy::too_many_arguments)]
fn config(
    sem: Semantics,
    tokens: bool,
    cap: u64,
    threshold: u32,
    burst: Option<u64>,
    res: &[u32],
    acc: OutputAccounting,
    dev: ConsumerPolicy,
) -> LimiterConfig {
    let total: u32 = res.iter().sum();
    let res: Vec<u32> = if total > 10_000 {
        res.iter().map(|r| r * 10_000 / total).collect()
    } else {
        res.to_vec()
    };
    let scale = if tokens { 400 } else { 1 };
    let mut consumers: Vec<ConsumerSpec> = res
        .iter()
        .enumerate()
        .map(|(i, &bp)| consumer(&format!("r{i}"), bp, ConsumerPolicy::default()))
        .collect();
    consumers.push(consumer("dev", 0, dev));
    LimiterConfig {
        capacity: cap * scale,
        unit: if tokens { Unit::Tpm } else { Unit::Rpm },
        threshold: threshold as f64 / 100.0,
        burst: burst.map(|b| b * scale),
        semantics: sem,
        accounting: acc,
        consumers,
    }
}

fn arb_policy() -> impl Strategy<Value = ConsumerPolicy> {
    (
        prop::option::of(5u64..200),
        prop::option::of(20_000u64..400_000),
        prop::option::of(1u32..6),
        prop::option::of(150u64..400),
    )
        .prop_map(|(rpm, tph, conc, mi)| ConsumerPolicy {
            rpm,
            tokens_per_hour: tph,
            concurrent: conc,
            max_input_tokens: mi,
        })
}

fn arb_any() -> impl Strategy<Value = LimiterConfig> {
    (
        0usize..4,
        any::<bool>(),
        40u64..900,
        50u32..=100,
        prop::option::of(0u64..400),
        prop::collection::vec(prop_oneof![Just(0u32), 100u32..4000], 0..4),
        0usize..3,
        prop_oneof![Just(ConsumerPolicy::default()), arb_policy()],
    )
        .prop_map(|(s, tk, cap, th, b, res, acc, dev)| {
            config(
                Semantics::ALL[s],
                tk,
                cap,
                th,
                b,
                &res,
                ACCOUNTING[acc],
                dev,
            )
        })
}

/// Every consumer's traffic: Poisson at `mult ×` an even share of capacity
/// (in requests), one of them greedy when `greedy` says so.
fn traffic(
    cfg: &LimiterConfig,
    seed: u64,
    mult: f64,
    greedy: Option<usize>,
    horizon: u64,
) -> Traffic {
    let n = cfg.consumers.len();
    let req_per_min = if tpm(cfg) {
        cfg.capacity as f64 / 400.0
    } else {
        cfg.capacity as f64
    };
    Traffic {
        seed,
        demand: (0..n)
            .map(|c| {
                if Some(c) == greedy {
                    Demand::Greedy
                } else {
                    Demand::Poisson(mult * req_per_min / n as f64)
                }
            })
            .collect(),
        tick: 100_000_000,
        horizon,
        input: INPUT,
        max_tokens: MAX_TOKENS,
        service: (SECOND / 2, 90 * SECOND),
        output: 1.1,
        keep_before: false,
    }
}

/// Deterministic by default; QSIM_PROPTEST_SEED / QSIM_PROPTEST_CASES to explore.
fn pt(cases: u32) -> ProptestConfig {
    let env = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    ProptestConfig {
        cases: env("QSIM_PROPTEST_CASES").map_or(cases, |c| c as u32),
        failure_persistence: None,
        rng_seed: proptest::test_runner::RngSeed::Fixed(
            env("QSIM_PROPTEST_SEED").unwrap_or(0x9_0009),
        ),
        ..ProptestConfig::default()
    }
}

/// Net units drawn from a set of buckets of total depth `depth` and rate
/// `per_minute`: over any stretch of events from the start of an instant
/// to an admission, charges − refunds ≤ depth + rate × duration (each
/// bucket's level starts at most full, ends an admission ≥ 0 and refills at
/// most at its rate; a capped refund only lowers the level).
struct WindowBound {
    depth: i128,
    /// Refill: `num` units per `den` ns.
    num: i128,
    den: i128,
    net: i128,
    /// min over window starts of `den·net_before − num·t`.
    best: i128,
    at: Option<u64>,
}

impl WindowBound {
    /// One bucket: its depth, refilled at its own rate.
    fn bucket(s: Shape) -> WindowBound {
        WindowBound::new(s.depth, s.depth, s.refill)
    }
    /// Several buckets together: their depths, refilled at `C` per minute.
    fn total(shapes: &[Shape], per_minute: u64) -> WindowBound {
        WindowBound::new(shapes.iter().map(|s| s.depth).sum(), per_minute, MINUTE)
    }
    fn new(depth: u64, num: u64, den: u64) -> WindowBound {
        WindowBound {
            depth: depth as i128,
            num: num as i128,
            den: den as i128,
            net: 0,
            best: i128::MAX,
            at: None,
        }
    }
    fn event(&mut self, t: u64) {
        if self.at != Some(t) {
            self.at = Some(t);
            self.best = self.best.min(self.den * self.net - self.num * t as i128);
        }
    }
    fn settle(&mut self, t: u64, refund: u64, extra: u64) {
        self.event(t);
        self.net += extra as i128 - refund as i128;
    }
    fn admit(&mut self, t: u64, units: u64) -> Result<(), String> {
        self.event(t);
        self.net += units as i128;
        let lhs = self.den * self.net - self.num * t as i128;
        if lhs > self.den * self.depth + self.best {
            return Err(format!(
                "at {t}: net units since some earlier instant exceed depth {} + rate × window",
                self.depth
            ));
        }
        Ok(())
    }
}

/// Per-bucket window bounds, by key: a floor's consumer index, G, the pool.
struct Routes {
    floor: Vec<Option<WindowBound>>,
    g: Option<WindowBound>,
    pool: Option<WindowBound>,
}

impl Routes {
    fn get(&mut self, k: usize) -> Option<&mut WindowBound> {
        match k {
            usize::MAX => self.pool.as_mut(),
            k if k == usize::MAX - 1 => self.g.as_mut(),
            j => self.floor[j].as_mut(),
        }
    }
}

proptest! {
    #![proptest_config(pt(24))]

    /// docs/limiter.md: "in every semantics the admitted work over any
    /// window w is at most C·w + B" (B here: the capacity buckets' depths as
    /// the document sizes them); in tokens net of refunds, with output
    /// charged late (debt) under on-completion accounting.
    #[test]
    fn admitted_work_within_capacity_times_window_plus_depths(
        cfg in arb_any(), seed in any::<u64>(), mult in 0.5f64..6.0, greedy in prop::option::of(0usize..4),
    ) {
        let b = buckets(&cfg);
        let shapes = b.capacity(cfg.semantics);
        // all capacity buckets together: C·w + depths. Under on-completion
        // accounting a bucket may end a window in debt (output charged after
        // admission), so the sum holds only for one bucket; each bucket's
        // own bound holds always.
        let mut total = (cfg.accounting != OutputAccounting::OnCompletion || shapes.len() == 1)
            .then(|| WindowBound::total(&shapes, cfg.capacity));
        let floor: Vec<Option<WindowBound>> = b.floor.iter().map(|f| f.map(WindowBound::bucket)).collect();
        let g = b.g.map(WindowBound::bucket);
        let pool = b.pool.map(WindowBound::bucket);
        let sem = cfg.semantics;
        let tokens = tpm(&cfg);
        let acc = cfg.accounting;
        let greedy = greedy.filter(|&g| g < cfg.consumers.len());
        let mut lim = Limiter::new(cfg.clone(), 0).unwrap();
        let tr = traffic(&cfg, seed, mult, greedy, 2 * MINUTE);
        let mut admitted = 0u64;
        // the bucket a grant was charged to: a floor (litellm-priority), G or the pool
        let key = |c: usize, src: Source| -> Result<usize, String> {
            match (sem, src) {
                (Semantics::LitellmPriority, Source::Own) => Ok(c),
                (Semantics::LitellmPriority, Source::Borrowed(j)) => Ok(j),
                (Semantics::StrictFloors | Semantics::Partitioned, Source::Shared { .. }) => Ok(usize::MAX - 1),
                (_, Source::Pool) => Ok(usize::MAX),
                _ => Err(format!("{sem:?} admitted consumer {c} from {src:?}")),
            }
        };
        let mut routes = Routes { floor, g, pool };
        drive(&mut lim, &tr, &mut |e| match e {
            Event::Decided { now, req, decision: Decision::Admit(gr), .. } => {
                admitted += 1;
                let units = charge(tokens, acc, req.input_tokens, req.max_tokens).0;
                if let Some(t) = total.as_mut() { t.admit(now, units)?; }
                routes.get(key(req.consumer, gr.source)?).ok_or("no such bucket")?.admit(now, units)
            }
            Event::Decided { .. } => Ok(()),
            Event::Completed { now, grant, actual, .. } => {
                let (r, x) = settlement(tokens, acc, grant.max_tokens, actual);
                if let Some(t) = total.as_mut() { t.settle(now, r, x); }
                routes.get(key(grant.consumer, grant.source)?).ok_or("no such bucket")?.settle(now, r, x);
                Ok(())
            }
        }).map_err(|e| TestCaseError::fail(format!("{cfg:?}: {e}")))?;
        prop_assert!(admitted > 0);
    }

    /// The single-bucket configurations (rate-limit-only; any semantics
    /// without reservations; partitioned's unreserved consumers on the pool)
    /// against the reference limiter, decision by decision: admit or deny,
    /// the limit named, the exact retry time, the lease, the source; with
    /// the consumer's own limits, leases expiring before late completions,
    /// refunds and debt.
    #[test]
    fn single_bucket_limiter_matches_the_reference_decision_by_decision(
        cfg in arb_any(), seed in any::<u64>(), mult in 0.5f64..5.0, lease_s in 2u64..120,
        greedy in prop::option::of(0usize..4),
    ) {
        let mut cfg = cfg;
        if !matches!(cfg.semantics, Semantics::RateLimitOnly | Semantics::Partitioned) {
            for c in &mut cfg.consumers { c.reserved_bp = 0; }
        }
        let lease = lease_s * SECOND;
        let params = Arc::new(Params::new(cfg.clone()).unwrap().with_lease(lease).unwrap());
        let mut lim = Limiter::with_params(params, 0);
        let mut model = SingleBucket::new(&cfg, lease, 0);
        let greedy = greedy.filter(|&g| g < cfg.consumers.len());
        let tr = traffic(&cfg, seed, mult, greedy, 2 * MINUTE);
        let sem = cfg.semantics;
        let mut checked = 0u64;
        drive(&mut lim, &tr, &mut |e| match e {
            Event::Decided { now, req, decision, .. } => {
                let c = req.consumer;
                if !model.models(c) {
                    return Ok(());
                }
                checked += 1;
                let want = model.decide(now, c, req.input_tokens, req.max_tokens);
                match (*decision, want) {
                    (Decision::Admit(g), RefDecision::Admit { lease_until }) => {
                        let source = if sem == Semantics::StrictFloors {
                            Source::Shared { credit: 0 }
                        } else {
                            Source::Pool
                        };
                        if g.lease_until != lease_until || g.source != source || g.consumer != c
                            || g.input_tokens != req.input_tokens || g.max_tokens != req.max_tokens {
                            return Err(format!("at {now}: grant {g:?}, reference lease {lease_until}, {source:?}"));
                        }
                        Ok(())
                    }
                    (Decision::Deny { limit, retry_at }, RefDecision::Deny { limit: l, retry_at: r })
                        if limit == l && retry_at == r => Ok(()),
                    (got, want) => Err(format!("at {now}, {req:?}: limiter {got:?}, reference {want:?}")),
                }
            }
            Event::Completed { now, grant, actual, .. } => {
                if model.models(grant.consumer) {
                    model.complete(now, grant.consumer, grant.lease_until, grant.input_tokens, grant.max_tokens, actual);
                }
                Ok(())
            }
        }).map_err(|e| TestCaseError::fail(format!("{cfg:?}: {e}")))?;
        prop_assert!(checked > 0);
    }

    /// Every denial leaves the state bit-for-bit unchanged and agrees with
    /// the pure form; a retry time is exact (admitted at it, denied 1 ns
    /// before); `NEVER` only where time alone cannot help: an input above
    /// `max_input_tokens`, or a request larger than every bucket the
    /// consumer may draw from (sizes from the configuration).
    #[test]
    fn denials_change_nothing_and_retry_times_are_exact(
        cfg in arb_any(), seed in any::<u64>(), mult in 0.5f64..4.0, greedy in prop::option::of(0usize..4),
    ) {
        let greedy = greedy.filter(|&g| g < cfg.consumers.len());
        let mut tr = traffic(&cfg, seed, mult, greedy, MINUTE);
        tr.keep_before = true;
        let mut lim = Limiter::new(cfg.clone(), 0).unwrap();
        let most = largest_request_that_can_wait(&cfg);
        let tokens = tpm(&cfg);
        drive(&mut lim, &tr, &mut |e| {
            let Event::Decided { now, req, decision, before: Some(before), after } = e else { return Ok(()) };
            let (pure, next) = decide_pure(before.params(), before.state(), now, req);
            if pure != *decision || next.as_ref().unwrap_or(before.state()) != after.state() {
                return Err(format!("at {now}: decide_pure differs from decide"));
            }
            let Decision::Deny { limit, retry_at } = *decision else { return Ok(()) };
            if before != after {
                return Err(format!("at {now}: a {limit:?} denial changed the state"));
            }
            let never = before.params().never_fits(req);
            if retry_at == NEVER {
                let (_, need) = charge(tokens, cfg.accounting, req.input_tokens, req.max_tokens);
                let own_too_big = own_needs(&cfg, req).into_iter().any(|(depth, n)| n > depth);
                let ok = limit == Limit::MaxInputTokens || own_too_big || need > most[req.consumer];
                return if !ok {
                    Err(format!("at {now}: {limit:?} denial of {req:?} (needs {need} ≤ {}) says never retry", most[req.consumer]))
                } else if never.is_none() {
                    Err(format!("at {now}: {limit:?} denial of {req:?} says never retry, never_fits says it fits"))
                } else {
                    Ok(())
                };
            }
            if let Some(n) = never {
                return Err(format!("at {now}: never_fits says {n:?} for {req:?}, decide says retry at {retry_at}"));
            }
            if retry_at <= now {
                return Err(format!("at {now}: retry_at {retry_at} not in the future"));
            }
            if !after.clone().decide(retry_at, req).is_admit() {
                return Err(format!("at {now}: {limit:?} denial of {req:?} not admitted at retry_at {retry_at}"));
            }
            if after.clone().decide(retry_at - 1, req).is_admit() {
                return Err(format!("at {now}: {limit:?} denial of {req:?} admitted before retry_at {retry_at}"));
            }
            Ok(())
        }).map_err(|e| TestCaseError::fail(format!("{cfg:?}: {e}")))?;
        let json = serde_json::to_string(lim.state()).unwrap();
        let back: State = serde_json::from_str(&json).unwrap();
        prop_assert!(back == *lim.state() && back.check(lim.params()).is_ok());
    }
}

/// Per consumer, the largest capacity need that waiting can always satisfy
/// (from the configuration, by the reference sizes): a need at or below it
/// must never get `NEVER`, one above it always does. When idle every bucket
/// is full; a strict-floors / partitioned borrower must leave every other
/// credit, and its own accruing one, in `G`.
fn largest_request_that_can_wait(cfg: &LimiterConfig) -> Vec<u64> {
    let b = buckets(cfg);
    let credits: u64 = b.floor.iter().flatten().map(|s| s.depth).sum();
    cfg.consumers
        .iter()
        .enumerate()
        .map(|(c, cs)| {
            let d = |s: Option<Shape>| s.map_or(0, |s| s.depth);
            match cfg.semantics {
                Semantics::RateLimitOnly => d(b.pool),
                Semantics::Partitioned if cs.reserved_bp == 0 => d(b.pool),
                Semantics::StrictFloors | Semantics::Partitioned => {
                    let own = d(b.floor[c]);
                    let keep = credits - own + u64::from(own > 0);
                    own.max(d(b.g).saturating_sub(keep))
                }
                Semantics::LitellmPriority => b
                    .capacity(cfg.semantics)
                    .iter()
                    .map(|s| s.depth)
                    .max()
                    .unwrap_or(0),
            }
        })
        .collect()
}

/// The consumer's own token-bucket limits: `(depth, need)` for a request.
fn own_needs(cfg: &LimiterConfig, req: &qsim_core::limiter::admission::Request) -> Vec<(u64, u64)> {
    let pol = cfg.consumers[req.consumer].policy;
    let mut v = Vec::new();
    if let Some(r) = pol.rpm {
        v.push((r.max(1), 1));
    }
    if let Some(t) = pol.tokens_per_hour {
        v.push((
            t.max(1),
            charge(true, cfg.accounting, req.input_tokens, req.max_tokens).1,
        ));
    }
    v
}

/// One greedy consumer (asking every tick until denied) for `horizon`;
/// the others silent. Returns its net units (charges − refunds + late
/// charges) over the run, and the last tick.
fn greedy_net(
    cfg: &LimiterConfig,
    who: usize,
    seed: u64,
    service: (u64, u64),
    output: f64,
    horizon: u64,
) -> Result<(i128, u64), String> {
    let tokens = tpm(cfg);
    let acc = cfg.accounting;
    let mut tr = traffic(cfg, seed, 0.0, Some(who), horizon);
    for (c, d) in tr.demand.iter_mut().enumerate() {
        if c != who {
            *d = Demand::Silent;
        }
    }
    tr.service = service;
    tr.output = output;
    let mut lim = Limiter::new(cfg.clone(), 0).unwrap();
    let mut net = 0i128;
    // net as of the last decision (completions after it do not count)
    let mut at_last = (0i128, 0u64);
    drive(&mut lim, &tr, &mut |e| {
        match e {
            Event::Decided {
                now, req, decision, ..
            } => {
                if decision.is_admit() {
                    net += charge(tokens, acc, req.input_tokens, req.max_tokens).0 as i128;
                }
                at_last = (net, now);
            }
            Event::Completed { grant, actual, .. } => {
                let (r, x) = settlement(tokens, acc, grant.max_tokens, actual);
                net += x as i128 - r as i128;
            }
        }
        Ok(())
    })?;
    Ok(at_last)
}

/// The lower bound on a greedy consumer's net units when it alone sends:
/// its bucket starts full, refills at its rate, and after every tick holds
/// less than the denied request plus what must stay for the idle
/// consumers' credits; `None` when the configuration lets a refund or the
/// refill overflow the bucket between ticks (then the bound does not apply).
fn greedy_floor(
    shape: Shape,
    keep: u64,
    n_max: u64,
    max_refund: u64,
    tick: u64,
    last: u64,
) -> Option<i128> {
    let per_tick = (tick as u128 * shape.depth as u128).div_ceil(shape.refill as u128) as u64;
    if shape.depth < keep + n_max + per_tick + max_refund + 1 {
        return None;
    }
    let refill = (last as u128 * shape.depth as u128 / shape.refill as u128) as i128;
    Some(shape.depth as i128 + refill - keep as i128 - n_max as i128)
}

/// The bucket a lone unreserved consumer draws from and what stays kept
/// for idle floors, per semantics (None: not a single bucket).
fn lone_unreserved(cfg: &LimiterConfig) -> Option<(Shape, u64)> {
    let b = buckets(cfg);
    match cfg.semantics {
        Semantics::RateLimitOnly => b.pool.map(|s| (s, 0)),
        // idle credits are full: G keeps each of them
        Semantics::StrictFloors => {
            b.g.map(|s| (s, b.floor.iter().flatten().map(|f| f.depth).sum()))
        }
        Semantics::Partitioned => b.pool.map(|s| (s, 0)),
        Semantics::LitellmPriority if reserved_bp(cfg) == 0 => b.pool.map(|s| (s, 0)),
        Semantics::LitellmPriority => None,
    }
}

proptest! {
    #![proptest_config(pt(2_000))]

    /// Issue 26's first case (`qsim plan --capacity 1000 --burst 3 --reserve
    /// 30,20,30`: `G` exactly as deep as the credits, so the unreserved
    /// consumer was refused forever while everything sat idle): over random
    /// configurations, small bursts included, `largest_need` is the
    /// reference's (sizes from the configuration alone); every consumer with
    /// a share or access to the pool has at least one unit of it; on an
    /// idle deployment a request needing exactly that much is admitted at
    /// once and one unit more is denied with `NEVER`, as `never_fits` says.
    #[test]
    fn every_consumer_with_capacity_is_admitted_when_idle_and_largest_need_is_exact(
        cfg in arb_any(), small in prop::option::of(0u64..8),
    ) {
        let mut cfg = cfg;
        if small.is_some() {
            cfg.burst = small;
        }
        let p = Params::new(cfg.clone()).unwrap();
        let most = largest_request_that_can_wait(&cfg);
        let tokens = tpm(&cfg);
        let idle = 3 * 3600 * SECOND;
        for (c, cs) in cfg.consumers.iter().enumerate() {
            prop_assert_eq!(p.largest_need(c), most[c], "consumer {}", c);
            let access = !(cfg.semantics == Semantics::Partitioned
                && cs.reserved_bp == 0
                && reserved_bp(&cfg) == 10_000);
            prop_assert!(!access || most[c] >= 1, "consumer {} has no capacity: {:?}", c, cfg);
            // the request needing `n` capacity units (one request in rpm)
            let ask = |n: u64| Request {
                consumer: c,
                input_tokens: if tokens { n } else { 1 },
                max_tokens: 0,
            };
            let sizes: Vec<u64> = if tokens { vec![most[c], most[c] + 1] } else { vec![1] };
            for n in sizes {
                let req = ask(n);
                let never = p.never_fits(&req);
                let d = Limiter::new(cfg.clone(), 0).unwrap().decide(idle, &req);
                match never {
                    // another of the consumer's limits can never hold it
                    Some(nf) if nf.limit != Limit::Capacity => {
                        prop_assert!(matches!(d, Decision::Deny { retry_at: NEVER, .. }), "{:?} {:?}", nf, d);
                    }
                    Some(nf) => {
                        prop_assert!(n > most[c], "{:?} for a need of {} ≤ {}", nf, n, most[c]);
                        prop_assert_eq!(d, Decision::Deny { limit: Limit::Capacity, retry_at: NEVER });
                    }
                    None => {
                        prop_assert!(n <= most[c]);
                        prop_assert!(d.is_admit(), "consumer {} needing {} ≤ {} on an idle deployment: {:?}", c, n, most[c], d);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(pt(16))]

    /// The first of issue 9's mutations (no refund in `complete`): in
    /// tokens with reserve-refund accounting, a completion long after its
    /// admission returns the unused `max_tokens` to capacity, so a consumer
    /// asking for more than capacity gets capacity net of refunds: at least
    /// the bucket depth + its refill over the run − one request (sizes from
    /// the configuration), in every semantics.
    #[test]
    fn completion_refunds_unused_max_tokens_to_capacity(
        s in 0usize..4, cap in 300u64..1200, burst in 10u64..40, seed in any::<u64>(),
        res in prop::collection::vec(prop_oneof![Just(0u32), 500u32..2500], 0..3),
    ) {
        let mut cfg = config(Semantics::ALL[s], true, cap, 80, Some(burst), &res, OutputAccounting::ReserveRefund, ConsumerPolicy::default());
        if cfg.semantics == Semantics::LitellmPriority {
            for c in &mut cfg.consumers { c.reserved_bp = 0; }
        }
        let who = cfg.consumers.len() - 1;
        let (shape, keep) = lone_unreserved(&cfg).unwrap();
        // streaming-like: completions 20–80 s after admission, output ≤ 30 % of max_tokens
        let horizon = 3 * MINUTE;
        let (net, last) = greedy_net(&cfg, who, seed, (20 * SECOND, 80 * SECOND), 0.3, horizon).map_err(TestCaseError::fail)?;
        if let Some(want) = greedy_floor(shape, keep, N_MAX_TOKENS, MAX_TOKENS.1, 100_000_000, last) {
            prop_assert!(net >= want, "{:?}: net {} tokens < {} (bucket {:?}, kept {})", cfg, net, want, shape, keep);
        }
    }

    /// Work conservation (docs/limiter.md): an idle consumer's floor flows
    /// to whoever asks. With the reserved consumers idle, a lone unreserved
    /// consumer gets everything but what the semantics keeps for them
    /// (strict-floors: their full credits; partitioned: it never gets more
    /// than the pool, checked by the window property), in requests and in
    /// tokens under every accounting (on-completion: output charged late, as debt).
    #[test]
    fn idle_floors_flow_to_whoever_asks(
        s in 0usize..4, tokens in any::<bool>(), cap in 300u64..1200, burst in 10u64..300, seed in any::<u64>(),
        acc in 0usize..3, res in prop::collection::vec(prop_oneof![Just(0u32), 500u32..2500], 0..3),
    ) {
        let mut cfg = config(Semantics::ALL[s], tokens, cap, 80, Some(burst), &res, ACCOUNTING[acc], ConsumerPolicy::default());
        if cfg.semantics == Semantics::LitellmPriority {
            for c in &mut cfg.consumers { c.reserved_bp = 0; }
        }
        let who = cfg.consumers.len() - 1;
        let (shape, keep) = lone_unreserved(&cfg).unwrap();
        let (n_max, refund) = if tokens { (N_MAX_TOKENS, MAX_TOKENS.1) } else { (1, 0) };
        let (net, last) = greedy_net(&cfg, who, seed, (SECOND, 30 * SECOND), 1.0, 2 * MINUTE).map_err(TestCaseError::fail)?;
        if let Some(want) = greedy_floor(shape, keep, n_max, refund, 100_000_000, last) {
            prop_assert!(net >= want, "{:?}: net {} < {}", cfg, net, want);
        }
    }

    /// strict-floors and partitioned: every reserved consumer that asks for
    /// more than its floor gets, over any stretch after the start, at least
    /// its floor rate × the stretch − one credit depth (5 s of its floor),
    /// whatever the others do — in requests and in tokens (with refunds,
    /// late settlement) under both reserve accountings. Every case has
    /// reserved consumers. Not under on-completion accounting: there a
    /// borrower's output is charged to `G` after admission and can take `G`
    /// below the credits (see docs/testing.md, "findings").
    #[test]
    fn every_greedy_reserved_consumer_gets_its_floor(
        partitioned in any::<bool>(), tokens in any::<bool>(), cap in 300u64..1200, burst in prop::option::of(0u64..300),
        res in prop::collection::vec(1000u32..4000, 1..4), acc in 0usize..2, seed in any::<u64>(),
        greedy_mask in 1u32..16, mult in 1.0f64..8.0,
    ) {
        let sem = if partitioned { Semantics::Partitioned } else { Semantics::StrictFloors };
        let cfg = config(sem, tokens, cap, 80, burst, &res, ACCOUNTING[acc], ConsumerPolicy::default());
        let n = cfg.consumers.len();
        let mut tr = traffic(&cfg, seed, mult, None, 3 * MINUTE);
        // at least one reserved consumer greedy; the others Poisson overload
        for (c, d) in tr.demand.iter_mut().enumerate() {
            if greedy_mask & (1 << c) != 0 || (c == 0) {
                *d = Demand::Greedy;
            }
        }
        let b = buckets(&cfg);
        let tick = tr.tick;
        let n_max = if tokens { N_MAX_TOKENS } else { 1 };
        let t0 = MINUTE / 2;
        let tokens_ = tokens;
        let acc = cfg.accounting;
        let mut got = vec![0u64; n];
        let mut last = 0;
        let mut lim = Limiter::new(cfg.clone(), 0).unwrap();
        drive(&mut lim, &tr, &mut |e| {
            if let Event::Decided { now, req, decision: Decision::Admit(_), .. } = e {
                if now > t0 {
                    got[req.consumer] += charge(tokens_, acc, req.input_tokens, req.max_tokens).0;
                }
            }
            if let Event::Decided { now, .. } = e { last = now; }
            Ok(())
        }).map_err(TestCaseError::fail)?;
        let mut checked = 0;
        for (c, floor) in b.floor.iter().enumerate() {
            let Some(credit) = *floor else { continue };
            if tr.demand[c] != Demand::Greedy { continue; }
            // the bound needs the credits never to overflow between ticks
            let per_tick = (tick as u128 * credit.depth as u128).div_ceil(credit.refill as u128) as u64;
            if credit.depth < n_max + 1 + per_tick { continue; }
            let stretch = (last - t0) as u128;
            let want = (stretch * credit.depth as u128 / credit.refill as u128) as i128 - credit.depth as i128;
            prop_assert!(got[c] as i128 >= want, "{:?}: {} got {} < {} (credit {:?})", cfg, cfg.consumers[c].name, got[c], want, credit);
            prop_assert_eq!(credit.depth, credit_depth(&cfg, cfg.consumers[c].reserved_bp));
            checked += 1;
        }
        prop_assert!(checked > 0 || tokens, "no reserved consumer checked: {:?}", cfg);
    }

    /// partitioned: the reserved consumers' decisions never depend on the
    /// unreserved ones (the same reserved traffic with and without an
    /// unreserved flood gives the same decisions), and the unreserved
    /// consumers never get more than the pool (rate and depth from the
    /// configuration) over any window.
    #[test]
    fn partitioned_reserved_consumers_never_depend_on_unreserved_traffic(
        tokens in any::<bool>(), cap in 100u64..1200, burst in prop::option::of(0u64..300),
        res in prop::collection::vec(300u32..3000, 1..4), acc in 0usize..3, seed in any::<u64>(), mult in 1.0f64..6.0,
    ) {
        let cfg = config(Semantics::Partitioned, tokens, cap, 80, burst, &res, ACCOUNTING[acc], ConsumerPolicy::default());
        let dev = cfg.consumers.len() - 1;
        let b = buckets(&cfg);
        let run = |with_dev: bool| -> Result<Vec<(u64, usize, Decision)>, String> {
            let mut tr = traffic(&cfg, seed, mult, Some(0), 2 * MINUTE);
            if !with_dev { tr.demand[dev] = Demand::Silent; } else { tr.demand[dev] = Demand::Greedy; }
            let mut lim = Limiter::new(cfg.clone(), 0).unwrap();
            let mut seen = Vec::new();
            let mut pool = b.pool.map(WindowBound::bucket);
            let acc = cfg.accounting;
            drive(&mut lim, &tr, &mut |e| match e {
                Event::Decided { now, req, decision, .. } => {
                    if req.consumer != dev {
                        seen.push((now, req.consumer, *decision));
                        Ok(())
                    } else if decision.is_admit() {
                        let units = charge(tokens, acc, req.input_tokens, req.max_tokens).0;
                        match pool.as_mut() {
                            Some(p) => p.admit(now, units),
                            None => Err("admitted an unreserved consumer without a pool".into()),
                        }
                    } else { Ok(()) }
                }
                Event::Completed { now, grant, actual, .. } => {
                    if grant.consumer == dev {
                        let (r, x) = settlement(tokens, acc, grant.max_tokens, actual);
                        if let Some(p) = pool.as_mut() { p.settle(now, r, x); }
                    }
                    Ok(())
                }
            })?;
            Ok(seen)
        };
        let alone = run(false).map_err(TestCaseError::fail)?;
        let flooded = run(true).map_err(TestCaseError::fail)?;
        prop_assert!(!alone.is_empty());
        prop_assert!(alone == flooded, "{:?}: the reserved consumers' decisions changed with dev's traffic", cfg);
    }

    /// litellm-priority: another consumer's floor is borrowed only while the
    /// units admitted in the current 60 s window (reference window: opened
    /// by the first admission after the previous one expired) are below
    /// θ·C; a reserved consumer's own grants come from its own floor first
    /// (never the pool while its floor holds the units). Each floor bucket
    /// and the pool keep within their own rate × window + depth.
    #[test]
    fn litellm_borrows_floors_only_below_the_saturation_threshold(
        tokens in any::<bool>(), cap in 100u64..1200, th in 10u32..=100, burst in prop::option::of(0u64..300),
        res in prop::collection::vec(300u32..3000, 1..4), acc in 0usize..3, seed in any::<u64>(), mult in 0.5f64..6.0,
        greedy in prop::option::of(0usize..4),
    ) {
        let cfg = config(Semantics::LitellmPriority, tokens, cap, th, burst, &res, ACCOUNTING[acc], ConsumerPolicy::default());
        let b = buckets(&cfg);
        let greedy = greedy.filter(|&g| g < cfg.consumers.len());
        let tr = traffic(&cfg, seed, mult, greedy, 2 * MINUTE);
        let n = cfg.consumers.len();
        let mut per_floor: Vec<Option<WindowBound>> = (0..n).map(|c| b.floor[c].map(WindowBound::bucket)).collect();
        let mut pool = b.pool.map(WindowBound::bucket);
        let mut window = LitellmWindow::default();
        let threshold = cfg.threshold * cfg.capacity as f64;
        let acc = cfg.accounting;
        let mut lim = Limiter::new(cfg.clone(), 0).unwrap();
        drive(&mut lim, &tr, &mut |e| match e {
            Event::Decided { now, req, decision: Decision::Admit(g), after, .. } => {
                let units = charge(tokens, acc, req.input_tokens, req.max_tokens).0;
                let bucket = match g.source {
                    Source::Own => per_floor[req.consumer].as_mut(),
                    Source::Borrowed(j) => {
                        if window.units_at(now) as f64 >= threshold {
                            return Err(format!("at {now}: borrowed floor {j} with {} units admitted in the window ≥ θ·C", window.units_at(now)));
                        }
                        per_floor[j].as_mut()
                    }
                    Source::Pool => pool.as_mut(),
                    Source::Shared { .. } => return Err("litellm-priority has no shared bucket".into()),
                };
                window.admitted(now, units);
                if after.saturated(now) != (window.units_at(now) as f64 >= threshold) {
                    return Err(format!("at {now}: saturated() disagrees with the window's {} units", window.units_at(now)));
                }
                match bucket {
                    Some(w) => w.admit(now, units),
                    None => Err(format!("at {now}: {:?} names a bucket the configuration does not have", g.source)),
                }
            }
            Event::Decided { .. } => Ok(()),
            Event::Completed { now, grant, actual, .. } => {
                let (r, x) = settlement(tokens, acc, grant.max_tokens, actual);
                let w = match grant.source {
                    Source::Own => per_floor[grant.consumer].as_mut(),
                    Source::Borrowed(j) => per_floor[j].as_mut(),
                    _ => pool.as_mut(),
                };
                if let Some(w) = w { w.settle(now, r, x); }
                Ok(())
            }
        }).map_err(|e| TestCaseError::fail(format!("{cfg:?}: {e}")))?;
    }
}

/// The second of issue 9's mutations (partitioned pool denial answering
/// `NEVER`): an unreserved consumer that drained the pool is told exactly
/// when the pool holds its next unit again (pool: 20 % of 1,000 RPM, depth
/// 20 % of the 200 burst = 40, refilled one unit per 300 ms).
#[test]
fn partitioned_pool_denial_tells_an_unreserved_consumer_when_to_retry() {
    let cfg = config(
        Semantics::Partitioned,
        false,
        1000,
        80,
        None,
        &[3000, 2000, 3000],
        OutputAccounting::ReserveRefund,
        ConsumerPolicy::default(),
    );
    let pool = buckets(&cfg).pool.unwrap();
    assert_eq!(
        pool,
        Shape {
            depth: 40,
            refill: 12 * SECOND
        },
        "40 units per 40 / 200 min"
    );
    let mut lim = Limiter::new(cfg, 0).unwrap();
    let dev = Request3::dev();
    for _ in 0..40 {
        assert!(lim.decide(0, &dev).is_admit());
    }
    let per_unit = pool.refill / pool.depth; // 300 ms
    assert_eq!(
        lim.decide(0, &dev),
        Decision::Deny {
            limit: Limit::Capacity,
            retry_at: per_unit
        }
    );
    assert!(lim.clone().decide(per_unit, &dev).is_admit());
    assert!(!lim.clone().decide(per_unit - 1, &dev).is_admit());
    // a reserved consumer is not slowed by the empty pool
    assert!(lim.decide(0, &Request3::agent(0)).is_admit());
}

struct Request3;
impl Request3 {
    fn dev() -> qsim_core::limiter::admission::Request {
        Request3::agent(3)
    }
    fn agent(c: usize) -> qsim_core::limiter::admission::Request {
        qsim_core::limiter::admission::Request {
            consumer: c,
            input_tokens: 100,
            max_tokens: 256,
        }
    }
}

/// The first mutation, in its smallest form: in tokens, a completion with
/// output below `max_tokens` returns the difference to the bucket it was
/// charged to, capped at the bucket's depth (one bucket of 1,000 tokens/min).
#[test]
fn tpm_completion_refunds_unused_max_tokens() {
    for sem in Semantics::ALL {
        let mut cfg = config(
            sem,
            true,
            1,
            80,
            Some(1),
            &[],
            OutputAccounting::ReserveRefund,
            ConsumerPolicy::default(),
        );
        cfg.capacity = 1000;
        cfg.burst = Some(1000);
        let shape = lone_unreserved(&cfg).unwrap().0;
        assert_eq!(shape.depth, share_depth(&cfg, 10_000));
        let mut lim = Limiter::new(cfg, 0).unwrap();
        let r = qsim_core::limiter::admission::Request {
            consumer: 0,
            input_tokens: 100,
            max_tokens: 400,
        };
        let g = match lim.decide(0, &r) {
            Decision::Admit(g) => g,
            d => panic!("{sem:?}: {d:?}"),
        };
        assert!(lim.decide(0, &r).is_admit()); // 1,000 − 2·500 = 0 left
        assert!(!lim.decide(0, &r).is_admit());
        // the first completes with 100 of 400 tokens: 300 come back
        lim.complete(0, &g, 100);
        let mut small = r;
        small.max_tokens = 200; // 300 tokens
        assert!(
            lim.clone().decide(0, &small).is_admit(),
            "{sem:?}: the refund did not come back"
        );
        small.max_tokens = 201;
        assert!(
            !lim.clone().decide(0, &small).is_admit(),
            "{sem:?}: refunded more than unused"
        );
        // refunds are capped at the depth: after a minute the bucket is full again
        lim.complete(MINUTE, &g, 0);
        let mut big = r;
        big.input_tokens = 600;
        assert!(lim.clone().decide(MINUTE, &big).is_admit());
        big.input_tokens = 601;
        assert!(
            !lim.clone().decide(MINUTE, &big).is_admit(),
            "{sem:?}: a refund overfilled the bucket"
        );
    }
}

proptest! {
    #![proptest_config(pt(48))]

    /// The compiled parameters and the limiter's read-outs against the
    /// configuration: every bucket as the document sizes it (capacity
    /// buckets, credits, own limits), the total and per-consumer depths,
    /// the default lease, the headroom of a fresh limiter and after
    /// admissions from one bucket, the levels, the consumers in flight.
    #[test]
    fn params_and_read_outs_match_the_configuration(cfg in arb_any(), k in 0u64..50) {
        let b = buckets(&cfg);
        let p = Params::new(cfg.clone()).unwrap();
        prop_assert_eq!(p.config(), &cfg);
        prop_assert_eq!(p.semantics(), cfg.semantics);
        prop_assert_eq!(p.consumers(), cfg.consumers.len());
        prop_assert_eq!(p.lease(), 600 * SECOND);
        let caps = b.capacity(cfg.semantics);
        let total: u64 = caps.iter().map(|s| s.depth).sum();
        prop_assert_eq!(p.total_depth(), total);
        prop_assert_eq!(p.capacity_slots().len(), caps.len());
        for c in 0..cfg.consumers.len() {
            let want = match cfg.semantics {
                Semantics::RateLimitOnly => 0,
                _ => b.floor[c].map_or(0, |s| s.depth),
            };
            prop_assert_eq!(p.floor_depth(c), want);
        }
        // every bucket: capacity buckets, credits, then own limits
        let mut want: Vec<(u64, u64)> = caps.iter().map(|s| (s.depth, s.refill)).collect();
        if matches!(cfg.semantics, Semantics::StrictFloors | Semantics::Partitioned) {
            want.extend(b.floor.iter().flatten().map(|s| (s.depth, s.refill)));
        }
        for cs in &cfg.consumers {
            if let Some(r) = cs.policy.rpm { want.push((r.max(1), MINUTE)); }
            if let Some(t) = cs.policy.tokens_per_hour { want.push((t.max(1), 3600 * SECOND)); }
        }
        let mut got: Vec<(u64, u64)> = p.buckets().iter().map(|s| (s.capacity(), s.window())).collect();
        want.sort_unstable();
        got.sort_unstable();
        prop_assert_eq!(&got, &want);
        let params = Arc::new(p);
        let mut lim = Limiter::with_params(params.clone(), 0);
        prop_assert_eq!(lim.config(), &cfg);
        prop_assert_eq!(lim.headroom(0), total);
        let mut levels: Vec<(i64, u64)> = lim.bucket_levels(0);
        levels.sort_unstable();
        prop_assert_eq!(levels, want.iter().map(|&(d, _)| (d as i64, d)).collect::<Vec<_>>());
        for c in 0..cfg.consumers.len() {
            prop_assert_eq!(lim.in_flight(c, 0), cfg.consumers[c].policy.concurrent.map(|_| 0));
        }
        prop_assert!(!lim.saturated(0));
        // a single-bucket configuration: the headroom falls by what is admitted
        let dev = cfg.consumers.len() - 1;
        let model = SingleBucket::new(&cfg, 600 * SECOND, 0);
        if model.models(dev) && cfg.semantics != Semantics::Partitioned {
            let r = Request { consumer: dev, input_tokens: 10, max_tokens: 10 };
            let units = charge(tpm(&cfg), cfg.accounting, 10, 10).0;
            let mut taken = 0;
            for _ in 0..k {
                if lim.decide(0, &r).is_admit() { taken += units; }
            }
            prop_assert_eq!(lim.headroom(0), total - taken);
            if cfg.consumers[dev].policy.concurrent.is_some() {
                let live = lim.in_flight(dev, 0).unwrap() as u64;
                prop_assert_eq!(live, taken / units.max(1));
            }
        }
        let state = lim.clone().into_state();
        prop_assert_eq!(&state, lim.state());
        prop_assert!(Limiter::from_parts(params, state).is_ok());
    }
}

/// A state read back from a store is checked against the parameters: the
/// number of levels and lease lists, no level above its bucket's depth, no
/// more leases than the concurrency limit.
#[test]
fn a_state_that_does_not_fit_is_refused() {
    let mut cfg = config(
        Semantics::StrictFloors,
        false,
        600,
        80,
        None,
        &[3000],
        OutputAccounting::ReserveRefund,
        ConsumerPolicy::default(),
    );
    cfg.consumers[1].policy.concurrent = Some(1);
    let p = Params::new(cfg.clone()).unwrap();
    let good = State::new(&p, 0);
    assert!(good.check(&p).is_ok());
    let json = serde_json::to_value(&good).unwrap();
    let edit = |f: &dyn Fn(&mut serde_json::Value)| -> State {
        let mut v = json.clone();
        f(&mut v);
        serde_json::from_value(v).unwrap()
    };
    let extra_level = edit(&|v| v["levels"].as_array_mut().unwrap().push(0.into()));
    assert!(extra_level.check(&p).unwrap_err().contains("bucket levels"));
    let no_leases = edit(&|v| v["leases"] = serde_json::json!([]));
    assert!(no_leases.check(&p).unwrap_err().contains("lease lists"));
    let overfull = edit(&|v| {
        let l = v["levels"][0].as_i64().unwrap();
        v["levels"][0] = (l + 1).into();
    });
    assert!(overfull.check(&p).unwrap_err().contains("exceeds"));
    let full = edit(&|v| {
        let l = v["levels"][0].as_i64().unwrap();
        v["levels"][0] = l.into();
    });
    assert!(full.check(&p).is_ok());
    let leases = edit(&|v| v["leases"][0] = serde_json::json!([5, 6]));
    assert!(leases.check(&p).unwrap_err().contains("concurrency"));
    let one = edit(&|v| v["leases"][0] = serde_json::json!([5]));
    assert!(one.check(&p).is_ok());
    assert!(Limiter::from_parts(Arc::new(p), leases).is_err());
}

/// Names, parsing and validation of the configuration, as the CLI and
/// files use them (docs/limiter.md).
#[test]
fn names_parse_back_and_invalid_configurations_are_errors() {
    let names = [
        "max_input_tokens",
        "concurrent",
        "rpm",
        "tokens_per_hour",
        "capacity",
    ];
    for (i, l) in Limit::ALL.into_iter().enumerate() {
        assert_eq!(l.name(), names[i]);
        assert_eq!(l.index(), i);
    }
    let sems = [
        "rate-limit-only",
        "strict-floors",
        "litellm-priority",
        "partitioned",
    ];
    for (i, s) in Semantics::ALL.into_iter().enumerate() {
        assert_eq!(s.name(), sems[i]);
        assert_eq!(Semantics::parse(sems[i]), Some(s));
        assert!(Semantics::NAMES.contains(sems[i]));
    }
    assert_eq!(Semantics::parse("strict"), None);
    let g: Vec<&str> = Semantics::ALL.iter().map(|s| s.guarantee()).collect();
    assert!(g[0].contains("no consumer has a floor"));
    assert!(g[1].contains("work-conserving"));
    assert!(g[2].contains("saturation threshold"));
    assert!(g[3].contains("unreserved pool serves only unreserved"));
    for (u, n) in [(Unit::Rpm, "rpm"), (Unit::Tpm, "tpm")] {
        assert_eq!(u.name(), n);
        assert_eq!(Unit::parse(n), Some(u));
    }
    assert_eq!(Unit::parse("rps"), None);
    // per-entity overrides replace only the fields they set
    let base = ConsumerPolicy {
        rpm: Some(1),
        tokens_per_hour: Some(2),
        concurrent: Some(3),
        max_input_tokens: Some(4),
    };
    assert_eq!(base.overridden_by(&ConsumerPolicy::default()), base);
    let over = ConsumerPolicy {
        rpm: Some(10),
        tokens_per_hour: Some(20),
        concurrent: Some(30),
        max_input_tokens: Some(40),
    };
    assert_eq!(base.overridden_by(&over), over);
    assert_eq!(ConsumerPolicy::default().overridden_by(&over), over);
    // burst: (1 − θ)·C rounded, unless given
    let mut cfg = config(
        Semantics::StrictFloors,
        false,
        1000,
        80,
        None,
        &[3000, 2000],
        OutputAccounting::ReserveRefund,
        ConsumerPolicy::default(),
    );
    assert_eq!(cfg.burst_units(), 200);
    assert_eq!(cfg.reserved_bp_total(), 5000);
    cfg.threshold = 0.755;
    assert_eq!(cfg.burst_units(), 245);
    cfg.burst = Some(7);
    assert_eq!(cfg.burst_units(), 7);
    assert!(cfg.validate().is_ok());
    for (th, ok) in [
        (0.0, false),
        (1.0, true),
        (1.01, false),
        (f64::NAN, false),
        (0.01, true),
    ] {
        let mut c = cfg.clone();
        c.threshold = th;
        assert_eq!(c.validate().is_ok(), ok, "threshold {th}");
    }
    let mut c = cfg.clone();
    c.capacity = 0;
    assert_eq!(c.validate().unwrap_err(), "capacity must be > 0");
    let mut c = cfg.clone();
    c.consumers.clear();
    assert!(c.validate().unwrap_err().contains("at least one consumer"));
    let mut c = cfg.clone();
    c.consumers[0].reserved_bp = 8001;
    assert_eq!(
        c.validate().unwrap_err(),
        "reservations add up to 100.01 %, more than 100 %"
    );
    c.consumers[0].reserved_bp = 8000;
    assert!(c.validate().is_ok());
    assert!(Params::new(c.clone()).is_ok());
    // reservations adding up to 100 %: no pool, and that is valid
    for sem in Semantics::ALL {
        let c = config(
            sem,
            false,
            1000,
            80,
            None,
            &[5000, 5000],
            OutputAccounting::ReserveRefund,
            ConsumerPolicy::default(),
        );
        let p = Params::new(c.clone()).unwrap();
        let caps = buckets(&c).capacity(sem);
        assert_eq!(
            p.total_depth(),
            caps.iter().map(|s| s.depth).sum::<u64>(),
            "{sem:?}"
        );
        assert!(buckets(&c).pool.is_none() || sem == Semantics::RateLimitOnly);
    }
    let deny = Decision::Deny {
        limit: Limit::Rpm,
        retry_at: 1,
    };
    assert!(!deny.is_admit());
}

fn paid(s: Source) -> Paid {
    match s {
        Source::Shared { credit } => Paid::G { credits: credit },
        Source::Own => Paid::Own,
        Source::Pool => Paid::Pool,
        Source::Borrowed(j) => Paid::Borrowed(j),
    }
}

proptest! {
    #![proptest_config(pt(32))]

    /// Every semantics' capacity rule (docs/limiter.md, "The rule of each
    /// semantics") on reference buckets, decision by decision: admitted or
    /// not, and from which bucket (strict-floors: own credits, else `G`
    /// beyond every other credit with the one accruing and its own unused
    /// ones; litellm-priority: own floor, pool, then the most idle other
    /// floor below saturation; partitioned: the pool for the unreserved).
    #[test]
    fn every_semantics_admits_by_its_documented_rule(
        s in 0usize..4, tokens in any::<bool>(), cap in 40u64..1200, th in 10u32..=100, burst in prop::option::of(0u64..300),
        res in prop::collection::vec(prop_oneof![Just(0u32), 100u32..4000], 0..4), acc in 0usize..3,
        seed in any::<u64>(), mult in 0.5f64..6.0, greedy in prop::option::of(0usize..4), equal in any::<bool>(),
    ) {
        // equal reservations: ties between floors (litellm: the lowest index wins)
        let res: Vec<u32> = if equal { res.iter().map(|_| res[0].max(500)).collect() } else { res };
        let cfg = config(Semantics::ALL[s], tokens, cap, th, burst, &res, ACCOUNTING[acc], ConsumerPolicy::default());
        let greedy = greedy.map(|g| g.min(cfg.consumers.len() - 1));
        let tr = traffic(&cfg, seed, mult, greedy, 2 * MINUTE);
        let mut model = Capacity::new(&cfg, 0);
        let mut lim = Limiter::new(cfg.clone(), 0).unwrap();
        let acc = cfg.accounting;
        let mut admitted = 0;
        drive(&mut lim, &tr, &mut |e| match e {
            Event::Decided { now, req, decision, .. } => {
                let (units, need) = charge(tokens, acc, req.input_tokens, req.max_tokens);
                let want = model.source(now, req.consumer, need);
                let got = match decision {
                    Decision::Admit(g) => Some(paid(g.source)),
                    Decision::Deny { .. } => None,
                };
                if got != want {
                    return Err(format!("at {now}: {req:?} (needs {need}): limiter {decision:?}, rule {want:?}"));
                }
                if let Some(p) = got {
                    admitted += 1;
                    model.admitted(now, req.consumer, p, units);
                }
                Ok(())
            }
            Event::Completed { now, grant, actual, .. } => {
                let (r, x) = settlement(tokens, acc, grant.max_tokens, actual);
                model.settled(now, grant.consumer, paid(grant.source), r, x);
                Ok(())
            }
        }).map_err(|e| TestCaseError::fail(format!("{cfg:?}: {e}")))?;
        prop_assert!(admitted > 0);
    }
}

/// LiteLLM's window is 60 s long: an admission exactly 60 s after the
/// window opened opens the next one (θ·C = 1,000 tokens; each request
/// 1,000 tokens, so each window is saturated by its first admission).
#[test]
fn litellm_window_opens_again_exactly_a_minute_later() {
    let mut cfg = config(
        Semantics::LitellmPriority,
        true,
        1,
        1,
        Some(10),
        &[],
        OutputAccounting::ReserveRefund,
        ConsumerPolicy::default(),
    );
    cfg.capacity = 100_000;
    cfg.burst = Some(10_000);
    let mut lim = Limiter::new(cfg, 0).unwrap();
    let r = Request {
        consumer: 0,
        input_tokens: 500,
        max_tokens: 500,
    };
    assert!(lim.decide(0, &r).is_admit());
    assert!(lim.saturated(0) && lim.saturated(MINUTE - 1));
    assert!(!lim.saturated(MINUTE), "the first window ended");
    assert!(lim.decide(MINUTE, &r).is_admit());
    assert!(
        lim.saturated(MINUTE + 1),
        "the admission at 60 s opened a new window"
    );
    assert!(!lim.saturated(2 * MINUTE));
}

/// litellm-priority borrows from the most idle other floor (the fullest
/// by fraction; ties to the lowest index): with floor 0 partly used and
/// floors 1 and 2 full, the unreserved consumer, past the pool, borrows
/// floor 1.
#[test]
fn litellm_borrows_the_most_idle_floor() {
    let cfg = config(
        Semantics::LitellmPriority,
        false,
        1000,
        80,
        None,
        &[3000, 2000, 3000],
        OutputAccounting::ReserveRefund,
        ConsumerPolicy::default(),
    );
    let pool = buckets(&cfg).pool.unwrap().depth;
    let mut lim = Limiter::new(cfg, 0).unwrap();
    let r = |c| Request {
        consumer: c,
        input_tokens: 10,
        max_tokens: 10,
    };
    for _ in 0..10 {
        assert!(lim.decide(0, &r(0)).is_admit());
    }
    for _ in 0..pool {
        match lim.decide(0, &r(3)) {
            Decision::Admit(g) => assert_eq!(g.source, Source::Pool),
            d => panic!("{d:?}"),
        }
    }
    match lim.decide(0, &r(3)) {
        Decision::Admit(g) => assert_eq!(g.source, Source::Borrowed(1)),
        d => panic!("{d:?}"),
    }
}
