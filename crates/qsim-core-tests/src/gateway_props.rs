//! The gateway (`qsim_core::gateway`) against a reference model written
//! from its documented rules (the module's "The rules" section) alone: for
//! random configs (upstreams with request and token limits, concurrency
//! caps, cooldowns, breakers and probes; routes of one or two tiers, first
//! or weighted) and random sequences of arrivals, replies (ok, 429 with or
//! without a hint, 5xx, timeout, refused, 4xx), answers ending and probes,
//! every step (which upstream, its deadline, answer or refusal with its
//! reason and time) and every per-upstream count agree; and invariants that
//! hold whatever the rules' details: no request goes to one upstream twice
//! or beyond its attempts, no upstream is sent a request while cooling
//! down or over its concurrency cap, and with every request ended nothing
//! is left in flight.
//!
//! The reference's buckets are the reference buckets of `reference.rs`
//! (charges and settlements as docs/limiter.md states them).

use crate::reference::{RefBucket, Shape, NEVER, SECOND};
use crate::Rng;
use qsim_core::gateway::{
    Breaker, Config, Gateway, Refused, Reply, Route, Step, Ticket, Tier, Upstream, ANY_MODEL,
};
use qsim_core::limiter::rates::{Cost, Counts, LimitSpec, OutputAccounting};
use qsim_core::route::Policy;

// ------------------------------------------------------------ the reference

/// What a limit charges at admission and needs available (requests 1;
/// token limits the input plus `max_tokens`, reserved).
fn charge(counts: Counts, c: Cost) -> u64 {
    match counts {
        Counts::Requests => 1,
        Counts::InputTokens => c.input_tokens,
        Counts::OutputTokens => c.max_tokens,
        Counts::Tokens => c.input_tokens + c.max_tokens,
    }
}

/// The unused reservation given back when the answer ends with `out`
/// tokens (reserve-and-refund accounting), and output above it charged.
fn settle(counts: Counts, c: Cost, out: u64) -> (u64, u64) {
    match counts {
        Counts::OutputTokens | Counts::Tokens => (
            c.max_tokens.saturating_sub(out),
            out.saturating_sub(c.max_tokens),
        ),
        _ => (0, 0),
    }
}

#[derive(Debug, Clone)]
enum Circ {
    Closed,
    Open(u64),
    Half(u32),
}

#[derive(Debug, Clone)]
struct RUp {
    buckets: Vec<(Counts, RefBucket)>,
    unanswered: u64,
    cool_end: u64,
    cool_429: bool,
    fails: u32,
    circ: Circ,
    probe_at: u64,
    probing: bool,
    sent: u64,
    first: u64,
    replies: [u64; 6],
    cooldowns: u64,
    opened: u64,
}

#[derive(Debug)]
struct RReq {
    route: usize,
    tried: Vec<usize>,
    at: Option<usize>,
    probe: bool,
    streaming: bool,
    cost: Cost,
}

struct Reference {
    cfg: Config,
    ups: Vec<RUp>,
}

fn kind(r: Reply) -> usize {
    match r {
        Reply::Ok => 0,
        Reply::RateLimited { .. } => 1,
        Reply::ServerError => 2,
        Reply::Timeout => 3,
        Reply::Refused => 4,
        Reply::ClientError => 5,
    }
}

impl Reference {
    fn new(cfg: Config) -> Reference {
        let ups = cfg
            .upstreams
            .iter()
            .map(|u| RUp {
                buckets: u
                    .limits
                    .iter()
                    .map(|l| {
                        (
                            l.counts,
                            RefBucket::full(
                                Shape {
                                    depth: l.limit,
                                    refill: l.window,
                                },
                                0,
                            ),
                        )
                    })
                    .collect(),
                unanswered: 0,
                cool_end: 0,
                cool_429: false,
                fails: 0,
                circ: Circ::Closed,
                probe_at: NEVER,
                probing: false,
                sent: 0,
                first: 0,
                replies: [0; 6],
                cooldowns: 0,
                opened: 0,
            })
            .collect();
        Reference { cfg, ups }
    }

    /// The circuit as of `now`: open past its time is half-open, none let
    /// through yet.
    fn circ(&self, u: usize, now: u64) -> Circ {
        match self.ups[u].circ {
            Circ::Open(until) if now >= until => Circ::Half(0),
            ref c => c.clone(),
        }
    }

    fn limits_admit(&self, u: usize, now: u64, c: Cost) -> bool {
        self.ups[u]
            .buckets
            .iter()
            .all(|(k, b)| b.ready(now, charge(*k, c)) <= now)
    }

    /// Rules 2–5 of "Open".
    fn open(&self, u: usize, now: u64, c: Cost) -> bool {
        let s = &self.ups[u];
        let spec = &self.cfg.upstreams[u];
        if now < s.cool_end {
            return false;
        }
        let circuit = match self.circ(u, now) {
            Circ::Closed => true,
            Circ::Open(_) => false,
            Circ::Half(k) => k < spec.breaker.probes,
        };
        circuit
            && spec.max_in_flight.is_none_or(|m| s.unanswered < m)
            && self.limits_admit(u, now, c)
    }

    fn choose(&self, now: u64, r: &RReq, draws: &mut Vec<u64>, rng: &mut Rng) -> Option<usize> {
        for tier in &self.cfg.routes[r.route].tiers {
            let open: Vec<(usize, usize)> = tier
                .upstreams
                .iter()
                .enumerate()
                .filter(|(_, u)| !r.tried.contains(u) && self.open(**u, now, r.cost))
                .map(|(i, u)| (i, *u))
                .collect();
            if open.is_empty() {
                continue;
            }
            match &tier.policy {
                Policy::Weighted(w) if open.len() > 1 => {
                    let total: u64 = open.iter().map(|(i, _)| w[*i]).sum();
                    let x = rng.next_u64() % total;
                    draws.push(x);
                    let mut acc = 0;
                    for (i, u) in &open {
                        acc += w[*i];
                        if x < acc {
                            return Some(*u);
                        }
                    }
                    unreachable!()
                }
                _ => return Some(open[0].1),
            }
        }
        None
    }

    fn send(&mut self, now: u64, r: &mut RReq, u: usize) -> Step {
        let first = r.tried.is_empty();
        r.tried.push(u);
        r.at = Some(u);
        r.streaming = false;
        r.probe = false;
        if let Circ::Half(k) = self.circ(u, now) {
            self.ups[u].circ = Circ::Half(k + 1);
            r.probe = true;
        }
        let cost = r.cost;
        let s = &mut self.ups[u];
        s.unanswered += 1;
        for (k, b) in &mut s.buckets {
            b.sync(now);
            b.spend(charge(*k, cost));
        }
        s.sent += 1;
        if first {
            s.first += 1;
        }
        Step::Send {
            upstream: u,
            deadline: now + self.cfg.upstreams[u].timeout,
        }
    }

    /// Nothing open: why and when, from the untried upstreams.
    fn refuse(&self, now: u64, r: &RReq) -> Step {
        let mut best: Option<(u64, Refused)> = None;
        let mut first_why = None;
        for u in self.cfg.routes[r.route].upstreams() {
            if r.tried.contains(&u) {
                continue;
            }
            let s = &self.ups[u];
            let spec = &self.cfg.upstreams[u];
            let mut at = now;
            let mut why = Refused::Limited;
            let mut on_end = false;
            if now < s.cool_end {
                at = s.cool_end;
                if !s.cool_429 {
                    why = Refused::Unavailable;
                }
            }
            match self.circ(u, now) {
                Circ::Closed => {}
                Circ::Open(until) => {
                    at = at.max(until);
                    why = Refused::Unavailable;
                }
                Circ::Half(k) => {
                    if k >= spec.breaker.probes {
                        on_end = true;
                        why = Refused::Unavailable;
                    }
                }
            }
            if spec.max_in_flight.is_some_and(|m| s.unanswered >= m) {
                on_end = true;
            }
            for (k, b) in &s.buckets {
                let t = b.ready(at, charge(*k, r.cost));
                if t == NEVER {
                    on_end = true;
                } else {
                    at = at.max(t);
                }
            }
            // every bucket at `at` (a later bucket's time may move an earlier one's)
            if !on_end {
                loop {
                    let t = s
                        .buckets
                        .iter()
                        .map(|(k, b)| b.ready(at, charge(*k, r.cost)))
                        .max()
                        .unwrap_or(at);
                    if t <= at {
                        break;
                    }
                    at = t;
                }
            }
            first_why.get_or_insert(why);
            if !on_end && best.is_none_or(|(b, _)| at < b) {
                best = Some((at, why));
            }
        }
        match best {
            Some((at, why)) => Step::Refuse {
                why,
                retry_at: Some(at),
            },
            None => Step::Refuse {
                why: first_why.unwrap_or(Refused::Unavailable),
                retry_at: None,
            },
        }
    }

    fn next(&mut self, now: u64, r: &mut RReq, draws: &mut Vec<u64>, rng: &mut Rng) -> Step {
        match self.choose(now, r, draws, rng) {
            Some(u) => self.send(now, r, u),
            None => {
                r.at = None;
                self.refuse(now, r)
            }
        }
    }

    fn failure(&mut self, u: usize, now: u64) {
        let spec = self.cfg.upstreams[u].clone();
        let half = matches!(self.circ(u, now), Circ::Half(_));
        let s = &mut self.ups[u];
        let end = now + spec.cooldown;
        if spec.cooldown > 0 {
            s.cooldowns += 1;
        }
        if end >= s.cool_end {
            s.cool_end = end;
            s.cool_429 = false;
        }
        s.fails += 1;
        let closed = matches!(s.circ, Circ::Closed);
        if half || (spec.breaker.failures > 0 && s.fails >= spec.breaker.failures && closed) {
            s.circ = Circ::Open(now + spec.breaker.open_for);
            s.opened += 1;
        }
        if let Some(every) = spec.probe_every {
            if !s.probing {
                s.probe_at = now + every;
            }
        }
    }

    fn reply(
        &mut self,
        now: u64,
        r: &mut RReq,
        reply: Reply,
        draws: &mut Vec<u64>,
        rng: &mut Rng,
    ) -> Step {
        let u = r.at.expect("an attempt in progress");
        if std::mem::take(&mut r.probe) {
            if let Circ::Half(k) = &mut self.ups[u].circ {
                *k = k.saturating_sub(1);
            }
        }
        self.ups[u].replies[kind(reply)] += 1;
        match reply {
            Reply::Ok => {
                self.ups[u].fails = 0;
                if matches!(self.circ(u, now), Circ::Half(_)) {
                    self.ups[u].circ = Circ::Closed;
                }
                if matches!(self.ups[u].circ, Circ::Closed) {
                    self.ups[u].probe_at = NEVER;
                }
                r.streaming = true;
                return Step::Answer;
            }
            Reply::ClientError => {
                self.release(u, now, r.cost, 0);
                return Step::Answer;
            }
            Reply::RateLimited { hint } => {
                let d = hint.unwrap_or(self.cfg.upstreams[u].cooldown);
                let s = &mut self.ups[u];
                if d > 0 {
                    s.cooldowns += 1;
                }
                if now + d > s.cool_end {
                    s.cool_end = now + d;
                    s.cool_429 = true;
                }
            }
            _ => self.failure(u, now),
        }
        self.release(u, now, r.cost, 0);
        if r.tried.len() as u32 >= self.cfg.routes[r.route].max_attempts {
            return Step::Answer;
        }
        self.next(now, r, draws, rng)
    }

    fn release(&mut self, u: usize, now: u64, c: Cost, out: u64) {
        let s = &mut self.ups[u];
        s.unanswered -= 1;
        for (k, b) in &mut s.buckets {
            b.sync(now);
            let (back, extra) = settle(*k, c, out);
            b.give_back(back);
            b.spend(extra);
        }
    }

    fn probe_due(&mut self, now: u64) -> Option<usize> {
        let u =
            (0..self.ups.len()).find(|&u| !self.ups[u].probing && self.ups[u].probe_at <= now)?;
        self.ups[u].probing = true;
        Some(u)
    }

    fn probe_result(&mut self, now: u64, u: usize, ok: bool) {
        self.ups[u].probing = false;
        if ok {
            let s = &mut self.ups[u];
            s.fails = 0;
            if !s.cool_429 && s.cool_end > now {
                s.cool_end = now;
            }
            if let Circ::Open(_) = s.circ {
                s.circ = Circ::Open(now);
            }
            s.probe_at = NEVER;
        } else {
            self.failure(u, now);
        }
    }
}

// ------------------------------------------------------------ random configs

fn random_config(rng: &mut Rng) -> Config {
    let n = rng.between(1, 4) as usize;
    let upstreams: Vec<Upstream> = (0..n)
        .map(|i| {
            let mut limits = vec![];
            if rng.between(0, 2) > 0 {
                limits.push(LimitSpec {
                    name: "RPM".into(),
                    counts: Counts::Requests,
                    limit: rng.between(1, 5),
                    window: rng.between(1, 20) * SECOND,
                    accounting: OutputAccounting::ReserveRefund,
                });
            }
            if rng.between(0, 2) == 0 {
                limits.push(LimitSpec {
                    name: "TPM".into(),
                    counts: [Counts::Tokens, Counts::OutputTokens][rng.between(0, 1) as usize],
                    limit: rng.between(50, 400),
                    window: rng.between(1, 20) * SECOND,
                    accounting: OutputAccounting::ReserveRefund,
                });
            }
            Upstream {
                name: format!("u{i}"),
                limits,
                max_in_flight: (rng.between(0, 2) == 0).then(|| rng.between(1, 3)),
                timeout: rng.between(1, 10) * SECOND,
                cooldown: rng.between(0, 5) * SECOND / 2,
                breaker: Breaker {
                    failures: rng.between(0, 3) as u32,
                    open_for: rng.between(1, 20) * SECOND,
                    probes: rng.between(1, 2) as u32,
                },
                probe_every: (rng.between(0, 2) == 0).then(|| rng.between(1, 4) * SECOND),
            }
        })
        .collect();
    let routes = (0..rng.between(1, 2))
        .map(|r| {
            // a random order of a random non-empty subset
            let mut us: Vec<usize> = (0..n).collect();
            for i in (1..us.len()).rev() {
                us.swap(i, rng.between(0, i as u64) as usize);
            }
            us.truncate(rng.between(1, n as u64) as usize);
            let cut = if us.len() > 1 && rng.between(0, 1) == 0 {
                rng.between(1, us.len() as u64 - 1) as usize
            } else {
                us.len()
            };
            let tiers: Vec<Tier> = [&us[..cut], &us[cut..]]
                .into_iter()
                .filter(|t| !t.is_empty())
                .map(|t| Tier {
                    upstreams: t.to_vec(),
                    policy: if rng.between(0, 1) == 0 {
                        Policy::First
                    } else {
                        Policy::Weighted(t.iter().map(|_| rng.between(1, 5)).collect())
                    },
                })
                .collect();
            Route {
                model: if r == 0 {
                    ANY_MODEL.into()
                } else {
                    "m1".into()
                },
                tiers,
                max_attempts: rng.between(1, us.len() as u64) as u32,
            }
        })
        .collect();
    Config { upstreams, routes }
}

fn random_reply(rng: &mut Rng) -> Reply {
    match rng.between(0, 9) {
        0..=3 => Reply::Ok,
        4 => Reply::RateLimited { hint: None },
        5 => Reply::RateLimited {
            hint: Some(rng.between(0, 4000) * 1_000_000),
        },
        6 => Reply::ServerError,
        7 => Reply::Timeout,
        8 => Reply::Refused,
        _ => Reply::ClientError,
    }
}

/// A request in both: the gateway's ticket and the reference's request.
struct Both {
    t: Ticket,
    r: RReq,
}

fn run_one(seed: u64) -> Result<u64, String> {
    let mut rng = Rng::new(seed);
    let cfg = random_config(&mut rng);
    let mut gw = Gateway::new(cfg.clone(), 0).map_err(|e| format!("{e:?}"))?;
    let mut rf = Reference::new(cfg.clone());
    let mut live: Vec<Both> = Vec::new();
    let mut now = 0u64;
    let mut steps = 0u64;
    for _ in 0..rng.between(50, 300) {
        now += rng.between(0, 3000) * 1_000_000;
        let action = rng.between(0, 9);
        // the draws both make come from one stream, consumed in order
        let dseed = rng.next_u64();
        let mut gdraws: Vec<u64> = Vec::new();
        let mut rdraws: Vec<u64> = Vec::new();
        let mut grng = Rng::new(dseed);
        let mut rrng = Rng::new(dseed);
        let mut below = |n: u64| {
            let x = grng.next_u64() % n;
            gdraws.push(x);
            x
        };
        let (g, r) = match action {
            0..=3 => {
                let route = rng.between(0, cfg.routes.len() as u64 - 1) as usize;
                let cost = Cost {
                    input_tokens: rng.between(1, 60),
                    max_tokens: rng.between(1, 60),
                };
                let (t, g) = gw.start(now, route, cost, &mut below);
                let mut rq = RReq {
                    route,
                    tried: vec![],
                    at: None,
                    probe: false,
                    streaming: false,
                    cost,
                };
                let r = rf.next(now, &mut rq, &mut rdraws, &mut rrng);
                if matches!(r, Step::Send { .. }) {
                    live.push(Both { t, r: rq });
                }
                (g, r)
            }
            4..=7 if !live.is_empty() => {
                let i = rng.between(0, live.len() as u64 - 1) as usize;
                let b = &mut live[i];
                if b.r.streaming {
                    let out = rng.between(0, 80);
                    gw.finish(now, &mut b.t, out);
                    let u = b.r.at.unwrap();
                    rf.release(u, now, b.r.cost, out);
                    live.swap_remove(i);
                    continue;
                }
                let reply = random_reply(&mut rng);
                let g = gw.on_reply(now, &mut b.t, reply, &mut below);
                let r = rf.reply(now, &mut b.r, reply, &mut rdraws, &mut rrng);
                // answered (unless a success still streams) or refused: over
                if !matches!(r, Step::Send { .. }) && !b.r.streaming {
                    live.swap_remove(i);
                }
                (g, r)
            }
            8 => {
                let g = gw.due_probe(now);
                let r = rf.probe_due(now);
                if g != r {
                    return Err(format!("{now}: due probe {g:?} vs reference {r:?}"));
                }
                if let Some(u) = g {
                    let ok = rng.between(0, 1) == 0;
                    gw.on_probe(now, u, ok);
                    rf.probe_result(now, u, ok);
                }
                continue;
            }
            _ => {
                let g = gw.poll_timeout();
                let r = rf
                    .ups
                    .iter()
                    .filter(|s| !s.probing && s.probe_at != NEVER)
                    .map(|s| s.probe_at)
                    .min();
                if g != r {
                    return Err(format!("{now}: poll_timeout {g:?} vs reference {r:?}"));
                }
                continue;
            }
        };
        steps += 1;
        if g != r || gdraws != rdraws {
            return Err(format!(
                "{now}: gateway {g:?} (draws {gdraws:?}) vs reference {r:?} (draws {rdraws:?})\n{cfg:#?}"
            ));
        }
        // invariants, whatever the rules' details
        if let Step::Send { upstream, .. } = g {
            let s = gw.upstream(upstream);
            let spec = &cfg.upstreams[upstream];
            if spec.max_in_flight.is_some_and(|m| s.in_flight() > m) {
                return Err(format!("{upstream} over its concurrency cap"));
            }
        }
        for b in &live {
            let max = cfg.routes[b.r.route].max_attempts as usize;
            let mut t = b.r.tried.clone();
            t.sort();
            t.dedup();
            if t.len() != b.r.tried.len() || t.len() > max || b.t.attempts() as usize != t.len() {
                return Err(format!("tried {:?} (max {max})", b.r.tried));
            }
        }
        for (u, s) in rf.ups.iter().enumerate() {
            let c = gw.upstream(u).counts;
            let mine = (
                s.sent,
                s.first,
                s.replies,
                s.cooldowns,
                s.opened,
                s.unanswered,
            );
            let theirs = (
                c.sent,
                c.first,
                [
                    c.ok,
                    c.rate_limited,
                    c.server_error,
                    c.timeout,
                    c.refused,
                    c.client_error,
                ],
                c.cooldowns,
                c.opened,
                gw.upstream(u).in_flight(),
            );
            if mine != theirs {
                return Err(format!(
                    "{now}: upstream {u}: reference {mine:?}, gateway {theirs:?}"
                ));
            }
        }
    }
    // end every request: nothing is left in flight
    for mut b in live {
        if b.r.streaming {
            gw.finish(now, &mut b.t, 0);
        } else if b.r.at.is_some() {
            gw.abandon(now, &mut b.t);
        }
    }
    for u in 0..cfg.upstreams.len() {
        if gw.upstream(u).in_flight() != 0 {
            return Err(format!("upstream {u} still has requests in flight"));
        }
    }
    Ok(steps)
}

#[test]
fn the_gateway_decides_as_its_documented_rules() {
    let cases: u64 = std::env::var("QSIM_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    let mut steps = 0;
    for seed in 0..cases {
        match run_one(0x40_0000 + seed) {
            Ok(n) => steps += n,
            Err(e) => panic!("seed {}: {e}", 0x40_0000 + seed),
        }
    }
    // the sequences did exercise the gateway
    assert!(steps > cases * 30, "only {steps} steps");
}
